"""Memory of `sb serve` under oversized requests: the server's peak and settled RSS per case.

Usage::

    nice -n 10 python benchmarks/serve_memory.py                   # random ResNet-18 x0.125, 10 classes, 32 px
    nice -n 10 python benchmarks/serve_memory.py --model model.onnx --json results.json
    nice -n 10 python benchmarks/serve_memory.py --serve-args "--max-image-pixels 200000000"

It starts ``python -m sbcli serve MODEL`` on 127.0.0.1 (a free port, no reload) and sends, one
after the other (loopback only, a bounded number of requests, each with a timeout):

- ``one-png``: one 9000 x 9000 PNG (81 megapixels in about 236 KB: black pixels compress well);
- ``64-pngs``: one multipart request holding 64 of them (about 15 MB);
- ``repeated``: ``--repeats`` one-image requests in a row;
- ``3x36mp``: ``--repeats`` requests in a row, each of three 6000 x 6000 PNGs (108 megapixels,
  within the default limits, so they are decoded: the memory a large accepted request takes and
  gives back);
- ``nested-json``: a JSON body nested 100,000 lists deep;
- ``sparse-file``: a 1 GiB sparse file sent as a raw image body (its Content-Length says so);
- ``small``: one 32 x 32 PNG, which must still be answered;
- ``64x15mib-at-once`` and ``32x15mib-multipart-at-once``: that many 15 MiB uploads sent together
  (raw bodies, then multipart forms): the bytes held at once are bounded (``--max-inflight-mb``).

After each case it reads the server's ``VmHWM`` (peak) and, after ``--settle`` seconds,
``VmRSS`` from ``/proc/<pid>/status``; the peak is reset before each case through
``/proc/<pid>/clear_refs`` where the kernel allows it (else it is the peak since start). It prints
one row per case (HTTP status, peak and settled RSS in MiB) and the server's RSS at rest before
the first case.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import shlex
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

MIB = 2**20
TIMEOUT = 300.0


def black_png(width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of black pixels, compressed row by row (never holds the pixels)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    squeeze = zlib.compressobj(9)
    row = b"\0" * (1 + 3 * width)  # filter byte 0, then the pixels
    idat = b"".join(squeeze.compress(row) for _ in range(height)) + squeeze.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def small_png(size: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (size, size), (90, 140, 200)).save(out, format="PNG")
    return out.getvalue()


def multipart(files: list[bytes]) -> tuple[bytes, str]:
    boundary = "sbcli-memory-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{i}.png"\r\n'
             f"Content-Type: image/png\r\n\r\n".encode() + data + b"\r\n" for i, data in enumerate(files)]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def post(port: int, body: bytes, content_type: str) -> int:
    """The HTTP status of one POST /predict (0: no answer within the timeout or the connection dropped)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/predict", body=body, headers={"Content-Type": content_type})
        res = conn.getresponse()
        res.read()
        return res.status
    except OSError:
        return 0
    finally:
        conn.close()


def at_once(clients: int, send: Callable[[], int]) -> list[int]:
    """``send`` from ``clients`` threads at the same moment: the statuses."""
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda _: send(), range(clients)))


def post_file(port: int, path: Path) -> int:
    """POST a file's bytes as the body with its size as Content-Length; stops sending once answered."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.putrequest("POST", "/predict")
        conn.putheader("Content-Type", "image/png")
        conn.putheader("Content-Length", str(path.stat().st_size))
        conn.endheaders()
        res = conn.getresponse()  # a server that checks the length answers before any body is sent
        res.read()
        return res.status
    except OSError:
        return 0
    finally:
        conn.close()


def status_kib(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of ``pid`` in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


def reset_peak(pid: int) -> bool:
    """Reset the peak RSS of ``pid`` (Linux 4.0+: write 5 to clear_refs); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Row:
    case: str
    statuses: list[int]
    peak_mib: float
    settled_mib: float
    seconds: float


