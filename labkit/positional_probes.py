"""Probes of check_positional_encoding beyond the table's values: a ``forward(x, start)``
that offsets into the table and refuses a sequence past ``max_len`` (notebook 02's second
exercise), dropout in train mode (the same exercise: once, on x + pe), and a table computed in
float64 (a 512 x 128 table in float32 and float64), a table built without Python loops, and a
forward that leaves the caller's x unchanged."""
from __future__ import annotations

import ast
import inspect
import os
import re
import sys
import sysconfig
import textwrap

import torch

from .compare import (
    _as_output,
    _close,
    dropout_stand_in,
    run_with_stand_in_dropout,
)
from .report import _call, _explain, _Report


def _start_probes(report: _Report, module, x, ref, max_len: int) -> None:
    """forward(x, start): the rows of positions start .. start + L - 1, or a ValueError."""
    length, start = x.size(1), 3
    out = _as_output(report, _call(report, f"forward(x, start={start}) with L={length}", module,
                                   x.clone(), start=start))
    if not report.probe(_close(out, x + ref[start:start + length]),
                        f"forward(x, start={start}) returns x + pe[{start}:{start + length}]"):
        if _close(out, x + ref[:length]):
            report.mistake("pe_start_ignored", f"forward(x, start={start}) added pe[:{length}]")
        else:
            report.mistake("mismatch", f"forward(x, start={start}) differs from "
                           f"x + pe[{start}:{start + length}]")
        return
    fit = max_len - length  # the last L positions of the table: they all exist
    try:
        out = module(x.clone(), start=fit)
    except Exception as exc:  # noqa: BLE001 - an off-by-one bound refuses the table's end
        first = str(exc).splitlines()[0] if str(exc) else ""
        report.probe(False, f"forward(x, start={fit}) with L={length} and max_len={max_len} "
                     f"uses the table's last rows (it raised {type(exc).__name__}: {first})")
        report.mistake("pe_length_off_by_one", f"start + L == max_len raised {type(exc).__name__}")
        return
    if not report.probe(_close(out, x + ref[fit:fit + length]),
                        f"forward(x, start={fit}) with L={length} and max_len={max_len} "
                        f"returns x + pe[{fit}:{max_len}]"):
        report.mistake("mismatch", f"forward(x, start={fit}) differs from x + pe[{fit}:]")
        return
    late = max_len - length + 1  # one position past the table's end
    what = (f"forward(x, start={late}) with L={length} and max_len={max_len} raises a "
            f"ValueError naming L, start and max_len")
    try:
        module(x.clone(), start=late)
    except ValueError as exc:
        msg = str(exc)
        numbers = set(re.findall(r"\d+", msg))  # whole numbers: "7" is not found inside "47"
        named = {str(length), str(late), str(max_len)} <= numbers
        if not report.probe(named, what + ("" if named else f" (it says: {msg})")):
            report.mistake("pe_length_message", f"the message was: {msg}")
        return
    except Exception as exc:  # noqa: BLE001 - the unchecked slice's own error
        first = str(exc).splitlines()[0] if str(exc) else ""
        report.probe(False, f"{what} (it raised {type(exc).__name__}: {first})")
        report.mistake("pe_no_length_check", f"{type(exc).__name__}: {first}")
        return
    report.probe(False, f"{what} (it returned without an error)")
    report.mistake("pe_no_length_check", "it returned an output for positions the table lacks")


def _input_kept_probe(report: _Report, module, x) -> bool:
    """forward must leave the caller's x as it was: `x += pe` rewrites the embeddings in place."""
    given = x.clone()
    try:
        module(given)
    except Exception:  # noqa: BLE001 - forward(x) already worked on a copy; nothing to add
        return True
    if report.probe(torch.equal(given, x), "forward(x) leaves the caller's x unchanged"):
        return True
    report.mistake("pe_input_modified", "after forward(x), x itself holds x + pe (x += ... or "
                   "x.add_(...)): return x + rows instead")
    return False


