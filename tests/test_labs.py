"""The labs as a teacher hands them out (issue 22): stub messages that state the contract only,
exercise copies without answers, graded predictions in every notebook, a teaching table that
cannot drift, a handout without solutions, a learner's work that no command overwrites, and
the small frictions of JupyterLab."""
import ast
import json
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
import labkit  # noqa: E402
from labkit.course import (  # noqa: E402
    contract,
    exercise_copy,
    labinfo,
    layout,
    markup,
    regions,
    scoring,
    teaching_table,
)
from labkit.course import exercises as mx  # noqa: E402
from labkit.course import handout as make_handout  # noqa: E402
from labkit.course import keys as make_keys  # noqa: E402

SOLVED = layout.solved_notebooks(ROOT)
NUMBERS = [f"{n:02d}" for n in range(14)]


def _read(path):
    return nbformat.read(path, as_version=4)


def _regions():
    """(notebook, cell index, region) for every solution region of the solved notebooks."""
    found = []
    for path in SOLVED:
        nb = _read(path)
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                for region in regions.find_regions(cell.source):
                    owner = regions.region_owner(cell.source, region)
                    found.append(pytest.param(path, index, region,
                                              id=f"{path.stem[:2]}-{owner}"))
    return found


# ----------------------------------------------------------------------------------------
# Item 1: a stub's message states the contract, never the solution's operations


def test_key_operations_are_read_from_the_code():
    cell = '''def attention(q, k, v, mask=None, dropout=None):
    """doc"""
    ### BEGIN SOLUTION
    ### HINT: anything
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    pe[:, 0::2] = weights.T * 10000
    return weights @ v, weights
    ### END SOLUTION'''
    region = regions.find_regions(cell)[0]
    ops = contract.key_operations(cell, region)
    assert {"transpose", "sqrt", "masked_fill", "finfo", "softmax", "@", ".T", "0::2",
            "10000"} <= set(ops), ops
    assert "dropout" not in ops  # a parameter: the contract's own word
    init = ("def __init__(self, d_model, dropout=0.1):\n    ### BEGIN SOLUTION\n"
            "    self.dropout = nn.Dropout(dropout)\n    self.w_o = nn.Linear(d_model, d_model)\n"
            "    ### END SOLUTION")
    assert set(contract.key_operations(init, regions.find_regions(init)[0])) == {"Linear"}
    assert "size" not in ops  # a size accessor, not an operation
    leaks = contract.leaked_operations("scores = q @ k.transpose(-2, -1); Softmax over keys", ops)
    assert set(leaks) == {"@", "transpose", "softmax"}
    message = ("q (..., L_q, d_k), k (..., L_k, d_k), v (..., L_k, d_v), mask bool "
                "broadcastable to (..., L_q, L_k), True = masked -> (output (..., L_q, d_v), "
                "weights (..., L_q, L_k)); the weights of each query sum to 1")
    assert contract.leaked_operations(message, ops) == []


def test_the_function_name_and_locals_are_contract_words():
    cell = '''def my_train_step(model, batch, optimizer, criterion, scheduler=None):
    ### BEGIN SOLUTION
    loss = criterion(model(batch[0]), batch[1])
    for layer in model.layers:
        layer(loss)
    loss.backward()
    optimizer.step()
    ### END SOLUTION'''
    ops = contract.key_operations(cell, regions.find_regions(cell)[0])
    assert set(ops) == {"backward"}, ops  # step: a word of the name; criterion, layer: names
    assert contract.leaked_operations("one training step: returns the loss", ops) == []
    assert contract.leaked_operations("zero the grads, Backward, then step", ops) == ["backward"]


@pytest.mark.parametrize("path, index, region", _regions())
def test_stub_message_does_not_name_the_solution_operations(path, index, region):
    """Fails on a message that gives the solution away (issue 22, item 1)."""
    source = _read(path).cells[index].source
    ops = contract.key_operations(source, region)
    leaks = contract.leaked_operations(region.hint or "", ops)
    assert not leaks, (
        f"{path.name}, {regions.region_owner(source, region)}: the stub message names the "
        f"solution's operations {leaks}. State the contract (inputs, outputs, shapes) and put "
        f"the operations in the folded hints below the exercise.\nmessage: {region.hint!r}")


# ----------------------------------------------------------------------------------------
# Item 3: exercise copies keep the questions and drop every answer; a key keeps them


@pytest.fixture(scope="module")
def copies() -> dict:
    """Exercise path -> text, generated now from the solved notebooks (what make exercises
    writes; tests/test_exercises.py checks that the committed copies are these)."""
    return exercise_copy.expected_exercises(ROOT)


def _statements(tree) -> list[str]:
    """Every statement in a tree, nested ones included, as normalised code."""
    return [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.stmt)]


def _region_statements(source: str, region) -> list[str]:
    tree, _ = contract._region_tree(source, region)
    return [ast.unparse(n) for n in tree.body] if tree else []


def solution_leaks(solved, exercise) -> list[str]:
    """Solution regions of ``solved`` whose code sits in a code cell of ``exercise``: every one
    of its statements verbatim in one cell (a stub left filled, or a demonstration repeating it).
    A "find the bug" lab shows the buggy code, all of the solution but the fixed line: allowed."""
    cells = []
    for cell in exercise.cells:
        if cell.cell_type == "code" and (tree := regions.parse_cell(cell.source)) is not None:
            cells.append(set(_statements(tree)))
    leaks = []
    for cell in solved.cells:
        if cell.cell_type != "code":
            continue
        for region in regions.find_regions(cell.source):
            wanted = [s for s in _region_statements(cell.source, region) if len(s) >= 12]
            if not wanted or (len(wanted) == 1 and len(wanted[0]) < 30):
                continue  # `return x`: too short to tell a leak from a coincidence
            for seen in cells:
                hits = sum(s in seen for s in wanted)
                if hits == len(wanted):  # all of it: a bug-fix lab shows all but the bug
                    leaks.append(f"{regions.region_owner(cell.source, region)} "
                                 f"({hits}/{len(wanted)} statements)")
                    break
    return leaks


