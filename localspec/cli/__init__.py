"""The ``localspec`` command. Each concern registers its commands from its own module.

What a user sees when something goes wrong, decided here once for every command:

- a bad flag value or a missing argument: click's usage message, exit status 2 (each option declares its
  bounds with a click type, the bounds taken from :mod:`localspec.settings`);
- a :class:`~localspec.errors.LocalspecError` (a missing file, an incompatible pair, a failed download...):
  its message and next step, exit status 1;
- a full disk or a read-only file system: what it is and what to do, exit status 1;
- a plain ``ValueError`` or ``OSError`` (a check the library does without its own error type yet, a
  permission denied): the message in one line, where it was raised, and how to get the full
  traceback, exit status 1. Such an error is either a bad value the library refused or a bug; the short form
  keeps the first readable and ``localspec --traceback ...`` keeps the second reportable;
- any other exception (``TypeError``, ``KeyError``, ...) is a bug in localspec: its traceback is printed as
  Python prints it, never hidden;
- Ctrl-C: "Interrupted.", exit status 130; a closed pipe (``localspec scan | head``): quiet, status 141;
- a check that ran and found no fit (``localspec pair``: an incompatible verdict, or no draft that fits
  the target): the verdict and its reasons as usual, exit status 3 (:data:`NO_FIT_EXIT`), so that a
  script can tell "does not fit" from "could not check" (1) and "fits" (0).
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
import traceback
from typing import NoReturn

import click

from localspec.errors import LocalspecError

#: The exit status of a check that ran and found no fit (see above).
NO_FIT_EXIT = 3


def _where(exc: BaseException) -> str:
    """``module.py:123`` of the innermost frame that raised ``exc`` (to find it again in a bug report)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno}"


#: OS errors that are the machine's state (a full disk, a read-only folder), not a bug: what to do.
_NOT_A_BUG = {
    errno.ENOSPC: "free some disk space, or send the output somewhere with room",
    errno.EROFS: "the file system is read-only: use a folder on a writable one",
    errno.EDQUOT: "your disk quota is used up: free some space",
}

#: Each command and the module under ``localspec.cli`` that declares it (in its ``COMMANDS``). A module is
#: imported when one of its commands runs (or for ``--help``), inside :meth:`_FriendlyGroup.invoke`: they
#: import numpy and llama.cpp, and a Ctrl-C during that second of importing printed a traceback.
COMMAND_MODULES = {
    "bench": "bench",
    "cache": "cache",
    "doctor": "doctor",
    "download": "hub",
    "export": "export",
    "find-draft": "hub",
    "index": "cache",
    "pair": "models",
    "presets": "hub",
    "rpc-server": "rpc",
    "run": "run",
    "scan": "models",
    "serve": "serve",
    "ui": "ui",
}


class _FriendlyGroup(click.Group):
    """Turns expected errors into a short message and an exit status, never a traceback (see above);
    loads each command's module when the command is asked for (:data:`COMMAND_MODULES`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            module = importlib.import_module(f"localspec.cli.{COMMAND_MODULES[cmd_name]}")
            for command in module.COMMANDS:
                self.add_command(command)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except LocalspecError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            from localspec.cli.options import WARNING_LINES  # (the module is loaded by now)

            # after text streamed to the terminal without a newline, on a line of its own
            click.echo(("\n" if WARNING_LINES.mid_line else "") + "Interrupted.", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # The reader went away (`localspec scan | head`): nothing left to tell it. Point stdout at
            # devnull so the interpreter's final flush does not raise again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(141)
        except OSError as exc:
            if ctx.params.get("show_traceback"):
                raise
            if exc.errno in _NOT_A_BUG:  # the machine's state, not localspec's: what it is and what to do
                click.echo(
                    f"Error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), err=True
                )
                click.echo(f"  -> {_NOT_A_BUG[exc.errno]}", err=True)
                sys.exit(1)
            self._bug(exc)
        except ValueError as exc:
            if ctx.params.get("show_traceback"):
                raise
            self._bug(exc)

    @staticmethod
    def _bug(exc: Exception) -> NoReturn:
        """A plain ValueError or OSError: one line, where it was raised, and how to report it."""
        click.echo(f"Error: {exc} ({type(exc).__name__} at {_where(exc)})", err=True)
        click.echo(
            "  -> if the values you gave are valid, this is a bug: run again as "
            "`localspec --traceback ...` and report what it prints",
            err=True,
        )
        sys.exit(1)


@click.group(cls=_FriendlyGroup)
@click.version_option(package_name="localspec")
@click.option(
    "--traceback",
    "show_traceback",
    is_flag=True,
    help="Print the full Python traceback of an unexpected error (for a bug report).",
)
def main(show_traceback: bool) -> None:
    """Speculative decoding for local GGUF models through llama.cpp."""
    from localspec.cli.options import install_warning_lines

    install_warning_lines()
