"""``sb pull NAME[@REVISION]``: a zoo entry or a Hub repository, verified and installed as a learner.

NAME is a zoo name (``sb pull --list``) or ``OWNER/NAME`` on the Hub. Where the zoo index lists
file hashes for what is fetched, every listed file must match its SHA-256; files are copied into
a temporary folder beside the target, verified there, checked to be a learner, and only then
moved into place, so a refused pull leaves nothing behind. With or without zoo hashes, every file
the learner names must match the SHA-256 and size its own ``learner.json`` records (format 3,
:mod:`sbcli.learner.store.layout`): a flipped bit or a zeroed tail fails the pull.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sbcli.atomic import NAME_MAX, staging
from sbcli.errors import ConfigError, ExportError, LearnerError
from sbcli.hub.client import HubConfig, check_repo_id, check_revision, copy_files, evict_cached, fetch, safe_relpath
from sbcli.hub.zoo import ZooEntry, ZooIndex, hash_error, load_index, mismatched_files
from sbcli.learner.store.outputs import check_output_dir


@dataclass(frozen=True)
class Ref:
    """What the user asked for: a zoo name or a Hub repository, and an optional revision."""

    name: str
    revision: str | None

    @property
    def is_repo(self) -> bool:
        return "/" in self.name


def parse_ref(text: str) -> Ref:
    """``NAME[@REVISION]``; raises ConfigError when either part is empty or the name is malformed."""
    name, at, revision = text.partition("@")
    if not name or (at and not revision):
        raise ConfigError(f"'{text}' is not NAME[@REVISION]; e.g. demo-sb-tiny or user/my-learner@step-2.")
    if "/" in name:
        check_repo_id(name)
    if revision:
        check_revision(revision)
    return Ref(name, revision or None)


@dataclass(frozen=True)
class Source:
    """Files ready to install: where they are, which ones, the hashes to check, and where from."""

    folder: Path
    files: list[str]
    expected: dict[str, str]
    origin: str
    revision: str | None = None
    commit: str | None = None
    from_cache: bool = False
    notes: list[str] = field(default_factory=list)
    cached: bool = False  # ``folder`` is a huggingface_hub cache snapshot (bad files are evicted from it)


@dataclass(frozen=True)
class PullReport:
    """Where the learner now is and how it got there."""

    path: Path
    origin: str
    revision: str | None
    commit: str | None
    files: list[str]
    verified: list[str]
    from_cache: bool
    notes: list[str]
    contents: dict[str, Any] = field(default_factory=dict)  # steps, classes, exemplar and test images inside

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "origin": self.origin, "revision": self.revision, "commit": self.commit,
                "files": self.files, "verified": self.verified, "from_cache": self.from_cache, "notes": self.notes,
                "contents": self.contents}


def _bundled(index: ZooIndex, entry: ZooEntry, revision: str | None, cfg: HubConfig) -> Source:
    del cfg  # bundled entries need no network
    if revision is not None:
        raise ConfigError(f"Zoo entry {entry.name} is bundled with sbcli and has one revision; drop '@{revision}'.")
    folder = index.bundled_dir(entry)
    if not folder.is_dir():
        raise ExportError(f"The bundled learner of {entry.name} is missing from this installation ({folder}); reinstall sbcli.")
    return Source(folder, sorted(entry.files), entry.files, f"zoo entry {entry.name} (bundled)")


def _from_hub(index: ZooIndex, entry: ZooEntry, revision: str | None, cfg: HubConfig) -> Source:
    del index
    rev = revision or entry.revision
    indexed = rev == entry.revision
    snap = fetch(entry.target, rev, cfg, sorted(entry.files) if indexed and entry.files else None)
    notes = [] if indexed else [f"revision {rev} is not the one the zoo index lists ({entry.revision}); hashes not checked"]
    return Source(snap.folder, snap.files, entry.files if indexed else {}, f"zoo entry {entry.name} ({entry.target}@{rev})",
                  rev, snap.commit, snap.from_cache, notes, cached=True)


def _unpublished(index: ZooIndex, entry: ZooEntry, revision: str | None, cfg: HubConfig) -> Source:
    del revision, cfg
    raise ConfigError(f"Zoo entry {entry.name} is not published anywhere; build it locally with its recipe "
                      f"({index.recipe_path(entry).name}): {entry.build}")


def _built(index: ZooIndex, entry: ZooEntry, revision: str | None, cfg: HubConfig) -> Source:
    del index, revision, cfg
    raise ConfigError(f"Zoo entry {entry.name} is built on this machine: `sb pull {entry.name} --data FILE` learns it.")


FETCHERS: dict[str, Callable[[ZooIndex, ZooEntry, str | None, HubConfig], Source]] = {
    "bundled": _bundled,
    "build": _built,
    "hub": _from_hub,
    "unpublished": _unpublished,
}


def _repo_source(index: ZooIndex, ref: Ref, cfg: HubConfig) -> Source:
    """A Hub repository by id; verified when the zoo lists that repository at that revision."""
    entry = next((e for e in index.entries.values() if e.location == f"hub:{ref.name}"), None)
    if entry is not None and (ref.revision or "main") == entry.revision:
        return _from_hub(index, entry, entry.revision, cfg)
    snap = fetch(ref.name, ref.revision, cfg)
    notes = [] if entry is None else [f"the zoo lists {ref.name} at {entry.revision}, not {snap.revision}; hashes not checked"]
    return Source(snap.folder, snap.files, {}, f"{ref.name}@{snap.revision}", snap.revision, snap.commit,
                  snap.from_cache, notes, cached=True)


def resolve(ref: Ref, index: ZooIndex, cfg: HubConfig) -> Source:
    """Find (download if needed) what ``ref`` names."""
    if ref.is_repo:
        return _repo_source(index, ref, cfg)
    entry = index.get(ref.name)
    return FETCHERS[entry.kind](index, entry, ref.revision, cfg)


def default_target(ref: Ref) -> Path:
    """``./NAME`` or ``./NAME-REVISION`` in the working directory."""
    base = re.sub(r"[^A-Za-z0-9._-]", "-", ref.name.split("/")[-1] + (f"-{ref.revision}" if ref.revision else ""))
    if len(base) > NAME_MAX:  # a long revision: its end becomes a hash, so that the name fits
        base = base[: NAME_MAX - 17] + "-" + hashlib.sha256(base.encode()).hexdigest()[:16]
    return Path.cwd() / base


def install(source: Source, target: Path) -> tuple[list[str], dict[str, Any]]:
    """Copy, verify and check the files in a folder beside ``target``, then move it into place.

    Returns the verified file names and what the learner holds (:func:`contents`). Raises
    ExportError/LearnerError and leaves nothing behind.
    """
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise LearnerError(f"{target} already exists; pull into another directory with -o, or remove it first.")
    target.parent.mkdir(parents=True, exist_ok=True)
    with staging(target, "pull") as tmp:  # a SIGKILLed pull's folder is removed by the next pull beside it
        tmp.mkdir()  # mode from the umask (mkdtemp would make the pulled learner 0700)
        copy_files(source.folder, source.files, tmp)
        bad = mismatched_files(tmp, source.expected)
        if bad:
            if source.cached:
                evict_cached(source.folder, bad)
            raise ExportError(hash_error(bad, source.origin))
        inside = _check_learner(tmp, source.origin, bool(source.expected))
        move_into_place(tmp, target)
    return sorted(source.expected), inside


def move_into_place(tmp: Path, target: Path) -> None:
    """One rename; a target that another process filled meanwhile is refused, not merged."""
    try:
        if target.exists():
            target.rmdir()
        os.replace(tmp, target)
    except OSError as err:
        raise LearnerError(f"{target} already exists; pull into another directory with -o, or remove it first.") from err


def _check_learner(folder: Path, origin: str, zoo_verified: bool) -> dict[str, Any]:
    """Load the downloaded learner whole (every file checked against its recorded hash), and say what it holds."""
    from sbcli.learner.state import Learner, open_stored, read_state

    try:
        read_state(folder)
        learner = Learner.load(folder, "cpu")  # reads and verifies the current step's files
        stored = open_stored(folder)
        current = set(stored.files.values()) | {f"objects/{sha}" for sha in stored.step_blocks(stored.current)}
        for rel in sorted(stored.referenced() - current):
            stored.read(rel)  # the files and blocks of other kept steps, each verified in one pass
    except LearnerError as err:
        raise LearnerError(f"{origin} is not an sbcli learner ({str(err).replace(str(folder), 'the download')})") from err
    inside = contents(learner)
    inside["hashes_recorded"] = bool(stored.hashes)
    if not stored.hashes and not zoo_verified:
        inside["unverified"] = True
    return inside


def contents(learner: Any) -> dict[str, Any]:
    """Steps, classes, and the images that travel with a learner (exemplars, test sample)."""
    s = learner.state
    return {"steps": s.steps, "classes": s.num_classes, "memory_budget": learner.memory.budget,
            "exemplar_images": len(learner.memory),
            "test_images": 0 if learner.test_sample is None else len(learner.test_sample),
            # tasks of the demo, whose test images ship with sbcli: `sb evaluate` finds them anywhere
            "bundled_test_tasks": sum(t.data_source.kind == "demo" for t in s.tasks)}


def content_notes(inside: dict[str, Any]) -> list[str]:
    """What a user must know before growing or evaluating the pulled learner."""
    if not inside:
        return []
    notes = []
    if inside.get("unverified"):
        notes.append("this learner records no file hashes (it was saved by an older sbcli) and no zoo index "
                     "lists it: its files were checked for structure, not for changed bytes")
    if inside["exemplar_images"] == 0 and inside["memory_budget"] > 0 and inside["steps"] > 0:
        notes.append("this learner carries no exemplar memory (it was pushed without --with-memory): `sb add-task` "
                     "refuses it unless you pass --no-rehearsal, which grows it by distillation alone")
    else:
        notes.append(f"this learner carries {inside['exemplar_images']} exemplar images (its memory), so "
                     "`sb add-task` rehearses its old classes")
    bundled = inside.get("bundled_test_tasks", 0)
    if inside["test_images"] == 0 and bundled and bundled == inside["steps"]:
        notes.append("its test images are the demo's, which ship with sbcli, so `sb evaluate` works anywhere")
    elif inside["test_images"] == 0 and bundled:
        notes.append("it carries no test sample: `sb evaluate` finds the demo's test images (they ship with sbcli) "
                     "and needs the other tasks' original test folders (--data-root) or a test folder you give it")
    elif inside["test_images"] == 0:
        notes.append("it carries no test sample: `sb evaluate` needs its original test folders (--data-root) "
                     "or a test folder you give it")
    else:
        notes.append(f"it carries {inside['test_images']} held-out test images, so `sb evaluate` works without "
                     "its original test folders")
    return notes


def backbone_entry(ref: str, index: Path | None = None) -> tuple[ZooEntry, ZooIndex] | None:
    """The zoo's backbone entry that ``ref`` names (``NAME[@REVISION]``), with its index; None for anything else
    (a learner entry, a Hub repository): :func:`sbcli.run.backbone_learner.pull_backbone` makes a learner of it."""
    parsed = parse_ref(ref)
    if parsed.is_repo:
        return None
    zoo_index = load_index(index)
    entry = zoo_index.get(parsed.name)
    return (entry, zoo_index) if entry.holds == "backbone" else None


def built_entry(ref: str, index: Path | None = None) -> tuple[ZooEntry, ZooIndex] | None:
    """The zoo's entry built on this machine that ``ref`` names, with its index; None for anything else
    (:func:`sbcli.run.zoo_build.build_entry` learns it). A revision is refused: a build has none."""
    parsed = parse_ref(ref)
    if parsed.is_repo:
        return None
    zoo_index = load_index(index)
    entry = zoo_index.get(parsed.name)
    if entry.kind != "build":
        return None
    if parsed.revision is not None:
        raise ConfigError(f"Zoo entry {entry.name} is built on this machine and has no revisions; drop '@{parsed.revision}'.")
    return entry, zoo_index


def pull(ref: str, out: Path | None = None, *, index: Path | None = None, cfg: HubConfig | None = None) -> PullReport:
    """Fetch ``ref`` (zoo name or OWNER/NAME, with optional ``@revision``) into ``out`` as a learner.

    Raises:
        UnknownNameError: no zoo entry of that name (with a suggestion).
        ConfigError: a malformed reference, or an unpublished zoo entry (with how to build it).
        ExportError: unknown repository or revision, an unreachable Hub with nothing cached, an unsafe
            file name, or a file that fails its hash check.
        LearnerError: the target exists, or what was fetched is not a learner.
    """
    parsed = parse_ref(ref)
    target = Path(out) if out is not None else default_target(parsed)
    check_output_dir(target, option="-o")  # before any download
    source = resolve(parsed, load_index(index), cfg or HubConfig())
    for name in source.files:
        safe_relpath(name)
    verified, inside = install(source, target.resolve())
    return PullReport(target, source.origin, source.revision, source.commit, source.files, verified,
                      source.from_cache, [*source.notes, *content_notes(inside)], inside)
