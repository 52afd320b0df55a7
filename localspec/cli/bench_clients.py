"""``localspec bench --clients 1,2,4,8``: ``localspec serve`` (and, with ``--peer``, llama.cpp's
``llama-server --parallel N``) under concurrent streaming clients (:mod:`localspec.bench.clients`)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localspec import constants
from localspec.cli.bench_options import BenchOptions, say_build_note, split_names

if TYPE_CHECKING:
    from localspec.bench.clients import PeerFiles

#: llama-server's context per slot when ``--n-ctx`` is not given (``localspec serve`` keeps its own default).
PEER_N_CTX = 4096


def bench_clients(o: BenchOptions) -> None:
    """Run the clients bench of ``o`` and write clients.json, clients.md and clients.png into ``--out``."""
    from localspec.bench import clients as cb
    from localspec.bench.clients_report import markdown, new_result, write_result
    from localspec.bench.workloads import load_workloads

    counts = list(o.clients or ())  # (this mode runs with --clients given)
    threads = o.threads or constants.default_threads()
    parallel = list(o.parallel or [max(counts)])
    workloads = load_workloads(split_names(o.workloads) or None, o.prompts, o.limit)
    mixed = [p for row in itertools.zip_longest(*(w.prompts for w in workloads)) for p in row if p]
    work = tuple(mixed[i % len(mixed)] for i in range(o.requests))  # the workloads taken in turn
    # the user's suffix store is never read or written by a bench (--no-store)
    model_args = [*_pick(o), "--threads", str(threads), "--no-store"]
    model_args += ["--n-ctx", str(o.n_ctx)] if o.n_ctx else []
    modes = split_names(o.serve_modes)
    if modes:
        pair = [*model_args, *(["--draft", o.draft] if o.draft else [])]
        settings = cb.mode_settings(pair, modes, max(parallel))
    else:
        settings = cb.serve_settings(model_args, o.draft, parallel)
    files = None
    if o.peer:
        files = _peer_files(o, threads)
        settings += cb.peer_settings(_peer_modes(o, files), parallel)
    plan = cb.ClientsPlan(tuple(settings), tuple(counts), work, o.max_tokens, o.repeats, not o.no_warmup)
    log = o.progress() or (lambda line: None)
    runs = cb.run_clients_bench(plan, peer_files=files, log_dir=Path(o.out_dir) / "servers", log=log)
    setup: dict[str, Any] = {
        # file names only: a result file is published and says nothing of the user's folders
        "target": _file_name(o.target or (None if o.preset else str(constants.EMBEDDED_TARGET))),
        "draft": _file_name(o.draft),
        "preset": o.preset,
        "threads": threads,
        "n_ctx": o.n_ctx,
        "peer_n_ctx_per_slot": files.n_ctx if files else None,
        "clients": counts,
        "parallel": parallel,
        "serve_modes": modes,
        "requests": o.requests,
        "max_tokens": o.max_tokens,
        "repeats": o.repeats,
        "prompts": [p.id for p in work],
    }
    result = new_result(setup, runs, threads)
    written = write_result(result, Path(o.out_dir))
    if o.as_json:
        click.echo(json.dumps(result.as_dict(), indent=1))
        return
    click.echo(markdown(result))
    say_build_note()
    click.echo(f"\nwrote {written['json']}, {written['markdown']}, {written['png']}")


def print_clients_file(data: dict[str, Any], where: str, *, as_json: bool) -> None:
    """``--from-json`` on a clients.json: its table again (or the document, with ``--json``)."""
    from localspec.bench.clients_report import markdown, read_result

    result = read_result(data, where)
    click.echo(json.dumps(result.as_dict(), indent=1) if as_json else markdown(result))


def _pick(o: BenchOptions) -> list[str]:
    """``serve``'s arguments that pick the target: the file, the preset, or none (the embedded pair)."""
    if o.target:
        return ["--target", o.target]
    return ["--preset", o.preset] if o.preset else []


def _peer_files(o: BenchOptions, threads: int) -> PeerFiles:
    """The files llama-server runs: the target and the draft model localspec runs (the preset's, the
    embedded pair's, or the ``--draft`` file; none for ``--draft`` none, ngram or auto with ``--target``)."""
    from localspec.bench.clients import PeerFiles

    named = o.draft if o.draft not in (None, "auto", "ngram", "none") else None
    if o.preset:
        from localspec.hub.download import ensure_preset

        pair = ensure_preset(o.preset)
        target, draft = pair.target, (Path(named) if named else pair.draft)
    elif o.target:
        target, draft = Path(o.target), Path(named) if named else None
    else:
        target, draft = constants.EMBEDDED_TARGET, Path(named) if named else constants.EMBEDDED_DRAFT
    if o.draft in ("none", "ngram"):
        draft = None
    return PeerFiles(target=Path(target), draft=draft, threads=threads, n_ctx=o.n_ctx or PEER_N_CTX)


def _peer_modes(o: BenchOptions, files: PeerFiles) -> list[str]:
    """llama.cpp's modes to run: ``--peer-modes``, else none, ngram-mod, draft-simple (with a draft model)
    and draft-mtp (when the target has MTP layers). A mode the files cannot run is a usage error."""
    from localspec.gguf.meta import read_metadata
    from localspec.gguf.vocab import mtp_layers

    has_mtp = mtp_layers(read_metadata(files.target))[1] > 0
    given = split_names(o.peer_modes)
    if "draft-simple" in given and files.draft is None:
        raise click.UsageError("--peer-modes draft-simple needs a draft model: give --draft FILE")
    if "draft-mtp" in given and not has_mtp:
        raise click.UsageError(
            f"--peer-modes draft-mtp needs MTP layers, and {files.target.name} has none: drop draft-mtp"
        )
    if given:
        return given
    optional = {"draft-simple": files.draft is not None, "draft-mtp": has_mtp}
    return [m for m in ("none", "ngram-mod", "draft-simple", "draft-mtp") if optional.get(m, True)]


def _file_name(path: str | None) -> str | None:
    """A model's file name (``ngram``/``none`` as they are), for a result file that may be published."""
    return Path(path).name if path else None
