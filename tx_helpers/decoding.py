"""Free-running greedy decoding, with and without a key/value cache, and accuracy helpers."""
from __future__ import annotations

import torch

from ._checks import check_positive_int, check_tokens
from .data import pad_sequences
from .masks import padding_mask


@torch.no_grad()
def greedy_decode(model, src, *, bos_idx: int, eos_idx: int, max_len: int,
                  pad_idx: int | None = None, use_cache: bool = False) -> torch.Tensor:
    """Generate from ``src`` (N, L_src), one argmax token at a time.

    Returns ids (N, L) with L <= max_len + 1: column 0 is BOS, then up to
    ``max_len`` generated tokens. A row that has produced EOS is finished: the
    rest of it is ``pad_idx`` (default ``model.config.pad_idx``). The loop stops
    as soon as every row is finished.

    ``use_cache=False`` re-runs the decoder on the whole prefix at every step.
    ``use_cache=True`` encodes once and feeds only the newest token, reusing each
    layer's cached self-attention keys/values and the cross-attention keys/values
    computed from the memory at the first step; it returns the same tokens.

    PAD and BOS can never be predicted (neither is ever a training label), so
    they are excluded from the argmax. The model runs in eval mode (no dropout)
    and gets its previous mode back afterwards.
    """
    check_tokens("src", src, model.config.src_vocab_size)
    check_positive_int("max_len", max_len)
    if max_len + 1 > model.config.max_len:
        raise ValueError(
            f"max_len={max_len} needs {max_len + 1} decoder positions, but the model's "
            f"positional table has max_len={model.config.max_len}"
        )
    pad_idx = model.config.pad_idx if pad_idx is None else pad_idx
    was_training = model.training
    model.eval()
    try:
        src_mask = padding_mask(src, model.config.pad_idx)  # (N, 1, L_src)
        memory = model.encode(src, src_mask)  # (N, L_src, d_model)
        n = src.size(0)
        ys = torch.full((n, 1), bos_idx, dtype=torch.long, device=src.device)  # (N, 1)
        finished = torch.zeros(n, dtype=torch.bool, device=src.device)
        cache = {} if use_cache else None
        for _ in range(max_len):
            if use_cache:
                hidden = model.decode(ys[:, -1:], memory, src_mask, cache=cache)  # (N, 1, d)
            else:
                hidden = model.decode(ys, memory, src_mask)  # (N, L_so_far, d_model)
            logits = model.generator(hidden[:, -1])  # (N, V)
            logits[:, [pad_idx, bos_idx]] = float("-inf")
            next_token = logits.argmax(dim=-1)  # (N,)
            next_token = next_token.masked_fill(finished, pad_idx)
            ys = torch.cat([ys, next_token[:, None]], dim=1)  # (N, L_so_far + 1)
            finished |= next_token == eos_idx
            if bool(finished.all()):
                break
        return ys
    finally:
        model.train(was_training)


def translate(model, texts, vocab, *, max_len: int = 16, batch_size: int = 512,
              use_cache: bool = True, device=None) -> list[str]:
    """Greedy-decode a list of strings with a character ``vocab``; return strings."""
    device = device or next(model.parameters()).device
    out = []
    for i in range(0, len(texts), batch_size):
        chunk = texts[i:i + batch_size]
        src = pad_sequences([vocab.encode(t) for t in chunk], vocab.pad_idx)  # (N, L_src)
        ids = greedy_decode(model, src.to(device), bos_idx=vocab.bos_idx, eos_idx=vocab.eos_idx,
                            max_len=max_len, pad_idx=vocab.pad_idx, use_cache=use_cache)
        out.extend(vocab.decode_batch(ids.cpu()))
    return out


def exact_match(predictions, targets) -> float:
    """Share of predictions equal to their target string."""
    predictions, targets = list(predictions), list(targets)
    if len(predictions) != len(targets):
        raise ValueError(f"got {len(predictions)} predictions for {len(targets)} targets")
    return sum(p == t for p, t in zip(predictions, targets, strict=True)) / max(len(targets), 1)


def exact_match_accuracy(model, pairs, vocab, *, max_len: int = 16, batch_size: int = 512,
                         use_cache: bool = True, device=None) -> float:
    """Free-running greedy exact-match accuracy on [(source, target), ...] string pairs."""
    sources = [s for s, _ in pairs]
    targets = [t for _, t in pairs]
    predictions = translate(model, sources, vocab, max_len=max_len, batch_size=batch_size,
                            use_cache=use_cache, device=device)
    return exact_match(predictions, targets)

