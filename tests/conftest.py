"""Shared test helpers: one weight-copying function, small sizes, padded token batches."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import tx_helpers as tx

# Small sizes keep the whole suite fast on 2 CPU cores. L_SRC != L_TGT and
# TGT_VOCAB != D_MODEL so that a swapped axis cannot pass by accident.
N, D_MODEL, N_HEADS, D_FF, N_LAYERS = 3, 16, 4, 32, 2
L_SRC, L_TGT = 7, 5
SRC_VOCAB, TGT_VOCAB, PAD = 11, 13, 1
SRC_LENGTHS = (7, 5, 3)  # real tokens per row; the rest is PAD
TGT_LENGTHS = (5, 2, 4)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def small_config(**overrides) -> tx.ModelConfig:
    kw = dict(src_vocab_size=SRC_VOCAB, tgt_vocab_size=TGT_VOCAB, d_model=D_MODEL,
              n_heads=N_HEADS, d_ff=D_FF, n_layers=N_LAYERS, dropout=0.1, max_len=32,
              pad_idx=PAD)
    return tx.ModelConfig(**{**kw, **overrides})


def padded_ids(lengths, length, vocab, pad=PAD, generator=None) -> torch.Tensor:
    """(len(lengths), length) ids in [0, vocab) without ``pad``, then ``pad`` after each length."""
    ids = torch.randint(0, vocab - 1, (len(lengths), length), generator=generator)
    ids = ids + (ids >= pad).long()  # skip the pad id: values in [0, vocab) \ {pad}
    for row, n_real in enumerate(lengths):
        ids[row, n_real:] = pad
    return ids


def _copy_linear(src: nn.Linear, dst: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def _copy_mha(src: tx.MultiHeadAttention, dst: nn.MultiheadAttention) -> None:
    # nn.MultiheadAttention packs Q, K, V into one (3 d_model, d_model) projection.
    dst.in_proj_weight.copy_(torch.cat([src.w_q.weight, src.w_k.weight, src.w_v.weight]))
    dst.in_proj_bias.copy_(torch.cat([src.w_q.bias, src.w_k.bias, src.w_v.bias]))
    _copy_linear(src.w_o, dst.out_proj)


def _copy(src: nn.Module, dst: nn.Module) -> None:
    if isinstance(src, tx.MultiHeadAttention):
        _copy_mha(src, dst)
    elif isinstance(src, (tx.EncoderLayer, tx.DecoderLayer)):
        _copy_mha(src.self_attn, dst.self_attn)
        if isinstance(src, tx.DecoderLayer):
            _copy_mha(src.cross_attn, dst.multihead_attn)
            dst.norm3.load_state_dict(src.norm3.state_dict())
        _copy_linear(src.feed_forward.linear1, dst.linear1)
        _copy_linear(src.feed_forward.linear2, dst.linear2)
        dst.norm1.load_state_dict(src.norm1.state_dict())
        dst.norm2.load_state_dict(src.norm2.state_dict())
    elif isinstance(src, (tx.Encoder, tx.Decoder)):
        # embedding and pos_encoding have no nn counterpart: the tests feed nn the embedded input.
        assert len(src.layers) == len(dst.layers)
        for a, b in zip(src.layers, dst.layers, strict=True):
            _copy(a, b)
        dst.norm.load_state_dict(src.norm.state_dict())
    elif isinstance(src, tx.Transformer):
        _copy(src.encoder, dst.encoder)
        _copy(src.decoder, dst.decoder)
    else:
        raise TypeError(f"no weight mapping for {type(src).__name__}")


def copy_weights(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Copy a tx_helpers module's weights into the matching torch.nn module; returns ``dst``.

    tx.MultiHeadAttention -> nn.MultiheadAttention, EncoderLayer/DecoderLayer ->
    nn.TransformerEncoderLayer/DecoderLayer, Encoder/Decoder -> nn.TransformerEncoder/
    Decoder (with norm), Transformer -> nn.Transformer. Every parameter of ``dst`` must
    be written, so a missed mapping fails here instead of passing by chance.
    """
    with torch.no_grad():
        for p in dst.parameters():
            p.fill_(float("nan"))
        _copy(src, dst)
        for name, p in dst.named_parameters():
            assert not torch.isnan(p).any(), f"copy_weights left {name} unset"
    return dst


def non_pad(x: torch.Tensor, ids: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    """Rows of ``x`` (N, L, ...) at the positions where ``ids`` (N, L) is not ``pad``."""
    return x[ids != pad]
