"""Check for notebook 12's second lab: one mixed-precision step over accumulated micro-batches.

:func:`check_amp_step` grades ``fn(micro_losses, model, optimizer, scaler, clip_norm) ->
(grad_norm, skipped)``: k micro-batch losses (each with its graph) make ONE optimizer step whose
gradient is that of their mean, through a real ``torch.amp.GradScaler`` on the CPU. Weights,
scale and norms are compared with the right step and with the known wrong ones (the keys of
``_AMP_VARIANTS`` and the call log); every run starts with stale gradients in ``.grad``; each
backward must free its graph; a step with an infinite micro-batch loss, and one with a finite
loss whose gradients overflow, must be skipped and reported so, finite steps not, both when the
scale grows after every finite step and under PyTorch's default growth interval (2000).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .mistakes import MISTAKES
from .report import CheckResult, _call, _Failed, _Report, _run_check

MISTAKES.update({
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
    "amp_overflow_not_skipped": ("a step whose loss or gradients held inf changed the weights",
                                 "a step whose gradients hold inf or NaN must leave the weights "
                                 "unchanged: the scaler decides that"),
    "amp_grad_norm": ("the returned gradient norm is not the norm of the true gradients before "
                      "clipping",
                      "the norm to return is that of the true gradients, measured before clipping"),
    "amp_not_a_pair": ("the step does not return the pair (grad_norm, skipped)",
                       "return two values: the true gradient norm before clipping, and True or "
                       "False for whether the scaler skipped this step"),
    "amp_accum_zero_each": ("the gradients were zeroed before each micro-batch's backward",
                            "only the last micro-batch's gradient survives; the step must see "
                            "all k of them added up, so they are cleared once per step"),
    "amp_accum_not_averaged": ("the micro-batch losses were not divided by their number",
                               "the gradients add up over the micro-batches: without the "
                               "division the step sees k times the gradient of their mean"),
    "amp_accum_step_each": ("the optimizer stepped (or the gradients were unscaled) once per "
                            "micro-batch",
                            "accumulation makes one step from all k gradients; the scaler's "
                            "unscale, step and update belong to that one step"),
    "amp_skipped_flag": ("the returned skipped flag does not say whether the scaler skipped "
                         "the step",
                         "it must be True exactly on a step whose true gradients held inf or "
                         "NaN (the weights stay unchanged), and False on every other step, "
                         "including one where the scale grows"),
    "amp_zero_at_end": ("the gradients were cleared at the end of the step, not before its "
                        "first backward",
                        "the gradients may hold stale values on entry (from an evaluation or "
                        "an earlier run), so clear them before this step's gradients are added"),
    "amp_no_clip": ("the gradients were never clipped to the clipping norm",
                    "measure the true gradients' norm and scale them down to the given norm "
                    "before the update"),
    "amp_accum_one_backward": ("one backward ran for all the micro-batches together",
                               "accumulation exists so that only one micro-batch's graph is in "
                               "memory at a time: each micro-batch's loss gets its own backward, "
                               "and .grad adds them up"),
    "amp_retain_graph": ("a micro-batch's graph was still there after the step "
                         "(backward with retain_graph=True)",
                         "accumulation keeps one micro-batch's graph in memory at a time: each "
                         "backward must free its graph, as backward does by default"),
})


class CallSpy:
    """Delegates to ``target`` and records the names of the methods called, in order (the
    check's instrumentation, not a reference: public, so the delegation watch lets it through)."""

    def __init__(self, target, log: list, prefix: str):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name):
        attr = getattr(self._target, name)
        if callable(attr) and not name.startswith("_"):
            def call(*args, **kwargs):
                self._log.append(f"{self._prefix}.{name}")
                args = tuple(a._target if isinstance(a, CallSpy) else a for a in args)
                return attr(*args, **kwargs)
            return call
        return attr

    def __setattr__(self, name, value):
        setattr(self._target, name, value)


K = 2  # micro-batches per step in every probe


def _amp_setup(seed: int, growth_interval: int = 1):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12,
                                growth_interval=growth_interval)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    return model, opt, scaler, x, y


class _GradOverflow(torch.autograd.Function):
    """Adds 0 to a loss, and an infinite gradient to backward: a finite loss whose gradients
    overflow, the case the scaler exists for."""

    @staticmethod
    def forward(ctx, out):
        ctx.shape = out.shape
        return out.new_zeros(())

    @staticmethod
    def backward(ctx, grad):
        return torch.full(ctx.shape, math.inf)


def _losses(model, x, y, blow_up=None):
    """K micro-batch losses of equal size; blow_up "loss": the last one is infinite; "grad": it
    is finite, but its gradients are not."""
    outs = [model(x[i::K]) for i in range(K)]  # (N / K, 3) each
    losses = [F.cross_entropy(out, y[i::K]) * 5.0  # large, so clipping at 0.5 acts
              for i, out in enumerate(outs)]
    if blow_up == "loss":
        losses[-1] = losses[-1] * math.inf
    elif blow_up == "grad":
        losses[-1] = losses[-1] + _GradOverflow.apply(outs[-1])
    return losses


