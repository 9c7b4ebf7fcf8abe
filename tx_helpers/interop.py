"""The bridge to torch.nn: copy tx weights into the matching torch.nn modules.

    tx.MultiHeadAttention        -> nn.MultiheadAttention (w_q, w_k, w_v stacked into in_proj)
    tx.EncoderLayer/DecoderLayer -> nn.TransformerEncoderLayer/DecoderLayer (cross_attn ->
                                    multihead_attn)
    tx.Encoder/Decoder           -> nn.TransformerEncoder/Decoder (layers and final norm)
    tx.Transformer               -> nn.Transformer (the two stacks), or
                                    ReferenceTransformer (also embeddings and generator)

``reference_model(model)`` builds the whole torch.nn twin of a tx.Transformer with its
weights. Notebooks 03 and 04 write the copy by hand on purpose, as a lesson; everything
else (tests, tools/bench.py, notebook 07) uses this module.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from .attention import MultiHeadAttention
from .config import ModelConfig
from .layers import DecoderLayer, EncoderLayer
from .model import Decoder, Encoder, Transformer
from .positional import sinusoidal_table


class ReferenceTransformer(nn.Module):
    """A tx.Transformer assembled from torch.nn: embeddings * sqrt(d_model), sinusoidal
    positions + dropout, ``nn.Transformer(batch_first=True)`` and a generator.

    ``forward(src, tgt)`` builds torch.nn's masks from the ids: key padding for source,
    target and memory (``config.pad_idx``), and the causal target mask.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = self.config = config
        self.src_embedding = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embedding = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.register_buffer("pe", sinusoidal_table(c.max_len, c.d_model))
        self.src_dropout = nn.Dropout(c.dropout)
        self.tgt_dropout = nn.Dropout(c.dropout)
        with warnings.catch_warnings():  # norm_first=True: "enable_nested_tensor is True" notice
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.transformer = nn.Transformer(
                c.d_model, c.n_heads, c.n_layers, c.n_layers, c.d_ff, c.dropout,
                activation="relu", batch_first=True, norm_first=c.norm_first)
        # eval mode would turn a padded source into a (prototype, warning) nested tensor
        self.transformer.encoder.use_nested_tensor = False
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        self.scale = math.sqrt(c.d_model)

    def forward(self, src, tgt):
        pad = self.config.pad_idx
        src_pad, tgt_pad = src == pad, tgt == pad  # (N, L_src), (N, L_tgt)
        length = tgt.size(1)
        causal = torch.ones(length, length, dtype=torch.bool, device=tgt.device).triu(1)
        x = self.src_dropout(self.src_embedding(src) * self.scale + self.pe[: src.size(1)])
        y = self.tgt_dropout(self.tgt_embedding(tgt) * self.scale + self.pe[:length])
        hidden = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=src_pad,
                                  tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
        return self.generator(hidden)  # (N, L_tgt, V)


def _copy_attention(src: MultiHeadAttention, dst: nn.MultiheadAttention) -> None:
    # nn.MultiheadAttention packs Q, K, V into one (3 d_model, d_model) projection
    dst.in_proj_weight.copy_(torch.cat([src.w_q.weight, src.w_k.weight, src.w_v.weight]))
    dst.in_proj_bias.copy_(torch.cat([src.w_q.bias, src.w_k.bias, src.w_v.bias]))
    dst.out_proj.load_state_dict(src.w_o.state_dict())


def _copy_layer(src: EncoderLayer | DecoderLayer, dst: nn.Module) -> None:
    _copy_attention(src.self_attn, dst.self_attn)
    norms = ["norm1", "norm2"]
    if isinstance(src, DecoderLayer):
        _copy_attention(src.cross_attn, dst.multihead_attn)
        norms.append("norm3")
    dst.linear1.load_state_dict(src.feed_forward.linear1.state_dict())
    dst.linear2.load_state_dict(src.feed_forward.linear2.state_dict())
    for name in norms:
        getattr(dst, name).load_state_dict(getattr(src, name).state_dict())


def _copy_stack(src: Encoder | Decoder, dst: nn.Module) -> None:
    # embedding and pos_encoding have no counterpart in torch.nn's stacks
    for a, b in zip(src.layers, dst.layers, strict=True):
        _copy_layer(a, b)
    dst.norm.load_state_dict(src.norm.state_dict())


def _copy(src: nn.Module, dst: nn.Module) -> None:
    if isinstance(src, MultiHeadAttention):
        _copy_attention(src, dst)
    elif isinstance(src, (EncoderLayer, DecoderLayer)):
        _copy_layer(src, dst)
    elif isinstance(src, (Encoder, Decoder)):
        _copy_stack(src, dst)
    elif isinstance(src, Transformer):
        stacks = dst.transformer if isinstance(dst, ReferenceTransformer) else dst
        _copy_stack(src.encoder, stacks.encoder)
        _copy_stack(src.decoder, stacks.decoder)
        if isinstance(dst, ReferenceTransformer):
            dst.src_embedding.load_state_dict(src.encoder.embedding.state_dict())
            dst.tgt_embedding.load_state_dict(src.decoder.embedding.state_dict())
            dst.generator.load_state_dict(src.generator.state_dict())
    else:
        raise TypeError(f"no torch.nn mapping for {type(src).__name__}")


@torch.no_grad()
def copy_weights(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Copy a tx module's weights into the matching torch.nn module; returns ``dst``.

    Every parameter of ``dst`` is first filled with NaN, so a parameter the mapping
    misses fails here (ValueError naming it) instead of passing by chance.
    """
    for p in dst.parameters():
        p.fill_(float("nan"))
    _copy(src, dst)
    for name, p in dst.named_parameters():
        if torch.isnan(p).any():
            raise ValueError(f"copy_weights left {name} of {type(dst).__name__} unset: "
                             f"expected a parameter for every one of {type(src).__name__}'s")
    return dst


def reference_model(model: Transformer) -> ReferenceTransformer:
    """The torch.nn twin of ``model``: same weights, dtype, device and train/eval mode."""
    param = next(model.parameters())
    ref = ReferenceTransformer(model.config).to(device=param.device, dtype=param.dtype)
    return copy_weights(model, ref).train(model.training)