def _table_float64(max_len: int, d_model: int) -> torch.Tensor:
    """The table with every step in float64 (the precision probes' reference)."""
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * omega)
    pe[:, 1::2] = torch.cos(pos * omega[: d_model // 2])
    return pe  # (max_len, d_model)


def _precision_probes(report: _Report, fn) -> None:
    """512 x 128: float32 by default within 1e-6 of float64-then-rounded; float64 within 1e-9."""
    max_len, d_model = 512, 128
    ref = _table_float64(max_len, d_model)
    for kwargs, dtype, tol in (({}, torch.float32, 1e-6), ({"dtype": torch.float64},
                                                          torch.float64, 1e-9)):
        call = f"fn({max_len}, {d_model}" + (", dtype=torch.float64)" if kwargs else ")")
        text = (f"{call} is a {str(dtype).replace('torch.', '')} table within {tol:.0e} of the "
                "table computed in float64" + (" and rounded once" if not kwargs else ""))
        try:
            table = fn(max_len, d_model, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if kwargs and isinstance(exc, TypeError) and "dtype" in msg:
                report.probe(False, f"{text} (it raised TypeError: {msg})")
                report.mistake("pe_dtype_ignored", "fn does not take the dtype argument")
            else:
                _explain(report, call, exc)
            return
        if not isinstance(table, torch.Tensor) or tuple(table.shape) != (max_len, d_model):
            report.probe(False, f"{text} (got {type(table).__name__} of shape "
                         f"{tuple(getattr(table, 'shape', ()))})")
            report.mistake("wrong_output_shape")
            return
        err = float((table.double() - ref).abs().max())
        if report.probe(table.dtype == dtype and err < tol, text):
            continue
        if table.dtype != dtype:
            report.mistake("pe_dtype_ignored", f"{call} returned {table.dtype}")
        elif err < 1e-2:
            report.mistake("pe_low_precision", f"{call} is off by up to {err:.1e}, above "
                           f"{tol:.0e}")
        else:
            report.mistake("mismatch", f"{call} differs from the table by up to {err:.3g}")


_LOOPS = {ast.For: "a for loop", ast.While: "a while loop", ast.ListComp: "a comprehension",
          ast.GeneratorExp: "a comprehension", ast.SetComp: "a comprehension",
          ast.DictComp: "a comprehension"}


def _loop_probe(report: _Report, fn) -> None:
    """No Python loop: none in the function's own source (IPython keeps cell sources), and none
    hidden in a helper, a ``map`` or a recursion (its Python calls do not grow with d_model)."""
    target = getattr(fn, "func", fn)  # a functools.partial
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        tree = None
    found = [] if tree is None else sorted(
        {(node.lineno, kind) for node in ast.walk(tree)
         for cls, kind in _LOOPS.items() if isinstance(node, cls)})
    text = "the table is built with tensor operations, without a Python loop"
    if found:
        report.probe(False, text)
        report.mistake("pe_python_loop", f"{found[0][1]} on line {found[0][0]} of the function")
        return
    try:
        few, many = _python_calls(fn, 6, 8), _python_calls(fn, 6, 32)
    except Exception:  # noqa: BLE001 - the value probes already reported errors
        few = many = 0
    if report.probe(many <= few, text):
        if tree is None:
            report.note("the function's source could not be read: 'no Python loops' was "
                        "checked by counting its calls only")
        return
    report.mistake("pe_python_loop", f"its Python calls grow with d_model ({few} at d_model=8, "
                   f"{many} at 32): a loop hides in a helper, a map() or a recursion")


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    here = os.path.dirname(os.path.abspath(__file__))
    return tuple(dirs | {here, os.path.join(os.path.dirname(here), "tx_helpers")})


def _python_calls(fn, max_len: int, d_model: int) -> int:
    """Calls (Python and builtin) made by code outside the libraries during fn(max_len, d_model).

    A table built from tensor operations makes the same number at any width; a loop, however
    it is written, makes more. Any profiler already running (the delegation watch) still sees
    every event."""
    skip = _library_dirs()
    outer = sys.getprofile()
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call") and not frame.f_code.co_filename.startswith(skip):
            count += 1
        if outer is not None:
            outer(frame, event, arg)

    sys.setprofile(profile)
    try:
        fn(max_len, d_model)
    finally:
        sys.setprofile(outer)
    return count


def _train_mode_probe(report: _Report, module, x, ref) -> None:
    """Train mode: the module's nn.Dropout acts once, on the sum x + pe[:L].

    Each nn.Dropout returns :func:`~labkit.compare.dropout_stand_in` of its input, so
    the expected output is ``dropout_stand_in(x + pe[:L])``: no random numbers are compared.
    A forward that never calls an nn.Dropout submodule fails (``pe_dropout_unused``), even when
    ``F.dropout`` changes its output: the contract names ``self.dropout``, and where a
    functional dropout acts cannot be seen.
    """
    length = x.size(1)
    text = "train mode: dropout acts once, on the sum x + pe[:L]"
    out, seen, changed = run_with_stand_in_dropout(module, lambda: _as_output(
        report, _call(report, "forward(x) in train mode", module, x.clone())))
    if not seen:
        report.probe(False, text + " (self.dropout, the module's nn.Dropout, was never called)")
        report.mistake("pe_dropout_unused", "in train mode self.dropout is never called"
                       + (": the output changes, but not through the module the contract "
                          "names (F.dropout given self.dropout.p?)" if changed
                          else " and the output equals the eval-mode output"))
        return
    if report.probe(_close(out, dropout_stand_in(x + ref[:length])), text):
        return
    total = sum(t.numel() for t in seen)

    def received(target):
        return any(t.numel() == target.numel() and _close(t.reshape(target.shape), target)
                   for t in seen)

    if total > x.numel():
        report.mistake("pe_dropout_misplaced", f"dropout saw {total} numbers in one forward, "
                       f"where x + pe holds {x.numel()}: it acts more than once")
    elif received(x):
        report.mistake("pe_dropout_misplaced", "self.dropout received x alone, before the "
                       "table rows were added")
    elif received(ref[:length]):
        report.mistake("pe_dropout_misplaced", "self.dropout received the table rows alone, "
                       "not their sum with x")
    else:
        report.mistake("mismatch", "in train mode the output differs from dropout applied "
                       "to x + pe[:L]")
