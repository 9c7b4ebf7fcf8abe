"""labkit/course/exercises.py: stale check, region replacement, and stubs that the grading
checks report (and pass once the solution is filled back in)."""
import ast
import inspect
import json
import math
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit
import tx_helpers as tx

ROOT = Path(__file__).resolve().parent.parent
from labkit.course import exercise_copy, layout, markup, regions  # noqa: E402
from labkit.course import exercises as mx  # noqa: E402


def base_namespace() -> dict:
    """What a notebook cell can rely on: torch, nn, F, math, tx (and a CPU device)."""
    return {"__name__": "__main__", "torch": torch, "nn": nn, "F": F, "math": math, "tx": tx,
            "device": torch.device("cpu")}


def fill_back(stub: str, solved: str) -> str:
    """Put each region's solution code back in place of its stub line."""
    for region in reversed(regions.find_regions(solved)):
        head, sep, tail = stub.rpartition(region.stub())
        assert sep, region.stub()
        stub = head + regions.solution_code(solved, region) + tail
    return stub


def new_objects(source: str, ns: dict) -> dict:
    """Exec ``source`` in a copy of ``ns``; return only what it defined."""
    local = dict(ns)
    exec(compile(source, "<cell>", "exec"), local)  # noqa: S102 - notebook code on purpose
    return {k: v for k, v in local.items() if k not in ns or ns[k] is not v}


# ----------------------------------------------------------------------------------------
# (1) the committed exercise notebooks are what the generator writes today


def test_exercise_notebooks_are_up_to_date():
    problems, edits = mx.staleness(ROOT)
    assert not problems, ("\n".join(problems) + "\nrun `make exercises` and commit "
                          "notebooks/exercises/ and docs/teaching.md")
    if edits:  # a learner's local edits: not the repository's fault, and never lost
        pytest.skip("\n".join(edits) + f"\nthese generated copies were edited here; "
                    f"`make exercises` keeps them in {layout.WORK_DIR}/{layout.RESCUE_DIR}/ and "
                    f"regenerates them (work in {layout.WORK_DIR}/)")


# ----------------------------------------------------------------------------------------
# (2) the generator on a synthetic notebook

SOLVED_CELL = '''\
class Box(nn.Module):
    def forward(self, x):
        """Double x."""
        ### BEGIN SOLUTION
        ### HINT: multiply by two
        y = x * 2
        return y
        ### END SOLUTION


def helper(x):
    if x:
        ### BEGIN SOLUTION
        return 1
        ### END SOLUTION
    return 0
### BEGIN HIDDEN TESTS
assert helper(1) == 1
### END HIDDEN TESTS'''


def synthetic_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.7"}
    nb.cells = [nbformat.v4.new_markdown_cell("# 09 Synthetic\n\nA title cell."),
                nbformat.v4.new_code_cell(SOLVED_CELL),
                nbformat.v4.new_code_cell("### BEGIN HIDDEN TESTS\nassert True\n"
                                          "### END HIDDEN TESTS"),
                nbformat.v4.new_code_cell("print(helper(1))")]
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
        if cell.cell_type == "code":
            cell.execution_count = i
            cell.outputs = [nbformat.v4.new_output("stream", text="1\n")]
            cell.metadata["execution"] = {"iopub.status.busy": "2025-01-01T00:00:00"}
    return nb


