"""A catalogue of plausible learner mistakes that tests/test_grading.py does not contain.

Each entry injects one mistake into otherwise correct code and asserts the diagnosis names
it. ``naming_rate()`` measures the share named correctly (run this file as a script to
print it); the test asserts every entry, so the rate in the suite is 100% or a failure.
"""
import functools
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as g
import tx_helpers as tx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grading_learners_loss_decoding import (  # noqa: E402
    DECODING_MISTAKES,
    SMOOTHING_MISTAKES,
    make_greedy,
)
from test_grading import (  # noqa: E402
    EncHarvard,
    LearnerDecoderLayer,
    LearnerEncoderLayer,
    LearnerFFN,
    LearnerMHA,
    LearnerPE,
    LearnerTransformer,
    SublayerConnection,
    make_train_step,
    pe_even_only,
)

NEG = -1e9


def attn(scale="sqrt_dk", dim=-1):
    def attention(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1)
        s = {"sqrt_dk": s / math.sqrt(q.size(-1)), "sqrt_dv": s / math.sqrt(v.size(-1)),
             "times": s * math.sqrt(q.size(-1))}[scale]
        if mask is not None:
            s = s.masked_fill(mask, NEG)
        return torch.softmax(s, dim=dim) @ v
    return attention


def attn_inverted_inf(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(mask == 0, float("-inf"))
    return s.softmax(-1) @ v


class MHAKVSwapped(LearnerMHA):
    def project(self, query, key, value):
        return self.w_q(query), self.w_k(value), self.w_v(key)


class MHAValueWithWk(LearnerMHA):
    def project(self, query, key, value):
        return self.w_q(query), self.w_k(key), self.w_k(value)


class MHAScaleDk(LearnerMHA):
    def scale(self):
        return self.d_k


class MHASoftmaxQueries(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split(t) for t in self.project(query, key, value))
        scores = q @ k.transpose(-2, -1) / self.scale()
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1), NEG)
        return self.w_o(self.merge(torch.softmax(scores, dim=-2) @ v))


class MHAMaskAfterSoftmax(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split(t) for t in self.project(query, key, value))
        w = torch.softmax(q @ k.transpose(-2, -1) / self.scale(), dim=-1)
        if mask is not None:
            w = w.masked_fill(mask.unsqueeze(1), 0.0)
        return self.w_o(self.merge(w @ v))


class MHAFunctionalDropout(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split(t) for t in self.project(query, key, value))
        s = q @ k.transpose(-2, -1) / self.scale()
        if mask is not None:
            s = s.masked_fill(mask.unsqueeze(1), NEG)
        w = F.dropout(torch.softmax(s, -1), 0.1)  # training defaults to True
        return self.w_o(self.merge(w @ v))


class MHASdpaNoTransposeBack(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split(t) for t in self.project(query, key, value))
        m = None if mask is None else ~mask.unsqueeze(1)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        return self.w_o(ctx.reshape(query.shape))


class PEFromOne(LearnerPE):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__(d_model, max_len, dropout)
        self.pe = tx.sinusoidal_table(max_len + 1, d_model)[1:].unsqueeze(0)


class PEFrozenParameter(LearnerPE):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__(d_model, max_len, dropout)
        table = self.pe
        del self._buffers["pe"]
        self.pe = nn.Parameter(table, requires_grad=False)


class PESwappedClass(LearnerPE):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__(d_model, max_len, dropout)
        t = tx.sinusoidal_table(max_len, d_model)
        swapped = torch.empty_like(t)
        swapped[:, 0::2] = t[:, 1::2]  # cos where sin belongs (d_model even)
        swapped[:, 1::2] = t[:, 0::2]
        self.pe = swapped.unsqueeze(0)


class FFNGeluModule(LearnerFFN):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__(d_model, d_ff, dropout, act=nn.GELU())


class FFNDropoutAlways(LearnerFFN):
    def forward(self, x):
        return self.linear2(F.dropout(F.relu(self.linear1(x)), 0.1, training=True))