def _amp_step(losses, model, opt, scaler, clip, *, zero="once", divide=True,
              unscale="before_clip", through_scaler=True, clipped=True):
    """The right accumulated AMP step (the defaults) and its known wrong variants, one option
    each. Returns (norm, skipped): the scale only drops at the update after a skipped step."""
    scale = scaler.get_scale()
    if zero == "once":
        opt.zero_grad()
    for loss in losses:
        if zero == "each":
            opt.zero_grad()
        scaler.scale(loss / len(losses) if divide else loss).backward()
    if unscale == "before_clip":
        scaler.unscale_(opt)
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip if clipped else math.inf)
    if unscale == "after_clip":
        scaler.unscale_(opt)
    if through_scaler:
        scaler.step(opt)
    else:
        opt.step()
    scaler.update()
    if zero == "end":
        opt.zero_grad()
    return norm, scaler.get_scale() < scale


_right = _amp_step
_AMP_VARIANTS = {  # mistake key -> the options of _amp_step that plant it
    "no_zero_grad": {"zero": "never"},
    "amp_accum_zero_each": {"zero": "each"},
    "amp_accum_not_averaged": {"divide": False},
    "amp_clip_before_unscale": {"unscale": "after_clip"},
    "amp_no_unscale": {"unscale": "never"},
    "amp_optimizer_step_bypasses_scaler": {"through_scaler": False},
    "amp_zero_at_end": {"zero": "end"},
    "amp_no_clip": {"clipped": False},
}


_STEP = "|"  # where each step begins in the call log


def _run_steps(step, n_steps=3, clip=0.5, seed=31, blow_up_at=None, spy=False, log=None,
               blow_up="loss", backwards=None, growth_interval=1, kept=None):
    """Weights, the scale after each step, what each step returned, after ``n_steps`` of
    ``step`` (and the call log with spy; ``backwards`` gets the backward passes of each step,
    ``kept`` whether a graph survived it; ``growth_interval`` is the scaler's: 1 grows the scale
    after every finite step)."""
    model, opt, scaler, x, y = _amp_setup(seed, growth_interval)
    gen = torch.Generator().manual_seed(seed + 2)
    for p in model.parameters():  # stale gradients, e.g. from an earlier step: clear them first
        p.grad = torch.randn(p.shape, generator=gen)
    counted = [0]
    next(model.parameters()).register_hook(lambda g: counted.__setitem__(0, counted[0] + 1))
    log = [] if log is None else log
    outs, scales = [], []
    for i in range(n_steps):
        log.append(_STEP)
        s_opt = CallSpy(opt, log, "optimizer") if spy else opt
        s_scaler = CallSpy(scaler, log, "scaler") if spy else scaler
        counted[0] = 0
        with torch.enable_grad():
            losses = _losses(model, x, y, blow_up=blow_up if i == blow_up_at else None)
            outs.append(step(losses, model, s_opt, s_scaler, clip))
        scales.append(scaler.get_scale())
        if backwards is not None:
            backwards.append(counted[0])
        if kept is not None:  # did the first loss's graph survive? A second pass tells
            try:
                torch.autograd.grad(losses[0], list(model.parameters()), allow_unused=True)
                kept.append(True)
            except RuntimeError as err:  # freed: "... the graph a second time"; kept, then
                kept.append("second time" not in str(err))  # stepped: "modified by an inplace"
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return weights, scales, outs, log


def _flag(value):
    """A returned skipped flag as a bool (a bool, 0/1 or a one-element bool tensor), else None."""
    if isinstance(value, torch.Tensor):
        return bool(value) if value.numel() == 1 and value.dtype == torch.bool else None
    if type(value).__name__ == "bool_" or (isinstance(value, int) and value in (0, 1)):
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
    size = f" of {len(value)}" if isinstance(value, (tuple, list)) else ""
    return f"a {type(value).__name__}{size}"


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
    for one in "/".join(log).split(_STEP):  # the calls of each step
        calls = [c for c in one.split("/") if c]
        stepped = [i for i, c in enumerate(calls) if c.endswith(".step")]
        if calls.count("scaler.unscale_") > 1 or (stepped and "scaler.scale" in calls[stepped[0]:]):
            report.mistake("amp_accum_step_each")  # a step (or an unscale) per micro-batch
            break
    if len(report.found) > 1:
        report.found.pop("exception", None)  # the named mistake explains the exception


