"""labkit: each check passes correct code written differently from the package,
fails each known mistake and names it, and never raises because of learner code."""
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as g
import tx_helpers as tx

NEG = -1e9


def assert_fails_with(result, key, *words):
    """The check failed, named ``key``, and the report says so in words a learner reads."""
    assert not result.passed, result.report
    assert key in result.mistakes, (key, result.mistakes, result.report)
    text = "\n".join(result.messages).lower()
    for word in words:
        assert word.lower() in text, (word, result.report)


def quiet(check, *args, **kwargs):
    return check(*args, verbose=False, **kwargs)


# ----------------------------------------------------------------------------------------
# scaled dot-product attention


def attn_einsum(q, k, v, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, NEG)
    w = scores.softmax(-1)
    return torch.einsum("...qk,...kd->...qd", w, v), w


def attn_sdpa(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else ~mask)


def attn_inf(q, k, v, mask=None):  # -inf fill is fine when no row is fully masked
    scores = q @ k.transpose(-1, -2) * k.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def make_attn(scale="sqrt_dk", dim=-1, masking="right", values="v"):
    def attention(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1)
        d_k = q.size(-1)
        s = {"sqrt_dk": s / math.sqrt(d_k), "none": s, "d_k": s / d_k,
             "d_model": s / math.sqrt(128)}[scale]
        if mask is not None and masking == "right":
            s = s.masked_fill(mask, NEG)
        elif mask is not None and masking == "inverted":
            s = s.masked_fill(mask == 0, NEG)
        elif mask is not None and masking == "zero":
            s = s.masked_fill(mask, 0)
        w = torch.softmax(s, dim=dim)
        if mask is not None and masking == "after":
            w = w.masked_fill(mask, 0)
        return w @ (v if values == "v" else k), w
    return attention


@pytest.mark.parametrize("fn", [attn_einsum, attn_sdpa, attn_inf, make_attn()])
def test_attention_correct_variants_pass(fn):
    assert quiet(g.check_attention, fn).passed


@pytest.mark.parametrize("bug, key, word", [
    (dict(scale="none"), "no_scaling", "not scaled"),
    (dict(scale="d_k"), "scale_d_k", "divided by d_k"),
    (dict(scale="d_model"), "scale_other", "sqrt(128"),
    (dict(dim=-2), "softmax_wrong_axis", "wrong axis"),
    (dict(masking="inverted"), "mask_inverted", "inverted"),
    (dict(masking="ignored"), "mask_ignored", "ignored"),
    (dict(masking="zero"), "mask_fill_zero", "filled with 0"),
    (dict(masking="after"), "mask_after_softmax", "after the softmax"),
    (dict(values="k"), "weights_times_k", "instead of v"),
])
def test_attention_mistakes_are_named(bug, key, word):
    assert_fails_with(quiet(g.check_attention, make_attn(**bug)), key, word)


def test_a_named_mistake_replaces_the_plain_mismatch():
    result = quiet(g.check_attention, make_attn(scale="d_model"))
    assert result.mistakes == ["scale_other"], result.report


def test_attention_two_mistakes_are_both_named():
    result = quiet(g.check_attention, make_attn(scale="none", masking="inverted"))
    assert {"no_scaling", "mask_inverted"} <= set(result.mistakes), result.report


def test_attention_exceptions_are_reported_not_raised(capsys):
    def stub(q, k, v, mask=None):
        raise NotImplementedError("compute the scores, mask them, softmax, multiply by v")

    result = g.check_attention(stub)
    assert_fails_with(result, "not_implemented", "not implemented yet",
                      "compute the scores, mask them")
    out = capsys.readouterr().out
    assert "check_attention: FAILED" in out and "✗" in out and "Hint:" in out

    def bad_shapes(q, k, v, mask=None):
        return (q @ k) @ v  # forgot the transpose

    assert_fails_with(quiet(g.check_attention, bad_shapes), "shape_error", "q @ k", "(N, H")


# full_contract=True: notebook 03's fill value (fully masked row, float16) and dropout


def attn_softmax_by_hand(q, k, v, mask=None, dropout=None):
    """Correct, written unlike the reference: einsum, torch.where, a softmax by hand."""
    s = torch.einsum("...id,...jd->...ij", q, k) * q.shape[-1] ** -0.5
    if mask is not None:
        s = torch.where(mask, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype), s)
    e = (s - s.amax(-1, keepdim=True)).exp()
    w = e / e.sum(-1, keepdim=True)
    if dropout is not None:
        w = dropout(w)
    return torch.einsum("...ij,...jd->...id", w, v), w


