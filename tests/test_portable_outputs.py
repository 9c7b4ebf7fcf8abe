"""Every compared notebook output must print the same on every learner's machine.

nbval compares each cell's stored output with what the cell prints today. Some prints differ
from machine to machine whatever the seed and the thread count: the digits of a round-off error
(they depend on which BLAS or vector kernel the CPU gets), a timing, a thread count, a device, a
path. This guard scans every compared output of every solved notebook and fails, naming the
notebook and cell, on any of them.

A cell whose printed values are exact on every machine (a constant of a float format, a rate
computed from a formula) opts out in its metadata, out of the learner's sight, with the reason::

    "metadata": {"portable_output": "the smallest float16 and bfloat16 numbers are constants"}

A cell whose output nbval does not compare carries nbval's tag ``nbval-ignore-output`` (or
``nbval-skip``); no harness comment stands in the code a learner reads.

A number right after a bound ("< 1e-12", "below 1e-12", "<= 6.0e-08") is a bound, not a
measurement, and passes.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))

NOT_COMPARED = ("nbval-ignore-output", "nbval-skip")
HARNESS = re.compile(r"NBVAL_\w+|PORTABLE_OUTPUT")
# A number written with an exponent of -7 or smaller: 3.0e-08, 1e-13, 2E-9.
SMALL = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[eE]-0*(?:[7-9]|[1-9]\d+)(?![\d.])")
BOUND_BEFORE = re.compile(r"(?:<=?|≤|>=?|≥|\bbelow|\bunder|\babove|\bthan|\bwithin|\bat most|"
                          r"\bat least|\bbound)\s*\(?$", re.I)
TIMING = re.compile(r"\d(?:\.\d+)?\s*(?:ms|µs|us|ns|sec|secs|seconds|s/it|it/s)\b"
                    r"|\d\.\d+\s*s\b")
THREADS = re.compile(r"\d+\s+(?:torch\s+)?threads?\b|\bthreads?\s*[:=]\s*\d+"
                     r"|get_num_threads\(\)\s*[:=]?\s*\d", re.I)
DEVICE = re.compile(r"\bcuda(?::\d+)?\b|\bmps\b|\bdevice\s*[:=(]\s*'?cpu\b", re.I)
PATH = re.compile(r"/home/|/tmp/|/work/|/root/|/Users/|site-packages|[A-Z]:\\\\")


def _src(cell) -> str:
    return "".join(cell.get("source", ""))


def _reason(meta: dict) -> str | None:
    """The opt-out's reason, if the cell has one of at least ten characters."""
    reason = meta.get("portable_output")
    return reason if isinstance(reason, str) and len(reason.strip()) >= 10 else None


def _shown(out) -> str:
    data = out.get("data", {})
    return "".join(out.get("text", "")) + "".join(data.get("text/plain", "")) + \
        "".join(data.get("text/html", ""))


def machine_dependent(line: str) -> list[str]:
    """What in one printed line would differ on another machine, in words."""
    found = []
    for m in SMALL.finditer(line):
        if not BOUND_BEFORE.search(line[:m.start()].rstrip()):
            found.append(f"the round-off-sized number {m.group(0)} (print a bound or a comparison)")
    if TIMING.search(line):
        found.append(f"a timing ({TIMING.search(line).group(0)!r})")
    if THREADS.search(line):
        found.append(f"a thread count ({THREADS.search(line).group(0)!r})")
    if DEVICE.search(line):
        found.append(f"a device ({DEVICE.search(line).group(0)!r})")
    if PATH.search(line):
        found.append(f"a local path ({PATH.search(line).group(0)!r})")
    return found


def findings(nb: dict) -> list[str]:
    """'cell i: ...' for every machine-dependent print in a compared output of ``nb``."""
    problems = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {})
        if any(tag in meta.get("tags", []) for tag in NOT_COMPARED) or _reason(meta):
            continue
        for out in cell.get("outputs", []):
            for line in _shown(out).splitlines():
                problems += [f"cell {i}: {what} in {line.strip()[:90]!r}"
                             for what in machine_dependent(line)]
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_compared_outputs_are_portable(path):
    problems = findings(json.loads(path.read_text(encoding="utf-8")))
    assert not problems, (
        f"{path.name}: compared outputs that differ from machine to machine:\n  "
        + "\n  ".join(problems)
        + "\nPrint a bound or a comparison, tag the cell nbval-ignore-output (and say so in the "
        "prose), or, if the value is exact everywhere, give it the metadata "
        "\"portable_output\": \"<reason>\".")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_opt_outs_give_a_reason_and_no_harness_is_in_sight(path):
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if "portable_output" in cell.get("metadata", {}):
            assert _reason(cell["metadata"]), \
                f"{path.name} cell {i}: portable_output needs a reason"
        if cell.get("cell_type") == "code":
            assert not HARNESS.search(_src(cell)), (
                f"{path.name} cell {i}: a harness comment in the learner's code; use the cell "
                "tag nbval-ignore-output or the metadata portable_output instead")


def _notebook(source: str, printed: str, metadata: dict | None = None) -> dict:
    return {"cells": [{"cell_type": "code", "metadata": metadata or {}, "source": source,
                       "outputs": [{"output_type": "stream", "name": "stdout", "text": printed}]}]}


@pytest.mark.parametrize("printed, what", [
    ("1.0e-13\n", "round-off"),
    ("max |a - b| = 8.9e-14 (float64)\n", "round-off"),
    ("relative error 3.0E-08\n", "round-off"),
    ("one step took 12.5 ms\n", "timing"),
    ("trained in 3.2 s\n", "timing"),
    ("running on 4 threads\n", "thread count"),
    ("device: cuda\n", "device"),
    ("saved to /tmp/model.pt\n", "path"),
])
def test_guard_catches_a_planted_print(printed, what):
    problems = findings(_notebook('print(f"{1e-13:.1e}")', printed))
    assert len(problems) == 1 and problems[0].startswith("cell 0:"), problems
    assert what in problems[0], problems


@pytest.mark.parametrize("printed", [
    "max |error| below 1e-12: True\n",
    "rounding error <= 6.0e-08\n",
    "gap 3.1e-05, loss 2.31, lr 1e-3\n",
    "(N, H, L_q, d_k) = (2, 8, 5, 16)\n",
    "exact match 98.1%\n",
])
def test_guard_passes_portable_prints(printed):
    assert findings(_notebook("print(x)", printed)) == []


def test_guard_respects_the_opt_outs():
    for meta in ({"tags": ["nbval-ignore-output"]},
                 {"portable_output": "float16's smallest subnormal is a constant"}):
        assert findings(_notebook("print(x)", "6.0e-08 in 1.5 ms\n", meta)) == []
    assert findings(_notebook("print(x)", "6.0e-08\n", {"portable_output": ""})), \
        "a reason is required"
    assert findings(_notebook("# NBVAL_IGNORE_OUTPUT\nprint(t)", "1.5 ms\n")), \
        "a comment is no longer an opt-out"
