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
import csv
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from labkit.course.grade_forked import grade_forked, run_here
from labkit.course.submission import prepare, records_from, written_answers

# The kernels' debugger warning about frozen modules is noise in the teacher's terminal.
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
NOT_MARKS = ("cells", "none", "written", "total")  # CSV rows that are not a check's mark
FIELDS = ["notebook", "exercise", "check", "passed", "mistakes", "diagnosis", "points",
          "max_points", "delegated"]


def run_notebook(path: Path, timeout: int = 120, prediction_points: float = 0.5
                 ) -> tuple[list[dict], int, dict]:
    """Execute ``path`` (a copy in memory) in a fresh Jupyter kernel:
    (check records, cells that raised, exercises)."""
    nb, n_cells, exercises = prepare(path, prediction_points)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    client.execute(stderr=subprocess.DEVNULL)  # the kernel's own log lines are noise here
    errors = sum(1 for cell in nb.cells[:n_cells] if cell.cell_type == "code"
                 and any(o.get("output_type") == "error" for o in cell.get("outputs", [])))
    text = "".join(out.get("text", "") for out in nb.cells[-1].outputs
                   if out.get("output_type") == "stream")
    return records_from(text), errors, exercises


def grade_one(path: Path, timeout: int, prediction_points: float, kernels: bool = True):
    """One submission: (records, cells that raised, exercises, written answers)."""
    if kernels:
        records, errors, exercises = run_notebook(path, timeout, prediction_points)
    else:
        records, errors, exercises = run_here(path, timeout, prediction_points)
    return records, errors, exercises, written_answers(nbformat.read(path, as_version=4))


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
    ok = sum(r["passed"] is True and not r["delegated"] for r in code)  # delegated: 0 points
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
