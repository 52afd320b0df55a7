"""The preset last downloaded or run from the command line, which ``localspec ui`` opens on.

One line in ``$LOCALSPEC_HOME/last-preset`` holding a preset's name (no text of yours): written by
``localspec download``, ``run`` and ``serve``; read by ``ui`` when no ``--preset`` is given. A file that
cannot be written or read only means the page opens on the embedded pair.
"""

from __future__ import annotations

import os
from pathlib import Path

from localspec import constants


def last_preset_path() -> Path:
    """Where the last preset's name is kept."""
    return constants.localspec_home() / "last-preset"


def remember_preset(name: str) -> None:
    """Keep ``name`` as the preset last downloaded or run (a failure to write it is ignored: it is a hint).

    Args:
        name: the preset's name.
    """
    path = last_preset_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(name + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def last_preset() -> str | None:
    """The preset last downloaded or run, or None when none was (or the file cannot be read).

    Returns:
        The preset's name as it was kept; whether it still exists is for the caller to check.
    """
    try:
        name = last_preset_path().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name or None
