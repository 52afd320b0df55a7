"""Ready-made model pairs, stored as TOML data (``presets/*.toml`` and the user's presets folder).

A preset file holds one or more ``[[preset]]`` tables and an optional ``[defaults]`` table merged
into each of them. A preset names a target and (optionally) a draft model, each as a Hub file
(``{ repo = "...", file = "..." }``, ``file`` may be a glob), a file shipped with localspec
(``{ embedded = "tiny-target.gguf" }``) or a local path (``{ path = "/models/x.gguf" }``).
See ``docs/presets.md`` for the full format.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from localspec import constants
from localspec.errors import PresetError, SettingsError
from localspec.settings import N_CTX_RANGE, DraftSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_REV_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
MAX_REVISION = 255
MAX_SIZE = 10**15  # 1 PB: far above any model, far below what overflows a float or an int64
#: The longest ``verified`` note a preset may carry (a sentence or two naming the sources, not a report).
MAX_VERIFIED = 400
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


@dataclass(frozen=True)
class HubRef:
    """A file (or glob) in a Hub repository at a revision."""

    repo_id: str
    filename: str  # a name or a case-insensitive glob
    revision: str = "main"
    kind: Literal["hub"] = "hub"
    path: None = None  # never a local path (so ``ref.path`` reads on either kind of ref)

    @property
    def is_local(self) -> bool:
        return False

    @property
    def is_pattern(self) -> bool:
        return any(c in self.filename for c in "*?[")

    def describe(self) -> str:
        rev = "" if self.revision == "main" else f"@{self.revision}"
        return f"{self.repo_id}{rev}/{self.filename}"

    def to_toml_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"repo": self.repo_id, "file": self.filename}
        if self.revision != "main":
            out["revision"] = self.revision
        return out


@dataclass(frozen=True)
class LocalRef:
    """A file on this machine: shipped inside localspec (``embedded``) or named by a ``path``."""

    path: Path
    kind: Literal["embedded", "path"] = "path"
    repo_id: None = None  # never a Hub repository (so ``ref.repo_id`` reads on either kind of ref)

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def is_local(self) -> bool:
        return True

    @property
    def is_pattern(self) -> bool:
        return False

    def describe(self) -> str:
        return f"{self.kind}:{self.path.name if self.kind == 'embedded' else self.path}"

    def to_toml_dict(self) -> dict[str, Any]:
        if self.kind == "embedded":
            return {"embedded": self.path.name}
        return {"path": str(self.path)}


#: Where a model comes from: ``isinstance(ref, HubRef)`` (or ``ref.kind == "hub"``) tells which.
ModelRef = HubRef | LocalRef


@dataclass(frozen=True)
class Preset:
    """A named target/draft pair with its settings and what it costs to fetch and run."""

    name: str
    target: ModelRef
    draft_model: ModelRef | None = None
    description: str = ""
    family: str = ""
    n_ctx: int = constants.DEFAULT_N_CTX
    draft: DraftSettings = field(default_factory=DraftSettings)
    chat_format: str = "auto"
    licence: str = ""
    gated: str | None = None  # None when no access request is needed, else a note saying what to accept
    #: What was checked about the repositories and file names, and how ("" when the preset does not say).
    verified: str = ""
    download_bytes: int = 0
    ram_bytes: int = 0
    source: str = "builtin"  # "builtin" | "user" | path of the file it came from

    @property
    def needs_download(self) -> bool:
        refs = [self.target] + ([self.draft_model] if self.draft_model else [])
        return any(r.kind == "hub" for r in refs)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["draft"] = self.draft.as_dict()  # the strategy by its name
        d["target"] = self.target.to_toml_dict()
        d["draft_model"] = self.draft_model.to_toml_dict() if self.draft_model else None
        return d


# ---------------------------------------------------------------------------------------------- parsing


def revision_problem(revision: object) -> str | None:
    """Why ``revision`` is not a safe Hub revision (a branch, a tag or a 40-hex commit), or None if it is.

    huggingface_hub writes ``refs/<revision>`` inside the cache, so a revision is a path as well as a
    name: ``..`` parts, a leading or doubled ``/``, backslashes and control characters are refused
    (``refs/pr/1``-style names with single slashes between plain parts are allowed).
    """
    if not isinstance(revision, str) or not revision:
        return f"revision {revision!r} must be a non-empty string"
    if _COMMIT_RE.match(revision):
        return None
    if len(revision) > MAX_REVISION:
        return f"revision is {len(revision)} characters long (at most {MAX_REVISION})"
    if any(ord(c) < 32 or ord(c) == 127 for c in revision) or "\\" in revision:
        return f"revision {revision!r} holds a backslash or a control character"
    if revision.startswith("/") or revision.endswith("/"):
        return f"revision {revision!r} starts or ends with '/'"
    for part in revision.split("/"):
        if not _REV_PART.match(part) or part.endswith(".lock") or ".." in part:
            return (
                f"revision {revision!r} is not a branch, tag or commit name (part {part!r}: letters, digits "
                "and . _ + - only, not starting with '.', no '..')"
            )
    return None


def check_revision(revision: object, *, where: str) -> str:
    """``revision`` if it is safe (see :func:`revision_problem`), else a :class:`PresetError` at ``where``."""
    problem = revision_problem(revision)
    if problem:
        raise PresetError(
            f"{where}: {problem}", hint='use a branch or tag name such as "main", or a 40-hex commit id'
        )
    assert isinstance(revision, str)
    return revision


def parse_size(value: Any, *, where: str) -> int:
    """``123``, ``"4.7 GB"``, ``"900MiB"`` -> bytes (decimal units for k/M/G/T, binary for Ki/Mi/Gi/Ti)."""
    if isinstance(value, bool):
        raise PresetError(
            f"{where}: expected a size, got {value!r}", hint='write e.g. 4700000000 or "4.7 GB"'
        )
    hint = 'write e.g. 4700000000 or "4.7 GB"'
    number: float | int | None = None
    if isinstance(value, (int, float)):
        number = value
    elif isinstance(value, str) and len(value) <= 64:
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").lower().rstrip("b")
            number = float(m.group(1)) * _UNITS[unit]
    if number is not None:
        if not (0 <= number <= MAX_SIZE):  # also refuses nan
            raise PresetError(f"{where}: {value!r} is not a size from 0 to 1 PB", hint=hint)
        return int(number)
    raise PresetError(f"{where}: {value!r} is not a size", hint='write e.g. 4700000000 or "4.7 GB"')


def _expect(table: dict, key: str, types: type | tuple, where: str, default: Any = None, required=False):
    if key not in table:
        if required:
            raise PresetError(f"{where}: missing key '{key}'", hint=f"add `{key} = ...` to that preset")
        return default
    value = table[key]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise PresetError(
            f"{where}: key '{key}' holds a {len(str(abs(value)))}-digit number, out of any sensible range",
            hint="fix the value in the preset file",
        )
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        names = " or ".join(t.__name__ for t in _as_tuple(types))
        raise PresetError(
            f"{where}: key '{key}' must be {names}, got {value!r}", hint="fix the value in the preset file"
        )
    return value


def _as_tuple(types: type | tuple) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def parse_model_ref(value: Any, where: str, *, base_dir: Path | None = None) -> ModelRef:
    """Turn ``{repo, file, revision}`` / ``{embedded}`` / ``{path}`` into a :class:`ModelRef`."""
    if not isinstance(value, dict):
        raise PresetError(
            f'{where}: expected a table like {{ repo = "org/name", file = "*.gguf" }}',
            hint="see docs/presets.md for the model reference forms",
        )
    kinds = [k for k in ("repo", "embedded", "path") if k in value]
    if len(kinds) != 1:
        raise PresetError(
            f"{where}: give exactly one of 'repo', 'embedded' or 'path' (got {kinds or 'none'})",
            hint="a Hub model needs `repo` and `file`; a local one `path`",
        )
    allowed = {"repo": {"repo", "file", "revision"}, "embedded": {"embedded"}, "path": {"path"}}[kinds[0]]
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise PresetError(
            f"{where}: unknown key(s) {', '.join(unknown)}", hint=f"allowed: {', '.join(sorted(allowed))}"
        )
    if kinds[0] == "repo":
        repo = _expect(value, "repo", str, where, required=True)
        if not REPO_ID_RE.match(repo):
            raise PresetError(
                f"{where}.repo: {repo!r} is not a Hub repository id", hint='write it as "org/name"'
            )
        filename = _expect(value, "file", str, where, required=True)
        if not filename.lower().endswith(".gguf"):
            raise PresetError(
                f"{where}.file: {filename!r} does not name a .gguf file",
                hint='use the GGUF file name or a pattern such as "*Q4_K_M.gguf"',
            )
        revision = check_revision(
            _expect(value, "revision", str, where, default="main"), where=f"{where}.revision"
        )
        return HubRef(repo_id=repo, filename=filename, revision=revision)
    if kinds[0] == "embedded":
        name = _expect(value, "embedded", str, where, required=True)
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise PresetError(
                f"{where}.embedded: {name!r} is not the name of a file shipped with localspec",
                hint='e.g. embedded = "tiny-target.gguf"',
            )
        return LocalRef(path=constants.EMBEDDED_DIR / name, kind="embedded")
    raw = Path(_expect(value, "path", str, where, required=True)).expanduser()
    if not raw.is_absolute() and base_dir is not None:
        raw = base_dir / raw
    return LocalRef(path=raw, kind="path")


_PRESET_KEYS = {
    "name",
    "description",
    "family",
    "target",
    "draft_model",
    "n_ctx",
    "draft",
    "chat_format",
    "licence",
    "gated",
    "verified",
    "download_size",
    "ram",
}
_DRAFT_KEYS = {"n_max", "n_min", "p_min", "adaptive", "strategy"}


def _parse_draft_settings(table: Any, where: str) -> DraftSettings:
    if not isinstance(table, dict):
        raise PresetError(
            f"{where}: expected a table of draft settings", hint=f"keys: {', '.join(sorted(_DRAFT_KEYS))}"
        )
    unknown = sorted(set(table) - _DRAFT_KEYS)
    if unknown:
        raise PresetError(
            f"{where}: unknown key(s) {', '.join(unknown)}", hint=f"allowed: {', '.join(sorted(_DRAFT_KEYS))}"
        )
    d = DraftSettings()
    values = {
        "n_max": _expect(table, "n_max", int, where, d.n_max),
        "n_min": _expect(table, "n_min", int, where, d.n_min),
        "p_min": _expect(table, "p_min", (int, float), where, d.p_min),
        "adaptive": _expect(table, "adaptive", bool, where, d.adaptive),
        "strategy": _expect(table, "strategy", str, where, d.strategy.name),
    }
    try:
        return DraftSettings(**values)
    except SettingsError as exc:
        # settings.py words the problem ("n_max 99 is out of range"); name the file, preset and key
        key = next((k for k in values if exc.message.startswith(k)), "")
        raise PresetError(f"{where}{'.' + key if key else ''}: {exc.message}", hint=exc.hint) from None


def _merge(defaults: dict, table: dict) -> dict:
    out = dict(defaults)
    for key, value in table.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key == "draft":
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def check_preset_name(name: str, where: str) -> str:
    """``name`` if a preset may be called that (lowercase letters, digits and ``. _ + -``), else a
    :class:`PresetError` naming ``where``."""
    if not _NAME_RE.match(name):
        raise PresetError(
            f"{where}: name {name!r} may only hold lowercase letters, digits and . _ + -",
            hint='rename the preset, e.g. "my-pair-7b"',
        )
    return name


def parse_preset(table: dict, *, where: str, source: str, base_dir: Path | None = None) -> Preset:
    """Validate one preset table; every error names ``where`` (file and preset) and the key."""
    unknown = sorted(set(table) - _PRESET_KEYS)
    if unknown:
        raise PresetError(
            f"{where}: unknown key(s) {', '.join(unknown)}",
            hint=f"allowed keys: {', '.join(sorted(_PRESET_KEYS))}",
        )
    name = check_preset_name(_expect(table, "name", str, where, required=True), where)
    target = parse_model_ref(
        _expect(table, "target", dict, where, required=True), f"{where}.target", base_dir=base_dir
    )
    draft_raw = table.get("draft_model")
    if draft_raw is None or draft_raw is False or draft_raw == "none":
        draft_model = None
    else:
        draft_model = parse_model_ref(draft_raw, f"{where}.draft_model", base_dir=base_dir)
    gated = table.get("gated", False)
    if gated is True:
        gated_note: str | None = "accept the licence on the repository page"
    elif gated is False:
        gated_note = None
    elif isinstance(gated, str):
        gated_note = gated
    else:
        raise PresetError(f"{where}: key 'gated' must be true, false or a note", hint="e.g. gated = true")
    verified = _expect(table, "verified", str, where, "")
    if len(verified) > MAX_VERIFIED:
        raise PresetError(
            f"{where}.verified: the note is {len(verified)} characters long (at most {MAX_VERIFIED})",
            hint="say in a sentence or two what was checked and where; details belong in the docs",
        )
    n_ctx = _expect(table, "n_ctx", int, where, constants.DEFAULT_N_CTX)
    low, high = N_CTX_RANGE  # what --n-ctx and load() accept
    if not low <= n_ctx <= high:
        raise PresetError(
            f"{where}.n_ctx: {n_ctx} is out of range ({low} to {high:,})",
            hint="use the model's trained context or less (4096 is usual)",
        )
    return Preset(
        name=name,
        target=target,
        draft_model=draft_model,
        description=_expect(table, "description", str, where, ""),
        family=_expect(table, "family", str, where, ""),
        n_ctx=n_ctx,
        draft=_parse_draft_settings(table.get("draft", {}), f"{where}.draft"),
        chat_format=_expect(table, "chat_format", str, where, "auto"),
        licence=_expect(table, "licence", str, where, ""),
        gated=gated_note,
        verified=verified,
        download_bytes=parse_size(table.get("download_size", 0), where=f"{where}.download_size"),
        ram_bytes=parse_size(table.get("ram", 0), where=f"{where}.ram"),
        source=source,
    )


def load_file(path: Path, *, source: str, problems: list[PresetError] | None = None) -> list[Preset]:
    """All presets of one TOML file (``source``: "builtin" or "user"; ``problems``: as in parse_text)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PresetError(
            f"{path}: cannot read ({exc.strerror or exc})", hint="check the file's permissions"
        ) from exc
    return parse_text(raw, path=path, source=source, problems=problems)


