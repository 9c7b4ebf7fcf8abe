"""Free-running decoding on token ids: greedy (with or without a key/value cache) and beam search.

The text-in, text-out helpers built on it (``translate``, ``exact_match_accuracy``) live
with the data, in :mod:`tx_helpers.data`.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ._checks import check_nonnegative_int, check_positive_int, check_tokens, checked_inputs
from .attention import KVCache
from .masks import padding_mask


def _check_decoding_args(model, src, bos_idx, eos_idx, max_len, pad_idx) -> int:
    """The checks both decoders run once per call; returns the pad id to fill with.

    Refused: ids outside the target vocabulary, BOS == EOS (every row would stop at
    once), EOS or BOS equal to PAD (the model masks pad positions as keys, so the
    cached and uncached paths would read the prefix differently), a ``pad_idx`` that
    is not the model's own (one source of truth: ``model.config.pad_idx``), an empty
    batch, and ``max_len`` beyond the positional table.
    """
    config = model.config
    check_tokens("src", src, config.src_vocab_size)
    if src.size(0) == 0:
        raise ValueError(f"src must hold at least one sequence, got shape {tuple(src.shape)}, "
                         f"expected (N, L_src) with N >= 1")
    check_positive_int("max_len", max_len)
    if max_len + 1 > config.max_len:
        raise ValueError(
            f"max_len={max_len} needs {max_len + 1} decoder positions, but the model's "
            f"positional table has max_len={config.max_len}"
        )
    if pad_idx is not None and pad_idx != config.pad_idx:
        raise ValueError(f"pad_idx={pad_idx} differs from the model's config.pad_idx="
                         f"{config.pad_idx}; leave pad_idx out, the model's own is used")
    pad_idx = config.pad_idx
    vocab = config.tgt_vocab_size
    for name, value in (("bos_idx", bos_idx), ("eos_idx", eos_idx)):
        check_nonnegative_int(name, value)
        if value >= vocab:
            raise ValueError(f"{name}={value} is outside the target vocabulary "
                             f"[0, {vocab}) of the model")
    if bos_idx == eos_idx:
        raise ValueError(f"bos_idx and eos_idx must differ, got {bos_idx} for both")
    for name, value in (("bos_idx", bos_idx), ("eos_idx", eos_idx)):
        if value == pad_idx:
            raise ValueError(f"{name}={value} is the model's pad id (config.pad_idx="
                             f"{pad_idx}); expected a token id other than padding")
    return pad_idx


@contextmanager
def _eval_mode(model):
    """Eval mode (no dropout) inside the block; the model's previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def greedy_decode(model, src, *, bos_idx: int, eos_idx: int, max_len: int,
                  pad_idx: int | None = None, use_cache: bool = True) -> torch.Tensor:
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
    pad_idx = _check_decoding_args(model, src, bos_idx, eos_idx, max_len, pad_idx)
    # inference mode: no autograd bookkeeping at all, less fixed cost per op than no_grad
    with _eval_mode(model), checked_inputs(), torch.inference_mode():
        src_mask = padding_mask(src, model.config.pad_idx)  # (N, 1, L_src)
        memory = model.encode(src, src_mask)  # (N, L_src, d_model)
        n, dev = src.size(0), src.device
        ys = torch.full((n, max_len + 1), pad_idx, dtype=torch.long, device=dev)  # (N, 1 + max_len)
        ys[:, 0] = bos_idx
        never = torch.tensor([pad_idx, bos_idx], device=dev)  # never predicted
        finished = torch.zeros(n, dtype=torch.bool, device=dev)
        cache = KVCache() if use_cache else None
        for t in range(1, max_len + 1):  # t = tokens in ys so far
            if use_cache:
                hidden = model.decode(ys[:, t - 1:t], memory, src_mask, cache=cache)  # (N, 1, d)
            else:
                hidden = model.decode(ys[:, :t], memory, src_mask)  # (N, t, d_model)
            logits = model.generator(hidden[:, -1])  # (N, V)
            logits.index_fill_(1, never, float("-inf"))
            next_token = logits.argmax(dim=-1).masked_fill_(finished, pad_idx)  # (N,)
            ys[:, t] = next_token
            finished |= next_token == eos_idx
            if bool(finished.all()):
                break
        ys = ys[:, :t + 1]  # (N, L) with L <= 1 + max_len
    return ys.clone()  # an ordinary tensor: inference-mode tensors cannot enter autograd


