"""labkit.check_multi_head_attention(train_mode=True): the dropout probe of notebook 03's lab.

It must pass correct layers written unlike tx (another weights layout, one dropout call per
head, dropout only when training), name the dropout mistakes (F.dropout too: the contract names
self.dropout), grade merge_heads where the class defines it, stay off by default
and leave the caller's random numbers alone."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as g
import tx_helpers as tx


def quiet(cls, **kwargs):
    return g.check_multi_head_attention(cls, verbose=False, **kwargs)


class Base(nn.Module):
    """Weights kept as (N, L_q, H, L_k), not tx's (N, H, L_q, L_k); ``drop`` places dropout."""

    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.dropout = nn.Dropout(dropout)

    def drop(self, w):  # (N, L_q, H, L_k)
        return self.dropout(w) if self.training else w

    def scores(self, query, key, mask):
        n, l_q, _ = query.shape
        q = self.w_q(query).reshape(n, l_q, self.h, self.d_k)  # (N, L_q, H, d_k)
        k = self.w_k(key).reshape(n, key.size(1), self.h, self.d_k)  # (N, L_k, H, d_k)
        s = torch.einsum("nqhd,nkhd->nqhk", q, k) / math.sqrt(self.d_k)  # (N, L_q, H, L_k)
        if mask is not None:
            m = mask if mask.dim() == 2 else mask.unsqueeze(2)  # (N, L_q or 1, 1, L_k)
            s = s.masked_fill(m, torch.finfo(s.dtype).min)
        return s

    def mix(self, w, value):
        n, l_q = w.shape[:2]
        v = self.w_v(value).reshape(n, value.size(1), self.h, self.d_k)  # (N, L_k, H, d_k)
        return self.w_o(torch.einsum("nqhk,nkhd->nqhd", w, v).reshape(n, l_q, -1))

    def forward(self, query, key, value, mask=None):
        w = self.drop(torch.softmax(self.scores(query, key, mask), dim=-1))
        return self.mix(w, value)


class PerHeadDropout(Base):
    def drop(self, w):  # one call per head, on that head's (N, L_q, L_k) weights
        return torch.stack([self.dropout(w[:, :, i]) for i in range(self.h)], dim=2)


class FunctionalDropout(Base):
    def drop(self, w):
        return F.dropout(w, self.dropout.p, self.training)


class NoDropout(Base):
    def drop(self, w):
        return w


class DropoutOnOutput(NoDropout):
    def forward(self, query, key, value, mask=None):
        return self.dropout(super().forward(query, key, value, mask))


class DropoutOnScores(NoDropout):
    def scores(self, query, key, mask):
        return self.dropout(super().scores(query, key, mask))


class DropoutTwice(Base):
    def drop(self, w):
        return self.dropout(self.dropout(w))


@pytest.mark.parametrize("cls", [tx.MultiHeadAttention, Base, PerHeadDropout])
def test_correct_dropout_passes(cls):
    result = quiet(cls, train_mode=True)
    assert result.passed, result.report
    assert "train mode" in result.report


def test_functional_dropout_with_the_modules_p_passes():
    """F.dropout(w, self.dropout.p, self.training) is the same computation as self.dropout(w):
    full marks, as notebook 04's FFN check gives it."""
    result = quiet(FunctionalDropout, train_mode=True)
    assert result.passed, result.report
    assert "F.dropout with self.dropout's p" in result.report


class TorchKernel(nn.Module):
    """A cold reader's submission: PyTorch's whole layer, handed self.dropout.p only."""

    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.d_model, self.n_heads = d_model, n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        h = self.n_heads
        n, l_q, l_k = query.size(0), query.size(1), key.size(1)
        if mask is None:
            mask3d = None
        else:
            mask3d = mask.expand(n, l_q, l_k) if mask.dim() == 3 else mask.expand(n, l_q, l_k)
            mask3d = mask3d.repeat_interleave(h, 0)  # (N * H, L_q, L_k)
        out, _ = F.multi_head_attention_forward(
            query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1),
            self.d_model, h, None, torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias]),
            None, None, False, self.dropout.p, self.w_o.weight, self.w_o.bias,
            training=self.training, need_weights=True, attn_mask=mask3d,
            average_attn_weights=False, use_separate_proj_weight=True,
            q_proj_weight=self.w_q.weight, k_proj_weight=self.w_k.weight,
            v_proj_weight=self.w_v.weight)
        return out.transpose(0, 1)


