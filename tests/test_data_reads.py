"""Data sources read image files as ``sb predict`` does: regular files only, size-checked before reading.

A task folder may hold anything a file system can: a huge (or sparse) file, a link to ``/dev/zero``,
a FIFO. Each is refused in one sentence naming the file, quickly and without reading it, so that a
training run neither fills the memory, nor blocks forever, nor reaches the user as a traceback.

The refusals are checked in a child process with a small address-space limit and a timeout: a
regression that reads the whole file fails on memory there, and one that blocks on a FIFO fails on
the timeout, instead of taking the test session down with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from learner_files import hashes
from PIL import Image
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.data import pixels, walk
from sbcli.data.sources.folder import load_folder
from sbcli.data.sources.tiny_imagenet import load_tiny_imagenet
from sbcli.errors import DataError

runner = CliRunner()
GIB = 1 << 30
HEADROOM = 512 << 20  # address space the child may add to what its imports took: far below the 1 GiB file
QUICK_S = 5.0  # a refusal that reads nothing takes milliseconds; this leaves room for a busy machine

needs_posix = pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(),
                                 reason="FIFOs and /dev/zero are POSIX")


def png(path: Path, colour: tuple[int, int, int] = (200, 40, 40)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), colour, dtype=np.uint8)).save(path)
    return path


def make_bad(kind: str, path: Path) -> Path:
    """A file named like an image that must not be read: a sparse 1 GiB file, a link to /dev/zero, a FIFO."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "huge":
        with open(path, "wb") as f:
            f.truncate(GIB)  # sparse: no disk used
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)
    return path


EXPECTED = {"huge": "is 1.0 GiB, more than the 64 MiB an image file may be",
            "zero": "a character device, not a regular file", "fifo": "is a FIFO (named pipe), not a regular file"}


def one_sentence(message: str) -> bool:
    return message.endswith(".") and "\n" not in message and ". " not in message.replace("...", "")


def in_child(imports: str, call: str, timeout: float = 60.0) -> dict:
    """Run ``call`` in a fresh interpreter under an address-space limit; what it raised and how long it took."""
    code = textwrap.dedent("""
        import json, resource, sys, time
        from pathlib import Path
        from sbcli.errors import DataError
        {imports}
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + {headroom}, vm + {headroom}))
        start = time.perf_counter()
        try:
            {call}
            out = {{"raised": None}}
        except DataError as err:
            out = {{"raised": "DataError", "message": str(err)}}
        except BaseException as err:
            out = {{"raised": type(err).__name__, "message": str(err)[:300]}}
        out["seconds"] = time.perf_counter() - start
        print(json.dumps(out))
    """).format(imports=imports, call=call, headroom=HEADROOM)
    try:
        done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                              timeout=timeout, cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        pytest.fail(f"{call} did not return within {timeout} s (blocked reading the file?)")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_posix
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from /proc")
@pytest.mark.parametrize("kind", ["huge", "zero", "fifo"])
def test_read_image_file_refuses_without_reading(kind: str, tmp_path: Path) -> None:
    bad = make_bad(kind, tmp_path / "cat" / "x.jpg")
    out = in_child("from sbcli.data.pixels import read_image_file", f"read_image_file(Path({str(bad)!r}))")
    assert out["raised"] == "DataError", out
    assert out["message"].startswith(f"{bad} ") and EXPECTED[kind] in out["message"], out["message"]
    assert one_sentence(out["message"]) and out["seconds"] < QUICK_S


@needs_posix
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from /proc")
@pytest.mark.parametrize("kind", ["huge", "zero", "fifo"])
def test_a_task_folder_refuses_what_is_not_an_image_file(kind: str, tmp_path: Path) -> None:
    png(tmp_path / "data" / "cat" / "a.png")
    png(tmp_path / "data" / "dog" / "a.png")
    bad = make_bad(kind, tmp_path / "data" / "dog" / "x.png")
    out = in_child("from sbcli.data.sources.folder import load_folder",
                   f"load_folder(Path({str(tmp_path / 'data')!r}), 16, cache=None)")
    assert out["raised"] == "DataError", out
    message = out["message"]
    assert message.startswith(f"{bad} ") and EXPECTED[kind] in message and "remove" in message, message
    assert "BytesIO" not in message and one_sentence(message) and out["seconds"] < QUICK_S


