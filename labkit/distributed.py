"""Checks for notebook 12's lab: the loss and the optimizer step of data-parallel training.

- :func:`check_token_mean_loss` grades ``fn(logits, target, pad_idx, global_tokens, world_size)``,
  one rank's loss. DDP averages the ranks' gradients, so the average over ranks of the gradients of
  ``fn`` must equal the gradient of the single-process mean over every non-pad token of the global
  batch. The check simulates the ranks in one process (a shared linear layer per rank, ragged token
  counts, pad index 0 and 2) and names the likely mistakes: a per-rank mean, a sum without the
  factor ``world_size``, pads counted, a plain sum, a pad index fixed at 0. The project's own
  answer, ``tools/train_ddp.py``'s ``GlobalTokenMeanLoss``, is the reference: learner code that
  runs it fails as ``delegated``.

:func:`check_amp_step`, the mixed-precision step of the same lab, is in :mod:`labkit.amp`.
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from . import mistakes_loss_decoding  # noqa: F401 - defines loss_detached
from .code_ran import code_ran
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Report, _run_check

MISTAKES.update({
    "dist_per_rank_mean": ("each rank takes the mean over its own tokens",
                           "DDP averages the ranks' gradients with equal weight, whatever their "
                           "token counts; the global mean weighs every token equally"),
    "dist_missing_world_size": ("the loss is sum / global_tokens without the factor world_size",
                                "DDP divides the summed gradients by the number of ranks; the "
                                "per-rank loss has to make up for that"),
    "dist_pads_counted": ("padding positions are counted in the loss",
                          "padding positions are not predictions: they are left out of the loss"),
    "dist_plain_sum": ("the loss is a plain sum over the rank's tokens",
                       "a plain sum grows with the batch: the loss must be normalised by the "
                       "global token count"),
    "dist_pad_hard_coded": ("the padding index is fixed in your code, not read from pad_idx",
                            "the pad index is an argument: another vocabulary pads with another "
                            "id, so leave out the positions that hold the given pad index"),
    "dist_label_smoothing": ("the loss uses label smoothing",
                             "this lab's loss is plain cross-entropy, without label smoothing "
                             "(unlike section 1's criterion): the check compares with that; your "
                             "scaling by the counts is the part to keep"),
    "dist_wrong_value": ("the rank's loss does not have the value that makes the ranks' "
                         "averaged gradient the global token mean's",
                         "compare your rank's value with the per-rank share of the global mean, "
                         "rank by rank"),
})


# ---------------------------------------------------------------------------- token-mean loss

# tools/train_ddp.py holds the project's answer (GlobalTokenMeanLoss): running it is delegation
_TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                     "train_ddp.py")


def _ranks(world: int, gen: torch.Generator, pad: int = 0):
    """Per-rank (hidden (N, L, d), target (N, L)) with ragged targets padded with ``pad``, V = 7."""
    shares, lengths = [], [(2, 5), (6, 6), (1, 3), (4, 2)]
    for rank in range(world):
        hidden = torch.randn(2, 6, 5, generator=gen)  # (N=2, L=6, d=5)
        target = torch.randint(1, 7, (2, 6), generator=gen)  # (N, L), pads added below
        target[target == pad] = 0  # real tokens never equal the pad index
        for row, keep in enumerate(lengths[rank % len(lengths)]):
            target[row, keep:] = pad
        shares.append((hidden, target))
    return shares


def _grads(loss_fn, shares, weight, world, total, pad=0):
    """Per-rank loss values and DDP's averaged gradient of a shared (V, d) weight."""
    values, grad = [], torch.zeros_like(weight)
    for hidden, target in shares:
        w = weight.clone().requires_grad_(True)
        logits = hidden @ w.T  # (N, L, V)
        loss = loss_fn(logits, target, pad, total, world)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"expected a one-element tensor loss, got {type(loss).__name__}")
        values.append(loss.item())
        if not loss.requires_grad:
            grad = None  # nothing to average: the loss was cut from the graph
            continue
        loss.reshape(()).backward()
        if grad is not None:
            grad += w.grad
    return values, (grad / world if grad is not None else None)


def _reference(logits, target, pad_idx, global_tokens, world_size):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_idx,
                           reduction="sum") * world_size / global_tokens


_LOSS_VARIANTS = {
    "dist_per_rank_mean": lambda lg, t, p, T, W: F.cross_entropy(
        lg.flatten(0, 1), t.flatten(), ignore_index=p),
    "dist_missing_world_size": lambda lg, t, p, T, W: F.cross_entropy(
        lg.flatten(0, 1), t.flatten(), ignore_index=p, reduction="sum") / T,
    "dist_pads_counted": lambda lg, t, p, T, W: F.cross_entropy(
        lg.flatten(0, 1), t.flatten(), reduction="sum") * W / T,
    "dist_plain_sum": lambda lg, t, p, T, W: F.cross_entropy(
        lg.flatten(0, 1), t.flatten(), ignore_index=p, reduction="sum"),
}