def attn_where_1e9(q, k, v, mask=None):
    """-1e9 made a tensor of the scores' dtype: -inf in float16, so only a fully masked
    float16 row shows it (a cold reader's pass of every other probe)."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        s = torch.where(mask, torch.tensor(NEG, dtype=s.dtype), s)
    return s.softmax(-1) @ v


def make_attn_contract(fill="finfo", drop="weights"):
    def attention(q, k, v, mask=None, dropout=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(mask, {"finfo": torch.finfo(s.dtype).min, "inf": float("-inf"),
                                     "1e9": NEG, "f32min": torch.finfo(torch.float32).min,
                                     "1e4": -1e4}[fill])
        if dropout is not None and drop == "scores":
            s = dropout(s)
        w = s.softmax(-1)
        if dropout is not None and drop in ("weights", "twice"):
            w = dropout(w)
        if dropout is not None and drop == "twice":
            w = dropout(w)
        out = (F.dropout(w, dropout.p) if dropout is not None and drop == "functional"
               else w) @ v
        if dropout is not None and drop == "output":
            out = dropout(out)
        return out, w
    return attention


@pytest.mark.parametrize("fn", [attn_softmax_by_hand, make_attn_contract(),
                                tx.scaled_dot_product_attention])
def test_attention_full_contract_correct_variants_pass(fn):
    assert quiet(g.check_attention, fn, full_contract=True).passed


@pytest.mark.parametrize("fn, key, word", [
    (attn_inf, "mask_fill_inf", "NaN"),
    (make_attn_contract(fill="inf"), "mask_fill_inf", "NaN"),
    (make_attn_contract(fill="1e9"), "mask_fill_overflow", "defect 8"),
    (make_attn_contract(fill="f32min"), "mask_fill_overflow", "float16"),
    (attn_where_1e9, "mask_fill_half_inf", "float16"),
    (make_attn_contract(fill="1e4"), "mask_fill_weak", "-1e4"),  # a reader's 7/7 pass
    (attn_sdpa, "mask_row_zeroed", "zero output"),
    (make_attn_contract(drop="output"), "attn_dropout_on_output", "output"),
    (make_attn_contract(drop="scores"), "attn_dropout_before_softmax", "before the softmax"),
    (make_attn_contract(drop="twice"), "attn_dropout_twice", "2 times"),
    (make_attn_contract(drop="none"), "attn_dropout_unused", "never called"),
    (make_attn_contract(drop="functional"), "attn_dropout_unused", "never called"),
])
def test_attention_full_contract_mistakes_are_named(fn, key, word):
    assert_fails_with(quiet(g.check_attention, fn, full_contract=True), key, word)
    assert quiet(g.check_attention, fn).passed  # the default check leaves these alone


def test_attention_full_contract_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    quiet(g.check_attention, attn_softmax_by_hand, full_contract=True)
    assert torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------------------------------
# multi-head attention


class LearnerMHA(nn.Module):
    """Learner-style MHA; subclasses below each carry one mistake."""

    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def split(self, x):
        n, length, _ = x.shape
        return x.view(n, length, self.n_heads, self.d_k).transpose(1, 2)

    def merge(self, x):
        n, _, length, _ = x.shape
        return x.transpose(1, 2).contiguous().view(n, length, self.d_model)

    def scale(self):
        return math.sqrt(self.d_k)

    def prepare_mask(self, mask):
        return mask.unsqueeze(1)

    def project(self, query, key, value):
        return self.w_q(query), self.w_k(key), self.w_v(value)

    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split(t) for t in self.project(query, key, value))
        scores = q @ k.transpose(-2, -1) / self.scale()
        if mask is not None:
            scores = self.fill(scores, self.prepare_mask(mask))
        w = self.dropout(torch.softmax(scores, dim=-1))
        return self.out(self.merge(w @ v))

    def fill(self, scores, mask):
        return scores.masked_fill(mask, NEG)

    def out(self, x):
        return self.w_o(x)


class MHAEinsum(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        n, lq, _ = query.shape
        h = self.n_heads
        q = self.w_q(query).reshape(n, lq, h, -1)
        k = self.w_k(key).reshape(n, key.size(1), h, -1)
        v = self.w_v(value).reshape(n, key.size(1), h, -1)
        scores = torch.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1), float("-inf"))
        w = scores.softmax(-1)
        return self.w_o(torch.einsum("nhqk,nkhd->nqhd", w, v).reshape(n, lq, -1))


class MHAPerHeadLoop(LearnerMHA):
    """One slice of the merged projections per head, concatenated."""

    def forward(self, query, key, value, mask=None):
        q, k, v = self.w_q(query), self.w_k(key), self.w_v(value)
        heads = []
        for i in range(self.n_heads):
            sl = slice(i * self.d_k, (i + 1) * self.d_k)
            out = attn_einsum(q[..., sl], k[..., sl], v[..., sl], mask)[0]
            heads.append(out)
        return self.w_o(torch.cat(heads, dim=-1))


class MHASdpa(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split(t) for t in self.project(query, key, value))
        m = None if mask is None else ~mask.unsqueeze(1)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        return self.w_o(ctx.transpose(1, 2).reshape(query.shape))


class MHAViewNoTranspose(LearnerMHA):
    def split(self, x):
        n, length, _ = x.shape
        return x.view(n, self.n_heads, length, self.d_k)

    def merge(self, x):
        n, _, length, _ = x.shape
        return x.reshape(n, length, self.d_model)


class MHAHeadsAxis(LearnerMHA):
    def forward(self, query, key, value, mask=None):  # attention across heads
        n, lq, _ = query.shape
        q = self.w_q(query).view(n, lq, self.n_heads, self.d_k)
        k = self.w_k(key).view(n, key.size(1), self.n_heads, self.d_k)
        v = self.w_v(value).view(n, key.size(1), self.n_heads, self.d_k)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        return self.w_o((w @ v).view(n, lq, self.d_model))


class MHAMergeNoTranspose(LearnerMHA):
    def merge(self, x):
        n, _, length, _ = x.shape
        return x.reshape(n, length, self.d_model)


class MHANoContiguous(LearnerMHA):
    def merge(self, x):
        n, _, length, _ = x.shape
        return x.transpose(1, 2).view(n, length, self.d_model)


class MHANoOutput(LearnerMHA):
    def out(self, x):
        return x


class MHAScaleDModel(LearnerMHA):
    def scale(self):
        return math.sqrt(self.d_model)


class MHANoScale(LearnerMHA):
    def scale(self):
        return 1.0


class MHAMaskInverted(LearnerMHA):
    def fill(self, scores, mask):
        return scores.masked_fill(~mask, NEG)


class MHAMaskZero(LearnerMHA):
    def fill(self, scores, mask):
        return scores.masked_fill(mask, 0.0)


class MHAKeyWithWq(LearnerMHA):
    def project(self, query, key, value):
        return self.w_q(query), self.w_q(key), self.w_v(value)


class MHANoHeadAxis(LearnerMHA):
    def prepare_mask(self, mask):
        return mask


class MHADropoutInEval(LearnerMHA):
    def forward(self, query, key, value, mask=None):
        return F.dropout(super().forward(query, key, value, mask), 0.5, training=True)


class MHAOtherNames(LearnerMHA):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__(d_model, n_heads, dropout)
        self.q_proj = self.w_q
        del self.w_q


class MHAThreeLinears(LearnerMHA):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__(d_model, n_heads, dropout)
        del self.w_o

    def out(self, x):
        return x


class MHAWrongSignature(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        return self.w_o(x)


@pytest.mark.parametrize("cls", [tx.MultiHeadAttention, LearnerMHA, MHAEinsum, MHAPerHeadLoop,
                                 MHASdpa])
def test_mha_correct_variants_pass(cls):
    assert quiet(g.check_multi_head_attention, cls).passed


@pytest.mark.parametrize("cls, key, word", [
    (MHAViewNoTranspose, "heads_view_without_transpose", "without transpose"),
    (MHAHeadsAxis, "heads_view_without_transpose", "before the position axis"),
    (MHAMergeNoTranspose, "heads_merge_without_transpose", "merged back"),
    (MHANoContiguous, "missing_contiguous", "needs contiguous memory"),
    (MHANoOutput, "no_output_projection", "w_o is not used"),
    (MHAScaleDModel, "scale_sqrt_d_model", "sqrt(d_model)"),
    (MHANoScale, "no_scaling", "not scaled"),
    (MHAMaskInverted, "mask_inverted", "inverted"),
    (MHAMaskZero, "mask_fill_zero", "filled with 0"),
    (MHAKeyWithWq, "unused_projection", "self.w_k has no effect"),
    (MHANoHeadAxis, "mask_needs_head_axis", "broadcast over the heads"),
    (MHADropoutInEval, "dropout_in_eval", "eval mode"),
    (MHAOtherNames, "attribute_error", "w_q"),
    (MHAThreeLinears, "missing_weights", "w_o"),
    (MHAWrongSignature, "signature", "positional argument"),
])
def test_mha_mistakes_are_named(cls, key, word):
    assert_fails_with(quiet(g.check_multi_head_attention, cls), key, word)


def test_mha_exception_in_init_and_instance_passed():
    class Stub(nn.Module):
        def __init__(self, d_model, n_heads, dropout):
            super().__init__()
            raise NotImplementedError("create w_q, w_k, w_v and w_o")

    assert_fails_with(quiet(g.check_multi_head_attention, Stub), "not_implemented",
                      "create w_q, w_k, w_v and w_o")
    assert_fails_with(quiet(g.check_multi_head_attention, LearnerMHA(32, 4)), "not_a_class")


# ----------------------------------------------------------------------------------------
# positional encoding


def pe_pow(max_len, d_model):  # correct, written with pow and a loop over pairs
    pe = torch.zeros(max_len, d_model)
    pos = torch.arange(max_len).float()
    for i in range(0, d_model, 2):
        pe[:, i] = torch.sin(pos / 10000 ** (i / d_model))
        if i + 1 < d_model:  # an odd d_model has one cos column fewer
            pe[:, i + 1] = torch.cos(pos / 10000 ** (i / d_model))
    return pe


def pe_even_only(max_len, d_model):
    pe = torch.zeros(max_len, d_model)
    pos = torch.arange(max_len).float()
    for i in range(0, d_model, 2):
        pe[:, i] = torch.sin(pos / 10000 ** (i / d_model))
        pe[:, i + 1] = torch.cos(pos / 10000 ** (i / d_model))  # IndexError for odd d_model
    return pe


def make_pe(swap=False, exponent="2i", start=0, halves=False):
    def table(max_len, d_model):
        pos = torch.arange(start, start + max_len).float().unsqueeze(1)
        j = torch.arange(d_model).float()
        pair = torch.arange((d_model + 1) // 2).float()
        if exponent == "2i":
            ang = pos / 10000 ** (2 * pair / d_model)
        elif exponent == "i":
            ang = pos / 10000 ** (pair / d_model)
        elif exponent == "column":  # 10000 ** (j / d) for every column j
            full = pos / 10000 ** (j / d_model)
        else:
            ang = pos * 10000 ** (2 * pair / d_model)
        if exponent == "column":
            a, b = full[:, 0::2], full[:, 1::2]
        else:
            a = b = ang
        s, c = (torch.cos(a), torch.sin(b)) if swap else (torch.sin(a), torch.cos(b))
        c = c[:, : d_model // 2]
        if halves:
            return torch.cat([s, c], dim=1)
        out = torch.zeros(max_len, d_model)
        out[:, 0::2], out[:, 1::2] = s, c
        return out
    return table


class LearnerPE(nn.Module):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", pe_pow(max_len, d_model).unsqueeze(0))  # (1, max_len, d)

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)])


class PEPlainAttribute(LearnerPE):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__(d_model, max_len, dropout)
        table = self.pe
        del self._buffers["pe"]
        self.pe = table


class PEParameter(LearnerPE):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__(d_model, max_len, dropout)
        table = self.pe
        del self._buffers["pe"]
        self.pe = nn.Parameter(table)


class PEScalesInput(LearnerPE):
    def forward(self, x):
        return x * math.sqrt(x.size(-1)) + self.pe[:, : x.size(1)]


class PENoSlice(LearnerPE):
    def forward(self, x):
        return x + self.pe


class PENoTableNoForward(nn.Module):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        self.table = make_pe(swap=True)(max_len, d_model)

    def forward(self, x):
        return x + self.table[: x.size(1)]


@pytest.mark.parametrize("impl", [tx.sinusoidal_table, pe_pow, make_pe(), LearnerPE,
                                  tx.PositionalEncoding])
def test_pe_correct_variants_pass(impl):
    assert quiet(g.check_positional_encoding, impl).passed


@pytest.mark.parametrize("impl, key, word", [
    (make_pe(swap=True), "pe_sin_cos_swapped", "swapped"),
    (make_pe(exponent="i"), "pe_exponent_i", "instead of 2i"),
    (make_pe(exponent="column"), "pe_exponent_column", "10000^(j/d_model)"),
    (make_pe(exponent="inverted"), "pe_frequency_inverted", "multiplied"),
    (make_pe(start=1), "pe_positions_from_1", "start at 1"),
    (make_pe(halves=True), "pe_concatenated", "interleaved"),
    (PEParameter, "pe_not_buffer", "nn.Parameter"),
    (PEScalesInput, "pe_scales_input", "sqrt(d_model)"),
    (PENoSlice, "shape_error", "its first L rows"),
    (PENoTableNoForward, "pe_sin_cos_swapped", "swapped"),
])
def test_pe_mistakes_are_named(impl, key, word):
    assert_fails_with(quiet(g.check_positional_encoding, impl), key, word)


def test_pe_odd_d_model_is_a_note_by_default_and_a_probe_on_request():
    result = quiet(g.check_positional_encoding, pe_even_only)
    assert result.passed and "odd d_model" in result.report, result.report
    assert_fails_with(quiet(g.check_positional_encoding, pe_even_only, odd_d_model=True),
                      "pe_odd_d_model", "odd d_model")
    assert quiet(g.check_positional_encoding, tx.sinusoidal_table, odd_d_model=True).passed


def pe_numpy_columns(max_len, d_model, dtype=torch.float32):
    """Correct, written unlike the reference: NumPy float64, one column at a time, power form."""
    import numpy as np

    pos = np.arange(max_len, dtype=np.float64)
    cols = [np.sin(pos / 10000.0 ** (j / d_model)) if j % 2 == 0
            else np.cos(pos / 10000.0 ** ((j - 1) / d_model)) for j in range(d_model)]
    return torch.from_numpy(np.stack(cols, axis=1)).to(dtype)


def pe_float32_angles(max_len, d_model, dtype=torch.float32):
    return make_pe()(max_len, d_model).to(dtype)  # every step in float32


def pe_dtype_unused(max_len, d_model, dtype=torch.float32):
    return pe_numpy_columns(max_len, d_model)  # right numbers, always float32


def test_pe_computed_in_float64_on_request():
    assert quiet(g.check_positional_encoding, pe_numpy_columns, odd_d_model=True,
                 computed_in_float64=True).passed
    assert quiet(g.check_positional_encoding, pe_float32_angles).passed  # default: not probed
    assert_fails_with(quiet(g.check_positional_encoding, pe_float32_angles,
                            computed_in_float64=True), "pe_low_precision", "float32", "1e-06")
    assert_fails_with(quiet(g.check_positional_encoding, pe_dtype_unused,
                            computed_in_float64=True), "pe_dtype_ignored", "float64")
    assert_fails_with(quiet(g.check_positional_encoding, make_pe(), computed_in_float64=True),
                      "pe_dtype_ignored", "dtype argument")


def pe_interleaved(max_len, d_model, dtype=torch.float32):
    """Correct and vectorised, unlike the reference: power form, (sin, cos) stacked, then
    interleaved and cut to d_model (an odd d_model drops the last cosine)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    omega = 1.0 / 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pairs = torch.stack([torch.sin(pos * omega), torch.cos(pos * omega)], dim=-1)
    return pairs.reshape(max_len, -1)[:, :d_model].to(dtype)