def test_a_regular_image_file_is_read_whole(tmp_path: Path) -> None:
    image = png(tmp_path / "a.png")
    assert pixels.read_image_file(image) == image.read_bytes()
    link = tmp_path / "link.png"
    link.symlink_to(image)  # links are followed, as the folder walk follows them
    assert pixels.read_image_file(link) == image.read_bytes()


def test_a_file_at_the_limit_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 1000)
    assert len(pixels.read_image_file(path, limit=1000)) == 1000
    with pytest.raises(DataError, match=r"a\.bin is 1,000 bytes, more than the 999 bytes an image file may be"):
        pixels.read_image_file(path, limit=999)


def test_a_missing_or_unreadable_file_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        pixels.read_image_file(tmp_path / "gone.jpg")
    assert str(info.value).startswith(f"Cannot read {tmp_path / 'gone.jpg'} ") and one_sentence(str(info.value))
    (tmp_path / "dir.jpg").mkdir()
    with pytest.raises(DataError, match=r"dir\.jpg is a folder, not a regular file"):
        pixels.read_image_file(tmp_path / "dir.jpg")


def test_a_file_pillow_cannot_identify_is_named_by_its_path(tmp_path: Path) -> None:
    png(tmp_path / "cat" / "a.png")
    bad = tmp_path / "dog" / "x.jpg"
    bad.parent.mkdir()
    bad.write_bytes(b"\0" * 4096)
    with pytest.raises(DataError) as info:
        load_folder(tmp_path, 16, cache=None)
    message = str(info.value)
    assert str(bad) in message and "BytesIO" not in message and "0x" not in message, message
    assert one_sentence(message)


def test_a_tiny_imagenet_zip_member_too_large_is_refused_unread(tmp_path: Path) -> None:
    from test_sources import tiny_files

    archive = tmp_path / "tiny.zip"
    files = tiny_files()
    big = "train/n02/images/n02_1.JPEG"
    files[big] = b"\0" * (64 * 2**20 + 1)  # deflates to about 64 KiB: a zip bomb in small
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for rel, content in files.items():
            out.writestr("tiny-imagenet-200/" + rel, content)
    with pytest.raises(DataError) as info:
        load_tiny_imagenet(archive, True, cache=None)
    message = str(info.value)
    assert message.startswith(f"tiny-imagenet-200/{big} in {archive} is 64.0 MiB, more than the 64 MiB"), message
    assert one_sentence(message)


@needs_posix
def test_a_tiny_imagenet_folder_refuses_a_fifo_image(tmp_path: Path) -> None:
    from test_sources import write_tiny_dir

    root = write_tiny_dir(tmp_path / "tiny")
    bad = root / "train" / "n02" / "images" / "n02_1.JPEG"
    bad.unlink()
    os.mkfifo(bad)
    out = in_child("from sbcli.data.sources.tiny_imagenet import load_tiny_imagenet",
                   f"load_tiny_imagenet(Path({str(root)!r}), True, cache=None)")
    assert out["raised"] == "DataError" and out["message"].startswith(f"{bad} is a FIFO"), out


@needs_posix
def test_a_fifo_named_like_a_zip_is_refused_unopened(tmp_path: Path) -> None:
    fifo = tmp_path / "tiny.zip"
    os.mkfifo(fifo)
    out = in_child("from sbcli.data.sources.tiny_imagenet import load_tiny_imagenet",
                   f"load_tiny_imagenet(Path({str(fifo)!r}), True, cache=None)")
    assert out["raised"] == "DataError" and out["message"] == (
        f"{fifo} is a FIFO (named pipe), not a zip file; pass the Tiny-ImageNet folder or its official .zip."), out


def test_add_task_refuses_a_huge_image_quickly_and_in_little_memory(one_task_learner: Path, color_data: dict,
                                                                    tmp_path: Path) -> None:
    learner = tmp_path / "learner"
    shutil.copytree(one_task_learner, learner)
    before = hashes(learner)
    new = tmp_path / "new"
    shutil.copytree(color_data["task2_train"], new)
    make_bad("huge", new / "blue" / "huge.jpg")
    tracemalloc.start()
    start = time.perf_counter()
    try:
        res = runner.invoke(app, ["add-task", str(learner), str(new), "--device", "cpu", "--epochs", "1"])
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    said = " ".join(res.stderr.split())
    assert res.exit_code == 1, said
    assert "huge.jpg is 1.0 GiB, more than the 64 MiB an image file may be; remove it" in said, said
    assert "Unexpected" not in said and "Traceback" not in said and "BytesIO" not in said
    assert peak < 256 << 20 and seconds < 60, (peak, seconds)
    assert hashes(learner) == before


