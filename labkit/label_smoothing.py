"""Check: a learner's label-smoothed cross-entropy, against nn.CrossEntropyLoss.

The convention checked is PyTorch's (``nn.CrossEntropyLoss(label_smoothing=eps,
ignore_index=pad_idx)``): the smoothed target is ``q = (1 - eps) * one_hot + eps / V`` over all
V classes (the true class and the pad column included, so the true class gets
``1 - eps + eps / V``); positions whose label is ``pad_idx`` are left out, and the loss is the
mean of ``-(q * log_softmax(logits)).sum(-1)`` over the remaining positions.
"""
from __future__ import annotations

from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

from .compare import _as_output, _close, _compare, _max_diff
from .localize_loss import localise_smoothing
from .report import CheckResult, _call, _Failed, _Report, _run_check

_SHAPES = ("logits (M, V) raw scores, target (M,) class ids; return a scalar tensor (the mean "
           "over the positions whose label is not pad_idx)")


def _smoothed_ce(logits, target, eps, pad_idx, *, spread="V", pad_mode="ignore",
                 reduce="mean", kl=False, eps_used=True, eps_value=None):
    """The reference and its known wrong variants (the first option of each is right)."""
    eps = 0.0 if not eps_used else (eps if eps_value is None else eps_value)
    v = logits.size(-1)
    log_p = torch.log_softmax(logits.double(), -1)  # (M, V)
    one_hot = F.one_hot(target, v).double()  # (M, V)
    if spread == "V":
        q = (1 - eps) * one_hot + eps / v
    elif spread == "no_share":  # the true class gets 1 - eps
        q = (1 - eps) * one_hot + eps / v * (1 - one_hot)
    elif spread == "V-1":
        q = (1 - eps) * one_hot + eps / (v - 1) * (1 - one_hot)
    else:  # "V-2": neither the true class nor the pad column
        q = (1 - eps) * one_hot + eps / (v - 2) * (1 - one_hot)
        q[:, pad_idx] = 0.0
        q[target == pad_idx] = one_hot[target == pad_idx] * (1 - eps)
    terms = -(q * log_p)  # (M, V)
    if kl:
        terms = terms + torch.xlogy(q, q)
    keep = (torch.ones_like(target).bool() if pad_mode == "count" else
            target != (0 if pad_mode == "zero" else pad_idx))  # (M,)
    per_position = terms.sum(-1) * keep  # (M,)
    if reduce == "sum":
        return per_position.sum()
    if reduce == "classes":
        return per_position.sum() / (keep.sum() * v)
    if pad_mode == "mean_all":
        return per_position.sum() / target.numel()
    return per_position.sum() / keep.sum()


_LS_AXES = {
    "spread": ["V", ("ls_spread_over_v_minus_1", "V-1"), ("ls_spread_over_v_minus_2", "V-2"),
               ("ls_true_class_missing_share", "no_share")],
    "pad_mode": ["ignore", ("ls_pad_not_ignored", "count"),
                 ("ls_mean_over_all_positions", "mean_all"), ("pad_idx_ignored", "zero")],
    "reduce": ["mean", ("ls_sum_not_mean", "sum"), ("ls_mean_over_classes", "classes")],
    "kl": [False, ("ls_kl_divergence", True)],
    "eps_used": [True, ("ls_eps_ignored", False)],
    "eps_value": [None, ("ls_eps_hardcoded", 0.1)],
}


class _BuiltinSmoothing(RuntimeError):
    """Raised by the patched cross-entropy when it is asked to smooth."""


def _no_builtin_smoothing(real):
    """F.cross_entropy that refuses label_smoothing > 0 (plain cross-entropy still works)."""
    def cross_entropy(*args, **kwargs):
        if float(kwargs.get("label_smoothing", args[7] if len(args) > 7 else 0.0)) > 0:
            raise _BuiltinSmoothing("label_smoothing")
        return real(*args, **kwargs)
    return cross_entropy


def _builds_target(report: _Report, fn, logits, target, eps, pad) -> None:
    """The exercise is to build the smoothed target: rerun fn with the built-in one refused."""
    try:
        with mock.patch.object(F, "cross_entropy", _no_builtin_smoothing(F.cross_entropy)):
            fn(logits, target, eps, pad)
        used = False
    except _BuiltinSmoothing:
        used = True
    except Exception:  # noqa: BLE001 - any other failure was reported by the first call
        used = False
    if not report.probe(not used, "the smoothed target is built here, not taken from "
                        "PyTorch's label_smoothing argument"):
        report.mistake("ls_builtin_smoothing")


