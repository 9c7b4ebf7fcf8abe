"""Building blocks on their own: masks, positional encoding, attention, sizes, tracing."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    D_MODEL,
    L_SRC,
    L_TGT,
    PAD,
    SRC_LENGTHS,
    SRC_VOCAB,
    TGT_LENGTHS,
    TGT_VOCAB,
    N,
    padded_ids,
    small_config,
)

import tx_helpers as tx

DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- masks

def test_padding_mask_values_and_shape():
    seq = torch.tensor([[5, 6, 1, 1], [1, 7, 8, 9]])
    mask = tx.padding_mask(seq, pad_idx=1)
    assert mask.shape == (2, 1, 4) and mask.dtype == torch.bool
    expected = torch.tensor([[[False, False, True, True]], [[True, False, False, False]]])
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("size", [1, 2, 5])
@pytest.mark.parametrize("past", [0, 1, 3])
def test_lookahead_mask_matches_double_loop(size, past):
    mask = tx.lookahead_mask(size, past=past)
    assert mask.shape == (size, past + size) and mask.dtype == torch.bool
    for i in range(size):  # query i sits at absolute position past + i
        for j in range(past + size):
            assert bool(mask[i, j]) == (j > past + i), (i, j)


def test_lookahead_mask_default_is_strict_upper_triangle():
    mask = tx.lookahead_mask(4)
    for i in range(4):
        for j in range(4):
            assert bool(mask[i, j]) == (j > i)


def test_decoder_self_mask_is_padding_or_lookahead():
    tgt = torch.tensor([[4, 5, 1], [1, 6, 7]])
    mask = tx.decoder_self_mask(tgt, pad_idx=1)
    assert mask.shape == (2, 3, 3)
    for b in range(2):
        for i in range(3):
            for j in range(3):
                assert bool(mask[b, i, j]) == (j > i or int(tgt[b, j]) == 1), (b, i, j)


@pytest.mark.parametrize("shape", [(4, 6), (2, 4, 6), (2, 1, 6), (2, 1, 4, 6), (2, 3, 4, 6),
                                   (1, 1, 1, 6)])
def test_expand_mask_broadcasts_to_scores(shape):
    mask = torch.rand(*shape) < 0.5
    out = tx.expand_mask(mask, 2, 3, 4, 6)
    assert out.dim() == 4
    full = out.expand(2, 3, 4, 6)
    if len(shape) == 3:  # (N, L_q, L_k) or (N, 1, L_k): head axis inserted at dim 1
        assert torch.equal(full[:, 1], mask.expand(2, 4, 6))
    else:
        assert torch.equal(full, mask.expand(2, 3, 4, 6))


def test_expand_mask_refuses_ambiguous_two_d_mask():
    mask = torch.zeros(4, 6, dtype=torch.bool)  # (L_q, L_k)? or (N, L_k) key padding?
    with pytest.raises(ValueError, match=r"a 2-D mask of shape \(4, 6\) is ambiguous when "
                                         r"N == L_q == 4"):
        tx.expand_mask(mask, 4, 3, 4, 6)
    assert tx.expand_mask(mask[None], 4, 3, 4, 6).shape == (1, 1, 4, 6)
    assert tx.expand_mask(mask[:, None], 4, 3, 4, 6).shape == (4, 1, 1, 6)


# ---------------------------------------------------------------- positional encoding

def _paper_pe(max_len, d_model):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same), by plain loops."""
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range((d_model + 1) // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i] = math.sin(angle)
            if 2 * i + 1 < d_model:
                table[pos, 2 * i + 1] = math.cos(angle)
    return torch.from_numpy(table)


@pytest.mark.parametrize("max_len, d_model", [(50, 16), (512, 128), (20, 7), (9, 1)])
def test_sinusoidal_table_equals_paper_formula(max_len, d_model):
    """float32 table, correct to float32 rounding (atol 1e-6) even at position 511."""
    table = tx.sinusoidal_table(max_len, d_model)
    assert table.shape == (max_len, d_model) and table.dtype == torch.float32
    torch.testing.assert_close(table.double(), _paper_pe(max_len, d_model), rtol=0, atol=1e-6)


def test_odd_d_model_last_column_is_a_sine():
    table = tx.sinusoidal_table(10, 5)
    pos = torch.arange(10, dtype=DT)
    torch.testing.assert_close(table[:, 4].double(), torch.sin(pos / 10000 ** (4 / 5)),
                               rtol=0, atol=1e-6)
    pe = tx.PositionalEncoding(5, 10, dropout=0.0)
    assert pe(torch.zeros(2, 3, 5)).shape == (2, 3, 5)


@pytest.mark.parametrize("start", [0, 4])
def test_positional_encoding_forward_adds_sliced_table(start):
    pe = tx.PositionalEncoding(8, 12, dropout=0.1).eval()
    x = torch.randn(2, 5, 8)
    out = pe(x, start)
    torch.testing.assert_close(out, x + _paper_pe(12, 8)[start:start + 5].float(),
                               rtol=0, atol=1e-6)


def test_positional_encoding_too_long_raises():
    pe = tx.PositionalEncoding(8, 6, dropout=0.0)
    pe(torch.zeros(1, 6, 8))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"L=7 tokens from start=0 .*max_len=6"):
        pe(torch.zeros(1, 7, 8))
    with pytest.raises(ValueError,
                       match=r"L=2 tokens from start=5 need positions 5\.\.6, .*max_len=6"):
        pe(torch.zeros(1, 2, 8), start=5)


