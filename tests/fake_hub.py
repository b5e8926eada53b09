"""A Hugging Face Hub-compatible HTTP server for tests (standard library only).

The real ``huggingface_hub`` client talks to it over loopback HTTP, so tests exercise the
same code paths as against huggingface.co: repos, branches, tags, commits with parents,
uploads (preupload + NDJSON commit), tree listings and ``resolve`` downloads.

Simplifications, all invisible to the client:

* every file is a "regular" git blob sent base64 inside the commit (no LFS, no Xet);
* no authentication: any token, or none, may do anything;
* no pull requests (``create_pr=True`` answers 400).

Usage::

    hub = FakeHub().start()
    HfApi(endpoint=hub.endpoint).create_repo("user/model")
    ...
    hub.stop()
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FakeHub", "HubError", "dead_endpoint", "git_blob_sha1"]

_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_API = r"/api/(?P<t>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)"
_REV = r"(?P<rev>[^/]+)"
# What the real Hub puts in the initial commit of every new repo (abridged).
GITATTRIBUTES = b"*.bin filter=lfs diff=lfs merge=lfs -text\n*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


def git_blob_sha1(content: bytes) -> str:
    """The git object id of a blob: what the Hub sends as a regular file's ETag."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _now() -> str:
    """The current UTC time in the Hub's ``2024-01-31T12:00:00.000Z`` form."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def dead_endpoint() -> str:
    """An ``http://127.0.0.1:<port>`` URL where nothing listens (connection refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class HubError(Exception):
    """An HTTP error answer; ``code`` goes into ``X-Error-Code``, which the client maps to its errors."""

    def __init__(self, status: int, message: str, code: str | None = None, **headers: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers


@dataclass
class Reply:
    """One HTTP answer: status, headers and the full body (omitted on the wire for HEAD)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> Reply:
        return cls(status, {"Content-Type": "application/json"}, json.dumps(obj).encode())

    @classmethod
    def error(cls, err: HubError) -> Reply:
        reply = cls.json({"error": err.message}, err.status)
        reply.headers.update(err.headers, **{"X-Error-Message": err.message})
        if err.code:
            reply.headers["X-Error-Code"] = err.code
        return reply


@dataclass
class Request:
    """A routed request: URL groups (already unquoted), query, lower-cased headers and body."""

    params: dict[str, str]
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


@dataclass
class Commit:
    """A commit: a full snapshot of the files plus its parent, like git."""

    oid: str
    parent: str | None
    title: str
    message: str
    date: str
    files: dict[str, bytes]


@dataclass
class Repo:
    """A repository: commits by id, and branch and tag names pointing at commits."""

    repo_type: str
    repo_id: str
    private: bool
    created: str = field(default_factory=_now)
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, rev: str) -> Commit:
        """The commit a branch, tag or full commit id names; 404 RevisionNotFound otherwise."""
        name = rev.removeprefix("refs/heads/").removeprefix("refs/tags/")
        oid = self.branches.get(name) or self.tags.get(name) or (rev if rev in self.commits else None)
        if oid is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return self.commits[oid]

    def add_commit(self, branch: str, title: str, message: str, files: dict[str, bytes]) -> Commit:
        """Record a new commit on ``branch`` (created if missing) whose parent is the branch head."""
        parent = self.branches.get(branch)
        date = _now()
        digest = hashlib.sha1(f"{self.repo_id}\n{parent}\n{len(self.commits)}\n{date}\n{title}".encode())
        for path in sorted(files):
            digest.update(f"{path}\0{git_blob_sha1(files[path])}\n".encode())
        commit = Commit(digest.hexdigest(), parent, title, message, date, dict(files))
        self.commits[commit.oid] = commit
        self.branches[branch] = commit.oid
        return commit

    def history(self, rev: str) -> list[Commit]:
        """Commits reachable from ``rev``, newest first."""
        commit: Commit | None = self.resolve(rev)
        out = []
        while commit is not None:
            out.append(commit)
            commit = self.commits.get(commit.parent) if commit.parent else None
        return out


def _file_entry(path: str, content: bytes) -> dict[str, Any]:
    return {"type": "file", "oid": git_blob_sha1(content), "size": len(content), "path": path}


def _dir_entry(path: str) -> dict[str, Any]:
    return {"type": "directory", "oid": hashlib.sha1(f"tree {path}".encode()).hexdigest(), "size": 0, "path": path}


def _tree_entries(files: dict[str, bytes], base: str, recursive: bool) -> list[dict[str, Any]]:
    """Tree listing under folder ``base`` ("" = root), like ``GET /api/models/x/y/tree/rev/base``."""
    base = base.strip("/")
    entries: dict[str, dict[str, Any]] = {}
    for path, content in files.items():
        if base and not path.startswith(base + "/"):
            continue
        parts = path[len(base) + 1 :].split("/") if base else path.split("/")
        depth = len(parts) if recursive else 1
        for i in range(1, min(depth, len(parts) - 1) + 1):
            folder = "/".join([base, *parts[:i]] if base else parts[:i])
            entries[folder] = _dir_entry(folder)
        if recursive or len(parts) == 1:
            entries[path] = _file_entry(path, content)
    return [entries[p] for p in sorted(entries)]


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) for a single ``Range: bytes=a-b`` header; None to send it all."""
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not match or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    start, end = (max(size - int(last), 0), size - 1) if not first else (int(first), int(last or size - 1))
    if start >= size or start > end:
        raise HubError(416, "Range Not Satisfiable", None, **{"Content-Range": f"bytes */{size}"})
    return start, min(end, size - 1)


class FakeHub:
    """In-memory Hub on ``127.0.0.1``; ``requests`` logs every (method, path) it served.

    Set ``fail_status`` (e.g. 503) to make every request fail with that status, or use
    :func:`dead_endpoint` for a server that does not answer at all. Either way the client
    retries ``hf_hub_download`` of an uncached file 5 times with backoff (about 23 s) unless
    the backoff sleep is patched out, as the ``fake_hub`` fixture does.
    """

    def __init__(self) -> None:
        self.endpoint = ""
        self.requests: list[tuple[str, str]] = []
        self.fail_status: int | None = None
        self.repos: dict[tuple[str, str], Repo] = {}
        # A hostile server, for the tests of what a client builds paths from (all off by default):
        self.any_revision = False  # every revision name, however formed, answers as main's head
        self.reported_sha: str | None = None  # the commit id every answer names, instead of the real one
        self.listed: dict[str, bytes] = {}  # extra files in every listing (repo info and tree), and served
        self.tree_only: dict[str, bytes] = {}  # extra files in the tree listing alone (not in repo info), and served
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._routes = self._build_routes()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeHub:
        """Serve on a free loopback port in a daemon thread; sets ``endpoint``."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.hub = self  # type: ignore[attr-defined]
        self._server = server
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-hub", daemon=True)
        thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test helpers ----------------------------------------------------------------------

    def set_file(
        self, repo_id: str, path: str, content: bytes, revision: str = "main", repo_type: str = "model"
    ) -> None:
        """Tamper: overwrite ``path`` in the commit ``revision`` names, without a new commit.

        The file is then served with headers that match the new bytes (ETag, size), so the
        client downloads it without complaint and only the caller's own checks can catch it.
        """
        with self._lock:
            self._get_repo(repo_type, repo_id).resolve(revision).files[path] = content

    # -- routing ---------------------------------------------------------------------------

    def _build_routes(self) -> list[tuple[str, re.Pattern[str], Callable[[Request], Reply]]]:
        table: list[tuple[str, str, Callable[[Request], Reply]]] = [
            ("POST", r"/api/repos/create", self._create_repo),
            ("DELETE", r"/api/repos/delete", self._delete_repo),
            ("POST", r"/api/validate-yaml", lambda req: Reply.json({})),
            ("GET", _API + rf"(?:/revision/{_REV})?", self._repo_info),
            ("GET", _API + rf"/tree/{_REV}(?:/(?P<path>.+))?", self._tree),
            ("POST", _API + rf"/paths-info/{_REV}", self._paths_info),
            ("GET", _API + r"/refs", self._refs),
            ("GET", _API + rf"/commits/{_REV}", self._commits),
            ("POST", _API + rf"/preupload/{_REV}", self._preupload),
            ("POST", _API + rf"/commit/{_REV}", self._commit),
            ("POST", _API + r"/branch/(?P<name>[^/]+)", self._create_branch),
            ("DELETE", _API + r"/branch/(?P<name>[^/]+)", self._delete_branch),
            ("POST", _API + rf"/tag/{_REV}", self._create_tag),
            ("DELETE", _API + r"/tag/(?P<name>[^/]+)", self._delete_tag),
            (
                "GET HEAD",
                r"/(?:(?P<t>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)/resolve/" + _REV + r"/(?P<path>.+)",
                self._resolve,
            ),
        ]
        return [(methods, re.compile(pattern), handler) for methods, pattern, handler in table]

    def handle(self, method: str, raw_path: str, body: bytes, headers: dict[str, str]) -> Reply:
        """Answer one request (called by the HTTP handler thread)."""
        url = urlsplit(raw_path)
        with self._lock:
            self.requests.append((method, url.path))
            if self.fail_status is not None:
                return Reply.error(HubError(self.fail_status, "FakeHub is set to fail"))
            for methods, pattern, handler in self._routes:
                match = pattern.fullmatch(url.path)
                if match and method in methods.split():
                    params = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                    try:
                        return handler(Request(params, parse_qs(url.query), headers, body))
                    except HubError as err:
                        return Reply.error(err)
            return Reply.error(HubError(404, f"FakeHub has no route for {method} {url.path}"))

    def _get_repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _repo(self, req: Request) -> Repo:
        return self._get_repo(_TYPES[req.params.get("t") or "models"], req.params["repo"])

    def _at(self, repo: Repo, rev: str) -> Commit:
        """The commit ``rev`` names; with ``any_revision``, main's head for a name it does not know."""
        try:
            return repo.resolve(rev)
        except HubError:
            if not self.any_revision:
                raise
            return repo.commits[repo.branches["main"]]

    def _sha(self, commit: Commit) -> str:
        return commit.oid if self.reported_sha is None else self.reported_sha

    def _repo_url(self, repo: Repo) -> str:
        return f"{self.endpoint}/{_URL_PREFIX[repo.repo_type]}{repo.repo_id}"

    # -- repos -----------------------------------------------------------------------------

    def _create_repo(self, req: Request) -> Reply:
        data = req.json()
        repo_type = data.get("type") or "model"
        repo_id = f"{data.get('organization') or 'user'}/{data['name']}"
        if (repo_type, repo_id) in self.repos:
            url = self._repo_url(self.repos[repo_type, repo_id])
            return Reply.json({"error": "You already created this repo", "url": url}, 409)
        private = bool(data.get("private")) or data.get("visibility") == "private"
        repo = Repo(repo_type, repo_id, private)
        repo.add_commit("main", "initial commit", "", {".gitattributes": GITATTRIBUTES})
        self.repos[repo_type, repo_id] = repo
        return Reply.json({"url": self._repo_url(repo), "name": repo_id, "id": repo_id})

    def _delete_repo(self, req: Request) -> Reply:
        data = req.json()
        repo = self._get_repo(data.get("type") or "model", f"{data.get('organization') or 'user'}/{data['name']}")
        del self.repos[repo.repo_type, repo.repo_id]
        return Reply.json({})

    def _repo_info(self, req: Request) -> Reply:
        repo = self._repo(req)
        commit = self._at(repo, req.params.get("rev", "main"))
        siblings = [
            {"rfilename": path, "size": len(data), "blobId": git_blob_sha1(data)}
            for path, data in sorted({**commit.files, **self.listed}.items())
        ]
        info = {"id": repo.repo_id, "author": repo.repo_id.split("/")[0], "sha": self._sha(commit), "private": repo.private}
        info.update(createdAt=repo.created, lastModified=commit.date, tags=[], siblings=siblings)
        return Reply.json(info)

    # -- trees and history -----------------------------------------------------------------

    def _tree(self, req: Request) -> Reply:
        files = {**self._at(self._repo(req), req.params["rev"]).files, **self.listed, **self.tree_only}
        recursive = req.query.get("recursive", ["false"])[0].lower() in ("true", "1")
        entries = _tree_entries(files, req.params.get("path", ""), recursive)
        if req.params.get("path") and not entries:
            raise HubError(404, f"Entry not found: {req.params['path']}", "EntryNotFound")
        return Reply.json(entries)

    def _paths_info(self, req: Request) -> Reply:
        files = {**self._at(self._repo(req), req.params["rev"]).files, **self.listed, **self.tree_only}
        out = []
        for raw in parse_qs(req.body.decode()).get("paths", []):
            path = raw.strip("/")
            if path in files:
                out.append(_file_entry(path, files[path]))
            elif any(name.startswith(path + "/") for name in files):
                out.append(_dir_entry(path))
        return Reply.json(out)

    def _refs(self, req: Request) -> Reply:
        repo = self._repo(req)

        def refs(names: dict[str, str], kind: str) -> list[dict[str, str]]:
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": oid} for n, oid in sorted(names.items())]

        return Reply.json(
            {
                "branches": refs(repo.branches, "heads"),
                "tags": refs(repo.tags, "tags"),
                "converts": [],
                "pullRequests": [],
            }
        )

    def _commits(self, req: Request) -> Reply:
        history = self._repo(req).history(req.params["rev"])
        return Reply.json(
            [
                {"id": c.oid, "title": c.title, "message": c.message, "date": c.date, "authors": [{"user": "user"}]}
                for c in history
            ]
        )

    # -- uploads ---------------------------------------------------------------------------

    def _preupload(self, req: Request) -> Reply:
        files = self._repo(req).resolve(req.params["rev"]).files
        answer = [
            {
                "path": f["path"],
                "uploadMode": "regular",
                "shouldIgnore": False,
                "oid": git_blob_sha1(files[f["path"]]) if f["path"] in files else None,
            }
            for f in req.json().get("files", [])
        ]
        return Reply.json({"files": answer})

    def _commit(self, req: Request) -> Reply:
        """NDJSON commit: a header line, then one line per added/deleted file or folder."""
        repo, branch = self._repo(req), req.params["rev"]
        if req.query.get("create_pr"):
            raise HubError(400, "FakeHub does not support pull requests")
        head = repo.resolve(branch)
        if branch not in repo.branches:
            raise HubError(400, f"Can only commit to a branch, not {branch!r}")
        lines = [json.loads(line) for line in req.body.splitlines() if line.strip()]
        header = next((item["value"] for item in lines if item["key"] == "header"), {})
        parent = header.get("parentCommit")
        if parent and parent != head.oid:
            raise HubError(412, f"parentCommit {parent} is not the head of {branch} ({head.oid})")
        files = dict(head.files)
        for item in lines:
            _apply_operation(files, item["key"], item["value"])
        commit = repo.add_commit(branch, header.get("summary", ""), header.get("description", ""), files)
        return Reply.json(
            {
                "commitOid": commit.oid,
                "commitUrl": f"{self._repo_url(repo)}/commit/{commit.oid}",
                "pullRequestUrl": None,
            }
        )

    # -- refs ------------------------------------------------------------------------------

    def _create_branch(self, req: Request) -> Reply:
        repo, name = self._repo(req), req.params["name"]
        if name in repo.branches:
            raise HubError(409, f"Reference already exists: refs/heads/{name}")
        repo.branches[name] = repo.resolve(req.json().get("startingPoint") or "main").oid
        return Reply.json({})

    def _delete_branch(self, req: Request) -> Reply:
        repo, name = self._repo(req), req.params["name"]
        if repo.branches.pop(name, None) is None:
            raise HubError(404, f"Invalid rev id: {name}", "RevisionNotFound")
        return Reply.json({})

    def _create_tag(self, req: Request) -> Reply:
        repo, tag = self._repo(req), req.json()["tag"]
        if tag in repo.tags:
            raise HubError(409, f"Reference already exists: refs/tags/{tag}")
        repo.tags[tag] = repo.resolve(req.params["rev"]).oid
        return Reply.json({})

    def _delete_tag(self, req: Request) -> Reply:
        repo, name = self._repo(req), req.params["name"]
        if repo.tags.pop(name, None) is None:
            raise HubError(404, f"Invalid rev id: {name}", "RevisionNotFound")
        return Reply.json({})

    # -- downloads -------------------------------------------------------------------------

    def _resolve(self, req: Request) -> Reply:
        """``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: the file, with the headers the client checks."""
        commit = self._at(self._repo(req), req.params["rev"])
        content = {**commit.files, **self.listed, **self.tree_only}.get(req.params["path"])
        if content is None:
            raise HubError(404, "Entry not found", "EntryNotFound", **{"X-Repo-Commit": self._sha(commit)})
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "X-Repo-Commit": self._sha(commit),
            "ETag": f'"{git_blob_sha1(content)}"',
        }
        span = _byte_range(req.headers.get("range"), len(content))
        if span is None:
            return Reply(200, headers, content)
        start, end = span
        headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
        return Reply(206, headers, content[start : end + 1])


