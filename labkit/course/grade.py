#!/usr/bin/env python3
"""Grade learners' exercise notebooks: execute each one, collect labkit results.

  make grade SUBMISSIONS="submissions/*.ipynb"            (uses the project's venv)
  .venv/bin/python -m labkit.course.grade submissions/*.ipynb --out grades.csv [--strict]

Each notebook runs top to bottom (errors do not stop it: a learner's unfinished cell is
recorded, the rest still runs). Then one extra cell, never saved, runs the checks for the
learner's exercises. By default each submission runs in its own child process, forked from
one that has already imported torch, tx_helpers and labkit, in a fresh IPython shell that
never draws a figure: no kernel to start and no import to repeat, and whatever a submission
changes dies with its child. ``--kernels`` runs each one in a fresh Jupyter kernel instead,
as nbgrader does (the default where the system cannot fork); both give the same marks.

What is graded: the classes and functions defined in the exercise cells, which
``labkit/course/exercises.py`` marks in the cell metadata (``tx_exercise``: number, name,
section). A notebook's own demonstration code (``BuggyMultiHeadAttention``, an
``ArticleEncoder``) lives in other cells and is never graded. Each exercised name gets the
check :func:`labkit.find_checks` pairs with it, run on its final definition;
a check the notebook ran itself on the same object is not counted again. A notebook
without that metadata (an older copy) falls back to every class and function it defines.

Outputs:

- the CSV (``--out``): one row per check with notebook, exercise (the numbers and names it
  covers), check, passed, mistakes, diagnosis, points, max_points, delegated; plus one
  ``cells`` row per notebook counting the cells that raised (information, not marks);
- a summary next to it (``grades_summary.txt`` for ``grades.csv``): one line per notebook
  with its code checks passed and its predictions right (counted apart), a ``marks:`` line
  with its points, then one line per failed or delegated exercise;
- one feedback file per notebook (``grades_feedback/<notebook>.txt``): every exercise's
  mark and its full report (the ✓/✗ probe lines, the diagnosis and the hint), for the
  student.

Marks (:func:`labkit.mark_exercise`, the same function nbgrader's test cells
call): each checked exercise is worth 1 point (a class that holds several exercises, one per
exercise); a failed check earns its share of probes passed; code that hands the exercise to
the ``tx_helpers`` reference (``return tx.padding_mask(...)``) is flagged and earns 0; each
graded prediction (``labkit.check_prediction``) is worth ``--prediction-points``. Mask
functions are checked one by one, so each has its own mark.

Exit status: 0; with ``--strict``, 1 when any check failed or a notebook could not be graded.
The script runs the learners' code: run it in a container or a throw-away account.
"""
from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from labkit.marks import check_options

# The kernels' debugger warning about frozen modules is noise in the teacher's terminal.
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
MARK = "@@TX_GRADES@@"
META_KEY = "tx_exercise"
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
print({mark!r} + _json.dumps(_records))
"""
NOT_MARKS = ("cells", "none", "written", "total")  # CSV rows that are not a check's mark
FIELDS = ["notebook", "exercise", "check", "passed", "mistakes", "diagnosis", "points",
          "max_points", "delegated"]


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


def _prepare(path: Path, prediction_points: float):
    """The submission with the collecting cell appended: (notebook, its own cells, exercises)."""
    nb = nbformat.read(path, as_version=4)
    exercises = exercises_of(nb)
    n_cells = len(nb.cells)
    names = sorted(exercises) if exercises else None
    points = {name: max(1, len(items)) for name, items in exercises.items()}
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    options = {name: check_options(code, name) for name in exercises}
    declared = [p["label"] for p in nb.metadata.get("tx_lab", {}).get("predictions", [])]
    nb.cells.append(nbformat.v4.new_code_cell(COLLECT.format(
        names=names, mark=MARK, points=points, options=options,
        prediction_points=prediction_points, declared=declared)))
    return nb, n_cells, exercises


def _records(text: str) -> list[dict]:
    """The collecting cell's records, [] if it never printed them (tx_helpers missing?)."""
    return json.loads(text.split(MARK, 1)[1]) if MARK in text else []


