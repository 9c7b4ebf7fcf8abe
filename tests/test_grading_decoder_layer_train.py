"""check_decoder_layer: a train-mode output that matches no dropout placement is a failed probe.

A cold reader built ``nn.TransformerDecoderLayer`` inside ``forward`` from the layer's own weights
(dropout 0.0 for attention, the learner's norms and dropouts reused): eval mode matched, the
train-mode probe only printed a note and the check passed. Two mistakes at once (no dropout on
the first sublayer, dropout after the add on the last) fooled it the same way.
"""
import sys
from pathlib import Path

import torch
from torch import nn

import labkit as g

sys.path.insert(0, str(Path(__file__).parent))
from test_grading import LearnerDecoderLayer  # noqa: E402


class DecTorchLayerInForward(nn.Module):
    """The reader's fooling code: PyTorch's decoder layer rebuilt from the learner's weights."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        self.n_heads, self.norm_first = n_heads, norm_first
        self.self_attn = g_mha(d_model, n_heads, dropout)
        self.cross_attn = g_mha(d_model, n_heads, dropout)
        import tx_helpers as tx
        self.feed_forward = tx.FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        d = x.size(-1)
        layer = nn.TransformerDecoderLayer(d, self.n_heads, self.feed_forward.linear1.out_features,
                                           0.0, batch_first=True, norm_first=self.norm_first)
        with torch.no_grad():
            for theirs, mine in ((layer.self_attn, self.self_attn),
                                 (layer.multihead_attn, self.cross_attn)):
                theirs.in_proj_weight.copy_(torch.cat([mine.w_q.weight, mine.w_k.weight,
                                                       mine.w_v.weight]))
                theirs.in_proj_bias.copy_(torch.cat([mine.w_q.bias, mine.w_k.bias, mine.w_v.bias]))
                theirs.out_proj.load_state_dict(mine.w_o.state_dict())
        layer.linear1, layer.linear2 = self.feed_forward.linear1, self.feed_forward.linear2
        layer.dropout = self.feed_forward.dropout
        layer.norm1, layer.norm2, layer.norm3 = self.norm1, self.norm2, self.norm3
        layer.dropout1, layer.dropout2, layer.dropout3 = self.dropout1, self.dropout2, self.dropout3
        layer.train(self.training)
        t_m = None if tgt_mask is None else tgt_mask.repeat_interleave(self.n_heads, 0)
        m_m = None if memory_mask is None else memory_mask[:, 0]
        return layer(x, memory, tgt_mask=t_m, memory_key_padding_mask=m_m)


def g_mha(d_model, n_heads, dropout):
    import tx_helpers as tx
    return tx.MultiHeadAttention(d_model, n_heads, dropout)


class DecTwoDropoutSlips(LearnerDecoderLayer):
    """No dropout on the self-attention output, dropout after the add on the FFN."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, tgt_mask))
        x = self.norm2(x + self.drop(self.cross(x, memory, memory_mask)))
        return self.norm3(self.drop(x + self.feed_forward(x)))


def _fails_on_dropout(result):
    assert not result.passed, result.report
    assert {"dropout_placement_unknown", "delegated"} & set(result.mistakes), result.mistakes


def test_torch_decoder_layer_built_in_forward_fails():
    _fails_on_dropout(g.check_decoder_layer(DecTorchLayerInForward, verbose=False))


def test_torch_decoder_layer_built_in_forward_fails_pre_ln():
    cls = lambda *a: DecTorchLayerInForward(*a, norm_first=True)  # noqa: E731
    _fails_on_dropout(g.check_decoder_layer(cls, norm_first=True, verbose=False))


def test_two_dropout_slips_fail_named():
    result = g.check_decoder_layer(DecTwoDropoutSlips, verbose=False)
    assert not result.passed, result.report
    assert "dropout_placement_unknown" in result.mistakes


def test_correct_decoder_layers_still_pass():
    import tx_helpers as tx
    assert g.check_decoder_layer(LearnerDecoderLayer, verbose=False).passed
    assert g.check_decoder_layer(tx.DecoderLayer, verbose=False).passed
    pre = g.check_decoder_layer(lambda *a: tx.DecoderLayer(*a, norm_first=True), norm_first=True,
                                verbose=False)
    assert pre.passed, pre.report
