"""``localspec serve``: an OpenAI-compatible HTTP endpoint (see docs/serve.md and localspec/server.py)."""

from __future__ import annotations

import click

from localspec import settings


@click.command("serve")
@click.option("--target", "-t", type=click.Path(dir_okay=False), help="Target GGUF (default: embedded pair).")
@click.option("--draft", "-d", help="Draft GGUF path, 'ngram', 'none' or 'auto' (default: auto).")
@click.option("--preset", "-p", help="A preset name (see `localspec presets`); downloads on first use.")
@click.option(
    "--strategy",
    type=click.Choice(settings.STRATEGIES),
    help="Drafting strategy for every request (default: the pair's own).",
)
@click.option("--n-max", type=click.IntRange(*settings.N_MAX_RANGE), help="Longest draft per round.")
@click.option(
    "--n-min", type=click.IntRange(min=0), help="Draft at least this many tokens before p-min stops it."
)
@click.option(
    "--p-min",
    type=click.FloatRange(0.0, 1.0),
    help="Stop drafting when the draft's top probability falls below this.",
)
@click.option(
    "--adaptive/--fixed", default=None, help="Adapt the draft length to measured acceptance and cost."
)
@click.option("--n-ctx", type=click.IntRange(min=16), help="Context size (default 4096 or the preset's).")
@click.option(
    "--threads", type=click.IntRange(min=1), help="CPU threads for the target (default: physical cores)."
)
@click.option(
    "--draft-threads", type=click.IntRange(min=1), help="CPU threads for the draft (default: as target)."
)
@click.option(
    "--gpu-layers",
    type=click.IntRange(min=-1),
    help="Target layers on a GPU (-1: all; default: all on a GPU build).",
)
@click.option(
    "--draft-gpu-layers",
    type=click.IntRange(min=-1),
    help="Draft layers on a GPU (-1: all; default: all on a GPU build).",
)
@click.option(
    "--corpus",
    type=click.Path(exists=True, file_okay=False),
    help="A folder the suffix cache drafts from (strategies suffix/auto).",
)
@click.option(
    "--no-store",
    is_flag=True,
    help="Keep the suffix cache in memory only (nothing written to disk; forgotten at exit).",
)
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
@click.option("--model-id", help="The model id the API reports (default: the target's file name).")
@click.option("--log-requests", is_flag=True, help="Log each HTTP request (uvicorn's access log).")
def serve(
    target,
    draft,
    preset,
    strategy,
    n_max,
    n_min,
    p_min,
    adaptive,
    n_ctx,
    threads,
    draft_threads,
    gpu_layers,
    draft_gpu_layers,
    corpus,
    no_store,
    host,
    port,
    api_key,
    insecure_no_auth,
    max_queue,
    max_body_mb,
    model_id,
    log_requests,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions).

    Point any OpenAI client at http://127.0.0.1:8000/v1. One request generates at a time; others wait in
    a FIFO queue. With no --target and no --preset it serves the small embedded pair, offline.
    """
    import localspec
    from localspec import constants
    from localspec.server import ServeOptions, exposure_line, serve
    from localspec.store import namespace_for_key

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
        strategy=strategy,
    )
    exposure_line(opts)  # refuse an exposed bind before spending time on loading the models
    pipe = localspec.load(
        target=target,
        draft=None if draft in (None, "auto") else draft,
        preset=preset,
        n_ctx=n_ctx,
        n_threads=threads,
        draft_n_threads=draft_threads,
        n_gpu_layers=gpu_layers,
        draft_n_gpu_layers=draft_gpu_layers,
        strategy=strategy,
        n_max=n_max,
        n_min=n_min,
        p_min=p_min,
        adaptive=adaptive,
        corpus=corpus,
        suffix_store=not no_store,
        # With an API key, the suffix store is that key's own: another key's server never drafts from it.
        store_namespace=namespace_for_key(api_key) if api_key else "default",
    )
    with pipe:
        serve(pipe, opts, echo=lambda line: click.echo(line, err=True), log_requests=log_requests)
    click.echo("localspec serve stopped.", err=True)


COMMANDS = [serve]
