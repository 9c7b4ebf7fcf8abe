"""labkit.check_prediction: graded predictions with named wrong answers."""
from __future__ import annotations

import math

import pytest
import torch

import labkit


def test_right_shape_passes_and_reveals(capsys):
    out = torch.zeros(2, 5, 16)
    result = labkit.check_prediction("output shape", (2, 5, 16), out.shape)
    assert result.passed and result.mistakes == []
    assert "you predicted (2, 5, 16); it is (2, 5, 16)" in capsys.readouterr().out


def test_known_wrong_answer_is_named():
    result = labkit.check_prediction(
        "parameters of Linear(4, 3)", 27, 15, verbose=False,
        mistakes={27: "you counted the biases twice", 12: "you forgot the biases"})
    assert not result.passed and result.mistakes == ["prediction_known_mistake"]
    assert "you counted the biases twice" in result.report


def test_unknown_wrong_answer_reveals_the_value():
    result = labkit.check_prediction("heads", 3, 8, verbose=False)
    assert result.mistakes == ["prediction_wrong"] and "it is 8" in result.report


@pytest.mark.parametrize("given, ok", [(0.101, True), (0.099, True), (0.12, False),
                                       (float("nan"), False)])
def test_numbers_within_tolerance(given, ok):
    assert labkit.check_prediction("loss", given, 0.1, tol=0.005, verbose=False).passed is ok


def test_relative_tolerance_and_tensor_values():
    assert labkit.check_prediction("count", 1050, torch.tensor(1000), rel=0.1,
                                       verbose=False).passed
    assert not labkit.check_prediction("count", 1200, 1000, rel=0.1, verbose=False).passed


def test_choices_ignore_case_and_space_but_not_bool_vs_int():
    assert labkit.check_prediction("layout", " Post-LN", "post-ln", verbose=False).passed
    assert not labkit.check_prediction("masked?", 1, True, verbose=False).passed


@pytest.mark.parametrize("blank", [..., None])
def test_blank_prediction_is_reported_not_raised(blank):
    result = labkit.check_prediction("output shape", blank, (2, 5), verbose=False)
    assert result.mistakes == ["prediction_missing"]
    assert "no prediction yet: write yours in the cell above" in result.report
    assert "(2, 5)" not in result.report  # a blank does not reveal the answer


@pytest.mark.parametrize("given", [range(5), {4, 0, 2, 1, 3}, [0, 1, 2, 3, 4]])
def test_positions_as_a_range_or_a_set_are_the_same_answer(given):
    assert labkit.check_prediction("positions", given, (0, 1, 2, 3, 4), verbose=False).passed
    assert not labkit.check_prediction("positions", given, (0, 1, 2, 3), verbose=False).passed


def test_bad_arguments_say_what_was_expected():
    with pytest.raises(TypeError, match="name must be a non-empty string"):
        labkit.check_prediction("", 1, 1)
    with pytest.raises(ValueError, match=r"tol must be a number >= 0 or None, got -1"):
        labkit.check_prediction("x", 1, 1, tol=-1)


@pytest.mark.parametrize("given, want", [("True", True), (" false ", False), ("9", 9),
                                         ("32,768", 32768), ("near 100 %", "near 100%")])
def test_answers_typed_as_text_are_read_as_the_answer_kind(given, want):
    assert labkit.check_prediction("x", given, want, verbose=False).passed


def test_text_that_is_not_the_answer_kind_still_fails():
    assert not labkit.check_prediction("x", "nine", 9, verbose=False).passed
    assert not labkit.check_prediction("x", "yes", True, verbose=False).passed


def test_a_sealed_kernel_records_without_revealing(capsys, monkeypatch):
    """Graded versions seal predictions: no ✓/✗, no true value, until nbgrader grades."""
    from labkit import predict

    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setattr(predict, "_SEALED", False)
    labkit.seal_predictions()
    wrong = labkit.check_prediction("output shape", (2, 5), (2, 3),
                                    mistakes={(2, 5): "that is L_k, not L_q"})
    shown = capsys.readouterr().out
    assert "recorded" in shown and "(2, 3)" not in shown and "L_k" not in shown
    assert "✗" not in shown and "✓" not in shown
    assert not wrong.passed and "prediction_known_mistake" in wrong.mistakes  # still graded
    assert labkit.sealed_score(0.5) is None
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")  # nbgrader grading the hand-in
    labkit.check_prediction("output shape", (2, 5), (2, 3))
    assert "it is (2, 3)" in capsys.readouterr().out
    assert labkit.sealed_score(0.5) == 0.5