def pe_loops_float64(max_len, d_model, dtype=torch.float32):
    """Right numbers, but section 2's loops (in float64, odd d_model handled)."""
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for j in range(d_model):
            angle = pos / 10000.0 ** ((j - j % 2) / d_model)
            pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe.to(dtype)


def pe_stepped_slices(max_len, d_model, dtype=torch.float32):
    """Correct and vectorised, as notebook 02's answer: exp form, stepped slices."""
    angles = (torch.arange(max_len, dtype=torch.float64)[:, None]
              * torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)
                          * (-math.log(10000.0) / d_model)))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.to(dtype)


def test_pe_no_loops_on_request():
    for impl in (pe_interleaved, pe_stepped_slices):
        result = quiet(g.check_positional_encoding, impl, odd_d_model=True,
                       computed_in_float64=True, no_loops=True)
        assert result.passed and "without a Python loop" in result.report, result.report
    assert quiet(g.check_positional_encoding, pe_loops_float64, odd_d_model=True,
                 computed_in_float64=True).passed  # default: not probed
    assert_fails_with(quiet(g.check_positional_encoding, pe_loops_float64, odd_d_model=True,
                            computed_in_float64=True, no_loops=True), "pe_python_loop", "for loop")
    assert_fails_with(quiet(g.check_positional_encoding, pe_numpy_columns, no_loops=True),
                      "pe_python_loop", "comprehension")


