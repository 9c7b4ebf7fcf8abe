"""Looking inside a model: parameter counts and a shape tracer."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) parameters; a tied Parameter is counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _shapes(obj) -> str:
    if isinstance(obj, torch.Tensor):
        return str(tuple(obj.shape))
    if isinstance(obj, (tuple, list)):
        parts = [_shapes(o) for o in obj]
        return ", ".join(p for p in parts if p)
    return ""


@dataclass
class ShapeTrace:
    """Rows of (module name, class, input shapes, output shape) in call order."""

    rows: list = field(default_factory=list)

    def __str__(self) -> str:
        header = ("module", "type", "input shapes", "output shape")
        table = [header] + [tuple(r) for r in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                 for r in table]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    __repr__ = __str__


def trace_shapes(module: nn.Module, *inputs, max_depth: int | None = None, **kwargs) -> ShapeTrace:
    """Run ``module(*inputs, **kwargs)`` once and tabulate every submodule's shapes.

    The article's advice, "print the shape after every step", done by forward
    hooks. ``max_depth`` limits how deep into the module tree the table goes
    (1 = direct children). Runs under ``torch.no_grad()``.
    """
    trace = ShapeTrace()
    handles = []
    slots = {}

    def pre_hook(name, mod):
        def hook(_mod, args, kw):
            all_in = list(args) + [v for v in kw.values() if isinstance(v, torch.Tensor)]
            slots.setdefault(name, []).append(len(trace.rows))
            trace.rows.append([name, type(mod).__name__, _shapes(all_in), ""])
        return hook

    def post_hook(name):
        def hook(_mod, _args, _kw, out):
            trace.rows[slots[name].pop()][3] = _shapes(out)
        return hook

    for name, mod in module.named_modules():
        if not name:
            name = type(module).__name__
        elif max_depth is not None and name.count(".") >= max_depth:
            continue
        handles.append(mod.register_forward_pre_hook(pre_hook(name, mod), with_kwargs=True))
        handles.append(mod.register_forward_hook(post_hook(name), with_kwargs=True))
    try:
        with torch.no_grad():
            module(*inputs, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return trace
