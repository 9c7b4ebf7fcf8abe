"""Position-wise feed-forward network and the encoder/decoder layers."""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from ._checks import check_dropout, check_positive_int
from .attention import LayerCache, MultiHeadAttention


class FeedForward(nn.Module):
    """FFN(x) = linear2(dropout(relu(linear1(x)))), applied to every position alone."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        check_dropout("dropout", dropout)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x):
        h = self.dropout(F.relu(self.linear1(x)))  # (N, L, d_ff)
        return self.linear2(h)  # (N, L, d_model)


class EncoderLayer(nn.Module):
    """Self-attention and FFN sublayers, each with dropout, residual and LayerNorm.

    Post-LN (``norm_first=False``, the paper): x = norm(x + dropout(sublayer(x))).
    Pre-LN (``norm_first=True``): x = x + dropout(sublayer(norm(x))), where the
    normalised input is computed once and shared by Q, K and V.
    """

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, norm_first=False, backend="manual"):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout, backend=backend)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        """x (N, L, d_model), mask broadcastable to (N, H, L, L) -> (N, L, d_model)."""
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout1(self.self_attn(h, h, h, mask))
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory, then FFN.

    Cross-attention takes queries from the decoder (L_tgt) and keys/values
    from ``memory`` (L_src), so its scores are (N, H, L_tgt, L_src).
    """

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, norm_first=False, backend="manual"):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout, backend=backend)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout, backend=backend)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None, cache: LayerCache | None = None):
        """x (N, L_tgt, d_model), memory (N, L_src, d_model) -> (N, L_tgt, d_model).

        ``cache`` is this layer's :class:`LayerCache` during incremental decoding
        (see :meth:`Decoder.forward`).
        """
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.self_attn, cache.cross_attn
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout1(self.self_attn(h, h, h, tgt_mask, self_cache))
            h = self.norm2(x)
            x = x + self.dropout2(self.cross_attn(h, memory, memory, memory_mask, cross_cache))
            x = x + self.dropout3(self.feed_forward(self.norm3(x)))
        else:
            x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, tgt_mask, self_cache)))
            x = self.norm2(
                x + self.dropout2(self.cross_attn(x, memory, memory, memory_mask, cross_cache))
            )
            x = self.norm3(x + self.dropout3(self.feed_forward(x)))
        return x
