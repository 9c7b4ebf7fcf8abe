"""Scaled dot-product attention and multi-head attention.

Masks are bool, True = "do not attend" (see :mod:`tx_helpers.masks`).

Policy for a fully masked query row (every key of that query is masked, e.g.
a padded query whose mask hides everything, or a sequence that is all padding):
the row gets uniform weights 1/L_k over all L_k keys, so its output is the
mean of the value rows: finite, never NaN. Both backends follow it:

- ``"manual"``: every score of the row is filled with ``finfo(dtype).min``,
  and the softmax of equal scores is uniform.
- ``"sdpa"``: PyTorch's ``F.scaled_dot_product_attention`` would return zeros
  for such a row, so :class:`MultiHeadAttention` hands it an unmasked row
  instead and then replaces that row's output by the mean of the values.
  Outputs and gradients then match the manual backend (eval mode; in training
  mode attention dropout makes both random, equal in distribution).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import (
    check_attention_inputs,
    check_divisible,
    check_dropout,
    check_positive_int,
    inputs_checked,
)
from .config import BACKENDS as BACKENDS  # re-exported; the list lives in config
from .masks import expand_mask


def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):
    """softmax(q k^T / sqrt(d_k)) v, returning ``(output, weights)``.

    q: (..., L_q, d_k), k: (..., L_k, d_k), v: (..., L_k, d_v).
    ``mask`` is bool, True = do not attend, broadcastable to (..., L_q, L_k).
    Masked scores are filled with the most negative finite value of the score
    dtype, so float16/bfloat16 do not overflow. A query row whose keys are all
    masked therefore gets uniform weights 1/L_k (finite, never NaN).
    ``dropout`` is an optional nn.Dropout applied to the weights.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., L_q, L_k)
    if mask is not None:
        scores.masked_fill_(mask, torch.finfo(scores.dtype).min)  # in place: a fresh tensor
    weights = torch.softmax(scores, dim=-1)  # (..., L_q, L_k)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights  # (..., L_q, d_v), (..., L_q, L_k)



class AttentionCache:
    """One attention module's projected keys and values, kept between decoding steps.

    ``grows=True`` (self-attention): each step's new keys/values are appended on
    the length axis. ``grows=False`` (cross-attention): they are computed from
    the encoder memory at the first step and reused as they are.
    ``k`` and ``v`` are (N, H, L, d_k), or None before the first step.
    """

    def __init__(self, grows: bool):
        self.grows = grows
        self.k = self.v = None

    def update(self, project, key, value):
        """The keys and values to attend over this step; ``project(key, value)`` -> (k, v)."""
        if self.k is not None and not self.grows:
            return self.k, self.v
        k, v = project(key, value)  # (N, H, L_new, d_k)
        if not self.grows:
            # stored contiguous once: every later step's q @ k^T then runs as one batched
            # matmul on the stored rows, instead of copying the head-split view each time
            k, v = k.contiguous(), v.contiguous()
        if self.k is not None:
            k = torch.cat([self.k, k], dim=2)  # (N, H, L_past + L_new, d_k)
            v = torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (in that order) of a growing cache; a fixed one is
        left alone (its rows come from the memory, which the caller already arranged)."""
        if self.grows and self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class LayerCache:
    """A decoder layer's caches: ``self_attn`` (grows) and ``cross_attn`` (fixed)."""

    def __init__(self):
        self.self_attn = AttentionCache(grows=True)
        self.cross_attn = AttentionCache(grows=False)