def answers_in(exercise) -> list[str]:
    """Everything in an exercise copy that gives an answer away."""
    found = []
    for i, cell in enumerate(exercise.cells):
        if markup.is_teacher_only(cell):
            found.append(f"cell {i}: tagged {markup.ANSWER_TAG!r}")
        if cell.cell_type == "markdown":
            for a, b, kind in markup.answer_blocks(cell.source):
                found.append(f"cell {i}: answer ({kind}) {cell.source[a:b][:60]!r}")
        if cell.cell_type == "code":
            if cell.get("outputs"):
                found.append(f"cell {i}: stored output")
            for line in cell.source.split("\n"):
                if markup.PREDICTION_MARK in line:
                    found.append(f"cell {i}: filled prediction {line.strip()!r}")
                elif "# your prediction" in line and not re.match(
                        r"^\s*[A-Za-z_]\w*\s*=\s*\.\.\.\s+# your prediction\s*$", line):
                    found.append(f"cell {i}: prediction not blank {line.strip()!r}")
    return found


def test_the_answer_detector_sees_each_kind_of_answer():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Q?\n<details><summary><b>Answer</b></summary>42</details>"),
        nbformat.v4.new_markdown_cell("Box <!-- answer -->the bug was here<!-- /answer -->"),
        nbformat.v4.new_code_cell("x = 3  ### PREDICTION"),
        nbformat.v4.new_code_cell("y = 4  # your prediction"),
        nbformat.v4.new_code_cell("print(1)", metadata={"tags": ["answer"]}),
    ])
    assert len(answers_in(nb)) == 5
    nb.cells[0].source = "Q?\n<details><summary>Hint 1: the idea</summary>look up</details>"
    assert len(answers_in(nb)) == 4  # a hint is not an answer


def test_copies_drop_answers_and_keep_questions_and_hints():
    md = ("**Q1.** Why?\n\n<details><summary>Hint 1: the idea</summary>think</details>\n\n"
          "<details><summary>Answer</summary>\n\nBecause.\n\n"
          "<details><summary>Hint inside</summary>x</details>\n</details>\n\n"
          "Then <!-- answer -->secret<!-- /answer --> stays hidden.")
    solved = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 07 T"),
        nbformat.v4.new_markdown_cell(md),
        nbformat.v4.new_markdown_cell("<details><summary>Answers</summary>all</details>"),
        nbformat.v4.new_markdown_cell("**Predict.** How many?"),
        nbformat.v4.new_code_cell("n_params = 66_048  ### PREDICTION"),
        nbformat.v4.new_code_cell("_ = labkit.check_prediction('count', n_params, 66048)"),
        nbformat.v4.new_code_cell("print(66048)", metadata={"tags": ["answer"]}),
        nbformat.v4.new_markdown_cell("**Write.** Where is the bug?\n\n"
                                      "<details><summary>Answer</summary>line 3</details>"),
    ])
    for i, cell in enumerate(solved.cells):
        cell.id = f"c{i}"
    ex = exercise_copy.make_exercise(solved, "07_t.ipynb")
    text = "\n".join(c.source for c in ex.cells)
    assert "**Q1.** Why?" in text and "Hint 1: the idea" in text and "Then  stays hidden." in text
    for gone in ("Because.", "Hint inside", "secret", "all", "66_048", "print(66048)", "line 3"):
        assert gone not in text, gone
    assert "n_params = ...  # your prediction" in text
    assert answers_in(ex) == []
    assert ex.cells[-1].source == markup.YOUR_ANSWER and "**Write.**" in ex.cells[-2].source
    meta = ex.metadata[markup.LAB_KEY]
    assert [p["name"] for p in meta["predictions"]] == ["n_params"] and len(meta["written"]) == 1
    assert "1 prediction:" in ex.cells[0].source and "1 written question" in ex.cells[0].source
    grader = next(c for c in ex.cells if "check_prediction" in c.source)
    assert grader.metadata["jupyter"] == {"source_hidden": True}
    assert markup.PREDICTION_FLOW in next(c.source for c in ex.cells
                                      if c.cell_type == "code" and "# your prediction" in c.source)


def test_answer_space_tag_puts_an_ungraded_answer_cell_before_the_proof():
    solved = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 11 T"),
        nbformat.v4.new_markdown_cell("## Q1. Why?", metadata={"tags": ["answer-space"]}),
        nbformat.v4.new_markdown_cell("<details><summary>Answer</summary>Because.</details>"),
        nbformat.v4.new_code_cell("print('proof')"),
        nbformat.v4.new_markdown_cell("## Q2. And?"),
        nbformat.v4.new_code_cell("print('proof 2')"),
    ])
    for i, cell in enumerate(solved.cells):
        cell.id = f"c{i}"
    ex = exercise_copy.make_exercise(solved, "11_t.ipynb")
    sources = [c.source for c in ex.cells[1:]]  # after the copy's note
    assert sources == ["# 11 T", "## Q1. Why?", markup.YOUR_ANSWER, "print('proof')", "## Q2. And?",
                       "print('proof 2')"]
    assert ex.metadata[markup.LAB_KEY]["written"] == []  # an answer space is not graded


def test_unbalanced_answer_markers_are_an_error():
    for bad in ("<!-- answer --> open", "close <!-- /answer -->", "<details><summary>Answer"):
        with pytest.raises(markup.RegionError):
            markup.strip_answers(bad)


@pytest.mark.parametrize("path", SOLVED, ids=[p.stem[:2] for p in SOLVED])
def test_exercise_copy_holds_no_answer(path, copies):
    """No Answer block, no teacher-only cell, no filled prediction, no solution code."""
    exercise = nbformat.reads(copies[ROOT / "notebooks" / layout.EXERCISE_DIR / path.name],
                              as_version=4)
    found = answers_in(exercise)
    found += [f"solution code of {leak}" for leak in solution_leaks(_read(path), exercise)]
    assert not found, f"{path.name}: the exercise copy gives answers away:\n" + "\n".join(found)


@pytest.mark.parametrize("path", SOLVED, ids=[p.stem[:2] for p in SOLVED])
def test_prediction_grading_cells_are_collapsed_in_the_copy(path, copies):
    """A check_prediction cell names the answer (and the usual wrong ones): in the exercise
    copy its code is collapsed, and the prediction cell and the top note say to run it unopened."""
    exercise = nbformat.reads(copies[ROOT / "notebooks" / layout.EXERCISE_DIR / path.name],
                              as_version=4)
    graders = [i for i, c in enumerate(exercise.cells)
               if c.cell_type == "code" and labinfo.is_prediction_grader(c.source)]
    shown = [i for i in graders
             if not c_hidden(exercise.cells[i])]
    assert not shown, f"{path.name}: check_prediction cells not collapsed: {shown}"
    predicting = [c for c in exercise.cells
                  if c.cell_type == "code" and "# your prediction" in c.source]
    assert all(markup.PREDICTION_FLOW in c.source for c in predicting)
    if predicting:
        assert "collapsed on purpose" in exercise.cells[0].source
    solved = _read(path)  # the solved notebook shows every cell
    assert not any(c_hidden(c) for c in solved.cells)


