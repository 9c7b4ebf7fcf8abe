"""Check: one training step, against tx.train_step."""
from __future__ import annotations

import inspect
import math
import warnings

import torch
from torch import nn

from tx_helpers.config import ModelConfig
from tx_helpers.model import Transformer
from tx_helpers.training import noam_scheduler

from .compare import (
    _close,
    _compare,
)
from .localize_loss import StepTrace, localise_step
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Failed, _Report, _run_check

MISTAKES.update({
    "zero_grad_at_end": ("the gradients were cleared after the update, not before this step's "
                         "backward, so the stale gradients the model arrived with reached the "
                         "first update",
                         "the model may arrive with gradients left by earlier code (an "
                         "evaluation, an inspection's backward): clear them before this step's "
                         "gradients are added"),
})

_STEP_SHAPES = ("the batch is (src (N, L_src), tgt_in (N, L_tgt), tgt_out (N, L_tgt)); the "
                "logits are (N, L_tgt, V); the criterion takes (N * L_tgt, V) and "
                "(N * L_tgt,)")


def _step_batches(n_steps: int, gen) -> list:
    """Right-padded copy-with-noise batches: pad 0, bos 1, eos 2, tokens 3..10."""
    batches = []
    for _ in range(n_steps):
        src = torch.randint(3, 11, (4, 6), generator=gen)  # (N, L_src)
        src[1, 4:], src[3, 3:] = 0, 0
        body = torch.randint(3, 11, (4, 4), generator=gen)
        tgt = torch.cat([torch.ones(4, 1, dtype=torch.long), body,
                         torch.full((4, 1), 2)], 1)  # (N, 6): <bos> y <eos>
        tgt[2, 4:] = torch.tensor([2, 0])
        batches.append((src, tgt[:, :-1], tgt[:, 1:]))
    return batches


def _number(x) -> float:
    """A float from a Python number or a one-element tensor (which may require grad)."""
    return x.item() if isinstance(x, torch.Tensor) else float(x)


def _legacy_order(fn) -> bool:
    """True for the older ``fn(model, batch, optimizer, scheduler, criterion, ...)`` order."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return names[3:5] == ["scheduler", "criterion"]


def _pair(r):
    """(loss, grad_norm) from a dict like tx.train_step's, or from a 2-tuple."""
    if isinstance(r, dict) and "loss" in r and "grad_norm" in r:
        return _number(r["loss"]), _number(r["grad_norm"])
    if isinstance(r, (tuple, list)) and len(r) == 2:
        return _number(r[0]), _number(r[1])
    raise TypeError("no loss and grad_norm")


