"""``localspec cache info|clear`` and ``localspec index DIR``: the suffix cache on disk."""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from pathlib import Path

import click

from localspec import constants
from localspec.decoding import costs as costsmod
from localspec.errors import CacheError, LocalspecError, ModelNotFoundError
from localspec.llama import build as llama_build
from localspec.suffix import corpus, store_files, store_info
from localspec.suffix import store as storemod
from localspec.units import format_bytes

_DIR_HELP = "Cache folder (default: suffix/ in localspec's cache folder, LOCALSPEC_HOME)."


@click.group("cache")
def cache() -> None:
    """The suffix cache: what earlier requests and indexed folders taught the drafter."""


@cache.command("info")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help=_DIR_HELP)
def info(directory: str | None) -> None:
    """List the store files: vocabulary, tokens, requests, corpus, size on disk, path.

    Each store is checked as a run's load checks it (its checksums and structure: about 66 ms for a
    million tokens), so one the next run would ignore is shown as unusable, with what it held and what to do.
    """
    where = Path(directory) if directory else store_files.default_dir()
    stores = store_info.list_stores(where)
    if not stores:
        click.echo(f"No suffix cache in {where}.")
    for s in stores:
        click.echo(str(s.path))
        if s.problem:
            click.echo(f"  unusable: {s.problem}")
        if s.fingerprint:  # the header reads (a damaged payload still has it): what the store holds, or held
            saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.saved_at)) if s.saved_at else "-"
            click.echo(f"  vocabulary {s.fingerprint[:16]}  namespace {s.namespace}  saved {saved}")
            click.echo(
                ("  it held history " if s.problem else "  history ")
                + f"{s.history_tokens:,} tokens in {s.history_requests:,} requests; "
                f"corpus {s.corpus_tokens:,} tokens in {s.corpus_documents:,} files"
                + (f" from {s.corpus_root}" if s.corpus_root else "")
            )
        if s.problem:
            click.echo(
                f"  -> the next run ignores it: {store_info.what_is_lost(s)}; its next save replaces the "
                f"file (`{_clear_command(directory)}` deletes it now)"
            )
        elif s.journal_problem:
            click.echo(
                f"  its journal is not loaded ({s.journal_problem}): the requests saved since the last "
                "snapshot are lost, and the next save starts a new journal"
            )
        click.echo(f"  {format_bytes(s.size_bytes)} on disk")
    if stores:
        total = sum(s.size_bytes for s in stores)
        click.echo(
            f"\n{len(stores)} store(s), {format_bytes(total)}: `{_clear_command(directory)}` deletes them."
        )
    _costs_info()
    _amx_info()


def _clear_command(directory: str | None) -> str:
    """The command that clears the store folder ``info`` listed (``--dir`` carried over when given)."""
    return "localspec cache clear" + (f" --dir {shlex.quote(directory)}" if directory else "")


def _amx_info() -> None:
    """The AMX check's kept verdicts (:mod:`localspec.llama.build`): what it found for this build."""
    verdicts = llama_build.list_verdicts()
    if verdicts:
        click.echo(
            f"\nAMX check: {len(verdicts)} verdict(s) on this llama.cpp build and a model file in "
            f"{llama_build.verdicts_dir()}. `localspec cache clear --costs` has the check run again."
        )


