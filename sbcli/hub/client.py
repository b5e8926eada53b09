"""The Hugging Face Hub: push a learner (one revision per task step) and fetch a repository.

Push: the learner's files (the exemplar memory only when asked, since it holds training images;
otherwise an empty one, and the card says so), its ONNX export and a model card
(:mod:`sbcli.hub.upload` stages them) go up in one commit to ``main``; the
branch ``step-N`` (N = the learner's steps) is created at that commit, or updated with the same
files if it exists. So pushing after every ``sb add-task`` keeps every step addressable as
``@step-1``, ``@step-2``, ... Every push writes the same files, so nothing stale remains and
other files of the repository are left alone. A push never overwrites another sequence: a
``step-N`` branch or a ``main`` holding other classes is refused, and pushing an earlier step of
the same sequence again refreshes its branch without moving ``main`` back.

Fetch: ``snapshot_download`` into the huggingface_hub cache (``HF_HOME``, ``HF_ENDPOINT`` and
``HF_HUB_OFFLINE`` are honoured), after the file list was checked for names that would escape
the target directory. A server that does not answer fails within the timeout (no retries: the
repository listing is one request) and then falls back to the cache.

Every client error becomes an :class:`~sbcli.errors.SbcliError` with one sentence to act on.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sbcli.errors import ConfigError, ExportError, SbcliError

LOG = logging.getLogger(__name__)

HUB_HINT = 'install the Hub extra: pip install "sbcli[hub]"'
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
ONNX_FILE = "model.onnx"
CARD_FILE = "README.md"
MAX_TIMEOUT_S = 3600.0  # an hour: longer is a hang, not a wait
GIT_FILES = (".gitattributes",)


@dataclass(frozen=True)
class HubConfig:
    """How to reach the Hub.

    Attributes:
        endpoint: the Hub URL; None means ``HF_ENDPOINT`` or huggingface.co (the library's default).
        token: an access token; None means ``HF_TOKEN`` or the stored login.
        timeout: seconds to wait for the repository listing before treating the Hub as unreachable.
        offline: use only the local cache (also on when ``HF_HUB_OFFLINE=1``).
    """

    endpoint: str | None = None
    token: str | None = None
    timeout: float = 10.0
    offline: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout, (int, float)) and 0 < self.timeout <= MAX_TIMEOUT_S):
            raise ConfigError(f"--timeout {self.timeout} is not a number of seconds in (0, {MAX_TIMEOUT_S:g}]; "
                              "give e.g. 10 (a Hub that does not answer by then is treated as unreachable).")


@dataclass(frozen=True)
class Snapshot:
    """A repository revision in the local cache."""

    folder: Path
    repo_id: str
    revision: str
    commit: str
    files: list[str]
    from_cache: bool  # True when the Hub was not asked (offline) or did not answer


def is_repo_id(repo_id: object) -> bool:
    """``owner/name`` with the Hub's characters and no '..'."""
    return isinstance(repo_id, str) and bool(REPO_ID.fullmatch(repo_id)) and ".." not in repo_id


def check_repo_id(repo_id: str) -> str:
    """``owner/name`` with the Hub's characters; raises ConfigError otherwise."""
    if not is_repo_id(repo_id):
        raise ConfigError(f"'{repo_id}' is not a Hub repository id; write it as OWNER/NAME (letters, digits, '-', '_', '.').")
    return repo_id


COMMIT = re.compile(r"[0-9a-f]{40}")
# A branch or tag name the Hub accepts, and nothing a path could be built from that leaves its folder:
# parts of letters, digits, '.', '_', '-' (none starting with '.', none ending in '.lock'), joined by '/'.
REF_PART = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
MAX_REVISION = 255


def revision_problem(revision: str) -> str | None:
    """Why ``revision`` is not a commit hash, a branch or a tag name (None when it is one)."""
    if not isinstance(revision, str) or not revision:
        return "it is empty"
    if len(revision.encode("utf-8", "surrogatepass")) > MAX_REVISION:
        return f"it is longer than {MAX_REVISION} bytes"
    if COMMIT.fullmatch(revision):
        return None
    if ".." in revision or "@{" in revision:
        return "it holds '..' or '@{'"
    parts = revision.split("/")
    if any(not REF_PART.fullmatch(part) or part.endswith(".lock") for part in parts) or revision.endswith("."):
        return ("it is not a commit hash nor a branch or tag name (letters, digits, '.', '_', '-' in parts "
                "joined by '/', none empty or starting with '.')")
    return None


def check_revision(revision: str, where: str = "") -> str:
    """``revision`` when it is a commit hash, a branch or a tag name; ConfigError (one sentence) otherwise,
    before anything is asked of the Hub."""
    problem = revision_problem(revision)
    if problem is not None:
        raise ConfigError(f"The revision {ascii(revision)}{where} cannot be used: {problem}; give a commit hash, "
                          "a branch or a tag name, e.g. main or step-2.")
    return revision


def safe_relpath(name: str) -> PurePosixPath:
    """A repository file name that stays inside the directory it is written to.

    Raises:
        ExportError: an absolute path, a '..' or '.' part, a backslash, a drive letter or an empty part.
    """
    if not is_safe_name(name):
        raise ExportError(f"The repository holds a file named {ascii(name)}, which would be written outside the target "
                          "directory; nothing was downloaded. Do not use this repository.")
    return PurePosixPath(name)


def is_safe_name(name: object) -> bool:
    """A relative POSIX path that stays inside the folder it is joined to: no absolute path, no '..' or '.'
    or empty part, no backslash, no drive letter, no control character."""
    if not isinstance(name, str) or not name:
        return False
    parts = name.split("/")
    return not (name.startswith("/") or "\\" in name or ":" in parts[0] or any(p in ("", ".", "..") for p in parts)
                or any(ord(c) < 32 or ord(c) == 127 for c in name))


def hub() -> Any:
    """The huggingface_hub module, or ExportError naming the extra to install."""
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors  # noqa: F401  (submodules the package does not load by itself)
    except ImportError as err:
        raise ExportError(f"The Hub commands need huggingface_hub; {HUB_HINT}.") from err
    return huggingface_hub


def is_offline(cfg: HubConfig) -> bool:
    return cfg.offline or bool(hub().constants.HF_HUB_OFFLINE)


def _endpoint(cfg: HubConfig) -> str:
    return cfg.endpoint or hub().constants.ENDPOINT


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The connection-level errors (refused, timed out, reset) of huggingface_hub 2.x's HTTP library."""
    import httpx2

    return (httpx2.TransportError,)


def _status(err: Exception) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _revisions(api: Any, repo_id: str) -> str:
    try:
        refs = api.list_repo_refs(repo_id)
    except (hub().errors.HfHubHTTPError, *_transport_errors()):
        return "unknown (listing them failed too)"
    return ", ".join(sorted(b.name for b in refs.branches) + sorted(t.name for t in refs.tags)) or "none"


@contextmanager
def hub_errors(action: str, repo_id: str, cfg: HubConfig, revision: str | None = None,
               api: Any = None) -> Iterator[None]:
    """Turn the Hub client's errors during ``action`` into one-sentence SbcliErrors."""
    hf = hub()
    errors = hf.errors
    try:
        yield
    except SbcliError:
        raise
    except errors.RevisionNotFoundError as err:
        known = _revisions(api, repo_id) if api is not None else "unknown"
        raise ExportError(f"{repo_id} has no revision '{revision}' (it has: {known}); pick one of those "
                          "or push that step first.") from err
    except errors.RepositoryNotFoundError as err:
        raise ExportError(f"No model repository {repo_id} at {_endpoint(cfg)} (or it is private); check the name, "
                          "or set HF_TOKEN to a token that can read it.") from err
    except errors.OfflineModeIsEnabled as err:
        raise ExportError(f"Cannot {action} {repo_id}: HF_HUB_OFFLINE is set; unset it to reach the Hub.") from err
    except errors.HfHubHTTPError as err:
        status = _status(err)
        if status in (401, 403):
            raise ExportError(f"The Hub refused to {action} {repo_id} (HTTP {status}); set HF_TOKEN (or --token) to a "
                              "token with write access to that namespace.") from err
        raise ExportError(f"The Hub at {_endpoint(cfg)} answered HTTP {status} while trying to {action} {repo_id}; "
                          "try again later.") from err
    except _transport_errors() as err:
        raise ExportError(f"The Hub at {_endpoint(cfg)} did not answer ({type(err).__name__}: {err}); check the network "
                          "and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use what is cached.") from err


def client(cfg: HubConfig) -> Any:
    """An ``HfApi`` for the configured endpoint and token."""
    return hub().HfApi(endpoint=cfg.endpoint, token=cfg.token)


# ---------------------------------------------------------------------------------------------
# Push
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PushReport:
    """What ``push`` uploaded and where."""

    repo_id: str
    url: str
    revisions: dict[str, str]  # revision (main, step-N) -> the commit it now points at
    files: list[str]
    with_memory: bool
    onnx: Any  # sbcli.export.onnx.OnnxReport

    def to_json(self) -> dict[str, Any]:
        # the ONNX file was written to a temporary folder, gone after the push: name it where it now is
        onnx = {**self.onnx.to_json(), "path": ONNX_FILE}
        return {"repo_id": self.repo_id, "url": self.url, "revisions": self.revisions, "files": self.files,
                "with_memory": self.with_memory, "onnx": onnx}


def push(learner_dir: Path, repo_id: str, *, with_memory: bool = False, private: bool = False,
         cfg: HubConfig = HubConfig(), onnx_cfg: Any = None, license: str = "unknown") -> PushReport:
    """Upload a learner to ``repo_id``: the branch ``step-N`` and, unless it holds a later step of
    the same sequence, ``main`` end up holding it.

    Raises:
        ConfigError: ``repo_id`` is not OWNER/NAME.
        LearnerError: ``learner_dir`` is not a learner, or has no classes yet.
        ExportError: the repository holds another learner (``step-N`` or ``main`` with other
            classes), the ONNX check failed, or the Hub refused or did not answer.
    """
    from sbcli.export.onnx import OnnxConfig
    from sbcli.hub.upload import Upload, stage
    from sbcli.learner.state import read_state

    check_repo_id(repo_id)
    if is_offline(cfg):
        raise ExportError(f"Cannot push {repo_id}: HF_HUB_OFFLINE is set; unset it to reach the Hub.")
    state = read_state(Path(learner_dir))
    state.require_classes("push")  # before the repository is created
    branch, message = f"step-{state.steps}", f"sbcli: learner after step {state.steps}"
    api = client(cfg)
    with hub_errors("push to", repo_id, cfg, api=api):
        url = str(api.create_repo(repo_id, private=private, exist_ok=True))
        to_main = _check_lineage(repo_id, state.class_names, branch, cfg)
        steps = sorted({b.name for b in api.list_repo_refs(repo_id).branches if b.name.startswith("step-")} | {branch})
    with tempfile.TemporaryDirectory(prefix="sbcli-push-") as tmp:
        upload = Upload(repo_id, with_memory, steps, license)
        folder, files, onnx_report = stage(Path(learner_dir), Path(tmp), upload, onnx_cfg or OnnxConfig())
        revisions: dict[str, str] = {}
        with hub_errors("push to", repo_id, cfg, api=api):
            if to_main:
                revisions["main"] = api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=message).oid
            revisions[branch] = _update_branch(api, repo_id, branch, commit=revisions.get("main"), folder=folder,
                                               message=message)
    return PushReport(repo_id, url, revisions, files, with_memory, onnx_report)