def test_regions_are_replaced_at_their_indentation():
    ex = exercise_copy.make_exercise(synthetic_notebook(), "09_synthetic.ipynb")
    assert ex.cells[0].cell_type == "markdown" and "Exercise version" in ex.cells[0].source
    assert ex.cells[1].source.startswith("# 09 Synthetic")
    # the solved notebook's full language_info: JupyterLab then opens the copy unmodified
    assert ex.metadata["language_info"] == {"name": "python", "version": "3.11.7"}
    assert ex.metadata["kernelspec"]["name"] == "python3"
    assert len(ex.cells) == 4  # note + title + stubbed cell + print cell; hidden-only dropped
    stub = ex.cells[2].source
    assert '        raise NotImplementedError("multiply by two")' in stub.split("\n")
    assert f'        raise NotImplementedError("{markup.DEFAULT_HINT}")' in stub.split("\n")
    assert "y = x * 2" not in stub and "return 1" not in stub and "HIDDEN" not in stub
    assert '"""Double x."""' in stub and "    return 0" in stub
    for cell in ex.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
            assert "execution" not in cell.metadata
    ns = base_namespace()
    objs = new_objects(stub, ns)
    with pytest.raises(NotImplementedError, match="multiply by two"):
        objs["Box"]()(torch.ones(1))
    assert objs["helper"](0) == 0
    filled = new_objects(fill_back(stub, SOLVED_CELL.split("### BEGIN HIDDEN")[0]), ns)
    assert filled["helper"](1) == 1 and float(filled["Box"]()(torch.ones(1))) == 2.0


def test_generator_cli_writes_checks_and_leaves_solved_alone(tmp_path, capsys):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    solved = nbdir / "09_synthetic.ipynb"
    nbformat.write(synthetic_notebook(), solved)
    no_regions = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 08")])
    nbformat.write(no_regions, nbdir / "08_plain.ipynb")
    before = solved.read_bytes()
    root = ["--root", str(tmp_path)]
    assert mx.main(root + ["--check"]) == 1  # missing
    assert mx.main(root) == 0
    out = nbdir / "exercises" / "09_synthetic.ipynb"
    first = out.read_bytes()
    assert mx.main(root + ["--check"]) == 0
    assert mx.main(root) == 0 and out.read_bytes() == first  # deterministic
    assert solved.read_bytes() == before
    assert (nbdir / "exercises" / "08_plain.ipynb").exists()  # every notebook gets a copy
    out.write_text(out.read_text().replace("multiply by two", "edited"))
    assert mx.main(root + ["--check"]) == 1  # edited by hand
    assert "edited by hand: notebooks/exercises/09_synthetic.ipynb" in capsys.readouterr().out
    mx.main(root)
    rescued = list((tmp_path / layout.WORK_DIR / layout.RESCUE_DIR).glob("09_synthetic-*.ipynb"))
    assert len(rescued) == 1 and "edited" in rescued[0].read_text()  # kept, not lost
    assert out.read_bytes() == first
    stale = json.loads(out.read_text())
    stale["cells"][1]["source"] = "# an older generator's copy"
    stale["metadata"][markup.LAB_KEY]["fingerprint"] = exercise_copy.fingerprint(
        nbformat.from_dict(stale))  # generated, so not someone's work
    out.write_text(json.dumps(stale))
    assert mx.main(root + ["--check"]) == 1
    assert "stale: notebooks/exercises/09_synthetic.ipynb" in capsys.readouterr().out
    mx.main(root)
    assert len(list((tmp_path / layout.WORK_DIR / layout.RESCUE_DIR).glob("*.ipynb"))) == 1
    gone = nbdir / "exercises" / "07_gone.ipynb"
    gone.write_text("{}")
    assert mx.main(root + ["--check"]) == 1  # extra
    mx.main(root)
    assert not gone.exists()
    assert len(list((tmp_path / layout.WORK_DIR / layout.RESCUE_DIR).glob("07_gone-*.ipynb"))) == 1


def test_long_hints_wrap_and_the_note_lists_the_exercises():
    hint = "word " * 60
    region = regions.Region(0, 2, "        ", hint.strip())
    stub = region.stub()
    assert all(len(line) <= markup.WIDTH for line in stub.split("\n")), stub
    with pytest.raises(NotImplementedError) as info:
        exec(compile(textwrap.dedent(stub), "<stub>", "exec"))  # noqa: S102
    assert str(info.value) == hint.strip()
    ex = exercise_copy.make_exercise(synthetic_notebook(), "09_synthetic.ipynb")
    note = ex.cells[0].source
    assert "2 exercises to write" in note
    assert "1. `Box.forward`" in note and "2. `helper`" in note
    assert ex.cells[2].metadata[markup.META_KEY][0]["name"] == "Box.forward"
    for path in sorted((ROOT / "notebooks" / layout.EXERCISE_DIR).glob(layout.SOLVED_GLOB)):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            too_long = [line for line in cell.source.split("\n")
                        if "NotImplementedError" in line and len(line) > markup.WIDTH]
            assert not too_long, (path.name, too_long)