def c_hidden(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def test_solution_leak_detector_finds_a_repeated_demonstration():
    solved_cell = ("class MyEncoder:\n    def forward(self, src, mask=None):\n"
                   "        ### BEGIN SOLUTION\n"
                   "        x = self.embedding(src) * math.sqrt(self.d_model)\n"
                   "        x = self.pos_encoding(x)\n"
                   "        for layer in self.layers:\n            x = layer(x, mask)\n"
                   "        return self.norm(x)\n        ### END SOLUTION")
    demo = "\n".join(line for line in solved_cell.replace("MyEncoder", "ArticleEncoder")
                     .split("\n") if "###" not in line)
    solved = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(demo),
                                             nbformat.v4.new_code_cell(solved_cell)])
    ex = exercise_copy.make_exercise(solved, "06_x.ipynb")
    assert solution_leaks(solved, ex) == ["MyEncoder.forward (4/4 statements)"]
    solved.cells = solved.cells[1:]
    assert solution_leaks(solved, exercise_copy.make_exercise(solved, "06_x.ipynb")) == []


@pytest.mark.parametrize("path", SOLVED, ids=[p.stem[:2] for p in SOLVED])
def test_teacher_key_holds_what_the_copy_drops(path):
    """Solutions, every answer, each prediction's expected value and named wrong answers, and
    the mistakes (with the learner's hint) of every check the lab calls."""
    key = make_keys.key_markdown(path, ROOT)
    nb = _read(path)
    info = labinfo.lab_info(nb)
    missing = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            for region in regions.find_regions(cell.source):
                code = textwrap.dedent(regions.solution_code(cell.source, region)).strip()
                if code not in key:
                    missing.append(f"solution of {regions.region_owner(cell.source, region)}")
        elif cell.cell_type == "markdown":
            for a, b, kind in markup.answer_blocks(cell.source):
                body = make_keys._answer_body(cell.source[a:b], kind)
                if body not in key:
                    missing.append(f"answer {body[:50]!r}")
    for p in info["predictions"]:
        if f"`{p['name']} = {p['value']}`" not in key:
            missing.append(f"prediction {p['name']}")
        missing += [f"wrong answer {w}" for w, _ in p["mistakes"] if f"`{w}`" not in key]
    for check in {c["check"] for c in info["checks"]}:
        for mistake in make_keys.mistakes_of(check):
            text, hint = labkit.MISTAKES[mistake]
            if f"`{mistake}`: {text}" not in key or hint not in key:
                missing.append(f"{check}: {mistake}")
    assert not missing, f"{path.name}: the teacher key lacks {missing}"
    assert "do not hand this out" in key


@pytest.mark.parametrize("path", SOLVED, ids=[p.stem[:2] for p in SOLVED])
def test_teacher_key_lists_each_written_question_with_its_model_answer_and_rubric(path):
    key = make_keys.key_markdown(path, ROOT)
    nb = _read(path)
    settings = scoring.lab_settings(scoring.load_labs(ROOT), path.name[:2])
    for w in labinfo.lab_info(nb)["written"]:
        source = nb.cells[w["cell"]].source
        head = f"### W{w['number']} (section *{w['section']}*, {settings['points']['written']:g}"
        assert head in key, (path.name, head)
        part = key.split(head, 1)[1].split("\n### ", 1)[0]
        assert w["question"].split("\n")[0] in part
        bodies = [make_keys._answer_body(source[a:b], k) for a, b, k in
                  markup.answer_blocks(source)]
        assert bodies and all(b in part for b in bodies), (path.name, w["number"])
        assert "Rubric (" in part, (path.name, w["number"])  # its own, or labs.toml's
        assert "**Mismatch:**" not in part, part[-300:]


def test_a_written_questions_own_rubric_replaces_the_generic_one(tmp_path):
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "**Write.** Why?\n\n<details><summary>Answer</summary>\n\nBecause.\n\n"
        "**Rubric (2 points).** 2: both; 1: one; 0: neither.\n</details>")])
    path = tmp_path / "notebooks" / "99_x.ipynb"
    nbformat.write(nb, path)
    key = make_keys.key_markdown(path, tmp_path)
    assert "Model answer and rubric:" in key and "**Rubric (2 points).** 2: both" in key
    assert "notebooks/labs.toml):" not in key  # no second, generic rubric


def test_each_check_lists_its_own_mistakes():
    assert "no_scaling" in make_keys.mistakes_of("check_attention")
    assert {"heads_view_without_transpose", "no_scaling"} <= set(
        make_keys.mistakes_of("check_multi_head_attention"))  # it reuses attention's variants
    assert "ls_kl_divergence" in make_keys.mistakes_of("check_label_smoothing")
    assert "not_implemented" in make_keys.shared_mistakes()
    assert "not_implemented" not in make_keys.mistakes_of("check_masks")
    assert make_keys.mistakes_of("check_that_does_not_exist") == []


def test_keys_are_written_outside_the_handout(tmp_path):
    assert make_keys.main(["--out", str(tmp_path / "keys")]) == 0
    names = sorted(p.name for p in (tmp_path / "keys").glob("*.md"))
    assert names == sorted([f"{p.stem}.md" for p in SOLVED] + ["README.md"])
    assert make_keys.KEYS_DIR.as_posix() + "/" in (ROOT / ".gitignore").read_text() \
        or "teacher/" in (ROOT / ".gitignore").read_text()


# ----------------------------------------------------------------------------------------
# Item 4: at least three graded predictions per notebook; every notebook has a copy

MIN_PREDICTIONS = 3


def _printed(cell) -> str:
    return make_keys._text_outputs(cell)


