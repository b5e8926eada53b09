"""Rebuild the paper's comparison: a grid of methods x task counts, one budget, resumable.

:mod:`~sbcli.bench.grid` (the rows, the cells and their shared budget), :mod:`~sbcli.bench.runner`
(run, resume or skip every cell: :func:`run_bench`), :mod:`~sbcli.bench.table` (``table.md``,
``table.json`` and the figures, beside the paper's Table 1) and :mod:`~sbcli.bench.report` (what ran,
in words). The names below are the ones `sb bench` and its users import.
"""

from sbcli.bench.grid import (
    BENCH_METHODS,
    PAPER_ORDER,
    PAPER_RHO,
    BenchMethod,
    BenchPlan,
    Cell,
    cell_options,
    dataset_kind,
    describe,
)
from sbcli.bench.runner import BenchResult, run_bench
from sbcli.bench.table import PAPER_TABLE1, cell_summary, paper_numbers, table_markdown

__all__ = ["BENCH_METHODS", "PAPER_ORDER", "PAPER_RHO", "PAPER_TABLE1", "BenchMethod", "BenchPlan", "BenchResult", "Cell",
    "cell_options", "cell_summary", "dataset_kind", "describe", "paper_numbers", "run_bench", "table_markdown"]