def test_unbalanced_markers_are_an_error(tmp_path, capsys):
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "def f():\n    ### BEGIN SOLUTION\n    return 1\n")])
    nbformat.write(nb, tmp_path / "notebooks" / "09_bad.ipynb")
    assert mx.main(["--root", str(tmp_path)]) == 2
    assert "09_bad.ipynb: line 2: BEGIN SOLUTION without END" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------
# (3) a stub is reported by its check; the solution filled back in passes


def _attention_solved_cell() -> str:
    """tx.scaled_dot_product_attention's own body, wrapped as an exercise region."""
    src = textwrap.dedent(inspect.getsource(tx.scaled_dot_product_attention))
    fn = ast.parse(src).body[0]
    lines = src.split("\n")
    body_start = fn.body[1].lineno - 1  # the first statement after the docstring
    head, body = lines[:body_start], lines[body_start:fn.end_lineno]
    hint = "    ### HINT: scale q @ k^T by 1/sqrt(d_k), mask, softmax over the keys, times v"
    return "\n".join(head + ["    ### BEGIN SOLUTION", hint] + body + ["    ### END SOLUTION"])


def test_synthetic_exercise_from_a_real_function():
    solved = _attention_solved_cell()
    stub = regions.stub_source(solved)
    ns = base_namespace()
    stubbed = new_objects(stub, ns)["scaled_dot_product_attention"]
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match="scale q @ k"):
        stubbed(q, q, q)
    result = labkit.check_attention(stubbed, verbose=False)
    assert not result.passed and "not_implemented" in result.mistakes
    assert "scale q @ k^T by 1/sqrt(d_k)" in result.report
    filled = new_objects(fill_back(stub, solved), ns)["scaled_dot_product_attention"]
    result = labkit.check_attention(filled, verbose=False)  # every probe passes: the numbers
    assert result.mistakes == ["delegated"], result.report  # are right, but it is tx's own
    assert "a copy of tx_helpers' scaled_dot_product_attention" in " ".join(result.messages)


def _definitions(cells) -> str:
    """Imports, defs, classes and constant assignments of earlier cells: enough context to exec
    one exercise cell outside Jupyter without running the notebook's experiments."""
    keep = []
    for cell in cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.split("\n")
                           if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            simple = isinstance(node, ast.Assign) and all(
                isinstance(n, (ast.Constant, ast.Name, ast.BinOp, ast.Tuple, ast.operator,
                               ast.expr_context, ast.UnaryOp, ast.unaryop))
                for n in ast.walk(node.value))
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)) \
                    or simple:
                keep.append(ast.unparse(node))
    return "\n".join(keep)


def _exec_quietly(source: str, ns: dict) -> None:
    for stmt in ast.parse(source).body:
        try:
            exec(compile(ast.Module([stmt], []), "<earlier cells>", "exec"), ns)  # noqa: S102
        except Exception:  # noqa: BLE001 - context is best effort
            pass


def real_region_cells():
    """(notebook, cell index) for every solved notebook cell with a solution region."""
    found = []
    for path in sorted((ROOT / "notebooks").glob(layout.SOLVED_GLOB)):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and regions.find_regions(cell.source):
                found.append(pytest.param(path, i, id=f"{path.stem}-cell{i}"))
    return found or [pytest.param(None, None, marks=pytest.mark.skip(
        reason="no solved notebook has a ### BEGIN SOLUTION region yet"))]