def test_pe_is_a_buffer():
    pe = tx.PositionalEncoding(8, 6, dropout=0.0)
    assert "pe" in pe.state_dict()
    assert list(pe.parameters()) == []
    assert not pe.pe.requires_grad
    pe64 = pe.to(torch.float64)
    assert pe64.pe.dtype == torch.float64
    x = torch.zeros(1, 3, 8, dtype=torch.float64)
    assert pe64(x).dtype == torch.float64


# ---------------------------------------------------------------- scaled dot-product attention

def _qkv(dtype=DT, n=2, l_q=3, l_k=4, d_k=5, requires_grad=False):
    return [torch.randn(n, length, d_k, dtype=dtype, requires_grad=requires_grad)
            for length in (l_q, l_k, l_k)]


def test_sdpa_matches_reference_formula():
    q, k, v = _qkv()
    mask = torch.tensor([[False, True, False, False], [False, False, False, True],
                         [True, True, False, False]])
    out, weights = tx.scaled_dot_product_attention(q, k, v, mask)
    # independent reference: explicit loops over queries and keys
    ref_w = torch.zeros(2, 3, 4, dtype=DT)
    for b in range(2):
        for i in range(3):
            scores = [float(q[b, i] @ k[b, j]) / math.sqrt(5) for j in range(4)]
            allowed = [j for j in range(4) if not mask[i, j]]
            z = sum(math.exp(scores[j]) for j in allowed)
            for j in allowed:
                ref_w[b, i, j] = math.exp(scores[j]) / z
    torch.testing.assert_close(weights, ref_w, **TOL)
    torch.testing.assert_close(out, ref_w @ v, **TOL)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=~mask),
                               **TOL)


