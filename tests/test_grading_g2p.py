"""labkit.check_phone_error_rate: passes the reference, names each likely mistake."""
import pytest

import labkit
from tx_helpers import g2p


def _closest(p, refs):
    return min(refs, key=lambda r: g2p.edit_distance(p, r))


def first_reference(predictions, references):
    return (sum(g2p.edit_distance(p, r[0]) for p, r in zip(predictions, references, strict=True))
            / sum(len(r[0]) for r in references))


def by_prediction_length(predictions, references):
    errors = sum(g2p.edit_distance(p, _closest(p, r))
                 for p, r in zip(predictions, references, strict=True))
    return errors / sum(len(p) for p in predictions)


def mean_of_word_rates(predictions, references):
    rates = [g2p.edit_distance(p, _closest(p, r)) / len(_closest(p, r))
             for p, r in zip(predictions, references, strict=True)]
    return sum(rates) / len(rates)


def word_error_rate(predictions, references):
    return g2p.word_error_rate(predictions, references)


def loop_strict(predictions, references):
    # a second correct form: a running best, replaced only by a strictly closer pronunciation
    errors = length = 0
    for p, refs in zip(predictions, references, strict=True):
        best = None
        for r in refs:
            d = g2p.edit_distance(p, r)
            if best is None or d < best[0]:
                best = (d, len(r))
        errors, length = errors + best[0], length + best[1]
    return errors / length


def loop_ties_last(predictions, references):
    # the same loop with <=: on a tie the last listed pronunciation's length counts
    errors = length = 0
    for p, refs in zip(predictions, references, strict=True):
        best = None
        for r in refs:
            d = g2p.edit_distance(p, r)
            if best is None or d <= best[0]:
                best = (d, len(r))
        errors, length = errors + best[0], length + best[1]
    return errors / length


def closest_by_rate(predictions, references):
    # a cold reader's PER: it passed 7/7, picking the closest pronunciation by the lowest
    # per-word rate (edits / length) instead of the fewest edits
    errors = length = 0
    for p, refs in zip(predictions, references, strict=True):
        best = min(refs, key=lambda r: g2p.edit_distance(p, r) / len(r))
        errors, length = errors + g2p.edit_distance(p, best), length + len(best)
    return errors / length


def closest_distance_first_length(predictions, references):
    # the errors of the closest pronunciation over the length of the first listed one
    pairs = list(zip(predictions, references, strict=True))
    return (sum(min(g2p.edit_distance(p, ref) for ref in r) for p, r in pairs)
            / sum(len(r[0]) for r in references))


def closest_distance_shortest_length(predictions, references):
    # a cold reader's: the fewest edits over the length of the shortest pronunciation
    pairs = list(zip(predictions, references, strict=True))
    return (sum(min(g2p.edit_distance(p, ref) for ref in r) for p, r in pairs)
            / sum(min(len(ref) for ref in r) for r in references))


def float32_result(predictions, references):
    # correct, but a numpy float32 (a cold reader's: it failed all 8 probes as "not a number")
    import numpy as np

    errors = length = 0
    for p, refs in zip(predictions, references, strict=True):
        closest = _closest(p, refs)
        errors, length = errors + g2p.edit_distance(p, closest), length + len(closest)
    return np.float32(errors) / np.float32(length)


def stub(predictions, references):
    raise NotImplementedError("return the phone error rate")


def test_the_reference_passes():
    result = labkit.check_phone_error_rate(g2p.phone_error_rate, verbose=False)
    assert result.passed and result.mistakes == []
    for fn in (loop_strict, float32_result):
        result = labkit.check_phone_error_rate(fn, verbose=False)
        assert result.passed and result.mistakes == [], result.report


@pytest.mark.parametrize("fn, key", [
    (first_reference, "per_first_reference"),
    (by_prediction_length, "per_divides_by_prediction"),
    (mean_of_word_rates, "per_mean_of_word_rates"),
    (word_error_rate, "per_word_error_rate"),
    (loop_ties_last, "per_tie_not_first"),
    (closest_distance_first_length, "per_closest_distance_first_length"),
    (closest_by_rate, "per_closest_by_rate"),
    (closest_distance_shortest_length, "per_shortest_length"),
    (stub, "not_implemented"),
    (lambda p, r: "0.1", "per_not_a_number"),
])
def test_each_likely_mistake_is_named(fn, key):
    result = labkit.check_phone_error_rate(fn, verbose=False)
    assert not result.passed
    assert result.mistakes[0] == key, result.report


def test_the_report_says_what_was_expected(capsys):
    labkit.check_phone_error_rate(first_reference)
    out = capsys.readouterr().out
    assert "check_phone_error_rate: FAILED" in out and "closest" in out


def test_the_fewest_edits_pick_the_pronunciation_not_the_lowest_rate():
    pred, refs = [["R", "EH", "D", "Z"]], [[["R", "EH"], ["R", "EH", "D", "IY", "M", "EY", "D"]]]
    assert g2p.phone_error_rate(pred, refs) == 1.0  # 2 edits against R EH
    assert abs(closest_by_rate(pred, refs) - 4 / 7) < 1e-12
