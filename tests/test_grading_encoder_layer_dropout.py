"""check_encoder_layer: a train-mode output that matches no dropout placement fails the probe.

A cold reader built ``nn.TransformerEncoderLayer`` inside ``forward``, copied the weights in and
got full marks: eval mode matched, and the unrecognised train-mode output was only a note.
"""
import sys
from pathlib import Path

import torch
from torch import nn

import labkit as g
import tx_helpers as tx

sys.path.insert(0, str(Path(__file__).parent))
from test_grading import EncPreLN, LearnerEncoderLayer  # noqa: E402


class EncThroughTorch(LearnerEncoderLayer):
    """Hands the work to a freshly built nn.TransformerEncoderLayer with the learner's weights."""

    def forward(self, x, mask=None):
        d_model, n_heads = self.norm1.normalized_shape[0], self.self_attn.n_heads
        d_ff, p = self.feed_forward.linear1.out_features, self.drop.p
        t = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, p, batch_first=True)
        a = self.self_attn
        w_qkv = torch.cat([a.w_q.weight, a.w_k.weight, a.w_v.weight])  # (3 d_model, d_model)
        t.self_attn.in_proj_weight = nn.Parameter(w_qkv)
        t.self_attn.in_proj_bias = nn.Parameter(torch.cat([a.w_q.bias, a.w_k.bias, a.w_v.bias]))
        t.self_attn.out_proj = a.w_o
        t.linear1, t.linear2 = self.feed_forward.linear1, self.feed_forward.linear2
        t.norm1, t.norm2 = self.norm1, self.norm2
        t.train(self.training)
        kpm = None if mask is None else mask[:, 0]  # (N, L)
        return t(x, src_key_padding_mask=kpm)


class EncDropoutOnAttnInput(LearnerEncoderLayer):
    """Dropout on the attention's key input only: no placement the probe knows."""

    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, self.drop(x), x, mask)))
        return self.norm2(x + self.drop(self.feed_forward(x)))


def test_encoder_layer_through_torch_layer_fails():
    result = g.check_encoder_layer(EncThroughTorch, verbose=False)
    assert not result.passed
    assert result.mistakes, result.messages


def test_encoder_layer_unknown_dropout_placement_fails_named():
    result = g.check_encoder_layer(EncDropoutOnAttnInput, verbose=False)
    assert not result.passed
    assert "dropout_placement_unknown" in result.mistakes
    assert not any(m.startswith("Note: ") for m in result.messages)


def test_correct_encoder_layers_still_pass():
    assert g.check_encoder_layer(LearnerEncoderLayer, verbose=False).passed
    assert g.check_encoder_layer(tx.EncoderLayer, verbose=False).passed
    assert g.check_encoder_layer(EncPreLN, norm_first=True, verbose=False).passed
