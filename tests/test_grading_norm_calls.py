"""check_encoder_layer / check_decoder_layer: each LayerNorm runs once per forward (defect 10).

The article's Pre-LN snippet calls ``self.norm1(x)`` three times: the output is the same as one
call, so only a count of the calls (forward hooks on the learner's norms) can tell.
"""
import torch
from torch import nn

import labkit
import tx_helpers as tx


class _PreLN(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout):
        super().__init__()
        self.self_attn = tx.MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = tx.FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)


class ArticlePreLN(_PreLN):
    def forward(self, x, mask=None):
        x = x + self.dropout1(self.self_attn(self.norm1(x), self.norm1(x), self.norm1(x), mask))
        return x + self.dropout2(self.feed_forward(self.norm2(x)))


class OncePreLN(_PreLN):
    def forward(self, x, mask=None):
        normed = self.norm1(x)  # (N, L, d_model), once
        x = x + self.dropout1(self.self_attn(normed, normed, normed, mask))
        return x + self.dropout2(self.feed_forward(self.norm2(x)))


def test_three_calls_of_norm1_are_named():
    result = labkit.check_encoder_layer(ArticlePreLN, norm_first=True, verbose=False)
    assert not result.passed and result.mistakes == ["norm_called_repeatedly"]
    assert any("norm1 ran 3 times" in m for m in result.messages), result.messages


def test_one_call_passes_in_both_layouts_and_for_the_decoder():
    assert labkit.check_encoder_layer(OncePreLN, norm_first=True, verbose=False).passed
    assert labkit.check_encoder_layer(tx.EncoderLayer, verbose=False).passed
    assert labkit.check_decoder_layer(tx.DecoderLayer, verbose=False).passed
    pre = labkit.check_decoder_layer(lambda *a: tx.DecoderLayer(*a, norm_first=True),
                                     norm_first=True, verbose=False)
    assert pre.passed, pre.messages


def test_the_count_leaves_the_learners_module_unhooked():
    layer = OncePreLN(32, 4, 64, 0.1)
    labkit.check_encoder_layer(lambda *a: layer, norm_first=True, verbose=False)
    assert not layer.norm1._forward_hooks and not layer.norm2._forward_hooks
    assert torch.is_grad_enabled()