def _pe_pair(i, pos, d):
    w = 10000.0 ** (-2 * i / d)
    return torch.sin(pos * w), torch.cos(pos * w)


def pe_map_over_helper(max_len, d_model, dtype=torch.float32):
    """A cold reader's submission: the loop is a map() over a helper, no loop syntax."""
    pos = torch.arange(max_len, dtype=torch.float64)
    cols = list(map(lambda i: _pe_pair(i, pos, d_model), range((d_model + 1) // 2)))
    return torch.stack(sum(map(list, cols), []), dim=1)[:, :d_model].to(dtype)


def pe_recursive(max_len, d_model, dtype=torch.float32, done=None):
    """The loop as a recursion, one column per call."""
    done = [] if done is None else done
    if len(done) == d_model:
        return torch.stack(done, dim=1).to(dtype)
    j = len(done)
    angle = torch.arange(max_len, dtype=torch.float64) * 10000.0 ** (-(j - j % 2) / d_model)
    done.append(torch.sin(angle) if j % 2 == 0 else torch.cos(angle))
    return pe_recursive(max_len, d_model, dtype, done)


@pytest.mark.parametrize("impl", [pe_map_over_helper, pe_recursive])
def test_pe_no_loops_catches_hidden_loops(impl):
    result = quiet(g.check_positional_encoding, impl, odd_d_model=True,
                   computed_in_float64=True, no_loops=True)
    assert_fails_with(result, "pe_python_loop", "grow with d_model")


class PEStartByIndex(nn.Module):
    """Correct forward(x, start), written unlike tx: index_select on an arange, a range test."""

    def __init__(self, d_model, max_len=512, dropout=0.1):
        super().__init__()
        self.register_buffer("pe", pe_numpy_columns(max_len, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, start=0):
        idx = torch.arange(start, start + x.shape[1])
        if idx[-1] >= self.pe.shape[0]:
            raise ValueError(f"L={x.shape[1]} from start={start}: max_len={self.pe.shape[0]}")
        return self.drop(x + self.pe.index_select(0, idx))


class PEStartIgnored(PEStartByIndex):
    def forward(self, x, start=0):
        return self.drop(x + self.pe[: x.shape[1]])


class PEStartUnchecked(PEStartByIndex):
    def forward(self, x, start=0):
        return self.drop(x + self.pe[start: start + x.shape[1]])


class PEStartVagueMessage(PEStartByIndex):
    def forward(self, x, start=0):
        if start + x.shape[1] > self.pe.shape[0]:
            raise ValueError("sequence too long")
        return self.drop(x + self.pe[start: start + x.shape[1]])


class PEStartSumOnly(PEStartByIndex):
    """The old tx message: the end position (start + L) and max_len, but neither L nor start."""

    def forward(self, x, start=0):
        if start + x.shape[1] > self.pe.shape[0]:
            raise ValueError(f"sequence of length {start + x.shape[1]} is longer than "
                             f"max_len={self.pe.shape[0]}")
        return self.drop(x + self.pe[start: start + x.shape[1]])


class PEStartRefusesTheEnd(PEStartByIndex):
    """Off by one: a sequence ending exactly at the table's last row is refused."""

    def forward(self, x, start=0):
        if start + x.shape[1] >= self.pe.shape[0]:
            raise ValueError(f"L={x.shape[1]} from start={start}: max_len={self.pe.shape[0]}")
        return self.drop(x + self.pe[start: start + x.shape[1]])


class PEStartOneTooFar(PEStartByIndex):
    """Off by one the other way: one missing row gets through to the broadcasting error."""

    def forward(self, x, start=0):
        if start + x.shape[1] > self.pe.shape[0] + 1:
            raise ValueError(f"L={x.shape[1]} from start={start}: max_len={self.pe.shape[0]}")
        return self.drop(x + self.pe[start: start + x.shape[1]])


def test_pe_forward_start_on_request():
    for cls in (PEStartByIndex, tx.PositionalEncoding):
        assert quiet(g.check_positional_encoding, cls, forward_start=True).passed
    assert quiet(g.check_positional_encoding, PEStartIgnored).passed  # default: not probed
    assert_fails_with(quiet(g.check_positional_encoding, PEStartIgnored, forward_start=True),
                      "pe_start_ignored", "pe[:7]")
    assert_fails_with(quiet(g.check_positional_encoding, PEStartUnchecked, forward_start=True),
                      "pe_no_length_check", "broadcasting")
    assert_fails_with(quiet(g.check_positional_encoding, PEStartVagueMessage,
                            forward_start=True), "pe_length_message", "sequence too long")
    assert_fails_with(quiet(g.check_positional_encoding, PEStartSumOnly, forward_start=True),
                      "pe_length_message", "length 51")
    assert_fails_with(quiet(g.check_positional_encoding, PEStartRefusesTheEnd,
                            forward_start=True), "pe_length_off_by_one", "start + L == max_len")
    assert_fails_with(quiet(g.check_positional_encoding, PEStartOneTooFar, forward_start=True),
                      "pe_no_length_check", "broadcasting")


class PEAddsInPlace(PEStartByIndex):
    """x += pe: the right output, but the caller's embeddings are overwritten."""

    def forward(self, x, start=0):
        if start + x.size(1) > self.pe.size(0):
            raise ValueError(f"L={x.size(1)}, start={start}, max_len={self.pe.size(0)}")
        x += self.pe[start:start + x.size(1)]
        return self.drop(x)


def test_pe_forward_in_place_is_named():
    report = quiet(g.check_positional_encoding, PEAddsInPlace, forward_start=True)
    assert_fails_with(report, "pe_input_modified", "in place")


class PEDropoutFunctional(PEStartByIndex):
    """F.dropout on the sum with the module's p: the contract's self.dropout is never called."""

    def forward(self, x, start=0):
        if start + x.size(1) > self.pe.size(0):
            raise ValueError(f"L={x.size(1)}, start={start}, max_len={self.pe.size(0)}")
        rows = self.pe[start:start + x.size(1)].unsqueeze(0)  # (1, L, d_model)
        return torch.nn.functional.dropout(x + rows, self.drop.p, self.training)


class PEDropoutFunctionalOnTable(PEStartByIndex):
    """A cold reader's fooling case: F.dropout on the table rows only, self.dropout unused."""

    def forward(self, x, start=0):
        if start + x.size(1) > self.pe.size(0):
            raise ValueError(f"L={x.size(1)}, start={start}, max_len={self.pe.size(0)}")
        rows = self.pe[start:start + x.size(1)]  # (L, d_model)
        return x + torch.nn.functional.dropout(rows, self.drop.p, self.training)


class PEDropoutNone(PEStartByIndex):
    def forward(self, x, start=0):
        if start + x.size(1) > self.pe.size(0):
            raise ValueError(f"L={x.size(1)}, start={start}, max_len={self.pe.size(0)}")
        return x + self.pe[start:start + x.size(1)]


class PEDropoutOnInput(PEStartByIndex):
    def forward(self, x, start=0):
        if start + x.size(1) > self.pe.size(0):
            raise ValueError(f"L={x.size(1)}, start={start}, max_len={self.pe.size(0)}")
        return self.drop(x) + self.pe[start:start + x.size(1)]


class PEDropoutOnTable(PEStartByIndex):
    def forward(self, x, start=0):
        if start + x.size(1) > self.pe.size(0):
            raise ValueError(f"L={x.size(1)}, start={start}, max_len={self.pe.size(0)}")
        return x + self.drop(self.pe[start:start + x.size(1)])


class PEDropoutTwice(PEStartByIndex):
    def forward(self, x, start=0):
        if start + x.size(1) > self.pe.size(0):
            raise ValueError(f"L={x.size(1)}, start={start}, max_len={self.pe.size(0)}")
        return self.drop(self.drop(x + self.pe[start:start + x.size(1)]))


def test_pe_dropout_in_train_mode_on_request():
    for cls in (PEStartByIndex, tx.PositionalEncoding):
        assert quiet(g.check_positional_encoding, cls, forward_start=True, train_mode=True).passed
    for cls in (PEDropoutFunctional, PEDropoutFunctionalOnTable):  # where F.dropout acts is unseen
        assert_fails_with(quiet(g.check_positional_encoding, cls, forward_start=True,
                                train_mode=True), "pe_dropout_unused", "F.dropout")
    assert quiet(g.check_positional_encoding, PEDropoutNone, forward_start=True).passed  # default
    assert_fails_with(quiet(g.check_positional_encoding, PEDropoutNone, forward_start=True,
                            train_mode=True), "pe_dropout_unused", "never called")
    for cls, word in ((PEDropoutOnInput, "x alone"), (PEDropoutOnTable, "table rows alone"),
                      (PEDropoutTwice, "more than once")):
        assert_fails_with(quiet(g.check_positional_encoding, cls, forward_start=True,
                                train_mode=True), "pe_dropout_misplaced", word)
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    quiet(g.check_positional_encoding, PEStartByIndex, forward_start=True, train_mode=True)
    assert torch.equal(torch.rand(1), before)  # the caller's RNG untouched


def test_pe_plain_attribute_passes_with_a_note():
    result = quiet(g.check_positional_encoding, PEPlainAttribute)
    assert result.passed and "plain attribute" in result.report, result.report


def test_pe_swapped_and_wrong_exponent_together():
    result = quiet(g.check_positional_encoding, make_pe(swap=True, exponent="i"))
    assert {"pe_sin_cos_swapped", "pe_exponent_i"} <= set(result.mistakes)


# ----------------------------------------------------------------------------------------
# masks


def pad_square(seq, pad_idx):  # (N, L, L): accepted with a note
    m = (seq == pad_idx).unsqueeze(1)
    return m.expand(-1, seq.size(1), -1)


def look_tril(size):
    return ~torch.tril(torch.ones(size, size)).bool()


def test_masks_correct_variants_pass():
    result = quiet(g.check_masks, pad_square, look_tril,
                   lambda t, p: (t == p)[:, None, :] | look_tril(t.size(1)),
                   lambda s, t, p: (s == p)[:, None, None, :])
    assert result.passed, result.report
    assert any("(N, L, L)" in m for m in result.messages)


@pytest.mark.parametrize("kwargs, key, word", [
    (dict(lookahead_fn=lambda n: torch.triu(torch.ones(n, n, dtype=torch.bool))),
     "lookahead_diagonal_0", "diagonal=0"),
    (dict(lookahead_fn=lambda n: torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=2)),
     "lookahead_diagonal_2", "diagonal=2"),
    (dict(lookahead_fn=lambda n: torch.tril(torch.ones(n, n, dtype=torch.bool))),
     "mask_inverted", "inverted"),
    (dict(lookahead_fn=lambda n: torch.triu(torch.full((n, n), float("-inf")), 1)),
     "mask_not_bool", "additive"),
    (dict(padding_fn=lambda s, p: (s == 0).unsqueeze(1)), "pad_idx_ignored", "pad_idx"),
    (dict(padding_fn=lambda s, p: s == p), "padding_mask_shape", "a query axis of size one"),
    (dict(padding_fn=lambda s, p: (s != p).unsqueeze(1)), "mask_inverted", "inverted"),
    (dict(decoder_fn=lambda t, p: tx.lookahead_mask(t.size(1)).expand(t.size(0), -1, -1)),
     "decoder_mask_no_padding", "no padding"),
    (dict(decoder_fn=lambda t, p: tx.padding_mask(t, p) & tx.lookahead_mask(t.size(1))),
     "decoder_mask_and", "AND"),
    (dict(decoder_fn=lambda t, p: tx.padding_mask(t, p).expand(-1, t.size(1), -1)),
     "decoder_mask_no_lookahead", "no look-ahead"),
    (dict(cross_fn=lambda s, t, p: tx.padding_mask(s, p).expand(-1, s.size(1), -1)),
     "cross_mask_shape", "(N, L_src, L_src)"),
    (dict(cross_fn=lambda s, t, p: tx.padding_mask(t, p)), "cross_mask_uses_tgt", "target"),
    (dict(cross_fn=lambda s, t, p: tx.padding_mask(s, p)
          | torch.triu(torch.ones(t.size(1), s.size(1), dtype=torch.bool), 1)),
     "cross_mask_lookahead", "look-ahead"),
])
def test_mask_mistakes_are_named(kwargs, key, word):
    assert_fails_with(quiet(g.check_masks, **kwargs), key, word)


def test_masks_keep_checking_after_one_failure():
    result = quiet(g.check_masks, padding_fn=lambda s, p: (s != p).unsqueeze(1),
                   lookahead_fn=tx.lookahead_mask)
    assert not result.passed
    assert any("✓ lookahead_fn(5)" in m for m in result.messages), result.report


# ----------------------------------------------------------------------------------------
# feed-forward


class LearnerFFN(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1, act=F.relu, residual=False):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout, self.act, self.residual = nn.Dropout(dropout), act, residual

    def forward(self, x):
        y = self.linear2(self.dropout(self.act(self.linear1(x))))
        return y + x if self.residual else y


def ffn(**kw):
    return type("FFN", (LearnerFFN,), {"__init__": lambda self, d, f, p: LearnerFFN.__init__(
        self, d, f, p, **kw)})


@pytest.mark.parametrize("cls", [tx.FeedForward, LearnerFFN])
def test_ffn_correct_passes(cls):
    assert quiet(g.check_feed_forward, cls).passed


@pytest.mark.parametrize("kw, key, word", [
    (dict(act=lambda t: t), "ffn_no_activation", "no ReLU"),
    (dict(act=F.gelu), "ffn_other_activation", "GELU"),
    (dict(residual=True), "ffn_residual_inside", "residual"),
])
def test_ffn_mistakes_are_named(kw, key, word):
    assert_fails_with(quiet(g.check_feed_forward, ffn(**kw)), key, word)


# ----------------------------------------------------------------------------------------
# encoder and decoder layers


class LearnerEncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = LearnerMHA(d_model, n_heads, dropout)
        self.feed_forward = LearnerFFN(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.drop(self.feed_forward(x)))


class EncPreLN(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        h = self.norm1(x)
        x = x + self.drop(self.self_attn(h, h, h, mask))
        return x + self.drop(self.feed_forward(self.norm2(x)))


class EncNormBeforeAdd(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = x + self.norm1(self.self_attn(x, x, x, mask))
        return x + self.norm2(self.feed_forward(x))


class EncNoResidual(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, mask))
        return self.norm2(self.feed_forward(x))


class EncNormsSwapped(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm2(x + self.self_attn(x, x, x, mask))
        return self.norm1(x + self.feed_forward(x))


class EncMaskDropped(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        return super().forward(x, None)


class EncBuggyAttention(LearnerEncoderLayer):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.self_attn = MHANoScale(d_model, n_heads, dropout)


@pytest.mark.parametrize("cls", [tx.EncoderLayer, LearnerEncoderLayer])
def test_encoder_layer_correct_passes(cls):
    assert quiet(g.check_encoder_layer, cls).passed


def test_encoder_layer_pre_ln_expected():
    assert quiet(g.check_encoder_layer, EncPreLN, norm_first=True).passed
    pre_ln = functools.partial(tx.EncoderLayer, norm_first=True)  # a class with its own flag
    assert quiet(g.check_encoder_layer, pre_ln, norm_first=True).passed
    assert quiet(g.check_decoder_layer, functools.partial(tx.DecoderLayer, norm_first=True),
                 norm_first=True).passed
    assert_fails_with(quiet(g.check_encoder_layer, LearnerEncoderLayer, norm_first=True),
                      "post_ln_instead_of_pre_ln", "Post-LN order")


@pytest.mark.parametrize("cls, key, word", [
    (EncPreLN, "pre_ln_instead_of_post_ln", "Pre-LN order"),
    (EncNormBeforeAdd, "norm_before_residual_add", "before the residual add"),
    (EncNoResidual, "missing_residual", "residual connection is missing"),
    (EncNormsSwapped, "norms_mixed_up", "wrong sublayers"),
    (EncMaskDropped, "mask_not_passed", "not passed"),
    (EncBuggyAttention, "submodule_differs", "self.self_attn"),
])
def test_encoder_layer_mistakes_are_named(cls, key, word):
    assert_fails_with(quiet(g.check_encoder_layer, cls), key, word)


class LearnerDecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MHAEinsum(d_model, n_heads, dropout)
        self.cross_attn = MHAEinsum(d_model, n_heads, dropout)
        self.feed_forward = LearnerFFN(d_model, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.drop = nn.Dropout(dropout)

    def cross(self, x, memory, memory_mask):
        return self.cross_attn(x, memory, memory, memory_mask)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, tgt_mask)))
        x = self.norm2(x + self.drop(self.cross(x, memory, memory_mask)))
        return self.norm3(x + self.drop(self.feed_forward(x)))


class DecCrossOnX(LearnerDecoderLayer):
    def cross(self, x, memory, memory_mask):
        return self.cross_attn(x, x, x)


class DecNoMemoryMask(LearnerDecoderLayer):
    def cross(self, x, memory, memory_mask):
        return self.cross_attn(x, memory, memory)


class DecPreLN(LearnerDecoderLayer):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, tgt_mask)
        x = x + self.cross(self.norm2(x), memory, memory_mask)
        return x + self.feed_forward(self.norm3(x))


class DecNoCrossResidual(LearnerDecoderLayer):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, tgt_mask))
        x = self.norm2(self.cross(x, memory, memory_mask))
        return self.norm3(x + self.feed_forward(x))


class DecMasksSwapped(LearnerDecoderLayer):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return super().forward(x, memory, memory_mask, tgt_mask)


@pytest.mark.parametrize("cls", [tx.DecoderLayer, LearnerDecoderLayer])
def test_decoder_layer_correct_passes(cls):
    assert quiet(g.check_decoder_layer, cls).passed


@pytest.mark.parametrize("cls, key, word", [
    (DecCrossOnX, "cross_attn_on_x", "instead of memory"),
    (DecNoMemoryMask, "memory_mask_not_passed", "memory_mask is not passed"),
    (DecPreLN, "pre_ln_instead_of_post_ln", "Pre-LN"),
    (DecNoCrossResidual, "missing_residual", "residual"),
    (DecMasksSwapped, "masks_swapped", "swapped"),
])
def test_decoder_layer_mistakes_are_named(cls, key, word):
    assert_fails_with(quiet(g.check_decoder_layer, cls), key, word)


# ----------------------------------------------------------------------------------------
# the whole model


class LearnerTransformer(nn.Module):
    """Built from tx blocks, with its own forward (the part the exercise asks for)."""

    scale_embeddings = True
    output = "logits"
    use_tgt_mask = True

    def __init__(self, config):
        super().__init__()
        c = config
        common = (c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout, c.max_len)
        self.encoder = tx.Encoder(c.src_vocab_size, *common)
        self.decoder = tx.Decoder(c.tgt_vocab_size, *common)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        self.d_model = c.d_model

    def embed(self, part, tokens):
        x = part.embedding(tokens)
        return part.pos_encoding(x * math.sqrt(self.d_model) if self.scale_embeddings else x)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        x = self.embed(self.encoder, src)
        for layer in self.encoder.layers:
            x = layer(x, src_mask)
        memory = self.encoder.norm(x)
        y = self.embed(self.decoder, tgt)
        for layer in self.decoder.layers:
            y = layer(y, memory, tgt_mask if self.use_tgt_mask else None, src_mask)
        logits = self.generator(self.decoder.norm(y))
        return logits.softmax(-1) if self.output == "probs" else logits


class TFNoScale(LearnerTransformer):
    scale_embeddings = False


class TFProbs(LearnerTransformer):
    output = "probs"


class TFSeesFuture(LearnerTransformer):
    use_tgt_mask = False


class TFNoGenerator(LearnerTransformer):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        memory = self.encoder(src, src_mask)
        return self.decoder(tgt, memory, tgt_mask, src_mask)


class TFRenamed(LearnerTransformer):
    def __init__(self, config):
        super().__init__(config)
        self.out_proj = self.generator
        del self.generator

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        self.generator = self.out_proj
        try:
            return super().forward(src, tgt, src_mask, tgt_mask)
        finally:
            del self.generator


@pytest.mark.parametrize("cls", [tx.Transformer, LearnerTransformer, TFRenamed])
def test_transformer_correct_passes(cls):
    assert quiet(g.check_transformer, cls).passed


@pytest.mark.parametrize("cls, key, word", [
    (TFNoScale, "embeddings_not_scaled", "sqrt(d_model)"),
    (TFProbs, "returns_probabilities", "logits"),
    (TFSeesFuture, "decoder_sees_future", "future"),
    (TFNoGenerator, "no_generator", "generator"),
])
def test_transformer_mistakes_are_named(cls, key, word):
    assert_fails_with(quiet(g.check_transformer, cls), key, word)


# ----------------------------------------------------------------------------------------
# the result object and the report


def test_result_object_and_history(capsys):
    g.clear_history()
    result = g.check_feed_forward(tx.FeedForward)
    printed = capsys.readouterr().out
    assert printed.strip() == result.report
    assert printed.startswith("check_feed_forward: passed")
    assert repr(result) == "<check_feed_forward: passed>"
    assert g.history() == [result] and result.as_dict()["passed"] is True
    bad = quiet(g.check_feed_forward, ffn(residual=True))
    assert "ffn_residual_inside" in repr(bad) and "FAILED" in repr(bad)


def test_checks_leave_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    quiet(g.check_multi_head_attention, LearnerMHA)
    assert torch.equal(torch.rand(3), expected)


def test_every_mistake_key_has_text_and_hint():
    for key, (text, hint) in g.MISTAKES.items():
        assert text and hint, key


# ----------------------------------------------------------------------------------------
# more mistakes, one line each


class FFNReluOut(LearnerFFN):
    def forward(self, x):
        return F.relu(super().forward(x))


class PESeqFirst(LearnerPE):
    def forward(self, x):  # the (L, N, d_model) habit of the PyTorch tutorial
        return x + self.pe[0, : x.size(0)].unsqueeze(1)


class EncSwappedOrder(LearnerEncoderLayer):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.feed_forward(x))
        return self.norm2(x + self.self_attn(x, x, x, mask))


