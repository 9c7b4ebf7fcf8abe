"""The lab table of docs/teaching.md, generated from the exercise copies and labs.toml."""
from __future__ import annotations

from pathlib import Path

import nbformat

from labkit.course.exercise_copy import expected_exercises
from labkit.course.layout import EXERCISE_DIR, LABS_TOML, ROOT, TEACHING, lab_number
from labkit.course.markup import LAB_KEY, RegionError, md_escape
from labkit.course.scoring import graded_objects, lab_points, lab_settings, load_labs

TABLE_BEGIN = "<!-- BEGIN GENERATED LAB TABLE: labkit/course/exercises.py writes this part -->"
TABLE_END = "<!-- END GENERATED LAB TABLE -->"


def lab_table(root: Path = ROOT, copies: dict[Path, str] | None = None) -> str:
    """The generated part of docs/teaching.md, from the exercise copies' metadata."""
    copies = copies if copies is not None else expected_exercises(root)
    labs = load_labs(root)
    rows = ["| Lab | Code to write: points, and the check that marks it | Predictions | "
            "Written answers | Points | Study time (estimate) |", "|---|---|---|---|---|---|"]
    rubrics, total_minutes = [], 0
    for path in sorted(copies):
        nb = nbformat.reads(copies[path], as_version=4)
        meta = nb.metadata[LAB_KEY]
        settings = lab_settings(labs, lab_number(path))
        points = lab_points(meta, settings)
        p = settings["points"]
        link = (f"[{path.stem.replace('_', ' ')}](../notebooks/{path.name}) "
                f"([exercise](../notebooks/{EXERCISE_DIR}/{path.name}))")
        code = []
        for top, methods, checks in graded_objects(meta["exercises"]):
            n = max(1, len(methods))
            what = f"`{top}`" + (f" ({', '.join(f'`{m}`' for m in methods)})" if methods else "")
            by = ", ".join(f"`{c}`" for c in checks) or "no check: mark by hand"
            code.append(f"{what}: {n * p['exercise']:g} pt, {by}")
        code_text = "<br>".join(code) or "none"
        preds = meta["predictions"]
        pred_text = (f"{len(preds)} × {p['prediction']:g} pt: "
                     + "; ".join(md_escape(x["label"] or x["name"]) for x in preds)
                     ) if preds else "none"
        written = meta["written"]
        written_text = (f"{len(written)} × {p['written']:g} pt (rubric below)" if written
                        else "none")
        if meta.get("drill"):
            written_text += (f"; {meta['drill']} drill questions with an answer cell, "
                             "**ungraded** (0 pt)")
        if settings["graded_note"]:
            written_text += f". {md_escape(settings['graded_note'])}"
        minutes = settings["minutes"]
        total_minutes += minutes or 0
        time_text = f"about {minutes} min" if minutes else "not estimated"
        rows.append(f"| {link} | {code_text} | {pred_text} | {written_text} | "
                    f"{points['total']:g} | {time_text} |")
        if written:
            rubrics.append(f"- **{path.stem}**: {settings['rubric'] or 'no rubric yet'}")
    out = [TABLE_BEGIN, "", *rows, "",
           f"Study times are the authors' estimates (reading, predicting, writing and "
           f"running, for a learner new to the topic), not measurements: about "
           f"{total_minutes / 60:.0f} hours for the series. Each exercise (one stub to fill "
           f"in) is worth {labs['points']['exercise']:g} pt, each graded prediction "
           f"{labs['points']['prediction']:g} pt and each written answer "
           f"{labs['points']['written']:g} pt unless a lab says otherwise; a class with several "
           f"stubs earns them through the one check that marks it (`labkit/course/grade.py` gives "
           f"a failed check half its points times the share of probes passed). The points, "
           f"the rubric and the estimates live in "
           f"`{LABS_TOML.as_posix()}`; the rest of this table is read from the notebooks. "
           f"`make exercises` rewrites it, and a test fails when it is stale."]
    if rubrics:
        out += ["", "Rubric for the written answers:", "", *rubrics]
    out += ["", TABLE_END]
    return "\n".join(out)


def teaching_text(root: Path = ROOT, copies: dict[Path, str] | None = None) -> str | None:
    """docs/teaching.md with its generated table replaced (None: no teaching.md)."""
    path = root / TEACHING
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise RegionError(f"{TEACHING.as_posix()}: the marker comments {TABLE_BEGIN!r} and "
                          f"{TABLE_END!r} are missing")
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    return head + lab_table(root, copies) + tail
