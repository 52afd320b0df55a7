"""The one place that reads environment variables and knows default paths.

Functions, not module-level values, so tests can set variables (``HF_HOME``, ``LOCALSPEC_HOME``...) with
monkeypatch and see them take effect. Every variable localspec honours:

==========================  ==========================================================================
Variable                    Effect (accessor)
==========================  ==========================================================================
``LOCALSPEC_HOME``          cache folder: scan cache, fingerprints, peer build (:func:`localspec_home`);
                            default ``$XDG_CACHE_HOME/localspec`` (``~/.cache/localspec``)
``LOCALSPEC_CONFIG``        config folder, user presets in ``presets/`` (:func:`config_dir`); default
                            ``$XDG_CONFIG_HOME/localspec`` (``~/.config/localspec``)
``LOCALSPEC_MODELS``        extra model folders for ``scan``/``pair``, separated by ``os.pathsep``
                            (``:`` on Linux and macOS, ``;`` on Windows) (:func:`extra_model_dirs`)
``LOCALSPEC_PEER_DIR``      where llama.cpp's own programs are built (``bench --peer``'s server,
                            ``rpc-server``) (:func:`peer_dir`)
``LOCALSPEC_VERBOSE``       any non-empty value: llama.cpp's own log is shown (:func:`verbose`)
``LOCALSPEC_API_KEY``       ``serve``'s API key, as ``--api-key`` (read by click: ``cli/serve.py``)
``LOCALSPEC_UI_AUTH``       ``ui``'s ``user:password`` login, as ``--auth`` (read by click: ``cli/ui.py``)
``LOCALSPEC_NO_STORE``      any non-empty value: the suffix cache keeps nothing on disk, in every command,
                            the web UI and the Python API (as ``--no-store``) (:func:`no_store`)
``LOCALSPEC_TRUST_AMX``     any non-empty value: load models without first checking that the llama.cpp
                            build's AMX kernels survive here (:func:`trust_amx`, :mod:`localspec.llama.build`)
``LLAMA_CPP_LIB_PATH``      read by llama-cpp-python: load another llama.cpp build; part of the key of a
                            kept AMX verdict (:func:`llama_cpp_lib_path`)
``XDG_CACHE_HOME``          base of the default cache folders (localspec's and Hugging Face's)
``XDG_CONFIG_HOME``         base of the default config folder
``HF_HOME``                 Hugging Face home, default ``$XDG_CACHE_HOME/huggingface`` (:func:`hf_home`)
``HF_HUB_CACHE``            the Hub download cache, default ``$HF_HOME/hub`` (:func:`hf_hub_cache`);
``HUGGINGFACE_HUB_CACHE``   the older name of ``HF_HUB_CACHE``, used when that is unset
``HF_ENDPOINT``             the Hub to talk to, e.g. a mirror (:func:`hf_endpoint`)
``HF_TOKEN``                access token for gated or private repositories (:func:`hf_token`);
``HUGGING_FACE_HUB_TOKEN``  the older name of ``HF_TOKEN``; with neither, huggingface_hub's saved login
``HF_HUB_OFFLINE``          ``1``/``true``/``yes``/``on``: no network, files from the cache only
                            (:func:`hf_offline`)
``OLLAMA_MODELS``           Ollama's model folder, scanned first (:func:`ollama_dirs`)
``CMAKE_ARGS``              extra CMake flags for the ``bench --peer`` build (:func:`cmake_args`)
==========================  ==========================================================================

Not read by localspec but by the libraries it drives: ``HF_HUB_DISABLE_XET`` is forced on for
localspec's downloads (see :mod:`localspec.hub.download`); ``HF_HUB_*`` timeouts and proxies (``HTTPS_PROXY``)
act through huggingface_hub as documented there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
EMBEDDED_DIR = PACKAGE_DIR / "embedded"
EMBEDDED_TARGET = EMBEDDED_DIR / "tiny-target.gguf"
EMBEDDED_DRAFT = EMBEDDED_DIR / "tiny-draft.gguf"
EMBEDDED_PRESET = "tiny-embedded"

DEFAULT_N_CTX = 4096
#: Host memory, in MB, that a pipeline's prompt caches may hold (the states of prompts its sequences held
#: before, for later requests that start the same way: localspec.llama.prompt_cache).
DEFAULT_PROMPT_CACHE_MB = 2000
DEFAULT_MAX_TOKENS = 256


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def localspec_home() -> Path:
    """Cache folder for fingerprints, benchmark peers and other derived data."""
    return (
        _env_path("LOCALSPEC_HOME")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "localspec"
    )


def delete_files(folder: Path, *patterns: str) -> list[Path]:
    """Delete the files in ``folder`` (of localspec's cache folder) whose names match ``patterns``; returns
    them. A folder that does not exist, or a file another process removed first, is no error."""
    gone: list[Path] = []
    try:
        paths = [path for pattern in patterns for path in folder.glob(pattern)]
    except OSError:
        return gone
    for path in paths:
        try:
            path.unlink()
            gone.append(path)
        except FileNotFoundError:
            pass
    return gone


def config_dir() -> Path:
    """User config folder (user presets live in ``presets/`` under it)."""
    return (
        _env_path("LOCALSPEC_CONFIG")
        or Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")).expanduser() / "localspec"
    )


def user_presets_dir() -> Path:
    return config_dir() / "presets"


def builtin_presets_dir() -> Path:
    """Presets shipped with localspec: ``presets/`` in a checkout, package data when installed."""
    checkout = PACKAGE_DIR.parent / "presets"
    if checkout.is_dir():
        return checkout
    from importlib.resources import files

    return Path(str(files("localspec.presets_data")))


def hf_home() -> Path:
    return (
        _env_path("HF_HOME")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "huggingface"
    )


def hf_hub_cache() -> Path:
    return _env_path("HF_HUB_CACHE") or _env_path("HUGGINGFACE_HUB_CACHE") or hf_home() / "hub"


def hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def lmstudio_dirs() -> list[Path]:
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def ollama_dirs() -> list[Path]:
    dirs = []
    env = _env_path("OLLAMA_MODELS")
    if env:
        dirs.append(env)
    dirs.append(Path.home() / ".ollama" / "models")
    if sys.platform.startswith("linux"):
        dirs.append(Path("/usr/share/ollama/.ollama/models"))
    return dirs


def extra_model_dirs() -> list[Path]:
    """Folders named in ``LOCALSPEC_MODELS`` (os.pathsep-separated)."""
    value = os.environ.get("LOCALSPEC_MODELS", "")
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()]


def default_scan_dirs() -> list[Path]:
    """Where ``localspec scan`` looks when given no path: only folders that exist."""
    candidates = [*extra_model_dirs(), hf_hub_cache(), *lmstudio_dirs(), *ollama_dirs()]
    seen: list[Path] = []
    for c in candidates:
        if c.is_dir() and c not in seen:
            seen.append(c)
    return seen


def default_threads() -> int:
    """Physical cores are what llama.cpp scales with; fall back to logical count."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # pragma: no cover - psutil missing or odd platform
        n = None
    return max(1, n or os.cpu_count() or 1)


def hf_endpoint() -> str:
    """The Hub to talk to (``HF_ENDPOINT``, e.g. a mirror or a test server)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hf_token() -> str | None:
    """``HF_TOKEN`` (or the older ``HUGGING_FACE_HUB_TOKEN``); None lets huggingface_hub use a saved login."""
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def verbose() -> bool:
    """``LOCALSPEC_VERBOSE`` set to anything non-empty: show llama.cpp's own log (runtime.py)."""
    return bool(os.environ.get("LOCALSPEC_VERBOSE"))


def no_store() -> bool:
    """``LOCALSPEC_NO_STORE`` set to anything non-empty: the suffix cache stays in memory (suffix/cache)."""
    return bool(os.environ.get("LOCALSPEC_NO_STORE"))


def trust_amx() -> bool:
    """``LOCALSPEC_TRUST_AMX`` set to anything non-empty: skip the AMX crash probe (llama_build.py)."""
    return bool(os.environ.get("LOCALSPEC_TRUST_AMX"))


def llama_cpp_lib_path() -> str | None:
    """``LLAMA_CPP_LIB_PATH``: the folder llama-cpp-python loads llama.cpp's libraries from, if set."""
    return os.environ.get("LLAMA_CPP_LIB_PATH") or None


def cmake_args() -> str:
    """``CMAKE_ARGS``: extra CMake flags (the same GPU flags as the llama-cpp-python wheel build)."""
    return os.environ.get("CMAKE_ARGS", "")


def peer_dir() -> Path:
    """Where llama.cpp's own programs are built and kept: ``localspec bench --peer``'s server, ``localspec
    rpc-server`` (``LOCALSPEC_PEER_DIR``)."""
    return _env_path("LOCALSPEC_PEER_DIR") or localspec_home() / "peer"