class DecNoTgtMask(LearnerDecoderLayer):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return super().forward(x, memory, None, memory_mask)


class DecSelfForCross(LearnerDecoderLayer):
    def cross(self, x, memory, memory_mask):
        return self.self_attn(x, memory, memory, memory_mask)


class DecTypo(LearnerDecoderLayer):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return self.norm4(x)


class TFNoFinalNorm(LearnerTransformer):
    def __init__(self, config):
        super().__init__(config)
        self.encoder.norm = nn.Identity()


class TFNoMemoryMask(LearnerTransformer):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        memory = self.encoder(src, src_mask)
        return self.generator(self.decoder(tgt, memory, tgt_mask, None))


def on_a_fixed_gpu(q, k, v, mask=None):  # what torch says for mask.to("cuda") on a GPU box
    raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                       "devices, cuda:0 and cpu!")


@pytest.mark.parametrize("check, impl, key, word", [
    (g.check_feed_forward, FFNReluOut, "ffn_activation_on_output", "output of linear2"),
    (g.check_positional_encoding, PESeqFirst, "pe_seq_first", "(L, N, d_model)"),
    (g.check_encoder_layer, EncSwappedOrder, "sublayers_out_of_order", "wrong order"),
    (g.check_decoder_layer, DecNoTgtMask, "tgt_mask_not_passed", "tgt_mask"),
    (g.check_decoder_layer, DecSelfForCross, "self_attn_reused_for_cross", "own weights"),
    (g.check_decoder_layer, DecTypo, "attribute_error", "norm4"),
    (g.check_transformer, TFNoFinalNorm, "no_final_norm", "final LayerNorm"),
    (g.check_transformer, TFNoMemoryMask, "source_padding_leaks", "src_mask"),
    (g.check_masks, dict(lookahead_fn=lambda n: torch.tril(torch.ones(n, n).bool(), -1)),
     "lookahead_masks_past", "past"),
    (g.check_masks, dict(decoder_fn=lambda t, p: (t == p)[:, :, None] | tx.lookahead_mask(
        t.size(1))), "padding_on_queries", "query rows"),
    (g.check_attention, lambda q, k, v, mask=None: (q @ k.transpose(-2, -1)).tolist(),
     "wrong_output_type", "not a tensor"),
    (g.check_attention, lambda q, k, v, mask=None: q[..., :8] * 0 / 0, "nan_output", "NaN"),
    (g.check_attention, on_a_fixed_gpu, "device_mismatch", "the checks run on the CPU"),
])
def test_more_mistakes_are_named(check, impl, key, word):
    result = quiet(check, **impl) if isinstance(impl, dict) else quiet(check, impl)
    assert_fails_with(result, key, word)


