"""GGUF files: the safe header reader, vocabulary fingerprints, pair verdicts, finding models on disk."""
