"""Check: a learner's phone error rate (notebook 13's lab) against ``tx.g2p.phone_error_rate``.

The learner writes ``fn(predictions, references) -> float``: ``predictions`` holds one list
of phones per word, ``references`` per word a list of its pronunciations (each a list of
phones). The check scores hand-made cases on which the usual wrong versions give different
numbers, and names the version the learner's numbers match.
"""
from __future__ import annotations

import math
import numbers

from tx_helpers.g2p import edit_distance, phone_error_rate

from .mistakes import MISTAKES
from .report import CheckResult, _call, _Report, _run_check

MISTAKES.update({
    "per_first_reference": (
        "the edit distance is taken to the first listed pronunciation, not the closest one, so "
        "a word said the other valid way (read as R IY D) counts as errors",
        "for each word take the smallest distance over all its pronunciations"),
    "per_closest_distance_first_length": (
        "the distance is to the closest pronunciation, but the length added to the "
        "denominator is the first one's",
        "add the length of the same pronunciation whose distance you counted"),
    "per_divides_by_prediction": (
        "the errors are divided by the number of predicted phones, so a prediction that "
        "runs on (or stops early) changes the denominator and the rate can even fall",
        "divide by the summed length of the reference pronunciations you compared with"),
    "per_mean_of_word_rates": (
        "each word's rate is computed and the rates are averaged, so a short word weighs as "
        "much as a long one",
        "sum the errors over all words and the reference lengths over all words, then divide "
        "once"),
    "per_tie_not_first": (
        "two pronunciations are equally close, and the length counted is not the first listed "
        "one's",
        "the contract: on a tie, the first listed of the closest pronunciations counts"),
    "per_closest_by_rate": (
        "the closest pronunciation was picked by the lowest rate (edits / its length), not by "
        "the fewest edits",
        "closest means the fewest edits; only then is its length counted, in the pooled total"),
    "per_shortest_length": (
        "the distance is to the closest pronunciation, but the length added to the "
        "denominator is the shortest pronunciation's",
        "add the length of the same pronunciation whose distance you counted"),
    "per_word_error_rate": (
        "this is the word error rate (share of words with any error), not the phone error rate",
        "count edits (insertions, deletions, substitutions), not wrong words"),
    "per_not_a_number": ("the function did not return a number",
                         "return one float: the total errors over the total reference phones"),
})

# (predictions, references): each case separates the right rate from the wrong versions
_CASES = [
    ("one word, one pronunciation, one substitution",
     [["N", "AY", "T"]], [[["N", "EY", "T"]]]),
    ("the prediction is the second pronunciation (read as R IY D)",
     [["R", "IY", "D"], ["K", "AE", "T"]], [[["R", "EH", "D"], ["R", "IY", "D"]],
                                            [["K", "AE", "T"]]]),
    ("a prediction that runs on without stopping, next to a short word",
     [["AH"] * 12, ["T", "UW"]], [[["AH", "B", "AW", "T"]], [["T", "UW"]]]),
    ("the closest pronunciation is longer than the first",
     [["R", "IH", "K", "AO", "R", "D"], ["AY"]],
     [[["R", "EH", "K", "ER", "D"], ["R", "IH", "K", "AO", "R", "D"]], [["AY"]]]),
    ("the closest pronunciation is the second, longer one, and still one phone off",
     [["R", "IH", "K", "AO", "R", "T"], ["AY"]],
     [[["R", "EH", "K", "ER", "D"], ["R", "IH", "K", "AO", "R", "D"]], [["AY"]]]),
    ("a short word with many errors and a long one with few",
     [["B", "IY"], ["S", "AY", "K", "AA", "L", "AH", "JH", "IY", "Z"]],
     [[["AE", "B"]], [["S", "AY", "K", "AA", "L", "AH", "JH", "IY"]]]),
    ("two pronunciations equally close, of different lengths (a tie: the first listed counts)",
     [["K", "AE", "T"], ["D", "AO", "G"]],
     [[["K", "AE", "T", "S"], ["K", "AE"]], [["D", "AO", "G"]]]),
    ("the fewest edits against a short pronunciation, a lower rate against a long one",
     [["R", "EH", "D", "Z"]], [[["R", "EH"], ["R", "EH", "D", "IY", "M", "EY", "D"]]]),
]


def _variants(predictions, references) -> dict[str, float]:
    pairs = list(zip(predictions, references, strict=True))
    first = sum(edit_distance(p, r[0]) for p, r in pairs)
    first_len = sum(len(r[0]) for r in references)
    closest = [min(r, key=lambda ref: edit_distance(p, ref)) for p, r in pairs]
    errors = [edit_distance(p, c) for p, c in zip(predictions, closest, strict=True)]
    by_rate = [(p, min(r, key=lambda ref: edit_distance(p, ref) / len(ref))) for p, r in pairs]
    return {
        "per_first_reference": first / first_len,
        "per_closest_distance_first_length": sum(errors) / first_len,
        "per_divides_by_prediction": sum(errors) / max(sum(map(len, predictions)), 1),
        "per_mean_of_word_rates": sum(e / len(c) for e, c in zip(errors, closest, strict=True))
        / len(closest),
        "per_word_error_rate": sum(p not in r for p, r in pairs) / len(references),
        "per_closest_by_rate": sum(edit_distance(p, c) for p, c in by_rate)
        / sum(len(c) for _, c in by_rate),
        "per_tie_not_first": sum(errors) / sum(  # among the closest, the last listed
            len(min(reversed(r), key=lambda ref: edit_distance(p, ref))) for p, r in pairs),
        "per_shortest_length": sum(errors) / sum(min(map(len, r)) for r in references),
    }


def _same(a: float, b: float) -> bool:
    """Equal up to float32 rounding: the cases' rates differ from each other by far more."""
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def check_phone_error_rate(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(predictions, references) -> float`` against ``tx.g2p.phone_error_rate``."""

    def body(report: _Report):
        named = []  # per wrong case, the wrong versions its number matches
        for what, predictions, references in _CASES:
            got = _call(report, f"fn(...) on: {what}", fn,
                        [list(p) for p in predictions], [[list(r) for r in refs]
                                                         for refs in references])
            want = phone_error_rate(predictions, references)
            if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(got):
                report.probe(False, f"{what}: returned {got!r}, expected the number {want:.4f}")
                report.mistake("per_not_a_number", f"got {type(got).__name__}")
                continue
            got = float(got)  # a numpy scalar is a number too (float32 rounding allowed)
            ok = _same(got, want)
            report.probe(ok, f"{what}: {got:.4f}" + ("" if ok else f", expected {want:.4f}"))
            if not ok:
                named.append([k for k, v in _variants(predictions, references).items()
                              if not _same(v, want) and _same(got, v)])
        common = [k for k in (named[0] if named else []) if all(k in n for n in named)]
        for key in common[:1] or [n[0] if n else "mismatch" for n in named]:
            report.mistake(key)  # one version that explains every wrong case, if there is one

    return _run_check("check_phone_error_rate", body, verbose, fn)
