"""A submitted notebook as the graders see it: the exercises and predictions its lab declares,
its written answers, and the collecting cell that runs the checks after the learner's cells
(shared by the kernel route, :mod:`labkit.course.grade`, and the forked one,
:mod:`labkit.course.grade_forked`)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat

from labkit.marks import check_options

MARK = "@@TX_GRADES@@"
# A cell tag: the grade runs ``pass`` in its place. For a long demo no check reads (12's
# two-process torchrun run and its asserts); tagging one only ever costs the learner marks.
GRADE_SKIP = "grade-skip"
META_KEY = "tx_exercise"
SNAPSHOT = ("import labkit.course.integrity as _tx_integrity\n"
            "_tx_before, _tx_check = _tx_integrity.snapshot(), _tx_integrity.patched")
COLLECT = """\
import json as _json
import labkit as _grading
_names = {names!r}
_points = {points!r}
_options = {options!r}
if _names is None:
    _names = [_n for _n, _o in list(globals().items()) if not _n.startswith("_")
              and getattr(_o, "__module__", None) == "__main__"]
_records = []
for _n in _names:
    if _n not in globals():  # a declared exercise the learner removed: 0, still in the maximum
        _records.append(dict(name=_n, subject=_n, passed=False, mistakes=["not_defined"],
                             messages=["Diagnosis: " + _n + " is not defined in the notebook"],
                             label="missing(" + _n + ")",
                             mark=dict(score=0, points=_points.get(_n, 1), delegated="")))
        continue
    _found = _grading.find_checks({{_n: globals()[_n]}}, module=None)
    if not _found:
        continue
    _m = _grading.mark_exercise(_n, globals()[_n], points=_points.get(_n, 1), verbose=False,
                                **_options.get(_n, {{}}))
    _d = _m.as_dict()
    _d.pop("result")
    _records.append(dict(_m.result.as_dict(), label=_found[0][0], mark=_d))
_marked = set()
for _m in _grading.mark_predictions(points_each={prediction_points!r}):
    _d = _m.as_dict()
    _d.pop("result")
    _marked.add(_d["exercise"])
    _records.append(dict(_m.result.as_dict(), label="prediction", mark=_d))
for _label in {declared!r}:  # a declared prediction whose cells raised: 0, still in the maximum
    _e = "prediction: " + _label
    if _e not in _marked:
        _records.append(dict(name="check_prediction", subject=_label, passed=False,
                             mistakes=["prediction_missing"], label="prediction",
                             messages=["Diagnosis: this prediction was never graded (its cell "
                                       "raised or did not run)"],
                             mark=dict(exercise=_e, score=0, points={prediction_points!r},
                                       delegated="")))
_patched = (_tx_integrity.patched(_tx_before) if _tx_integrity.patched is _tx_check
            else ["labkit.course.integrity.patched"])
if _patched:  # the submission replaced part of the grader: no automatic mark counts
    for _r in _records:
        _r.update(passed=False, mistakes=["grader_patched"], messages=[
            "Diagnosis: the notebook replaced part of the grader (" + ", ".join(_patched[:5])
            + "); no automatic mark counts"])
        _r["mark"].update(score=0)
print({mark!r} + _json.dumps(_records))
"""


def defined_names(source: str) -> list[str]:
    """Top-level classes and functions a cell defines (IPython magics skipped)."""
    lines = [line for line in source.split("\n") if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def exercises_of(nb) -> dict[str, list[dict]]:
    """Name an exercise asks for -> the exercises (number, name, section) it holds.

    The lab's declared exercises (notebook metadata ``tx_lab``, else each exercise cell's
    ``tx_exercise`` items), never only what the learner defined: an exercise answered by an
    assignment (``lookahead_mask = M.lookahead_mask``) or deleted still counts in the maximum.
    """
    found: dict[str, list[dict]] = {}
    declared = nb.metadata.get("tx_lab", {}).get("exercises")
    if declared is None:
        declared = [item for cell in nb.cells if cell.cell_type == "code"
                    for item in cell.get("metadata", {}).get(META_KEY) or []]
    for item in declared:
        found.setdefault(item["name"].split(".")[0], []).append(
            {key: item[key] for key in ("name", "number", "section") if key in item})
    return found


def written_answers(nb) -> list[tuple[str, str]]:
    """(question, the learner's answer) for each ``**Write.**`` cell, for marking by hand."""
    pairs = []
    for cell, after in zip(nb.cells, nb.cells[1:] + [None], strict=True):
        if cell.cell_type != "markdown" or not cell.source.startswith("**Write.**"):
            continue
        question = " ".join(cell.source[len("**Write.**"):].split("<details>")[0].split())
        answer = ""
        if after is not None and after.cell_type == "markdown" \
                and not after.source.startswith("**Write.**"):
            answer = after.source.replace("**Your answer:**", "").strip()
            if answer.startswith("*(double-click"):
                answer = ""
        pairs.append((question, " ".join(answer.split()) or "(no answer)"))
    return pairs


def method_scope(items: list[dict]) -> dict:
    """``{"methods": [...]}`` for exercises on a class's methods (``"Box.forward"``), else {}:
    :func:`labkit.mark_exercise` then treats the class's other methods as the lab's given code."""
    methods = sorted({i["name"].split(".", 1)[1] for i in items if "." in i["name"]})
    return {"methods": methods} if methods else {}


def prepare(path: Path, prediction_points: float):
    """The submission with the collecting cell appended: (notebook, its own cells, exercises)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if GRADE_SKIP in cell.get("metadata", {}).get("tags", []):
            cell.source = f"pass  # not run by the grade (cell tag {GRADE_SKIP})"
    nb.cells.insert(0, nbformat.v4.new_code_cell(SNAPSHOT))  # before the learner's first cell
    exercises = exercises_of(nb)
    n_cells = len(nb.cells)
    names = sorted(exercises) if exercises else None
    points = {name: max(1, len(items)) for name, items in exercises.items()}
    # the options the lab's checks ask for, from the lab's record of its check calls: a learner
    # who edits or deletes a check call (dropping odd_d_model=True) must not change the grade
    calls = [c["call"] for c in nb.metadata.get("tx_lab", {}).get("checks", []) if "call" in c]
    code = "\n".join(calls) if calls else "\n".join(
        c.source for c in nb.cells if c.cell_type == "code")
    options = {name: check_options(code, name) for name in exercises}
    for name, items in exercises.items():
        options[name].update(method_scope(items))
    declared = [p["label"] for p in nb.metadata.get("tx_lab", {}).get("predictions", [])]
    nb.cells.append(nbformat.v4.new_code_cell(COLLECT.format(
        names=names, mark=MARK, points=points, options=options,
        prediction_points=prediction_points, declared=declared)))
    return nb, n_cells, exercises


def records_from(text: str) -> list[dict]:
    """The collecting cell's records, [] if it never printed them (tx_helpers missing?)."""
    return json.loads(text.split(MARK, 1)[1]) if MARK in text else []
