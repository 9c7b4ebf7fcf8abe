"""Check: a learner's prediction (a shape, a number, a choice) against the value a cell computes.

The pattern, in three cells: a markdown cell asks the question; a code cell holds only the
answer, one assignment ending with ``### PREDICTION`` (the exercise copies turn it into
``name = ...``); the next code cell computes the true value and calls::

    labkit.check_prediction("output shape", predicted_shape, tuple(out.shape),
                                mistakes={(2, 8, 5, 16): "that is the split-heads layout"})

It prints one ✓/✗ line, the named mistake when the answer is a known wrong one, and the true
value, so the same cell grades and reveals. An unanswered ``...`` is reported, not raised: the
reveal still shows.
"""
from __future__ import annotations

import ast
import builtins
import math
import os
import re
import types
from numbers import Real

import torch

from .mistakes import MISTAKES
from .report import CheckResult, _Report

MISTAKES.update({
    "prediction_missing": ("no prediction was written",
                           "replace the ... in the prediction cell above with your answer, "
                           "run that cell, then this one"),
    "prediction_wrong": ("the prediction differs from the computed value",
                         "work out where your reasoning and the computation part ways, then "
                         "re-read the cells before the question"),
    "prediction_known_mistake": ("the prediction is a common wrong answer",
                                 "compare with the cells above that show where this goes wrong"),
    "prediction_pasted": ("the prediction reads a value the notebook computed instead of "
                          "stating one",
                          "write the value you worked out yourself, as a number, a shape or "
                          "a word, without the names of the notebook's variables"),
})


def _normalise(value):
    """Shapes and sequences as tuples of plain Python values; tensors of one element as numbers."""
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # arrays and scalars
        value = value.tolist()
    if isinstance(value, torch.Size):
        return tuple(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, list):
        return tuple(_normalise(v) for v in value)
    if isinstance(value, (tuple, range)):
        return tuple(_normalise(v) for v in value)
    if isinstance(value, (set, frozenset)):  # "which positions": {1, 3} is the list (1, 3)
        return tuple(sorted(_normalise(v) for v in value))
    if isinstance(value, str):  # case, spacing and "100 %" vs "100%" do not matter
        return re.sub(r"\s+%", "%", " ".join(value.split())).lower()
    return value


def _coerce(given, want):
    """A prediction typed as text ("True", "9", "0.5", "5%", "(4, 17, 128)") is read as the kind
    of the answer."""
    if not isinstance(given, str) or isinstance(want, str):
        return given
    text = given.strip().lower()
    if isinstance(want, bool):
        return {"true": True, "false": False}.get(text, given)
    if isinstance(want, Real):
        percent = text.endswith("%")
        try:
            number = float(text.rstrip("%").strip().replace(",", ""))
        except ValueError:
            return given
        return number / 100 if percent else number
    if isinstance(want, tuple):  # a shape or a list typed as text
        inner = re.fullmatch(r"torch\.size\(\s*(.*)\)", text)
        try:
            value = ast.literal_eval(inner.group(1) if inner else text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return given
        if isinstance(value, (int, float)):
            value = (value,)
        return _normalise(value) if isinstance(value, (tuple, list, set, int, float)) else given
    return given


def _same(given, want, tol: float | None, rel: float | None) -> bool:
    given, want = _normalise(given), _normalise(want)
    given = _coerce(given, want)
    numbers = all(isinstance(v, Real) and not isinstance(v, bool) for v in (given, want))
    if numbers and (tol is not None or rel is not None):
        bound = max(tol or 0.0, (rel or 0.0) * abs(want))
        return math.isfinite(given) and abs(given - want) <= bound
    if isinstance(want, bool) != isinstance(given, bool):
        return False  # True is not the answer 1
    return given == want


def _parse(source):
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, TypeError):
        return None


# what a prediction may call or read without pasting: modules, functions, classes
_TOOLS = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)