# ---------------------------------------------------------------- beam search

class BeamOutput(NamedTuple):
    """What :func:`beam_search` returns (unpacks as ``tokens, scores = ...``).

    ``tokens`` (N, beam_size, L): per source row, the hypotheses best first;
    column 0 is BOS, a finished hypothesis ends with EOS and is right-padded
    with ``pad_idx``; L is the longest hypothesis (at most max_len + 1).
    ``scores`` (N, beam_size), sorted descending along dim 1: the sum of the
    model's log-probabilities of the generated tokens (EOS included) divided by
    the GNMT length penalty ((5 + length) / 6) ** length_penalty, where length
    counts the generated tokens (EOS included, BOS not).
    """

    tokens: torch.Tensor
    scores: torch.Tensor


def gnmt_length_penalty(length, alpha: float):
    """Wu et al. (2016), eq. 14: lp(Y) = ((5 + |Y|) / 6) ** alpha. alpha = 0 gives 1."""
    return ((5 + length) / 6) ** alpha


def beam_search(model, src, *, bos_idx: int, eos_idx: int, max_len: int, beam_size: int = 4,
                length_penalty: float = 0.6, pad_idx: int | None = None,
                use_cache: bool = True) -> BeamOutput:
    """Beam search from ``src`` (N, L_src): keep the ``beam_size`` best prefixes per row.

    Each step extends every live prefix by every token and keeps the top
    2 * beam_size candidates by summed log-probability. Candidates
    ending in EOS that rank in the top beam_size join the row's pool of
    finished hypotheses, scored
    sum / ((5 + length) / 6) ** length_penalty; the best ``beam_size`` others
    stay live. A row is done once it holds ``beam_size`` finished hypotheses
    and its best live prefix, scored at its current length, does not beat the
    worst of them (Hugging Face's default ``early_stopping=False`` rule; stopping
    at the first ``beam_size`` finished hypotheses instead lets early, truncated
    outputs fill the pool before the real one ends). Rows still running at
    ``max_len`` add their live prefixes, penalised at length ``max_len``.
    Returns a :class:`BeamOutput` (tokens, scores), best first.

    ``beam_size=1`` is :func:`greedy_decode` exactly, for any length_penalty:
    the single live prefix always takes the argmax, and its first EOS fills the
    pool with a score no live prefix of the same length can beat. Scores use the
    model's own log-probabilities (softmax over the whole vocabulary); PAD and
    BOS are never chosen, as in greedy decoding.

    With ``use_cache=True`` the decoder sees only the newest token per step;
    after pruning, each layer's cached self-attention keys/values are
    reordered with the surviving prefixes' parent beam indices; the
    cross-attention keys/values are not reordered.
    """
    pad_idx = _check_decoding_args(model, src, bos_idx, eos_idx, max_len, pad_idx)
    check_positive_int("beam_size", beam_size)
    vocab_size = model.config.tgt_vocab_size
    if beam_size > vocab_size - 3:
        raise ValueError(
            f"beam_size={beam_size} is too large for tgt_vocab_size={vocab_size}: expected at "
            f"most {vocab_size - 3} (PAD, BOS and EOS cannot extend a live prefix)"
        )
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise TypeError(f"length_penalty must be a float >= 0, got "
                        f"{type(length_penalty).__name__} ({length_penalty!r})")
    if not (math.isfinite(length_penalty) and length_penalty >= 0):
        raise ValueError(f"length_penalty must be a finite number >= 0, got {length_penalty}")
    with _eval_mode(model), checked_inputs(), torch.inference_mode():  # as greedy_decode
        n, k, dev = src.size(0), beam_size, src.device
        src_mask = padding_mask(src, model.config.pad_idx)  # (N, 1, L_src)
        memory = model.encode(src, src_mask)  # (N, L_src, d_model)
        memory = memory.repeat_interleave(k, dim=0)  # (N*K, L_src, d_model)
        src_mask = src_mask.repeat_interleave(k, dim=0)  # (N*K, 1, L_src)
        neg_inf = float("-inf")
        score_dtype = torch.promote_types(memory.dtype, torch.float32)  # no float16 sums
        alive = torch.full((n, k, 1), bos_idx, dtype=torch.long, device=dev)  # (N, K, t)
        alive_scores = torch.full((n, k), neg_inf, dtype=score_dtype, device=dev)  # sums (N, K)
        alive_scores[:, 0] = 0.0  # one real start; the copies only exist to keep shapes fixed
        fin_tokens = torch.full((n, k, max_len + 1), pad_idx, dtype=torch.long, device=dev)
        fin_scores = torch.full((n, k), neg_inf, dtype=score_dtype, device=dev)  # sorted (N, K)
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        cache = KVCache() if use_cache else None
        rows = torch.arange(n, device=dev)[:, None] * k  # (N, 1) first flat index of each row
        for t in range(1, max_len + 1):  # t = generated tokens after this step
            flat = alive.view(n * k, t)  # (N*K, t)
            if use_cache:
                hidden = model.decode(flat[:, -1:], memory, src_mask, cache=cache)  # (N*K, 1, d)
            else:
                hidden = model.decode(flat, memory, src_mask)  # (N*K, t, d_model)
            logits = model.generator(hidden[:, -1])  # (N*K, V)
            logp = torch.log_softmax(logits, dim=-1, dtype=score_dtype)  # (N*K, V)
            logp[:, [pad_idx, bos_idx]] = neg_inf
            cand = alive_scores[:, :, None] + logp.view(n, k, vocab_size)  # (N, K, V)
            top_scores, top_idx = cand.view(n, k * vocab_size).topk(2 * k, dim=1)  # (N, 2K)
            parent, token = top_idx // vocab_size, top_idx % vocab_size  # (N, 2K)
            seqs = torch.cat([alive.gather(1, parent[:, :, None].expand(-1, -1, t)),
                              token[:, :, None]], dim=2)  # (N, 2K, t+1)
            is_eos = token == eos_idx  # (N, 2K)
            # finished: EOS candidates ranked in the top K (as in fairseq) join the pool;
            # an EOS ranked lower was beaten by K live continuations and is dropped
            in_top_k = torch.arange(2 * k, device=dev) < k  # (2K,)
            new_fin = torch.where(is_eos & in_top_k & ~done[:, None],
                                  top_scores / gnmt_length_penalty(t, length_penalty), neg_inf)
            seqs_padded = F.pad(seqs, (0, max_len - t), value=pad_idx)  # (N, 2K, max_len+1)
            fin_scores, sel = torch.cat([fin_scores, new_fin], 1).topk(k, dim=1)  # (N, K)
            fin_tokens = torch.cat([fin_tokens, seqs_padded], 1).gather(
                1, sel[:, :, None].expand(-1, -1, max_len + 1))  # (N, K, max_len+1)
            # live: the best K candidates that did not end in EOS (at most K of 2K did)
            alive_scores, pos = top_scores.masked_fill(is_eos, neg_inf).topk(k, dim=1)
            # done: K finished, and the best live prefix, scored at its current length,
            # does not beat the worst of them
            best_live = alive_scores[:, 0] / gnmt_length_penalty(t, length_penalty)
            done |= (fin_scores[:, -1] > neg_inf) & (fin_scores[:, -1] >= best_live)
            if bool(done.all()):
                break
            alive = seqs.gather(1, pos[:, :, None].expand(-1, -1, t + 1))  # (N, K, t+1)
            if use_cache:
                cache.reorder((rows + parent.gather(1, pos)).view(-1))  # parent flat indices
        else:  # max_len reached: unfinished rows also rank their live prefixes
            live = torch.where(done[:, None], neg_inf,
                               alive_scores / gnmt_length_penalty(max_len, length_penalty))
            fin_scores, sel = torch.cat([fin_scores, live], 1).topk(k, dim=1)
            fin_tokens = torch.cat([fin_tokens, alive], 1).gather(
                1, sel[:, :, None].expand(-1, -1, max_len + 1))
        length = int((fin_tokens != pad_idx).sum(-1).max())  # longest hypothesis, BOS included
    return BeamOutput(fin_tokens[:, :, :length].clone(), fin_scores.clone())  # ordinary tensors