@pytest.mark.parametrize("path, index", real_region_cells())
def test_real_exercise_stub_fails_and_solution_passes(path, index):
    nb = nbformat.read(path, as_version=4)
    solved = nb.cells[index].source
    ns = base_namespace()
    _exec_quietly(_definitions(nb.cells[:index]), ns)
    stub = regions.stub_source(regions.strip_hidden_tests(solved))
    try:
        stub_objs = new_objects(stub, ns)
    except NotImplementedError as exc:  # a region at the top level of the cell
        hints = [r.hint for r in regions.find_regions(solved) if r.hint]
        assert not hints or str(exc) in hints
        pytest.skip("the region is top-level code: the cell itself raises the stub")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"the cell needs context the test cannot rebuild: {exc!r}")
    checks = labkit.find_checks(stub_objs)
    if not checks:
        pytest.skip(f"no grading check matches the names defined here: {sorted(stub_objs)}")
    hints = [r.hint or markup.DEFAULT_HINT for r in regions.find_regions(solved)]
    for label, run in checks:
        result = run(verbose=False)
        assert not result.passed and "not_implemented" in result.mistakes, (label, result.report)
        assert any(h in "\n".join(result.messages) for h in hints), (label, result.report)
    filled = fill_back(stub, regions.strip_hidden_tests(solved))
    for label, run in labkit.find_checks(new_objects(filled, ns)):
        result = run(verbose=False)
        assert result.passed, (label, result.report)


# ----------------------------------------------------------------------------------------
# labkit/course/grade.py: execute a learner's notebook and collect the check results into a CSV