def test_an_unsealed_kernel_scores_and_reveals(capsys, monkeypatch):
    from labkit import predict

    monkeypatch.setattr(predict, "_SEALED", False)
    assert labkit.sealed_score(0.25) == 0.25
    labkit.check_prediction("d_k", 64, 64)
    assert "it is 64" in capsys.readouterr().out


def test_numpy_values_are_read_as_plain_numbers_and_lists():
    import numpy as np

    assert labkit.check_prediction("positions", np.array([0, 2]), (0, 2), verbose=False).passed
    assert labkit.check_prediction("mean", np.float64(0.5), 0.5, tol=0.01, verbose=False).passed
    assert not labkit.check_prediction("positions", [0, 1], np.array([0, 2]),
                                       verbose=False).passed


def test_pasted_names_finds_a_notebook_variable_in_the_prediction_line():
    from labkit.predict import pasted_names

    var_raw, answer = [1.0, 61.6], 61.6
    ns = {"var_raw": var_raw, "math": math, "predicted_var": answer, "round": round}
    grading = 'labkit.check_prediction("variance", predicted_var, 61.6)'
    inputs = ["var_raw = [1.0, 61.6]", "predicted_var = var_raw[1]  ### PREDICTION"]
    assert pasted_names(answer, ns, inputs, grading) == ["var_raw"]
    # a stated value, arithmetic on literals and a module are fine
    for line in ("predicted_var = 61.6", "predicted_var = 1 / 6", "predicted_var = 2 * math.pi"):
        assert pasted_names(answer, ns, inputs[:1] + [line], grading) == []
    # arithmetic on plain-number settings is reasoning; a bare setting, or a list inside
    # arithmetic, is a paste
    ns.update(d_model=512, n_heads=8)
    assert pasted_names(answer, ns, ["predicted_var = d_model // n_heads"], grading) == []
    assert pasted_names(answer, ns, ["predicted_var = d_model"], grading) == ["d_model"]
    assert pasted_names(answer, ns, ["predicted_var = var_raw[1] * n_heads"],
                        grading) == ["var_raw"]
    # a setting read off a config inside arithmetic or a tuple is reasoning; a model's output
    # is a computed result even though the model is callable
    class Config:
        d_model = 128

    class Model:
        def __call__(self, x):
            return x

        def encode(self, x):
            return x

    ns.update(config=Config(), model=Model(), src=var_raw)
    assert pasted_names(answer, ns, ["predicted_var = (4, 17, config.d_model)"], grading) == []
    assert pasted_names(answer, ns, ["predicted_var = config.d_model"], grading) == ["config"]
    assert pasted_names(answer, ns, ["predicted_var = tuple(model.encode(src))"],
                        grading) == ["model", "src"]
    # a set-up cell after the prediction (not only assignments) is not taken for it
    setup = "d_k = len(var_raw)\nprint(d_k)"
    assert pasted_names(answer, ns, inputs[:1] + ["predicted_var = 61.6", setup], grading) == []


def test_check_prediction_rejects_a_pasted_variable_in_a_kernel():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        for cell in ("import labkit", "rows = list(range(20))",
                     "predicted_rows = len(rows)  ### PREDICTION",
                     "r = labkit.check_prediction('rows', predicted_rows, 20, verbose=False)",
                     "predicted_rows = 20  ### PREDICTION",
                     "s = labkit.check_prediction('rows', predicted_rows, 20, verbose=False)"):
            assert shell.run_cell(cell, store_history=True).success
        pasted, stated = shell.user_ns["r"], shell.user_ns["s"]
        assert not pasted.passed and pasted.mistakes == ["prediction_pasted"]
        assert "rows" in pasted.report and "it is 20" in pasted.report
        assert stated.passed
    finally:
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("typed, want, passed", [
    ("(4, 17, 128)", (4, 17, 128), True), ("4, 17, 128", (4, 17, 128), True),
    ("torch.Size([4, 17, 128])", torch.Size([4, 17, 128]), True), ("[1, 3]", [1, 3], True),
    ("(4, 17)", (4, 17, 128), False), ("four", (4,), False),
    ("5%", 0.05, True), ("5 %", 0.05, True), ("50%", 0.05, False)])
def test_a_shape_or_a_percentage_typed_as_text_is_read_as_a_value(typed, want, passed):
    tol = 1e-9 if isinstance(want, float) else None
    result = labkit.check_prediction("x", typed, want, tol=tol, verbose=False)
    assert result.passed is passed
