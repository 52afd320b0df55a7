"""Measuring: workloads and run records, the single-request and session benches, the llama.cpp peer (a
llama-server client), the tuner and its records (``tuning``), reports."""
