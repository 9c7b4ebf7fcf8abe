"""The localising probes name the part that is wrong for mistakes no variant list holds.

Each class below carries one mistake that the checks' variant lists do not contain; the
test asserts the report says which part is off and how (a key other than the generic
``mismatch``, and a word of the description), so the diagnosis comes from a probe that
isolates the part, not from matching a list.
"""
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as g

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_grading import (  # noqa: E402
    LearnerDecoderLayer,
    LearnerEncoderLayer,
    LearnerFFN,
    LearnerMHA,
    LearnerTransformer,
)


class SplitViewMergeOk(LearnerMHA):
    def split(self, x):
        n, length, _ = x.shape
        return x.view(n, self.n_heads, length, self.d_k)


class WeakFill(LearnerMHA):
    def fill(self, s, m):
        return s.masked_fill(m, -1e-2)


class QOnKey(LearnerMHA):
    def project(self, q, k, v):
        return self.w_q(q), self.w_k(q), self.w_v(v)


class Scale8(LearnerMHA):
    def scale(self):
        return 8.0


class ResidualInside(LearnerMHA):
    def out(self, x):
        return self.w_o(x)

    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask) + query


class AddMask(LearnerMHA):
    def fill(self, s, m):
        return s + m.float() * -1.0


class FFNLeaky(LearnerFFN):
    def forward(self, x):
        return self.linear2(self.dropout(F.leaky_relu(self.linear1(x), 0.1)))


class FFNNarrow(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()  # the hidden layer is d_model wide
        self.linear1 = nn.Linear(d_model, d_model)
        self.linear2 = nn.Linear(d_model, d_model)

    def forward(self, x):
        return self.linear2(F.relu(self.linear1(x)))


class FFNSigmoid(LearnerFFN):
    def forward(self, x):
        return self.linear2(torch.sigmoid(self.linear1(x)))


def att_tiny(q,k,v,mask=None):
    s = q@k.transpose(-2,-1)/math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(mask, -1e-9)
    return s.softmax(-1)@v


def att_sig(q,k,v,mask=None):
    s = q@k.transpose(-2,-1)/math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(mask, -1e9)
    return torch.sigmoid(s)@v


def att_scale_twice(q,k,v,mask=None):
    s = q@k.transpose(-2,-1)/q.size(-1)**0.5/q.size(-1)**0.5*2
    if mask is not None:
        s = s.masked_fill(mask, -1e9)
    return s.softmax(-1)@v


class EncFFOnX(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        h = self.norm1(x + self.drop(self.self_attn(x, x, x, mask)))
        return self.norm2(h + self.drop(self.feed_forward(x)))


class EncNoNorm2(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, mask)))
        return x + self.drop(self.feed_forward(x))


class EncResTwice(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        a = self.self_attn(x, x, x, mask)
        x = self.norm1(x + a + a)
        return self.norm2(x + self.drop(self.feed_forward(x)))


class EncDropResidual(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm1(self.drop(x) + self.self_attn(x, x, x, mask))
        return self.norm2(self.drop(x) + self.feed_forward(x))


class EncMaskUnsq(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, None if mask is None else ~mask)))
        return self.norm2(x + self.drop(self.feed_forward(x)))


class DecCrossKeyX(LearnerDecoderLayer):
    def cross(self, x, memory, memory_mask):
        return self.cross_attn(x, x, memory, memory_mask)


class DecFFBeforeCross(LearnerDecoderLayer):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, tgt_mask)))
        y = self.norm2(x + self.drop(self.cross(x, memory, memory_mask)))
        return self.norm3(y + self.drop(self.feed_forward(x)))


class ScaleByD(LearnerTransformer):
    def embed(self, part, tokens):
        return part.pos_encoding(part.embedding(tokens) * self.d_model)


class NoPE(LearnerTransformer):
    def embed(self, part, tokens):
        return part.embedding(tokens) * math.sqrt(self.d_model)


class LeakOne(LearnerTransformer):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        L = tgt.size(1)
        m = torch.triu(torch.ones(L, L, dtype=torch.bool), 2).unsqueeze(0) | (tgt == 1).unsqueeze(1)
        return super().forward(src, tgt, src_mask, m)