def _apply_operation(files: dict[str, bytes], key: str, value: dict[str, Any]) -> None:
    """Apply one NDJSON commit line to the snapshot ``files``."""
    if key == "file":
        raw = value["content"]
        files[value["path"]] = base64.b64decode(raw) if value.get("encoding") == "base64" else raw.encode()
    elif key == "deletedFile":
        if files.pop(value["path"], None) is None:
            raise HubError(404, f"File not found: {value['path']}", "EntryNotFound")
    elif key == "deletedFolder":
        prefix = value["path"].rstrip("/") + "/"
        doomed = [path for path in files if path.startswith(prefix)]
        if not doomed:
            raise HubError(404, f"Folder not found: {value['path']}", "EntryNotFound")
        for path in doomed:
            del files[path]
    elif key != "header":
        raise HubError(400, f"FakeHub does not support commit operation {key!r} (only regular files)")


class _Handler(BaseHTTPRequestHandler):
    """Reads the request, asks the :class:`FakeHub` for a :class:`Reply` and writes it out."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence access logs
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers up to the blank line
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self, method: str) -> None:
        body = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.hub.handle(method, self.path, body, headers)  # type: ignore[attr-defined]
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        # One request per connection: a kept-alive connection would outlive stop() and keep answering.
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(reply.body)
