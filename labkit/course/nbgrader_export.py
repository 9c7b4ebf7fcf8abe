#!/usr/bin/env python3
"""Export every lab into an nbgrader course folder (``make nbgrader``).

  .venv/bin/python -m labkit.course.nbgrader_export --out course [--only 05_masks ...]

For each numbered notebook (solution regions are ``### BEGIN SOLUTION`` ... ``### END
SOLUTION``), ``course/source/<notebook stem>/<notebook>.ipynb`` is written in nbgrader's
format, with the points of ``notebooks/labs.toml`` (the same as ``make grade``):

- every cell that holds a solution region is an *autograded answer* cell (nbgrader replaces
  each region with ``raise NotImplementedError()``; the region's ``### HINT:`` line is kept
  as a ``# Hint:`` comment above it, so students still see it);
- after it, one *autograder test* cell per class or function it defines that a check covers,
  worth the lab's exercise points per exercise it holds: it calls
  :func:`labkit.mark_exercise`,
  which prints the full report (the named mistake, the hint) and ends with the score, which
  nbgrader reads as partial credit. Delegating to the ``tx_helpers`` reference earns 0;
- each ``name = value  ### PREDICTION`` line becomes a solution region under a
  ``# Your prediction: name = ...`` comment, in an answer cell (the student version shows
  the stub, not the value);
- each cell that calls ``check_prediction`` becomes a test cell worth the lab's prediction
  points (``notebooks/labs.toml``, or ``--prediction-points``) times the predictions it
  checks; the score is that times the share of them that are right;
- an exercise whose name pairs with no check is graded by the check the notebook calls on it
  (12's ``check_amp_step(amp_step)``); one no check covers (06's ``MyEncoder`` and
  ``MyDecoder``) makes its answer cell a *manually graded answer* with its points, and the
  README and the run say so;
- each written question (a ``**Write.**`` markdown cell) is followed by a *manually graded*
  markdown answer cell worth the lab's written points (its rubric is in the teacher key); an
  ungraded drill question (tag ``answer-space``) gets an answer cell with no points;
- the cells that call ``check_prediction`` are collapsed (``jupyter.source_hidden``): their
  code names the answer, so the student version runs them unopened; and *sealed*
  (:func:`labkit.seal_predictions`): no ✓/✗ or true value until nbgrader autogrades;
- every other cell is *read-only* (locked); markdown answers (the ``<details>`` blocks) and
  teacher-only cells are left out, as in ``notebooks/exercises/``;
- lines between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` outside a test cell
  are removed, as in ``notebooks/exercises/`` (a cell holding only such lines is dropped).

Also written: ``course/nbgrader_config.py`` (course id, the stub, a cell timeout) and
``course/README.md`` with the commands (docs/nbgrader.md shows them). The notebook metadata
``tx_lab`` lists the exercises and predictions, so ``make grade`` grades a hand-in too.
The kernel that runs a submission must import ``tx_helpers`` (``make setup`` installs it).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]

from labkit import check_options  # noqa: E402
from labkit.course import labinfo, markup, regions, scoring  # noqa: E402
from labkit.course.submission import defined_names, method_scope  # noqa: E402

SCHEMA = 3
CONFIG = '''\
# nbgrader configuration for the Transformer labs (written by labkit/course/nbgrader_export.py).
c = get_config()  # noqa: F821 - nbgrader provides it
c.CourseDirectory.course_id = {course!r}
c.CourseDirectory.db_url = "sqlite:///gradebook.db"
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.ClearSolutions.enforce_metadata = True
c.Execute.timeout = {timeout}
'''
TEST_CELL = '''\
# Autograded ({points:g} point{s}): {items}.
# The check prints what is wrong and how to fix it; the last line is the score.
import labkit as _grading
_mark = _grading.mark_exercise({name!r}, {name}, points={points!r}{options})
_mark.score'''
PREDICTION_HEAD = '''\
import labkit as _grading
_grading.seal_predictions()  # graded: no answer shown until nbgrader grades the hand-in
_before = len(_grading.history())  # the predictions this cell checks come after this line
'''
PREDICTION_TAIL = '''
# Autograded ({points:g} point{s}: {count} prediction{ps} x {each:g}); the last line is the score.
_marks = _grading.mark_predictions(_grading.history()[_before:], points_each=1)
_share = sum(_m.score for _m in _marks) / len(_marks) if _marks else 0.0
_grading.sealed_score({points!r} * _share)'''
WRITTEN_ANSWER = "YOUR ANSWER HERE"  # nbgrader's own placeholder in a markdown answer cell
MANUAL_NOTE = ("# Marked by hand ({points:g} point{s}): no automatic check covers {names}; "
               "the notebook's own checks above and below show whether it works.\n")


def _meta(kind: str, grade_id: str, points: float | None = None) -> dict:
    meta = {"grade": kind == "test", "grade_id": grade_id, "locked": kind != "solution",
            "schema_version": SCHEMA, "solution": kind == "solution", "task": False}
    if kind == "test":
        meta["points"] = points
    return meta


def _check_label(name: str, is_class: bool) -> str | None:
    """The check find_checks pairs with a class or function of this name, without running it."""
    from torch import nn

    from labkit import find_checks

    dummy = type(name, (nn.Module,), {}) if is_class else (lambda *a, **k: None)
    if not is_class:
        dummy.__name__ = name
    found = find_checks({name: dummy}, module=None)
    return found[0][0] if found else None


def _notebook_check(info: dict, name: str) -> str | None:
    """The check the notebook itself calls on ``name`` alone (``labkit.check_amp_step(amp_step)``,
    literal options allowed), for an exercise whose name pairs with no check."""
    import ast

    for c in info["checks"]:
        try:
            call = ast.parse(c["call"]).body[0].value
        except (SyntaxError, IndexError, AttributeError):
            continue
        plain = [a for a in call.args if isinstance(a, ast.Name)] == call.args
        if (c["subjects"] == [name] and plain and [a.id for a in call.args] == [name]
                and not any(isinstance(k.value, ast.Name) for k in call.keywords)):
            return c["check"]
    return None


def _check_for(info: dict, top: str, classes: set[str]) -> tuple[str | None, bool]:
    """(check, paired by name?) for the exercise's class or function ``top``."""
    if _check_label(top, top in classes) is not None:
        return "by name", True
    return _notebook_check(info, top), False


