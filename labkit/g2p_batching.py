"""Checks: notebook 13's lab, the part that changes with real data.

``check_g2p_batches(fn)``: ``fn(pairs, batch_size, *, seed=0, bucket=16)`` yields one epoch of
``(src, tgt_in, tgt_out)`` batches built from ``(word, phones)`` pairs, words of similar length
together. The check runs it on made-up pairs and reads the batches back: every batch full,
every pair at most once, the targets shifted, little padding, a shuffled order, the same
batches for the same seed.
"""
from __future__ import annotations

import math
import random

import torch

from tx_helpers import g2p_data
from tx_helpers.g2p import (
    LETTER_VOCAB,
    PHONES,
    make_g2p_batch,
)

from .code_ran import code_ran
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Report, _run_check

MISTAKES.update({
    "g2p_batch_not_triples": (
        "a batch is not three tensors (src, tgt_in, tgt_out)",
        "build each batch with the notebook's batch maker, as section 3 does"),
    "g2p_batch_ragged_kept": (
        "the ragged last batch is kept, so one batch is smaller than the others",
        "the contract drops the rest that does not fill a whole batch"),
    "g2p_batch_wrong_size": (
        "the number of batches, or the number of rows in a batch, is not what the contract says",
        "one epoch holds as many full batches as the pairs fill, each of exactly the batch size"),
    "g2p_batch_repeats_pairs": (
        "a pair appears in more than one batch of the epoch, or a row is not one of the pairs",
        "cut each bucket into consecutive, non-overlapping slices"),
    "g2p_batch_unshifted": (
        "the decoder input equals the labels: the target is not shifted by one, so the decoder "
        "can copy its input (notebook 10 shows what that does)",
        "the decoder reads the start token and the phones, and must predict the phones and the "
        "end token"),
    "g2p_batch_wrong_tensors": (
        "the tensors of a batch do not hold its pairs (letters, shifted phones, padding)",
        "build each batch from its pairs with the notebook's batch maker"),
    "g2p_batch_not_bucketed": (
        "the batches are not grouped by word length: about as much padding as random batches",
        "inside each bucket, order the pairs by word length before cutting it into batches"),
    "g2p_batch_no_shuffle": (
        "each batch holds pairs that are neighbours in the input list: the pairs are not mixed "
        "before they are grouped by length",
        "shuffle a copy of the pairs first, with a generator seeded from the seed argument"),
    "g2p_batch_order_sorted": (
        "the batches come out in order of word length (rising or falling)",
        "after cutting the batches, shuffle their order as well"),
    "g2p_batch_ignores_bucket": (
        "the bucket argument does not set how far the grouping by length reaches: bucket=1 "
        "should give about the padding of random batches, and the padding should fall as bucket "
        "grows",
        "group by length only within each run of shuffled pairs, as many as the bucket "
        "argument says batches"),
    "g2p_batch_mutates_pairs": (
        "the caller's list of pairs was reordered in place",
        "shuffle a copy: the caller's training pairs must keep their order"),
    "g2p_batch_not_reproducible": (
        "two calls with the same seed give different batches",
        "draw every random choice from a generator seeded from the seed argument, not from the "
        "global random state"),
    "g2p_batch_ignores_seed": (
        "different seeds give the same batches",
        "seed the generator from the seed argument"),
})


def _made_up_pairs(n: int = 300, seed: int = 0) -> list[tuple[str, list[str]]]:
    """Distinct made-up words of 2-13 letters with random phones, in alphabetical order."""
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                          for _ in range(rng.randint(2, 13))))
    return [(w, [rng.choice(PHONES) for _ in range(max(1, len(w) - rng.randint(0, 2)))])
            for w in sorted(words)]


def _word(row) -> str:
    return "".join(LETTER_VOCAB.decode_tokens(row))


def _epoch(report, fn, pairs, batch_size, seed, bucket) -> list:
    what = f"fn(pairs, {batch_size}, seed={seed}, bucket={bucket})"
    # the check never calls the reference batcher, so a run of it is the learner's, even when
    # its generator is handed back and only the check iterates it (the grade's watch then sees
    # the lab kit as the caller)
    with code_ran(lambda code: code is g2p_data.g2p_batches.__code__) as runs:
        out = _call(report, what, fn, pairs, batch_size, seed=seed, bucket=bucket)
        batches = _call(report, f"iterating over {what}", list, out)
    if runs.found:
        report.mistake("delegated", "its batches come from tx_helpers' g2p_batches, the "
                       "reference this exercise rebuilds")
    return batches


def _padding(batches) -> float:
    """The share of padded letter slots in these batches."""
    return sum((b[0] == LETTER_VOCAB.pad_idx).sum().item() for b in batches) / max(
        sum(b[0].numel() for b in batches), 1)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b, strict=True)
                                    for x, y in zip(p, q, strict=True))


