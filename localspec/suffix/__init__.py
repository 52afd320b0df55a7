"""The suffix cache: draft from what followed the same context before, in this request or any earlier one."""

from localspec import _moved

__getattr__ = _moved.folded_getattr(__name__)  # the old module of this name, for one release
