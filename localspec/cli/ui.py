"""``localspec ui``: the web page on localhost."""

from __future__ import annotations

import click


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=7860, show_default=True, type=click.IntRange(1, 65535), help="Port.")
@click.option("--share", is_flag=True, help="Also open a public Gradio share link (off by default).")
def ui(host: str, port: int, share: bool) -> None:
    """Open the web UI: pick a pair, watch the draft's tokens, compare speed and memory, bench."""
    from localspec.ui.app import launch

    click.echo(f"localspec UI on http://{host}:{port}  (Ctrl+C to stop)")
    launch(host=host, port=port, share=share)


COMMANDS = [ui]
