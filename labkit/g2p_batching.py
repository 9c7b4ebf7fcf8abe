"""Checks: notebook 13's lab, the part that changes with real data.

``check_g2p_batches(fn)``: ``fn(pairs, batch_size, *, seed=0, bucket=16)`` yields one epoch of
``(src, tgt_in, tgt_out)`` batches built from ``(word, phones)`` pairs, words of similar length
together. The check runs it on made-up pairs and reads the batches back: every batch full,
every pair at most once, the targets shifted, little padding, a shuffled order, the same
batches for the same seed.

``check_g2p_training(fn, ...)``: ``fn(recipe, batches) -> (model, history)`` trains the recipe's
model (built by the notebook's set-up: Adam and the Noam schedule) on the first
``recipe["steps"]`` batches with ``tx.train`` and returns the *average* of the weights at the last
``recipe["average_last"]`` checkpoints, ``recipe["average_every"]`` steps apart, the last one after
the final step (the paper's checkpoint averaging). The check runs it on a tiny recipe and
compares the history and the returned weights with the reference run (and with its usual wrong
variants: no copy of the checkpoints, checkpoints at the wrong steps); given the notebook's
trained model it also scores the validation WER of the short run against a stated margin.
"""
from __future__ import annotations

import itertools
import math
import random
import sys

import torch

from tx_helpers import g2p_data
from tx_helpers.g2p import (
    LETTER_VOCAB,
    LIVE_RECIPE,
    PHONES,
    evaluate,
    g2p_model_config,
    make_g2p_batch,
)
from tx_helpers.model import Transformer
from tx_helpers.training import History, noam_scheduler, paper_adam, train

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
    "g2p_train_wrong_steps": (
        "the history does not have one entry per step of the recipe",
        "train on exactly as many batches as the recipe's steps"),
    "g2p_train_no_scheduler": (
        "the learning rate never changes: the Noam schedule is not passed to the training call",
        "pass the scheduler to the training call: the optimizer's base rate is 1.0 and only "
        "the schedule scales it"),
    "g2p_train_wrong_schedule": (
        "the learning rates differ from the recipe's Noam schedule",
        "build the schedule from the model's d_model and the recipe's warmup, factor, cooldown "
        "and steps"),
    "g2p_train_not_seeded": (
        "the first loss differs from the reference: the model was not built right after seeding "
        "with the recipe's seed (or with another config)",
        "seed with the recipe's seed, then build the model from the recipe's model settings"),
    "g2p_train_label_smoothing": (
        "the loss is not the recipe's label-smoothed loss",
        "pass the recipe's label smoothing to the training call"),
    "g2p_train_no_clipping": (
        "the gradients are not clipped at the recipe's norm",
        "pass the recipe's clip_norm to the training call"),
    "g2p_train_wrong_return": (
        "the function does not return (the trained model, its History)",
        "return the model you trained and the History the training call gave back"),
    "g2p_avg_final_weights": (
        "the returned weights are the final step's, not an average: either nothing is averaged, "
        "or every checkpoint you kept is the model's live tensors (a state dict holds references "
        "to the weights, which the following steps overwrite)",
        "keep a copy of each checkpoint's tensors, detached from the model, and average those"),
    "g2p_avg_wrong_steps": (
        "the returned weights are an average, but of checkpoints taken after other steps than "
        "the recipe's (off by one, not average_every apart, or too many)",
        "the last checkpoint is the one after the final step; count back the spacing "
        "between checkpoints for each earlier one"),
    "g2p_avg_not_eval": (
        "the returned model is still in training mode",
        "return the model in evaluation mode, as the contract says"),
    "g2p_run_wer_above_margin": (
        "the validation WER of the short run is above the margin a correct run stays under",
        "run the two checks above first; then look at the loss curve and the learning rate"),
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


class _ReferenceRuns:
    """Context manager: ``found`` is True once ``tx.g2p.g2p_batches``'s code runs. The check
    itself never calls it, so a run is the learner's, even when its generator is handed back
    (wrapped or not) and only the check iterates it, where the grade's watch sees the lab kit as
    the caller. Chained with any profile hook already set."""

    def __init__(self):
        self.found = False

    def __enter__(self):
        self._previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def _hook(self, frame, event, arg):
        if self._previous is not None:
            self._previous(frame, event, arg)
        if event == "call" and frame.f_code is g2p_data.g2p_batches.__code__:
            self.found = True

    def __exit__(self, *exc):
        sys.setprofile(self._previous)
        return False


def _epoch(report, fn, pairs, batch_size, seed, bucket) -> list:
    what = f"fn(pairs, {batch_size}, seed={seed}, bucket={bucket})"
    with _ReferenceRuns() as runs:
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


# ---------------------------------------------------------------- the training call

TINY_RECIPE = {**LIVE_RECIPE, "steps": 4, "batch_size": 8, "warmup": 2, "clip_norm": 0.05,
               "average_last": 2, "average_every": 2,  # the checkpoints after steps 2 and 4
               "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
                         "dropout": 0.0, "norm_first": True}}


