"""The sources a run can name and the kinds of source a learner's task record can hold, named once.

Torch-free and importing nothing of sbcli: the CLI checks a source's name before torch loads, the data
layer opens it, the learner's validation checks a stored record's kind, and the defaults tell a paper
benchmark from own data, all from these tuples.
"""

from __future__ import annotations

PAPER_BENCHMARKS = ("cifar10", "cifar100", "tiny-imagenet")  # the paper's benchmarks, by name
BENCHMARKS = ("demo", *PAPER_BENCHMARKS)  # every source `sb train` takes by name rather than by path
# what a task's source record says it was: a benchmark, a class-per-folder directory, or a step that took classes out
SOURCE_KINDS = (*BENCHMARKS, "folder", "forget")
