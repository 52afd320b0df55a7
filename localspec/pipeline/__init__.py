"""The pipeline: load() / generate() / Pipeline, chat replies and tool calls."""
