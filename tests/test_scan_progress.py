"""Listing and decoding a class-per-folder tree say how far they are on stderr (the `sbcli.progress`
log, silenced by --quiet), and listing stats every file once."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sbcli.cli import progress as cli_progress
from sbcli.data import progress, walk
from sbcli.data.sources.folder import load_folder


def tree(root: Path, classes: int = 3, per_class: int = 40) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}" / "nested").mkdir(parents=True)
        for i in range(per_class):
            where = root / f"c{c}" / ("nested" if i % 2 else "") / f"{i:03d}.png"
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(where)
    return root


def test_listing_and_decoding_log_progress_and_a_rate(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path / "data")
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)  # a line for every file or chunk, whatever the speed
    with caplog.at_level(logging.INFO, logger="sbcli.progress"):
        report = load_folder(root, 8, cache=None)
    assert len(report.data) == 120
    lines = [r.getMessage() for r in caplog.records if r.name == "sbcli.progress"]
    listing = [line for line in lines if line.startswith(f"Listing images in {root}: ")]
    assert "1 files so far" in listing[0] and listing[-1].startswith(f"Listing images in {root}: 120 files in ")
    assert listing[-1].endswith("files/s).") and len(listing) >= 120
    decoding = [line for line in lines if line.startswith(f"Decoding images in {root}: ")]
    assert "120 of 120 images" in decoding[0] and decoding[-1].endswith("images/s).")


def test_short_work_says_nothing_and_quiet_silences_it(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path / "data", 2, 4)
    with caplog.at_level(logging.INFO, logger="sbcli.progress"):
        load_folder(root, 8, cache=None)  # well under INTERVAL_S
    assert not [r for r in caplog.records if r.name == "sbcli.progress"]
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)
    caplog.clear()
    cli_progress.reporter(quiet=True)
    try:
        load_folder(root, 8, cache=None)
        assert not [r for r in caplog.records if r.name == "sbcli.progress"]
    finally:
        cli_progress.reporter(quiet=False)


def test_walk_stats_one_stat_a_file_same_order_and_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree(tmp_path / "data", 2, 6)
    (root / "c1" / "link.png").symlink_to(root / "c0" / "000.png")
    expected = [p for p in walk.walk_files(root)]
    calls = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda *a, **k: calls.append(a[0]) or real_stat(*a, **k))
    pairs = list(walk.walk_stats(root))
    files_first = ["000.png", "002.png", "004.png"]  # a folder's files (sorted), then its subfolders
    nested = ["nested/001.png", "nested/003.png", "nested/005.png"]
    want = [root / "c0" / n for n in files_first + nested] + [root / "c1" / n for n in files_first + ["link.png"] + nested]
    assert [p for p, _ in pairs] == expected == want
    for path, st in pairs:
        assert (st.st_size, st.st_mtime_ns) == (real_stat(path).st_size, real_stat(path).st_mtime_ns)
    assert len(calls) <= 1  # the root only: DirEntry.stat does the rest, once a file


def test_lines_mode_says_where_a_long_epoch_is(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    pipe = Console(file=io.StringIO(), force_terminal=False, width=200)
    lines = cli_progress.reporter(False, console=pipe)
    assert isinstance(lines, cli_progress.LineReporter)
    monkeypatch.setattr(lines, "within_epoch_s", 0.0)
    for done in range(1, 5):
        lines.on_batch(done, 10)
    out = pipe.file.getvalue().splitlines()
    assert len(out) == 3 and out[-1].startswith("batch 4/10 of the running epoch · ") and "the epoch ends in" in out[-1]
    monkeypatch.setattr(lines, "within_epoch_s", 3600.0)
    for done in range(1, 5):
        lines.on_batch(done, 10)
    assert len(pipe.file.getvalue().splitlines()) == 3  # a new epoch; nothing within the hour
