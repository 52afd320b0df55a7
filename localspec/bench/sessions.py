"""Multi-request workloads: sequences of requests run in order through one pipeline.

Real local work repeats itself across requests (an editor sending the same file again, an agent's tool
calls, a conversation revising its own answers, code in the style of the user's repository). These
workloads measure what a drafter that remembers earlier requests buys. Each file in
``localspec/data/sessions/`` holds *warm* sessions (fed to a store before measuring, never measured) and
*measured* sessions; they were written and committed before any tuning.

Kinds of session:

- ``edit``: one file edited over several requests; each request sends the latest version of the file
  (the last code block of the previous answer, as an editor applying the edit would) and one instruction.
- ``agent``: a tool-calling loop; one request per step with the whole conversation so far (the model's
  own replies and scripted observations).
- ``chat``: a conversation whose turns each get the model's own earlier answers.
- ``single``: requests that stand alone (the repository workload, whose files are indexed as a corpus).

This module knows only the pipeline's public calls (``chat``); it imports nothing of the bench.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.constants import PACKAGE_DIR
from localspec.errors import BenchError

SESSIONS_DIR = PACKAGE_DIR / "data" / "sessions"
#: The shipped multi-request workloads, in the order reports show them.
SESSION_WORKLOADS: tuple[str, ...] = ("edit-session", "agent", "multi-turn", "repo-code")
_KINDS = ("edit", "agent", "chat", "single")
_CODE_BLOCK = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)

Message = dict[str, str]


@dataclass(frozen=True)
class Session:
    """One sequence of requests. ``steps`` are the instructions, observations, turns or prompts."""

    id: str
    kind: str
    steps: tuple[str, ...]
    file: str = ""  # edit: the file's name
    code: str = ""  # edit: its first version
    task: str = ""  # agent: the task


@dataclass
class SessionWorkload:
    name: str
    description: str
    max_tokens: int
    warm: list[Session]
    measured: list[Session]
    system: str = ""  # agent: the system prompt naming the tools
    template: str = ""  # edit: how a request is written
    corpus: Path | None = None  # a folder indexed as the corpus before running
    source: str = ""

    @property
    def n_measured_requests(self) -> int:
        return sum(n_requests(s) for s in self.measured)


@dataclass
class Request:
    """One request of a session as it was sent, and what came back."""

    session: str
    index: int
    messages: list[Message]
    reply: Any = None  # the pipeline's GenerationResult (a str carrying .stats)
    seconds: float = 0.0  # wall time of the whole call, prompt processing and drafter bookkeeping included
    extra: dict[str, Any] = field(default_factory=dict)


def n_requests(session: Session) -> int:
    """How many requests a session makes (an agent asks once for the task and once per observation)."""
    return len(session.steps) + (1 if session.kind == "agent" else 0)


def last_code_block(text: str) -> str | None:
    """The last fenced code block of ``text`` (an unterminated last block counts), or None."""
    blocks = _CODE_BLOCK.findall(text)
    if not blocks:
        return None
    code = blocks[-1]
    return code if code.endswith("\n") else code + "\n"


# ---------------------------------------------------------------------------------------------- loading


def _error(path: Path, what: str) -> BenchError:
    return BenchError(f"{path}: {what}", hint="see localspec/data/sessions/*.json for the layout")


def _text(row: dict, key: str, path: Path, where: str, required: bool = True) -> str:
    value = row.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise _error(path, f"{where}: {key!r} must be a non-empty string")
    return value


def _session(row: Any, path: Path, where: str) -> Session:
    if not isinstance(row, dict):
        raise _error(path, f"{where}: expected an object")
    sid = _text(row, "id", path, where)
    kind = _text(row, "kind", path, where)
    if kind not in _KINDS:
        raise _error(path, f"{where}: kind {kind!r} is not one of {', '.join(_KINDS)}")
    key = {"edit": "instructions", "agent": "observations", "chat": "turns", "single": "prompt"}[kind]
    raw = [row.get(key)] if kind == "single" else row.get(key)
    if not isinstance(raw, list) or not raw or not all(isinstance(s, str) and s.strip() for s in raw):
        raise _error(path, f"{where}: {key!r} must hold non-empty strings")
    return Session(
        id=sid,
        kind=kind,
        steps=tuple(raw),
        file=_text(row, "file", path, where, required=kind == "edit"),
        code=_text(row, "code", path, where, required=kind == "edit"),
        task=_text(row, "task", path, where, required=kind == "agent"),
    )


def load_session_workload(name_or_path: str | Path) -> SessionWorkload:
    """A shipped workload by name (:data:`SESSION_WORKLOADS`) or a session file of the same layout."""
    path = Path(name_or_path)
    if str(name_or_path) in SESSION_WORKLOADS:
        path = SESSIONS_DIR / f"{name_or_path}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(
            f"{path}: no such session file", hint=f"use one of {', '.join(SESSION_WORKLOADS)} or a path"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _error(path, f"not a JSON session file ({exc})") from None
    if not isinstance(data, dict):
        raise _error(path, "expected a JSON object")
    max_tokens = data.get("max_tokens", 128)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 4096:
        raise _error(path, "max_tokens must be a whole number from 1 to 4096")
    warm = [_session(r, path, f"warm[{i}]") for i, r in enumerate(data.get("warm") or [])]
    measured = [_session(r, path, f"measured[{i}]") for i, r in enumerate(data.get("measured") or [])]
    if not measured:
        raise _error(path, "no measured sessions")
    ids = [s.id for s in warm + measured]
    if len(set(ids)) != len(ids):
        raise _error(path, "session ids must be unique (warm sessions are never the measured ones)")
    corpus = data.get("corpus")
    corpus_dir = (path.parent / corpus) if isinstance(corpus, str) and corpus else None
    if corpus_dir is not None and not corpus_dir.is_dir():
        raise _error(path, f"corpus folder {corpus_dir} does not exist")
    name = str(data["workload"]) if isinstance(data.get("workload"), str) else path.stem
    kinds = {s.kind for s in warm + measured}
    return SessionWorkload(
        name=name,
        description=str(data.get("description", "")),
        max_tokens=max_tokens,
        warm=warm,
        measured=measured,
        system=_text(data, "system", path, "top level", required="agent" in kinds),
        template=_text(data, "template", path, "top level", required="edit" in kinds),
        corpus=corpus_dir,
        source=str(path),
    )


def corpus_files(folder: Path) -> list[Path]:
    """The text files of a corpus folder, in a stable order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


