"""The machine's speed now, for benchmarks that compare CPU times taken at different moments."""

from __future__ import annotations

import time


def calibration_seconds() -> float:
    """CPU seconds of a fixed pure-Python loop (3·10⁶ dict updates): the machine's speed now."""
    t = time.process_time()
    d: dict[int, int] = {}
    for i in range(3_000_000):
        d[i & 1023] = i
    return time.process_time() - t