class NotChained(LearnerTransformer):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        x0 = self.embed(self.encoder, src)
        x = x0
        for layer in self.encoder.layers:
            x = layer(x0, src_mask)
        memory = self.encoder.norm(x)
        y = self.embed(self.decoder, tgt)
        for layer in self.decoder.layers:
            y = layer(y, memory, tgt_mask, src_mask)
        return self.generator(self.decoder.norm(y))


class LogitsScaled(LearnerTransformer):
    def forward(self, *a):
        return super().forward(*a) / 2


def pe_base_1000(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    freq = torch.pow(1000.0, -torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return pe


def pe_halved(max_len, d_model):
    return 0.5 * _pe(max_len, d_model)


def _pe(max_len, d_model):
    import tx_helpers as tx
    return tx.sinusoidal_table(max_len, d_model)


def la_device_ignored(size, device=None):
    return torch.triu(torch.ones(size, size, dtype=torch.bool), 1)


def la_leaks_at_row_2(size):
    m = torch.triu(torch.ones(size, size, dtype=torch.bool), 1)
    if size > 3:
        m[2, 3] = False
    return m


CASES = [
    (g.check_multi_head_attention, SplitViewMergeOk, "heads_view_without_transpose",
     "merge is correct"),
    (g.check_multi_head_attention, WeakFill, "mask_fill_weak", "masked key still gets weight"),
    (g.check_multi_head_attention, ResidualInside, "mha_output_changed", "plus the query"),
    (g.check_multi_head_attention, AddMask, "mask_fill_weak", "masked key"),
    (g.check_feed_forward, FFNLeaky, "ffn_activation_wrong", "0.1 times"),
    (g.check_feed_forward, FFNNarrow, "ffn_hidden_width", "16 wide"),
    (g.check_feed_forward, FFNSigmoid, "ffn_activation_wrong", "negative pre-activations"),
    (g.check_attention, att_sig, "attention_rows_not_normalised", "sum to"),
    (g.check_encoder_layer, EncFFOnX, "sublayer_output_dropped", "self.feed_forward"),
    (g.check_encoder_layer, EncNoNorm2, "layernorm_missing", "without its LayerNorm"),
    (g.check_encoder_layer, EncResTwice, "residual_doubled", "twice"),
    (g.check_encoder_layer, EncDropResidual, "dropout_on_residual", "residual stream"),
    (g.check_encoder_layer, EncMaskUnsq, "mask_inverted", "inverted mask"),
    (g.check_decoder_layer, DecFFBeforeCross, "sublayer_output_dropped", "cross_attn"),
    (g.check_transformer, ScaleByD, "embedding_scale_wrong", "x 32"),
    (g.check_transformer, NoPE, "pe_not_added", "without the positional encoding"),
    (g.check_transformer, LeakOne, "decoder_sees_future", "leaks 1 step"),
    (g.check_transformer, NotChained, "layers_not_chained", "layer 1"),
    (g.check_transformer, LogitsScaled, "output_changed", "generator's output"),
    (g.check_positional_encoding, pe_base_1000, "pe_frequency", "base were 1000"),
    (g.check_positional_encoding, pe_halved, "pe_amplitude", "amplitude 0.5"),
    (lambda fn, verbose: g.check_masks(lookahead_fn=fn, verbose=verbose), la_device_ignored,
     "mask_device_ignored", "not used"),
    (lambda fn, verbose: g.check_masks(lookahead_fn=fn, verbose=verbose), la_leaks_at_row_2,
     "mask_rows_wrong", "query 2"),
]


@pytest.mark.filterwarnings("ignore:Detected call of")
@pytest.mark.parametrize("check, impl, key, word", CASES,
                         ids=[getattr(c[1], "__name__", str(i)) for i, c in enumerate(CASES)])


def test_a_probe_names_the_part(check, impl, key, word):
    result = check(impl, verbose=False)
    assert not result.passed, result.report
    assert key in result.mistakes, result.report
    assert "mismatch" not in result.mistakes, result.report
    assert word in result.report, result.report


def test_split_probe_passes_a_correct_split():
    result = g.check_multi_head_attention(LearnerMHA, verbose=False)
    assert result.passed, result.report


def test_layers_and_model_pass_when_correct():
    for check, cls in ((g.check_encoder_layer, LearnerEncoderLayer),
                       (g.check_decoder_layer, LearnerDecoderLayer),
                       (g.check_transformer, LearnerTransformer),
                       (g.check_feed_forward, LearnerFFN)):
        result = check(cls, verbose=False)
        assert result.passed, result.report