# ----------------------------------------------------------------------------------------
# docs/teaching.md stays true


def test_teaching_doc_lists_every_mistake_and_shows_a_real_report():
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    doc = (docs / "teaching.md").read_text()
    extra = (docs / "nbgrader.md").read_text() if (docs / "nbgrader.md").exists() else ""
    missing = [key for key in g.MISTAKES if f"`{key}`" not in doc + extra]
    assert not missing, f"docs/teaching.md (or docs/nbgrader.md) does not list: {missing}"
    example = doc.split("prints, for a class that forgot the output projection:")[1]
    example = example.split("```")[1].strip("\n").split("\n")
    report = quiet(g.check_multi_head_attention, MHANoOutput).messages
    assert [line for line in example if line.strip() != "..."] == [
        line for line in report if line in example]


# ----------------------------------------------------------------------------------------
# one training step


def make_train_step(zero_grad=True, clip=True, schedule="after", dec_in="tgt_in",
                    labels="tgt_out", returns="pre_clip", backward=True, zero_at_end=False):
    """A learner's train step, correct by default; each argument plants one known mistake."""

    def step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
        parts = dict(zip(("src", "tgt_in", "tgt_out"), batch, strict=True))
        model.train()
        logits = model(parts["src"], parts[dec_in])
        loss = criterion(logits.reshape(-1, logits.size(-1)), parts[labels].reshape(-1))
        if zero_grad and not zero_at_end:
            optimizer.zero_grad()
        if backward:
            loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm if clip else math.inf)
        if returns == "post_clip":
            norm = nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        if schedule == "before":
            scheduler.step()
        optimizer.step()
        if schedule == "after":
            scheduler.step()
        if zero_at_end:
            optimizer.zero_grad()
        return loss.item() if returns == "loss_only" else {"loss": loss, "grad_norm": norm}

    return step


