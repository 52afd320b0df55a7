"""Every error localspec raises on purpose, each with a next step a person can act on.

Each class also inherits the builtin a caller would naturally catch (``ValueError``,
``FileNotFoundError``, ...). The CLI and the UI turn these into friendly messages at
their edge; the library never prints.
"""

from __future__ import annotations


class LocalspecError(Exception):
    """Base class. ``hint`` is the next step for the user (a command, a flag, a fix)."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  -> {self.hint}" if self.hint else self.message


class GGUFError(LocalspecError, ValueError):
    """A file is not a readable GGUF model. Names the file and the byte offset."""

    def __init__(self, path: str, message: str, *, offset: int | None = None, hint: str | None = None):
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(
            f"{path}: {message}{where}",
            hint=hint or "check that the file is a complete GGUF model (re-download it if it was cut short)",
        )
        self.path = path
        self.offset = offset


class ModelNotFoundError(LocalspecError, FileNotFoundError):
    """A model path or name that does not exist."""


class IncompatiblePairError(LocalspecError, ValueError):
    """A draft whose vocabulary does not fit the target (carries the verdict's reasons)."""

    def __init__(self, message: str, *, reasons: list[str] | None = None, hint: str | None = None):
        self.reasons = list(reasons or [])
        detail = "".join(f"\n  - {r}" for r in self.reasons)
        super().__init__(
            message + detail,
            hint=hint or "run `localspec pair TARGET` to list drafts that fit, or use --draft ngram",
        )


class UnusableModelError(LocalspecError, ValueError):
    """A file that is a GGUF but cannot serve as a model here (mmproj, vocab-only, shard, recurrent)."""


class BuildError(LocalspecError, RuntimeError):
    """The installed llama.cpp build cannot run a model on this machine (its AMX kernels crash here)."""


class ContextOverflowError(LocalspecError, ValueError):
    """Prompt plus max_tokens does not fit the context window."""


class SettingsError(LocalspecError, ValueError):
    """A drafting or generation setting is out of its bounds (see :mod:`localspec.settings`)."""


class PresetError(LocalspecError, ValueError):
    """A preset name that does not exist or a preset file that does not validate.

    ``path`` is the file (or folder) it was found in, when :func:`localspec.presets.load_presets`
    reports one, and ``preset`` the name of the one preset that was left out for it (None when the
    whole file was).
    """

    path: str | None = None
    preset: str | None = None


class DownloadError(LocalspecError, OSError):
    """A download from the Hugging Face Hub failed."""


class GatedRepoError(DownloadError):
    """The repository needs an access token or accepted terms."""


class OfflineError(DownloadError):
    """HF_HUB_OFFLINE is set and the files are not in the cache."""


class DiskSpaceError(DownloadError):
    """Not enough free disk space for a download."""


class BenchError(LocalspecError, ValueError):
    """A benchmark input (prompt file, option) that cannot be used."""


class CacheError(LocalspecError, ValueError):
    """The suffix cache (its store files, a corpus folder to index) cannot be used as asked."""


class MessageError(LocalspecError, ValueError):
    """Chat ``messages`` that are not a list of ``{"role", "content"}`` turns; ``param`` names the field."""

    def __init__(self, message: str, *, param: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.param = param


class GrammarError(LocalspecError, ValueError):
    """A grammar, JSON schema or ``response_format`` that cannot constrain a reply; ``param`` names it."""

    def __init__(self, message: str, *, param: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.param = param