def test_torch_kernel_with_dropout_p_fails():
    result = quiet(TorchKernel, train_mode=True)
    assert not result.passed, result.report
    assert {"attn_dropout_unused", "delegated"} & set(result.mistakes), result.report


class OwnMHA(nn.Module):
    """Correct, written like 03's solution without tx's code."""

    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.dropout = nn.Dropout(dropout)
        self.attn_weights = None

    def split_heads(self, x):  # (N, L, d_model) -> (N, H, L, d_k)
        return x.unflatten(-1, (self.n_heads, self.d_k)).transpose(1, 2)

    def merge_heads(self, x):  # (N, H, L, d_k) -> (N, L, d_model)
        return x.transpose(1, 2).flatten(-2)

    def attend(self, query, key, value, mask):  # -> context (N, H, L_q, d_k)
        q, k, v = (self.split_heads(w(t)) for w, t in
                   ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (N, H, L_q, L_k)
        if mask is not None:
            s = s.masked_fill(mask.unsqueeze(1) if mask.dim() == 3 else mask,
                              torch.finfo(s.dtype).min)
        w = self.dropout(torch.softmax(s, dim=-1))
        self.attn_weights = w.detach()
        return w @ v

    def forward(self, query, key, value, mask=None):
        return self.w_o(self.merge_heads(self.attend(query, key, value, mask)))


class MergeInForward(OwnMHA):
    """A cold reader's submission: merge_heads left as the stub, forward merging inline."""

    def merge_heads(self, x):
        raise NotImplementedError("(N, H, L, d_k) in, (N, L, d_model) out")

    def forward(self, query, key, value, mask=None):
        ctx = self.attend(query, key, value, mask)  # (N, H, L_q, d_k)
        n, _, l_q, _ = ctx.shape
        return self.w_o(ctx.transpose(1, 2).reshape(n, l_q, -1))  # (N, L_q, d_model)


def test_own_layer_passes_the_merge_probe():
    result = quiet(OwnMHA, train_mode=True, lookahead_mask=True, stored_weights=True)
    assert result.passed and "merge_heads turns heads" in result.report, result.report


class MergeWithoutTranspose(MergeInForward):
    def merge_heads(self, x):
        n, _, length, _ = x.shape
        return x.reshape(n, length, -1)


@pytest.mark.parametrize("cls, key", [(MergeInForward, "not_implemented"),
                                      (MergeWithoutTranspose, "heads_merge_without_transpose")])
def test_merge_heads_itself_is_graded(cls, key):
    result = quiet(cls, train_mode=True)
    assert not result.passed and key in result.mistakes, result.report
    assert "merge_heads" in result.report


@pytest.mark.parametrize("cls, key", [
    (NoDropout, "attn_dropout_unused"),
    (DropoutOnOutput, "attn_dropout_on_output"),
    (DropoutOnScores, "attn_dropout_before_softmax"),
    (DropoutTwice, "attn_dropout_twice"),
])
def test_dropout_mistakes_are_named(cls, key):
    result = quiet(cls, train_mode=True)
    assert not result.passed and key in result.mistakes, result.report
    assert quiet(cls).passed  # off by default: other notebooks' checks are unchanged


def test_train_mode_probe_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    quiet(Base, train_mode=True)
    torch.testing.assert_close(torch.rand(3), expected)


# lookahead_mask=True: the 2-D (L_q, L_k) mask of 03's contract


class LoopOverHeads(nn.Module):
    """Correct, unlike tx: one attention call per head on 3-D slices, masks used as given."""

    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        q, k, v = self.w_q(query), self.w_k(key), self.w_v(value)
        outs = []
        for i in range(self.h):
            cols = slice(i * self.d_k, (i + 1) * self.d_k)
            s = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(self.d_k)  # (N, L_q, L_k)
            if mask is not None:
                s = s.masked_fill(mask, torch.finfo(s.dtype).min)
            outs.append(self.dropout(torch.softmax(s, dim=-1)) @ v[..., cols])
        return self.w_o(torch.cat(outs, dim=-1))


class AlwaysHeadAxis(tx.MultiHeadAttention):
    """The likely mistake: every mask gets unsqueeze(1), a 2-D one too."""

    def forward(self, query, key, value, mask=None, cache=None):
        return super().forward(query, key, value, None if mask is None else
                               mask.unsqueeze(1).unsqueeze(1).squeeze(1))


class IgnoresTwoDMask(OwnMHA):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask if mask is None or mask.dim() == 3
                               else None)