def check_amp_step(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(micro_losses, model, optimizer, scaler, clip_norm) -> (grad_norm, skipped)``:
    one mixed-precision step from k accumulated micro-batch losses.

    ``micro_losses`` is a list of k scalar losses of equal-size micro-batches, each with its
    graph; ``scaler`` a ``torch.amp.GradScaler``; the gradients may hold the previous step's
    values on entry. The step's gradient must be that of the mean of the k losses, the returned
    norm that of the true gradients before clipping, and ``skipped`` whether the scaler skipped
    the step (a bool, or a one-element bool tensor); each micro-batch loss gets its own
    backward, which frees its graph. The probes are listed in the module docstring.
    """

    def body(report: _Report):
        want_w, want_scales, want_outs, _ = _run_steps(_right)
        want_norms, want_flags, _ = _split(want_outs)
        assert want_flags == [False] * 3
        log, backwards, kept = [], [], []
        try:
            got_w, got_scales, got_outs, _ = _call(report, "your step, 3 times", _run_steps, fn,
                                                   spy=True, log=log, backwards=backwards,
                                                   kept=kept)
        except _Failed:
            if "not_implemented" not in report.found:
                _name_from_log(report, log)
            raise
        _name_from_log(report, log)
        first = "/".join(log).split(_STEP)[1].split("/")
        shown = [c for c in first if c and not c.split(".", 1)[1].startswith(("get_", "is_"))]
        report.probe(not report.found, "the calls of one step: " + " -> ".join(shown))
        if not report.probe(backwards == [K] * 3, f"one backward per micro-batch: {K} per step "
                            f"(yours: {', '.join(map(str, backwards))})"):
            if all(b < K for b in backwards):
                report.mistake("amp_accum_one_backward")
        elif not report.probe(not any(kept), "each backward freed its micro-batch's graph"):
            report.mistake("amp_retain_graph")
        got_norms, got_flags, is_pair = _split(got_outs)
        if not is_pair:
            report.probe(False, "your step returns the pair (grad_norm, skipped); it returned "
                         + _describe(got_outs[0]))
            report.mistake("amp_not_a_pair")
        same_w = torch.allclose(got_w, want_w, rtol=1e-5, atol=1e-7)
        report.probe(same_w, "weights after 3 steps equal the reference step's")
        got_scale, want_scale = got_scales[-1], want_scales[-1]
        report.probe(got_scale == want_scale, f"the loss scale after 3 steps: {got_scale:g} "
                     f"(reference {want_scale:g})")
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
            times_k = all(g is not None and math.isclose(g, K * w, rel_tol=1e-4)
                          for g, w in zip(got_norms, want_norms, strict=True))
            report.mistake("amp_accum_not_averaged" if times_k else "amp_grad_norm")
        flags_ok = got_flags == want_flags
        if is_pair:
            shown = [_shown_flag(f, out) for f, out in zip(got_flags, got_outs, strict=True)]
            report.probe(flags_ok, "the 3 finite steps are reported as not skipped (skipped: "
                         f"{', '.join(shown)})")
            # PyTorch's default growth interval (2000): a finite step leaves the scale unchanged
            assert _split(_run_steps(_right, growth_interval=2000)[2])[1] == [False] * 3
            try:
                _, still, outs, _ = _run_steps(fn, growth_interval=2000)
                _, still_flags, _ = _split(outs)
            except Exception as exc:  # noqa: BLE001 - the learner's step, a second scaler
                still, outs, still_flags = [math.nan], [(None, exc)], [None]
            shown = [_shown_flag(f, out) for f, out in zip(still_flags, outs, strict=True)]
            calm = still_flags == [False] * 3
            report.probe(calm, "with PyTorch's default growth interval (the scale stays "
                         f"{still[-1]:g}), the 3 finite steps are reported as not skipped "
                         f"(skipped: {', '.join(shown)})")
            flags_ok = flags_ok and calm
        # an overflowing step must be skipped, reported as skipped, and the scale must drop:
        # an infinite loss, then a finite loss whose gradients overflow (what fp16 really does)
        for blow_up, what in (("loss", "an infinite loss"),
                              ("grad", "a finite loss whose gradients overflow")):
            want_w, want_scales, want_outs, _ = _run_steps(_right, n_steps=2, blow_up_at=1,
                                                           blow_up=blow_up)
            assert torch.allclose(want_w, _run_steps(_right, n_steps=1)[0])
            assert _split(want_outs)[1] == [False, True]
            try:
                start_w, _, _, _ = _run_steps(fn, n_steps=1)  # the learner's own first step
                got_w, got_scales, got_outs, _ = _run_steps(fn, n_steps=2, blow_up_at=1,
                                                            blow_up=blow_up)
            except Exception as exc:  # noqa: BLE001 - the learner's step on an overflow
                report.probe(False, f"a step with {what}: raised {type(exc).__name__}")
                report.mistake("amp_overflow_not_skipped")
                return
            skipped = torch.allclose(got_w, start_w, rtol=1e-5, atol=1e-7) and bool(
                torch.isfinite(got_w).all())
            report.probe(skipped, f"a step with {what} is skipped (weights unchanged, "
                         f"scale {got_scales[0]:g} -> {got_scales[1]:g}, reference "
                         f"{want_scales[0]:g} -> {want_scales[1]:g})")
            if not skipped:
                report.mistake("amp_overflow_not_skipped")
            _, flags, still_pair = _split(got_outs)
            if is_pair and still_pair:
                report.probe(flags[1] is True, f"the step with {what} is reported as skipped "
                             f"(skipped: {_shown_flag(flags[1], got_outs[1])})")
                if not (flags_ok and flags[1] is True):
                    report.mistake("amp_skipped_flag")

    return _run_check("check_amp_step", body, verbose, fn)


__all__ = ["check_amp_step"]
