"""Progress of long data work (listing a folder, decoding its images) as log lines on stderr.

The data layer knows nothing of the terminal: it logs to ``sbcli.progress`` at INFO, which the CLI
shows on stderr (and silences under ``--quiet``). A line at most every :data:`INTERVAL_S` seconds
while the work runs, and a closing line with the rate when the work took longer than that.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

LOG = logging.getLogger("sbcli.progress")
INTERVAL_S = 2.0  # seconds between lines; work shorter than this says nothing


@dataclass
class Counter:
    """Counts done items of one piece of work and logs how far it is."""

    doing: str  # "Listing images in data/train"
    unit: str  # "files"
    total: int | None = None
    count: int = 0
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)

    def add(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if now - self.last >= INTERVAL_S:
            self.last = now
            LOG.info("%s: %s (%s %s/s)", self.doing, self._so_far(), f"{self.rate():,.0f}", self.unit)

    def rate(self) -> float:
        return self.count / max(time.monotonic() - self.started, 1e-9)

    def done(self) -> None:
        seconds = time.monotonic() - self.started
        if seconds >= INTERVAL_S:
            LOG.info("%s: %s %s in %.1f s (%s %s/s).", self.doing, f"{self.count:,}", self.unit, seconds,
                     f"{self.rate():,.0f}", self.unit)

    def _so_far(self) -> str:
        if self.total:
            left = (self.total - self.count) / max(self.rate(), 1e-9)
            return f"{self.count:,} of {self.total:,} {self.unit}, about {left:.0f} s left"
        return f"{self.count:,} {self.unit} so far"
