"""Issue 29's bar, counted by ``python -m labkit.course.audit``: the counting logic on small
fixture notebooks, then the real table printed (its counts may be non-zero while the labs are
rewritten; ``--strict`` turns them into a failure). Also the copy's Run All note and its folded
proof cells, read from the code. In-process, no notebook runs."""
import nbformat

from labkit.course import audit, exercise_copy, labinfo

QUESTION = "**Predict.** What shape does the output have?"
PREDICT = "predicted_shape = (2, 5, 16)  ### PREDICTION"
GRADE = ('labkit.check_prediction("output shape", predicted_shape, (2, 5, 16), '
         'mistakes={(2, 8, 5, 16): "split heads"})')


def _nb(*cells, outputs=None):
    nb = nbformat.v4.new_notebook()
    for i, (kind, source) in enumerate(cells):
        cell = (nbformat.v4.new_markdown_cell(source) if kind == "md"
                else nbformat.v4.new_code_cell(source))
        cell.id = f"c{i}"
        if outputs and i in outputs:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=outputs[i])]
        nb.cells.append(cell)
    return nb


def test_a_printed_answer_before_the_prediction_is_counted():
    clean = _nb(("code", "x = 1"), ("md", QUESTION), ("code", PREDICT), ("code", GRADE),
                outputs={0: "nothing to see\n"})
    assert audit.visible_answers(clean) == []
    leaky = _nb(("code", "out = f(x)\nprint(out.shape)"), ("md", QUESTION), ("code", PREDICT),
                ("code", GRADE), outputs={0: "torch.Size([2, 5, 16])\n"})
    assert audit.visible_answers(leaky) == [{"prediction": "predicted_shape",
                                             "value": "(2, 5, 16)", "cell": 0,
                                             "where": "output"}]
    after = _nb(("md", QUESTION), ("code", PREDICT), ("code", GRADE),
                ("code", "print(out.shape)"), outputs={3: "(2, 5, 16)\n"})
    assert audit.visible_answers(after) == []  # shown after the answer: fine


def test_written_values_count_in_visible_text_and_code_but_not_in_answers_or_folds():
    prose = _nb(("md", "The output is (2, 5, 16) as we saw."), ("md", QUESTION),
                ("code", PREDICT), ("code", GRADE))
    assert [v["where"] for v in audit.visible_answers(prose)] == ["text"]
    answer = _nb(("md", "Q?\n\n<details><summary>Answer</summary>(2, 5, 16)</details>"),
                 ("md", QUESTION), ("code", PREDICT), ("code", GRADE))
    assert audit.visible_answers(answer) == []  # the copy drops the answer block
    comment = _nb(("code", "# the output will be (2, 5, 16)\ny = 2"), ("md", QUESTION),
                  ("code", PREDICT), ("code", GRADE))
    assert [v["where"] for v in audit.visible_answers(comment)] == ["code"]
    number = _nb(("code", "d = 2"), ("md", "**Predict.** How many?"),
                 ("code", "n_params = 60611.5  ### PREDICTION"),
                 ("code", 'labkit.check_prediction("n", n_params, 60611.5)'),
                 outputs={0: "positions: 60611.5\n"})
    assert [v["prediction"] for v in audit.visible_answers(number)] == ["n_params"]
    small = _nb(("code", "print(2)"), ("md", "**Predict.** How many heads?"),
                ("code", "n = 8  ### PREDICTION"), ("code", 'labkit.check_prediction("n", n, 8)'),
                outputs={0: "the 8 heads of 2 layers\n"})
    assert audit.visible_answers(small) == []  # a small number in a sentence means nothing
    labelled = _nb(("code", "print(2)"), ("md", "**Predict.** How many heads?"),
                   ("code", "n = 8  ### PREDICTION"),
                   ("code", 'labkit.check_prediction("n", n, 8)'),
                   outputs={0: "heads: 8\n"})
    assert len(audit.visible_answers(labelled)) == 1  # "label: value" gives it away


