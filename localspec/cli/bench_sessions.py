"""``localspec bench --sessions``: the multi-request workloads through one pipeline, with llama.cpp's modes
beside them (``--peer``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from localspec import constants
from localspec.cli.bench_options import BenchOptions, say_build_note, split_names

if TYPE_CHECKING:
    from localspec.bench.session_run import PeerSetup
    from localspec.pipeline.pipeline import Pipeline


def bench_sessions(o: BenchOptions) -> None:
    """``--sessions``: each session workload's requests in order through one pipeline, per row; with
    ``--peer``, llama.cpp's modes in the same repeats. Writes sessions.json and sessions.md."""
    import localspec
    from localspec.bench.session_run import markdown, noise_lines, run_bench, session_configs

    quiet = o.quiet or o.as_json
    log = (lambda line: None) if quiet else (lambda line: click.echo(f"  {line}", err=True))
    ctx = click.get_current_context()
    cap = o.max_tokens if ctx.get_parameter_source("max_tokens") is ParameterSource.COMMANDLINE else None
    with localspec.load(
        target=o.target,
        draft=o.draft,
        preset=o.preset,
        n_threads=o.threads,
        n_ctx=o.n_ctx,
        suffix_store=False,  # the bench never reads or writes the user's store
        rpc=o.rpc,
        tensor_split=o.tensor_split,
    ) as pipe:
        rows = split_names(o.session_rows)
        configs = session_configs(rows, pipe.info.draft_path is not None) if rows else None
        setup = _session_peer(o, pipe, log) if o.peer else None
        results = run_bench(
            pipe,
            split_names(o.sessions),
            configs=configs,
            repeats=o.repeats,
            max_tokens=cap,
            peer=setup,
            log=log,
        )
    out = Path(o.out_dir)
    (out / "sessions.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    table = markdown(results)
    (out / "sessions.md").write_text(table, encoding="utf-8")
    click.echo(json.dumps(results, indent=1) if o.as_json else table)
    for line in noise_lines(results):
        click.echo(line, err=True)
    if not o.as_json:
        say_build_note()


def _session_peer(o: BenchOptions, pipe: Pipeline, log: Callable[[str], None]) -> PeerSetup:
    """llama.cpp's side of a session bench: its modes (``--peer-modes``; draft-simple only with a draft)."""
    from localspec.bench import peer as peer_mod
    from localspec.bench.session_run import PeerSetup
    from localspec.llama.build import cpu_flags, installed_system_info

    # the same kernels on both sides: a native peer next to an AVX2 wheel compares builds
    flags = cpu_flags(installed_system_info())
    log(f"the llama.cpp peer is built with: {' '.join(flags) or 'the native CPU features'}")
    modes = split_names(o.peer_modes) or list(peer_mod.SESSION_MODES)
    return PeerSetup(
        target=pipe.info.target_path,
        draft=pipe.info.draft_path,
        threads=o.threads or constants.default_threads(),
        n_ctx=pipe.n_ctx,
        modes=tuple(m for m in modes if m != "draft-simple" or pipe.info.draft_path),
        work_dir=Path(o.out_dir) / "llama.cpp",
    )
