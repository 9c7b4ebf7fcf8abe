"""make grade on a graded hand-in (nbgrader's student version, as `make handout GRADED=1` ships).

A cold teacher found the student version without the exercise markers: the grader fell back
to every function defined (a locked demonstration earned a point) and an unanswered
prediction, whose cell raises, dropped out of the maximum. The export now carries the lab's
``tx_lab`` metadata, and a declared prediction that never ran counts 0 of its points.
"""
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def test_an_untouched_graded_hand_in_scores_zero_of_the_full_maximum(tmp_path):
    from labkit.course import grade, handout, labinfo, scoring
    from labkit.course.grade_forked import grade_forked

    solved = ROOT / "notebooks" / "05_masks.ipynb"
    path = tmp_path / "carol_05_masks.ipynb"
    nbformat.write(handout.graded_notebook(solved), path)
    # make grade's default route (the kernel route marks the same: test_grade_forked.py)
    records, errors, exercises, _ = next(grade_forked([path], 120, 0.5, 1))
    rows = grade.rows_for(path, records, errors, exercises)
    total = rows[-1]
    parts = scoring.lab_points(labinfo.lab_info(nbformat.read(solved, as_version=4)),
                               scoring.lab_settings(scoring.load_labs(), "05"))
    assert float(total["points"]) == 0, total
    assert float(total["max_points"]) == parts["total"] - parts["written"], (total, parts)
    graded = {r["exercise"] for r in rows if r["check"] not in grade.NOT_MARKS}
    assert "-" not in graded, graded  # every row names its exercise
    assert not any("article" in r["exercise"] for r in rows), graded  # no demonstration


def test_the_summary_and_feedback_say_the_written_answers_are_still_to_mark():
    from labkit.course import grade

    path = Path("alice_05.ipynb")
    record = {"name": "check_masks", "subject": "padding_mask", "passed": True, "mistakes": [],
              "messages": ["check_masks: passed"], "label": "check_masks",
              "mark": {"score": 1, "points": 1, "delegated": "", "lines": ["passed"]}}
    exercises = {"padding_mask": [{"number": 1, "name": "padding_mask"}]}
    written = [("Why (N, 1, L_src)?", "it broadcasts")] * 2
    rows = grade.rows_for(path, [record], 0, exercises, written)
    summary = grade.summary_line(path, rows)
    assert "marks: 1/1 points automatic, + 2 written answer(s) to mark by hand" in summary[1]
    feedback = grade.feedback_text(path, [record], rows, 0)
    assert feedback.startswith("Feedback for alice_05.ipynb: 1/1 points from the automatic")
    assert "your teacher marks your 2 written answer(s)" in feedback.split("\n")[0]
