"""Checks for notebook 12's lab: the loss and the optimizer step of data-parallel training.

- :func:`check_token_mean_loss` grades ``fn(logits, target, pad_idx, global_tokens, world_size)``,
  one rank's loss. DDP averages the ranks' gradients, so the average over ranks of the gradients of
  ``fn`` must equal the gradient of the single-process mean over every non-pad token of the global
  batch. The check simulates the ranks in one process (a shared linear layer per rank, ragged token
  counts) and names the likely mistakes: a per-rank mean, a sum without the factor ``world_size``,
  pads counted, a plain sum.
- :func:`check_amp_step` grades ``fn(loss, model, optimizer, scaler, clip_norm) -> (grad_norm,
  skipped)``, the rest of a mixed-precision step after the forward pass: scale the loss, backward,
  unscale, clip, step through the scaler, update the scale, and say whether the scaler skipped the
  step. It runs the learner's step with a real ``torch.amp.GradScaler`` (on the CPU) and compares
  the weights and the scale with the right order and with the known wrong ones (clipping before
  unscaling, no unscale, update before step, ``optimizer.step()`` that bypasses the scaler, no loss
  scaling); a step whose loss is infinite must be skipped and reported as skipped, and the finite
  steps (whose scale grows here) as not skipped.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from . import mistakes_loss_decoding  # noqa: F401 - defines loss_detached
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Failed, _Report, _run_check

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
    "dist_wrong_value": ("the rank's loss does not have the value that makes the ranks' "
                         "averaged gradient the global token mean's",
                         "compare your rank's value with the per-rank share of the global mean, "
                         "rank by rank"),
    "amp_clip_before_unscale": ("the gradients were clipped while still multiplied by the "
                                "loss scale",
                                "while the gradients still carry the loss scale, their norm is "
                                "that of the scaled gradients, not the true ones"),
    "amp_no_unscale": ("the gradients are never unscaled before clipping",
                       "clipping must see the true gradients, so the loss scale has to be taken "
                       "out first"),
    "amp_update_before_step": ("scaler.update() ran before scaler.step(optimizer)",
                               "the scaler decides whether to skip the step from this step's "
                               "gradients, and only then adapts the scale"),
    "amp_optimizer_step_bypasses_scaler": ("optimizer.step() was called directly",
                                           "an update must go through the scaler, which skips it "
                                           "when a gradient is inf or NaN"),
    "amp_no_loss_scaling": ("backward ran on the unscaled loss",
                            "small float16 gradients underflow to zero unless the loss is scaled "
                            "up before backward"),
    "amp_no_update": ("scaler.update() is never called",
                      "the scale adapts once per step, after the update"),
    "amp_overflow_not_skipped": ("a step with an infinite loss changed the weights",
                                 "a step whose gradients hold inf or NaN must leave the weights "
                                 "unchanged: the scaler decides that"),
    "amp_grad_norm": ("the returned gradient norm is not the norm of the true gradients before "
                      "clipping",
                      "the norm to return is that of the true gradients, measured before clipping"),
    "amp_not_a_pair": ("the step does not return the pair (grad_norm, skipped)",
                       "return two values: the true gradient norm before clipping, and True or "
                       "False for whether the scaler skipped this step"),
    "amp_skipped_flag": ("the returned skipped flag does not say whether the scaler skipped "
                         "the step",
                         "it must be True exactly on a step whose true gradients held inf or "
                         "NaN (the weights stay unchanged), and False on every other step, "
                         "including one where the scale grows"),
})


# ---------------------------------------------------------------------------- token-mean loss

def _ranks(world: int, gen: torch.Generator):
    """Per-rank (hidden (N, L, d), target (N, L)) with ragged, padded targets; pad 0, V = 7."""
    shares, lengths = [], [(2, 5), (6, 6), (1, 3), (4, 2)]
    for rank in range(world):
        hidden = torch.randn(2, 6, 5, generator=gen)  # (N=2, L=6, d=5)
        target = torch.randint(1, 7, (2, 6), generator=gen)  # (N, L), pad 0 added below
        for row, keep in enumerate(lengths[rank % len(lengths)]):
            target[row, keep:] = 0
        shares.append((hidden, target))
    return shares


def _grads(loss_fn, shares, weight, world, total):
    """Per-rank loss values and DDP's averaged gradient of a shared (V, d) weight."""
    values, grad = [], torch.zeros_like(weight)
    for hidden, target in shares:
        w = weight.clone().requires_grad_(True)
        logits = hidden @ w.T  # (N, L, V)
        loss = loss_fn(logits, target, 0, total, world)
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