def _remote_classes(repo_id: str, revision: str, cfg: HubConfig) -> list[str] | None:
    """The class names of the learner at ``revision``; None when the revision or its learner.json is absent."""
    import json

    errors = hub().errors
    try:
        path = hub().hf_hub_download(repo_id, "learner.json", revision=revision, endpoint=cfg.endpoint,
                                     token=cfg.token, etag_timeout=cfg.timeout)
    except (errors.EntryNotFoundError, errors.RevisionNotFoundError):
        return None
    return list(json.loads(Path(path).read_text(encoding="utf-8")).get("class_names", []))


def _check_lineage(repo_id: str, ours: list[str], branch: str, cfg: HubConfig) -> bool:
    """Refuse to overwrite another sequence's step; True when ``main`` should move to this learner.

    ``main`` moves unless it holds a later step of the same sequence (our classes are a strict
    prefix of its classes), so pushing an earlier step again only refreshes its own branch.
    """
    on_step = _remote_classes(repo_id, branch, cfg)
    if on_step is not None and on_step != ours:
        raise ExportError(f"{repo_id}@{branch} holds another learner after that step ({', '.join(on_step[-3:])}, ...); "
                          "push this one to another repository so that both sequences stay addressable.")
    on_main = _remote_classes(repo_id, "main", cfg)
    if on_main is None or on_main == ours[: len(on_main)]:
        return True
    if ours == on_main[: len(ours)]:
        return False
    raise ExportError(f"{repo_id} holds another sequence on main (classes {', '.join(on_main[:3])}, ...); push this "
                      "learner to another repository.")


