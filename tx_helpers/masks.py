"""Attention masks. Convention everywhere: bool, True means "do not attend"."""
from __future__ import annotations

import torch

from ._checks import check_nonnegative_int, check_positive_int


def padding_mask(seq: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """Key-padding mask (N, 1, L): True where ``seq`` holds ``pad_idx``.

    The singleton query axis broadcasts over every query, so the same mask
    serves encoder self-attention (L_q = L_src) and cross-attention
    (L_q = L_tgt).
    """
    if not isinstance(seq, torch.Tensor):
        raise TypeError(f"seq must be a torch.Tensor of token ids (N, L), got {type(seq).__name__}")
    if seq.dim() != 2:
        raise ValueError(f"seq must be token ids of shape (N, L), got {tuple(seq.shape)}")
    return (seq == pad_idx).unsqueeze(1)  # (N, 1, L)


def lookahead_mask(size: int, device=None, *, past: int = 0) -> torch.Tensor:
    """Causal mask (size, past + size): True strictly above the diagonal.

    Query i (at absolute position past + i) may see keys 0 .. past + i.
    With ``past=0`` this is the square (L, L) look-ahead mask; ``past > 0``
    serves incremental decoding, where earlier keys come from a cache.
    """
    check_positive_int("size", size)
    check_nonnegative_int("past", past)  # a negative past silently gave a (L, L + past) mask
    ones = torch.ones(size, past + size, dtype=torch.bool, device=device)
    return torch.triu(ones, diagonal=past + 1)  # (L, past + L)


def decoder_self_mask(tgt: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """Decoder self-attention mask (N, L, L): padding OR look-ahead."""
    pad = padding_mask(tgt, pad_idx)  # (N, 1, L)
    causal = lookahead_mask(tgt.size(1), device=tgt.device)  # (L, L)
    return pad | causal  # (N, L, L)


def expand_mask(mask: torch.Tensor, n: int, n_heads: int, l_q: int, l_k: int) -> torch.Tensor:
    """Check ``mask`` and view it as 4-D, broadcastable to (N, H, L_q, L_k).

    Accepted: (L_q, L_k), (N, L_q, L_k), (N, 1, L_k) and any 4-D mask that
    broadcasts. A 3-D mask gets its head axis at dim 1.

    A 2-D mask always means (L_q, L_k). A key-padding mask (N, L_k), the
    shape ``torch.nn`` uses, has the same shape when N == L_q, and reading it
    as (L_q, L_k) would hide the wrong keys without any error. So a 2-D mask
    with N == L_q > 1 rows is refused: add the missing axis yourself,
    ``mask[None]`` (1, L_q, L_k) or ``mask[:, None]`` (N, 1, L_k).
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a bool tensor (True = do not attend), got dtype {mask.dtype}; "
            f"a 0/1 float mask is ambiguous and easily inverted: use mask.bool() "
            f"or build it with tx_helpers.padding_mask / lookahead_mask"
        )
    target = (n, n_heads, l_q, l_k)
    if mask.dim() == 2:
        if n == l_q > 1 and mask.size(0) == n:
            raise ValueError(
                f"a 2-D mask of shape {tuple(mask.shape)} is ambiguous when N == L_q == {n}: "
                f"it could be (L_q, L_k) or a key-padding mask (N, L_k); say which: "
                f"mask[None] gives (1, L_q, L_k), one mask for the whole batch, "
                f"mask[:, None] gives (N, 1, L_k), key padding (what tx.padding_mask returns)"
            )
        m = mask[None, None]
    elif mask.dim() == 3:
        m = mask.unsqueeze(1)
    elif mask.dim() == 4:
        m = mask
    else:
        raise ValueError(
            f"mask must be 2-D, 3-D or 4-D, got shape {tuple(mask.shape)}; "
            f"expected something that broadcasts to (N, H, L_q, L_k) = {target}"
        )
    if any(a != 1 and a != b for a, b in zip(m.shape, target, strict=True)):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores (N, H, L_q, L_k) = {target}; use (N, 1, L_k) for padding, "
            f"(L_q, L_k) or (N, L_q, L_k) otherwise"
        )
    return m
