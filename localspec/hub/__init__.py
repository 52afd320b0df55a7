"""Presets and the Hugging Face Hub: TOML presets, checked downloads, the Hub-wide draft search."""

from localspec import _moved

__getattr__ = _moved.folded_getattr(__name__)  # the old module of this name, for one release