class EncDropoutTwice(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop(self.drop(self.self_attn(x, x, x, mask))))
        return self.norm2(x + self.drop(self.feed_forward(x)))


class EncDropoutAfterAdd(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm1(self.drop(x + self.self_attn(x, x, x, mask)))
        return self.norm2(self.drop(x + self.feed_forward(x)))


class EncNoResidualDropout(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, mask))
        return self.norm2(x + self.feed_forward(x))


class EncHarvardNoMask(EncHarvard):
    def forward(self, x, mask=None):
        return super().forward(x, None)


class PreLNSublayer(SublayerConnection):
    def forward(self, x, sublayer):  # the Annotated Transformer's order: Pre-LN
        return x + self.dropout(sublayer(self.norm(x)))


class EncHarvardPreLN(EncHarvard):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.sublayer = nn.ModuleList([PreLNSublayer(d_model, dropout) for _ in range(2)])


class DecDropoutAfterAdd(LearnerDecoderLayer):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(self.drop(x + self.self_attn(x, x, x, tgt_mask)))
        x = self.norm2(self.drop(x + self.cross(x, memory, memory_mask)))
        return self.norm3(self.drop(x + self.feed_forward(x)))


class DecOneNorm(LearnerDecoderLayer):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, tgt_mask))
        x = self.norm1(x + self.cross(x, memory, memory_mask))
        return self.norm1(x + self.feed_forward(x))


class TFPreLN(tx.Transformer):
    def __init__(self, config):
        import dataclasses

        super().__init__(dataclasses.replace(config, norm_first=True))


class TFLogSoftmax(LearnerTransformer):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return super().forward(src, tgt, src_mask, tgt_mask).log_softmax(-1)


class TFOnlySrcScaled(LearnerTransformer):
    def embed(self, part, tokens):
        x = part.embedding(tokens)
        return part.pos_encoding(x * math.sqrt(self.d_model) if part is self.encoder else x)


class TFNoDecoderNorm(LearnerTransformer):
    def __init__(self, config):
        super().__init__(config)
        self.decoder.norm = nn.Identity()


def step_zero_grad_before_step(model, batch, optimizer, criterion, scheduler=None,
                               clip_norm=1.0):
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in)
    loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.zero_grad()  # wipes the gradients it just computed
    optimizer.step()
    scheduler.step()
    return {"loss": loss.item(), "grad_norm": norm.item()}