def check_token_mean_loss(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(logits, target, pad_idx, global_tokens, world_size) -> loss``, one rank's loss.

    ``logits`` (N, L, V), ``target`` (N, L) with ``pad_idx`` for padding, ``global_tokens`` the
    non-pad target count of the whole global batch (all ranks), ``world_size`` the number of
    ranks. Averaged over ranks (what DDP does to gradients), the gradients of ``fn`` must equal
    those of the mean over all the global batch's tokens, for 2 and 3 ranks with different token
    counts per rank.
    """

    def body(report: _Report):
        for world in (2, 3):
            gen = torch.Generator().manual_seed(20 + world)
            shares = _ranks(world, gen)
            weight = torch.randn(7, 5, generator=gen)  # (V, d), shared by every rank
            tokens = [int((t != 0).sum()) for _, t in shares]
            total = sum(tokens)
            with torch.enable_grad():
                got, got_grad = _call(report, f"your loss on {world} ranks", _grads, fn,
                                      shares, weight, world, total)
                if got_grad is None:
                    report.probe(False, f"{world} ranks: the loss carries a gradient")
                    report.mistake("loss_detached")
                    return
                want, want_grad = _grads(_reference, shares, weight, world, total)
                target = torch.cat([t for _, t in shares])  # one process, all rows
                w1 = weight.clone().requires_grad_(True)
                F.cross_entropy((torch.cat([h for h, _ in shares]) @ w1.T).flatten(0, 1),
                                target.flatten(), ignore_index=0).backward()
            same_grad = torch.allclose(got_grad, w1.grad, rtol=1e-4, atol=1e-6)
            assert torch.allclose(want_grad, w1.grad, rtol=1e-4, atol=1e-6)
            report.probe(same_grad, f"{world} ranks holding {tokens} tokens: the ranks' averaged "
                         "gradient equals the single-process token mean's")
            close = all(math.isclose(g, w, rel_tol=1e-4, abs_tol=1e-6)
                        for g, w in zip(got, want, strict=True))
            report.probe(close, f"{world} ranks: each rank's loss has the value the global "
                         f"token mean requires ({[round(v, 4) for v in want]}); got "
                         f"{[round(v, 4) for v in got]}")
            if same_grad and close:
                continue
            for key, variant in _LOSS_VARIANTS.items():
                with torch.enable_grad():
                    values, _ = _grads(variant, shares, weight, world, total)
                if all(math.isclose(g, v, rel_tol=1e-4, abs_tol=1e-6)
                       for g, v in zip(got, values, strict=True)):
                    report.mistake(key)
                    break
            else:
                report.mistake("dist_wrong_value")
            return  # one diagnosis is enough

    return _run_check("check_token_mean_loss", body, verbose, fn)


# ---------------------------------------------------------------------------- AMP step

class _Spy:
    """Delegates to ``target`` and records the names of the methods called, in order."""

    def __init__(self, target, log: list, prefix: str):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name):
        attr = getattr(self._target, name)
        if callable(attr) and not name.startswith("_"):
            def call(*args, **kwargs):
                self._log.append(f"{self._prefix}.{name}")
                args = tuple(a._target if isinstance(a, _Spy) else a for a in args)
                return attr(*args, **kwargs)
            return call
        return attr

    def __setattr__(self, name, value):
        setattr(self._target, name, value)


def _amp_setup(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=1)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    return model, opt, scaler, x, y


def _loss(model, x, y, blow_up=False):
    loss = F.cross_entropy(model(x), y) * 5.0  # a large gradient, so clipping at 0.5 acts
    return loss * math.inf if blow_up else loss


def _amp_step(loss, model, opt, scaler, clip, *, zero_grad=True, unscale="before_clip",
              through_scaler=True):
    """The right AMP step (the defaults) and its known wrong variants, one option each:
    no zeroing, unscaling after clipping or never, ``optimizer.step()`` past the scaler.
    Returns (norm, skipped): the scale only drops at the update after a skipped step."""
    scale = scaler.get_scale()
    if zero_grad:
        opt.zero_grad()
    scaler.scale(loss).backward()
    if unscale == "before_clip":
        scaler.unscale_(opt)
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip)
    if unscale == "after_clip":
        scaler.unscale_(opt)
    if through_scaler:
        scaler.step(opt)
    else:
        opt.step()
    scaler.update()
    return norm, scaler.get_scale() < scale


_right = _amp_step
_AMP_VARIANTS = {  # mistake key -> the options of _amp_step that plant it
    "no_zero_grad": {"zero_grad": False},
    "amp_clip_before_unscale": {"unscale": "after_clip"},
    "amp_no_unscale": {"unscale": "never"},
    "amp_optimizer_step_bypasses_scaler": {"through_scaler": False},
}


def _run_steps(step, n_steps=3, clip=0.5, seed=31, blow_up_at=None, spy=False, log=None):
    """Weights, the scale after each step, what each step returned, after ``n_steps`` of
    ``step`` (and the call log with spy)."""
    model, opt, scaler, x, y = _amp_setup(seed)
    log = [] if log is None else log
    outs, scales = [], []
    for i in range(n_steps):
        s_opt = _Spy(opt, log, "optimizer") if spy else opt
        s_scaler = _Spy(scaler, log, "scaler") if spy else scaler
        with torch.enable_grad():
            loss = _loss(model, x, y, blow_up=(i == blow_up_at))
            outs.append(step(loss, model, s_opt, s_scaler, clip))
        scales.append(scaler.get_scale())
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return weights, scales, outs, log


def _flag(value):
    """A returned skipped flag as a bool (a bool, 0/1 or a one-element bool tensor), else None."""
    if isinstance(value, torch.Tensor):
        return bool(value) if value.numel() == 1 and value.dtype == torch.bool else None
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return None


def _split(outs):
    """(norms, flags, is_pair) from a step's returns; a norm or flag that cannot be read is None."""
    norms, flags, is_pair = [], [], True
    for out in outs:
        if isinstance(out, (tuple, list)) and len(out) == 2:
            norm, flag = out
        else:  # e.g. the norm alone
            norm, flag, is_pair = out, None, False
        try:
            norms.append(float(norm))
        except (TypeError, ValueError, RuntimeError):
            norms.append(None)
        flags.append(_flag(flag))
    return norms, flags, is_pair


def _shown_flag(flag, out) -> str:
    """How a returned flag is printed: True/False, or what was returned instead."""
    return str(flag) if flag is not None else _describe(out[1])


def _describe(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _name_from_log(report: _Report, log: list) -> None:
    """Mistakes that the order of the calls shows by itself (the call log of the spies)."""
    if "scaler.scale" not in log:
        report.mistake("amp_no_loss_scaling")
    if "optimizer.step" in log and "scaler.step" not in log:
        report.mistake("amp_optimizer_step_bypasses_scaler")
    if "scaler.update" not in log:
        report.mistake("amp_no_update")
    if "scaler.update" in log and "scaler.step" in log and \
            log.index("scaler.update") < log.index("scaler.step"):
        report.mistake("amp_update_before_step")
    if len(report.found) > 1:
        report.found.pop("exception", None)  # the named mistake explains the exception


def check_amp_step(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(loss, model, optimizer, scaler, clip_norm) -> (grad_norm, skipped)``: the
    mixed-precision step after the forward pass, in the order scale, backward, unscale, clip,
    step, update.

    ``loss`` is a scalar with a graph, ``scaler`` a ``torch.amp.GradScaler``; the gradients may
    hold the previous step's values on entry (zero them). Return the norm of the true gradients
    before clipping (what ``clip_grad_norm_`` returns after ``unscale_``) and whether the scaler
    skipped the step (a bool, or a one-element bool tensor). Three steps from the same start must
    give the reference's weights, scale and norms, each reported as not skipped (the scale grows
    after every finite step here); a fourth run with an infinite loss at step 2 must skip that
    step and report it as skipped.
    """

    def body(report: _Report):
        want_w, want_scales, want_outs, _ = _run_steps(_right)
        want_norms, want_flags, _ = _split(want_outs)
        assert want_flags == [False] * 3
        log = []
        try:
            got_w, got_scales, got_outs, _ = _call(report, "your step, 3 times", _run_steps, fn,
                                                   spy=True, log=log)
        except _Failed:
            if "not_implemented" not in report.found:
                _name_from_log(report, log)
            raise
        _name_from_log(report, log)
        first = log[:len(log) // 3 or None]
        shown = [c for c in first if not c.split(".", 1)[1].startswith(("get_", "is_"))]
        report.probe(not report.found, "the calls of one step: " + " -> ".join(shown))
        got_norms, got_flags, is_pair = _split(got_outs)
        if not is_pair:
            report.probe(False, "your step returns the pair (grad_norm, skipped); it returned "
                         + _describe(got_outs[0]))
            report.mistake("amp_not_a_pair")
        same_w = torch.allclose(got_w, want_w, rtol=1e-5, atol=1e-7)
        report.probe(same_w, "weights after 3 steps equal the reference step's")
        got_scale, want_scale = got_scales[-1], want_scales[-1]
        report.probe(got_scale == want_scale, f"the loss scale after 3 steps: {got_scale:g} "
                     f"(reference {want_scale:g}: it grows after each finite step here)")
        norms_ok = all(g is not None and math.isclose(g, w, rel_tol=1e-4)
                       for g, w in zip(got_norms, want_norms, strict=True))
        report.probe(norms_ok, "the returned gradient norms are the true (unscaled) norms "
                     "before clipping")
        if not same_w:
            for key, options in _AMP_VARIANTS.items():
                w, _, _, _ = _run_steps(functools.partial(_amp_step, **options))
                if torch.allclose(got_w, w, rtol=1e-5, atol=1e-7):
                    report.mistake(key)
                    break
            else:
                if "scaler.unscale_" not in log:
                    report.mistake("amp_no_unscale")
                elif "scaler.step" not in log:
                    report.mistake("amp_optimizer_step_bypasses_scaler")
                else:
                    report.mistake("mismatch")
        elif not norms_ok:
            report.mistake("amp_grad_norm")
        flags_ok = got_flags == want_flags
        if is_pair:
            shown = [_shown_flag(f, out) for f, out in zip(got_flags, got_outs, strict=True)]
            report.probe(flags_ok, "the 3 finite steps are reported as not skipped (skipped: "
                         f"{', '.join(shown)})")
        # an overflowing step must be skipped, reported as skipped, and the scale must drop
        want_w, want_scales, want_outs, _ = _run_steps(_right, n_steps=2, blow_up_at=1)
        assert torch.allclose(want_w, _run_steps(_right, n_steps=1)[0])
        assert _split(want_outs)[1] == [False, True]
        try:
            start_w, _, _, _ = _run_steps(fn, n_steps=1)  # the learner's own first step
            got_w, got_scales, got_outs, _ = _run_steps(fn, n_steps=2, blow_up_at=1)
        except Exception as exc:  # noqa: BLE001 - the learner's step on an infinite loss
            report.probe(False, f"a step with an infinite loss: raised {type(exc).__name__}")
            report.mistake("amp_overflow_not_skipped")
            return
        skipped = torch.allclose(got_w, start_w, rtol=1e-5, atol=1e-7) and bool(
            torch.isfinite(got_w).all())
        report.probe(skipped, "a step with an infinite loss is skipped (weights unchanged, "
                     f"scale {got_scales[0]:g} -> {got_scales[1]:g}, reference "
                     f"{want_scales[0]:g} -> {want_scales[1]:g})")
        if not skipped:
            report.mistake("amp_overflow_not_skipped")
        _, flags, still_pair = _split(got_outs)
        if is_pair and still_pair:
            report.probe(flags[1] is True, "that step is reported as skipped (skipped: "
                         f"{_shown_flag(flags[1], got_outs[1])})")
            if not (flags_ok and flags[1] is True):
                report.mistake("amp_skipped_flag")

    return _run_check("check_amp_step", body, verbose, fn)


__all__ = ["check_token_mean_loss", "check_amp_step"]