def parse_text(
    raw: bytes | str, *, path: Path, source: str, problems: list[PresetError] | None = None
) -> list[Preset]:
    """All presets of one TOML document (``path`` names it in errors and anchors relative paths).

    Anything wrong raises :class:`PresetError` naming ``path``: bad UTF-8, bad TOML, nesting too deep
    for the parser, out-of-range numbers, unknown keys. With a ``problems`` list, a fault inside one
    ``[[preset]]`` table goes there instead (its ``preset`` set to the preset's name) and only that
    preset is left out: one typo does not take the file's other presets with it. A fault of the file
    as a whole (its encoding, its syntax, its ``[defaults]``) still raises.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise PresetError(
            f"{path}: not UTF-8 text (byte {exc.start} is {raw[exc.start : exc.start + 1]!r})",
            hint="save the file as UTF-8",
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"{path}: not valid TOML ({exc})", hint="fix the syntax at the line shown") from exc
    except RecursionError:
        raise PresetError(
            f"{path}: nested too deeply to read", hint="a preset needs only a few levels"
        ) from None
    except ValueError as exc:  # e.g. an integer too long to convert
        raise PresetError(f"{path}: cannot be read as TOML ({exc})", hint="fix the value shown") from None
    unknown = sorted(set(data) - {"defaults", "preset"})
    if unknown:
        raise PresetError(
            f"{path}: unknown top-level key(s) {', '.join(unknown)}",
            hint="a preset file holds [defaults] and [[preset]] tables only",
        )
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise PresetError(f"{path}: 'defaults' must be a table", hint="write it as [defaults]")
    tables = data.get("preset", [])
    if not isinstance(tables, list) or not tables:
        raise PresetError(
            f"{path}: no [[preset]] table", hint="add at least one [[preset]] with name and target"
        )
    out = []
    for i, table in enumerate(tables):
        name = table.get("name") if isinstance(table, dict) else None
        label = str(name if name is not None else f"#{i + 1}")[:80]
        where = f"{path} [preset {label}]"
        try:
            if not isinstance(table, dict):
                raise PresetError(f"{where}: expected a table", hint="write each preset as [[preset]]")
            out.append(
                parse_preset(_merge(defaults, table), where=where, source=source, base_dir=path.parent)
            )
        except PresetError as exc:
            if problems is None:
                raise
            exc.preset = name if isinstance(name, str) else None
            problems.append(exc)
    return out


def _load_dir(folder: Path, source: str, problems: list[PresetError]) -> list[Preset]:
    """Every preset in ``folder``. A file that does not load goes to ``problems`` and is skipped whole;
    a preset that does not (a bad value, a name an earlier file took) goes there alone."""
    try:
        paths = sorted(p for p in folder.glob("*.toml") if p.is_file()) if folder.is_dir() else []
    except OSError as exc:
        problem = PresetError(f"{folder}: cannot list ({exc})", hint="check the folder's permissions")
        problem.path = str(folder)
        problems.append(problem)
        return []
    presets: list[Preset] = []
    seen: dict[str, Path] = {}
    for path in sorted(paths):
        found: list[PresetError] = []
        try:
            loaded = load_file(path, source=source if source == "builtin" else str(path), problems=found)
        except PresetError as exc:
            found, loaded = [exc], []
        for preset in loaded:
            if preset.name in seen:
                twin = PresetError(
                    f"{path} [preset {preset.name}]: the name is also used in {seen[preset.name]}",
                    hint="rename one of them",
                )
                twin.preset = preset.name
                found.append(twin)
                continue
            seen[preset.name] = path
            presets.append(preset)
        for problem in found:
            problem.path = str(path)
        problems.extend(found)
    return presets


def load_presets() -> tuple[list[Preset], list[PresetError]]:
    """Built-in presets plus the user's, and one :class:`PresetError` per file or preset that was skipped.

    A user preset replaces a built-in one of the same name. A broken file never hides the others:
    it is reported (by path, with the key and a next step) and left out.
    """
    problems: list[PresetError] = []
    by_name = {p.name: p for p in _load_dir(constants.builtin_presets_dir(), "builtin", problems)}
    for p in _load_dir(constants.user_presets_dir(), "user", problems):
        by_name[p.name] = p
    return list(by_name.values()), problems


def builtin_preset_names() -> set[str]:
    """The names of the presets that come with localspec."""
    return {p.name for p in _load_dir(constants.builtin_presets_dir(), "builtin", [])}


def list_presets() -> list[Preset]:
    """Every preset that loads (see :func:`load_presets`; :func:`preset_problems` lists the skipped files)."""
    return load_presets()[0]


def preset_problems() -> list[PresetError]:
    """One error per preset file or preset skipped because it does not load (empty when all are fine)."""
    return load_presets()[1]


def get_preset(name: str) -> Preset:
    """The preset called ``name``; an unknown name raises :class:`PresetError` listing close matches."""
    found, problems = load_presets()
    presets = {p.name: p for p in found}
    if name in presets:
        return presets[name]
    for problem in problems:
        if problem.preset == name:  # it exists, but does not load: say why, not "no such preset"
            raise PresetError(
                f"preset '{name}' was skipped: {' '.join(problem.message.split())}", hint=problem.hint
            )
    close = difflib.get_close_matches(name, presets, n=5, cutoff=0.5)
    close += [n for n in presets if name.lower() in n and n not in close][: 5 - len(close)]
    msg = f"no preset named '{name}'"
    if close:
        msg += f"; did you mean: {', '.join(close)}?"
    files = [p for p in problems if p.preset is None]
    if files:
        msg += (
            f" ({len(files)} preset file(s) were skipped: "
            + "; ".join(str(p.message).split("\n")[0][:200] for p in files[:3])
            + ")"
        )
    fix = " (and fix the skipped files named)" if files else ""
    raise PresetError(msg, hint=f"run `localspec presets` to list them all{fix}")


def user_preset_path(name: str) -> Path:
    """Where :func:`save_user_preset` writes the user preset ``name``."""
    return constants.user_presets_dir() / f"{name}.toml"


def save_user_preset(preset: Preset | dict, name: str | None = None) -> Path:
    """Write a preset into the user presets folder as ``<name>.toml`` and return the path.

    ``preset`` may be a :class:`Preset` (e.g. a built-in one with tuned ``draft`` settings, via
    ``dataclasses.replace``) or a dict in the TOML layout. It is validated before writing.
    """
    if isinstance(preset, Preset):
        table = _preset_to_table(replace(preset, name=name or preset.name))
    else:
        table = dict(preset)
        if name:
            table["name"] = name
    folder = constants.user_presets_dir()
    final_name = table.get("name", "")
    path = user_preset_path(final_name)
    parse_preset(table, where=f"{path} [preset {final_name}]", source=str(path), base_dir=folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(dump_toml({"preset": [table]}), encoding="utf-8")
    tmp.replace(path)
    return path


def _preset_to_table(p: Preset) -> dict[str, Any]:
    table: dict[str, Any] = {
        "name": p.name,
        "description": p.description,
        "family": p.family,
        "target": p.target.to_toml_dict(),
    }
    if p.draft_model:
        table["draft_model"] = p.draft_model.to_toml_dict()
    table.update(
        n_ctx=p.n_ctx,
        chat_format=p.chat_format,
        licence=p.licence,
        gated=p.gated if p.gated else False,
    )
    if p.verified:
        table["verified"] = p.verified
    table.update(
        download_size=p.download_bytes,
        ram=p.ram_bytes,
    )
    table["draft"] = p.draft.as_dict()
    return table


# ------------------------------------------------------------------------------------ a tiny TOML writer


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, Path):
        return _toml_value(str(v))
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dump_toml(data: dict[str, list[dict[str, Any]]]) -> str:
    """Write ``{"preset": [tables]}``: scalars and inline tables first, the ``draft`` table last."""
    lines: list[str] = []
    for table in data["preset"]:
        lines.append("[[preset]]")
        sub = {k: v for k, v in table.items() if k == "draft" and isinstance(v, dict)}
        for key, value in table.items():
            if key in sub or value is None:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        for value in sub.values():
            lines.append("")
            lines.append("[preset.draft]")
            lines.extend(f"{k} = {_toml_value(x)}" for k, x in value.items())
        lines.append("")
    return "\n".join(lines)