def _reads(node):
    """The outermost ``name`` or ``name.attr.attr`` chains ``node`` reads (Load context)."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name):
            return [node]
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return [node]
    return [leaf for child in ast.iter_child_nodes(node) for leaf in _reads(child)]


def _resolve(chain, namespace):
    """The value of a ``name.attr...`` chain in ``namespace`` (None if an attribute fails)."""
    if isinstance(chain, ast.Name):
        return namespace.get(chain.id)
    try:
        return getattr(_resolve(chain.value, namespace), chain.attr)
    except Exception:  # noqa: BLE001 - a property that raises: not a plain setting
        return None


def pasted_names(predicted, namespace: dict, inputs, current: str) -> list[str]:
    """Names of the notebook's variables that the prediction's line reads, e.g. ``var_raw`` in
    ``predicted = var_raw[6]``. The prediction's variable is a name the grading cell
    (``current``) reads that is bound to ``predicted`` itself; its line is found in the latest
    of ``inputs`` (newest last) that holds only assignments, as a prediction cell does.
    Modules, functions and builtins are fine (``math.pi``), as is arithmetic on literals
    (``1 / 6``) or on plain-number settings (``d_model // n_heads``); a bare name is a paste
    whatever it holds. Empty when nothing is found."""
    tree = _parse(current)
    if tree is None:
        return []
    wanted = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and namespace.get(n.id, ...) is predicted}
    for source in reversed(list(inputs)[-30:]):
        cell = _parse(source)
        if cell is None or not cell.body or not all(isinstance(s, ast.Assign) for s in cell.body):
            continue
        for node in cell.body:
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if not wanted.intersection(targets):
                continue
            bare = isinstance(node.value, (ast.Name, ast.Attribute, ast.Subscript))
            names = set()
            for leaf in _reads(node.value):
                root = leaf
                while isinstance(root, ast.Attribute):
                    root = root.value
                name = root.id
                if (name not in namespace or hasattr(builtins, name)
                        or isinstance(namespace[name], _TOOLS)):
                    continue  # a module, function or class: a tool, not a result
                if not bare and isinstance(_resolve(leaf, namespace), (bool, int, float, str)):
                    continue  # arithmetic on settings (d_model // n_heads, config.d_model)
                names.add(name)  # a computed result: a tensor, a list, a model's output
            return sorted(names)
    return []


def _pasted_in_kernel(predicted) -> list[str]:
    """:func:`pasted_names` in the running IPython kernel (its input history); [] elsewhere,
    e.g. in plain Python or under nbval, which keeps no history."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            return []
        namespace = shell.user_ns
        inputs = namespace.get("In") or []
        if len(inputs) < 2:
            return []
        return pasted_names(predicted, namespace, inputs[:-1], inputs[-1])
    except Exception:  # never let the history lookup break a grading cell
        return []


def _shown(value) -> str:
    return repr(_normalise(value)) if not isinstance(value, str) else repr(value)


_SEALED = False
SEALED_LINE = ("check_prediction: {name}: recorded. Graded after you hand in: your feedback "
               "shows the answer.")


def seal_predictions() -> None:
    """From now on in this kernel, :func:`check_prediction` records without revealing: no
    ✓/✗, no true value. A graded version's first cell calls it, so a learner cannot read the
    answer and then edit the prediction. While nbgrader grades (it sets ``NBGRADER_EXECUTION``)
    everything is shown again, for the feedback."""
    global _SEALED
    _SEALED = True


def revealing() -> bool:
    """False in a sealed kernel (see :func:`seal_predictions`) outside nbgrader's grading."""
    return not _SEALED or bool(os.environ.get("NBGRADER_EXECUTION"))


def sealed_score(score: float) -> float | None:
    """``score`` where answers are revealed, else None (a sealed cell shows no mark)."""
    return score if revealing() else None


def check_prediction(name: str, predicted, actual, *, tol: float | None = None,
                     rel: float | None = None, mistakes: dict | None = None,
                     verbose: bool = True) -> CheckResult:
    """Grade ``predicted`` against ``actual`` and reveal ``actual`` (unless sealed).

    ``name``: what was predicted, in words. ``tol``/``rel``: absolute/relative tolerance for
    numbers (exact match when both are None). ``mistakes``: known wrong answers, each mapped to
    what it means ("you counted the biases twice"); matched with the same tolerance.
    """
    if revealing():
        return _grade_prediction(name, predicted, actual, tol, rel, mistakes, verbose)
    result = _grade_prediction(name, predicted, actual, tol, rel, mistakes, False)
    if verbose:
        print(SEALED_LINE.format(name=name))
    return result


def _grade_prediction(name, predicted, actual, tol, rel, mistakes, verbose) -> CheckResult:
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"name must be a non-empty string saying what was predicted, got {name!r}")
    for arg, value in (("tol", tol), ("rel", rel)):
        if value is not None and (not isinstance(value, Real) or value < 0):
            raise ValueError(f"{arg} must be a number >= 0 or None, got {value!r}")
    report = _Report("check_prediction", verbose, name)
    tolerance = ("" if tol is None and rel is None else
                 f" (within {tol if tol is not None else f'{rel:.0%}'})")
    if predicted is ... or predicted is None:
        report.probe(False, f"{name}: no prediction yet: write yours in the cell above "
                     "(in place of ...) and run this cell again")  # the answer stays hidden
        report.mistake("prediction_missing")
        return report.finish()
    pasted = _pasted_in_kernel(predicted)
    if pasted:
        report.probe(False, f"{name}: your answer reads the notebook's "
                     f"{' and '.join(pasted)}; it is {_shown(actual)}")
        report.mistake("prediction_pasted")
        return report.finish()
    ok = _same(predicted, actual, tol, rel)
    report.probe(ok, f"{name}: you predicted {_shown(predicted)}; it is {_shown(actual)}"
                 + tolerance)
    if not ok:
        meaning = next((text for wrong, text in (mistakes or {}).items()
                        if _same(predicted, wrong, tol, rel)), None)
        if meaning:
            report.mistake("prediction_known_mistake", meaning)
        else:
            report.mistake("prediction_wrong")
    return report.finish()