def run_notebook(path: Path, timeout: int = 120, prediction_points: float = 0.5
                 ) -> tuple[list[dict], int, dict]:
    """Execute ``path`` (a copy in memory) in a fresh Jupyter kernel:
    (check records, cells that raised, exercises)."""
    nb, n_cells, exercises = _prepare(path, prediction_points)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    client.execute(stderr=subprocess.DEVNULL)  # the kernel's own log lines are noise here
    errors = sum(1 for cell in nb.cells[:n_cells] if cell.cell_type == "code"
                 and any(o.get("output_type") == "error" for o in cell.get("outputs", [])))
    text = "".join(out.get("text", "") for out in nb.cells[-1].outputs
                   if out.get("output_type") == "stream")
    return _records(text), errors, exercises


class CellTimeout(Exception):
    """A cell ran longer than ``--timeout`` seconds."""


def run_here(path: Path, timeout: int = 120, prediction_points: float = 0.5
             ) -> tuple[list[dict], int, dict]:
    """Execute ``path`` in a fresh IPython shell of this process, as a kernel would, but
    without starting one: what :func:`run_notebook` returns. Meant for a forked child (it
    changes the working folder and the process's output streams)."""
    import contextlib
    import io
    import signal

    from IPython.core.interactiveshell import InteractiveShell

    nb, n_cells, exercises = _prepare(path, prediction_points)
    os.chdir(path.parent.resolve())
    sys.path.insert(0, "")  # a kernel imports from its working folder
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # output written below Python (C extensions) is noise here
    os.dup2(devnull, 2)
    class Shell(InteractiveShell):
        def enable_gui(self, gui=None):  # %matplotlib inline asks; there is no event loop
            pass

    shell = Shell.instance(colors="NoColor")
    shell.display_formatter.active_types = ["text/plain"]  # figures are never drawn

    def expire(signum, frame):
        raise CellTimeout(f"the cell ran longer than {timeout} s")

    signal.signal(signal.SIGALRM, expire)
    errors, text = 0, ""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        out = io.StringIO()
        signal.alarm(timeout)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            result = shell.run_cell(cell.source, store_history=False)
        signal.alarm(0)
        errors += index < n_cells and not result.success
        text = out.getvalue()
    return _records(text), errors, exercises


def grade_one(path: Path, timeout: int, prediction_points: float, kernels: bool = True):
    """One submission: (records, cells that raised, exercises, written answers)."""
    run = run_notebook if kernels else run_here
    records, errors, exercises = run(path, timeout, prediction_points)
    return records, errors, exercises, written_answers(nbformat.read(path, as_version=4))


def _unfinished(path: Path, prediction_points: float):
    """A submission whose grading process died (it exited, ran out of memory, was killed
    past its time): each declared exercise and prediction scores 0, still in the maximum."""
    nb = nbformat.read(path, as_version=4)
    exercises = exercises_of(nb)
    why = "Diagnosis: the notebook stopped the grader before its checks ran (a cell exited " \
          "the process, ran out of memory or never ended)"
    records = [dict(name=name, subject=name, passed=False, mistakes=["not_graded"],
                    messages=[why], label=f"unfinished({name})",
                    mark=dict(score=0, points=max(1, len(items)), delegated=""))
               for name, items in exercises.items()]
    records += [dict(name="check_prediction", subject=p["label"], passed=False,
                     mistakes=["not_graded"], messages=[why], label="prediction",
                     mark=dict(exercise="prediction: " + p["label"], score=0,
                               points=prediction_points, delegated=""))
                for p in nb.metadata.get("tx_lab", {}).get("predictions", [])]
    return records, 0, exercises, written_answers(nb)


def _preload() -> None:
    """Import what every submission imports, once, before the children are forked."""
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    from IPython.core.interactiveshell import InteractiveShell  # noqa: F401
    from matplotlib_inline import backend_inline  # noqa: F401

    import labkit  # noqa: F401
    import tx_helpers  # noqa: F401