def _rank_correlation(values) -> float:
    """Spearman's rank correlation of ``values`` with their positions (tied values share the
    mean of their ranks); 0 for fewer than two distinct values."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    n = len(values)
    mean = (n - 1) / 2
    cov = sum((r - mean) * (p - mean) for p, r in enumerate(ranks))
    spread = math.sqrt(sum((r - mean) ** 2 for r in ranks) * sum((p - mean) ** 2
                                                                   for p in range(n)))
    return cov / spread if spread > 0 else 0.0


def check_g2p_batches(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(pairs, batch_size, *, seed=0, bucket=16)``: one epoch of bucketed batches."""

    def body(report: _Report):
        pairs, batch_size, bucket = _made_up_pairs(), 8, 8
        given = list(pairs)
        batches = _epoch(report, fn, given, batch_size, 0, bucket)
        if given != pairs:
            report.mistake("g2p_batch_mutates_pairs")
        triples = all(isinstance(b, (tuple, list)) and len(b) == 3
                      and all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in b)
                      for b in batches)
        if not report.probe(triples and batches, "every batch is (src, tgt_in, tgt_out), "
                            "each a 2-D tensor"):
            report.mistake("g2p_batch_not_triples")
            return
        full = len(pairs) // batch_size
        sizes = [b[0].size(0) for b in batches]
        if not report.probe(sizes == [batch_size] * full, f"{full} batches of {batch_size} "
                            f"rows from {len(pairs)} pairs (the rest dropped)"):
            ragged = len(sizes) == full + 1 and sorted(sizes)[1:] == [batch_size] * full
            report.mistake("g2p_batch_ragged_kept" if ragged else "g2p_batch_wrong_size",
                           f"got {len(sizes)} batches of sizes {sorted(set(sizes))}")
        phones = dict(pairs)
        index = {w: i for i, (w, _) in enumerate(pairs)}
        rows = [[_word(r) for r in b[0].tolist()] for b in batches]
        seen = [w for group in rows for w in group]
        if not report.probe(len(seen) == len(set(seen)) and set(seen) <= set(phones),
                            "every row is one of the pairs, and no pair comes twice"):
            report.mistake("g2p_batch_repeats_pairs")
            return
        want = [make_g2p_batch([(w, phones[w]) for w in group]) for group in rows]
        if not report.probe(_same(batches, want), "each batch holds its pairs: letters, then "
                            "<bos> + phones in, phones + <eos> out, padded with 0"):
            shifted = any(b[1].shape == b[2].shape and torch.equal(b[1], b[2]) for b in batches)
            report.mistake("g2p_batch_unshifted" if shifted else "g2p_batch_wrong_tensors")
            return
        padding = _padding(batches)
        rng = random.Random(0)
        shuffled = rng.sample(pairs, len(pairs))
        random_batches = [make_g2p_batch(shuffled[i:i + batch_size])[0]
                          for i in range(0, full * batch_size, batch_size)]
        baseline = sum((s == LETTER_VOCAB.pad_idx).sum().item() for s in random_batches) / sum(
            s.numel() for s in random_batches)
        if not report.probe(padding < 0.5 * baseline, f"little padding: {padding:.0%} of the "
                            f"letter slots, against {baseline:.0%} for random batches"):
            report.mistake("g2p_batch_not_bucketed")
        spans = [max(index[w] for w in g) - min(index[w] for w in g) for g in rows]
        if not report.probe(max(spans) >= bucket * batch_size,
                            "a batch's pairs come from all over the input list"):
            report.mistake("g2p_batch_no_shuffle")
        by_bucket = {b: _padding(_epoch(report, fn, list(pairs), batch_size, 0, b))
                     for b in (1, 2, len(pairs) // batch_size)}  # the last: the whole list
        spread = " -> ".join(f"{b}: {v:.0%}" for b, v in by_bucket.items())
        one, two, whole = by_bucket.values()
        if not report.probe(one > 0.7 * baseline and one > two > whole,
                            f"bucket sets the reach of the grouping: padding for bucket {spread}"
                            f" (bucket=1 about random batches' {baseline:.0%}, then falling)"):
            report.mistake("g2p_batch_ignores_bucket")
        # bucket = the whole list: unshuffled batches come out sorted, rising or falling
        rhos = [_rank_correlation(
            [(b[0] != LETTER_VOCAB.pad_idx).sum().item() / b[0].size(0) for b in _epoch(
                report, fn, list(pairs), batch_size, seed, len(pairs) // batch_size)])
            for seed in (0, 1, 2)]
        rho = sum(rhos) / len(rhos)
        if not report.probe(abs(rho) < 0.5, "the order of the batches does not follow word "
                            "length (bucket = the whole list, 3 seeds: rank correlation of a "
                            f"batch's length with its place {rho:+.2f}; sorted gives +1 or -1, "
                            "shuffled about 0)"):
            report.mistake("g2p_batch_order_sorted")
        again = _epoch(report, fn, list(pairs), batch_size, 0, bucket)
        other = _epoch(report, fn, list(pairs), batch_size, 1, bucket)
        if not report.probe(_same(batches, again), "the same seed gives the same batches"):
            report.mistake("g2p_batch_not_reproducible")
        elif not report.probe(not _same(batches, other), "another seed gives other batches"):
            report.mistake("g2p_batch_ignores_seed")

    return _run_check("check_g2p_batches", body, verbose, fn)
