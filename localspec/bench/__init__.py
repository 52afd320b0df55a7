"""Measuring: workloads, the single-request and session benches, the llama.cpp peer, the tuner, reports."""
