"""tx_helpers against torch.nn, weight for weight, in eval mode and float64.

All weights are copied with conftest.copy_weights. Fully masked query rows are
avoided in the nn comparisons on purpose: tx gives such a row uniform weights
1/L_k (masked scores are finfo.min, still finite), while nn.MultiheadAttention
uses -inf and returns NaN there. tests/test_blocks.py covers that row for tx.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import (
    D_FF,
    D_MODEL,
    L_SRC,
    L_TGT,
    N_HEADS,
    N_LAYERS,
    PAD,
    SRC_LENGTHS,
    SRC_VOCAB,
    TGT_LENGTHS,
    TGT_VOCAB,
    N,
    copy_weights,
    non_pad,
    padded_ids,
    small_config,
)
from torch import nn

import tx_helpers as tx

DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-10)


def _random_mask(*shape):
    """Random bool mask (True = blocked) whose last-axis rows are never fully masked."""
    mask = torch.rand(*shape) < 0.4
    mask[..., 0] = False
    return mask


def _nn_layer_kwargs(norm_first):
    return dict(d_model=D_MODEL, nhead=N_HEADS, dim_feedforward=D_FF, dropout=0.1,
                activation="relu", batch_first=True, norm_first=norm_first, dtype=DT)


# ---------------------------------------------------------------- multi-head attention

MASK_FORMS = ["none", "2d (L_q, L_k)", "3d (N, L_q, L_k)", "3d padding (N, 1, L_k)",
              "4d (N, 1, L_q, L_k)", "4d (N, H, L_q, L_k)"]


def _mask_pair(form, n, h, l_q, l_k):
    """(tx mask, kwargs for nn.MultiheadAttention) expressing the same blocked positions."""
    if form == "none":
        return None, {}
    if form == "2d (L_q, L_k)":
        m = _random_mask(l_q, l_k)
        return m, dict(attn_mask=m)
    if form == "3d (N, L_q, L_k)":
        m = _random_mask(n, l_q, l_k)
        return m, dict(attn_mask=m.repeat_interleave(h, dim=0))  # nn wants (N*H, L_q, L_k)
    if form == "3d padding (N, 1, L_k)":
        m = _random_mask(n, 1, l_k)
        return m, dict(key_padding_mask=m[:, 0, :])  # (N, L_k)
    if form == "4d (N, 1, L_q, L_k)":
        m = _random_mask(n, 1, l_q, l_k)
        return m, dict(attn_mask=m.expand(n, h, l_q, l_k).reshape(n * h, l_q, l_k))
    if form == "4d (N, H, L_q, L_k)":
        m = _random_mask(n, h, l_q, l_k)
        return m, dict(attn_mask=m.reshape(n * h, l_q, l_k))
    raise AssertionError(form)


@pytest.mark.parametrize("form", MASK_FORMS)
def test_mha_matches_nn_multihead_attention(form):
    l_q, l_k = 4, 6
    mine = tx.MultiHeadAttention(D_MODEL, N_HEADS, dropout=0.1).to(DT).eval()
    ref = nn.MultiheadAttention(D_MODEL, N_HEADS, dropout=0.1, batch_first=True, dtype=DT).eval()
    copy_weights(mine, ref)
    q = torch.randn(N, l_q, D_MODEL, dtype=DT)
    k = torch.randn(N, l_k, D_MODEL, dtype=DT)
    v = torch.randn(N, l_k, D_MODEL, dtype=DT)
    mask, nn_kwargs = _mask_pair(form, N, N_HEADS, l_q, l_k)

    out = mine(q, k, v, mask)
    ref_out, ref_weights = ref(q, k, v, need_weights=True, average_attn_weights=False,
                               **nn_kwargs)
    assert out.shape == (N, l_q, D_MODEL)
    torch.testing.assert_close(out, ref_out, **TOL)
    assert mine.attn_weights.shape == (N, N_HEADS, l_q, l_k)
    torch.testing.assert_close(mine.attn_weights, ref_weights, **TOL)


# ---------------------------------------------------------------- single layers

@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_nn(norm_first):
    mine = tx.EncoderLayer(D_MODEL, N_HEADS, D_FF, 0.1, norm_first).to(DT).eval()
    ref = copy_weights(mine, nn.TransformerEncoderLayer(**_nn_layer_kwargs(norm_first)).eval())
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    x = torch.randn(N, L_SRC, D_MODEL, dtype=DT)

    out = mine(x, tx.padding_mask(src, PAD))
    ref_out = ref(x, src_key_padding_mask=src == PAD)
    assert out.shape == (N, L_SRC, D_MODEL)
    torch.testing.assert_close(non_pad(out, src), non_pad(ref_out, src), **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_nn(norm_first):
    mine = tx.DecoderLayer(D_MODEL, N_HEADS, D_FF, 0.1, norm_first).to(DT).eval()
    ref = copy_weights(mine, nn.TransformerDecoderLayer(**_nn_layer_kwargs(norm_first)).eval())
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)
    x = torch.randn(N, L_TGT, D_MODEL, dtype=DT)
    memory = torch.randn(N, L_SRC, D_MODEL, dtype=DT)

    out = mine(x, memory, tx.decoder_self_mask(tgt, PAD), tx.padding_mask(src, PAD))
    causal = torch.triu(torch.ones(L_TGT, L_TGT, dtype=torch.bool), diagonal=1)
    ref_out = ref(x, memory, tgt_mask=causal, tgt_key_padding_mask=tgt == PAD,
                  memory_key_padding_mask=src == PAD)
    assert out.shape == (N, L_TGT, D_MODEL)
    torch.testing.assert_close(non_pad(out, tgt), non_pad(ref_out, tgt), **TOL)


# ---------------------------------------------------------------- stacks

def _embed(stack, ids):
    """What nn's stacks must be fed: pos_encoding(embedding(ids) * sqrt(d_model))."""
    return stack.pos_encoding(stack.embedding(ids) * math.sqrt(stack.d_model))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_matches_nn(norm_first):
    mine = tx.Encoder(SRC_VOCAB, D_MODEL, N_HEADS, D_FF, N_LAYERS, 0.1, 32, norm_first)
    mine = mine.to(DT).eval()
    ref = nn.TransformerEncoder(nn.TransformerEncoderLayer(**_nn_layer_kwargs(norm_first)),
                                N_LAYERS, norm=nn.LayerNorm(D_MODEL, dtype=DT),
                                enable_nested_tensor=False)
    copy_weights(mine, ref.eval())
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)

    out = mine(src, tx.padding_mask(src, PAD))
    ref_out = ref(_embed(mine, src), src_key_padding_mask=src == PAD)
    assert out.shape == (N, L_SRC, D_MODEL)
    torch.testing.assert_close(non_pad(out, src), non_pad(ref_out, src), **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_stack_matches_nn(norm_first):
    mine = tx.Decoder(TGT_VOCAB, D_MODEL, N_HEADS, D_FF, N_LAYERS, 0.1, 32, norm_first)
    mine = mine.to(DT).eval()
    ref = nn.TransformerDecoder(nn.TransformerDecoderLayer(**_nn_layer_kwargs(norm_first)),
                                N_LAYERS, norm=nn.LayerNorm(D_MODEL, dtype=DT))
    copy_weights(mine, ref.eval())
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)
    memory = torch.randn(N, L_SRC, D_MODEL, dtype=DT)

    out = mine(tgt, memory, tx.decoder_self_mask(tgt, PAD), tx.padding_mask(src, PAD))
    causal = torch.triu(torch.ones(L_TGT, L_TGT, dtype=torch.bool), diagonal=1)
    ref_out = ref(_embed(mine, tgt), memory, tgt_mask=causal, tgt_key_padding_mask=tgt == PAD,
                  memory_key_padding_mask=src == PAD)
    assert out.shape == (N, L_TGT, D_MODEL)
    torch.testing.assert_close(non_pad(out, tgt), non_pad(ref_out, tgt), **TOL)