def _revealed(check_cell, label: str) -> str | None:
    """The value a check_prediction cell revealed for ``label`` ("...; it is X")."""
    for line in _printed(check_cell).split("\n"):
        if f"{label}:" in line:
            m = re.search(r"it is (.+?)(?: \(within [^)]*\))?\s*$", line)
            if m:
                return m.group(1)
    return None


def prediction_problems(nb) -> list[str]:
    """The rules of a graded prediction (docs/CONVENTIONS.md), as problems found."""
    info = labinfo.lab_info(nb)
    problems = [f"`{name}` ({markup.PREDICTION_MARK}) is never passed to "
                "labkit.check_prediction" for name in info["ungraded_predictions"]]
    for p in info["predictions"]:
        at, asked = p["cell"], p["question_cell"]
        cell = nb.cells[at]
        if asked is None:
            problems.append(f"`{p['name']}` (cell {at}): no markdown question before it")
            continue
        if not markup.is_prediction_cell(cell.source):
            problems.append(f"`{p['name']}` (cell {at}): a prediction cell holds only "
                            f"`name = value  {markup.PREDICTION_MARK}` lines and comments")
        if cell.get("outputs"):
            problems.append(f"`{p['name']}` (cell {at}): the prediction cell prints something")
        value = _revealed(nb.cells[p["check_cell"]], p["label"] or p["name"])
        if not value or len(value) < 2:
            continue
        pattern = rf"(?<![\w.]){re.escape(value)}(?![\w.])"
        for j in range(asked + 1, at):  # between the question and the answer cell
            if nb.cells[j].cell_type == "code" and re.search(pattern, _printed(nb.cells[j])):
                problems.append(f"`{p['name']}` (cell {at}): the answer {value} is printed by "
                                f"cell {j}, between the question and the prediction cell")
    return problems


def test_prediction_rules_on_a_synthetic_notebook():
    cells = [nbformat.v4.new_markdown_cell("**Predict.** The shape?"),
             nbformat.v4.new_code_cell("x = 1", outputs=[nbformat.v4.new_output(
                 "stream", text="shape (2, 5, 16)\n")]),
             nbformat.v4.new_code_cell("shape = (2, 5, 16)  ### PREDICTION"),
             nbformat.v4.new_code_cell(
                 "_ = labkit.check_prediction('output shape', shape, (2, 5, 16))",
                 outputs=[nbformat.v4.new_output("stream", text=(
                     "check_prediction: passed (1/1 probes)\n  ✓ output shape: you predicted "
                     "(2, 5, 16); it is (2, 5, 16)\n"))]),
             nbformat.v4.new_code_cell("n = 3  ### PREDICTION")]
    nb = nbformat.v4.new_notebook(cells=cells)
    problems = prediction_problems(nb)
    assert len(problems) == 2, problems
    assert "`n` (### PREDICTION) is never passed" in problems[0]
    assert "printed by cell 1, between the question" in problems[1]
    cells[1].outputs = [nbformat.v4.new_output("stream", text="shape (2, 5, 160)\n")]
    assert len(prediction_problems(nb)) == 1  # (2, 5, 160) does not give (2, 5, 16) away
    quiz = ("rows = [('1. output', shape, (2, 5, 16), {(5, 2, 16): 'swapped'})]\n"
            "for q, p, want, m in rows:\n"
            "    _ = labkit.check_prediction(q, p, want, mistakes=m)")
    cells[3].source = quiz  # graded in a loop, as 11's shape quiz does
    info = labinfo.lab_info(nb)
    assert [(p["name"], p["label"], p["mistakes"]) for p in info["predictions"]] == [
        ("shape", "1. output", [["(5, 2, 16)", "swapped"]])]


@pytest.mark.parametrize("number", NUMBERS)
def test_every_notebook_has_three_graded_predictions(number):
    """Fails until the notebook branches add the predictions (issue 22, item 4)."""
    paths = [p for p in SOLVED if p.name.startswith(number + "_")]
    assert len(paths) == 1, f"no solved notebook {number}_*.ipynb"
    nb = _read(paths[0])
    info = labinfo.lab_info(nb)
    problems = prediction_problems(nb)
    assert len(info["predictions"]) >= MIN_PREDICTIONS and not problems, (
        f"{paths[0].name}: {len(info['predictions'])} graded prediction(s), at least "
        f"{MIN_PREDICTIONS} wanted (a '**Predict.**' markdown cell, then a cell with "
        f"`name = value  {markup.PREDICTION_MARK}`, then a labkit.check_prediction call that "
        "takes `name`)" + "".join(f"\n- {p}" for p in problems))


