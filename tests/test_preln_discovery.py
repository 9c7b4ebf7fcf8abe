"""find_checks checks a layer named as Pre-LN (04's extension, PreLNEncoderLayer) in the Pre-LN
layout, and every other *EncoderLayer in the paper's Post-LN one."""
from __future__ import annotations

import torch
from torch import nn

import labkit
import tx_helpers as tx


class _Layer(nn.Module):
    """An encoder layer written here from the formulas, not from the reference."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = tx.MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = tx.FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)


class _PostLN(_Layer):
    def forward(self, x, mask=None):
        a = self.self_attn(x, x, x, mask)                       # (N, L, d_model)
        x = self.norm1(x + self.dropout1(a))
        return self.norm2(x + self.dropout2(self.feed_forward(x)))


class _PreLN(_Layer):
    def forward(self, x, mask=None):
        n = self.norm1(x)                                       # (N, L, d_model)
        x = x + self.dropout1(self.self_attn(n, n, n, mask))
        return x + self.dropout2(self.feed_forward(self.norm2(x)))


class _PreLNNormsTheSum(_Layer):  # Pre-LN that normalises the sum, as Post-LN does
    def forward(self, x, mask=None):
        n = self.norm1(x)
        x = self.norm1(x + self.dropout1(self.self_attn(n, n, n, mask)))
        return self.norm2(x + self.dropout2(self.feed_forward(self.norm2(x))))


def _run(name, cls):
    """The result of every check find_checks pairs with ``cls`` bound to ``name``."""
    torch.manual_seed(0)
    found = labkit.find_checks({name: cls}, module=None)
    assert [label for label, _ in found] == [f"check_encoder_layer({name})"]
    return found[0][1](verbose=False)


def test_a_pre_ln_name_is_checked_in_the_pre_ln_layout():
    for name in ("PreLNEncoderLayer", "PreNormEncoderLayer", "NormFirstEncoderLayer",
                 "pre_ln_encoder_layer"):
        assert _run(name, _PreLN).passed, name
        assert not _run(name, _PostLN).passed, name


def test_any_other_encoder_layer_is_checked_in_the_post_ln_layout():
    assert _run("EncoderLayer", _PostLN).passed
    assert not _run("EncoderLayer", _PreLN).passed


def test_a_pre_ln_layer_that_normalises_the_sum_fails():
    result = _run("PreLNEncoderLayer", _PreLNNormsTheSum)
    assert not result.passed and result.mistakes, result.report
