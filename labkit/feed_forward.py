"""Check: the position-wise feed-forward block."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tx_helpers.layers import FeedForward

from .compare import (
    _as_output,
    _close,
    _compare,
    _deterministic,
    _instantiate,
)
from .localize import ffn_probe, hidden_width_probe
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Failed, _Report, _run_check
from .weights import copy_reference

MISTAKES.update({
    "ffn_dropout_missing": (
        "in train mode the feed-forward's output is that of eval mode: its dropout is never "
        "applied",
        "the exercise asks for dropout on the wide hidden vector, as in the package's block; "
        "a module that is built but never called does nothing"),
    "ffn_dropout_repeated": (
        "in train mode dropout acts on the hidden layer more than once",
        "each hidden activation is dropped once; a second pass drops more than the rate asks"),
    "ffn_activation_ignored": (
        "the class does not use the activation it is given: built with activation=F.gelu, "
        "it still applies ReLU or cannot be built",
        "the nonlinearity is an argument of the block, stored when it is built; the forward "
        "pass applies whatever was passed, ReLU only by default"),
})


def check_feed_forward(cls, *, hidden_dropout: bool = False, activation: bool = False,
                       verbose: bool = True) -> CheckResult:
    """Check ``cls(d_model, d_ff, dropout)`` with ``linear1``, ``linear2`` against
    :class:`tx_helpers.FeedForward` (linear2(dropout(relu(linear1(x))))).

    ``hidden_dropout=True`` (notebook 04's exercise) grades the train-mode placement as a
    probe: dropout once on the hidden layer, as tx has it; no dropout at all, or dropout
    applied twice, fails (by default no dropout passes: the paper has none inside the FFN).
    ``activation=True`` (notebook 04's exercise) also builds ``cls(d_model, d_ff, dropout,
    activation=F.gelu)`` and expects linear2(gelu(linear1(x))) in eval mode."""
    d_model, d_ff = 16, 48

    def body(report: _Report):
        module = _instantiate(report, cls, (d_model, d_ff, 0.1),
                              f"cls(d_model={d_model}, d_ff={d_ff}, dropout=0.1)",
                              ("d_model", "d_ff", "dropout"))
        torch.manual_seed(5)
        ref = FeedForward(d_model, d_ff, 0.1).eval()
        x = torch.randn(2, 5, d_model, generator=torch.Generator().manual_seed(6))
        try:
            placed = copy_reference(report, module, ref, warmup=lambda m: m(x),
                                    what="attributes linear1, linear2 are nn.Linear layers",
                                    strict=True)
        except _Failed:
            if hidden_width_probe(report, module, d_model, d_ff):
                report.found.pop("wrong_output_shape", None)
            raise
        no_bias = [n for n in ("linear1", "linear2") if n + ".bias" not in placed]
        if no_bias:  # the paper's FFN is max(0, x W1 + b1) W2 + b2
            report.probe(False, "linear1 and linear2 have biases (b1, b2 in the paper's "
                         "FFN(x) = max(0, x W1 + b1) W2 + b2)")
            report.mistake("ffn_no_bias", f"{' and '.join(no_bias)} built with bias=False")
        out = _as_output(report, _call(report, "forward(x)", module, x.clone(),
                                       shape_hint="linear1 maps d_model to d_ff, "
                                       "linear2 maps d_ff back to d_model"))

        def variant(act="relu", out_act=False, residual=False):
            h = ref.linear1(x)
            h = {"relu": F.relu, "none": lambda t: t, "gelu": F.gelu}[act](h)
            y = ref.linear2(h)
            y = F.relu(y) if out_act else y
            return y + x if residual else y

        axes = {"act": ["relu", ("ffn_no_activation", "none"), ("ffn_other_activation", "gelu")],
                "out_act": [False, ("ffn_activation_on_output", True)],
                "residual": [False, ("ffn_residual_inside", True)]}
        _deterministic(report, lambda: module(x.clone()), out)
        _compare(report, "output matches linear2(relu(linear1(x))) (eval mode)", out, ref(x),
                 axes, variant)
        lin1 = _owner(module, placed.get("linear1.weight"))
        lin2 = _owner(module, placed.get("linear2.weight"))
        if report.only_mismatch():
            ffn_probe(report, module, lin1, lin2, x)
        if not report.found and lin1 is not None and lin2 is not None:
            _dropout_placement(report, module, lin1, lin2, x, hidden_dropout)
        if activation and not report.found:
            _activation_probe(report, cls, ref, x, d_model, d_ff)

    return _run_check("check_feed_forward", body, verbose, cls)


def _activation_probe(report: _Report, cls, ref, x, d_model, d_ff) -> None:
    """``cls(..., activation=F.gelu)`` must apply GELU, not a hard-coded ReLU."""
    what = (f"cls(d_model={d_model}, d_ff={d_ff}, dropout=0.1, activation=F.gelu) gives "
            "linear2(gelu(linear1(x))) (eval mode)")
    try:
        module = cls(d_model, d_ff, 0.1, activation=F.gelu)
        module.load_state_dict(ref.state_dict(), strict=False)
        module.eval()
        with torch.no_grad():
            got = module(x.clone())
    except Exception as exc:  # noqa: BLE001 - reported as the probe's failure
        report.probe(False, f"{what} (it raised {type(exc).__name__})")
        report.mistake("ffn_activation_ignored", f"{type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}")
        return
    with torch.no_grad():
        want = ref.linear2(F.gelu(ref.linear1(x)))
        relu = ref(x)
    if report.probe(_close(got, want), what):
        return
    report.mistake("ffn_activation_ignored", "the output is ReLU's" if _close(got, relu)
                   else "the output is neither GELU's nor ReLU's")


def _owner(module, weight):
    """The learner's Linear that holds ``weight`` (the tensor the reference was copied into)."""
    if weight is None:
        return None
    ptr = weight.data_ptr()
    return next((m for m in module.modules() if isinstance(m, torch.nn.Linear)
                 and m.weight.data_ptr() == ptr and m.weight.shape == weight.shape), None)


def _dropout_placement(report: _Report, module, lin1, lin2, x, required=False) -> None:
    """Train mode, dropout replaced by a fixed per-feature scaling: where does it act?

    On the hidden activations (tx's choice) or nowhere (the paper drops only the sublayer's
    output, in the layer around it) passes; on the output or the input is named. With
    ``required`` only the hidden layer passes, as a probe.
    """
    from .dropout import _drop, stand_in

    def ffn(h_drop=False, out_drop=False, in_drop=False):
        h = F.relu(lin1(_drop(x) if in_drop else x))
        y = lin2(_drop(h) if h_drop else h)
        return _drop(y) if out_drop else y

    module.train()
    try:
        with stand_in():
            try:
                got = _as_output(report, module(x.clone()))
            except Exception:  # noqa: BLE001 - eval mode worked: no verdict here
                return
            what = ("in train mode, dropout acts once on the hidden layer (seen through a "
                    "fixed stand-in for dropout)")
            if _close(got, ffn(h_drop=True)):
                if required:
                    report.probe(True, what)
                return
            if _close(got, ffn()):
                if required:
                    report.probe(False, what)
                    report.mistake("ffn_dropout_missing")
                return
            h = F.relu(lin1(x))
            if required and _close(got, lin2(_drop(_drop(h)))):
                report.probe(False, what)
                report.mistake("ffn_dropout_repeated")
                return
            for kw, where in (({"out_drop": True}, "on the output of linear2"),
                              ({"h_drop": True, "out_drop": True}, "on the hidden layer and "
                               "again on the output"),
                              ({"in_drop": True}, "on the input x")):
                if _close(got, ffn(**kw)):
                    report.probe(False, "in train mode, dropout acts on the hidden layer only "
                                 "(seen through a fixed stand-in for dropout)")
                    report.mistake("ffn_dropout_position", where)
                    return
            if required:
                report.probe(False, what)
                report.mistake("ffn_dropout_position", "it matches none of the usual placements")
                return
            report.note("in train mode the output differs from the usual dropout placements "
                        "although eval mode matches: check where dropout is applied")
    finally:
        module.eval()
