"""Marks a teacher can put in a gradebook: points per exercise, partial credit, delegation.

One exercise, one mark::

    m = labkit.mark_exercise("padding_mask", padding_mask, points=2)
    m.score  # 2.0 when the check passes; else 2 x 1/2 x (probes passed / probes); 0 if delegated

- **Partial credit**: a failed check earns at most half its points,
  ``points x FAILED_SHARE x probes passed / probes``: the failure decides (a beam step that
  never reorders its cache passes 6 of 7 probes, yet it is wrong), and the probes say how far
  the code got. The report shows every probe, so the teacher sees where the fraction comes
  from. An untouched stub (``NotImplementedError``) earns 0, even where the lab's given code
  (a class's ``__init__``) passes probes before the stub raises; in a class with several
  exercised methods the written ones keep their share.
- **Delegation**: an exercise that hands its work to the ``tx_helpers`` reference for the
  same block earns 0, whatever the check says, however the reference is bound (an alias
  import, an assignment, a module, ``getattr``, a wrapper, a subclass, a borrowed method):
  :mod:`.delegation` compares the objects and watches the reference's code run while the
  check runs. So does a label-smoothing exercise that passes ``label_smoothing=`` to
  PyTorch's cross-entropy. Using other ``tx`` blocks as parts is fine (a decoder layer may
  use ``tx.MultiHeadAttention``; a decoder mask, ``tx.padding_mask``).
- **The checker's own crash** earns 0 and says the exercise needs marking by hand.
- **Predictions** (:func:`labkit.check_prediction`) are marked by
  :func:`mark_predictions`, each worth ``points_each``.

``labkit.course.grade`` and the nbgrader test cells (``labkit.course.nbgrader_export``) both call
:func:`mark_exercise`, so the two routes give the same marks.
"""
from __future__ import annotations

import ast
import inspect
import types
import warnings
from dataclasses import dataclass, field

from .delegation import (  # noqa: F401 - REFERENCES is public here too
    MASK_REFERENCES,
    REFERENCES,
    _is_tx,
    reference_names,
    watch_references,
)
from .delegation_source import find_delegation
from .report import CheckResult, history

# the most a failed check earns, as a share of its points
FAILED_SHARE = 0.5
# probes a wrong answer passes too (a wrong mask built on the right device): they earn
# partial credit only when every other probe of the check passed
SECONDARY_PROBES = ("builds the mask on that device", "builds its mask on the device of its")


@dataclass
class Mark:
    """One exercise's mark: ``score`` of ``points``, and why."""

    exercise: str
    score: float
    points: float
    passed: bool
    delegated: str | None = None
    needs_review: bool = False
    result: CheckResult | None = None
    probes: tuple[int, int] = (0, 0)
    lines: list[str] = field(default_factory=list)

    def __float__(self) -> float:
        return float(self.score)

    def __repr__(self) -> str:
        return f"<Mark {self.exercise}: {self.score:g}/{self.points:g}>"

    def as_dict(self) -> dict:
        return {"exercise": self.exercise, "score": self.score, "points": self.points,
                "passed": self.passed, "delegated": self.delegated or "",
                "needs_review": self.needs_review, "probes": list(self.probes),
                "lines": list(self.lines),
                "result": self.result.as_dict() if self.result is not None else None}


def _probes(result: CheckResult) -> tuple[int, int]:
    """(probes that earn credit, probes): a probe a wrong answer passes too (see
    :data:`SECONDARY_PROBES`) earns nothing while another probe of the check failed."""
    def secondary(m: str) -> bool:
        return any(s in m for s in SECONDARY_PROBES)

    ok = sum(1 for m in result.messages if m.startswith("  ✓ ") and not secondary(m))
    bad = sum(1 for m in result.messages if m.startswith("  ✗ ") and not secondary(m))
    ok2 = sum(1 for m in result.messages if m.startswith("  ✓ ") and secondary(m))
    bad2 = sum(1 for m in result.messages if m.startswith("  ✗ ") and secondary(m))
    return (ok + ok2 if bad == 0 else ok), ok + bad + ok2 + bad2


def with_references(obj, own: set[str] = frozenset()):
    """``obj`` with the learner's own versions of other exercises replaced by the references.

    A function that calls the learner's ``lookahead_mask`` is run with ``tx.lookahead_mask``
    in its place, so a mistake in ``lookahead_mask`` is charged once, at its own exercise.
    Names in ``own`` (the references of the exercise being marked) are never replaced: the
    learner's own ``greedy_decode`` called by ``my_greedy`` stays theirs. Returns (the function
    to check, the names replaced). Classes are returned unchanged.
    """
    import tx_helpers

    if not isinstance(obj, types.FunctionType):
        return obj, []
    refs = {n for names in REFERENCES.values() for n in names} - set(own)
    scope = obj.__globals__
    swapped = {}
    for name in obj.__code__.co_names:
        value = scope.get(name)
        if (name == obj.__name__ or name not in refs or value is None or _is_tx(value)
                or not callable(value) or not hasattr(tx_helpers, name)):
            continue
        swapped[name] = getattr(tx_helpers, name)
    if not swapped:
        return obj, []
    fn = types.FunctionType(obj.__code__, {**scope, **swapped}, obj.__name__,
                            obj.__defaults__, obj.__closure__)
    fn.__kwdefaults__ = obj.__kwdefaults__
    fn.__qualname__, fn.__module__, fn.__doc__ = obj.__qualname__, obj.__module__, obj.__doc__
    return fn, sorted(swapped)


def _choose_check(name: str, obj):
    from .discovery import find_checks

    found = find_checks({name: obj}, module=None)
    if not found:
        raise ValueError(f"no check matches the name {name!r}; pass check=labkit.check_...")
    return found[0]