def test_every_notebook_has_an_exercise_copy(copies):
    names = sorted(p.name[:2] for p in copies)
    assert names == NUMBERS, names
    for path, text in copies.items():
        nb = nbformat.reads(text, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert markup.PREDICTION_MARK not in cell.source, path.name


# ----------------------------------------------------------------------------------------
# Item 6: the teaching table cannot drift; the handout holds no solved notebook

def test_teaching_table_matches_the_exercise_metadata(copies):
    want = teaching_table.teaching_text(ROOT, copies)
    have = (ROOT / layout.TEACHING).read_text(encoding="utf-8")
    assert want == have, ("docs/teaching.md's lab table differs from the exercise metadata and "
                          "notebooks/labs.toml: run `make exercises`")


def test_lab_table_lists_points_rubric_and_estimates(copies):
    table = teaching_table.lab_table(ROOT, copies)
    labs = scoring.load_labs(ROOT)
    for number in NUMBERS:
        settings = scoring.lab_settings(labs, number)
        assert settings["minutes"], f"notebooks/labs.toml: lab {number} has no study_minutes"
        assert f"notebooks/{number}_" in table
    assert "estimates" in table and "not measurements" in table
    for path, text in copies.items():
        meta = nbformat.reads(text, as_version=4).metadata[markup.LAB_KEY]
        row = next(line for line in table.split("\n") if f"(../notebooks/{path.name})" in line)
        for check in meta["checks"]:
            assert f"`{check['check']}`" in row, check
        for e in meta["exercises"]:
            assert f"`{e['name'].split('.')[-1]}`" in row, e
        points = scoring.lab_points(meta, scoring.lab_settings(labs, path.name[:2]))
        assert f"| {points['total']:g} |" in row
        if meta["written"]:
            assert f"**{path.stem}**" in table  # its rubric line


def test_points_add_up_on_a_synthetic_lab():
    labs = {"points": dict(scoring.DEFAULT_POINTS), "rubric": {"written": "r"},
            "lab": {"03": {"points": {"prediction": 2}, "study_minutes": 50}}}
    settings = scoring.lab_settings(labs, "03")
    meta = {"exercises": [{"name": "MHA.split"}, {"name": "MHA.merge"}, {"name": "f"}],
            "predictions": [{}, {}, {}], "written": [{}]}
    assert scoring.lab_points(meta, settings) == {"exercises": 3, "predictions": 6, "written": 2,
                                             "total": 11}
    assert settings["minutes"] == 50 and settings["rubric"] == "r"
    exercises = [{"name": "MHA.split", "checks": ["check_mha"]},
                 {"name": "MHA.merge", "checks": ["check_mha"]}, {"name": "f", "checks": []}]
    assert scoring.graded_objects(exercises) == [("MHA", ["split", "merge"], ["check_mha"]),
                                            ("f", [], [])]


def test_check_table_lists_every_check_a_lab_calls(copies):
    doc = (ROOT / layout.TEACHING).read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(check_\w+)\(", doc, re.MULTILINE))
    used = {c["check"] for text in copies.values()
            for c in nbformat.reads(text, as_version=4).metadata[markup.LAB_KEY]["checks"]}
    used.add("check_prediction")
    assert used <= rows, f"docs/teaching.md's check table lacks {sorted(used - rows)}"
    assert "have no exercise notebook of their own" not in doc  # the stale sentence is gone


def test_labs_toml_rejects_nothing_silently():
    labs = scoring.load_labs(ROOT)
    assert set(labs["points"]) == set(scoring.DEFAULT_POINTS)
    assert set(labs["lab"]) == set(NUMBERS), sorted(labs["lab"])
    assert labs["rubric"].get("written")


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    return make_handout.build(tmp_path_factory.mktemp("dist"), ROOT)


def test_handout_holds_no_solved_notebook_and_no_key(handout):
    folder, archive = handout
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    with zipfile.ZipFile(archive) as zf:
        assert sorted(n.split("/", 1)[1] for n in zf.namelist()) == files
    notebooks = [f for f in files if f.endswith(".ipynb")]
    assert notebooks == [f"notebooks/{p.name}" for p in SOLVED], notebooks
    solved_texts = {p.read_text(encoding="utf-8") for p in SOLVED}
    for rel in notebooks:
        text = (folder / rel).read_text(encoding="utf-8")
        assert text not in solved_texts, rel
        assert "### BEGIN SOLUTION" not in text and "### HINT:" not in text, rel
        nb = nbformat.reads(text, as_version=4)
        assert nb.metadata[markup.LAB_KEY]["solved"] == Path(rel).name
        assert not exercise_copy.is_hand_edited(nb)  # exactly what the generator wrote
        assert answers_in(nb) == [], rel
    for f in files:
        assert not f.startswith(("teacher/", "tests/", "notebooks/exercises/")), f
        assert "teacher key" not in (folder / f).read_bytes().decode("utf-8", "ignore").lower() \
            or f.endswith(".py"), f
    assert {"README.md", "pyproject.toml", "requirements.txt", "tx_helpers/__init__.py",
            "labkit/__init__.py", "tx_helpers/models/MANIFEST.json",
            "docs/defects.md", "jupyterlab-overrides.json"} <= set(files)
    assert (folder / "requirements.txt").read_text() == (ROOT / "requirements.txt").read_text()
    tools = [f for f in files if f.startswith(("tools/", "benchmarks/"))]
    assert tools == ["benchmarks/ddp_demo.txt", "tools/train_ddp.py"], tools
    teaching = (ROOT / "docs" / "teaching.md").read_text(encoding="utf-8")
    assert all(f"`{t}`" in teaching for t in tools)  # the doc names what the handout holds
    assert "no tools" not in teaching


def test_handout_package_imports_from_the_handout(handout):
    folder, _ = handout
    done = subprocess.run([sys.executable, "-c", "import tx_helpers, pathlib; "
                           "print(pathlib.Path(tx_helpers.__file__).parent.parent)"],
                          cwd=folder, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == folder


# ----------------------------------------------------------------------------------------
# Item 7: a learner's work is never lost


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "PATH": "/usr/bin:/bin",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(root)})


def _solve(exercise_text: str, solved) -> str:
    """What a learner saves: every stub replaced by its solution, and a cell run."""
    nb = nbformat.reads(exercise_text, as_version=4)
    solutions = {c.id: c.source for c in solved.cells}
    for cell in nb.cells:
        if cell.cell_type == "code" and "NotImplementedError" in cell.source:
            source = solutions[cell.id]
            for region in reversed(regions.find_regions(source)):
                stub = region.stub()
                cell.source = cell.source.replace(stub, regions.solution_code(source, region))
            cell.outputs = [nbformat.v4.new_output("stream", text="my run\n")]
            cell.execution_count = 1
    return nbformat.writes(nb)


def test_a_learners_work_survives_make_exercises_and_make_test(tmp_path):
    """A learner saves solutions in my-work/ (and, against the advice, in notebooks/exercises/),
    then runs make exercises and the staleness check of make test: nothing is lost or fails."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "docs").mkdir()
    name = "05_masks.ipynb"
    for path in SOLVED:
        if path.name[:2] in ("00", "05"):
            (tmp_path / "notebooks" / path.name).write_bytes(path.read_bytes())
    (tmp_path / layout.LABS_TOML).write_bytes((ROOT / layout.LABS_TOML).read_bytes())
    markers = f"{teaching_table.TABLE_BEGIN}\n{teaching_table.TABLE_END}"
    (tmp_path / layout.TEACHING).write_text(f"# T\n\n{markers}\n")
    (tmp_path / ".gitignore").write_text(f"{layout.WORK_DIR}/\n")
    root = ["--root", str(tmp_path)]
    assert mx.main(root) == 0  # make exercises, as the repository ships them
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "project")
    assert mx.main(root + ["--fill", layout.WORK_DIR]) == 0  # make lab, first time
    work = tmp_path / layout.WORK_DIR
    assert sorted(p.name for p in work.glob("*.ipynb")) == ["00_overview.ipynb", name]
    solved = _read(tmp_path / "notebooks" / name)
    mine = _solve((work / name).read_text(), solved)
    assert "raise NotImplementedError(\"" not in mine
    (work / name).write_text(mine)
    (work / "my_notes.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook()))
    generated = tmp_path / "notebooks" / layout.EXERCISE_DIR / name
    also_mine = _solve(generated.read_text(), solved)
    generated.write_text(also_mine)

    problems, edits = mx.staleness(tmp_path)  # what make test asserts
    assert problems == [] and edits == [f"edited by hand: notebooks/exercises/{name}"]
    assert mx.main(root) == 0  # make exercises
    assert (work / name).read_text() == mine  # untouched
    rescued = list((work / layout.RESCUE_DIR).glob("05_masks-*.ipynb"))
    assert len(rescued) == 1 and rescued[0].read_text() == also_mine  # kept, not lost
    assert mx.staleness(tmp_path) == ([], [])
    assert mx.main(root + ["--check"]) == 0

    (work / "00_overview.ipynb").unlink()  # "start this one afresh"
    assert mx.main(root + ["--fill", layout.WORK_DIR]) == 0  # make lab, again
    assert (work / "00_overview.ipynb").exists() and (work / name).read_text() == mine
    assert (work / "my_notes.ipynb").exists()

    solved.cells[0].source += "\n\nA new sentence."  # the project changes; the learner pulls
    nbformat.write(solved, tmp_path / "notebooks" / name)
    assert mx.main(root) == 0 and mx.main(root + ["--fill", layout.WORK_DIR]) == 0
    assert (work / name).read_text() == mine
    assert "A new sentence." in generated.read_text()


def test_learners_folder_is_ignored_and_outside_what_the_tests_collect():
    assert f"{layout.WORK_DIR}/" in (ROOT / ".gitignore").read_text().split("\n")
    makefile = (ROOT / "Makefile").read_text()
    test_recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert layout.WORK_DIR not in test_recipe
    assert not layout.WORK_DIR.startswith(("notebooks", "tests"))
    lab_recipe = re.search(r"^lab:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert "labkit.course.exercises --fill $(WORK)" in lab_recipe
    assert "/lab/tree/$(WORK)" in lab_recipe


# ----------------------------------------------------------------------------------------
# Item 8: copies open unmodified; the note is the notebook's own; no news pop-up


@pytest.mark.parametrize("path", SOLVED, ids=[p.stem[:2] for p in SOLVED])
def test_copy_keeps_metadata_and_its_note_is_its_own(path, copies):
    solved = _read(path)
    ex = nbformat.reads(copies[ROOT / "notebooks" / layout.EXERCISE_DIR / path.name], as_version=4)
    # JupyterLab marks a notebook modified when its stored language_info or kernelspec differ
    # from what the kernel reports; the solved notebooks open clean, so the copies store theirs.
    assert ex.metadata["language_info"] == solved.metadata["language_info"]
    assert ex.metadata["kernelspec"] == solved.metadata["kernelspec"]
    assert (ex.nbformat, ex.nbformat_minor) == (solved.nbformat, solved.nbformat_minor)
    note = ex.cells[0].source
    assert ex.cells[0].id == exercise_copy.NOTE_ID and f"`{path.name}`" in note
    # no list of section titles: JupyterLab's table of contents has them, and a deep dive's
    # title in the note can answer a prediction before its cell (04's BatchNorm deep dive)
    assert "Sections of this notebook" not in note
    info = labinfo.lab_info(solved)
    kept = [i for i in info["proof_cells"] if not markup.is_teacher_only(solved.cells[i])]
    if info["proof_cells"]:  # the note promises proof cells only where the copy keeps some
        assert ("cells under it" in note) == bool(kept), path.name
        assert ("no answers in this copy" in note) == (not kept), path.name
    sections = set(labinfo.section_titles(solved))
    named = set(re.findall(r"\bcheck_\w+", note))
    assert named == {c["check"] for c in info["checks"]}, named  # no other notebook's check
    for e in info["exercises"]:
        assert e["section"].split(" / ")[0] in sections | {"the introduction"}
        assert f"`{e['name']}`, in section *{markup.md_escape(e['section'])}*" in note
    stops = bool(info["exercises"]) and info["run_all_stop"] is not None
    assert ("Run All stops at the first cell that runs a stub" in note) == stops  # from the code
    assert ("Run All runs to the end" in note) == (bool(info["exercises"]) and not stops)
    assert ("prediction" in note) == bool(info["predictions"])
    lines = sum(len(markup.prediction_lines(c.source)) for c in solved.cells
                if c.cell_type == "code")
    if lines:  # the banner counts every prediction line, each graded by a later check
        assert f"**{lines} prediction{'s' if lines != 1 else ''}:**" in note, (path.name, lines)
        assert info["ungraded_predictions"] == [], info["ungraded_predictions"]


def test_note_puts_each_exercise_in_its_own_section():
    cells = [nbformat.v4.new_markdown_cell("# 05 Masks"),
             nbformat.v4.new_markdown_cell("## 1. Padding"),
             nbformat.v4.new_code_cell("def padding_mask(seq, pad_idx):\n    ### BEGIN SOLUTION\n"
                                       "    return seq == pad_idx\n    ### END SOLUTION"),
             nbformat.v4.new_markdown_cell("## 2. Look-ahead"),
             nbformat.v4.new_code_cell("def lookahead_mask(size):\n    ### BEGIN SOLUTION\n"
                                       "    return size\n    ### END SOLUTION"),
             nbformat.v4.new_code_cell("_ = labkit.check_masks(padding_mask, lookahead_mask)")]
    ex = exercise_copy.make_exercise(nbformat.v4.new_notebook(cells=cells), "05_masks.ipynb")
    note = ex.cells[0].source
    assert "`padding_mask`, in section *1. Padding*" in note
    assert "`lookahead_mask`, in section *2. Look-ahead*" in note
    assert "`labkit.check_masks(padding_mask, lookahead_mask)`" in note
    assert "check_multi_head_attention" not in note


def test_lab_settings_switch_off_the_news_question():
    """The override make setup installs, checked against the installed JupyterLab's schema."""
    overrides = json.loads((ROOT / "tools" / "jupyterlab" / "overrides.json").read_text())
    schema_dir = Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas"
    for plugin, values in overrides.items():
        package, _, name = plugin.partition(":")
        schema_path = schema_dir / package / f"{name}.json"
        if not schema_path.exists():
            pytest.skip(f"JupyterLab's schema {schema_path} is not installed here")
        props = json.loads(schema_path.read_text())["properties"]
        for key, value in values.items():
            assert key in props, f"{plugin} has no setting {key!r}"
            spec = props[key]
            if "oneOf" in spec:
                assert value in [o["const"] for o in spec["oneOf"]], (key, value)
            else:
                assert isinstance(value, {"boolean": bool, "string": str}[spec["type"]])
    news = overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"]
    assert news == "false"  # "Never"; the default "none" asks on every fresh start


def test_notebook_11_drill_is_stated_ungraded_and_the_timed_exercise_has_no_code_hint():
    """Notebook 11's answer cells earn nothing: the copy's note, the lab table and the teacher
    key say so, and the 'from memory' exercise keeps only the idea and where-it-was-shown hints."""
    path = next(p for p in SOLVED if p.name.startswith("11_"))
    nb = _read(path)
    info = labinfo.lab_info(nb)
    assert info["drill"] >= 40 and len(info["written"]) >= 2  # the drill is practice; two Write.
    ex = exercise_copy.make_exercise(nb, path.name)
    assert f"{info['drill']} drill questions, ungraded" in ex.cells[0].source
    row = next(line for line in teaching_table.lab_table(ROOT).split("\n")
               if line.startswith("| [11 "))
    assert "**ungraded** (0 pt)" in row and "timed exercise" in row
    key = make_keys.key_markdown(path, ROOT)
    assert "ungraded practice, worth 0 points" in key and "timed exercise" in key
    start = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                 and c.source.startswith("## Timed exercise"))
    end = next(i for i in range(start + 1, len(nb.cells)) if nb.cells[i].cell_type == "markdown"
               and nb.cells[i].source.startswith("## "))
    hints = "\n".join(c.source for c in nb.cells[start:end] if c.cell_type == "markdown")
    assert "Hint 1" in hints and "Hint 2" in hints and "Hint 3" not in hints


