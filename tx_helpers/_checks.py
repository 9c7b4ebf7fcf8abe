"""Argument checks that turn a learner's likely mistake into a clear error.

Every check raises ValueError or TypeError naming the argument, what it got and
what was expected, before PyTorch fails somewhere deep inside a matmul.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch

_CHECKED = contextvars.ContextVar("tx_inputs_checked", default=False)


def inputs_checked() -> bool:
    """True inside :func:`checked_inputs`: an entry point has already checked the inputs."""
    return _CHECKED.get()


@contextmanager
def checked_inputs():
    """Run the block as an internal call: the inner entry points skip their input checks.

    A public entry point (``Transformer.forward``, ``encode``, ``decode``, the stacks'
    ``forward``, the decoders) checks its tokens once when called from outside, then
    calls the rest of the model inside this block, so one forward or one decode loop
    does not re-check (each token check is a host sync on CUDA: ``int(ids.max())``).
    """
    token = _CHECKED.set(True)
    try:
        yield
    finally:
        _CHECKED.reset(token)


def check_positive_int(name: str, value) -> None:
    """``value`` must be an int >= 1 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 1:
        raise ValueError(f"{name} must be positive, got {name}={value}")


def check_nonnegative_int(name: str, value) -> None:
    """``value`` must be an int >= 0 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {name}={value}")


def check_dropout(name: str, p) -> None:
    """A dropout probability must be a number in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(p).__name__} ({p!r})")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {name}={p}")


def check_divisible(d_model: int, n_heads: int) -> None:
    if d_model % n_heads:
        # the divisors of d_model nearest to n_heads, below and above
        below = max(h for h in range(1, n_heads) if d_model % h == 0)
        above = next((h for h in range(n_heads + 1, d_model + 1) if d_model % h == 0), None)
        heads = f"n_heads={below}" + (f" or {above}" if above else "")
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}: "
            f"each head needs d_k = d_model / n_heads features "
            f"(try d_model={n_heads * max(1, round(d_model / n_heads))}, or {heads})"
        )


def check_features(name: str, x, d_model: int, dtype: torch.dtype | None = None) -> None:
    """``x`` must be a floating tensor of shape (N, L, d_model) (and of ``dtype``, if given).

    The dtype is not checked under autocast, where mixed dtypes are the point.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor of features, got dtype {x.dtype}; "
            f"token ids go through an nn.Embedding first"
        )
    if x.dim() != 3:
        hint = " (missing batch dimension? use x.unsqueeze(0))" if x.dim() == 2 else ""
        raise ValueError(
            f"{name} must have shape (N, L, d_model={d_model}), got {tuple(x.shape)}{hint}"
        )
    if x.size(-1) != d_model:
        raise ValueError(
            f"{name} has feature size {x.size(-1)}, expected d_model={d_model} "
            f"(shape {tuple(x.shape)}, expected (N, L, {d_model}))"
        )
    if dtype is not None and x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{name} has dtype {x.dtype}, but the model's weights are {dtype}; "
                        f"convert one of them (e.g. {name}.to({dtype}))")


def check_tokens(name: str, ids, vocab_size: int) -> None:
    """``ids`` must be an integer tensor (N, L) with values in [0, vocab_size)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype not in (torch.long, torch.int):  # nn.Embedding takes only these two
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {ids.dtype}")
    if ids.dim() != 2:
        hint = " (missing batch dimension? use ids.unsqueeze(0))" if ids.dim() == 1 else ""
        raise ValueError(f"{name} must have shape (N, L), got {tuple(ids.shape)}{hint}")
    if ids.size(1) == 0:
        raise ValueError(f"{name} must have at least one token per row, got shape "
                         f"{tuple(ids.shape)}, expected (N, L) with L >= 1")
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"{name} contains token id {bad}, outside the vocabulary [0, {vocab_size})"
            )


def check_same_batch(src, tgt) -> None:
    if src.size(0) != tgt.size(0):
        raise ValueError(
            f"src and tgt batch sizes differ: src has N={src.size(0)} "
            f"(shape {tuple(src.shape)}), tgt has N={tgt.size(0)} (shape {tuple(tgt.shape)})"
        )


def check_attention_inputs(query, key, value, d_model: int) -> None:
    """query (N, L_q, d_model) and key/value (N, L_k, d_model) with one N and one L_k."""
    check_features("query", query, d_model)
    check_features("key", key, d_model)
    check_features("value", value, d_model)
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(f"key and value must have the same (N, L_k), got {tuple(key.shape)} "
                         f"and {tuple(value.shape)}")
    if key.size(0) != query.size(0):
        raise ValueError(
            f"query and key batch sizes differ: {tuple(query.shape)} vs {tuple(key.shape)}"
        )