def nest(base: Path, levels: int) -> Path:
    """``base/d/d/.../d`` ``levels`` deep holding ``deep.png``, made 100 levels at a time from inside (no
    path passes PATH_MAX on the way, however deep); the bottom's path, which may pass it."""
    here = os.getcwd()
    os.chdir(base)
    try:
        for step in range(0, levels, 100):
            chunk = os.path.join(*["d"] * min(100, levels - step))
            os.makedirs(chunk)
            os.chdir(chunk)
        Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save("deep.png")
    finally:
        os.chdir(here)
    return base.joinpath(*["d"] * levels)


def remove_nest(top: Path) -> None:
    """Remove ``top`` and a chain of folders below it one level at a time, by short paths: pytest's own
    clean-up of old temporary folders recurses (shutil.rmtree) and would fail on it in a later session."""
    while top.exists():
        for entry in os.scandir(top):
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
        if not (top / "d").exists():
            os.rmdir(top)
            return
        up = top.with_name(top.name + ".up")
        os.rename(top / "d", up)  # the chain moves one level up; the path to it stays short
        os.rmdir(top)
        os.rename(up, top)


def test_a_class_folder_1000_folders_deep_is_walked(tmp_path: Path) -> None:
    root = tmp_path / "data"
    png(root / "cat" / "a.png")
    (root / "dog").mkdir()
    try:
        bottom = nest(root / "dog", 1000)
        assert [p for p, _ in walk.walk_stats(root / "dog")] == [bottom / "deep.png"]
        report = load_folder(root, 8, cache=None)
        assert report.data.class_names == ["cat", "dog"] and report.data.labels.tolist() == [0, 1]
    finally:
        remove_nest(root / "dog")


def test_a_folder_nested_past_the_systems_path_limit_is_one_sentence(tmp_path: Path) -> None:
    root = tmp_path / "data"
    png(root / "cat" / "a.png")
    (root / "dog").mkdir()
    levels = os.pathconf(tmp_path, "PC_PATH_MAX") // 2 + 100 if hasattr(os, "pathconf") else 2500
    try:
        nest(root / "dog", levels)
        with pytest.raises(DataError) as info:
            load_folder(root, 8, cache=None)
    finally:
        remove_nest(root / "dog")
    message = str(info.value)
    assert message.startswith(f"The path {root / 'dog'}/d/d/") and "is longer than the system allows" in message
    assert one_sentence(message) and len(message) < 400


def test_the_walk_still_refuses_a_loop_deep_down(tmp_path: Path) -> None:
    deep = tmp_path / "c" / "d" / "d" / "d"
    deep.mkdir(parents=True)
    png(deep / "a.png")
    (deep / "back").symlink_to(tmp_path / "c" / "d")
    with pytest.raises(DataError, match=r"back is a symlink loop: .* leads back to .*c/d; remove the link\."):
        list(walk.walk_stats(tmp_path / "c"))
    # the same folder twice, side by side, is not a loop
    (tmp_path / "c" / "again").symlink_to(deep)
    (deep / "back").unlink()
    assert [p.name for p, _ in walk.walk_stats(tmp_path / "c")] == ["a.png", "a.png"]


def test_sb_predict_refuses_a_fifo_and_a_device_link_at_once(tmp_path: Path) -> None:
    """`sb predict` reads image files through the same bounded reader as training (it blocked on a FIFO)."""
    import os
    import subprocess
    import sys

    fifo, zero = tmp_path / "x.png", tmp_path / "z.png"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    for bad in (fifo, zero):
        code = ("from pathlib import Path; from sbcli.serve.predict import read_image_file\n"
                f"try:\n    read_image_file(Path({str(bad)!r}))\nexcept Exception as err:\n    print(type(err).__name__, err)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=False)
        assert out.stdout.startswith("DataError") and "not a regular file" in out.stdout, out.stdout + out.stderr
