"""make grade's default route: each submission in a child forked from one process that has
imported torch, tx_helpers and labkit once (labkit/course/grade.py: grade_forked, run_here).

What the route must keep from a fresh kernel per submission: the same marks, one
submission's changes to modules never reaching the next, a cell that never ends stopped by
the timeout, and a child that dies graded 0 with its exercises still in the maximum.
"""
import csv
import os

import nbformat
import pytest

from labkit.course import grade

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the forked route needs fork")

IMPORTS = "import torch\nimport labkit\nimport tx_helpers as tx"
ATTENTION = ("def attention(q, k, v, mask=None):\n"
             "    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5\n"
             "    if mask is not None:\n"
             "        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)\n"
             "    w = torch.softmax(scores, dim=-1)\n"
             "    return w @ v, w")


UNSCALED = ("def attention(q, k, v, mask=None):\n"
            "    w = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  # no 1/sqrt(d_k)\n"
            "    return w @ v, w")


def notebook(path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def marks(out):
    rows = csv.DictReader(out.open())
    return {r["notebook"]: (r["points"], r["max_points"]) for r in rows
            if r["check"] == "total"}


def test_a_submission_that_breaks_the_checks_does_not_reach_the_next(tmp_path):
    """The first learner makes the lab kit's comparison say yes to anything (in one shared
    process every later submission would then pass); the wrong one graded right after it,
    in the same worker, still fails and the right one still passes."""
    cheat = notebook(tmp_path / "a_cheat.ipynb", IMPORTS,
                     "def attention(q, k, v, mask=None):\n    return q, None",
                     "import labkit.compare\nlabkit.compare._close = lambda *a, **k: True")
    honest = notebook(tmp_path / "b_honest.ipynb", IMPORTS, ATTENTION)
    wrong = notebook(tmp_path / "c_wrong.ipynb", IMPORTS, UNSCALED)  # 1/3 of its probes: 1/6
    out = tmp_path / "grades.csv"
    grade.main([str(cheat), str(honest), str(wrong), "--out", str(out), "--jobs", "1"])
    got = marks(out)
    assert (got["b_honest.ipynb"], got["c_wrong.ipynb"]) == (("1", "1"), ("0.17", "1")), got


@pytest.mark.slow  # a fresh kernel per submission; the forked-route tests stay fast
def test_the_forked_route_marks_as_a_fresh_kernel_does(tmp_path):
    wrong = notebook(tmp_path / "wrong.ipynb", IMPORTS, UNSCALED,
                     "raise ValueError('an unfinished cell')")
    right = notebook(tmp_path / "right.ipynb", IMPORTS, ATTENTION)
    rows = {}
    for route in ([], ["--kernels"]):
        out = tmp_path / f"grades{len(route)}.csv"
        grade.main([str(wrong), str(right), "--out", str(out)] + route)
        rows[bool(route)] = [{k: r[k] for k in ("notebook", "check", "passed", "mistakes",
                                                "points", "max_points")}
                             for r in csv.DictReader(out.open())]
    assert rows[False] == rows[True]
    by = {(r["notebook"], r["check"]): r for r in rows[False]}
    assert by[("wrong.ipynb", "cells")]["mistakes"] == "1 cell(s) raised"
    assert "no_scaling" in by[("wrong.ipynb", "check_attention(attention)")]["mistakes"]


def test_a_prediction_computed_from_the_notebooks_variables_is_caught(tmp_path):
    """The forked route keeps the input history a kernel keeps: a prediction pasted from a
    variable scores 0 as ``prediction_pasted``; a typed one scores its points."""
    cells = ["import labkit", "rows = list(range(20))", "predicted_rows = {}  ### PREDICTION",
             "labkit.check_prediction('rows', predicted_rows, 20)"]
    pasted = notebook(tmp_path / "pasted.ipynb", *[c.format("len(rows)") for c in cells])
    typed = notebook(tmp_path / "typed.ipynb", *[c.format("20") for c in cells])
    out = tmp_path / "grades.csv"
    grade.main([str(pasted), str(typed), "--out", str(out), "--jobs", "1"])
    rows = {r["notebook"]: r for r in csv.DictReader(out.open())
            if r["check"] == "prediction"}
    assert rows["pasted.ipynb"]["mistakes"] == "prediction_pasted", rows
    assert rows["typed.ipynb"]["passed"] == "True" and rows["typed.ipynb"]["mistakes"] == "", rows


EVEN_ONLY_TABLE = (  # right for even d_model; raises for odd d_model (the column slices differ)
    "import math\n"
    "def positional_table(max_len, d_model, dtype=torch.float32):\n"
    "    pe = torch.zeros(max_len, d_model, dtype=torch.float64)\n"
    "    pos = torch.arange(max_len, dtype=torch.float64)[:, None]\n"
    "    omega = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)"
    " * (-math.log(10000.0) / d_model))\n"
    "    pe[:, 0::2] = torch.sin(pos * omega)\n"
    "    pe[:, 1::2] = torch.cos(pos * omega)\n"
    "    return pe.to(dtype)")


def test_the_grade_asks_what_the_lab_asks_even_if_the_check_call_is_edited(tmp_path):
    """The options a check runs with come from the lab's record of its check calls (metadata
    ``tx_lab``), not from the learner's cells: dropping ``odd_d_model=True`` from the call in
    the notebook does not let an even-only table pass."""
    path = notebook(tmp_path / "edited.ipynb", IMPORTS, EVEN_ONLY_TABLE,
                    "labkit.check_positional_encoding(positional_table)")
    nb = nbformat.read(path, as_version=4)
    nb.metadata["tx_lab"] = {
        "exercises": [{"name": "positional_table", "number": 1, "section": "4"}],
        "predictions": [],
        "checks": [{"call": "labkit.check_positional_encoding(positional_table, "
                            "odd_d_model=True)"}]}
    nbformat.write(nb, path)
    out = tmp_path / "grades.csv"
    grade.main([str(path), "--out", str(out), "--jobs", "1"])
    rows = {r["check"]: r for r in csv.DictReader(out.open())}
    row = rows["check_positional_encoding(positional_table)"]
    assert row["passed"] == "False", row
    assert marks(out)["edited.ipynb"][0] != "1", rows


@pytest.mark.parametrize("patch", [
    "import labkit.report\nlabkit.report._Report.probe = lambda self, ok, text: None",
    "import labkit.compare\nlabkit.compare._close = lambda *a, **k: True",
    "import torch\ntorch.allclose = lambda *a, **k: True",
])
def test_a_submission_that_patches_the_grader_scores_zero(tmp_path, patch):
    """A cold reader patched the lab kit's report from a stub cell and got 5.5/5.5 for an
    unscaled attention; now every automatic mark of that submission is 0, named."""
    path = notebook(tmp_path / "patched.ipynb", IMPORTS, patch, UNSCALED)
    out = tmp_path / "grades.csv"
    grade.main([str(path), "--out", str(out), "--jobs", "1"])
    rows = {r["check"]: r for r in csv.DictReader(out.open())}
    row = rows["check_attention(attention)"]
    assert row["mistakes"] == "grader_patched" and row["points"] in ("0", "0.0"), row
    assert "replaced part of the grader" in row["diagnosis"], row


def test_a_cell_tagged_grade_skip_is_not_run(tmp_path):
    path = notebook(tmp_path / "skip.ipynb", IMPORTS, ATTENTION, "raise SystemExit('a long demo')")
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].metadata["tags"] = ["grade-skip"]
    nbformat.write(nb, path)
    out = tmp_path / "grades.csv"
    grade.main([str(path), "--out", str(out), "--jobs", "1"])
    rows = {r["check"]: r for r in csv.DictReader(out.open())}
    assert rows["cells"]["mistakes"] == "" and rows["total"]["points"] == "1", rows


