"""check_feed_forward(activation=True): notebook 04's FFN takes its nonlinearity as an argument.

A cold reader found the exercise a transcription of the printed formula; the block now has an
``activation=`` argument (ReLU by default), and the check builds it with GELU as well.
"""
import torch.nn.functional as F
from torch import nn

import labkit as g


class FFN(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1, activation=F.relu):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout, self.activation = nn.Dropout(dropout), activation

    def forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class FFNHardReLU(FFN):
    """Transcribes the formula: ReLU hard-coded, the argument ignored."""

    def forward(self, x):
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


class FFNNoArgument(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


def test_ffn_using_its_activation_passes():
    assert g.check_feed_forward(FFN, hidden_dropout=True, activation=True, verbose=False).passed


def test_hard_coded_relu_fails_named():
    result = g.check_feed_forward(FFNHardReLU, hidden_dropout=True, activation=True,
                                  verbose=False)
    assert not result.passed and result.mistakes == ["ffn_activation_ignored"], result.report
    assert "ReLU's" in result.report


def test_missing_argument_fails_named_and_passes_by_default():
    result = g.check_feed_forward(FFNNoArgument, hidden_dropout=True, activation=True,
                                  verbose=False)
    assert not result.passed and result.mistakes == ["ffn_activation_ignored"], result.report
    assert g.check_feed_forward(FFNNoArgument, hidden_dropout=True, verbose=False).passed
