"""The advisory lock that saves (and clears) of one suffix store take turns under.

``fcntl.flock`` on ``<fingerprint>-<namespace>.lslock`` next to the store's snapshot. Whoever takes the
lock creates the file (0600, never followed if a symlink) and deletes it before letting go, so that the
folder holds only the store's files between saves; a process that waited on the file meanwhile finds it
deleted (or replaced) once it gets its lock, and starts over with the path's current file (a lock on a
deleted file excludes nobody). Where there is no ``fcntl`` (Windows) there is no lock, and saves go on
unlocked.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; saves go on unlocked, as they did before there was one
    fcntl = None  # type: ignore[assignment]

#: How long a save (or a clear) waits for another writer's save to finish: several times the longest a
#: save holds the lock (a full reload and a new snapshot at the default cap). Past it the save is skipped
#: (its requests stay in memory and go with the next save that gets the lock) and, until one does, saves
#: only try once.
LOCK_WAIT_SECONDS = 5.0


class NoLock(Exception):
    """A store's lock file cannot be used here (the message says why); saves go on without it."""


class LockBusy(Exception):
    """Another process held a store's lock past the wait."""


def take_lock(path: Path, wait: float) -> int | None:
    """Take the advisory lock ``path`` (created 0600 in an existing or new 0700 folder, never followed
    if a symlink), waiting up to ``wait`` seconds; its descriptor, or None where there is no ``fcntl``.
    Raises :class:`LockBusy` past the wait and :class:`NoLock` (why) when the file cannot be used.
    The holder deletes the file before it lets go (:func:`release_lock`): a waiter that then gets its
    lock on the deleted file starts over with the path's current one."""
    if fcntl is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # failing: the caller reports it
    deadline = time.monotonic() + wait
    delay = 0.001
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError as exc:
            raise NoLock(f"cannot open its lock file ({exc.strerror or exc})") from exc
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockBusy from None
                    time.sleep(delay)
                    delay = min(2 * delay, 0.05)  # most saves hold it for a millisecond or two
            held = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
        except OSError as exc:
            os.close(fd)
            raise NoLock(f"cannot lock it ({exc.strerror or exc})") from exc
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # the holder deleted it as it let go: lock the path's file now


def release_lock(path: Path, fd: int) -> None:
    """Delete the lock file ``path`` if it is still the one ``fd`` holds, then let go of the lock."""
    with contextlib.suppress(OSError):
        held = os.fstat(fd)
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            os.unlink(path)
    os.close(fd)  # releases the lock
