"""The real nbgrader, end to end, on the 05 masks lab (issue 23, item 4).

The commands docs/nbgrader.md shows run as written, in a fresh shell: ``make nbgrader``'s
exporter writes the course; nbgrader generates the student version, autogrades three
submissions (correct, one mistake, untouched) against a SQLite gradebook and generates
feedback. Full, partial and zero scores are asserted, and the feedback HTML must
name the mistake. Needs ``requirements-teacher.txt`` (``make test-teacher`` installs it);
skipped with the reason where nbgrader is missing. The exported content (written questions,
collapsed prediction graders, the checks each exercise gets) is asserted in-process without it.
"""
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import doc_shell
import nbformat
import pytest

needs_nbgrader = pytest.mark.skipif(
    importlib.util.find_spec("nbgrader") is None,
    reason="nbgrader is not installed: `make test-teacher` installs requirements-teacher.txt "
    "into .venv and runs this test")

ROOT = Path(__file__).resolve().parent.parent
LAB = "05_masks"
BIN = Path(sys.executable).parent


def _lab_total(stem: str = LAB) -> dict:
    from labkit.course import labinfo, scoring

    path = ROOT / "notebooks" / f"{stem}.ipynb"
    settings = scoring.lab_settings(scoring.load_labs(), stem[:2])
    return scoring.lab_points(labinfo.lab_info(nbformat.read(path, as_version=4)), settings)


def _submission(release: Path, source: Path, change=None):
    """The released notebook with each answer cell filled from the source (solutions)."""
    nb = nbformat.read(release, as_version=4)
    solved = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source
              for c in nbformat.read(source, as_version=4).cells}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = solved[meta["grade_id"]]
            if change is not None:
                cell.source = change(cell.source)
    return nb