def measure(pid: int, case: str, send: Callable[[], list[int]], settle: float) -> Row:
    reset_peak(pid)
    print(f"{case} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    statuses = send()
    seconds = time.perf_counter() - start
    peak = status_kib(pid)["VmHWM"]
    time.sleep(settle)
    return Row(case, statuses, round(peak / 1024, 1), round(status_kib(pid)["VmRSS"] / 1024, 1), round(seconds, 2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sb serve did not start (exit {proc.poll()})")
        time.sleep(0.2)


@contextmanager
def serving(model: Path, extra: list[str], env: dict[str, str] | None = None) -> Iterator[tuple[int, int]]:
    """``python -m sbcli serve MODEL`` on 127.0.0.1: (port, pid); stopped on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "sbcli", "serve", str(model), "--port", str(port), "--reload-interval", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        wait_ready(port, proc, 120)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def sparse_file(folder: Path, size: int) -> Path:
    path = folder / "sparse.png"
    with path.open("wb") as f:
        f.truncate(size)
    return path


def run_cases(port: int, pid: int, folder: Path, *, repeats: int, settle: float, side: int = 9000,
              copies: int = 64, depth: int = 100_000, sparse_bytes: int = 2**30,
              only: set[str] | None = None) -> tuple[float, list[Row]]:
    """The server's RSS at rest (MiB), then one :class:`Row` per case, in order."""
    big = black_png(side, side)
    many, kind = multipart([big] * copies)
    three, three_kind = multipart([black_png(6000, 6000)] * 3)
    nested = b'{"images": ' + b"[" * depth + b"]" * depth + b"}"
    sparse = sparse_file(folder, sparse_bytes)
    upload = bytes(15 * 2**20)  # 15 MiB: under the per-request limit, over the bytes held at once when many come together
    upload_form, upload_kind = multipart([upload])
    rest = status_kib(pid)["VmRSS"] / 1024
    cases: list[tuple[str, Callable[[], list[int]]]] = [
        ("one-png", lambda: [post(port, big, "image/png")]),
        (f"{copies}-pngs", lambda: [post(port, many, kind)]),
        ("repeated", lambda: [post(port, big, "image/png") for _ in range(repeats)]),
        ("3x36mp", lambda: [post(port, three, three_kind) for _ in range(repeats)]),
        ("nested-json", lambda: [post(port, nested, "application/json")]),
        ("sparse-file", lambda: [post_file(port, sparse)]),
        ("small", lambda: [post(port, small_png(32), "image/png")]),
        ("64x15mib-at-once", lambda: at_once(64, lambda: post(port, upload, "image/png"))),
        ("32x15mib-multipart-at-once", lambda: at_once(32, lambda: post(port, upload_form, upload_kind))),
    ]
    return round(rest, 1), [measure(pid, name, send, settle) for name, send in cases if not only or name in only]


def random_model(out: Path, width: float, classes: int, size: int) -> Path:
    """A random-weight learner exported to ``out`` (memory does not depend on the weights)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from onnx_speed import random_learner  # imports torch: only to build the model

    from sbcli.export.onnx import export_onnx

    return export_onnx(random_learner(width, classes, size), out).path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="an .onnx file from sb export (default: a random ResNet-18 x0.125)")
    parser.add_argument("--repeats", type=int, default=4, help="one-image requests in a row (default 4)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before reading the settled RSS")
    parser.add_argument("--serve-args", default="", help="extra `sb serve` options, e.g. \"--max-image-pixels 1e8\"")
    parser.add_argument("--cases", nargs="*", help="run only these cases (default: all)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or random_model(Path(tmp) / "model.onnx", 0.125, 10, 32)
        with serving(model, shlex.split(args.serve_args)) as (port, pid):
            rest, rows = run_cases(port, pid, Path(tmp), repeats=args.repeats, settle=args.settle,
                                   only=set(args.cases or ()))
    print(f"sb serve {args.serve_args or '(defaults)'}: RSS at rest {rest:.0f} MiB")
    print(f"{'case':<12} {'status':<16} {'peak MiB':>9} {'settled MiB':>12} {'seconds':>8}")
    for row in rows:
        statuses = ",".join(sorted({str(s) for s in row.statuses}))
        print(f"{row.case:<12} {statuses + ' x' + str(len(row.statuses)):<16} {row.peak_mib:>9.0f} {row.settled_mib:>12.0f} {row.seconds:>8.2f}")
    if args.json:
        args.json.write_text(json.dumps({"rest_mib": rest, "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