def mark_result(exercise: str, result: CheckResult, points: float = 1.0,
                delegated: str | None = None, stub_scores_zero: bool = True) -> Mark:
    """The mark for a check already run (see :func:`mark_exercise`). ``stub_scores_zero``:
    a check that met a stub still raising ``NotImplementedError`` earns 0 (False for a class
    with several exercised methods, where the written ones keep their probes)."""
    ok, total = _probes(result)
    review = "checker_failed" in result.mistakes
    if delegated:
        score = 0.0
    elif result.passed:
        score = float(points)
    elif review or (stub_scores_zero and "not_implemented" in result.mistakes):
        score = 0.0  # a stub still raising earns nothing, whatever its given code passed
    else:
        score = round(points * FAILED_SHARE * ok / total, 2) if total else 0.0
    lines = [f"Exercise {exercise}: {score:g}/{points:g} point(s)"
             + (f" ({ok}/{total} probes credited)" if not result.passed else "")]
    if delegated:
        lines.append(f"  Not credited: {delegated}. Write this part yourself; the check "
                     "below ran on it anyway.")
    if review:
        lines.append("  The check itself failed on this code: your teacher will mark it by "
                     "hand.")
    lines += ["  " + line for line in result.report.split("\n")]
    return Mark(exercise, score, float(points), result.passed and not delegated, delegated,
                review, result, (ok, total), lines)


def mark_exercise(exercise: str, obj, *, points: float = 1.0, check=None, verbose: bool = True,
                  methods: list[str] | None = None, **check_kwargs) -> Mark:
    """Run the check for ``obj`` (chosen by name unless ``check`` is given) and mark it.

    ``methods``: for a class, the methods the learner writes; its other methods are the lab's
    given code, and what they call (``tx.sinusoidal_table`` in a given ``__init__``) is not
    counted as handing the exercise to the reference.

    Prints the mark line and the full report when ``verbose``. Warnings raised inside the
    learner's code are silenced here (nbgrader scores a test cell that writes to stderr 0).
    """
    if not isinstance(points, (int, float)) or points < 0:
        raise ValueError(f"points must be a number >= 0, got {points!r}")
    slot = None
    if check is None:
        label, run = _choose_check(exercise, obj)
        check_name = label.split("(")[0]
        if check_name == "check_masks":
            slot = label.split("(", 1)[1].split("=", 1)[0]
    else:
        check_name = getattr(check, "__name__", getattr(getattr(check, "func", None),
                                                        "__name__", ""))
    own = reference_names(check_name, slot)
    learner_obj = obj
    obj, swapped = with_references(obj, own)
    if check is None:
        runner = run
        if swapped or check_kwargs:  # the exercise's own options, e.g. odd_d_model=True
            from . import discovery

            fn = getattr(discovery, check_name)
            if check_name == "check_masks":
                def runner(verbose=False):
                    return fn(**{slot: obj}, verbose=verbose, **check_kwargs)
            else:
                def runner(verbose=False):
                    return fn(obj, verbose=verbose, **check_kwargs)
    else:
        def runner(verbose=False):
            if check_name == "check_masks" and not check_kwargs:
                return check(obj, verbose=verbose)
            return check(obj, verbose=verbose, **check_kwargs)
    given = ()
    if methods and isinstance(learner_obj, type):
        given = [f.__code__ for n, f in vars(learner_obj).items()
                 if inspect.isfunction(f) and n not in methods]
    with warnings.catch_warnings(), watch_references(own, given) as watch:
        warnings.simplefilter("ignore")
        result = runner(verbose=False)
    delegated = (find_delegation(learner_obj, check_name, slot, methods)
                 or "; ".join(watch.found))
    mark = mark_result(exercise, result, points, delegated or None,
                       stub_scores_zero=not methods or len(methods) == 1)
    if swapped:
        mark.lines.insert(1, "  Checked with " + ", ".join(f"tx.{n}" for n in swapped)
                          + " in place of your own (marked at its own exercise), so a "
                          "mistake there costs once.")
    if verbose:
        text = "\n".join(mark.lines)
        try:
            print(text)
        except UnicodeEncodeError:
            print(text.replace("✓", "ok").replace("✗", "XX"))
    return mark


def mark_predictions(results: list[CheckResult] | None = None, points_each: float = 0.5
                     ) -> list[Mark]:
    """One mark per prediction (the last check of each), from ``results`` or the history."""
    results = [r for r in (history() if results is None else results)
               if r.name == "check_prediction"]
    last: dict[str, CheckResult] = {}
    for r in results:
        last[r.subject] = r
    return [mark_result(f"prediction: {name}", r, points_each) for name, r in last.items()]


def check_options(source: str, name: str) -> dict:
    """Keyword options a notebook passes when it checks ``name`` itself, such as
    ``check_positional_encoding(positional_table, odd_d_model=True)``: literal values only,
    so the graded run asks what the exercise asked."""
    options: dict = {}
    try:
        tree = ast.parse("\n".join(line for line in source.split("\n")
                                   if not line.lstrip().startswith(("%", "!"))))
    except SyntaxError:
        return options
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and (getattr(node.func, "attr", "") or getattr(
                node.func, "id", "")).startswith("check_")):
            continue
        names = [a.id for a in node.args if isinstance(a, ast.Name)]
        names += [k.value.id for k in node.keywords if isinstance(k.value, ast.Name)]
        if name not in names:
            continue
        for kw in node.keywords:
            if kw.arg in (None, "verbose") or isinstance(kw.value, ast.Name):
                continue
            try:
                options[kw.arg] = ast.literal_eval(kw.value)
            except ValueError:
                continue
    return options