# ---------------------------------------------------------------- full model

def _nn_transformer(config):
    with warnings.catch_warnings():
        # nn.Transformer's encoder warns that nested tensors are off for norm_first=True.
        warnings.simplefilter("ignore", UserWarning)
        return nn.Transformer(config.d_model, config.n_heads, config.n_layers, config.n_layers,
                              config.d_ff, config.dropout, activation="relu",
                              batch_first=True, norm_first=config.norm_first, dtype=DT)


def _nn_logits(mine, ref, src, tgt):
    """tx's embeddings, PE and generator around nn.Transformer's encoder-decoder."""
    pad = mine.config.pad_idx
    causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), dtype=torch.bool)
    hidden = ref(_embed(mine.encoder, src), _embed(mine.decoder, tgt), tgt_mask=causal,
                 src_key_padding_mask=src == pad, tgt_key_padding_mask=tgt == pad,
                 memory_key_padding_mask=src == pad)
    return mine.generator(hidden)


@pytest.mark.parametrize("norm_first", [False, True])
def test_full_model_matches_nn_transformer(norm_first):
    config = small_config(norm_first=norm_first)
    mine = tx.Transformer(config).to(DT).eval()
    ref = copy_weights(mine, _nn_transformer(config)).eval()
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)

    logits = mine(src, tgt)  # default masks, built from config.pad_idx
    assert logits.shape == (N, L_TGT, TGT_VOCAB)
    torch.testing.assert_close(non_pad(logits, tgt), non_pad(_nn_logits(mine, ref, src, tgt), tgt),
                               **TOL)


