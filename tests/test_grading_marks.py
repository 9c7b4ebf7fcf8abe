"""Marks per exercise (issue 23, item 5): partial credit, delegation, predictions, feedback."""
import csv
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import labkit as g
import tx_helpers as tx

ROOT = Path(__file__).resolve().parent.parent


def padding_delegates(seq, pad_idx):
    return tx.padding_mask(seq, pad_idx)


def lookahead_diag0(size):
    return torch.triu(torch.ones(size, size, dtype=torch.bool), diagonal=0)


def lookahead_stub(size):
    raise NotImplementedError("write it")


class FFNSubclass(tx.FeedForward):
    pass


class LayerUsingTxAttention(nn.Module):  # tx.MultiHeadAttention as a part: fine
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = tx.MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = tx.FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.drop(self.feed_forward(x)))


def test_delegation_is_flagged_and_not_credited():
    mark = g.mark_exercise("padding_mask", padding_delegates, points=2, verbose=False)
    assert mark.result.passed and mark.score == 0 and not mark.passed
    assert "tx.padding_mask" in mark.delegated
    assert any("Not credited" in line for line in mark.lines)
    mark = g.mark_exercise("FeedForward", FFNSubclass, verbose=False)
    assert mark.score == 0 and "subclasses" in mark.delegated


def test_using_another_tx_block_as_a_part_is_credited():
    mark = g.mark_exercise("EncoderLayer", LayerUsingTxAttention, verbose=False)
    assert mark.delegated is None and mark.score == 1.0, mark.lines


def own_lookahead(size, device=None):
    rows = torch.arange(size, device=device)
    return rows[None, :] > rows[:, None]  # (L, L): key j after query i


def attention_unscaled(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)  # (N, H, L_q, L_k), never divided by sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(-1)
    return weights @ v, weights


def test_a_failed_check_earns_half_its_points_times_the_share_of_probes_passed():
    full = g.mark_exercise("lookahead_mask", own_lookahead, points=3, verbose=False)
    assert full.score == 3 and full.passed
    wrong = g.mark_exercise("lookahead_mask", lookahead_diag0, points=3, verbose=False)
    assert not wrong.passed and wrong.score == 0 and wrong.probes[0] == 0
    unscaled = g.mark_exercise("attention", attention_unscaled, points=3, verbose=False)
    ok, total = unscaled.probes
    assert 0 < ok < total and not unscaled.passed, unscaled.lines
    assert unscaled.score == round(3 * 0.5 * ok / total, 2) < 1.5  # a failure decides
    stub = g.mark_exercise("lookahead_mask", lookahead_stub, points=3, verbose=False)
    assert stub.score == 0 and "not implemented" in "\n".join(stub.lines)


def test_mark_prints_the_full_report(capsys):
    g.mark_exercise("lookahead_mask", lookahead_diag0)
    out = capsys.readouterr().out
    assert out.startswith("Exercise lookahead_mask: 0/1 point(s)")
    assert "✗ lookahead_fn(5)" in out and "Diagnosis: the look-ahead mask uses diagonal=0" in out


def test_predictions_are_points():
    results = [g.check_prediction("shape", (2, 3), (2, 3), verbose=False),
               g.check_prediction("count", 5, 4, verbose=False),
               g.check_prediction("count", 4, 4, verbose=False)]  # the last one counts
    marks = g.mark_predictions(results, points_each=0.5)
    assert [(m.exercise, m.score) for m in marks] == [("prediction: shape", 0.5),
                                                      ("prediction: count", 0.5)]


def test_bad_points_argument():
    with pytest.raises(ValueError, match="points must be a number >= 0, got -1"):
        g.mark_exercise("lookahead_mask", own_lookahead, points=-1)


