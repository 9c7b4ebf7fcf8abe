"""Correct code in the layouts public tutorials use passes every check (issue 23, item 2).

Each block below is written here in the shape such tutorials take (argument order, buffer
layout, fused projections, a NumPy table, sequence-first tensors); none is copied. A check
called with its defaults judges by the paper: an odd d_model, which these tables do not
support, is a note and never a failure.
"""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as g


class PEDropoutFirst(nn.Module):
    """(d_model, dropout, max_len): pe (1, max_len, d) from exp(-log(10000) 2i / d)."""

    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        x = x + self.pe[:, : x.size(1)].requires_grad_(False)
        return self.dropout(x)


class PENoDropout(nn.Module):
    """(d_model, max_len): a non-persistent buffer, no dropout."""

    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


class PESequenceFirst(nn.Module):
    """pe (max_len, 1, d_model), x (L, N, d_model)."""

    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return self.dropout(x + self.pe[: x.size(0)])


def sinusoid_table_numpy(n_position, d_hid):
    def angle(pos, j):
        return pos / np.power(10000, 2 * (j // 2) / d_hid)
    table = np.array([[angle(p, j) for j in range(d_hid)] for p in range(n_position)])
    table[:, 0::2] = np.sin(table[:, 0::2])
    table[:, 1::2] = np.cos(table[:, 1::2])
    return torch.FloatTensor(table)


class PEFrozenParameter(PEDropoutFirst):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__(d_model, dropout, max_len)
        table = self.pe
        del self._buffers["pe"]
        self.pe = nn.Parameter(table, requires_grad=False)


def attention_returning_weights(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MHAHeadsFirst(nn.Module):
    """(h, d_model, dropout): four cloned Linears in a list, the weights kept on self."""

    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        assert d_model % h == 0
        self.d_k, self.h = d_model // h, h
        self.linears = nn.ModuleList([copy.deepcopy(nn.Linear(d_model, d_model))
                                      for _ in range(4)])
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        nbatches = query.size(0)
        query, key, value = [lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linears, (query, key, value), strict=False)]
        x, self.attn = attention_returning_weights(query, key, value, mask, self.dropout)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        del query, key, value
        return self.linears[-1](x)


class MHASeparateNoBias(nn.Module):
    """Separate projections without bias, named W_q..W_o, embed_dim/num_heads."""

    def __init__(self, embed_dim, num_heads, dropout=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(embed_dim, embed_dim, bias=False)
                                                  for _ in range(4))

    def forward(self, queries, keys, values, mask=None):
        n = queries.size(0)

        def split(t):
            return t.reshape(n, t.size(1), self.num_heads, -1).permute(0, 2, 1, 3)
        q, k, v = split(self.W_q(queries)), split(self.W_k(keys)), split(self.W_v(values))
        attn_mask = None if mask is None else ~mask.unsqueeze(1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.W_o(out.permute(0, 2, 1, 3).reshape(n, -1, q.size(1) * q.size(-1)))


class FFNSequential(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(d_ff, d_model))

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("check, impl", [
    (g.check_positional_encoding, PEDropoutFirst),
    (g.check_positional_encoding, PENoDropout),
    (g.check_positional_encoding, PESequenceFirst),
    (g.check_positional_encoding, sinusoid_table_numpy),
    (g.check_positional_encoding, PEFrozenParameter),
    (g.check_multi_head_attention, MHAHeadsFirst),
    (g.check_multi_head_attention, MHASeparateNoBias),
    (g.check_feed_forward, FFNSequential),
], ids=lambda v: getattr(v, "__name__", ""))
def test_public_layouts_pass(check, impl):
    result = check(impl, verbose=False)
    assert result.passed, result.report


def test_odd_d_model_is_only_a_note_for_a_table_that_needs_even_sizes():
    result = g.check_positional_encoding(PEDropoutFirst, verbose=False)
    assert result.passed and "odd d_model" in result.report, result.report
    result = g.check_positional_encoding(PEDropoutFirst, odd_d_model=True, verbose=False)
    assert not result.passed and result.mistakes == ["pe_odd_d_model"], result.report