# ---------------------------------------------------------------- SDPA backend

def _backend_pair():
    manual = tx.MultiHeadAttention(D_MODEL, N_HEADS, dropout=0.1).to(DT).eval()
    sdpa = tx.MultiHeadAttention(D_MODEL, N_HEADS, dropout=0.1, backend="sdpa").to(DT).eval()
    sdpa.load_state_dict(manual.state_dict())
    return manual, sdpa


@pytest.mark.parametrize("form", MASK_FORMS)
def test_sdpa_backend_matches_manual_forward_and_backward(form):
    l_q, l_k = 4, 6
    manual, sdpa = _backend_pair()
    mask, _ = _mask_pair(form, N, N_HEADS, l_q, l_k)  # no fully masked rows
    inputs = [torch.randn(N, length, D_MODEL, dtype=DT) for length in (l_q, l_k, l_k)]
    grad_out = torch.randn(N, l_q, D_MODEL, dtype=DT)

    results = []
    for module in (manual, sdpa):
        xs = [x.clone().requires_grad_() for x in inputs]
        out = module(*xs, mask)
        out.backward(grad_out)
        results.append((out, [x.grad for x in xs],
                        {n: p.grad for n, p in module.named_parameters()}))
    (out_m, gx_m, gp_m), (out_s, gx_s, gp_s) = results
    torch.testing.assert_close(out_s, out_m, **TOL)
    for a, b in zip(gx_s, gx_m, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    assert gp_s.keys() == gp_m.keys()
    for name in gp_m:
        torch.testing.assert_close(gp_s[name], gp_m[name], **TOL, msg=name)
    assert sdpa.attn_weights is None


def test_sdpa_backend_fully_masked_row_matches_manual():
    """One policy (tx_helpers/attention.py): a query row with every key masked gets
    uniform weights, so its output is the mean of the values, in both backends.
    (PyTorch's fused kernel alone would return zeros for that row.)
    """
    manual, sdpa = _backend_pair()
    x = torch.randn(1, 3, D_MODEL, dtype=DT)
    mask = torch.tensor([[False, True, False], [True, True, True], [False, False, False]])
    out_m, out_s = manual(x, x, x, mask), sdpa(x, x, x, mask)
    assert torch.isfinite(out_m).all() and torch.isfinite(out_s).all()
    keep = torch.tensor([0, 2])
    torch.testing.assert_close(out_s[:, keep], out_m[:, keep], **TOL)

    v = manual.w_v(x).view(1, 3, N_HEADS, -1).transpose(1, 2)  # (1, H, 3, d_k)
    mean_v = v.mean(dim=2).transpose(0, 1).reshape(1, D_MODEL)  # uniform weights over 3 keys
    torch.testing.assert_close(out_m[:, 1], manual.w_o(mean_v), **TOL)
    torch.testing.assert_close(out_s[:, 1], out_m[:, 1], **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_sdpa_backend_full_model_matches_manual(norm_first):
    manual = tx.Transformer(small_config(norm_first=norm_first)).to(DT).eval()
    sdpa = tx.Transformer(small_config(norm_first=norm_first, attn_backend="sdpa")).to(DT).eval()
    sdpa.load_state_dict(manual.state_dict())
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)
    torch.testing.assert_close(sdpa(src, tgt), manual(src, tgt), **TOL)