def _classes(source: str) -> set[str]:
    import ast

    lines = [ln for ln in source.split("\n") if not ln.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return set()
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef)}


def _hidden_lines(source: str) -> str:
    """The lines between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``."""
    out, inside = [], False
    for line in source.split("\n"):
        if markup.BEGIN_HIDDEN.match(line):
            inside = True
        elif markup.END_HIDDEN.match(line):
            inside = False
        elif inside:
            out.append(line)
    return "\n".join(out)


def _hints_outside(source: str) -> str:
    """Move each region's ``### HINT:`` line above its BEGIN line as a ``# Hint:`` comment."""
    lines = source.split("\n")
    for region in reversed(regions.find_regions(source)):
        nxt = region.begin + 1
        m = markup.HINT.match(lines[nxt]) if nxt < len(lines) else None
        if m:
            del lines[nxt]
            lines.insert(region.begin, f"{region.indent}# Hint: {m.group('text')}")
    return "\n".join(lines)


def _prediction_answers(source: str) -> str:
    """Each ``name = value  ### PREDICTION`` line becomes a solution region under a
    ``# Your prediction: name = ...`` comment: the student version shows the stub, never the
    value (a locked cell with the solved values would hand out the answers)."""
    lines = source.split("\n")
    for index, name, value in reversed(markup.prediction_lines(source)):
        indent = lines[index][:len(lines[index]) - len(lines[index].lstrip())]
        lines[index:index + 1] = [f"{indent}# Your prediction: {name} = ...",
                                  f"{indent}### BEGIN SOLUTION", f"{indent}{name} = {value}",
                                  f"{indent}### END SOLUTION"]
    return "\n".join(lines)