def _update_branch(api: Any, repo_id: str, branch: str, *, commit: str | None, folder: Path, message: str) -> str:
    """Point ``branch`` at ``commit`` (when it is new and there is one), else commit ``folder`` to it.

    Returns the commit the branch now points at.
    """
    existing = {b.name for b in api.list_repo_refs(repo_id).branches}
    if branch not in existing:
        api.create_branch(repo_id, branch=branch, revision=commit)
        if commit is not None:
            return commit
    return api.upload_folder(repo_id=repo_id, folder_path=folder, revision=branch, commit_message=message).oid


# ---------------------------------------------------------------------------------------------
# Fetch
# ---------------------------------------------------------------------------------------------


def fetch(repo_id: str, revision: str | None, cfg: HubConfig, wanted: list[str] | None = None,
          fill: str = "pull it once while online") -> Snapshot:
    """Download ``repo_id`` at ``revision`` (default ``main``) into the cache, or find it there.

    Args:
        wanted: only these files (all of them must exist); None means every file but ``.gitattributes``.

    Raises:
        ExportError: unknown repository or revision, an unsafe file name, a missing wanted file, or
            a Hub that does not answer when nothing is cached.
    """
    check_repo_id(repo_id)
    revision = check_revision(revision or "main")
    for name in wanted or []:
        safe_relpath(name)
    if is_offline(cfg):
        return _from_cache(repo_id, revision, cfg, wanted, reason="HF_HUB_OFFLINE is set", fill=fill)
    api = client(cfg)
    info, unreachable = repo_info(api, repo_id, revision, cfg)
    if info is None:
        return _from_cache(repo_id, revision, cfg, wanted, reason=unreachable, fill=fill)
    commit = _commit_of(info, repo_id, revision)
    names = [s.rfilename for s in info.siblings or []]
    files = _select(names, wanted, repo_id, revision)
    hf = hub()
    # Pinned to the commit checked above: the client asks no second time (a server could answer otherwise),
    # and fetches exactly the checked names, whatever a later listing holds.
    pinned = hf.ResolvedRevision(resolved=commit, initial=revision, repo_id=repo_id)
    with hub_errors("download", repo_id, cfg, revision, api):
        folder = Path(hf.snapshot_download(repo_id, revision=pinned, endpoint=cfg.endpoint, token=cfg.token,
                                           allow_patterns=_patterns(wanted if wanted is not None else names), etag_timeout=cfg.timeout))
    if folder.name != commit:
        raise ExportError(f"{repo_id}@{revision} changed while it was downloading; pull again.")
    _remember_ref(folder, revision, commit)
    return Snapshot(folder, repo_id, revision, commit, files, from_cache=False)