@pytest.mark.parametrize("with_mask", [False, True])
def test_sdpa_gradcheck(with_mask):
    q, k, v = _qkv(n=1, l_q=2, l_k=3, d_k=2, requires_grad=True)  # tiny: gradcheck is O(numel)
    mask = torch.tensor([[False, True, False]]) if with_mask else None  # (1, L_k)

    def fn(q, k, v):
        return tx.scaled_dot_product_attention(q, k, v, mask)

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_sdpa_weights_rows_sum_to_one_and_masked_columns_are_zero():
    q, k, v = _qkv(n=2, l_q=3, l_k=6)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[:, 4:] = True
    mask[1, 0] = True
    _, weights = tx.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, dtype=DT), **TOL)
    assert (weights[..., 4:] == 0).all()
    assert (weights[:, 1, 0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_masked_is_finite_in_low_precision(dtype):
    q, k, v = _qkv(dtype=dtype, n=1, l_q=2, l_k=4)
    mask = torch.tensor([[False, True, False, True],   # partly masked row
                         [True, True, True, True]])    # fully masked row
    out, weights = tx.scaled_dot_product_attention(q, k, v, mask)
    assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (weights[0, 0, [1, 3]] == 0).all()
    # a fully masked row is uniform 1/L_k (the documented convention), not NaN
    torch.testing.assert_close(weights[0, 1].float(), torch.full((4,), 0.25))
    torch.testing.assert_close(out[0, 1].float(), v[0].float().mean(0), rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- fully masked query rows

def _fully_masked_cases(n, h, l_q, l_k):
    """Masks with at least one fully masked query row, in every accepted form."""
    two_d = torch.rand(l_q, l_k) < 0.3
    two_d[1] = True  # query 1 sees no key
    three_d = torch.rand(n, l_q, l_k) < 0.3
    three_d[0, 2] = True
    padding = torch.zeros(n, 1, l_k, dtype=torch.bool)
    padding[0, 0, -2:] = True
    padding[1] = True  # a sequence that is all padding: every query of it sees nothing
    per_head = torch.rand(n, h, l_q, l_k) < 0.3
    per_head[1, 0, 3] = True
    return {"2d": two_d, "3d": three_d, "padding": padding, "4d per head": per_head}


@pytest.mark.parametrize("form", ["2d", "3d", "padding", "4d per head"])
def test_fully_masked_row_same_policy_in_both_backends(form):
    """One policy: a query that may attend to no key gets uniform weights 1/L_k, so its output
    is the mean of the values. manual and sdpa agree on those rows and on every other row,
    forward and backward."""
    torch.manual_seed(0)
    n, h, l_q, l_k, d_model = 2, 4, 5, 6, 16
    mask = _fully_masked_cases(n, h, l_q, l_k)[form]
    manual = tx.MultiHeadAttention(d_model, h, dropout=0.1).eval()
    sdpa = tx.MultiHeadAttention(d_model, h, dropout=0.1, backend="sdpa").eval()
    sdpa.load_state_dict(manual.state_dict())
    inputs = [torch.randn(n, length, d_model) for length in (l_q, l_k, l_k)]
    results = []
    for module in (manual, sdpa):
        xs = [x.clone().requires_grad_() for x in inputs]
        out = module(*xs, mask)  # (N, L_q, d_model)
        out.square().sum().backward()
        results.append((out.detach(), [x.grad for x in xs]))
    (out_m, grads_m), (out_s, grads_s) = results
    assert torch.isfinite(out_s).all() and torch.isfinite(out_m).all()
    torch.testing.assert_close(out_s, out_m, rtol=0, atol=1e-6)
    for a, b in zip(grads_s, grads_m, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # the manual weights of a fully masked row are exactly uniform
    full = tx.expand_mask(mask, n, h, l_q, l_k).expand(n, h, l_q, l_k).all(-1)  # (N, H, L_q)
    assert full.any() and not full.all()
    weights = manual.attn_weights[full]  # (rows, L_k)
    torch.testing.assert_close(weights, torch.full_like(weights, 1 / l_k))


def test_fully_masked_row_output_is_mean_of_values_for_sdpa():
    torch.manual_seed(1)
    d_model, h = 8, 2
    sdpa = tx.MultiHeadAttention(d_model, h, dropout=0.0, backend="sdpa").eval()
    x = torch.randn(1, 3, d_model)
    mask = torch.tensor([[False, True, False], [True, True, True], [False, False, False]])
    mean_v = sdpa.w_v(x).mean(dim=1)  # (1, d_model): mean of the projected values, all heads
    torch.testing.assert_close(sdpa(x, x, x, mask[None])[:, 1], sdpa.w_o(mean_v))


# ---------------------------------------------------------------- model sizes

@pytest.mark.parametrize("factory, paper_count", [("paper_base", 65e6), ("paper_big", 213e6)])
def test_paper_sizes_match_table_3(factory, paper_count):
    config = getattr(tx.ModelConfig, factory)()
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = tx.Transformer(config)
    count = tx.count_parameters(model)
    assert abs(count - paper_count) / paper_count < 0.05, count


def test_share_embeddings_ties_one_parameter():
    tied = tx.Transformer(small_config(tgt_vocab_size=SRC_VOCAB, share_embeddings=True))
    untied = tx.Transformer(small_config(tgt_vocab_size=SRC_VOCAB, share_embeddings=False))
    w = tied.generator.weight
    assert tied.encoder.embedding.weight is w and tied.decoder.embedding.weight is w
    assert untied.encoder.embedding.weight is not untied.generator.weight
    drop = tx.count_parameters(untied) - tx.count_parameters(tied)
    assert drop == 2 * SRC_VOCAB * D_MODEL


def test_paper_base_shares_embeddings():
    with torch.device("meta"):
        tied = tx.Transformer(tx.ModelConfig.paper_base())
        untied = tx.Transformer(tx.ModelConfig.paper_base(share_embeddings=False))
    assert tied.encoder.embedding.weight is tied.generator.weight
    assert tx.count_parameters(untied) - tx.count_parameters(tied) == 2 * 37000 * 512


def test_count_parameters_is_sum_of_numel():
    model = tx.Transformer(small_config())
    assert tx.count_parameters(model) == sum(p.numel() for p in model.parameters())
    model.generator.bias.requires_grad_(False)
    assert tx.count_parameters(model) == sum(p.numel() for p in model.parameters()) - TGT_VOCAB
    assert tx.count_parameters(model, trainable_only=False) == sum(
        p.numel() for p in model.parameters())


# ---------------------------------------------------------------- trace_shapes

def test_trace_shapes_rows_in_call_order():
    model = tx.Transformer(small_config(n_layers=1)).eval()
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)
    trace = tx.trace_shapes(model, src, tgt, max_depth=1)
    rows = [tuple(r) for r in trace.rows]
    assert [r[0] for r in rows] == ["Transformer", "encoder", "decoder", "generator"]
    assert rows[0][2:] == (f"({N}, {L_SRC}), ({N}, {L_TGT})", f"({N}, {L_TGT}, {TGT_VOCAB})")
    assert rows[1][1] == "Encoder" and rows[1][3] == f"({N}, {L_SRC}, {D_MODEL})"
    assert rows[2][3] == f"({N}, {L_TGT}, {D_MODEL})"
    assert rows[3][1:] == ("Linear", f"({N}, {L_TGT}, {D_MODEL})", f"({N}, {L_TGT}, {TGT_VOCAB})")
    assert "module" in str(trace) and "generator" in str(trace)


def test_trace_shapes_full_depth_covers_attention():
    model = tx.Transformer(small_config(n_layers=1)).eval()
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)
    rows = {r[0]: r for r in tx.trace_shapes(model, src, tgt).rows}
    q_proj = rows["decoder.layers.0.cross_attn.w_q"]
    assert q_proj[3] == f"({N}, {L_TGT}, {D_MODEL})"
    k_proj = rows["decoder.layers.0.cross_attn.w_k"]
    assert k_proj[2] == f"({N}, {L_SRC}, {D_MODEL})"
    names = [r[0] for r in tx.trace_shapes(model, src, tgt).rows]
    assert names.index("encoder") < names.index("encoder.layers.0.self_attn") < names.index(
        "decoder") < names.index("decoder.layers.0.cross_attn") < names.index("generator")


# ---------------------------------------------------------------- causality and padding

def test_future_target_tokens_do_not_change_earlier_logits():
    model = tx.Transformer(small_config()).to(DT).eval()
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids((L_TGT,) * N, L_TGT, TGT_VOCAB)
    changed = tgt.clone()
    changed[:, 3:] = (tgt[:, 3:] + 3) % TGT_VOCAB
    changed[changed == PAD] = 0
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :3], b[:, :3], **TOL)
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_trailing_source_pads_do_not_change_logits():
    model = tx.Transformer(small_config()).to(DT).eval()
    src = padded_ids((4, 3, 4), 4, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)
    padded = torch.cat([src, torch.full((N, 3), PAD)], dim=1)
    torch.testing.assert_close(model(src, tgt), model(padded, tgt), **TOL)