def export_notebook(path: Path, prediction_points: float | None = None,
                    manual: list[str] | None = None) -> tuple[object, float]:
    """The nbgrader source version of one solved notebook, and its total points.

    Points come from ``notebooks/labs.toml`` (``labkit/course/exercises.py``'s ``load_labs``
    and ``lab_settings``): each exercise and each graded prediction, also when one cell
    checks several predictions. ``prediction_points`` overrides the prediction value.
    Exercises no check covers become manually graded answer cells with their points; their
    names are appended to ``manual`` when it is given.
    """
    nb = nbformat.read(path, as_version=4)
    settings = scoring.lab_settings(scoring.load_labs(), path.stem[:2])["points"]
    each = float(settings["exercise"])
    written_points = float(settings["written"])
    if prediction_points is None:
        prediction_points = float(settings["prediction"])
    info = labinfo.lab_info(nb)
    predictions_in: dict[int, int] = {}  # the cell that checks them -> how many
    for item in info["predictions"]:
        predictions_in[item["check_cell"]] = predictions_in.get(item["check_cell"], 0) + 1
    items_by_cell: dict[int, list[dict]] = {}
    for item in labinfo.exercise_list(nb):
        items_by_cell.setdefault(item["cell"], []).append(item)
    stem = path.stem
    cells, total, counter = [], 0.0, 0
    all_code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")

    def gid(kind: str) -> str:
        nonlocal counter
        counter += 1
        return f"{stem}-{kind}-{counter:03d}"

    for index, cell in enumerate(nb.cells):
        cell = nbformat.from_dict(json.loads(json.dumps(cell)))
        hidden = ""
        if markup.is_teacher_only(cell) or cell.source.startswith("## Recap card"):
            continue  # the teacher's key; the recap card states what the graded work asks
        if cell.cell_type == "markdown":  # the <details> answers, as in the exercise copies
            cell.source = markup.strip_answers(cell.source)
            if not cell.source.strip():
                continue
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            original = cell.source
            stripped = regions.strip_hidden_tests(original)
            hidden = _hidden_lines(original)
            if original.strip() and not stripped.strip() and index not in items_by_cell:
                continue  # only hidden tests: dropped, as in the exercise copies
            cell.source = stripped
        for key in ("execution", "ExecuteTime", "collapsed", "scrolled", markup.META_KEY):
            cell.metadata.pop(key, None)
        if index in items_by_cell:
            cell.source = _hints_outside(cell.source)
            cell.metadata["nbgrader"] = _meta("solution", gid("answer"))
            cells.append(cell)
            classes = _classes(cell.source)
            unchecked = [i for i in items_by_cell[index]
                         if _check_for(info, i["name"].split(".")[0], classes)[0] is None]
            if unchecked:  # a manually graded answer: nbgrader asks the teacher for a score
                points = each * len(unchecked)
                names = ", ".join(f"{i['number']}. {i['name']}" for i in unchecked)
                cell.source = MANUAL_NOTE.format(points=points, s="" if points == 1 else "s",
                                                 names=names) + cell.source
                cell.metadata["nbgrader"].update(grade=True, points=points)
                total += points
                if manual is not None:
                    manual.append(names)
            for name in defined_names(cell.source):
                items = [i for i in items_by_cell[index] if i["name"].split(".")[0] == name]
                check, by_name = _check_for(info, name, classes)
                if not items or check is None:
                    continue
                points = each * len(items)
                total += points
                options = "" if by_name else f", check=_grading.{check}"
                options += "".join(f", {k}={v!r}" for k, v in dict(
                    check_options(all_code, name), **method_scope(items)).items())
                source = TEST_CELL.format(
                    points=points, s="" if points == 1 else "s", name=name, options=options,
                    items=", ".join(f"{i['number']}. {i['name']}" for i in items))
                if hidden:  # the exercise cell's hidden tests run here, hidden from students
                    head, last = source.rsplit("\n", 1)
                    source = (f"{head}\n### BEGIN HIDDEN TESTS\n{hidden}\n"
                              f"### END HIDDEN TESTS\n{last}")
                    hidden = ""
                test = nbformat.v4.new_code_cell(source)
                test.metadata["nbgrader"] = _meta("test", gid("test"), points)
                cells.append(test)
            continue
        if cell.cell_type == "code" and markup.prediction_lines(cell.source):
            cell.source = _prediction_answers(cell.source)
            cell.metadata["nbgrader"] = _meta("solution", gid("guess"))
            cells.append(cell)
            continue
        if cell.cell_type == "code" and re.search(r"\bcheck_prediction\(", cell.source):
            count = predictions_in.get(index, 1)
            points = prediction_points * count
            cell.source = PREDICTION_HEAD + cell.source.rstrip() + "\n" + PREDICTION_TAIL.format(
                points=points, s="" if points == 1 else "s", count=count,
                ps="" if count == 1 else "s", each=prediction_points)
            cell.metadata["nbgrader"] = _meta("test", gid("prediction"), points)
            # its code names the answer and the usual wrong ones: run it unopened
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
            total += points
        else:
            cell.metadata["nbgrader"] = _meta("readonly", gid("locked"))
        cells.append(cell)
        tags = nb.cells[index].get("metadata", {}).get("tags") or []
        if markup.is_written_question(nb.cells[index]) or markup.ANSWER_SPACE_TAG in tags:
            graded = markup.is_written_question(nb.cells[index])
            answer = nbformat.v4.new_markdown_cell(WRITTEN_ANSWER)
            answer.metadata["nbgrader"] = _meta("solution", gid("written" if graded else "drill"))
            if graded:  # a manually graded answer: the teacher marks it with the key's rubric
                answer.metadata["nbgrader"].update(grade=True, points=written_points)
                total += written_points
            cells.append(answer)
    for cell in cells if nb.nbformat_minor < 5 else ():
        cell.pop("id", None)
    nb.cells = cells
    nb.metadata.pop("widgets", None)
    nb.metadata[markup.LAB_KEY] = {  # make grade reads what the lab grades from here too
        "exercises": [{k: e[k] for k in ("number", "name", "section")} for e in info["exercises"]],
        "predictions": [{k: p[k] for k in ("number", "name", "label", "section")}
                        for p in info["predictions"]],
        "checks": [{"call": c["call"]} for c in info["checks"]]}
    return nb, total