def test_folded_blocks_count_before_the_answer_cell_and_between_it_and_its_grading_cell():
    """A learner opens folds: one that shows the value before the answer cell gives it away,
    and any fold but a hint between the answer cell and its grading cell is read as the answer
    (notebook 11's "Say this" under Q2 and Q3: "quadruples", "66,048")."""
    aside = _nb(("md", "<details><summary>Aside</summary>it is (2, 5, 16)</details>"),
                ("md", QUESTION), ("code", PREDICT), ("code", GRADE))
    assert [v["where"] for v in audit.visible_answers(aside)] == ["folded block"]
    say = "<details><summary>Say this</summary>Doubling L quadruples it.</details>"
    count = _nb(("md", "**Predict.** By what factor?"), ("code", "f = 4  ### PREDICTION"),
                ("md", say), ("code", 'labkit.check_prediction("f", f, 4)'))
    assert audit.visible_answers(count) == [{"prediction": "f", "value": "4", "cell": 2,
                                             "where": "folded block before the grading cell"}]
    commas = _nb(("md", "**Predict.** How many?"), ("code", "n = 66_048  ### PREDICTION"),
                 ("md", "Four projections: 66,048."),
                 ("code", 'labkit.check_prediction("n", n, 1)'))
    assert [v["where"] for v in audit.visible_answers(commas)] == ["text before the grading cell"]
    after = _nb(("md", "**Predict.** By what factor?"), ("code", "f = 4  ### PREDICTION"),
                ("md", "<details><summary>Hint 1: the idea</summary>pairs</details>"),
                ("code", 'labkit.check_prediction("f", f, 4)'), ("md", say))
    assert audit.visible_answers(after) == []  # a hint between, the answer after the grading


EXERCISE = '''def padding_mask(seq, pad_idx):
    """(N, L) ids -> (N, 1, L) bool."""
    ### BEGIN SOLUTION
    return (seq == pad_idx).unsqueeze(1)
    ### END SOLUTION'''


def test_a_hint_tier_that_is_nearly_the_code_is_counted():
    nudge = ("<details><summary>Hint 1: the idea</summary>compare each id with the pad id"
             "</details>\n<details><summary>Hint 3: what to look up</summary>"
             "`Tensor.unsqueeze`</details>")
    assert audit.copying_hints(_nb(("code", EXERCISE), ("md", nudge))) == []
    code = ("<details><summary>Hint 1: the idea</summary>compare</details>\n"
            "<details><summary>Hint 3: nearly the code</summary>"
            "`return (seq == pad_idx).unsqueeze(1)`</details>")
    found = audit.copying_hints(_nb(("code", EXERCISE), ("md", code)))
    assert [h["tier"] for h in found] == ["Hint 3: nearly the code"], found
    assert found[0]["cover"] == 1.0


def test_the_audit_row_counts_written_questions_exercises_and_checks():
    nb = _nb(("md", "**Write.** Why a bool mask?\n\n<details><summary>Answer</summary>x"
              "</details>"), ("code", EXERCISE),
             ("code", "_ = labkit.check_masks(padding_mask)"))
    row = audit.audit(nb, "99_fixture.ipynb")
    assert (row["written"], row["exercises"], row["checks"]) == (1, ["padding_mask"],
                                                                   ["check_masks"])
    assert "| 99_fixture.ipynb | 1 | 0 | 0 | 1 | check_masks |" in audit.table([row])


def test_the_real_table(capsys):
    assert audit.main([]) == 0
    out = capsys.readouterr().out
    print(out)  # the bar, for the record
    assert out.count("\n| 0") >= 10 and "| Copy | Written |" in out


# ---------------------------------------------------------------- the copy's note and folds

CALLED = "out = padding_mask(ids, 1)"


def test_the_run_all_note_follows_whether_a_stub_raises_at_top_level():
    checked_only = _nb(("code", EXERCISE), ("code", "_ = labkit.check_masks(padding_mask)"))
    assert labinfo.lab_info(checked_only)["run_all_stop"] is None
    note = exercise_copy.make_exercise(checked_only, "99_x.ipynb").cells[0].source
    assert "Run All runs to the end" in note and "Run All stops" not in note
    called = _nb(("code", EXERCISE), ("code", "_ = labkit.check_masks(padding_mask)"),
                 ("code", CALLED))
    assert labinfo.lab_info(called)["run_all_stop"] == {"cell": 2, "name": "padding_mask"}
    note = exercise_copy.make_exercise(called, "99_x.ipynb").cells[0].source
    assert "Run All stops at the first cell that runs a stub" in note and "`padding_mask`" in note
    inside = _nb(("code", EXERCISE), ("code", f"def demo():\n    {CALLED}"))
    assert labinfo.lab_info(inside)["run_all_stop"] is None  # a call inside a def waits


def test_check_yourself_proof_cells_are_folded_in_the_copy():
    nb = _nb(("md", "## Core"), ("code", "x = 1"), ("md", "## Check yourself\n\n1. Why?\n\n"
             "<details><summary>Answer</summary>because</details>"),
             ("code", 'print("Q1: because")'), outputs={3: "Q1: because\n"})
    assert labinfo.lab_info(nb)["proof_cells"] == [3]
    copy = exercise_copy.make_exercise(nb, "99_x.ipynb")
    proof = next(c for c in copy.cells if c.source == 'print("Q1: because")')
    assert proof.metadata["jupyter"]["source_hidden"] is True and proof.outputs == []
    core = next(c for c in copy.cells if c.source == "x = 1")
    assert "jupyter" not in core.metadata
    assert "Check yourself:** answer each question before" in copy.cells[0].source
