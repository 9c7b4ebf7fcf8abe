"""Sinusoidal positional encoding (Vaswani et al., 2017, section 3.5)."""
from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import check_dropout, check_features, check_nonnegative_int, check_positive_int


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """PE table (max_len, d_model): sin on even columns, cos on odd columns.

    Column pair (2i, 2i+1) turns at angular frequency 10000^(-2i/d_model),
    computed as exp(-2i * ln(10000) / d_model): a float exponent, never an
    integer power that could overflow (notebook 02 compares the two forms).
    An odd d_model works: its last column is a sine with no cosine partner.
    Angles are computed in float64 and rounded once to float32: in float32,
    pos * freq is off by up to ~3e-5 at pos ~500 (more than assert_close allows).
    """
    check_positive_int("max_len", max_len)
    check_positive_int("d_model", d_model)
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model/2),)
    div_term = torch.exp(two_i * (-math.log(10000.0) / d_model))  # (ceil(d_model/2),)
    angles = position * div_term  # (max_len, ceil(d_model/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe  # (max_len, d_model)


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to (N, L, d_model) inputs, then dropout.

    ``pe`` is a buffer: saved in ``state_dict``, moved by ``.to()``, never trained.
    """

    def __init__(self, d_model: int, max_len: int, dropout: float = 0.1):
        super().__init__()
        check_dropout("dropout", dropout)
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(p=dropout)
        self.register_buffer("pe", sinusoidal_table(max_len, d_model))  # (max_len, d_model)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Add positions ``start .. start + L - 1`` (``start`` > 0 when decoding with a cache)."""
        check_features("x", x, self.d_model)
        check_nonnegative_int("start", start)
        length = x.size(1)
        if start + length > self.max_len:
            raise ValueError(
                f"L={length} tokens from start={start} need positions "
                f"{start}..{start + length - 1}, but the table has max_len={self.max_len} rows "
                f"(positions 0..{self.max_len - 1}): raise max_len in the config or truncate "
                f"the input"
            )
        return self.dropout(x + self.pe[start : start + length])  # (N, L, d_model)
