"""`sb serve` and `sb predict` within bounded memory: pixel limits read from the header before any
decoding (413 with one sentence), a server-wide pixel budget, deeply nested JSON as a 400, files
refused from their size before they are read, and a bounded load test of a real `sb serve`
process that sends the oversized cases and checks its peak and settled RSS."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from learners import make_learner
from PIL import Image
from test_serve_http import call, multipart, png, running
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.data import pixels
from sbcli.errors import DataError
from sbcli.export import onnx as onnx_export
from sbcli.serve import limits
from sbcli.serve.app import ServeConfig
from sbcli.serve.predict import predict, read_image_file
from sbcli.serve.versions import model_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from serve_memory import black_png, run_cases, serving  # noqa: E402

BIG = black_png(9000, 9000)  # 81 megapixels in about 236 KB


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("limits") / "model.onnx"
    onnx_export.export_onnx(make_learner("std"), out)
    return out


def jpeg(side: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


def test_too_many_pixels_are_refused_from_the_header_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    loads = []
    original = Image.Image.load
    monkeypatch.setattr(Image.Image, "load", lambda self: loads.append(self.size) or original(self))
    with pytest.raises(pixels.ImageTooLargeError, match=r"9000 x 9000 pixels \(81,000,000\), more than the 40,000,000"):
        pixels.decode(BIG, 32, 32, max_pixels=40_000_000, name="big.png")
    assert loads == []  # nothing decoded
    assert pixels.decoded_size(BIG, 32, 32) == (9000, 9000)
    # A JPEG decodes at 1/8 scale when that still covers the target: 2000 px -> 250 px, under a 0.1 MP limit.
    assert pixels.decoded_size(jpeg(2000), 32, 32) == (250, 250)
    assert pixels.decode(jpeg(2000), 32, 32, max_pixels=100_000).shape == (3, 32, 32)


def test_pillow_bomb_warning_becomes_a_refusal_where_the_policy_says_so() -> None:
    import warnings

    over = black_png(9500, 9500)  # 90.25 MP: above Pillow's warning threshold, under its error
    with warnings.catch_warnings():
        pixels.refuse_pillow_bombs()
        with pytest.raises(pixels.ImageTooLargeError, match="more pixels than Pillow's decompression-bomb threshold"):
            pixels.decoded_size(over, 32, 32)


def test_pixel_budget_holds_at_most_its_capacity_in_order() -> None:
    async def scenario() -> tuple[int, list[int]]:
        budget, peak, order = limits.PixelBudget(10), [0], []

        async def job(i: int, n: int) -> None:
            async with budget.hold(n):
                peak[0] = max(peak[0], budget.used)
                order.append(i)
                await asyncio.sleep(0.01)

        await asyncio.gather(*(job(i, n) for i, n in enumerate([6, 6, 3, 20, 1])))
        assert budget.used == 0
        return peak[0], order

    peak, order = asyncio.run(scenario())
    assert peak <= 10 and order == [0, 1, 2, 3, 4]  # FIFO: the small ones do not overtake a waiting large one


def test_server_refuses_oversized_images_with_413_and_nested_json_with_400(model: Path) -> None:
    cfg = ServeConfig(str(model), reload_interval_s=0, max_image_pixels=40_000_000, max_request_pixels=3_000_000)
    with running(cfg) as (url, server):
        status, body = call(f"{url}/predict", BIG, "image/png")
        assert status == 413
        assert body["error"] == ("Image #0 would decode to 81,000,000 pixels, more than the 40,000,000 this server "
                                 "decodes per image; send a smaller image.")
        many, kind = multipart([(f"{i}.png", black_png(1000, 1000)) for i in range(4)])
        status, body = call(f"{url}/predict", many, kind)
        assert status == 413 and body["error"].startswith("The request's images would decode to 4,000,000 pixels")
        for depth in (100, 100_000):
            nested = b'{"images": ' + b"[" * depth + b"]" * depth + b"}"
            status, body = call(f"{url}/predict", nested, "application/json")
            assert status == 400 and body["error"].endswith(".") and "\n" not in body["error"]
        status, body = call(f"{url}/predict", b"{" * 50_000, "application/json")
        assert status == 400
        status, body = call(f"{url}/predict", png(1), "image/png")
        assert status == 200 and server.budget.used == 0
        status, meta = call(f"{url}/metadata")
        assert meta["limits"]["max_image_pixels"] == 40_000_000 and meta["limits"]["max_request_pixels"] == 3_000_000
        # the Open Inference Protocol's encoded images are decoded within the same limits
        infer = f"{url}/v2/models/{model_name(model)}/infer"
        big = {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(BIG).decode()]}]}
        status, body = call(infer, json.dumps(big).encode(), "application/json")
        assert status == 413 and body["error"].startswith("Image #0 would decode to 81,000,000 pixels")
        assert server.budget.used == 0


def test_cli_refuses_bad_pixel_limits_in_one_sentence(model: Path) -> None:
    for args, words in ((["--max-image-megapixels", "0"], "must be above 0"),
                        (["--max-image-megapixels", "50", "--max-request-megapixels", "10"], "at most --max-request-megapixels"),
                        (["--max-image-megapixels", "100", "--max-request-megapixels", "200"], "decompression-bomb threshold")):
        res = CliRunner().invoke(app, ["serve", str(model), "--port", "0", *args])
        assert res.exit_code == 1 and words in res.output and "Traceback" not in res.output


def test_cli_defaults_are_the_library_defaults() -> None:
    res = CliRunner().invoke(app, ["serve", "--help"], terminal_width=200)
    assert "--max-image-megapixels" in res.output and "--max-request-megapixels" in res.output
    from sbcli.cli.serve import serve

    defaults = serve.__wrapped__.__defaults__ if hasattr(serve, "__wrapped__") else serve.__defaults__
    assert limits.DEFAULT_MAX_IMAGE_PIXELS / 1e6 in defaults and limits.DEFAULT_MAX_REQUEST_PIXELS / 1e6 in defaults


def test_a_huge_sparse_file_is_refused_without_being_read(tmp_path: Path, model: Path) -> None:
    sparse = tmp_path / "huge.png"
    with sparse.open("wb") as f:
        f.truncate(2**30)
    tracemalloc.start()
    with pytest.raises(DataError, match=r"huge.png is 1.0 GiB, more than the 64 MiB an image file may be"):
        read_image_file(sparse)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20  # nothing of it was read (the proof is the memory, not a time a loaded machine can miss)
    res = CliRunner().invoke(app, ["predict", str(model), str(sparse)])
    assert res.exit_code == 1 and "is 1.0 GiB, more than the 64 MiB" in res.output
    small = tmp_path / "small.png"
    small.write_bytes(png(2))
    assert len(predict(model, [small]).predictions) == 1


def test_load_test_oversized_cases_keep_sb_serve_within_bounds(model: Path, tmp_path: Path) -> None:
    """A real `sb serve` on 127.0.0.1: every oversized case refused, peak and settled RSS bounded."""
    with serving(model, []) as (port, pid):
        rest, rows = run_cases(port, pid, tmp_path, repeats=2, settle=0.5)
    by = {row.case: row for row in rows}
    assert by["one-png"].statuses == [413] and by["64-pngs"].statuses == [413] and by["repeated"].statuses == [413, 413]
    assert by["nested-json"].statuses == [400] and by["sparse-file"].statuses == [413] and by["small"].statuses == [200]
    assert by["3x36mp"].statuses == [200, 200]  # 108 MP, within the limits: decoded
    for row in rows:  # before: one 81 MP PNG took the server to 1 GB, 64 of them to 5.8 GB (5.7 GB kept)
        # refused: no decoding; accepted: 108 MP at about 4 bytes a pixel (1.3 GB before)
        assert row.peak_mib < rest + (600 if row.case == "3x36mp" else 200), (row, rest)
        assert row.settled_mib < rest + 100, (row, rest)  # memory handed back (1.16 GB kept before)
    print(json.dumps({"rest_mib": rest, "rows": [row.__dict__ for row in rows]}))
