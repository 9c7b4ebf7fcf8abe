"""Check: the sinusoidal positional encoding (a table function or a module)."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..positional import sinusoidal_table
from .compare import (
    _as_output,
    _close,
    _compare,
    _deterministic,
    _instantiate,
)
from .report import CheckResult, _call, _Failed, _Report, _run_check


def _pe_variant(max_len, d_model, swap=False, layout="interleaved", exponent="2i", start=0):
    pos = torch.arange(start, start + max_len, dtype=torch.float32).unsqueeze(1)
    pairs = (d_model + 1) // 2
    if exponent == "2i":
        ex = torch.arange(0, d_model, 2, dtype=torch.float32)
    elif exponent == "i":
        ex = torch.arange(pairs, dtype=torch.float32)
    elif exponent == "column":
        ex = None
    else:  # inverted: pos * 10000^(2i/d)
        ex = torch.arange(0, d_model, 2, dtype=torch.float32)
    first, second = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
    pe = torch.zeros(max_len, d_model)
    if exponent == "column":
        cols = torch.arange(d_model, dtype=torch.float32)
        ang = pos / torch.pow(10000.0, cols / d_model)
        pe[:, 0::2] = first(ang[:, 0::2])
        pe[:, 1::2] = second(ang[:, 1::2])
        return pe
    if exponent == "inverted":
        ang = pos * torch.pow(10000.0, ex / d_model)
    else:
        ang = pos / torch.pow(10000.0, ex / d_model)  # (max_len, pairs)
    if layout == "interleaved":
        pe[:, 0::2] = first(ang)
        pe[:, 1::2] = second(ang[:, : d_model // 2])
    else:
        pe[:, :pairs] = first(ang)
        pe[:, pairs:] = second(ang[:, : d_model - pairs])
    return pe


_PE_AXES = {
    "swap": [False, ("pe_sin_cos_swapped", True)],
    "layout": ["interleaved", ("pe_concatenated", "halves")],
    "exponent": ["2i", ("pe_exponent_i", "i"), ("pe_exponent_column", "column"),
                 ("pe_frequency_inverted", "inverted")],
    "start": [0, ("pe_positions_from_1", 1)],
}


def _first_rows(t):
    return t[:4]


def _squeeze_table(report: _Report, table, max_len, d_model, what):
    table = _as_output(report, table, what)
    if table.dim() == 3 and 1 in table.shape[:2]:
        table = table.reshape(table.shape[0] * table.shape[1], table.shape[2])
    if tuple(table.shape) != (max_len, d_model):
        report.probe(False, f"{what} has shape (max_len, d_model) = {(max_len, d_model)} "
                     f"(got {tuple(table.shape)})")
        report.mistake("wrong_output_shape")
        raise _Failed
    return table.float()


def _odd_probe(report: _Report, make) -> None:
    """An odd d_model (15): the cos columns are one fewer than the sin columns."""
    d = 15
    try:
        table = make(d)
        table = table.reshape(-1, table.shape[-1]).float() if isinstance(
            table, torch.Tensor) else table
    except Exception as exc:  # noqa: BLE001 - reported as the mistake below
        report.probe(False, f"an odd d_model ({d}) works (raised {type(exc).__name__}: "
                     f"{str(exc).splitlines()[0] if str(exc) else ''})")
        report.mistake("pe_odd_d_model")
        return
    ok = _close(table, sinusoidal_table(20, d)) if isinstance(table, torch.Tensor) else False
    if not report.probe(ok, f"an odd d_model ({d}) gives sinusoidal_table(20, {d})"):
        report.mistake("pe_odd_d_model")


def check_positional_encoding(fn_or_cls, *, verbose: bool = True) -> CheckResult:
    """Check a sinusoidal positional encoding against :func:`tx_helpers.sinusoidal_table`.

    Accepts a function ``fn(max_len, d_model) -> (max_len, d_model)`` or a class
    ``cls(d_model, max_len, dropout)`` with a buffer ``pe`` and/or ``forward(x)``
    that adds the table to x of shape (N, L, d_model).
    """
    max_len, d_model = 50, 16
    ref = sinusoidal_table(max_len, d_model)

    def variant_table(**kw):
        return _pe_variant(max_len, d_model, **kw)

    def body(report: _Report):
        is_class = isinstance(fn_or_cls, type) and issubclass(fn_or_cls, nn.Module)
        if not is_class and not isinstance(fn_or_cls, nn.Module):
            table = _call(report, f"fn({max_len}, {d_model})", fn_or_cls, max_len, d_model)
            table = _squeeze_table(report, table, max_len, d_model, f"fn({max_len}, {d_model})")
            if _compare(report, "the table matches sinusoidal_table (sin on even columns, cos on "
                        "odd, frequencies 1/10000^(2i/d_model))", table, ref, _PE_AXES,
                        variant_table, _first_rows):
                _odd_probe(report, lambda d: fn_or_cls(20, d))
            return
        module = _instantiate(report, fn_or_cls, (d_model, max_len, 0.1),
                              f"cls(d_model={d_model}, max_len={max_len}, dropout=0.1)")
        pe = getattr(module, "pe", None)
        if isinstance(pe, torch.Tensor):
            buffers = dict(module.named_buffers(recurse=False))
            params = dict(module.named_parameters(recurse=False))
            if "pe" in buffers:
                report.probe(True, "pe is a registered buffer")
            else:
                report.probe(False, "pe is a registered buffer")
                report.mistake("pe_not_buffer", "it is an nn.Parameter, so the optimizer would "
                               "train it" if "pe" in params else "it is a plain attribute: "
                               ".to(device) would leave it behind")
            table = _squeeze_table(report, pe.detach(), max_len, d_model, "pe")
            if _compare(report, "pe matches sinusoidal_table", table, ref, _PE_AXES,
                        variant_table, _first_rows):
                _odd_probe(report, lambda d: fn_or_cls(d, 20, 0.1).pe)
        else:
            report.note("no `pe` attribute found: only forward(x) is checked")
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(3, 7, d_model, generator=gen)
        out = _as_output(report, _call(report, "forward(x) with x (N=3, L=7, d_model)",
                                       module, x.clone(),
                                       shape_hint="slice the table to the input length: "
                                       "self.pe[:x.size(1)]"))
        expected = x + ref[:7]
        axes = dict(_PE_AXES)
        axes["extra"] = [None, ("pe_scales_input", "scale"), ("pe_seq_first", "seq_first")]

        def variant_forward(extra=None, **kw):
            table = variant_table(**kw)
            if extra == "scale":
                return x * math.sqrt(d_model) + table[:7]
            if extra == "seq_first":
                return x + table[:3].unsqueeze(1)
            return x + table[:7]

        _deterministic(report, lambda: module(x.clone()), out)
        _compare(report, "forward(x) returns x + pe[:L] (eval mode, no dropout)", out,
                 expected, axes, variant_forward, lambda t: t[:, :4])

    return _run_check("check_positional_encoding", body, verbose, fn_or_cls)



