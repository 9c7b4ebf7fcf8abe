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

from ._checks import check_divisible, check_dropout, check_features, check_positive_int
from .masks import expand_mask

BACKENDS = ("manual", "sdpa")


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
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., L_q, L_k)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights  # (..., L_q, d_v), (..., L_q, L_k)


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

    def forward(self, query, key, value, mask=None, cache=None):
        """query (N, L_q, d_model), key/value (N, L_k, d_model) -> (N, L_q, d_model).

        ``cache`` (a dict, used by incremental decoding) holds this layer's
        projected keys and values: with ``cache["static"]`` true they are
        computed once and reused (cross-attention); otherwise the new keys and
        values are appended to those already cached (self-attention).
        """
        check_features("query", query, self.d_model)
        check_features("key", key, self.d_model)
        check_features("value", value, self.d_model)
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(
                f"key and value must have the same (N, L_k), got {tuple(key.shape)} "
                f"and {tuple(value.shape)}"
            )
        if key.size(0) != query.size(0):
            raise ValueError(
                f"query and key batch sizes differ: {tuple(query.shape)} vs {tuple(key.shape)}"
            )
        n, l_q, _ = query.shape

        q = self._split_heads(self.w_q(query))  # (N, H, L_q, d_k)
        if cache is not None and cache.get("static") and "k" in cache:
            k, v = cache["k"], cache["v"]  # (N, H, L_k, d_k)
        else:
            k = self._split_heads(self.w_k(key))  # (N, H, L_k, d_k)
            v = self._split_heads(self.w_v(value))  # (N, H, L_k, d_k)
            if cache is not None:
                if not cache.get("static") and "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)  # (N, H, L_past + L_k, d_k)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        l_k = k.size(2)
        if mask is not None:
            mask = expand_mask(mask, n, self.n_heads, l_q, l_k)  # broadcasts to (N, H, L_q, L_k)

        if self.backend == "sdpa":
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
            self.attn_weights = None
        else:
            context, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout)
            self.attn_weights = weights.detach()  # (N, H, L_q, L_k)
        context = context.transpose(1, 2).contiguous().view(n, l_q, self.d_model)  # (N, L_q, d)
        return self.w_o(context)  # (N, L_q, d_model)
