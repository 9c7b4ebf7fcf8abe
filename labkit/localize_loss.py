"""Localising probes for the label-smoothed loss and the training step (issue 29, item 6).

They run when the numbers differ and no known variant explains them, and say which part of
the computation is wrong, also for a mistake nobody listed:

- :func:`localise_smoothing`: *what the loss is averaged over* (one position, the same position
  four times, the position with three pad-labelled rows added, pad rows alone) and *how the
  target distribution is built* (read from the gradient at one position: for a loss
  ``-(q * log_softmax(z)).sum()`` the gradient is ``S * softmax(z) - q`` with ``S = q.sum()``,
  so two logit rows give ``S`` and ``q``; a loss linear in the raw logits gives ``S = 0``, a
  flipped sign ``S = -1``).
- :class:`StepTrace` and :func:`localise_step`: *which steps run, in which order and in which
  mode*: the optimizer's and the scheduler's calls, the model's mode at its forward pass, the
  global gradient norm right after backward (all the parameters' gradient hooks), the norm and
  the largest entry the optimizer applies, the gradients left after the step, the returned loss
  and norm.
"""
from __future__ import annotations

import math

import torch

from .report import _Report

_TOL = 2e-3


def _near(a: float, b: float, rel: float = _TOL) -> bool:
    return math.isfinite(a) and abs(a - b) <= rel * max(1.0, abs(b))


# ------------------------------------------------------------------------- label smoothing

def localise_smoothing(report: _Report, fn, eps: float, pad: int, v: int) -> None:
    """Name the part of a smoothed loss that differs: the reduction or the target."""
    gen = torch.Generator().manual_seed(7)
    row = 1.5 * torch.randn(1, v, generator=gen)  # (1, V)
    label = 3 if pad != 3 else 4
    others = 1.5 * torch.randn(3, v, generator=gen)  # (3, V): rows labelled pad

    def value(logits, target) -> float:
        try:
            out = fn(logits, torch.tensor(target), eps, pad)
            return float(out.detach().reshape(()) if isinstance(out, torch.Tensor) else out)
        except Exception:  # noqa: BLE001 - a probe that cannot run says nothing
            return math.nan

    one = value(row, [label])
    four = value(row.repeat(4, 1), [label] * 4)
    padded = value(torch.cat([row, others]), [label, pad, pad, pad])
    pads_only = value(others, [pad] * 3)
    if not math.isfinite(one):
        report.probe(False, "one non-pad position gives a finite loss")
        if math.isfinite(pads_only):
            report.mistake("ls_pad_keep_inverted", f"a batch without pad labels gives {one}, "
                           f"a batch of pad labels alone gives {pads_only:.4f}")
        return
    mean_ok = report.probe(_near(four, one), f"the same position four times gives the loss of "
                           f"one ({one:.4f}; got {four:.4f}): a mean over positions")
    if not mean_ok:
        if _near(four, 4 * one):
            report.mistake("ls_sum_not_mean", "four equal positions give four times the loss")
        elif _near(four, one / 4):
            report.mistake("loss_divided_twice", "four equal positions give a quarter of the "
                           "loss of one: the mean is divided by the number of positions again")
        else:
            report.mistake("ls_reduction_wrong", f"one position gives {one:.4f}, four equal "
                           f"ones {four:.4f}")
    if not report.probe(_near(padded, one), f"adding three pad-labelled positions leaves it "
                        f"unchanged (got {padded:.4f})"):
        if _near(padded, one / 4):
            report.mistake("ls_mean_over_all_positions", "with three pad rows added the loss "
                           "is a quarter of the loss of the one real position")
        elif mean_ok:
            report.mistake("ls_pad_not_ignored", "three pad-labelled rows change the loss of "
                           "one real position")
    _target_probe(report, fn, row, label, eps, pad, v)


def _target_probe(report: _Report, fn, row, label: int, eps: float, pad: int, v: int) -> None:
    """Read the learner's target q from the gradient of its loss at one position."""
    grads = []
    for z in (torch.zeros(1, v), row):
        z = z.clone().requires_grad_(True)
        try:
            with torch.enable_grad():
                out = fn(z, torch.tensor([label]), eps, pad)
                (grad,) = torch.autograd.grad(out.reshape(()), z)
        except Exception:  # noqa: BLE001 - a loss without a gradient is named elsewhere
            return
        grads.append(grad[0].double())
    p0 = torch.full((v,), 1.0 / v, dtype=torch.float64)
    p1 = torch.softmax(row[0].double(), -1)
    dp = p1 - p0
    s = float((grads[1] - grads[0]) @ dp / (dp @ dp))
    q = s * p0 - grads[0]  # (V,)
    fits = float((grads[1] - (s * p1 - q)).abs().max()) < 1e-3
    true_q, other_q = 1 - eps + eps / v, eps / v
    got_true = float(q[label])
    got_other = float(torch.cat([q[:label], q[label + 1:]]).mean())
    ok = fits and _near(s, 1.0) and _near(got_true, true_q) and _near(got_other, other_q, 2e-2)
    if report.probe(ok, "the target distribution read from the gradient at one position is "
                    f"(1 - eps) one-hot + eps / V (the true class {true_q:.4f}, every other "
                    f"class {other_q:.4f})"):
        return
    if fits and abs(s) < 1e-3:
        report.mistake("ls_no_log_softmax")
    elif fits and _near(s, -1.0):
        report.mistake("ls_sign_flipped")
    elif fits:
        report.mistake("ls_target_wrong", f"the true class gets {got_true:.4f} (1 - eps + "
                       f"eps / V = {true_q:.4f}), every other class {got_other:.4f} (eps / V = "
                       f"{other_q:.4f}), and the target sums to {s:.4f} (expected 1)")
    else:
        report.mistake("ls_not_cross_entropy")