# ---------------------------------------------------------------------------------------------- running


def requests(workload: SessionWorkload, session: Session) -> Iterator[Request]:
    """The requests of ``session`` in order. Send each (set ``.reply``) before asking for the next one:
    the next request is built from the replies so far, as a real client's would be."""
    if session.kind == "single":
        yield Request(session.id, 0, [{"role": "user", "content": session.steps[0]}])
        return
    if session.kind == "edit":
        code = session.code
        for i, instruction in enumerate(session.steps):
            content = workload.template.format(file=session.file, code=code, instruction=instruction)
            req = Request(session.id, i, [{"role": "user", "content": content}])
            yield req
            code = last_code_block(str(req.reply or "")) or code
        return
    messages: list[Message] = []
    if session.kind == "agent":
        messages = [{"role": "system", "content": workload.system}, {"role": "user", "content": session.task}]
        follow_ups = list(session.steps)
        for i in range(len(follow_ups) + 1):
            req = Request(session.id, i, list(messages))
            yield req
            if i < len(follow_ups):
                messages += [
                    {"role": "assistant", "content": str(req.reply or "")},
                    {"role": "user", "content": follow_ups[i]},
                ]
        return
    for i, turn in enumerate(session.steps):  # chat
        messages.append({"role": "user", "content": turn})
        req = Request(session.id, i, list(messages))
        yield req
        messages.append({"role": "assistant", "content": str(req.reply or "")})


def run_session(
    workload: SessionWorkload,
    session: Session,
    send: Callable[[list[Message]], Any],
    *,
    clock: Callable[[], float],
) -> list[Request]:
    """Run every request of ``session`` through ``send(messages) -> reply`` in order, timing each."""
    done = []
    for req in requests(workload, session):
        t = clock()
        req.reply = send(req.messages)
        req.seconds = clock() - t
        done.append(req)
    return done