class KVCache:
    """The key/value cache of incremental decoding: pass one (empty) to
    ``Transformer.decode(..., cache=cache)`` and keep passing it.

    ``layers[i]`` is decoder layer i's :class:`LayerCache`, made at its first
    step; ``length`` counts the target positions decoded so far (the positional
    encoding continues from it). ``reorder(index)`` keeps batch rows ``index``,
    as beam search needs after pruning.
    """

    def __init__(self):
        self.layers: list[LayerCache] = []
        self.length = 0

    def layer(self, i: int) -> LayerCache:
        while len(self.layers) <= i:
            self.layers.append(LayerCache())
        return self.layers[i]

    def advance(self, n_new: int) -> None:
        self.length += n_new

    def reorder(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            layer.self_attn.reorder(index)
            layer.cross_attn.reorder(index)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with one merged Linear per Q, K and V.

    ``backend="manual"`` (default) runs :func:`scaled_dot_product_attention`
    and keeps the last weights in ``self.attn_weights`` (N, H, L_q, L_k),
    detached, for plotting. ``backend="sdpa"`` calls PyTorch's fused
    ``F.scaled_dot_product_attention`` and keeps no weights.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.1, backend: str = "manual"):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        check_divisible(d_model, n_heads)
        check_dropout("dropout", dropout)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got backend={backend!r}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.backend = backend
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(p=dropout)
        self.attn_weights = None

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        n, length, _ = x.shape
        return x.view(n, length, self.n_heads, self.d_k).transpose(1, 2)  # (N, H, L, d_k)

    def _project_kv(self, key, value):
        return self._split_heads(self.w_k(key)), self._split_heads(self.w_v(value))

    def forward(self, query, key, value, mask=None, cache: AttentionCache | None = None):
        """query (N, L_q, d_model), key/value (N, L_k, d_model) -> (N, L_q, d_model).

        ``cache`` (an :class:`AttentionCache`, used by incremental decoding) keeps
        this layer's projected keys and values: appended to at every step for
        self-attention, computed once and reused for cross-attention.
        """
        if not inputs_checked():  # a model's forward or decode has checked its inputs once
            check_attention_inputs(query, key, value, self.d_model)
        n, l_q, _ = query.shape
        q = self._split_heads(self.w_q(query))  # (N, H, L_q, d_k)
        if cache is None:
            k, v = self._project_kv(key, value)  # (N, H, L_k, d_k) each
        else:
            k, v = cache.update(self._project_kv, key, value)  # (N, H, L_past + L_k, d_k)
        if mask is not None:
            if cache is not None and cache.grows and isinstance(mask, torch.Tensor) \
                    and mask.dim() == 2:
                # incremental self-attention: Transformer.decode's shifted look-ahead mask
                # (L_q, L_past + L_q), shared by the batch, so N == L_q is not ambiguous here
                mask = mask[None]  # (1, L_q, L_k)
            mask = expand_mask(mask, n, self.n_heads, l_q, k.size(2))  # (N, H, L_q, L_k)
        if self.backend == "sdpa":
            context, self.attn_weights = self._sdpa(q, k, v, mask), None
        else:
            dropout = self.dropout if self.training else None  # eval: no call that does nothing
            context, weights = scaled_dot_product_attention(q, k, v, mask, dropout)
            self.attn_weights = weights.detach()  # (N, H, L_q, L_k)
        context = context.transpose(1, 2).contiguous().view(n, l_q, self.d_model)  # (N, L_q, d)
        return self.w_o(context)  # (N, L_q, d_model)

    def _sdpa(self, q, k, v, mask):
        """PyTorch's fused attention, with the manual backend's fully-masked-row policy."""
        full_rows = None
        if mask is not None:
            full_rows = mask.all(dim=-1, keepdim=True)  # (.., L_q, 1): query sees no key
            mask = mask & ~full_rows  # such a row goes in unmasked (no NaN, no zeros) ...
        context = F.scaled_dot_product_attention(
            q, k, v,
            attn_mask=None if mask is None else ~mask,  # SDPA: True = may attend
            dropout_p=self.dropout.p if self.training else 0.0,
        )  # (N, H, L_q, d_k)
        if full_rows is not None:
            # ... and leaves as the mean of the values: uniform weights, as in "manual"
            context = torch.where(full_rows, v.mean(dim=2, keepdim=True), context)
        return context
