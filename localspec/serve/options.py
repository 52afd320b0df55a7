"""How ``localspec serve`` listens and what it accepts (:class:`ServeOptions`), and its exposure line."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.errors import LocalspecError
from localspec.serve.exposure import check_exposure
from localspec.settings import STRATEGIES

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_BODY_BYTES = 8_000_000  # 8 MB (decimal, as localspec.units formats it)
API_KEY_ENV = "LOCALSPEC_API_KEY"


@dataclass(frozen=True)
class ServeOptions:
    """How the endpoint listens and what it accepts.

    ``model_id`` is the id ``/v1/models`` reports (default: the target's file name without ``.gguf``);
    it and every name in ``aliases`` (e.g. the preset's name) are accepted as a request's ``model``.
    ``strategy`` overrides the pipeline's drafting strategy for every request (one of
    :data:`localspec.settings.STRATEGIES`).
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    insecure_no_auth: bool = False
    max_queue: int = DEFAULT_MAX_QUEUE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    model_id: str | None = None
    aliases: tuple[str, ...] = ()
    strategy: str | None = None

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ServeError(
                "the API key is empty", hint=f"give a non-empty --api-key (or {API_KEY_ENV}), or leave it out"
            )
        if self.max_queue < 1:
            raise ServeError(f"max queue {self.max_queue} must be at least 1", hint="e.g. --max-queue 64")
        if self.max_body_bytes < 1024:
            raise ServeError(
                f"a body limit of {self.max_body_bytes} bytes is too small for any request",
                hint="use at least 1 KB (the default is 8 MB)",
            )
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise ServeError(
                f"strategy {self.strategy!r} is not one of {', '.join(STRATEGIES)}",
                hint="leave --strategy out to use the pair's own",
            )


class ServeError(LocalspecError, ValueError):
    """A server option that cannot work, or an address that cannot be bound."""


def exposure_line(opts: ServeOptions) -> str:
    """The exposure rule for this endpoint: raises ``ExposureError`` for an exposed bind without a key."""
    return check_exposure(
        opts.host,
        what="the HTTP API",
        has_auth=opts.api_key is not None,
        insecure_no_auth=opts.insecure_no_auth,
        auth_flag=f"--api-key KEY (or set {API_KEY_ENV})",
    )