def _commit_of(info: Any, repo_id: str, revision: str) -> str:
    """The commit id the Hub answered, checked to be one (cache folders are named by it)."""
    sha = getattr(info, "sha", None)
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise ExportError(f"The Hub answered {ascii(sha)} as the commit of {repo_id}@{revision}, which is not a commit id; "
                          "nothing was downloaded. Do not use this server.")
    return sha


def _remember_ref(snapshot: Path, revision: str, commit: str) -> None:
    """The cache's ``refs/REVISION`` file (what an offline pull by branch or tag name reads), written by
    sbcli from checked names (the download was pinned to the commit, so the client did not write it)."""
    if revision == commit:
        return
    ref = snapshot.parent.parent / "refs" / revision  # a checked revision: inside refs/
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        if not ref.is_file() or ref.read_text() != commit:
            tmp = ref.with_name(f"{ref.name}.{os.getpid()}.tmp")
            tmp.write_text(commit)
            os.replace(tmp, ref)
    except OSError as err:  # best effort, as the client does: a read-only cache only costs offline pulls by name
        LOG.warning("Could not note %s's commit in the Hub cache (%s); an offline pull by that name will not find it.",
                    revision, err.strerror or err)


def repo_info(api: Any, repo_id: str, revision: str, cfg: HubConfig) -> tuple[Any, str]:
    """(the revision's info, "") or (None, why the Hub is unreachable: no answer or a 5xx)."""
    errors = hub().errors
    with hub_errors("download", repo_id, cfg, revision, api):
        try:
            return api.model_info(repo_id, revision=revision, timeout=cfg.timeout), ""
        except errors.HfHubHTTPError as err:
            status = _status(err)
            if status is None or status < 500 or isinstance(err, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError)):
                raise
            return None, f"the Hub at {_endpoint(cfg)} answered HTTP {status}"
        except _transport_errors() as err:
            return None, f"the Hub at {_endpoint(cfg)} did not answer: {type(err).__name__}: {err}"