class HeadsThird(Base):
    """Base's (N, L_q, H, L_k) layout with a 2-D mask placed right: (L_q, 1, L_k)."""

    def scores(self, query, key, mask):
        if mask is not None and mask.dim() == 2:
            return super().scores(query, key, mask.unsqueeze(0))  # (1, L_q, L_k), a 3-D mask
        return super().scores(query, key, mask)


@pytest.mark.parametrize("cls", [tx.MultiHeadAttention, HeadsThird, LoopOverHeads])
def test_lookahead_mask_passes_correct_layers(cls):
    result = quiet(cls, train_mode=True, lookahead_mask=True)
    assert result.passed and "look-ahead mask (L, L)" in result.report, result.report


def test_lookahead_mask_mistakes_are_named():
    result = quiet(AlwaysHeadAxis, lookahead_mask=True)
    assert not result.passed and "mask_2d_head_axis" in result.mistakes, result.report
    result = quiet(IgnoresTwoDMask, lookahead_mask=True)
    assert not result.passed and "mask_ignored" in result.mistakes, result.report
    assert quiet(IgnoresTwoDMask).passed  # off by default: other notebooks' checks unchanged


# stored_weights=True: 03's contract keeps the (N, H, L_q, L_k) weights in self.attn_weights

class BaseStoring(HeadsThird):
    """Correct, unlike tx: weights computed as (N, L_q, H, L_k), stored permuted."""

    def forward(self, query, key, value, mask=None):
        w = torch.softmax(self.scores(query, key, mask), dim=-1)  # (N, L_q, H, L_k)
        self.attn_weights = w.permute(0, 2, 1, 3).detach()  # (N, H, L_q, L_k)
        return self.mix(self.drop(w), value)


class LoopStoring(LoopOverHeads):
    """Correct: one call per head, the weights stacked on a head axis (grad kept, no detach)."""

    def forward(self, query, key, value, mask=None):
        q, k, v = self.w_q(query), self.w_k(key), self.w_v(value)
        outs, weights = [], []
        for i in range(self.h):
            cols = slice(i * self.d_k, (i + 1) * self.d_k)
            s = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(self.d_k)  # (N, L_q, L_k)
            if mask is not None:
                s = s.masked_fill(mask, torch.finfo(s.dtype).min)
            weights.append(torch.softmax(s, dim=-1))
            outs.append(self.dropout(weights[-1]) @ v[..., cols])
        self.attn_weights = torch.stack(weights, dim=1)  # (N, H, L_q, L_k)
        return self.w_o(torch.cat(outs, dim=-1))


class FusedNoWeights(tx.MultiHeadAttention):
    """The likely mistake: F.scaled_dot_product_attention returns no weights to keep."""

    def forward(self, query, key, value, mask=None, cache=None):
        self.attn_weights = None
        n, l_q, _ = query.shape
        split = lambda t: t.view(n, t.size(1), self.n_heads, self.d_k).transpose(1, 2)  # noqa: E731
        attn_mask = None
        if mask is not None:
            attn_mask = ~(mask.unsqueeze(1) if mask.dim() == 3 else mask)
        ctx = F.scaled_dot_product_attention(split(self.w_q(query)), split(self.w_k(key)),
                                             split(self.w_v(value)), attn_mask=attn_mask)
        return self.w_o(ctx.transpose(1, 2).reshape(n, l_q, -1))


class WeightsAveraged(BaseStoring):
    """A mistake: the weights averaged over the heads, (N, L_q, L_k)."""

    def forward(self, query, key, value, mask=None):
        out = super().forward(query, key, value, mask)
        self.attn_weights = self.attn_weights.mean(dim=1)
        return out


@pytest.mark.parametrize("cls", [tx.MultiHeadAttention, BaseStoring, LoopStoring])
def test_stored_weights_pass_correct_layers(cls):
    result = quiet(cls, train_mode=True, lookahead_mask=True, stored_weights=True)
    assert result.passed and "self.attn_weights holds" in result.report, result.report


@pytest.mark.parametrize("cls, key", [(Base, "attn_weights_not_stored"),
                                      (FusedNoWeights, "attn_weights_not_stored"),
                                      (WeightsAveraged, "attn_weights_wrong")])
def test_stored_weights_mistakes_are_named(cls, key):
    result = quiet(cls, stored_weights=True)
    assert not result.passed and key in result.mistakes, result.report
    assert quiet(cls).passed  # off by default: other notebooks' checks unchanged
