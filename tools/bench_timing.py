"""Timing for tools/bench.py: interleaved rounds, paired ratios, peak memory, the machine."""
from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

# The clock of the timed blocks: wall time (default) or this process's CPU time
# (--clock cpu: with --threads 1 it is far less disturbed by other processes on a shared
# machine, but it hides waiting, so the final numbers should be wall time).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_current = {"clock": "wall"}


def use_clock(name: str) -> None:
    """Time every later block with ``CLOCKS[name]``."""
    if name not in CLOCKS:
        raise ValueError(f"clock: got {name!r}, expected one of {sorted(CLOCKS)}")
    _current["clock"] = name


def clock() -> float:
    return CLOCKS[_current["clock"]]()


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def interleaved(cases: dict, *, rounds: int, warmup: int = 1, block_s: float = 0.0) -> dict:
    """Time callables in interleaved rounds: ``{name: [seconds per call, one per round]}``.

    Each callable first runs ``warmup`` times; with ``block_s`` > 0 the last warm-up
    call (there is at least one) sets the number of calls per timed block, so that a
    block lasts about ``block_s`` seconds (at least one call).
    The order rotates from round to round so that no case always runs first.
    """
    reps = {}
    for name, fn in cases.items():
        elapsed = 0.0
        for _ in range(max(1, warmup) if block_s > 0 else warmup):
            start = clock()
            fn()
            elapsed = clock() - start
        reps[name] = max(1, math.ceil(block_s / max(elapsed, 1e-9)))
    names = list(cases)
    times = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn, n = cases[name], reps[name]
            start = clock()
            for _ in range(n):
                fn()
            times[name].append((clock() - start) / n)
    return times


def paired_ratio(times: dict, a: str, b: str) -> float:
    """Median over rounds of time[a] / time[b] measured in the same round."""
    return median([x / y for x, y in zip(times[a], times[b], strict=True)])


@contextlib.contextmanager
def quiet_stderr():
    """Silence C++-level stderr (the profiler prints start/stop lines and warnings)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def peak_cpu_bytes(fn) -> int | None:
    """Peak extra CPU memory during one ``fn()``, from torch.profiler's allocator events.

    Running sum of every allocation (+) and free (-) the profiler records, in time
    order; the peak is relative to the memory in use when ``fn`` starts. None when this
    torch build does not expose the events.
    """
    with quiet_stderr(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True) as prof:
            fn()
        try:
            events = [e for e in prof.profiler.kineto_results.events()
                      if e.name() == "[memory]"]
        except AttributeError:
            return None
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return peak


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "clock": "process CPU time" if _current["clock"] == "cpu" else "wall time",
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_average_start": loadavg(),
    }


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
