"""Shared test helpers: small sizes, padded token batches; weights are copied to torch.nn
with tx_helpers.interop.copy_weights (re-exported here)."""
from __future__ import annotations

import pytest
import torch

import tx_helpers as tx
from tx_helpers.data import random_padded_ids
from tx_helpers.interop import copy_weights as copy_weights

# Small sizes keep the whole suite fast on 2 CPU cores. L_SRC != L_TGT and
# TGT_VOCAB != D_MODEL so that a swapped axis cannot pass by accident.
N, D_MODEL, N_HEADS, D_FF, N_LAYERS = 3, 16, 4, 32, 2
L_SRC, L_TGT = 7, 5
SRC_VOCAB, TGT_VOCAB, PAD = 11, 13, 1
SRC_LENGTHS = (7, 5, 3)  # real tokens per row; the rest is PAD
TGT_LENGTHS = (5, 2, 4)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a long integration test that a fast test or a "
                            "notebook also covers; `make test` skips it, `make test-slow` (and "
                            "CI) runs it")


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
    return random_padded_ids(lengths, length, vocab, pad, generator)


def non_pad(x: torch.Tensor, ids: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    """Rows of ``x`` (N, L, ...) at the positions where ``ids`` (N, L) is not ``pad``."""
    return x[ids != pad]
