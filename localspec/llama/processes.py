"""Child processes that never outlive localspec: llama.cpp's programs (``rpc-server``, ``llama-server``) and
the build steps that make them (cmake, make and the compilers under them).

:func:`die_with_this_process` makes a child end when this process ends however it ends (a SIGKILL
included); :func:`stop_on_sigterm` turns a SIGTERM into the ``KeyboardInterrupt`` a Ctrl-C raises, so the
``finally:`` blocks that stop children run; :func:`call_as_group` runs a tool in its own process group and
takes the whole group down with it; :func:`stop` ends one child, politely first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def die_with_this_process() -> dict[str, Any]:
    """``subprocess.Popen`` keywords that make a child end when this process ends, however it ends: on
    Linux the kernel sends it SIGTERM (``PR_SET_PDEATHSIG``) when this process dies, even of a SIGKILL that
    leaves no time to stop it. Only for a child started from the main thread: the signal follows the thread
    that started the child, and a worker thread ending would take a long-lived child with it. Elsewhere:
    no keywords (the caller stops its children itself)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return {}
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return {}
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # this process died between the fork and now
            os._exit(1)

    return {"preexec_fn": in_child}


_PR_SET_PDEATHSIG = 1


def stop_on_sigterm() -> contextlib.AbstractContextManager[None]:
    """Within the block (on the main thread), a SIGTERM (``timeout``, a supervisor) raises
    ``KeyboardInterrupt`` like a Ctrl-C, so the ``finally:`` blocks that stop this process's children run;
    elsewhere it changes nothing."""
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()
    return _sigterm_raises()


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def call_as_group(cmd: list[str], *, cwd: Path | None, stdout: Any) -> int:
    """Run a build step (or another tool, such as llama-quantize) in its own process group and wait for it.

    Interrupted (Ctrl-C, or SIGTERM from ``timeout`` or a supervisor, which reach this process alone), it
    takes the whole group down with it: ``subprocess.call`` kills only its child (cmake), and make and the
    compilers under it went on at full CPU for minutes, re-parented to init, slowing every later
    measurement. Killed outright (SIGKILL, the OOM killer), this process cannot do that: then the kernel's
    signal (:func:`die_with_this_process`) reaches a shell in front of ``cmd``, which passes it to the whole
    group.

    Args:
        cmd: the program and its arguments.
        cwd: where it runs (None: here).
        stdout: where its output and errors go (a file, or None for this process's own).

    Returns:
        Its exit status.
    """
    dies_with = die_with_this_process()
    if dies_with:
        cmd = ["sh", "-c", _GROUP_ON_TERM, "sh", *cmd]
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=os.name == "posix",
        **dies_with,
    )
    try:
        with stop_on_sigterm():
            return proc.wait()
    except BaseException:
        _stop_group(proc)
        raise


#: The shell in front of a group's command: runs it, returns its exit status, and on SIGTERM (the kernel's,
#: when this process dies) sends SIGTERM to the whole process group, itself included.
_GROUP_ON_TERM = 'trap "trap - TERM; kill -TERM 0" TERM; "$@" & wait $!'


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the build's process group, SIGKILL after 10 s."""
    if os.name != "posix":
        proc.kill()
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def stop(proc: subprocess.Popen, *, grace_s: float = 5.0) -> None:
    """End a child that may still run: SIGTERM, then SIGKILL when it has not exited after ``grace_s``.

    Args:
        proc: the child (one that has exited already is left as it is).
        grace_s: how long it has to exit on its own after the SIGTERM.
    """
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