def test_notebook_12_amp_lab_states_the_contract_and_no_hint_gives_the_order():
    """Lab 2 of 12 says what the step must achieve; the order of the calls is the exercise."""
    path = next(p for p in SOLVED if p.name.startswith("12_"))
    cells = _read(path).cells
    lab = next(i for i, c in enumerate(cells) if c.cell_type == "markdown"
               and c.source.startswith("### Lab 2"))
    text = cells[lab].source
    for call in ("unscale_", "scaler.step", "scaler.update", "zero_grad", "Six moves"):
        assert call not in text, call
    for need in ("fp16-safe", "true gradients", "inf or NaN"):
        assert need in text, need
    hints = next(c.source for c in cells[lab + 1:] if c.cell_type == "markdown")
    blocks = re.split(r"<summary>", hints)
    hint1 = next(b for b in blocks if b.startswith("Hint 1"))
    hint2 = next(b for b in blocks if b.startswith("Hint 2"))
    for hint in (hint1, hint2):  # the order is the exercise: no hint gives it
        assert "Six moves" not in hint and "clear the old gradients" not in hint
        assert "unscale_" not in hint and "scaler.update" not in hint
    assert hint2.startswith("Hint 2: where it was shown")
    assert any(b.startswith("Hint 3") for b in blocks)