def test_grade_script_marks_each_mask_and_writes_one_feedback_file(tmp_path):
    from labkit.course import grade

    code = ("import torch\nimport labkit\nimport tx_helpers as tx\n\n"
            "def padding_mask(seq, pad_idx):\n    return tx.padding_mask(seq, pad_idx)\n\n"
            "def lookahead_mask(size):\n"
            "    return torch.triu(torch.ones(size, size, dtype=torch.bool), diagonal=0)\n\n"
            "def decoder_self_mask(tgt, pad_idx):\n    raise NotImplementedError('todo')\n\n"
            "def cross_mask(src, tgt, pad_idx, device=None):\n"
            "    raise NotImplementedError('todo')\n")
    cell = nbformat.v4.new_code_cell(code)
    cell.metadata["tx_exercise"] = [
        {"number": i + 1, "name": n, "section": "Masks"} for i, n in enumerate(
            ("padding_mask", "lookahead_mask", "decoder_self_mask", "cross_mask"))]
    pred = nbformat.v4.new_code_cell("_ = labkit.check_prediction('mask shape', (4, 4), "
                                     "tuple(lookahead_mask(4).shape))")
    nb = nbformat.v4.new_notebook(cells=[cell, pred])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "bob_05.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "grades.csv"
    assert grade.main([str(path), "--out", str(out), "--timeout", "60"]) == 0
    rows = {r["exercise"]: r for r in csv.DictReader(out.open()) if r["check"] != "cells"}
    assert rows["1. padding_mask"]["points"] == "0.0"
    assert "tx.padding_mask" in rows["1. padding_mask"]["delegated"]
    assert rows["2. lookahead_mask"]["points"] == "0.0"
    assert "lookahead_diagonal_0" in rows["2. lookahead_mask"]["mistakes"]
    assert rows["3. decoder_self_mask"]["points"] == "0.0"
    # an untouched stub lists only not_implemented, no secondary mistake names
    assert rows["3. decoder_self_mask"]["mistakes"] == "not_implemented"
    assert rows["4. cross_mask"]["mistakes"] == "not_implemented"
    assert rows["prediction: mask shape"]["points"] == "0.5"
    # passed True, points 0: the same row says why
    assert rows["1. padding_mask"]["passed"] == "True"
    assert rows["1. padding_mask"]["diagnosis"].startswith("check passed but not credited: ")
    summary = (tmp_path / "grades_summary.txt").read_text()
    # code checks and predictions are counted apart; the delegated padding_mask is not "passed"
    assert summary.startswith("bob_05.ipynb: 0/4 code checks passed, 1/1 predictions right ")
    assert "  marks: 0.5/4.5 points" in summary
    feedback = (tmp_path / "grades_feedback" / "bob_05.txt").read_text()
    assert feedback.startswith("Feedback for bob_05.ipynb: 0.5/4.5 points")
    assert "Not credited" in feedback and "✗ lookahead_fn(5)" in feedback
    assert "not implemented" in feedback


# one mistake charged once (teacher's report on the 05 lab): a learner whose only error is
# diagonal=0 in lookahead_mask, with a correct decoder_self_mask that calls it
def lookahead_mask(size, device=None):
    return torch.triu(torch.ones(size, size, dtype=torch.bool, device=device), diagonal=0)


def decoder_self_mask(tgt, pad_idx):
    return tx.padding_mask(tgt, pad_idx) | lookahead_mask(tgt.size(1), device=tgt.device)


def test_a_wrong_helper_costs_once_not_again_in_the_exercise_that_calls_it():
    own = g.mark_exercise("lookahead_mask", lookahead_mask, verbose=False)
    assert own.score == 0 and "lookahead_diagonal_0" in own.result.mistakes
    # the device probe passes on this wrong mask too: it earns no half point
    assert own.probes == (0, 2), own.lines
    user = g.mark_exercise("decoder_self_mask", decoder_self_mask, verbose=False)
    assert user.score == 1.0 and user.passed, user.lines
    assert user.delegated is None  # tx.padding_mask is a part here, not the answer
    assert "Checked with tx.lookahead_mask in place of your own" in user.lines[1]
    # the learner's function itself is untouched
    assert bool(decoder_self_mask(torch.tensor([[2, 3]]), 1)[0, 0, 0])


def test_own_mask_reference_is_still_delegation():
    def decoder_delegates(tgt, pad_idx):
        return tx.decoder_self_mask(tgt, pad_idx)

    mark = g.mark_exercise("decoder_self_mask", decoder_delegates, verbose=False)
    assert mark.score == 0 and "tx.decoder_self_mask" in mark.delegated


def smoothing_by_builtin(logits, target, eps, pad_idx):
    return torch.nn.functional.cross_entropy(logits, target, label_smoothing=eps,
                                             ignore_index=pad_idx)


class SmoothingByModule(nn.Module):
    def __init__(self, eps, pad_idx):
        super().__init__()
        self.loss = nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=pad_idx)

    def forward(self, logits, target):
        return self.loss(logits, target)


def smoothing_written(logits, target, eps, pad_idx):
    logp = torch.log_softmax(logits, dim=-1)
    keep = target != pad_idx
    nll = torch.nn.functional.nll_loss(logp, target, ignore_index=pad_idx, reduction="none")
    return ((1 - eps) * nll - eps * logp.mean(-1))[keep].mean()


def test_builtin_label_smoothing_is_delegation():
    mark = g.mark_exercise("label_smoothing_loss", smoothing_by_builtin, verbose=False)
    # the check itself refuses it (ls_builtin_smoothing); the delegation scan names the call
    assert "ls_builtin_smoothing" in mark.result.mistakes
    assert mark.score == 0 and not mark.passed
    assert "label_smoothing=" in mark.delegated and "cross_entropy" in mark.delegated
    assert g.find_delegation(SmoothingByModule, "check_label_smoothing")
    written = g.mark_exercise("label_smoothing_loss", smoothing_written, verbose=False)
    assert written.delegated is None and written.score == 1.0, written.lines