def grade_forked(paths: list[Path], timeout: int, prediction_points: float, jobs: int):
    """Yield each submission's :func:`grade_one` result, in order, grading ``jobs`` at once,
    each in its own child forked from this process after :func:`_preload` (no kernel to
    start, no import to repeat; a child's changes to modules die with it)."""
    import pickle
    import select
    import time

    _preload()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    results: dict[int, object] = {}
    running: dict[int, tuple] = {}  # read end -> (index, pid, deadline, data)
    todo = list(enumerate(paths))
    done = 0
    while done < len(paths):
        while todo and len(running) < jobs:
            index, path = todo.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: grade, send the result, leave without clean-up
                os.close(read)
                try:
                    import torch
                    torch.set_num_threads(threads)
                    result = grade_one(path, timeout, prediction_points, kernels=False)
                except BaseException as err:  # noqa: BLE001 - reported as a failed grade
                    result = err
                with os.fdopen(write, "wb") as fh:
                    pickle.dump(result, fh)
                os._exit(0)
            os.close(write)
            cells = sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)
            running[read] = (index, pid, time.monotonic() + timeout * (cells + 1), [])
        ready, _, _ = select.select(list(running), [], [], 1.0)
        for read in list(running):
            index, pid, deadline, data = running[read]
            chunk = os.read(read, 1 << 20) if read in ready else b""
            if chunk:
                data.append(chunk)
                continue
            if read not in ready:
                if time.monotonic() < deadline:
                    continue
                os.kill(pid, 9)  # stuck where the cell timeout cannot reach (C code)
            os.close(read)
            os.waitpid(pid, 0)
            del running[read]
            try:
                results[index] = pickle.loads(b"".join(data))
            except Exception:  # noqa: BLE001 - the child died (memory, a signal, killed)
                results[index] = None
        while done in results:
            result = results.pop(done)
            if not isinstance(result, tuple):
                result = _unfinished(paths[done], prediction_points)
            yield result
            done += 1


def exercise_label(record: dict, exercises: dict) -> str:
    if record.get("label") == "prediction":
        return record["mark"]["exercise"]
    subjects = record.get("subject", "").split(",")
    items = [item for s in subjects for item in exercises.get(s, [])]
    return "; ".join(f"{i['number']}. {i['name']}" for i in items) or "-"


def rows_for(path: Path, records: list[dict], errors: int, exercises: dict,
             written: list[tuple[str, str]] = ()) -> list[dict]:
    rows = [{"notebook": path.name, "exercise": "", "check": "cells", "passed": errors == 0,
             "mistakes": f"{errors} cell(s) raised" if errors else "", "diagnosis": "",
             "points": "", "max_points": "", "delegated": ""}]
    for r in records:
        diagnosis = next((m[len("Diagnosis: "):] for m in r["messages"]
                          if m.startswith("Diagnosis: ")), "")
        mark = r.get("mark", {})
        if mark.get("delegated"):  # passed True, points 0: the same row says why
            diagnosis = f"check passed but not credited: {mark['delegated']}"
        rows.append({"notebook": path.name, "exercise": exercise_label(r, exercises),
                     "check": r.get("label", r["name"]), "passed": r["passed"],
                     "mistakes": " ".join(r["mistakes"]), "diagnosis": diagnosis,
                     "points": mark.get("score", ""), "max_points": mark.get("points", ""),
                     "delegated": mark.get("delegated", "")})
    checked = {s for r in records for s in r.get("subject", "").split(",")}
    for name, items in exercises.items():
        if name not in checked:  # an exercise no check covers: say so, count nothing
            rows.append({"notebook": path.name, "check": "none", "passed": "",
                         "exercise": "; ".join(f"{i['number']}. {i['name']}" for i in items),
                         "mistakes": "", "diagnosis": "no automatic check for this exercise",
                         "points": "", "max_points": "", "delegated": ""})
    for question, answer in written:  # the teacher marks these with labs.toml's rubric
        rows.append({"notebook": path.name, "exercise": question, "check": "written",
                     "passed": "", "mistakes": "", "diagnosis": answer, "points": "",
                     "max_points": "", "delegated": ""})
    graded = [r for r in rows if r["check"] not in NOT_MARKS]
    rows.append({"notebook": path.name, "exercise": "", "check": "total", "passed": "",
                 "mistakes": "", "diagnosis": "automatic marks; written answers not included",
                 "points": f"{sum(float(r['points'] or 0) for r in graded):g}",
                 "max_points": f"{sum(float(r['max_points'] or 0) for r in graded):g}",
                 "delegated": ""})
    return rows