def test_study_estimates_leave_time_for_every_graded_and_drill_item():
    """A floor, not a measurement: 2 min per drill question and per prediction, 5 per exercise,
    5 per written answer; no lab's estimate is below what its own items need."""
    labs = scoring.load_labs(ROOT)
    short = []
    for path in SOLVED:
        info = labinfo.lab_info(_read(path))
        need = (2 * info["drill"] + 2 * len(info["predictions"]) + 5 * len(info["exercises"])
                + 5 * len(info["written"]))
        minutes = scoring.lab_settings(labs, path.name[:2])["minutes"] or 0
        if minutes < need:
            short.append(f"{path.name}: about {minutes} min for items that need {need}")
    assert not short, "\n".join(short)


# ------------------------------------------------------------- issue 29: the bar on the real labs

@pytest.mark.parametrize("path", SOLVED, ids=[p.stem for p in SOLVED])
def test_no_visible_cell_answers_a_prediction(path):
    """Nothing the learner sees before a prediction's answer cell shows its expected value:
    prose, unfolded code, or what a cell prints (labkit.course.audit's rule)."""
    from labkit.course import audit

    found = audit.visible_answers(_read(path))
    assert not found, "answers visible before the answer cell: " + "; ".join(
        f"{v['prediction']} = {v['value']} in cell {v['cell']}'s {v['where']}" for v in found)


@pytest.mark.parametrize("path", SOLVED, ids=[p.stem for p in SOLVED])
def test_no_hint_tier_is_nearly_the_code(path):
    from labkit.course import audit

    found = audit.copying_hints(_read(path))
    assert not found, "hint tiers whose code covers most of the solution: " + "; ".join(
        f"cell {h['cell']} {h['tier']} ({h['cover']:.0%})" for h in found)


@pytest.fixture(scope="module")
def graded_handout(tmp_path_factory):
    return make_handout.build(tmp_path_factory.mktemp("graded"), ROOT, ["05", "09"], True)


def test_graded_handout_carries_only_the_chosen_labs(graded_handout):
    folder, archive = graded_handout
    names = sorted(p.name[:2] for p in (folder / "notebooks").glob("*.ipynb"))
    assert names == ["05", "09"], names
    assert "This is a graded handout" in (folder / "README.md").read_text()
    with pytest.raises(ValueError, match="no notebook numbered"):
        make_handout.build(folder.parent / "x", ROOT, ["99"], True)


