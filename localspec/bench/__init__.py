"""Measuring: workloads, the single-request and session benches, the llama.cpp peer, the tuner, reports."""

from localspec import _moved

__getattr__ = _moved.folded_getattr(__name__)  # the old module of this name, for one release
