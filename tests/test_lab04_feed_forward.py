"""Notebook 04's FFN exercise, graded by labkit.check_feed_forward(cls, hidden_dropout=True).

The notebook's contract puts dropout once on the hidden layer, as tx does. Correct FFNs written
independently of tx (a clamp for the ReLU, dropout before the ReLU, F.dropout with the module's
own mode) pass; no dropout, dropout twice or on the output fail and are named. Without the flag
an FFN with no dropout passes (the paper puts none inside the FFN).
"""
import json
from pathlib import Path

import pytest
import torch.nn.functional as F
from torch import nn

import labkit

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "04_feed_forward_and_sublayers.ipynb"


class _Base(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)


def _ffn(forward):
    return type("FeedForward", (_Base,), {"forward": forward})


CORRECT = {
    "relu_module_order": lambda s, x: s.linear2(s.dropout(F.relu(s.linear1(x)))),
    "clamp": lambda s, x: s.linear2(s.dropout(s.linear1(x).clamp(min=0))),
    "dropout_before_relu": lambda s, x: s.linear2(F.relu(s.dropout(s.linear1(x)))),
    "functional_dropout": lambda s, x: s.linear2(F.dropout(F.relu(s.linear1(x)), s.dropout.p,
                                                           s.training)),
}
WRONG = {
    "ffn_dropout_missing": lambda s, x: s.linear2(F.relu(s.linear1(x))),
    "ffn_dropout_repeated": lambda s, x: s.linear2(s.dropout(s.dropout(F.relu(s.linear1(x))))),
    "ffn_dropout_position": lambda s, x: s.dropout(s.linear2(F.relu(s.linear1(x)))),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_ffns_pass(name):
    result = labkit.check_feed_forward(_ffn(CORRECT[name]), hidden_dropout=True, verbose=False)
    assert result.passed, result.report
    assert any("dropout acts once on the hidden layer" in m for m in result.messages)


@pytest.mark.parametrize("key", sorted(WRONG))
def test_dropout_mistakes_are_named(key):
    result = labkit.check_feed_forward(_ffn(WRONG[key]), hidden_dropout=True, verbose=False)
    assert not result.passed and key in result.mistakes, result.report


def test_without_the_flag_an_ffn_without_dropout_passes():
    assert labkit.check_feed_forward(_ffn(WRONG["ffn_dropout_missing"]), verbose=False).passed


def test_the_notebook_grades_the_dropout_placement():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    calls = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"
             and "labkit.check_feed_forward(" in "".join(c["source"])]
    assert calls and all("hidden_dropout=True" in c for c in calls), calls