def train_step_legacy_order(model, batch, optimizer, scheduler, criterion, clip_norm=1.0):
    """The order notebook 08 used to teach, returning a tuple: still accepted."""
    out = make_train_step()(model, batch, optimizer, criterion, scheduler, clip_norm=clip_norm)
    return out["loss"], out["grad_norm"]


@pytest.mark.parametrize("fn", [make_train_step(), tx.train_step, train_step_legacy_order])
def test_train_step_correct_variants_pass(fn):
    result = quiet(g.check_train_step, fn)
    assert result.passed, result.report


@pytest.mark.filterwarnings("ignore:Detected call of")
@pytest.mark.parametrize("kwargs, key, word", [
    (dict(zero_grad=False), "no_zero_grad", "start from zero gradients"),
    (dict(zero_at_end=True), "zero_grad_at_end", "gradients left by earlier code"),
    (dict(clip=False), "no_clipping", "clips the gradient norm"),
    (dict(schedule="never"), "scheduler_not_stepped", "never stepped"),
    (dict(schedule="before"), "scheduler_before_optimizer", "next step's learning rate"),
    (dict(dec_in="tgt_out"), "decoder_reads_labels", "copy the answer"),
    (dict(labels="tgt_in"), "labels_not_shifted", "not shifted"),
    (dict(returns="post_clip"), "grad_norm_after_clip", "after clipping"),
    (dict(returns="loss_only"), "wrong_return", "a dict with the loss"),
    (dict(backward=False), "no_update", "backward()"),
])
def test_train_step_mistakes_are_named(kwargs, key, word):
    assert_fails_with(quiet(g.check_train_step, make_train_step(**kwargs)), key, word)