def _costs_info() -> None:
    """The measured decoding costs the suffix drafter sizes its drafts by (one per machine, build, models,
    threads and offload)."""
    curves = costsmod.list_costs()
    if not curves:
        return
    click.echo(f"\nMeasured decoding costs in {costsmod.costs_dir()}:")
    for c in curves:
        click.echo(str(c.path))
        if c.costs is None:
            click.echo(f"  unusable ({c.problem}): measured again the next time it is needed")
            continue
        d, V = c.costs.details, c.costs.V
        models = " + ".join(str(m) for m in (d.get("target"), d.get("draft")) if m) or "models not recorded"
        threads = f", {d['threads']} threads" if d.get("threads") else ""
        click.echo(f"  {models}{threads}, measured {c.costs.measured.replace('T', ' ')}")
        draft = c.costs.draft_ratio
        click.echo(
            f"  {1000 * c.costs.target_token_seconds:.1f} ms per target token"
            + (f", a draft-model token {draft:.2f} of it" if draft is not None else "")
            + f"; a pass of 2 / 16 / 32 tokens costs {V(2):.2f} / {V(16):.2f} / {V(32):.2f} single passes"
        )
        if not c.costs.steady:
            click.echo(
                f"  measured while the machine was busy (the timings of {c.costs.unsteady_timings} "
                "disagreed): `localspec cache clear --costs` when it is idle"
            )
    click.echo(f"{len(curves)} curve(s). `localspec cache clear --costs` has them measured again.")


@cache.command("clear")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help=_DIR_HELP)
@click.option(
    "--costs",
    is_flag=True,
    help="Delete what was measured about this machine and build instead (decoding costs, the AMX check's "
    "verdicts; the store is kept): the next run measures again.",
)
def clear(yes: bool, directory: str | None, costs: bool) -> None:
    """Delete every store file (the history of earlier requests and indexed corpora)."""
    if costs and directory:
        raise click.UsageError(
            f"--dir names a suffix cache folder, and --costs deletes what was measured about this machine "
            f"(in {costsmod.costs_dir()}), not a store: drop --dir, or --costs to clear the store in it"
        )
    if costs:
        gone = costsmod.clear_costs()
        click.echo(
            f"Deleted {len(gone)} measured curve(s) from {costsmod.costs_dir()}; "
            "the next run that needs one measures this machine again (20-30 s for a 1.5B model on two cores)."
        )
        if verdicts := llama_build.clear_verdicts():
            click.echo(
                f"Deleted {len(verdicts)} AMX check verdict(s) from {llama_build.verdicts_dir()}; "
                "the next load of a quantized model with this build runs the check again."
            )
        return
    where = Path(directory) if directory else store_files.default_dir()
    stores = store_info.list_stores(where)
    if not stores:
        click.echo(f"No suffix cache in {where}.")
        return
    total = sum(s.size_bytes for s in stores)
    question = f"Delete {len(stores)} store(s) ({format_bytes(total)}, with their journals) in {where}?"
    try:
        sure = yes or click.confirm(question, default=False)
    except click.Abort:
        if sys.stdin.isatty():
            raise  # Ctrl-C at the question
        raise click.UsageError(
            "no answer on stdin (not a terminal): add --yes to delete without asking"
        ) from None
    if not sure:
        click.echo("Nothing deleted.")
        return
    gone = store_info.clear(where)
    click.echo(
        f"Deleted {len(gone)} file(s) from {where}. A localspec server or web UI that is running forgets "
        "what it held, its corpus too, at the end of its next request (restart it to index --corpus again)."
    )


def _check_namespace(value: str) -> str:
    """``--namespace`` as a store file name takes it (a usage error otherwise)."""
    try:
        store_files.store_path(".", "0" * 16, value)
    except CacheError as exc:
        raise click.BadParameter(f"{exc.message}: {exc.hint}", param_hint="'--namespace'") from None
    return value


