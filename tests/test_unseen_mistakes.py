"""Recall on a catalogue of mistakes written without reading the checks (issue 23, item 3).

``tests/unseen_mistakes.py`` was written by a helper who had not read ``labkit``:
``UNSEEN`` mistakes (each with ``words`` a correct diagnosis would use) and ``CORRECT`` blocks
in other layouts. A mistake counts as *named* when the check fails, its mistakes are not only
the generic ``mismatch`` (nor ``checker_failed``), and the report contains one of the entry's
words. Every CORRECT entry must pass.

Run as a script for the numbers (and the misses)::

    .venv/bin/python tests/test_unseen_mistakes.py
"""
from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
catalogue = pytest.importorskip("unseen_mistakes") if __name__ != "__main__" else __import__(
    "unseen_mistakes")

import labkit as g  # noqa: E402

GENERIC = {"mismatch", "checker_failed"}
# measured with this file's naming rule (see the module docstring and the final report)
RECALL_FLOOR = 54  # 11/57 before issue 23 (main at 1512da1), 37/57 after, 54/57 with the
# localising probes of label smoothing, greedy decoding and the train step (issue 29)


def _check(block: str):
    return {
        "positional_encoding": g.check_positional_encoding,
        "attention": g.check_attention,
        "multi_head_attention": g.check_multi_head_attention,
        "masks": lambda kw, verbose: g.check_masks(**kw, verbose=verbose),
        "feed_forward": g.check_feed_forward,
        "encoder_layer": g.check_encoder_layer,
        "decoder_layer": g.check_decoder_layer,
        "transformer": g.check_transformer,
        "label_smoothing": g.check_label_smoothing,
        "greedy_decode": g.check_greedy_decode,
        "train_step": g.check_train_step,
    }[block]


def run(entry: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            impl = entry["make"]()
        except Exception as exc:  # noqa: BLE001 - a broken entry is reported, not raised
            return None, f"make() raised {type(exc).__name__}: {exc}"
        check = _check(entry["block"])
        kwargs = entry.get("check_kwargs") or {}
        if kwargs:
            check = functools.partial(check, **kwargs)
        return check(impl, verbose=False), ""


def is_named(entry: dict, result) -> bool:
    if result is None or result.passed:
        return False
    if not set(result.mistakes) - GENERIC:
        return False
    report = result.report.lower()
    return any(w.lower() in report for w in entry["words"])


def measure():
    named, missed = [], []
    for entry in catalogue.UNSEEN:
        result, err = run(entry)
        (named if is_named(entry, result) else missed).append(
            (entry["id"], result.mistakes if result is not None else err))
    failed_correct = []
    for entry in catalogue.CORRECT:
        result, err = run(entry)
        if result is None or not result.passed:
            failed_correct.append((entry["id"], result.report if result is not None else err))
    return named, missed, failed_correct


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("entry", catalogue.CORRECT, ids=[e["id"] for e in catalogue.CORRECT])
def test_correct_block_passes(entry):
    result, err = run(entry)
    assert result is not None, err
    assert result.passed, result.report


@pytest.mark.filterwarnings("ignore")
def test_unseen_recall_does_not_drop():
    named, missed, _ = measure()
    assert len(named) >= RECALL_FLOOR, (
        f"{len(named)}/{len(catalogue.UNSEEN)} named, floor {RECALL_FLOOR}; missed: {missed}")


if __name__ == "__main__":
    named, missed, failed = measure()
    total = len(catalogue.UNSEEN)
    print(f"unseen mistakes named: {len(named)}/{total} ({len(named) / total:.0%})")
    print(f"correct blocks passing: {len(catalogue.CORRECT) - len(failed)}/"
          f"{len(catalogue.CORRECT)}")
    for mid, got in missed:
        print(f"  missed {mid}: {got}")
    for mid, report in failed:
        print(f"  correct block failed {mid}:\n{report}")