def _reference(recipe, batches, *, label_smoothing=None, clip_norm=-1.0, schedule=True,
               states=None):
    """The reference short run (and, through its keywords, the usual wrong variants): the model
    holds the average of the recipe's checkpoints. ``states``, a dict, receives a copy of the
    weights after every step (step number -> state dict)."""
    torch.manual_seed(recipe["seed"])
    model = Transformer(g2p_model_config(**recipe["model"]))
    optimizer = paper_adam(model.parameters())
    scheduler = noam_scheduler(optimizer, model.config.d_model, recipe["warmup"],
                               recipe["factor"], cooldown=recipe["cooldown"],
                               total=recipe["steps"]) if schedule else None
    states = {} if states is None else states

    def keep(history):
        states[len(history)] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    history = train(model, itertools.islice(batches, recipe["steps"]), optimizer, scheduler,
                    label_smoothing=recipe["label_smoothing"] if label_smoothing is None
                    else label_smoothing,
                    clip_norm=recipe["clip_norm"] if clip_norm == -1.0 else clip_norm,
                    callback=keep)
    model.load_state_dict(_mean_state([states[s] for s in _checkpoint_steps(recipe)
                                       if s in states]))
    return model.eval(), history


def _checkpoint_steps(recipe) -> list[int]:
    """The steps after which the recipe's averaged checkpoints are taken, the last one last."""
    steps, every = recipe["steps"], recipe.get("average_every", 1)
    return [steps - every * i for i in reversed(range(recipe.get("average_last", 1)))
            if steps - every * i > 0]


def _mean_state(states: list[dict]) -> dict:
    return {k: torch.stack([s[k].double() for s in states]).mean(0).to(states[0][k].dtype)
            for k in states[0]}


def _same_weights(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(
        got[k].shape == want[k].shape and torch.allclose(got[k].double(), want[k].double(),
                                                         rtol=1e-5, atol=1e-6) for k in want)


def _close(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(y))
                                    for x, y in zip(a, b, strict=True))


def check_g2p_training(fn, *, model=None, words=None, lexicon=None, max_wer: float | None = None,
                       verbose: bool = True) -> CheckResult:
    """Check ``fn(recipe, batches) -> (model, history)`` against the reference short run.

    With ``model``, ``words``, ``lexicon`` and ``max_wer`` (the notebook's trained model, the
    validation words and the margin), also score that model's greedy WER on ``words``.
    """

    def body(report: _Report):
        pairs = _made_up_pairs(80, seed=1)
        batches = [make_g2p_batch(pairs[i:i + 8]) for i in range(0, 48, 8)]  # 6 > 4 steps
        with torch.enable_grad():
            out = _call(report, "fn(recipe, batches) on a tiny recipe", fn, dict(TINY_RECIPE),
                        iter(batches))
            states = {}
            want_model, want = _reference(TINY_RECIPE, iter(batches), states=states)
        if not report.probe(isinstance(out, tuple) and len(out) == 2
                            and isinstance(out[0], torch.nn.Module)
                            and isinstance(out[1], History), "returns (model, History)"):
            report.mistake("g2p_train_wrong_return", f"got {type(out).__name__}")
            return
        got_model, got = out
        steps = TINY_RECIPE["steps"]
        if not report.probe(len(got) == steps, f"{steps} steps for a recipe of {steps} steps "
                            f"(given {len(batches)} batches)"):
            report.mistake("g2p_train_wrong_steps", f"got {len(got)}")
            return
        if not report.probe(_close(got.lr, want.lr), "the learning rate follows the recipe's "
                            "Noam schedule"):
            constant = len(set(round(x, 12) for x in got.lr)) == 1
            report.mistake("g2p_train_no_scheduler" if constant else "g2p_train_wrong_schedule")
        if not report.probe(_close(got.loss, want.loss), "the losses equal the reference run's"):
            with torch.enable_grad():
                variants = {
                    "g2p_train_label_smoothing": _reference(TINY_RECIPE, iter(batches),
                                                            label_smoothing=0.0)[1].loss,
                    "g2p_train_no_clipping": _reference(TINY_RECIPE, iter(batches),
                                                        clip_norm=None)[1].loss,
                }
            named = [k for k, v in variants.items() if _close(got.loss, v)]
            first = abs(got.loss[0] - want.loss[0]) > 1e-5 * max(1.0, abs(want.loss[0]))
            report.mistake(named[0] if named else
                           "g2p_train_not_seeded" if first and got.lr and _close(got.lr, want.lr)
                           else "mismatch")
            return  # another run: its weights say nothing about the averaging
        got_state = {k: v.detach() for k, v in got_model.state_dict().items()}
        chosen = _checkpoint_steps(TINY_RECIPE)
        if not report.probe(_same_weights(got_state, want_model.state_dict()),
                            f"the returned weights are the mean of the checkpoints after steps "
                            f"{' and '.join(map(str, chosen))}"):
            final = states.get(steps)
            others = [c for n in range(2, steps + 1) for c in itertools.combinations(
                range(1, steps + 1), n) if list(c) != chosen and all(s in states for s in c)]
            if final is not None and _same_weights(got_state, final):
                report.mistake("g2p_avg_final_weights")
            elif any(_same_weights(got_state, _mean_state([states[s] for s in c]))
                     for c in others):
                report.mistake("g2p_avg_wrong_steps")
            else:
                report.mistake("g2p_train_wrong_return", "its weights are none of the run's "
                               "checkpoints, nor an average of them")
        elif not report.probe(not got_model.training, "the returned model is in evaluation mode"):
            report.mistake("g2p_avg_not_eval")
        if model is None:
            return
        result = evaluate(list(words), model=model, lexicon=lexicon)
        ok = math.isfinite(result["wer"]) and result["wer"] <= max_wer
        if not report.probe(ok, f"your short run's validation WER is below the {max_wer:.0%} "
                            f"margin (on {result['words']:,} validation words)"):
            report.mistake("g2p_run_wer_above_margin", f"WER {result['wer']:.1%}")

    return _run_check("check_g2p_training", body, verbose, fn)