def test_a_cell_that_never_ends_is_stopped_and_the_rest_still_graded(tmp_path):
    path = notebook(tmp_path / "loops.ipynb", IMPORTS, ATTENTION, "while True:\n    pass")
    out = tmp_path / "grades.csv"
    grade.main([str(path), "--out", str(out), "--timeout", "2"])
    rows = {r["check"]: r for r in csv.DictReader(out.open())}
    assert rows["cells"]["mistakes"] == "1 cell(s) raised"
    assert rows["total"]["points"] == "1"


def test_a_child_that_dies_scores_zero_and_keeps_its_maximum(tmp_path):
    crash = notebook(tmp_path / "crash.ipynb", IMPORTS, ATTENTION, "import os\nos._exit(3)")
    nb = nbformat.read(crash, as_version=4)
    nb.metadata["tx_lab"] = {"exercises": [{"name": "attention", "number": 1,
                                            "section": "3"}], "predictions": []}
    nbformat.write(nb, crash)
    out = tmp_path / "grades.csv"
    assert grade.main([str(crash), "--out", str(out), "--strict"]) == 1
    assert marks(out) == {"crash.ipynb": ("0", "1")}


@pytest.mark.parametrize("name", ["02_positional_encoding.ipynb", "03_multi_head_attention.ipynb"])
def test_a_solved_lab_grades_to_full_automatic_marks(tmp_path, name):
    """The exercise copy with the solutions and predictions of the solved notebook put back:
    every automatic point. 02's given __init__ calls tx.sinusoidal_table and 03's given
    split_heads is tx's code; neither is the learner's delegation (both once scored 0)."""
    import json
    from pathlib import Path

    from test_exercises import fill_back

    from labkit.course import layout, markup, regions

    root = Path(__file__).resolve().parents[1] / "notebooks"
    solved = {c.id: c.source for c in nbformat.read(root / name, as_version=4).cells}
    nb = nbformat.read(root / layout.EXERCISE_DIR / name, as_version=4)
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.get("metadata", {}).get(markup.META_KEY):
            cell.source = fill_back(cell.source, regions.strip_hidden_tests(solved[cell.id]))
        elif cell.cell_type == "code" and "### PREDICTION" in solved.get(cell.id, ""):
            cell.source = solved[cell.id]
    path = tmp_path / name
    nbformat.write(nb, path)
    out = tmp_path / "grades.csv"
    assert grade.main([str(path), "--out", str(out), "--strict"]) == 0
    points, total = marks(out)[name]
    assert points == total and float(total) > 0, (points, total)


def test_the_labs_exercise_names_pair_with_their_checks():
    """12's and 13's exercises once had no automatic check although their checks exist."""
    import labkit

    def f():
        pass

    for name, check in (("token_mean_loss", "check_token_mean_loss"),
                        ("amp_step", "check_amp_step"),
                        ("my_phone_error_rate", "check_phone_error_rate")):
        found = labkit.find_checks({name: f}, module=None)
        assert [label for label, _ in found] == [f"{check}({name})"], found
