"""Check: the sinusoidal positional encoding (a table function or a module)."""
from __future__ import annotations

import math

import torch
from torch import nn

from tx_helpers.positional import sinusoidal_table

from .compare import (
    _as_output,
    _by_name,
    _close,
    _compare,
    _deterministic,
    _instantiate,
)
from .positional_probes import (
    _input_kept_probe,
    _loop_probe,
    _precision_probes,
    _start_probes,
    _train_mode_probe,
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
    if not isinstance(table, torch.Tensor) and hasattr(table, "__array__"):
        table = torch.as_tensor(table.__array__())  # a NumPy table is as good as a tensor
    table = _as_output(report, table, what)
    if table.dim() == 3 and 1 in table.shape[:2]:
        table = table.reshape(table.shape[0] * table.shape[1], table.shape[2])
    if table.dim() == 2 and table.shape[0] > max_len and table.shape[1] == d_model:
        table = table[:max_len]  # a longer table (a larger default max_len): its first rows
    if tuple(table.shape) != (max_len, d_model):
        report.probe(False, f"{what} has shape (max_len, d_model) = {(max_len, d_model)} "
                     f"(got {tuple(table.shape)})")
        report.mistake("wrong_output_shape")
        raise _Failed
    return table.float()


def _odd_probe(report: _Report, make, required: bool) -> None:
    """An odd d_model (15): the cos columns are one fewer than the sin columns.

    The paper's d_model is even, so by default a table that fails here is only a note;
    ``required`` (an exercise that asks for odd sizes) makes it a probe.
    """
    d = 15
    problem = None
    try:
        table = make(d)
        if not isinstance(table, torch.Tensor) and hasattr(table, "__array__"):
            table = torch.as_tensor(table.__array__())
        if isinstance(table, torch.Tensor):
            table = table.reshape(-1, table.shape[-1]).float()[:20]
        if not _close(table, sinusoidal_table(20, d)):
            problem = f"it does not give sinusoidal_table(20, {d})"
    except Exception as exc:  # noqa: BLE001 - reported below
        problem = (f"it raised {type(exc).__name__}: "
                   f"{str(exc).splitlines()[0] if str(exc) else ''}")
    if required:
        if report.probe(problem is None, f"an odd d_model ({d}) gives sinusoidal_table(20, {d})"
                        + (f" ({problem})" if problem else "")):
            return
        report.mistake("pe_odd_d_model")
    elif problem is not None:
        report.note(f"with an odd d_model ({d}) {problem}. The paper's d_model is even, so this "
                    "does not count; an exercise that asks for odd sizes checks it with "
                    "odd_d_model=True")


def _column_fit(x: torch.Tensor):
    """Fit one column x[p] = a sin(w p) + b cos(w p): (w, a, b, relative residual)."""
    x = x.double()
    p = torch.arange(len(x), dtype=torch.float64)
    mid = x[1:-1]
    denom = 2 * float((mid * mid).sum())
    if denom < 1e-12:
        return 0.0, 0.0, float(x[0]), 0.0 if float(x.abs().max()) < 1e-9 else 1.0
    c = max(-1.0, min(1.0, float(((x[2:] + x[:-2]) * mid).sum()) / denom))
    w = math.acos(c)
    basis = torch.stack([torch.sin(w * p), torch.cos(w * p)], 1)
    coef = torch.linalg.lstsq(basis, x.unsqueeze(1)).solution.squeeze(1)
    resid = float((basis @ coef - x).norm()) / max(float(x.norm()), 1e-12)
    return w, float(coef[0]), float(coef[1]), resid


def _describe_columns(report: _Report, table: torch.Tensor, d_model: int,
                      what: str = "the table") -> bool:
    """Read each column's frequency, phase and amplitude off the table and name the first
    columns that differ from sin/cos(pos / 10000^(2i/d_model)). Returns whether it named one."""
    table = table.detach().double()
    if table.shape[0] > 1 and torch.allclose(table, table[:1].expand_as(table), atol=1e-6):
        report.mistake("pe_same_rows", f"in {what}, all {table.shape[0]} rows are equal")
        return True
    found = []
    bases = []
    for col in range(table.shape[1]):
        i = col // 2
        w_ref = 10000.0 ** (-2 * i / d_model)
        want = "sin" if col % 2 == 0 else "cos"
        w, a, b, resid = _column_fit(table[:, col])
        amp = math.hypot(a, b)
        label = f"column {col} (pair i={i}, {want})"
        if amp < 1e-6 and resid < 1e-6:
            found.append(("pe_column_wrong", f"{label} is all zeros: it was never filled"))
            continue
        if resid > 1e-3:
            found.append(("pe_column_wrong", f"{label} is not a sinusoid of the position"))
            continue
        if abs(w - w_ref) > 1e-3 * max(w_ref, 1e-3):
            e = -math.log(max(w, 1e-300)) / math.log(10000.0) * d_model if w > 0 else float("nan")
            base = w ** (-d_model / (2 * i)) if i > 0 and 0 < w < 1 else None
            if base is not None:
                bases.append(base)
            found.append(("pe_frequency", f"{label} has frequency {w:.4g} = "
                          f"10000^(-{e:.3g}/d_model) where 10000^(-{2 * i}/d_model) = "
                          f"{w_ref:.4g} is expected"
                          + (f" (as if the base were {base:.4g} instead of 10000)"
                             if base is not None and abs(base - 10000) > 1 else "")))
            continue
        if abs(amp - 1.0) > 1e-3:
            found.append(("pe_amplitude", f"{label} has amplitude {amp:.4g} instead of 1"))
            continue
        phase = math.atan2(b, a)  # x = amp * sin(w p + phase)
        expected_phase = 0.0 if want == "sin" else math.pi / 2
        delta = (phase - expected_phase + math.pi) % (2 * math.pi) - math.pi
        if abs(delta) > 1e-3:
            other = "cos" if want == "sin" else "sin"
            if abs(abs(delta) - math.pi / 2) < 1e-3 and w > 1e-2:
                how = f"holds {other} where {want} is expected"
            elif w > 1e-2 and abs(delta / w - round(delta / w)) < 1e-2 and round(delta / w):
                how = (f"is shifted by {round(delta / w)} position(s): its row 0 is the "
                       f"value for position {round(delta / w)}")
            else:
                how = f"has phase {delta:+.3g} rad off the {want} of the position"
            found.append(("pe_phase", f"{label} {how}"))
    if not found:
        return False
    keys = list(dict.fromkeys(k for k, _ in found))
    for key in keys:
        details = [t for k, t in found if k == key]
        more = f" (and {len(details) - 2} more columns)" if len(details) > 2 else ""
        report.mistake(key, f"in {what}, " + "; ".join(details[:2]) + more)
    if len(bases) >= 2 and max(bases) / min(bases) < 1.02:
        report.note(f"every wrong frequency fits a base of {sum(bases) / len(bases):.4g} in "
                    "base^(-2i/d_model); the paper's base is 10000")
    return True


def check_positional_encoding(fn_or_cls, *, odd_d_model: bool = False,
                              computed_in_float64: bool = False,
                              no_loops: bool = False,
                              forward_start: bool = False,
                              train_mode: bool = False,
                              verbose: bool = True) -> CheckResult:
    """Check a sinusoidal positional encoding against :func:`tx_helpers.sinusoidal_table`.

    Accepts a function ``fn(max_len, d_model) -> (max_len, d_model)`` (a (1, max_len,
    d_model) table or a NumPy array is fine) or a class ``cls(d_model, max_len, dropout)``
    (other orders and usual names are built by keyword) with a table ``pe`` and/or
    ``forward(x)`` that adds the table to x of shape (N, L, d_model).

    By default the paper's definition is checked (its d_model is even); an odd d_model that
    fails is a note. ``odd_d_model=True`` makes it a probe, for an exercise that asks for it.
    When the table differs, each column's frequency, phase and amplitude are read off it and
    the first wrong columns are named.

    ``computed_in_float64=True`` (notebook 02's exercise, a function ``fn(max_len, d_model,
    dtype=torch.float32)``) also probes the contract's precision: a 512 x 128 table in the
    default float32 within 1e-6 of the float64 table rounded once, and ``dtype=torch.float64``
    giving a float64 table within 1e-9. Angles computed in float32 are off by 1e-6 to 1e-4
    at the far positions, so they fail both.

    ``no_loops=True`` (the same exercise, whose contract asks for tensor operations) also
    reads the function's own source: a ``for`` or ``while`` loop or a comprehension fails.

    ``forward_start=True`` (notebook 02's second exercise, a class) also probes
    ``forward(x, start)``: rows ``start .. start + L - 1`` are added, and positions past
    ``max_len`` raise a ValueError whose message names L, start and max_len.
    """
    max_len, d_model = 50, 16
    ref = sinusoidal_table(max_len, d_model)

    def variant_table(**kw):
        return _pe_variant(max_len, d_model, **kw)

    def compare_table(report, what, table):
        ok = _compare(report, what, table, ref, _PE_AXES, variant_table, _first_rows)
        if not ok and "mismatch" in report.found:
            if _describe_columns(report, table, d_model, what.split(" ")[0]):
                report.found.pop("mismatch", None)
        return ok

    def body(report: _Report):
        is_class = isinstance(fn_or_cls, type) and issubclass(fn_or_cls, nn.Module)
        if not is_class and not isinstance(fn_or_cls, nn.Module):
            table = _call(report, f"fn({max_len}, {d_model})", fn_or_cls, max_len, d_model)
            table = _squeeze_table(report, table, max_len, d_model, f"fn({max_len}, {d_model})")
            if compare_table(report, "the table matches sinusoidal_table (sin on even columns, "
                             "cos on odd, frequencies 1/10000^(2i/d_model))", table):
                _odd_probe(report, lambda d: fn_or_cls(20, d), odd_d_model)
                if computed_in_float64:
                    _precision_probes(report, fn_or_cls)
                if no_loops:
                    _loop_probe(report, fn_or_cls)
            return
        roles = ("d_model", "max_len", "dropout")
        module = _instantiate(report, fn_or_cls, (d_model, max_len, 0.1),
                              f"cls(d_model={d_model}, max_len={max_len}, dropout=0.1)", roles)
        pe = getattr(module, "pe", None)
        if not isinstance(pe, torch.Tensor):  # another name: the one tensor of the right size
            tensors = [t for t in list(module.buffers()) + list(vars(module).values())
                       if isinstance(t, torch.Tensor) and t.dim() in (2, 3)
                       and t.shape[-1] == d_model and t.numel() >= max_len * d_model]
            pe = tensors[0] if len(tensors) == 1 else None
        if isinstance(pe, torch.Tensor):
            buffers = {id(b) for b in module.buffers()}
            params = {id(p): p for p in module.parameters()}
            if id(pe) in params and pe.requires_grad:
                report.probe(False, "the table is not trained (a buffer, or a Parameter with "
                             "requires_grad=False)")
                report.mistake("pe_not_buffer", "it is an nn.Parameter, so the optimizer would "
                               "train it")
            elif id(pe) in params:
                report.note("the table is a frozen nn.Parameter: it is never trained, but a "
                            "buffer (register_buffer) is the usual home for a fixed table")
            elif id(pe) not in buffers:
                report.note("the table is a plain attribute, not a registered buffer: "
                            "module.to(device) would leave it behind and state_dict would not "
                            "hold it (register_buffer avoids both)")
            table = _squeeze_table(report, pe.detach(), max_len, d_model, "pe")
            if compare_table(report, "pe matches sinusoidal_table", table):
                def odd(d):
                    roles_odd = _by_name(fn_or_cls, roles, (d, 20, 0.1))
                    try:
                        made = fn_or_cls(d, 20, 0.1)
                    except Exception:  # noqa: BLE001 - try the keyword form
                        if roles_odd is None:
                            raise
                        made = fn_or_cls(**roles_odd)
                    return made.pe
                _odd_probe(report, odd, odd_d_model)
        else:
            report.note("no `pe` attribute found: only forward(x) is checked")
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(3, 7, d_model, generator=gen)
        if (isinstance(pe, torch.Tensor) and pe.dim() == 3 and pe.shape[1] == 1
                and pe.shape[0] > 1):  # PyTorch's tutorial layout: pe (max_len, 1, d_model)
            x_sf = x.transpose(0, 1).contiguous()  # (L, N, d_model)
            try:
                got = module(x_sf.clone())
                got = got[0] if isinstance(got, (tuple, list)) else got
                seq_first = _close(got, x_sf + ref[:7].unsqueeze(1))
            except Exception:  # noqa: BLE001 - then it is checked as (N, L, d_model) below
                seq_first = False
            if seq_first:
                report.probe(True, "forward(x) with x (L=7, N=3, d_model) returns x + pe[:L] "
                             "(sequence-first layout, eval mode)")
                report.note("pe is (max_len, 1, d_model) and forward takes x as (L, N, "
                            "d_model), sequence first, as in PyTorch's own tutorial: right "
                            "for that layout; the exercises here use (N, L, d_model)")
                return
        out = _as_output(report, _call(report, "forward(x) with x (N=3, L=7, d_model)",
                                       module, x.clone(),
                                       shape_hint="the table has max_len rows; an input of "
                                       "length L uses its first L rows"))
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
        if not _compare(report, "forward(x) returns x + pe[:L] (eval mode, no dropout)", out,
                        expected, axes, variant_forward, lambda t: t[:, :4]):
            if "mismatch" in report.found:
                _localize_forward(report, module, x, out, d_model)
        elif _input_kept_probe(report, module, x):
            if forward_start:
                _start_probes(report, module, x, ref, max_len)
            if train_mode and not report.found and all(ok for ok, _ in report.probes):
                _train_mode_probe(report, module, x, ref)

    return _run_check("check_positional_encoding", body, verbose, fn_or_cls)


def _localize_forward(report: _Report, module, x, out, d_model) -> None:
    """Split forward(x) into what it does to x and what it adds: forward(0) is the added part."""
    try:
        added = module(torch.zeros_like(x))
        added = added[0] if isinstance(added, (tuple, list)) else added
    except Exception:  # noqa: BLE001 - forward(x) worked; nothing more to say
        return
    if not isinstance(added, torch.Tensor) or added.shape != out.shape:
        return
    named = False
    through = (out - added).double()
    if not _close(through, x):
        ratio = float((through * x.double()).sum() / (x.double() ** 2).sum())
        if _close(through, ratio * x.double()):
            report.mistake("pe_input_changed", f"forward multiplies x by {ratio:.4g} before "
                           "adding the table")
        else:
            report.mistake("pe_input_changed", "forward(x) - forward(0) is not x: the input "
                           "is changed, not only added to")
        named = True
    if not _close(added, added[:1].expand_as(added)):
        report.mistake("pe_seq_first", "the added table differs between batch elements")
        named = True
    elif not _close(added[0], sinusoidal_table(added.shape[1], d_model)):
        named |= _describe_columns(report, added[0], d_model, "the table forward adds")
    if named:
        report.found.pop("mismatch", None)
