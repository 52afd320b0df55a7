"""The workload vocabulary: prompts, workloads and their files, at the bottom of the bench family.

``bench`` (the runs), ``benchmath`` (the arithmetic), ``tune`` (the sweep), ``peer`` (llama.cpp's side) and
``report`` (the files) all speak in these types; this module imports none of them. A new workload is a JSONL
file in ``localspec/data/prompts/`` plus its name in :data:`WORKLOADS` and a title in
:data:`WORKLOAD_TITLES`.

Most workloads are independent prompts: the bench interleaves configs per prompt. A *sequential* workload
(``Workload.sequential``) is one session of requests whose order matters (an edit session, an agent loop):
the bench runs all its prompts in order through one pipeline for each config, so state a drafter keeps
between requests (a suffix cache) builds up as it would for a user.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.constants import PACKAGE_DIR
from localspec.errors import BenchError
from localspec.settings import DraftSettings

#: The shipped workloads a bench runs by default, in the order reports show them.
WORKLOADS: tuple[str, ...] = ("code", "summarise", "chat", "translate", "edit", "creative")
#: Prompts where copying from the prompt cannot help (new code from a description, explanations, chat):
#: the draft model's own ground, where a big target (``bench --wide-target``) shows what it can do.
BIG_TARGET_WORKLOADS: tuple[str, ...] = ("write-code", "explain", "chat")
#: Every shipped workload, the defaults first.
ALL_WORKLOADS: tuple[str, ...] = (*WORKLOADS, *(w for w in BIG_TARGET_WORKLOADS if w not in WORKLOADS))
#: Names that stand for several workloads (``--workloads big-target``).
WORKLOAD_SETS: dict[str, tuple[str, ...]] = {"big-target": BIG_TARGET_WORKLOADS}
WORKLOAD_TITLES: dict[str, str] = {
    "code": "code completion",
    "summarise": "summarisation",
    "chat": "open chat",
    "translate": "translation",
    "edit": "code edit",
    "creative": "creative writing",
    "write-code": "code from a description",
    "explain": "explanations",
}
PROMPTS_DIR = PACKAGE_DIR / "data" / "prompts"


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. ``chat`` prompts go through the model's chat template."""

    id: str
    text: str
    chat: bool = True


@dataclass
class Workload:
    """A named list of prompts. ``sequential``: the prompts are one session, run in order (see module doc)."""

    name: str
    prompts: list[Prompt]
    source: str = ""
    sequential: bool = False

    @property
    def title(self) -> str:
        return WORKLOAD_TITLES.get(self.name, self.name)

    def limited(self, limit: int | None) -> Workload:
        """The first ``limit`` prompts (all when ``limit`` is None or 0)."""
        if not limit:
            return self
        return Workload(self.name, self.prompts[:limit], self.source, self.sequential)


def _line_error(path: Path, lineno: int, what: str) -> BenchError:
    return BenchError(
        f"{path}:{lineno}: {what}",
        hint='use one prompt per line, or JSONL lines like {"prompt": "..."} (optional "id", "chat")',
    )