# --------------------------------------------------------------------------- training step

class StepTrace:
    """Records what one learner step does to the model, the optimizer and the scheduler."""

    def __init__(self, model, optimizer, scheduler):
        self.events: list[str] = []
        self.modes: list[bool] = []
        self.pre_norm = self.pre_sum = math.nan  # right after backward
        self.applied_norm = self.applied_max = math.nan  # at optimizer.step
        params = [p for p in model.parameters() if p.requires_grad]
        self._params, self._seen = params, 0
        self._hooks = [model.register_forward_pre_hook(self._forward)]
        self._hooks += [p.register_post_accumulate_grad_hook(self._grad) for p in params]
        self._hooks.append(optimizer.register_step_pre_hook(self._step))
        self._restore = []
        for owner, name in ((optimizer, "zero_grad"), (model, "zero_grad"), (scheduler, "step")):
            self._wrap(owner, name, "scheduler" if owner is scheduler else name)

    def _step(self, _optimizer, _args, _kwargs):
        grads = [p.grad for p in self._params if p.grad is not None]
        if grads:
            self.applied_norm = float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            self.applied_max = max(float(g.abs().max()) for g in grads)
        self.events.append("step")

    def _wrap(self, owner, name: str, label: str) -> None:
        """Record calls of ``owner.name`` (an instance attribute, removed afterwards)."""
        inner = getattr(owner, name)
        had = name in vars(owner)

        def wrapper(*args, **kwargs):
            self.events.append(label)
            return inner(*args, **kwargs)

        setattr(owner, name, wrapper)
        self._restore.append((owner, name, inner if had else None))

    def _forward(self, module, _args):
        self.events.append("forward")
        self.modes.append(module.training)

    def _grad(self, _param):
        self._seen += 1
        if self._seen == len(self._params):  # every gradient is complete: before clipping
            self.events.append("backward")
            norms = [torch.linalg.vector_norm(p.grad) for p in self._params]
            self.pre_norm = float(torch.linalg.vector_norm(torch.stack(norms)))
            self.pre_sum = float(sum(norms))
            self._seen = 0

    def after(self) -> float:
        """The gradient norm left once the step returned; removes every hook."""
        for h in self._hooks:
            h.remove()
        for owner, name, inner in self._restore:
            if inner is None:
                delattr(owner, name)
            else:
                setattr(owner, name, inner)
        grads = [p.grad for p in self._params if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads]))) if grads else math.nan


def _order_ok(order: list) -> bool:
    """True when backward, step, scheduler run once each in that order, with zero_grad
    called, but never between backward and the update (before backward or after step)."""
    if [e for e in order if e != "zero_grad"] != ["backward", "step", "scheduler"]:
        return False
    return "zero_grad" in order and "zero_grad" not in order[order.index("backward"):
                                                            order.index("step")]


def localise_step(report: _Report, trace: StepTrace, left_norm: float, returned, ref_loss: float,
                  clip: float, n_tokens: int) -> None:
    """Name the part of the first step that differs from forward, zero_grad, backward, clip,
    optimizer.step, scheduler.step in train mode."""
    order = [e for e in trace.events if e in ("zero_grad", "backward", "step", "scheduler")]
    report.probe(_order_ok(order), "the step's calls, in order: " + ", ".join(order))
    clipped = trace.applied_norm <= clip * (1 + _TOL)
    if not report.probe(clipped or not math.isfinite(trace.applied_norm),
                        f"the optimizer applies gradients of norm at most clip_norm = {clip} "
                        f"(the norm after backward was {trace.pre_norm:.4f}, at the update "
                        f"{trace.applied_norm:.4f})"):
        if _near(trace.applied_norm, trace.pre_norm) and _near(left_norm, clip):
            report.mistake("clip_after_step")
        elif _near(trace.applied_norm, trace.pre_norm):
            report.mistake("no_clipping")
        elif trace.applied_max <= clip * (1 + _TOL):
            report.mistake("clip_by_value", f"no entry exceeds {clip}, but the norm is "
                           f"{trace.applied_norm:.4f}")
    elif trace.pre_norm > clip and not _near(trace.applied_norm, clip):
        report.probe(False, f"clipping keeps the gradients' direction: their norm becomes "
                     f"clip_norm ({trace.applied_norm:.4f} instead of {clip})")
        if trace.applied_max <= clip * (1 + _TOL):
            report.mistake("clip_by_value")
    if returned is None:
        return
    loss, norm = returned
    if not report.probe(_near(norm, trace.pre_norm), f"the returned grad_norm ({norm:.4f}) is "
                        f"the global norm of the gradients before clipping "
                        f"({trace.pre_norm:.4f})"):
        if _near(norm, trace.pre_sum):
            report.mistake("grad_norm_not_global")
        elif _near(norm, clip):
            report.mistake("grad_norm_after_clip")
    if not report.probe(_near(loss, ref_loss), f"the returned loss ({loss:.4f}) is the "
                        f"criterion's value ({ref_loss:.4f})"):
        if _near(loss, ref_loss / n_tokens):
            report.mistake("loss_divided_twice", f"{loss:.4f} = {ref_loss:.4f} / {n_tokens} "
                           "target tokens")
