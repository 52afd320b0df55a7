"""``localspec serve``: an OpenAI-compatible HTTP endpoint (see docs/serve.md and localspec/serve/app.py)."""

from __future__ import annotations

import signal

import click

from localspec import constants
from localspec.cli.options import load_pipeline, model_options


@click.command("serve")
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free)."
)
@click.option(
    "--api-key",
    envvar="LOCALSPEC_API_KEY",
    show_envvar=True,
    help="Require 'Authorization: Bearer KEY' on every request (needed for any --host but loopback). "
    "Prefer the environment variable: it stays out of your shell history.",
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Allow a non-loopback --host without an API key (only on a network you trust).",
)
@click.option(
    "--max-queue",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Requests that may wait while one generates; more get 429 with Retry-After.",
)
@click.option(
    "--max-body-mb",
    default=8.0,
    show_default=True,
    type=click.FloatRange(min=0.01),
    help="Largest request body accepted, in MB (1 MB = 1,000,000 bytes).",
)
@click.option(
    "--parallel",
    type=click.IntRange(1, 256),
    help="Requests that generate at once, in one pass of the target per step (default: 4, fewer when "
    "their KV caches do not fit the free memory, 1 with MTP drafting).",
)
@click.option(
    "--prompt-cache-mb",
    default=float(constants.DEFAULT_PROMPT_CACHE_MB),
    show_default=True,
    type=click.FloatRange(min=0),
    help="Host memory (MB) for the states of earlier prompts, so that a request starting as an earlier one "
    "did (a chat's next turn, an agent's system prompt) evaluates only what is new; 0 turns it off.",
)
@click.option("--model-id", help="The model id the API reports (default: the target's file name).")
@click.option("--log-requests", is_flag=True, help="Log each HTTP request (uvicorn's access log).")
def serve(
    host,
    port,
    api_key,
    insecure_no_auth,
    max_queue,
    max_body_mb,
    parallel,
    prompt_cache_mb,
    model_id,
    log_requests,
    **model,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions).

    Point any OpenAI client at http://127.0.0.1:8000/v1. Up to --parallel requests generate at once (one
    pass of the target verifies all of them each step); others wait in a FIFO queue. With no --target and
    no --preset it serves the small embedded pair, offline.
    """
    from localspec.serve.app import serve
    from localspec.serve.options import ServeOptions, exposure_line
    from localspec.suffix.store_files import namespace_for_key

    preset, target = model["preset"], model["target"]
    aliases = (preset,) if preset else ((constants.EMBEDDED_PRESET,) if target is None else ())
    opts = ServeOptions(
        host=host,
        port=port,
        api_key=api_key if api_key else None,
        insecure_no_auth=insecure_no_auth,
        max_queue=max_queue,
        max_body_bytes=int(max_body_mb * 1_000_000),
        model_id=model_id,
        aliases=aliases,
        strategy=model["strategy"],
    )
    exposure_line(opts)  # refuse an exposed bind before spending time on loading the models
    # With an API key, the suffix store is that key's own: another key's server never drafts from it.
    namespace = namespace_for_key(api_key) if api_key else "default"
    pipe = load_pipeline(
        store_namespace=namespace, parallel=parallel, prompt_cache_mb=prompt_cache_mb, **model
    )
    with pipe:
        serve(pipe, opts, echo=lambda line: click.echo(line, err=True), log_requests=log_requests)
        # Stopped: one more Ctrl-C or SIGTERM (an impatient user, a supervisor) while the models are freed
        # and the process ends would only turn a clean exit into a KeyboardInterrupt or a death by signal.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    click.echo("localspec serve stopped.", err=True)


COMMANDS = [serve]