def _round_trip_block() -> list[str]:
    """docs/nbgrader.md's round trip: export, generate, autograde, feedback."""
    block = next(b for b in doc_shell.shell_blocks(ROOT / "docs" / "nbgrader.md")
                 if "nbgrader autograde" in b)
    return block.split("\n")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The commands docs/nbgrader.md shows, run as written in a fresh shell (the venv not
    active), with three submissions collected where the document says so: before autograde."""
    tmp = tmp_path_factory.mktemp("nbgrader")
    lines = _round_trip_block()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("nbgrader autograde"))
    assert lines[at] == f"nbgrader autograde {LAB}", lines[at]
    carry = [ln for ln in lines[:at] if ln.startswith(("source ", "cd "))]

    def shell(part):
        proc = subprocess.run(["bash", "-c", doc_shell.script("\n".join(part), tmp)],
                              cwd=ROOT, env=doc_shell.fresh_shell_env(), capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, "\n".join(part) + proc.stdout[-3000:] + proc.stderr[-3000:]

    shell(lines[:at])
    course = tmp / "course"
    release = course / "release" / LAB / f"{LAB}.ipynb"
    source = course / "source" / LAB / f"{LAB}.ipynb"
    subs = {
        "correct": _submission(release, source),
        "mistake": _submission(release, source, lambda s: s.replace(
            "diagonal=past + 1)", "diagonal=past)")),  # query i may not see itself
        "untouched": nbformat.read(release, as_version=4),
    }
    assert "diagonal=past)" in json.dumps(subs["mistake"]), \
        "the planted mistake did not apply"
    for student, nb in subs.items():
        folder = course / "submitted" / student / LAB
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{LAB}.ipynb")
    (tmp / "students.csv").write_text("id\n" + "\n".join(subs) + "\n")
    shell(carry + [f"nbgrader db student import {tmp}/students.csv"] + lines[at:])
    return course


@needs_nbgrader
def test_scores_full_partial_and_zero(graded):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{graded / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission(LAB, s).score for s in ("correct", "mistake",
                                                                  "untouched")}
        top = gb.find_assignment(LAB).max_score
    assert top == _lab_total()["total"]  # notebooks/labs.toml's points, as make grade's
    by_hand = _lab_total()["written"]  # the written answers wait for the teacher's marks
    assert scores["correct"] == top - by_hand, scores
    assert 0 < scores["mistake"] < top, scores
    assert scores["untouched"] == 0, scores  # its predictions are stubs too


@needs_nbgrader
def test_feedback_names_the_mistake(graded):
    html = (graded / "feedback" / "mistake" / LAB / f"{LAB}.html").read_text()
    assert "diagonal=0" in html and "a token cannot attend" in html
    assert "Exercise lookahead_mask: 0/1" in html
    correct = (graded / "feedback" / "correct" / LAB / f"{LAB}.html").read_text()
    assert "Exercise lookahead_mask: 1/1" in correct


@needs_nbgrader
def test_student_version_hides_solutions_and_locks_cells(graded):
    nb = nbformat.read(graded / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    solutions = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    answers = [c for c in solutions if c.cell_type == "code"]
    written = [c for c in solutions if c.cell_type == "markdown"]  # the Write. questions' cells
    assert answers and all("raise NotImplementedError()" in c.source for c in answers)
    assert not any("torch.triu(torch.ones(size, size" in c.source for c in answers)
    assert all("# Hint:" in c.source or "# Your prediction: " in c.source for c in answers)
    assert len(written) >= 2 and all(c.source.strip() == "YOUR ANSWER HERE" for c in written)
    # the solved prediction values are not handed out
    assert not any("### PREDICTION" in c.source or "= (3, 1, 6)" in c.source
                   for c in nb.cells), "a prediction's value is visible"
    from labkit.course import markup

    assert not any(markup.answer_blocks(c.source) for c in nb.cells if c.cell_type == "markdown")
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    points = [c.metadata["nbgrader"]["points"] for c in tests]
    exercises = [c.metadata["nbgrader"]["points"] for c in tests
                 if "-test-" in c.metadata["nbgrader"]["grade_id"]]
    parts = _lab_total()
    assert sum(exercises) == parts["exercises"] and sum(points) == parts["total"], points
    graders = [c for c in nb.cells if "check_prediction(" in c.source]
    assert graders and all(c.metadata.get("jupyter", {}).get("source_hidden")
                           for c in graders), "a prediction grading cell opens unfolded"
    assert all(c.metadata["nbgrader"]["locked"] for c in nb.cells
               if not c.metadata["nbgrader"]["solution"])


@needs_nbgrader
def test_every_lab_exports(graded):
    """``make nbgrader`` (the round trip's first line) wrote every numbered notebook."""
    sources = sorted(p.parent.name for p in (graded / "source").glob("*/*.ipynb"))
    want = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sources == want, sources
    assert shutil.which("nbgrader", path=str(BIN))


@needs_nbgrader
def test_totals_follow_labs_toml_and_every_notebook_exports(tmp_path):
    """The exporter's points are notebooks/labs.toml's, as in make grade: 0.5 per prediction
    (also when one cell checks several), 00, 01 and 13 exported, no exercise marked by hand."""
    from labkit.course import labinfo, scoring
    from labkit.course import nbgrader_export as nc

    labs = scoring.load_labs()
    stems = [p.stem[:2] for p in nc.labs()]
    assert {"00", "01", "13"} <= set(stems)
    for path in nc.labs():
        nb = nbformat.read(path, as_version=4)
        settings = scoring.lab_settings(labs, path.stem[:2])
        want = scoring.lab_points(labinfo.lab_info(nb), settings)["total"]
        manual: list[str] = []
        got = nc.export_notebook(path, None, manual)[1]
        assert got == want, (path.stem, got, want)
        assert manual == [], (path.stem, manual)  # every exercise has a check (06: check_decoder)
    proc = subprocess.run([sys.executable, "-m", "labkit.course.nbgrader_export", "--out",
                           str(tmp_path), "--only", "06_encoder_and_decoder"], check=True,
                          capture_output=True, text=True)
    assert "06_encoder_and_decoder" in proc.stdout and "marked by hand" not in proc.stdout
    assert (tmp_path / "README.md").is_file()


# ---------------------------------------------------------------- the exported content, in-process

def _exported(stem: str):
    from labkit.course import nbgrader_export as nc

    manual: list[str] = []
    nb, total = nc.export_notebook(ROOT / "notebooks" / f"{stem}.ipynb", None, manual)
    return nb, total, manual


def _stem(prefix: str) -> str:
    return next(p.stem for p in sorted((ROOT / "notebooks").glob(f"{prefix}_*.ipynb")))


def test_each_written_question_is_a_manually_graded_answer_with_its_points():
    from labkit.course import labinfo, markup, scoring

    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        nb, total, _ = _exported(path.stem)
        want = scoring.lab_settings(scoring.load_labs(), path.stem[:2])["points"]["written"]
        questions = labinfo.lab_info(nbformat.read(path, as_version=4))["written"]
        for i, cell in enumerate(nb.cells):
            if markup.is_written_question(cell):
                answer = nb.cells[i + 1].metadata.get("nbgrader", {})
                assert nb.cells[i + 1].cell_type == "markdown", (path.stem, i)
                assert answer.get("solution") and answer.get("grade"), (path.stem, i, answer)
                assert answer["points"] == want and not answer["locked"], (path.stem, answer)
        written = [c for c in nb.cells if "-written-" in c.metadata.get("nbgrader", {}).get(
            "grade_id", "")]
        assert len(written) == len(questions), (path.stem, len(written), len(questions))
        assert total == _lab_total(path.stem)["total"], path.stem


def test_the_graded_version_has_no_recap_card():
    """It states the formulas and the classic mistake, which the graded questions ask for."""
    for stem in ("05_masks", "09_inference"):
        nb, _, _ = _exported(stem)
        assert not any(c.source.startswith("## Recap card") for c in nb.cells), stem


def test_prediction_grading_cells_are_collapsed_in_the_export():
    nb, _, _ = _exported(LAB)
    graders = [c for c in nb.cells if "check_prediction(" in c.source]
    assert graders
    for cell in graders:
        assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, cell.source[:80]
        assert cell.metadata["nbgrader"]["grade"], "a prediction grader is a test cell"
        # sealed: the student's kernel shows no answer and no mark, nbgrader's grading does
        assert "_grading.seal_predictions()" in cell.source.split("check_prediction(")[0]
        assert cell.source.rstrip().split("\n")[-1].startswith("_grading.sealed_score(")


def test_notebook_12s_exercises_are_autograded_by_the_checks_it_calls():
    nb, _, manual = _exported(_stem("12"))
    assert manual == [], manual
    tests = [c.source for c in nb.cells if "-test-" in c.metadata.get("nbgrader", {}).get(
        "grade_id", "")]
    # found by name now (labkit.find_checks pairs token_mean_loss and amp_step with their checks)
    assert any("mark_exercise('token_mean_loss', token_mean_loss" in s for s in tests), tests
    assert any("mark_exercise('amp_step', amp_step" in s for s in tests), tests


def test_an_exercise_no_check_covers_stays_hand_marked(monkeypatch):
    """Every lab's exercises have a check today (06's MyDecoder got check_decoder), so the
    hand-marked route is exercised by hiding that pairing."""
    from labkit.course import nbgrader_export as nc

    assert _exported(_stem("06"))[2] == []
    real = nc._check_for
    monkeypatch.setattr(nc, "_check_for", lambda info, top, classes: (
        (None, False) if top == "MyDecoder" else real(info, top, classes)))
    nb, _, manual = _exported(_stem("06"))
    assert any("MyDecoder" in m for m in manual), manual
    marked = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")
              and "MyDecoder" in c.source
              and c.source.startswith(nc.MANUAL_NOTE.split("{")[0])]
    assert marked, "the exercise's answer cell asks the teacher for a score"


def test_docs_points_table_is_what_the_exporter_does():
    from labkit.course import nbgrader_export as nc

    text = (ROOT / "docs" / "nbgrader.md").read_text(encoding="utf-8")
    assert nc.points_table() in text, (
        "docs/nbgrader.md's points table is stale: run "
        "`.venv/bin/python -m labkit.course.nbgrader_export --update-doc`")
    assert "13 has none" not in text and "12's `token_mean_loss` and `amp_step`." not in text
