"""Post-LN code that drops the normalised stream (dropout after the norm) is a named mistake.

A cold reader found check_decoder_layer passing ``x = dropout1(norm1(x + self_attn(...)))``
with only a note; the encoder-layer check shares the same train-mode probe.
"""
import sys
from pathlib import Path

import torch.nn.functional as F
from torch import nn

import labkit as g

sys.path.insert(0, str(Path(__file__).parent))
from test_grading import LearnerDecoderLayer, LearnerEncoderLayer  # noqa: E402


class EncDropoutAfterNorm(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.drop(self.norm1(x + self.self_attn(x, x, x, mask)))
        return self.drop(self.norm2(x + self.feed_forward(x)))


class DecDropoutAfterNorm(LearnerDecoderLayer):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.dropout1(self.norm1(x + self.self_attn(x, x, x, tgt_mask)))
        x = self.dropout2(self.norm2(x + self.cross(x, memory, memory_mask)))
        return self.dropout3(self.norm3(x + self.feed_forward(x)))


class DecFunctionalDropout(LearnerDecoderLayer):
    """Correct, written differently: F.dropout with training=, keyword arguments."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        p, t = self.drop.p, self.training
        x = self.norm1(x + F.dropout(self.self_attn(x, x, x, mask=tgt_mask), p, training=t))
        x = self.norm2(x + F.dropout(self.cross(x, memory, memory_mask), p, training=t))
        return self.norm3(x + F.dropout(self.feed_forward(x), p=p, training=t))


def test_decoder_layer_dropout_after_norm_fails_named():
    result = g.check_decoder_layer(DecDropoutAfterNorm, verbose=False)
    assert not result.passed
    assert "dropout_after_norm" in result.mistakes


def test_encoder_layer_dropout_after_norm_fails_named():
    result = g.check_encoder_layer(EncDropoutAfterNorm, verbose=False)
    assert not result.passed
    assert "dropout_after_norm" in result.mistakes


def test_correct_layers_still_pass():
    assert g.check_decoder_layer(LearnerDecoderLayer, verbose=False).passed
    assert g.check_decoder_layer(DecFunctionalDropout, verbose=False).passed
    assert g.check_encoder_layer(LearnerEncoderLayer, verbose=False).passed