def check_label_smoothing(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(logits, target, eps, pad_idx) -> loss``, a label-smoothed cross-entropy.

    ``logits`` (M, V), ``target`` (M,); the loss must equal
    ``nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=pad_idx)(logits, target)``: eps
    spread over all V classes, pad labels ignored, the mean over non-pad positions. Probes: a
    batch with pad labels (eps = 0.2, pad_idx = 1), the loss floor (logits = log q give the
    entropy of q, not 0), a large logit gap (log(softmax) underflows there), a gradient, and a
    rerun with PyTorch's own ``label_smoothing`` refused (the exercise is to build the target).
    When the loss differs and no known variant explains it,
    :func:`.localize_loss.localise_smoothing` names the part: what the loss is averaged over,
    or how the target is built (read from the gradient at one position).
    """
    eps, pad, v = 0.2, 1, 7

    def reference(logits, target, e=eps):
        return nn.CrossEntropyLoss(label_smoothing=e, ignore_index=pad)(logits, target)

    def run(report, logits, target, what, e=eps):
        out = _call(report, what, fn, logits, target, e, pad, shape_hint=_SHAPES)
        return _as_output(report, out, "the loss")

    def body(report: _Report):
        gen = torch.Generator().manual_seed(51)  # every variant >= 1% from the rest
        logits = (2.0 * torch.randn(10, v, generator=gen)).requires_grad_(True)  # (M, V)
        target = torch.tensor([3, 1, 0, 6, 2, 1, 5, 4, 1, 2])  # (M,): three pad labels
        with torch.enable_grad():
            out = run(report, logits, target, "fn(logits (10, 7), target (10,) with 3 pad "
                      "labels, eps=0.2, pad_idx=1)")
            expected = reference(logits, target)
            if out.dim() == 1 and out.shape[0] == target.numel():
                report.probe(False, f"the loss is a scalar (got shape {tuple(out.shape)})")
                report.mistake("wrong_output_shape", "one loss per position", "reduce to a "
                               "scalar: the mean over the non-pad positions")
                raise _Failed
            out = out.reshape(()) if out.numel() == 1 else out
            detached = not out.requires_grad

        def variant(**kw):
            return _smoothed_ce(logits.detach(), target, eps, pad, **kw).float()

        main_ok = _compare(report, f"the loss matches nn.CrossEntropyLoss(label_smoothing={eps}, "
                           f"ignore_index={pad}) = {expected.item():.4f}", out.detach(),
                           expected.detach(), _LS_AXES, variant)
        if not report.probe(not detached, "the loss carries a gradient (loss.backward() works)"):
            report.mistake("loss_detached")
        if not main_ok and report.only_mismatch():  # which part: the reduction or the target
            localise_smoothing(report, fn, eps, pad, v)
            if not report.only_mismatch():
                report.found.pop("mismatch", None)
                raise _Failed
        if main_ok:
            _builds_target(report, fn, logits.detach(), target, eps, pad)
        # a second eps: the argument is used
        if main_ok:
            out2 = run(report, logits.detach(), target, "fn(..., eps=0.05, pad_idx=1)", 0.05)
            if not _compare(report, "with eps=0.05 it matches too", out2,
                            reference(logits.detach(), target, 0.05)):
                report.found.pop("mismatch", None)
                report.mistake("ls_eps_hardcoded")
        # the floor: at logits = log q the loss is the entropy of q
        floor_target = torch.tensor([0, 4, 6, 2])
        q = (1 - eps) * F.one_hot(floor_target, v).float() + eps / v  # (4, V)
        floor = run(report, q.log(), floor_target, "fn(log q, target) at the smoothed target q")
        entropy = reference(q.log(), floor_target)
        _compare(report, f"with logits = log q (q the smoothed target) it matches too: "
                 f"{entropy.item():.4f}", floor.detach(), entropy,
                 _LS_AXES if main_ok else None,  # else the first probe has named it
                 lambda **kw: _smoothed_ce(q.log(), floor_target, eps, pad, **kw).float())
        # stability: a logit gap of 200 makes softmax underflow to exactly 0
        wide = torch.full((3, v), -100.0)
        wide[:, 0] = 100.0
        wide_target = torch.tensor([0, 3, 5])
        out3 = run(report, wide, wide_target, "fn(logits with a gap of 200, target)")
        expected3 = reference(wide, wide_target)
        if not report.probe(_close(out3.detach(), expected3),
                            f"with a logit gap of 200 the loss is finite and right "
                            f"({expected3.item():.2f}; got {out3.item():.2f})"):
            if main_ok or not torch.isfinite(out3).all():
                report.mistake("ls_log_of_softmax", f"max abs diff "
                               f"{_max_diff(out3.detach(), expected3):.3g}")

    return _run_check("check_label_smoothing", body, verbose, fn)
