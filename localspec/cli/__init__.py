"""The ``localspec`` command. Each concern registers its commands from its own module."""

from __future__ import annotations

import sys

import click

from localspec.errors import LocalspecError


class _FriendlyGroup(click.Group):
    """Turns localspec's own errors into a short message and exit status 1, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except LocalspecError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)


@click.group(cls=_FriendlyGroup)
@click.version_option(package_name="localspec")
def main() -> None:
    """Speculative decoding for local GGUF models through llama.cpp."""


def _register() -> None:
    import importlib

    for name in ("models", "run", "hub", "bench", "ui", "serve"):
        try:
            module = importlib.import_module(f"localspec.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"localspec.cli.{name}":
                continue  # that concern is not built yet
            raise
        for command in module.COMMANDS:
            main.add_command(command)


_register()