def check_train_step(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0) -> dict``,
    the signature and return of :func:`tx_helpers.train_step`: one training step whose dict
    holds at least ``loss`` and ``grad_norm`` (before clipping).

    The older order ``fn(model, batch, optimizer, scheduler, criterion, clip_norm)`` returning
    ``(loss, grad_norm)`` is still accepted (recognised by its parameter names).

    Three steps from the same start must give the reference's losses, norms and weights. A
    plain SGD (lr = the Noam rate) makes zeroing, clipping and the schedule's order visible.
    The model is handed over in eval mode and with stale gradients (as after an evaluation or an
    inspection's backward; clearing them only after the update is ``zero_grad_at_end``), and the
    first step is traced (:class:`.localize_loss.StepTrace`): the forward pass must run in train
    mode, and when the numbers differ the trace names the part: the calls in order,
    the norm after backward and at the update (clipping after the step, by value), the
    returned loss and norm.
    """
    n_steps, clip = 3, 0.1
    batches = _step_batches(n_steps, torch.Generator().manual_seed(12))
    config = ModelConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2, d_ff=32,
                         n_layers=1, dropout=0.0, max_len=16, pad_idx=0)
    torch.manual_seed(13)
    start = Transformer(config).state_dict()

    def fresh():
        model = Transformer(config)
        model.load_state_dict(start)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = noam_scheduler(optimizer, config.d_model, warmup=2, factor=20.0)
        return model, optimizer, scheduler, nn.CrossEntropyLoss(ignore_index=0,
                                                                 label_smoothing=0.1)

    def flat(model):
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    def stale(model):  # gradients left on the model by earlier code (an inspection's backward)
        g = torch.Generator().manual_seed(14)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)

    def variant(zero_grad=True, max_norm=clip, schedule="after", dec_in=1, labels=2):
        model, optimizer, scheduler, criterion = fresh()
        stale(model)
        losses, norms = [], []
        for i, batch in enumerate(batches):
            logits = model(batch[0], batch[dec_in])  # (N, L_tgt, V)
            loss = criterion(logits.reshape(-1, logits.size(-1)), batch[labels].reshape(-1))
            if zero_grad is True or (zero_grad == "end" and i > 0):  # "end": after the update
                optimizer.zero_grad()
            loss.backward()
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(),
                                                        max_norm or math.inf)))
            if schedule == "before":
                with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()"
                    warnings.simplefilter("ignore")
                    scheduler.step()
            optimizer.step()
            if schedule == "after":
                scheduler.step()
            losses.append(loss.item())
        return torch.tensor(losses), torch.tensor(norms), flat(model)

    def body(report: _Report):
        with torch.enable_grad():
            model, optimizer, scheduler, criterion = fresh()
            model.eval()  # handed over as after an evaluation: the step must switch to train
            stale(model)  # with stale gradients: only this step's may reach the update
            returned = []
            legacy = _legacy_order(fn)
            order = "scheduler, criterion" if legacy else "criterion, scheduler"
            for i, batch in enumerate(batches):
                args = (scheduler, criterion) if legacy else (criterion, scheduler)
                trace = StepTrace(model, optimizer, scheduler) if i == 0 else None
                try:
                    returned.append(_call(report, f"step {i + 1}: fn(model, batch, optimizer, "
                                          f"{order}, clip_norm={clip})", fn, model, batch,
                                          optimizer, *args, clip_norm=clip,
                                          shape_hint=_STEP_SHAPES))
                finally:
                    if trace is not None:
                        left_norm = trace.after()
                        first = trace
            report.probe(True, f"{n_steps} steps ran without an exception")
            if not report.probe(bool(first.modes) and all(first.modes),
                                "the forward pass runs in train mode"):
                report.mistake("step_eval_mode")
            ref_losses, ref_norms, ref_params = variant()
            params = flat(model)
            if not report.probe(not torch.equal(params, flat(fresh()[0])),
                                "the parameters change"):
                report.mistake("no_update")
                raise _Failed
            try:
                pairs = [_pair(r) for r in returned]
                losses = torch.tensor([p[0] for p in pairs])
                norms = torch.tensor([p[1] for p in pairs])
            except (TypeError, ValueError, RuntimeError):
                pairs = []
            what = ("returns (loss, grad_norm) as numbers" if legacy else
                    "returns a dict with loss and grad_norm, like tx.train_step")
            if report.probe(len(pairs) == n_steps, what):
                _compare(report, "the losses of the three steps match the reference", losses,
                         ref_losses)
                if not _compare(report, "the returned norms are the norms before clipping",
                                norms, ref_norms) and _close(norms, torch.full_like(norms, clip)):
                    report.found.pop("mismatch", None)
                    report.mistake("grad_norm_after_clip")
            else:
                report.mistake("wrong_return", f"got {returned[0]!r}"[:120])
            axes = {"zero_grad": [True, ("no_zero_grad", False), ("zero_grad_at_end", "end")],
                    "max_norm": [clip, ("no_clipping", None)],
                    "schedule": ["after", ("scheduler_not_stepped", "never"),
                                 ("scheduler_before_optimizer", "before")],
                    "dec_in": [1, ("decoder_reads_labels", 2)],
                    "labels": [2, ("labels_not_shifted", 1)]}
            _compare(report, f"the weights after {n_steps} steps match the reference", params,
                     ref_params, axes, lambda **kw: variant(**kw)[2])
            if report.found:  # which part of the step: its calls, order, mode, clipping
                named = set(report.found)
                localise_step(report, first, left_norm, pairs[0] if pairs else None,
                              float(ref_losses[0]), clip, int((batches[0][2] != 0).sum()))
                if set(report.found) - named:
                    report.found.pop("mismatch", None)
                    if "clip_after_step" in report.found:
                        report.found.pop("no_clipping", None)

    return _run_check("check_train_step", body, verbose, fn)



