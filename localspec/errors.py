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
    """Prompt plus max_tokens does not fit the context window.

    Raised before generating (:meth:`before_generating`, by :meth:`localspec.Pipeline.stream_tokens`)
    it carries the numbers (``prompt_tokens``, ``max_tokens``, ``n_ctx``, ``n_ctx_train``,
    ``at_trained_limit``: n_ctx is the model's trained context, so a larger one is no way out), and
    :meth:`reworded` says the same in another front end's option names (the command line's ``-n`` and
    ``--n-ctx``). Raised mid-generation (a model's context filled up) it carries only its message.
    """

    prompt_tokens: int | None = None
    max_tokens: int | None = None
    n_ctx: int | None = None
    n_ctx_train: int | None = None
    at_trained_limit: bool = False
    lowered_from: int | None = None

    @classmethod
    def before_generating(
        cls,
        *,
        prompt_tokens: int,
        max_tokens: int,
        n_ctx: int,
        n_ctx_train: int | None,
        at_trained_limit: bool,
        lowered_from: int | None = None,
        words: tuple[str, str, str] = ("max_tokens", "n_ctx", "load"),
    ) -> ContextOverflowError:
        """The error for a request that does not fit, worded with ``words``: the name of the setting for
        the answer's length, the one for the context, and the verb that sets the context."""
        max_name, ctx_name, load = words
        n, room = prompt_tokens, n_ctx - prompt_tokens
        lowered = f" ({ctx_name} {lowered_from} lowered to the model's trained context)" * bool(lowered_from)
        if at_trained_limit:
            hint = "shorten the prompt" + (f" or lower {max_name} to {room} or less" if room > 0 else "")
            hint += f": the model was trained on {n_ctx_train or n_ctx} tokens, the most it is loaded with"
        elif room <= 0:
            hint = (
                f"the prompt alone needs {n} tokens: shorten it, or {load} with {ctx_name} "
                f"{n + max_tokens} or more"
            )
        else:
            hint = (
                f"shorten the prompt, lower {max_name} to {room} or less, or {load} with a larger {ctx_name}"
            )
        exc = cls(
            f"the prompt ({n} tokens) plus {max_name} {max_tokens} exceeds the context window of "
            f"{n_ctx} tokens{lowered}",
            hint=hint,
        )
        exc.prompt_tokens, exc.max_tokens, exc.n_ctx = prompt_tokens, max_tokens, n_ctx
        exc.n_ctx_train, exc.at_trained_limit, exc.lowered_from = n_ctx_train, at_trained_limit, lowered_from
        return exc

    def reworded(self, max_tokens: str, n_ctx: str, load: str) -> ContextOverflowError:
        """The same error in other option names (itself when it carries no numbers)."""
        if self.prompt_tokens is None or self.max_tokens is None or self.n_ctx is None:
            return self
        return self.before_generating(
            prompt_tokens=self.prompt_tokens,
            max_tokens=self.max_tokens,
            n_ctx=self.n_ctx,
            n_ctx_train=self.n_ctx_train,
            at_trained_limit=self.at_trained_limit,
            lowered_from=self.lowered_from,
            words=(max_tokens, n_ctx, load),
        )


class SettingsError(LocalspecError, ValueError):
    """A drafting or generation setting is out of its bounds (see :mod:`localspec.settings`)."""


class PresetError(LocalspecError, ValueError):
    """A preset name that does not exist or a preset file that does not validate.

    ``path`` is the file (or folder) it was found in, when :func:`localspec.hub.presets.load_presets`
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


class RpcError(LocalspecError, ConnectionError):
    """llama.cpp's RPC backend cannot use an rpc-server: a wrong address, a server that does not answer or
    speaks another protocol version, one that stopped mid-generation, or a build without RPC."""