def _uniform_target(logits, target, pad_idx, global_tokens, world_size):
    """The right scaling of the cross-entropy against a uniform target (label smoothing 1)."""
    logp = F.log_softmax(logits, dim=-1)  # (N, L, V)
    return -(logp.mean(-1) * (target != pad_idx)).sum() * world_size / global_tokens


def _smoothed(got, shares, weight, world, total, pad=0) -> bool:
    """Whether the values are the right per-rank share of a label-smoothed token mean.

    Label smoothing eps makes the loss (1 - eps) * plain + eps * uniform-target, linear in eps:
    solve eps on rank 0, then test it on every rank."""
    with torch.enable_grad():
        plain, _ = _grads(_reference, shares, weight, world, total, pad)
        uniform, _ = _grads(_uniform_target, shares, weight, world, total, pad)
    if abs(uniform[0] - plain[0]) < 1e-6:
        return False
    eps = (got[0] - plain[0]) / (uniform[0] - plain[0])
    return 1e-3 < eps < 1 and all(
        math.isclose(g, a + eps * (b - a), rel_tol=1e-4, abs_tol=1e-6)
        for g, a, b in zip(got, plain, uniform, strict=True))


def check_token_mean_loss(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(logits, target, pad_idx, global_tokens, world_size) -> loss``, one rank's loss.

    ``logits`` (N, L, V), ``target`` (N, L) with ``pad_idx`` for padding, ``global_tokens`` the
    non-pad target count of the whole global batch (all ranks), ``world_size`` the number of
    ranks. Averaged over ranks (what DDP does to gradients), the gradients of ``fn`` must equal
    those of the mean over all the global batch's tokens, for 2 and 3 ranks with different token
    counts per rank, and for a pad index other than 0 on 3 ranks.
    """

    def body(report: _Report):
        for world, pad in ((2, 0), (3, 0), (3, 2)):
            gen = torch.Generator().manual_seed(20 + world)
            shares = _ranks(world, gen, pad)
            weight = torch.randn(7, 5, generator=gen)  # (V, d), shared by every rank
            tokens = [int((t != pad).sum()) for _, t in shares]
            total = sum(tokens)
            where = f"{world} ranks" + (f", pad index {pad}" if pad else "")
            ran_tool = code_ran(lambda code: os.path.abspath(code.co_filename) == _TOOL)
            with torch.enable_grad(), ran_tool as tool:
                got, got_grad = _call(report, f"your loss on {where}", _grads, fn,
                                      shares, weight, world, total, pad)
            if tool.found:
                report.probe(False, "your loss is built from the lab's operations, not from "
                             "the project's own answer")
                report.mistake("delegated", "it runs tools/train_ddp.py's GlobalTokenMeanLoss, "
                               "the project's answer to this lab")
                return
            with torch.enable_grad():
                if got_grad is None:
                    report.probe(False, f"{where}: the loss carries a gradient")
                    report.mistake("loss_detached")
                    return
                want, want_grad = _grads(_reference, shares, weight, world, total, pad)
                target = torch.cat([t for _, t in shares])  # one process, all rows
                w1 = weight.clone().requires_grad_(True)
                F.cross_entropy((torch.cat([h for h, _ in shares]) @ w1.T).flatten(0, 1),
                                target.flatten(), ignore_index=pad).backward()
            same_grad = torch.allclose(got_grad, w1.grad, rtol=1e-4, atol=1e-6)
            assert torch.allclose(want_grad, w1.grad, rtol=1e-4, atol=1e-6)
            report.probe(same_grad, f"{world} ranks holding {tokens} tokens"
                         + (f", pad index {pad}" if pad else "") + ": the ranks' averaged "
                         "gradient equals the single-process token mean's")
            close = all(math.isclose(g, w, rel_tol=1e-4, abs_tol=1e-6)
                        for g, w in zip(got, want, strict=True))
            report.probe(close, f"{where}: each rank's loss has the value the global "
                         f"token mean requires ({[round(v, 4) for v in want]}); got "
                         f"{[round(v, 4) for v in got]}")
            if same_grad and close:
                continue
            variants = dict(_LOSS_VARIANTS)
            if pad:
                variants["dist_pad_hard_coded"] = lambda lg, t, p, T, W: _reference(lg, t, 0, T, W)
            for key, variant in variants.items():
                with torch.enable_grad():
                    values, _ = _grads(variant, shares, weight, world, total, pad)
                if all(math.isclose(g, v, rel_tol=1e-4, abs_tol=1e-6)
                       for g, v in zip(got, values, strict=True)):
                    report.mistake(key)
                    break
            else:
                smoothed = _smoothed(got, shares, weight, world, total, pad)
                report.mistake("dist_label_smoothing" if smoothed else "dist_wrong_value")
            return  # one diagnosis is enough

    return _run_check("check_token_mean_loss", body, verbose, fn)


# ---------------------------------------------------------------------------- AMP step


__all__ = ["check_token_mean_loss"]