def summary_line(path: Path, rows: list[dict]) -> list[str]:
    graded = [r for r in rows if r["check"] not in NOT_MARKS]
    code = [r for r in graded if r["check"] != "prediction"]
    predictions = [r for r in graded if r["check"] == "prediction"]
    cells = rows[0]["mistakes"] or "no cell raised"
    score = sum(float(r["points"] or 0) for r in graded)
    total = sum(float(r["max_points"] or 0) for r in graded)
    ok = sum(r["passed"] is True for r in code)
    head = f"{path.name}: {ok}/{len(code)} code checks passed"
    if predictions:
        head += (f", {sum(r['passed'] is True for r in predictions)}/{len(predictions)} "
                 "predictions right")
    written = sum(r["check"] == "written" for r in rows)
    by_hand = (f" automatic, + {written} written answer(s) to mark by hand" if written else "")
    lines = [f"{head} ({cells})", f"  marks: {score:g}/{total:g} points{by_hand}"]
    for r in graded:
        if r["delegated"]:
            lines.append(f"  - exercise {r['exercise']}: not credited: {r['delegated']}")
        elif r["passed"] is not True:
            lines.append(f"  - exercise {r['exercise']}: {r['points']:g}/{r['max_points']:g}: "
                         f"{r['diagnosis'] or r['mistakes']}")
    for r in rows:
        if r["check"] == "none":
            lines.append(f"  - exercise {r['exercise']}: not checked automatically")
    for r in rows:
        if r["check"] == "written":
            lines += [f"  - to mark by hand: {r['exercise']}", f"    answer: {r['diagnosis']}"]
    return lines


def feedback_text(path: Path, records: list[dict], rows: list[dict], errors: int) -> str:
    """The student's own file: every exercise's mark and its full report (✓/✗ lines)."""
    graded = [r for r in rows if r["check"] not in NOT_MARKS]
    score = sum(float(r["points"] or 0) for r in graded)
    total = sum(float(r["max_points"] or 0) for r in graded)
    written = sum(r["check"] == "written" for r in rows)
    by_hand = (f" from the automatic checks; your teacher marks your {written} written "
               "answer(s)" if written else "")
    out = [f"Feedback for {path.name}: {score:g}/{total:g} points{by_hand}", ""]
    if errors:
        out += [f"{errors} cell(s) raised an error when the notebook ran top to bottom.", ""]
    for r, row in zip(records, [r for r in rows if r["check"] not in NOT_MARKS],
                      strict=False):
        label = row["exercise"] if row["exercise"] != "-" else r.get("subject", "")
        out += [f"## {label}"] + r.get("mark", {}).get("lines", r["messages"]) + [""]
    for row in rows:
        if row["check"] == "none":
            out += [f"## {row['exercise']}", "  not checked automatically: your teacher marks "
                    "it", ""]
    return "\n".join(out)


def _report(path, records, errors, exercises, written, rows, summary, feedback_dir) -> bool:
    """Add one submission's rows and summary lines, write its feedback; True if it failed."""
    mine = rows_for(path, records, errors, exercises, written)
    rows += mine
    lines = summary_line(path, mine)
    summary += lines
    (feedback_dir / f"{path.stem}.txt").write_text(
        feedback_text(path, records, mine, errors) + "\n", encoding="utf-8")
    print(lines[0] + ";" + lines[1].replace("  marks:", ""), flush=True)
    return not records or not all(r["passed"] for r in records)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("grades.csv"))
    parser.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    parser.add_argument("--prediction-points", type=float, default=0.5,
                        help="points for each graded prediction (default 0.5)")
    parser.add_argument("--feedback", type=Path, default=None,
                        help="folder for one feedback file per notebook (default: "
                        "<out stem>_feedback next to the CSV)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="notebooks graded at once (default: one per CPU core)")
    parser.add_argument("--kernels", action="store_true", default=not hasattr(os, "fork"),
                        help="run each submission in a fresh Jupyter kernel, as nbgrader "
                        "does (slower; the default where the system cannot fork)")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 if any check failed or a notebook could not be graded")
    args = parser.parse_args(argv)
    feedback_dir = args.feedback or args.out.with_name(f"{args.out.stem}_feedback")
    feedback_dir.mkdir(parents=True, exist_ok=True)
    rows, summary, failed = [], [], False
    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(args.notebooks)))
    if args.kernels:  # one worker process per core, each running kernels one at a time
        pool = ProcessPoolExecutor(jobs)
        results = pool.map(grade_one, args.notebooks, repeat(args.timeout),
                           repeat(args.prediction_points))
    else:
        pool, results = None, grade_forked(args.notebooks, args.timeout,
                                           args.prediction_points, jobs)
    for path, (records, errors, exercises, written) in zip(args.notebooks, results,
                                                           strict=True):
        failed |= _report(path, records, errors, exercises, written, rows, summary,
                          feedback_dir)
    if pool is not None:
        pool.shutdown()
    with args.out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    summary_path = args.out.with_name(f"{args.out.stem}_summary.txt")
    summary_path.write_text("\n".join(summary) + "\n", encoding="utf-8")
    print(f"wrote {args.out}, {summary_path} and one feedback file per notebook in "
          f"{feedback_dir}/")
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