# (label, check, implementation or keyword arguments, the key the diagnosis must contain)
CATALOGUE = [
    ("attention divides by sqrt(d_v)", g.check_attention, attn("sqrt_dv"), "scale_d_v"),
    ("attention multiplies by sqrt(d_k)", g.check_attention, attn("times"), "scale_other"),
    ("attention softmax over the heads axis", g.check_attention, attn(dim=1),
     "softmax_wrong_axis"),
    ("attention mask == 0 filled with -inf", g.check_attention, attn_inverted_inf,
     "mask_inverted"),
    ("MHA key and value swapped", g.check_multi_head_attention, MHAKVSwapped,
     "key_value_swapped"),
    ("MHA values projected with w_k", g.check_multi_head_attention, MHAValueWithWk,
     "unused_projection"),
    ("MHA divides by d_k", g.check_multi_head_attention, MHAScaleDk, "scale_d_k"),
    ("MHA softmax over the queries", g.check_multi_head_attention, MHASoftmaxQueries,
     "softmax_wrong_axis"),
    ("MHA mask after the softmax", g.check_multi_head_attention, MHAMaskAfterSoftmax,
     "mask_after_softmax"),
    ("MHA F.dropout without training=", g.check_multi_head_attention, MHAFunctionalDropout,
     "dropout_in_eval"),
    ("MHA SDPA output merged without transpose", g.check_multi_head_attention,
     MHASdpaNoTransposeBack, "heads_merge_without_transpose"),
    ("PE positions from 1 (class)", g.check_positional_encoding, PEFromOne,
     "pe_positions_from_1"),
    ("PE fails for odd d_model (asked for)",
     functools.partial(g.check_positional_encoding, odd_d_model=True), pe_even_only,
     "pe_odd_d_model"),
    ("PE sin/cos swapped (class)", g.check_positional_encoding, PESwappedClass,
     "pe_sin_cos_swapped"),
    ("FFN nn.GELU", g.check_feed_forward, FFNGeluModule, "ffn_other_activation"),
    ("FFN dropout always on", g.check_feed_forward, FFNDropoutAlways, "dropout_in_eval"),
    ("encoder dropout twice", g.check_encoder_layer, EncDropoutTwice, "dropout_twice"),
    ("encoder dropout after the add", g.check_encoder_layer, EncDropoutAfterAdd,
     "dropout_after_residual"),
    ("encoder no residual dropout", g.check_encoder_layer, EncNoResidualDropout,
     "residual_dropout_missing"),
    ("encoder (Harvard layout) mask dropped", g.check_encoder_layer, EncHarvardNoMask,
     "mask_not_passed"),
    ("encoder (Harvard layout) Pre-LN", g.check_encoder_layer, EncHarvardPreLN,
     "pre_ln_instead_of_post_ln"),
    ("decoder dropout after the add", g.check_decoder_layer, DecDropoutAfterAdd,
     "dropout_after_residual"),
    ("decoder one norm for all sublayers", g.check_decoder_layer, DecOneNorm,
     "norms_mixed_up"),
    ("transformer Pre-LN for Post-LN", g.check_transformer, TFPreLN,
     "pre_ln_instead_of_post_ln"),
    ("transformer returns log-probabilities", g.check_transformer, TFLogSoftmax,
     "returns_probabilities"),
    ("transformer scales only the source embeddings", g.check_transformer, TFOnlySrcScaled,
     "embeddings_not_scaled"),
    ("transformer without the decoder's final norm", g.check_transformer, TFNoDecoderNorm,
     "no_final_norm"),
    ("masks: lookahead as float", g.check_masks,
     dict(lookahead_fn=lambda n: torch.triu(torch.ones(n, n), 1)), "mask_not_bool"),
    ("masks: decoder mask from tril only", g.check_masks,
     dict(decoder_fn=lambda t, p: ~torch.tril(torch.ones(t.size(0), t.size(1), t.size(1),
                                                         dtype=torch.bool))),
     "decoder_mask_no_padding"),
    ("train step: zero_grad between backward and step", g.check_train_step,
     step_zero_grad_before_step, "no_update"),
    ("train step: scheduler never stepped, grads never zeroed", g.check_train_step,
     make_train_step(schedule="never", zero_grad=False), "scheduler_not_stepped"),
    ("greedy: one token too many", g.check_greedy_decode, make_greedy(extra_steps=1),
     "decode_max_len_off_by_one"),
]
CATALOGUE += [(f"label smoothing: {key}", g.check_label_smoothing, fn, key)
              for key, fn in SMOOTHING_MISTAKES.items()]
CATALOGUE += [(f"greedy decoding: {key}", g.check_greedy_decode, fn, key)
              for key, fn in DECODING_MISTAKES.items()]


def diagnose(check, impl):
    return check(**impl, verbose=False) if isinstance(impl, dict) else check(impl,
                                                                             verbose=False)


def naming_rate() -> tuple[int, int, list[str]]:
    named, wrong = 0, []
    for label, check, impl, key in CATALOGUE:
        result = diagnose(check, impl)
        if not result.passed and key in result.mistakes:
            named += 1
        else:
            wrong.append(f"{label}: expected {key}, got {result.mistakes or 'passed'}")
    return named, len(CATALOGUE), wrong


@pytest.mark.filterwarnings("ignore:Detected call of")
@pytest.mark.parametrize("label, check, impl, key", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_catalogued_mistake_is_named(label, check, impl, key):
    result = diagnose(check, impl)
    assert not result.passed and key in result.mistakes, (label, result.report)


def test_catalogue_is_large_enough():
    assert len(CATALOGUE) >= 25


if __name__ == "__main__":
    n, total, misses = naming_rate()
    print(f"{n}/{total} catalogued mistakes named correctly ({n / total:.0%})")
    print("\n".join(misses))