def _patterns(wanted: list[str] | None) -> list[str] | None:
    """fnmatch patterns matching exactly the ``wanted`` names (None: the whole snapshot, so that the
    cache holds a complete snapshot that offline pulls accept)."""
    return None if wanted is None else [re.sub(r"([*?[])", r"[\1]", name) for name in wanted]


def _select(names: list[str], wanted: list[str] | None, repo_id: str, revision: str) -> list[str]:
    for name in names:
        safe_relpath(name)
    if wanted is None:
        return [n for n in names if n not in GIT_FILES]
    missing = sorted(set(wanted) - set(names))
    if missing:
        raise ExportError(f"{repo_id}@{revision} lacks {', '.join(missing)}, which the zoo index lists; "
                          "the entry and the repository disagree, report it to the zoo's maintainer.")
    return list(wanted)


def _from_cache(repo_id: str, revision: str, cfg: HubConfig, wanted: list[str] | None, reason: str,
                fill: str = "pull it once while online") -> Snapshot:
    errors = hub().errors
    try:
        folder = Path(hub().snapshot_download(repo_id, revision=revision, endpoint=cfg.endpoint,
                                              allow_patterns=_patterns(wanted), local_files_only=True))
    except (errors.LocalEntryNotFoundError, errors.IncompleteSnapshotError, FileNotFoundError) as err:
        raise ExportError(f"{repo_id}@{revision} is not in the local cache and the Hub cannot be used ({reason}); "
                          f"check the network and HF_ENDPOINT, or {fill}.") from err
    if not COMMIT.fullmatch(folder.name):
        raise ExportError(f"The local cache of {repo_id}@{revision} names {ascii(folder.name)} as its commit, which is "
                          "not a commit id; remove that cache entry and pull again while online.")
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    files = _select(names, wanted, repo_id, revision)
    return Snapshot(folder, repo_id, revision, folder.name, files, from_cache=True)


def evict_cached(snapshot_folder: Path, names: list[str]) -> None:
    """Drop files from a cache snapshot (the snapshot's link and the blob it points to), so that the
    next pull downloads them again instead of reusing a copy that failed its check."""
    for name in names:
        link = snapshot_folder / safe_relpath(name)
        if link.is_symlink():
            link.resolve().unlink(missing_ok=True)
            link.unlink()


def copy_files(source: Path, files: list[str], target: Path) -> None:
    """Copy ``files`` (checked names) from ``source`` into ``target``, following cache symlinks."""
    for name in files:
        rel = safe_relpath(name)
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, dest)