def test_grade_script_without_exercise_metadata_grades_every_definition(tmp_path):
    import csv

    from labkit.course import grade

    cells = [
        nbformat.v4.new_markdown_cell("# A learner's notebook"),
        nbformat.v4.new_code_cell("import math\nimport torch\nfrom torch import nn\n"
                                  "import labkit\nimport tx_helpers as tx"),
        nbformat.v4.new_code_cell(
            "def attention(q, k, v, mask=None):\n"
            "    w = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  # forgot the scaling\n"
            "    return w @ v"),
        nbformat.v4.new_code_cell("_ = labkit.check_attention(attention)"),
        nbformat.v4.new_code_cell("raise NotImplementedError('an unfinished cell')"),
        nbformat.v4.new_code_cell("class FeedForward(tx.FeedForward):\n    pass"),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "alice_03.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "grades.csv"
    assert grade.main([str(path), "--out", str(out), "--timeout", "60"]) == 0
    assert grade.main([str(path), "--out", str(out), "--timeout", "60", "--strict"]) == 1
    rows = list(csv.DictReader(out.open()))
    by = {r["check"]: r for r in rows}
    assert len(by) == len(rows) == 4  # cells, attention, feed-forward, total: no check twice
    assert by["total"]["max_points"] == "2"  # the per-student total of the automatic marks
    assert by["cells"]["mistakes"] == "1 cell(s) raised"
    assert by["check_attention(attention)"]["passed"] == "False"
    assert "no_scaling" in by["check_attention(attention)"]["mistakes"]
    assert "not scaled" in by["check_attention(attention)"]["diagnosis"]
    assert by["check_feed_forward(FeedForward)"]["passed"] == "True"
    summary = (tmp_path / "grades_summary.txt").read_text()
    # the subclassed FeedForward passes its check but is delegated: not counted as passed
    assert summary.startswith("alice_03.ipynb: 0/2 code checks passed (1 cell(s) raised)")


def test_grade_script_full_partial_and_zero_marks(tmp_path):
    """A correct, a wrong and an untouched copy of a real exercise notebook."""
    import csv

    from labkit.course import grade

    name = "04_feed_forward_and_sublayers.ipynb"
    solved = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    exercise = nbformat.read(ROOT / "notebooks" / layout.EXERCISE_DIR / name, as_version=4)
    solutions = {c.id: c.source for c in solved.cells}
    correct = nbformat.from_dict(json.loads(json.dumps(exercise)))
    for cell in correct.cells:
        if cell.get("metadata", {}).get(markup.META_KEY):
            cell.source = fill_back(cell.source, regions.strip_hidden_tests(solutions[cell.id]))
    wrong = nbformat.from_dict(json.loads(json.dumps(correct)))
    for cell in wrong.cells:  # the encoder layer forgets the attention sublayer's residual
        cell.source = cell.source.replace("self.norm1(x + self.dropout1(", "self.norm1((")
    paths = []
    for who, nb in (("correct", correct), ("wrong", wrong), ("untouched", exercise)):
        paths.append(tmp_path / f"{who}_{name}")
        nbformat.write(nb, paths[-1])
    out = tmp_path / "grades.csv"
    assert grade.main([str(p) for p in paths] + ["--out", str(out), "--strict"]) == 1
    rows = [r for r in csv.DictReader(out.open())
            if r["check"] not in grade.NOT_MARKS + ("prediction",)]
    marks = {}
    for r in rows:
        got, total = marks.get(r["notebook"], (0, 0))
        marks[r["notebook"]] = (got + (r["passed"] == "True"), total + 1)
    # three exercises: FeedForward, EncoderLayer and the Pre-LN extension
    assert marks == {f"correct_{name}": (3, 3), f"wrong_{name}": (2, 3),
                     f"untouched_{name}": (0, 3)}, rows
    # the untouched stubs earn nothing, though the given __init__ passes probes before forward
    untouched = [r for r in rows if r["notebook"] == f"untouched_{name}"]
    assert sum(float(r["points"]) for r in untouched) == 0, untouched
    wrong_rows = [r for r in rows if r["notebook"] == f"wrong_{name}" and r["passed"] == "False"]
    assert wrong_rows[0]["exercise"] == "2. EncoderLayer.forward"
    assert "missing_residual" in wrong_rows[0]["mistakes"]
    assert all(r["exercise"] != "-" for r in rows)
    summary = (tmp_path / "grades_summary.txt").read_text().split("\n")
    head = next(line for line in summary if line.startswith(f"correct_{name}: "))
    # code checks and predictions counted apart (the untouched predictions are not right)
    assert head.startswith(f"correct_{name}: 3/3 code checks passed, ") and head.endswith(
        " predictions right (no cell raised)"), head


@pytest.mark.slow  # the full grade CLI; test_grade_script_full_partial_and_zero_marks stays fast
def test_grade_counts_every_declared_exercise_and_lists_written_answers(tmp_path):
    """05's look-ahead exercise answered by an assignment (no def) stays in the maximum; the
    written questions come with the learner's text for marking by hand; one total per student."""
    import csv

    from labkit.course import grade

    name = "05_masks.ipynb"
    solved = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    exercise = nbformat.read(ROOT / "notebooks" / layout.EXERCISE_DIR / name, as_version=4)
    solutions = {c.id: c.source for c in solved.cells}
    nb = nbformat.from_dict(json.loads(json.dumps(exercise)))
    for cell in nb.cells:
        items = cell.get("metadata", {}).get(markup.META_KEY)
        if items and items[0]["name"] == "lookahead_mask":
            cell.source = "import tx_helpers.masks as M\nlookahead_mask = M.lookahead_mask"
        elif items:
            cell.source = fill_back(cell.source, regions.strip_hidden_tests(solutions[cell.id]))
    answers = [i + 1 for i, c in enumerate(nb.cells) if c.source.startswith("**Write.**")]
    nb.cells[answers[0]].source = "**Your answer:** it broadcasts over the queries."
    path = tmp_path / "bob_05.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "grades.csv"
    grade.main([str(path), "--out", str(out), "--jobs", "1"])
    rows = list(csv.DictReader(out.open()))
    declared = nb.metadata["tx_lab"]
    code = [r for r in rows if r["check"] not in grade.NOT_MARKS + ("prediction",)]
    assert sum(float(r["max_points"]) for r in code) == len(declared["exercises"]) == 4
    assert any("2. lookahead_mask" in r["exercise"] for r in code), code
    total = next(r for r in rows if r["check"] == "total")
    assert float(total["max_points"]) == 4 + 0.5 * len(declared["predictions"])
    written = [r for r in rows if r["check"] == "written"]
    assert len(written) == len(answers) >= 2
    assert written[0]["diagnosis"] == "it broadcasts over the queries."
    assert written[1]["diagnosis"] == "(no answer)" and written[1]["exercise"].startswith("Why")
    summary = (tmp_path / "grades_summary.txt").read_text()
    assert "to mark by hand: Why" in summary
    assert "answer: it broadcasts over the queries." in summary