@click.command("index")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--target", "-t", type=click.Path(dir_okay=False), help="Target GGUF (default: embedded pair).")
@click.option(
    "--namespace",
    default="default",
    show_default=True,
    callback=lambda ctx, param, value: _check_namespace(value),
    help="Store namespace (1-64 letters, digits, '.', '_' or '-'): a server with --api-key keeps its own.",
)
@click.option("--dir", "directory", type=click.Path(file_okay=False), help=_DIR_HELP)
@click.option(
    "--max-files",
    type=click.IntRange(1, 100_000),
    default=corpus.MAX_CORPUS_FILES,
    show_default=True,
    help="Stop after this many files.",
)
@click.option(
    "--max-mb",
    type=click.IntRange(1, 1000),
    default=corpus.MAX_CORPUS_BYTES // 1_000_000,
    show_default=True,
    help="Stop after this many megabytes of text.",
)
def index(
    folder: str, target: str | None, namespace: str, directory: str | None, max_files: int, max_mb: int
) -> None:
    """Index FOLDER (a repository, notes, docs) as the corpus the suffix drafter copies from.

    Tokenizes every text file with the target's own tokenizer (only its vocabulary is loaded) and
    stores it with the target's vocabulary; it replaces the corpus indexed before for that vocabulary.
    Hidden files, .git, build folders, symlinks, binary files and files over 1 MB are skipped.
    """
    from localspec.gguf.meta import read_metadata
    from localspec.gguf.vocab import fingerprint

    model = Path(target).expanduser() if target else constants.EMBEDDED_TARGET
    if not model.is_file():
        raise ModelNotFoundError(f"{model}: no such file", hint="pass --target PATH of a GGUF model")
    vocab = fingerprint(read_metadata(model))
    if not vocab.fingerprint:
        raise CacheError(f"{model} has no vocabulary", hint="pass the target model the corpus is for")
    scan = corpus.read_corpus(folder, max_files=max_files, max_bytes=max_mb * 1_000_000)
    if not scan.files:
        why = ", ".join(f"{n} {k}" for k, n in sorted(scan.skipped.items())) or "it is empty"
        raise CacheError(
            f"no text files to index in {scan.root} (skipped: {why})",
            hint="point at a folder of source files, notes or docs",
        )
    documents = _tokenize(model, [text for _, text in scan.files])
    st = storemod.SuffixStore(directory, vocab.fingerprint, namespace=namespace, n_vocab=vocab.n_vocab)
    quiet = logging.getLogger(storemod.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # what the load would log is said below, in an index's words, once
    try:
        ix = st.load()
    finally:
        quiet.setLevel(level)
    if st.unusable is not None:  # this corpus replaces the one it held: only its requests are lost
        lost = st.unusable
        held = (
            f" (its {lost.history_requests:,} earlier request(s) are gone)" if lost.history_requests else ""
        )
        click.echo(
            f"suffix cache {st.path}: {lost.problem}; starting it afresh with this folder's corpus{held}",
            err=True,
        )
    elif st.problem:
        click.echo(st.problem, err=True)
    ix.set_corpus(documents)
    st.corpus_root = str(scan.root.resolve())
    quiet.setLevel(logging.ERROR)  # a failed save is the error below, not a log line and then the error
    try:
        saved = st.save(ix)
    finally:
        quiet.setLevel(level)
    if not saved:
        raise CacheError(
            st.problem or f"cannot write {st.path}",
            hint="check that the cache folder can be created and written, and that the disk has room",
        )
    click.echo(
        f"Indexed {len(scan.files):,} file(s), {ix.corpus_tokens:,} tokens "
        f"({format_bytes(scan.n_bytes)} of text) from {scan.root} for {model.name}."
    )
    if scan.skipped:
        click.echo("Skipped: " + ", ".join(f"{n} {k}" for k, n in sorted(scan.skipped.items())) + ".")
    if scan.stopped:
        click.echo(f"Note: {scan.stopped}; raise the limit to index more.")
    click.echo(f"Store: {st.path} ({format_bytes(os.path.getsize(st.path))}).")


def _tokenize(model: Path, texts: list[str]) -> list[list[int]]:
    """Token ids of each text with the model's own tokenizer (vocab_only: no weights are loaded)."""
    import llama_cpp

    from localspec.llama.logs import quiet_stderr

    try:
        with quiet_stderr():
            llm = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    except (ValueError, RuntimeError) as exc:
        raise LocalspecError(
            f"{model}: llama.cpp cannot load its vocabulary ({exc})",
            hint="check that the file is a complete GGUF model",
        ) from exc
    try:
        return [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in texts]
    finally:
        llm.close()


COMMANDS = [cache, index]
