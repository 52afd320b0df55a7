"""The OpenAI-compatible server and the one rule for binding any server."""
