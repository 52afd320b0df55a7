"""A small local stand-in for the Hugging Face Hub, enough for huggingface_hub 2.x to run for real.

It serves the endpoints the library calls for ``hf_hub_download``, ``snapshot_download``,
``HfFileSystem`` range reads, ``model_info``, ``list_repo_tree``, ``get_paths_info`` and
``list_models``, from repositories built out of files on disk:

- ``HEAD/GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag``; for LFS files (``*.gguf``)
  also ``X-Linked-Etag``/``X-Linked-Size`` (sha256 and size) and, when ``redirect_lfs`` is on, a
  302 to a "CDN" URL on another origin (``localhost`` instead of ``127.0.0.1``), like the real Hub.
  GET honours ``Range`` (206 + ``Content-Range``).
- ``GET /api/models/{repo}[/revision/{rev}]``, ``GET /api/models/{repo}/tree/{rev}[/{path}]``,
  ``POST /api/models/{repo}/paths-info/{rev}``, ``GET /api/models?search=&author=``.

Gated repos answer 401 (no token) or 403 (a token without access) with ``X-Error-Code: GatedRepo``;
unknown repos 401 ``RepoNotFound``; missing files 404 ``EntryNotFound``. Every request is logged
(method, path, requested range, status, body bytes sent) so tests can assert what went over the
wire. ``drop_after[path] = n`` makes the next full GET of that file stop after ``n`` bytes and close
the connection, to exercise resuming.

Hostile modes, for the checks localspec makes on what a server sends:

- ``corrupt`` ("repo/path" keys): the file's bytes are served with one byte flipped, under the true
  headers (size, ``ETag``/``X-Linked-Etag`` with the real hashes), as a bad mirror or proxy would;
- ``xet = True``: resolve answers carry the Xet headers the real Hub sends for Xet-stored files
  (``X-Xet-Hash``, ``X-Xet-Refresh-Route``); the refresh route itself answers 404 and is logged, so a
  test sees whether a client tried the Xet protocol instead of plain HTTP;
- ``extra_siblings[repo]``: names added to the repository listing (``model_info``) only, e.g.
  ``../../x.gguf``, as a hostile listing would.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".bin", ".safetensors")


@dataclass
class RepoFileEntry:
    path: str
    local: Path
    size: int
    sha256: str
    git_oid: str

    @property
    def is_lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, RepoFileEntry]
    commit: str
    gated: bool = False
    tags: list[str] = field(default_factory=list)
    downloads: int = 0

    @property
    def author(self) -> str:
        return self.repo_id.split("/", 1)[0]


@dataclass
class LogEntry:
    method: str
    path: str
    status: int
    range_start: int | None = None
    range_end: int | None = None  # inclusive
    bytes_sent: int = 0
    authorization: str | None = None


def _git_oid(data_size: int, digest_source: Path) -> str:
    h = hashlib.sha1(f"blob {data_size}\0".encode())
    with open(digest_source, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class FakeHub:
    """Start with ``with FakeHub(tmp_path) as hub:``; ``hub.endpoint`` goes into ``HF_ENDPOINT``."""

    def __init__(self, root: Path, *, redirect_lfs: bool = False, tokens: dict[str, set[str]] | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.repos: dict[str, FakeRepo] = {}
        self.redirect_lfs = redirect_lfs
        self.tokens = tokens or {}  # token -> set of gated repo ids it may read
        self.log: list[LogEntry] = []
        self.drop_after: dict[str, int] = {}  # "repo/path" -> bytes to send before cutting the connection
        self.corrupt: set[str] = set()  # "repo/path" served with a flipped byte under the true headers
        self.xet = False  # send Xet headers on resolve
        self.extra_siblings: dict[str, list[dict]] = {}  # repo -> extra listing entries
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------ repositories
    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        *,
        gated: bool = False,
        tags: list[str] | None = None,
        downloads: int = 0,
    ) -> FakeRepo:
        folder = self.root / repo_id.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        entries: dict[str, RepoFileEntry] = {}
        for name, content in files.items():
            local = folder / name
            local.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                local.write_bytes(content)
            else:
                shutil.copyfile(content, local)
            size = local.stat().st_size
            entries[name] = RepoFileEntry(name, local, size, _sha256(local), _git_oid(size, local))
        commit = hashlib.sha1(
            (repo_id + "".join(sorted(e.sha256 for e in entries.values()))).encode()
        ).hexdigest()
        repo = FakeRepo(repo_id, entries, commit, gated=gated, tags=tags or ["gguf"], downloads=downloads)
        self.repos[repo_id] = repo
        return repo

    # ------------------------------------------------------------------------------------------ server
    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def cdn_origin(self) -> str:
        assert self._server is not None
        return f"http://localhost:{self._server.server_address[1]}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def record(self, entry: LogEntry) -> None:
        with self._lock:
            self.log.append(entry)

    def requests_for(self, filename: str, method: str | None = None) -> list[LogEntry]:
        return [
            e for e in self.log if e.path.endswith("/" + filename) and (method is None or e.method == method)
        ]


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/cdn-lfs/(?P<repo>[^/]+/[^/]+)/(?P<sha>[0-9a-f]{64})$")
_API_REPO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")
_API_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?$")
_API_PATHS = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/paths-info/(?P<rev>[^/]+)$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, format, *args):
        pass

    # ------------------------------------------------------------------------------------ helpers
    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        # logged before the answer goes out: a client that has its answer finds it in the log
        self.fake.record(
            LogEntry(
                self.command,
                self.path,
                status,
                bytes_sent=0 if self.command == "HEAD" else len(body),
                authorization=self.headers.get("Authorization"),
            )
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})}
        self._json(status, {"error": message}, headers)

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
        return repo

    def _check_revision(self, repo: FakeRepo, rev: str) -> bool:
        if unquote(rev) in ("main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", {"X-Repo-Commit": repo.commit})
        return False

    def _authorised(self, repo: FakeRepo) -> bool:
        if not repo.gated:
            return True
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        if token is None:
            self._error(
                401,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. You must have access "
                "to it and be authenticated to access it. Please log in.",
            )
            return False
        if repo.repo_id not in self.fake.tokens.get(token, set()):
            self._error(
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the "
                f"authorized list. Visit https://huggingface.co/{repo.repo_id} to ask for access.",
            )
            return False
        return True

    # ------------------------------------------------------------------------------------ routing
    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        try:
            if m := _CDN.match(path):
                return self._cdn(m["repo"], m["sha"])
            if m := _RESOLVE.match(path):
                return self._resolve(m["repo"], m["rev"], m["path"])
            if path == "/api/models":
                return self._list_models(query)
            if m := _API_TREE.match(path):
                return self._tree(m["repo"], m["rev"], m["path"] or "", query)
            if self.command == "POST" and (m := _API_PATHS.match(path)):
                return self._paths_info(m["repo"], m["rev"])
            if m := _API_REPO.match(path):
                return self._model_info(m["repo"], m["rev"], query)
            self._error(404, "NotFound", f"no route for {path}")
        except (BrokenPipeError, ConnectionResetError):
            pass

    # ------------------------------------------------------------------------------------ file serving
    def _resolve(self, repo_id: str, rev: str, filename: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._check_revision(repo, rev) or not self._authorised(repo):
            return
        entry = repo.files.get(filename)
        if entry is None:
            self._error(
                404, "EntryNotFound", f'{filename} does not exist on "{rev}"', {"X-Repo-Commit": repo.commit}
            )
            return
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{entry.git_oid}"', "Accept-Ranges": "bytes"}
        if self.fake.xet:
            headers["X-Xet-Hash"] = hashlib.sha256(entry.sha256.encode()).hexdigest()
            headers["X-Xet-Refresh-Route"] = f"{self.fake.endpoint}/api/models/{repo_id}/xet-read-token/{rev}"
        if entry.is_lfs:
            headers.update({"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)})
            if self.fake.redirect_lfs:
                headers["Location"] = f"{self.fake.cdn_origin}/cdn-lfs/{quote(repo_id)}/{entry.sha256}"
                self._send(302, b"", headers)
                return
            headers["ETag"] = f'"{entry.sha256}"'
        self._file(entry, headers, key=f"{repo_id}/{filename}")

    def _cdn(self, repo_id: str, sha: str) -> None:
        repo = self.fake.repos.get(repo_id)
        entry = next((e for e in (repo.files.values() if repo else []) if e.sha256 == sha), None)
        if entry is None:
            self._error(404, "EntryNotFound", "no such blob")
            return
        self._file(entry, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"}, key=f"{repo_id}/{entry.path}")

    def _file(self, entry: RepoFileEntry, headers: dict[str, str], *, key: str) -> None:
        size = entry.size
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            m = _RANGE.match(rng.strip())
            if not m or (not m[1] and not m[2]):
                self._error(416, "RangeNotSatisfiable", f"bad range {rng}")
                return
            if m[1]:
                start = int(m[1])
                end = min(int(m[2]), size - 1) if m[2] else size - 1
            else:
                start, end = max(0, size - int(m[2])), size - 1
            if start >= size or start > end:
                self._error(
                    416,
                    "RangeNotSatisfiable",
                    f"range {rng} outside 0-{size - 1}",
                    {"Content-Range": f"bytes */{size}"},
                )
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1
        log = LogEntry(
            self.command,
            self.path,
            status,
            start if rng else None,
            end if rng else None,
            authorization=self.headers.get("Authorization"),
        )
        self.fake.record(log)  # before the answer; bytes_sent grows as the body goes out
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        if self.command == "HEAD":
            self.end_headers()
            return
        # the body's byte count is known only as it goes: count it first, so a client that has read
        # the whole body finds the full count in the log
        cut = None
        if key in self.fake.drop_after and self.command == "GET":
            cut = self.fake.drop_after.pop(key)
        log.bytes_sent = length if cut is None else min(length, cut)
        self.end_headers()
        flip = size // 2 if key in self.fake.corrupt else -1  # the byte served wrong
        sent = 0
        with open(entry.local, "rb") as fh:
            fh.seek(start)
            remaining = length if cut is None else min(length, cut)
            while remaining > 0:
                at = fh.tell()
                chunk = fh.read(min(65536, remaining))
                if not chunk:
                    break
                if at <= flip < at + len(chunk):
                    i = flip - at
                    chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1 :]
                self.wfile.write(chunk)
                sent += len(chunk)
                remaining -= len(chunk)
        log.bytes_sent = sent  # what really went out (less if the client hung up)
        if cut is not None and sent < length:
            self.wfile.flush()
            self.close_connection = True
            try:
                import socket

                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ------------------------------------------------------------------------------------ API
    def _sibling(self, e: RepoFileEntry, blobs: bool) -> dict:
        out: dict = {"rfilename": e.path}
        if blobs:
            out.update(size=e.size, blobId=e.git_oid)
            if e.is_lfs:
                out["lfs"] = {"size": e.size, "sha256": e.sha256, "pointerSize": 134}
        return out

    def _model_info(self, repo_id: str, rev: str | None, query: dict) -> None:
        repo = self._repo(repo_id)
        if repo is None or (rev is not None and not self._check_revision(repo, rev)):
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        self._json(
            200,
            self._model_summary(repo)
            | {
                "sha": repo.commit,
                "siblings": [self._sibling(e, blobs) for e in repo.files.values()]
                + self.fake.extra_siblings.get(repo_id, []),
                "usedStorage": sum(e.size for e in repo.files.values()),
            },
        )

    def _model_summary(self, repo: FakeRepo) -> dict:
        return {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.author,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": repo.downloads,
            "likes": 0,
            "tags": repo.tags,
            "library_name": "gguf",
            "createdAt": "2025-01-01T00:00:00.000Z",
            "lastModified": "2025-01-01T00:00:00.000Z",
        }

    def _tree_entry(self, e: RepoFileEntry) -> dict:
        out: dict = {"type": "file", "oid": e.git_oid, "size": e.size, "path": e.path}
        if e.is_lfs:
            out["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": 134}
        return out

    def _tree(self, repo_id: str, rev: str, folder: str, query: dict) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._check_revision(repo, rev):
            return
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        files, folders = [], set()
        for e in repo.files.values():
            if not e.path.startswith(prefix):
                continue
            rest = e.path[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/", 1)[0])
            else:
                files.append(self._tree_entry(e))
                if recursive:
                    parts = rest.split("/")[:-1]
                    folders.update(prefix + "/".join(parts[: i + 1]) for i in range(len(parts)))
        if prefix and not files and not folders:
            self._error(404, "EntryNotFound", f"{folder} does not exist", {"X-Repo-Commit": repo.commit})
            return
        out = [{"type": "directory", "oid": "0" * 40, "path": f} for f in sorted(folders)] + files
        self._json(200, out)

    def _paths_info(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._check_revision(repo, rev):
            return
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode())
        out = []
        for p in form.get("paths", []):
            if p in repo.files:
                out.append(self._tree_entry(repo.files[p]))
            elif any(f.startswith(p.rstrip("/") + "/") for f in repo.files):
                out.append({"type": "directory", "oid": "0" * 40, "path": p})
        self._json(200, out)

    def _list_models(self, query: dict) -> None:
        search = query.get("search", [""])[0].lower()
        author = query.get("author", [""])[0].lower()
        limit = int(query.get("limit", ["1000"])[0])
        hits = [
            r
            for r in self.fake.repos.values()
            if search in r.repo_id.lower() and (not author or r.author.lower() == author)
        ]
        hits.sort(key=lambda r: -r.downloads)
        self._json(200, [self._model_summary(r) for r in hits[:limit]])
