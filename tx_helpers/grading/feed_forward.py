"""Check: the position-wise feed-forward block."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers import FeedForward
from .compare import (
    _as_output,
    _compare,
    _deterministic,
    _instantiate,
)
from .localize import ffn_probe, hidden_width_probe
from .report import CheckResult, _call, _Failed, _Report, _run_check
from .weights import copy_reference


def check_feed_forward(cls, *, verbose: bool = True) -> CheckResult:
    """Check ``cls(d_model, d_ff, dropout)`` with ``linear1``, ``linear2`` against
    :class:`tx_helpers.FeedForward` (linear2(dropout(relu(linear1(x))))."""
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
                                       shape_hint="linear1: d_model -> d_ff, "
                                       "linear2: d_ff -> d_model"))

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
        if report.only_mismatch():
            ffn_probe(report, module, _owner(module, placed.get("linear1.weight")),
                      _owner(module, placed.get("linear2.weight")), x)

    return _run_check("check_feed_forward", body, verbose, cls)





def _owner(module, weight):
    """The learner's Linear that holds ``weight`` (the tensor the reference was copied into)."""
    if weight is None:
        return None
    ptr = weight.data_ptr()
    return next((m for m in module.modules() if isinstance(m, torch.nn.Linear)
                 and m.weight.data_ptr() == ptr and m.weight.shape == weight.shape), None)