DOC = ROOT / "docs" / "nbgrader.md"
POINTS_BEGIN = ("<!-- BEGIN GENERATED POINTS: python -m labkit.course.nbgrader_export "
                "--update-doc writes this table -->")
POINTS_END = "<!-- END GENERATED POINTS -->"


def points_table(root: Path = ROOT) -> str:
    """The points of every exported lab, as docs/nbgrader.md shows them (generated)."""
    rows = ["| Lab | Points | Autograded | Marked by hand |", "|---|---|---|---|"]
    labs_toml = scoring.load_labs(root)
    for path in labs(root):
        manual: list[str] = []  # "1. MyEncoder.forward, 3. MyDecoder.forward" per answer cell
        _, total = export_notebook(path, None, manual)
        info = labinfo.lab_info(nbformat.read(path, as_version=4))
        settings = scoring.lab_settings(labs_toml, path.stem[:2])
        parts = scoring.lab_points(info, settings)
        hand_items = sum(len(m.split(", ")) for m in manual)
        hand_code = settings["points"]["exercise"] * hand_items
        hand = [f"{len(info['written'])} written answer(s), {parts['written']:g} pt"
                ] if info["written"] else []
        if manual:
            hand.append(f"{'; '.join(manual)}, {hand_code:g} pt")
        rows.append(f"| `{path.stem}` | {total:g} | {total - parts['written'] - hand_code:g} pt: "
                    f"{len(info['exercises']) - hand_items} exercise(s), "
                    f"{len(info['predictions'])} prediction(s) | {'; '.join(hand) or 'nothing'} |")
    return "\n".join([POINTS_BEGIN, *rows, POINTS_END])


def doc_text(root: Path = ROOT) -> str:
    """docs/nbgrader.md with its generated points table replaced."""
    text = (root / "docs" / "nbgrader.md").read_text(encoding="utf-8")
    head, rest = text.split(POINTS_BEGIN, 1)
    return head + points_table(root) + rest.split(POINTS_END, 1)[1]


def labs(root: Path = ROOT) -> list[Path]:
    """Every numbered notebook: those without a solution region (00, 01, 13) too, with
    their predictions as the graded cells (or none: 0 points, a locked notebook to run)."""
    return sorted((root / "notebooks").glob("[0-9]*.ipynb"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("course"))
    parser.add_argument("--only", nargs="*", default=None,
                        help="notebook stems to export (default: every lab)")
    parser.add_argument("--course-id", default="transformer-labs")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--prediction-points", type=float, default=None,
                        help="points per graded prediction (default: notebooks/labs.toml)")
    parser.add_argument("--update-doc", action="store_true",
                        help="rewrite the points table of docs/nbgrader.md, and nothing else")
    args = parser.parse_args(argv)
    if args.update_doc:
        DOC.write_text(doc_text(), encoding="utf-8")
        print(f"wrote the points table of {DOC.relative_to(ROOT)}")
        return 0
    chosen = [p for p in labs() if args.only is None or p.stem in args.only]
    if args.only and len(chosen) != len(args.only):
        missing = set(args.only) - {p.stem for p in chosen}
        parser.error(f"--only: no lab named {sorted(missing)} (labs: "
                     f"{', '.join(p.stem for p in labs())})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nbgrader_config.py").write_text(
        CONFIG.format(course=args.course_id, timeout=args.timeout), encoding="utf-8")
    lines = []
    for path in chosen:
        manual: list[str] = []
        nb, total = export_notebook(path, args.prediction_points, manual)
        folder = args.out / "source" / path.stem
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / path.name)
        by_hand = (f"; marked by hand (no automatic check): {'; '.join(manual)}"
                   if manual else "")
        lines.append(f"- `{path.stem}`: {total:g} point(s){by_hand}")
        print(f"{folder / path.name}: {total:g} point(s){by_hand}")
    (args.out / "README.md").write_text(
        "# nbgrader course: the Transformer labs\n\nWritten by `labkit/course/nbgrader_export.py`; "
        "see docs/nbgrader.md in the repository.\n\nAssignments:\n\n" + "\n".join(lines)
        + "\n\nIn this folder: `nbgrader generate_assignment NAME`, collect submissions into "
        "`submitted/<student>/NAME/`, `nbgrader autograde NAME`, "
        "`nbgrader generate_feedback NAME`.\n", encoding="utf-8")
    print(f"wrote {len(chosen)} assignment(s) under {args.out / 'source'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
