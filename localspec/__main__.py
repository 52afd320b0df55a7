"""``python -m localspec`` and the ``localspec`` console script (:func:`entry`)."""

from __future__ import annotations

import sys


def entry() -> None:
    """Run the command line. The command group is imported here, inside the try: a Ctrl-C while Python
    imports it (click, the package) says "Interrupted." and exits 130, as one during a command does."""
    try:
        from localspec.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    entry()
