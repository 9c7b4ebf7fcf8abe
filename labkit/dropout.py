"""Train-mode probes: where dropout sits, seen through a deterministic stand-in.

Every other probe runs in eval mode, where dropout is the identity, so dropout applied
twice or after the residual add would go unnoticed. Here ``F.dropout`` (which ``nn.Dropout``
calls) is replaced, for one forward pass in train mode, by a fixed per-feature scaling:
the same for the learner and for the reference, so no random mask has to line up, and
LayerNorm cannot hide it (a per-feature scaling is not a constant factor).
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from .compare import _close
from .report import _Report
from .weights import locate


def _scaling(x: torch.Tensor) -> torch.Tensor:
    n = x.size(-1)
    return 1.0 + 0.5 * torch.cos(1.3 * torch.arange(n, dtype=x.dtype) + 0.7)


def _fake_dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - F's own names
    return input * _scaling(input) if training and p > 0 else input


@contextlib.contextmanager
def stand_in():
    """Train mode with F.dropout replaced by the fixed scaling, for the modules given."""
    real = F.dropout
    F.dropout = _fake_dropout
    try:
        yield
    finally:
        F.dropout = real


def _drop(x):
    return x * _scaling(x)


def _layer(x, steps, norm_first, kinds):
    """Run (sublayer, norm) steps, dropout placed at step i as ``kinds[i]`` says."""
    for (fn, norm), kind in zip(steps, kinds, strict=True):
        if norm_first:
            s = fn(_drop(norm(x)) if kind in ("on_input", "after_norm") else norm(x))
            x = {"right": x + _drop(s), "twice": x + _drop(_drop(s)),
                 "after_add": _drop(x + s), "missing": x + s, "on_residual": _drop(x) + s,
                 "on_input": x + s, "after_norm": x + s}[kind]
        else:
            s = fn(_drop(x) if kind == "on_input" else x)
            x = {"right": norm(x + _drop(s)), "twice": norm(x + _drop(_drop(s))),
                 "after_add": norm(_drop(x + s)), "missing": norm(x + s),
                 "on_residual": norm(_drop(x) + s), "on_input": norm(x + s),
                 "after_norm": _drop(norm(x + s))}[kind]
    return x


def _part(module, ref, name):
    """The learner's own submodule (its internal dropout is its own business), else ref's."""
    mine = locate(module, name)[0]
    return mine if mine is not None else getattr(ref, name)


def dropout_probe(report: _Report, module, ref, run_mine, parts, x, norm_first, *,
                  unknown_fails: bool = False) -> None:
    """Compare the learner's train-mode output with placements of dropout, under the stand-in.

    ``parts``: [(sublayer name, call(sublayer, h), norm name)] in order. The sublayers and
    norms are the learner's own, so only the placement around them is judged. A difference
    that matches no known placement is only a note (correct code may draw dropout elsewhere),
    or, with ``unknown_fails``, a failed probe named ``dropout_placement_unknown``.
    """
    module.train()
    ref.train()
    try:
        with stand_in():
            try:
                mine = run_mine(module)
                mine = mine[0] if isinstance(mine, (tuple, list)) else mine
                steps = [(functools.partial(call, _part(module, ref, sub)),
                          _part(module, ref, norm)) for sub, call, norm in parts]
                n = len(steps)
                if _close(mine, _layer(x, steps, norm_first, ["right"] * n)):
                    report.probe(True, "in train mode, dropout sits where the reference has "
                                 "it (seen through a fixed stand-in for dropout)")
                    return
                for kind, key in (("twice", "dropout_twice"),
                                  ("after_add", "dropout_after_residual"),
                                  ("missing", "residual_dropout_missing"),
                                  ("on_residual", "dropout_on_residual"),
                                  ("on_input", "dropout_on_sublayer_input"),
                                  ("after_norm", "dropout_after_norm")):
                    placements = [[kind] * n] + [["right"] * i + [kind] + ["right"] * (n - i - 1)
                                                 for i in range(n)]
                    if any(_close(mine, _layer(x, steps, norm_first, p)) for p in placements):
                        report.probe(False, "in train mode, dropout sits where the reference "
                                     "has it (seen through a fixed stand-in for dropout)")
                        report.mistake(key)
                        return
            except Exception:  # noqa: BLE001 - eval mode worked; an odd layout: no verdict
                return
            if unknown_fails:
                report.probe(False, "in train mode, dropout sits where the reference has it "
                             "(seen through a fixed stand-in for dropout)")
                report.mistake("dropout_placement_unknown")
                return
            report.note("in train mode the output differs from the usual dropout placements "
                        "although eval mode matches: check where dropout is applied")
    finally:
        module.eval()
        ref.eval()
