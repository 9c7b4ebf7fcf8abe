"""The KV cache: cached decoding equals full decoding, in steps or chunks; reorder; KVCache only."""
from __future__ import annotations

import pytest
import torch
from conftest import (
    D_MODEL,
    L_SRC,
    L_TGT,
    N_HEADS,
    N_LAYERS,
    PAD,
    SRC_LENGTHS,
    SRC_VOCAB,
    TGT_VOCAB,
    N,
    padded_ids,
    small_config,
)

import tx_helpers as tx

DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_cached_decode_equals_full_decode(norm_first, backend):
    model = tx.Transformer(small_config(norm_first=norm_first, attn_backend=backend))
    model = model.to(DT).eval()
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids((L_TGT,) * N, L_TGT, TGT_VOCAB)  # no target padding
    src_mask = tx.padding_mask(src, PAD)
    memory = model.encode(src)
    full = model.decode(tgt, memory, src_mask)  # (N, L_tgt, d_model)

    cache = tx.KVCache()
    for t in range(L_TGT):
        step = model.decode(tgt[:, t:t + 1], memory, src_mask, cache=cache)  # (N, 1, d_model)
        torch.testing.assert_close(step[:, 0], full[:, t], **TOL, msg=f"position {t}")
    assert cache.length == L_TGT and len(cache.layers) == N_LAYERS
    assert cache.layers[0].self_attn.k.shape == (N, N_HEADS, L_TGT, D_MODEL // N_HEADS)
    assert cache.layers[0].cross_attn.k.shape == (N, N_HEADS, L_SRC, D_MODEL // N_HEADS)


def test_kv_cache_reorder_moves_self_rows_only():
    model = tx.Transformer(small_config()).to(DT).eval()
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    memory = model.encode(src)
    cache = tx.KVCache()
    model.decode(padded_ids((2,) * N, 2, TGT_VOCAB), memory, cache=cache)
    self_k, cross_k = cache.layers[1].self_attn.k, cache.layers[1].cross_attn.k
    order = torch.tensor([2, 2, 0])
    cache.reorder(order)
    assert torch.equal(cache.layers[1].self_attn.k, self_k[order])
    assert cache.layers[1].cross_attn.k is cross_k  # the memory's rows are the caller's to arrange


def test_a_dict_cache_is_refused():
    model = tx.Transformer(small_config()).to(DT).eval()
    memory = model.encode(padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB))
    with pytest.raises(TypeError, match=r"cache must be a tx.KVCache \(start with cache = "
                                        r"tx.KVCache\(\)\), got dict"):
        model.decode(padded_ids((1,) * N, 1, TGT_VOCAB), memory, cache={})


def test_cached_decode_in_chunks():
    model = tx.Transformer(small_config()).to(DT).eval()
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids((L_TGT,) * N, L_TGT, TGT_VOCAB)
    memory = model.encode(src)
    src_mask = tx.padding_mask(src, PAD)
    full = model.decode(tgt, memory, src_mask)
    cache = tx.KVCache()
    first = model.decode(tgt[:, :2], memory, src_mask, cache=cache)  # 2 tokens at once
    rest = model.decode(tgt[:, 2:], memory, src_mask, cache=cache)   # 3 more, past=2
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, **TOL)