def load_prompts(
    path: str | Path, name: str | None = None, *, chat_default: bool = True, sequential: bool = False
) -> Workload:
    """Read a prompt file: JSONL (``.jsonl``, or a first line starting with ``{``) or one prompt per line.

    A malformed line raises :class:`BenchError` naming the file and the line number.
    """
    path = Path(path)
    try:
        if path.exists() and not path.is_file():
            raise BenchError(f"{path}: not a regular file", hint="give the path of a prompt file")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise BenchError(f"{path}: prompt file not found", hint="check the --prompts path") from exc
    except UnicodeDecodeError as exc:
        raise BenchError(f"{path}: not UTF-8 text", hint="save the prompt file as UTF-8") from exc
    lines = text.splitlines()
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    jsonl = path.suffix.lower() in (".jsonl", ".json") or first.startswith("{")
    prompts: list[Prompt] = []
    stem = name or path.stem
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(f"{stem}-{len(prompts) + 1:02d}", line.strip(), chat_default))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _line_error(path, lineno, f"not valid JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(row, dict):
            raise _line_error(path, lineno, f"expected a JSON object, got {type(row).__name__}")
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise _line_error(path, lineno, 'missing or empty "prompt" string')
        chat = row.get("chat", chat_default)
        if not isinstance(chat, bool):
            raise _line_error(path, lineno, '"chat" must be true or false')
        pid = row.get("id", f"{stem}-{len(prompts) + 1:02d}")
        prompts.append(Prompt(str(pid), prompt, chat))
    if not prompts:
        raise BenchError(f"{path}: no prompts in the file", hint="add one prompt per line")
    return Workload(stem, prompts, str(path), sequential)


def workload_choices() -> list[str]:
    """Every name ``--workloads`` takes: the shipped workloads and the sets."""
    return [*ALL_WORKLOADS, *WORKLOAD_SETS]


def builtin_workload(name: str) -> Workload:
    """One of the shipped workloads (:data:`ALL_WORKLOADS`)."""
    if name not in ALL_WORKLOADS:
        raise BenchError(f"unknown workload {name!r}", hint=f"choose from: {', '.join(workload_choices())}")
    return load_prompts(PROMPTS_DIR / f"{name}.jsonl", name)


def expand_workloads(names: Iterable[str]) -> list[str]:
    """Workload names with each set (:data:`WORKLOAD_SETS`) replaced by its members, without repeats."""
    out: list[str] = []
    for name in names:
        for member in WORKLOAD_SETS.get(name, (name,)):
            if member not in out:
                out.append(member)
    return out


def select_workloads(names: Iterable[str] | None = None, limit: int | None = None) -> list[Workload]:
    """Shipped workloads or sets by name (the defaults, :data:`WORKLOADS`, when ``names`` is empty), each
    cut to its first ``limit`` prompts."""
    return [builtin_workload(n).limited(limit) for n in expand_workloads(names or WORKLOADS)]


def load_workloads(
    names: Sequence[str] | None = None, prompts_file: str | Path | None = None, limit: int | None = None
) -> list[Workload]:
    """The user's prompt file (one workload) when given, else the shipped workloads ``names``."""
    if prompts_file:
        return [load_prompts(prompts_file).limited(limit)]
    return select_workloads(names, limit)


#: Runs one prompt under one setting for ``max_tokens`` and returns its stats dict
#: (``GenerationStats.as_dict()`` plus ``text``): ``bench.engine_runner`` for localspec, ``peer.peer_runner``
#: for llama.cpp.
Runner = Callable[[Prompt, DraftSettings, int], dict]

#: The engine of our side's runs, and of llama.cpp's (``--peer``).
LOCALSPEC, LLAMA_CPP = "localspec", "llama.cpp"


@dataclass(frozen=True)
class RunRecord:
    """One run of one prompt under one setting: what :func:`localspec.bench.single.run_interleaved` keeps,
    :func:`localspec.bench.arithmetic.summarise` groups into cells and a report writes (:meth:`as_dict`)."""

    engine: str  # LOCALSPEC or LLAMA_CPP
    workload: str  # Workload.name
    prompt_id: str  # Prompt.id
    config: str  # DraftSettings.label
    repeat: int  # 0, 1, ...; -1: an uncounted warm-up
    stats: dict  # what the runner returned (GenerationStats.as_dict() plus ``text``)

    @property
    def counted(self) -> bool:
        """Whether the run counts (a warm-up does not)."""
        return self.repeat >= 0

    def as_dict(self, *, text_chars: int | None = None) -> dict[str, Any]:
        """The record as a report writes it; ``text_chars``: the generated text cut to that length."""
        stats = self.stats
        if text_chars is not None:
            stats = {**stats, "text": (stats.get("text") or "")[:text_chars]}
        return {
            "engine": self.engine,
            "workload": self.workload,
            "prompt_id": self.prompt_id,
            "config": self.config,
            "repeat": self.repeat,
            "stats": stats,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        """A record read back from :meth:`as_dict` (a bench.json; one written before engines were named is
        ours)."""
        return cls(
            engine=str(d.get("engine") or LOCALSPEC),
            workload=str(d["workload"]),
            prompt_id=str(d["prompt_id"]),
            config=str(d["config"]),
            repeat=int(d["repeat"]),
            stats=dict(d.get("stats") or {}),
        )