def test_train_step_two_mistakes_and_a_stub():
    result = quiet(g.check_train_step, make_train_step(zero_grad=False, schedule="never"))
    assert {"no_zero_grad", "scheduler_not_stepped"} <= set(result.mistakes), result.report

    def my_train_step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
        raise NotImplementedError("forward, loss, zero_grad, backward, clip, step, step")

    assert_fails_with(quiet(g.check_train_step, my_train_step), "not_implemented",
                      "zero_grad, backward")
    assert [label for label, _ in g.find_checks({"my_train_step": my_train_step}, None)] == [
        "check_train_step(my_train_step)"]


# ----------------------------------------------------------------------------------------
# correct code in other layouts passes every check that takes it


class MHAListAlias(nn.Module):
    """The Annotated Transformer's layout: four Linears in a list, plus aliases."""

    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])
        self.w_q = self.linears[0]  # an alias: the same module under a second name

    def forward(self, query, key, value, mask=None):
        n = query.size(0)
        q, k, v = (lin(x).view(n, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears[:3], (query, key, value), strict=True))
        if mask is not None:
            mask = mask.unsqueeze(1)
        out = attn_einsum(q, k, v, mask)[0]
        return self.linears[3](out.transpose(1, 2).reshape(n, -1, self.h * self.d_k))


class MHAFused(nn.Module):
    """minGPT-like: one fused q/k/v Linear for self-attention, split for cross-attention."""

    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.h, self.d = n_heads, d_model
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        n, lq, d = query.shape
        w_q, w_k, w_v = self.qkv.weight.split(d)
        b_q, b_k, b_v = self.qkv.bias.split(d)
        q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        q, k, v = (t.view(n, -1, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        m = None if mask is None else ~mask.unsqueeze(1)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                             dropout_p=self.drop.p if self.training else 0.0)
        return self.proj(ctx.transpose(1, 2).reshape(n, lq, d))


class FFNLazy(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.net = nn.Sequential(nn.LazyLinear(d_ff), nn.ReLU(), nn.Dropout(dropout),
                                 nn.LazyLinear(d_model))

    def forward(self, x):
        return self.net(x)


class FFNHarvard(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1, self.w_2, self.dropout = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), \
            nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout):
        super().__init__()
        self.norm, self.dropout = nn.LayerNorm(size), nn.Dropout(dropout)

    def forward(self, x, sublayer):  # Post-LN, as the paper
        return self.norm(x + self.dropout(sublayer(x)))


class EncHarvard(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MHAListAlias(d_model, n_heads, dropout)
        self.feed_forward = FFNHarvard(d_model, d_ff, dropout)
        self.sublayer = nn.ModuleList([SublayerConnection(d_model, dropout) for _ in range(2)])

    def forward(self, x, mask=None):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))
        return self.sublayer[1](x, self.feed_forward)


class DecFused(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.attn, self.src_attn = MHAFused(d_model, n_heads, dropout), MHAFused(
            d_model, n_heads, dropout)
        self.mlp = FFNLazy(d_model, d_ff, dropout)
        self.ln1, self.ln2, self.ln3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.ln1(x + self.drop(self.attn(x, x, x, tgt_mask)))
        x = self.ln2(x + self.drop(self.src_attn(x, memory, memory, memory_mask)))
        return self.ln3(x + self.drop(self.mlp(x)))


@pytest.mark.parametrize("check, cls", [
    (g.check_multi_head_attention, MHAListAlias),
    (g.check_multi_head_attention, MHAFused),
    (g.check_feed_forward, FFNLazy),
    (g.check_feed_forward, FFNHarvard),
    (g.check_encoder_layer, EncHarvard),
    (g.check_decoder_layer, DecFused),
])
def test_other_layouts_pass(check, cls):
    result = quiet(check, cls)
    assert result.passed, result.report


def test_a_crash_inside_the_checker_is_not_blamed_on_the_learner(monkeypatch):
    from labkit import feed_forward, weights

    # a function of the package called the wrong way: the TypeError comes from the checker
    monkeypatch.setattr(feed_forward, "copy_reference", weights.locate)
    result = quiet(g.check_feed_forward, tx.FeedForward)
    assert result.mistakes == ["checker_failed"], result.report
    assert "says nothing about whether your code is right" in result.report
    assert "shape_error" not in result.mistakes
