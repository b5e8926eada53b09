"""Stored payloads are read through their typed records: string-key reads outside their homes stay few.

``benchmarks/key_reads.py`` counts them (its docstring says what counts); a checker that sees nothing could
pass, so it is also fed a small package with reads it must find and reads it must not.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 10


def _counter():
    spec = importlib.util.spec_from_file_location("key_reads", ROOT / "benchmarks" / "key_reads.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["key_reads"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_package_reads_stored_payloads_by_key_at_most_ten_times_outside_their_homes():
    reads = _counter().key_reads(ROOT)
    assert len(reads) <= LIMIT, "\n".join(f"{r.path}:{r.line} {r.code}" for r in reads)


def test_the_counter_finds_key_reads_of_payloads_and_only_those(tmp_path):
    package = tmp_path / "sbcli" / "cli"
    package.mkdir(parents=True)
    (package / "show.py").write_text(
        "def show(history, result, summary):\n"
        "    for h in history:\n"
        "        r = h.record\n"
        "        a = r.get('after_B', {}).get('overall')\n"  # 2: the record, and the metrics inside it
        "        b = 'after_C' in h.record\n"  # 1
        "        c = [p['epochs'] for p in h.phases]\n"  # 1
        "    d = summary['last']\n"  # 1: a parameter named as a payload
        "    e = history_summary(history)['forgetting']\n"  # 1
        "    h.record['written'] = 1\n"  # a write, not a read
        "    f = {'a': 1}['a']\n"  # not a payload
        "    g = result.metrics.overall\n"  # typed
        "    return a, b, c, d, e, f, g\n", encoding="utf-8")
    home = tmp_path / "sbcli" / "learner"
    home.mkdir()
    (home / "records.py").write_text("def read(h):\n    return h.record['after_C']\n", encoding="utf-8")  # its home
    reads = _counter().key_reads(tmp_path)
    assert [(r.line, r.code) for r in reads] == [(4, "r.get('after_B', {}).get('overall')"), (4, "r.get('after_B', {})"),
                                                  (5, "'after_C' in h.record"), (6, "p['epochs']"),
                                                  (7, "summary['last']"), (8, "history_summary(history)['forgetting']")]