def test_graded_handout_has_only_the_first_hint_and_no_answers(graded_handout):
    folder, _ = graded_handout
    for path in sorted((folder / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        solved = _read(ROOT / "notebooks" / path.name)
        text = "\n".join(c.source for c in nb.cells)
        assert re.search(r"<summary>\s*Hint 1", text), path.name  # the idea stays
        assert not re.search(r"<summary>\s*Hint [2-9]", text), path.name
        assert "### BEGIN SOLUTION" not in text and "### PREDICTION" not in text
        for cell in solved.cells:
            for region in regions.find_regions(cell.source):
                code = regions.solution_code(cell.source, region).strip()
                longest = max(code.split("\n"), key=len).strip()
                assert len(longest) < 12 or longest not in text, (path.name, longest)
        proofs = [solved.cells[i].source for i in labinfo.lab_info(solved)["proof_cells"]]
        assert not any(p.strip() and p in text for p in proofs), path.name
        graders = [c for c in nb.cells if "check_prediction(" in c.source]
        assert graders and all(c.metadata["jupyter"]["source_hidden"] for c in graders)
        answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
        assert answers and all("raise NotImplementedError()" in c.source
                               or c.source == "YOUR ANSWER HERE" for c in answers)
        written = [c for c in answers if c.cell_type == "markdown"]
        assert len(written) == len(labinfo.lab_info(solved)["written"]), path.name


def test_graded_handout_of_11_leaves_out_the_drill_proofs_that_hold_the_timed_exercise():
    """11's drill proofs hold the 'from memory' exercise's parts; the exercise copy only folds
    them (source hidden), the graded handout (make handout LABS=11 GRADED=1) leaves them out."""
    path = next(p for p in SOLVED if p.name.startswith("11_"))
    solved = _read(path)
    copy = exercise_copy.make_exercise(_read(path), path.name)
    graded = make_handout.graded_notebook(path)
    parts = {"Q26's blockwise attention": "def blockwise_attention(",
             "Q12's head split": ".view(2, 10, 8, d_k).transpose(1, 2)",
             "Q29's mask fill": ".masked_fill(mask, torch.finfo(dtype).min)"}
    for name, code in parts.items():
        folded = [c for c in copy.cells if c.cell_type == "code" and code in c.source]
        assert folded and all(c.metadata["jupyter"]["source_hidden"] for c in folded), name
        assert not any(code in c.source for c in graded.cells), name
    proofs = [solved.cells[i].source.strip() for i in labinfo.proof_cells(solved)]
    kept = [c for c in graded.cells if any(p and p in c.source for p in proofs)]
    assert all(c.metadata["nbgrader"]["grade"] for c in kept)  # only a prediction's sealed grader
    assert "make handout LABS=11 GRADED=1" in make_keys.key_markdown(path, ROOT)  # the note says so


def test_first_hints_only_keeps_the_idea_and_drops_later_tiers():
    text = ("Hints:\n\n<details><summary>Hint 1: the idea</summary>compare</details>\n\n"
            "<details><summary>Hint 2: where it was shown</summary>cell 5</details>\n"
            "<details><summary>Answer</summary>kept for the copy's own rules</details>")
    out = make_handout.first_hints_only(text)
    assert "Hint 1: the idea" in out and "Hint 2" not in out and "Answer" in out


def test_make_handout_passes_labs_and_graded():
    recipe = (ROOT / "Makefile").read_text().split("\nhandout:", 1)[1].split("\n\n", 1)[0]
    assert "$(if $(LABS),--labs $(LABS))" in recipe
    assert "$(if $(filter 1 yes true,$(GRADED)),--graded)" in recipe


def test_handout_readme_claims_hold_for_the_labs_it_carries(handout):
    """The student README explains **Write.** cells only because labs have them, and says the
    top note tells whether Run All stops (the copies differ: read from their code)."""
    folder, _ = handout
    readme = (folder / "README.md").read_text()
    copies = [nbformat.read(p, as_version=4) for p in sorted((folder / "notebooks").glob("*"))]
    written = sum(len(c.metadata[markup.LAB_KEY]["written"]) for c in copies)
    assert ("**Write.** cells" in readme) == (written > 0), written
    notes = [c.cells[0].source for c in copies]
    assert any("Run All stops" in n for n in notes) or not any("Run All" in n for n in notes)
    assert "Each notebook's top note says whether *Run All* stops" in readme


def test_the_copies_leave_the_recap_card_out():
    """Below the stubs the card states what the exercises compute and the predictions' values
    (cold readers opened the old fold first): the copy keeps its heading and a pointer only."""
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        solved = _read(path)
        card = next(c.source for c in solved.cells if c.cell_type == "markdown"
                    and c.source.startswith("## Recap card"))
        ex = _read(ROOT / "notebooks" / layout.EXERCISE_DIR / path.name)
        cards = [c.source for c in ex.cells if c.cell_type == "markdown"
                 and c.source.startswith("## Recap card")]
        assert len(cards) == 1, path.name
        assert "this copy leaves it out" in cards[0] and path.name in cards[0], cards[0]
        body = card.split("\n", 1)[1].strip()
        assert body[:60] not in cards[0], path.name


def test_a_stub_called_inside_try_except_does_not_stop_run_all():
    guarded = ("try:\n    out = my_fn(1)\nexcept NotImplementedError:\n    out = None\n")
    bare = "out = my_fn(1)\n"
    stub = "def my_fn(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"
    for body, stops in ((guarded, False), (bare, True)):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("## 1. A section"),
                                             nbformat.v4.new_code_cell(stub),
                                             nbformat.v4.new_code_cell(body)])
        info = labinfo.lab_info(nb)
        assert (info["run_all_stop"] is not None) == stops, body
        note = exercise_copy.make_exercise(nb, "99_x.ipynb").cells[0].source
        assert ("the first calls `my_fn`, in section *1. A section*" in note) == stops


def test_the_graded_readme_says_which_labs_and_that_predictions_are_sealed():
    chosen = [ROOT / "notebooks" / "05_masks.ipynb", ROOT / "notebooks" / "09_inference.ipynb"]
    text = make_handout.readme(chosen, graded=True)
    assert "Labs 05 and 09 (of the series 00-13) build" in text
    assert "shows the true value" not in text and "sealed" in text
    assert "Each starts with a note" not in text  # the graded notebooks have none
    full = make_handout.readme(sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), False)
    assert full.startswith("# Transformer labs") and "Labs 00-13 build" in full
    assert "Each starts with a note" in full and "This is a graded handout" not in full


def test_a_check_call_with_a_comment_is_listed_whole_in_the_note():
    source = ("_ = labkit.check_positional_encoding(positional_table, odd_d_model=True,  # odd\n"
              "                                    computed_in_float64=True)\n")
    (_, _, call), = labinfo.check_calls(source)
    assert call == ("labkit.check_positional_encoding(positional_table, odd_d_model=True, "
                    "computed_in_float64=True)")
    (_, _, text), = labinfo.check_calls('_ = labkit.check_prediction("a # b", x, 3)')
    assert '"a # b"' in text  # a # inside a string is not a comment
