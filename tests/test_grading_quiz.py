"""check_shape_quiz: right answers pass; each wrong or missing answer is named with its shape."""
import pytest
import torch

import labkit
from labkit import quiz

RIGHT = {"q1": (2, 4, 5, 7), "q2": (2, 5, 32), "q3": (3, 7), "q4a": (2, 1, 7),
         "q4b": (2, 5, 5), "q5": (2, 4, 3, 8), "q6": (4, 6, 128)}


def test_computed_shapes_are_the_quiz_answers():
    assert quiz.quiz_shapes() == RIGHT
    assert set(quiz.QUESTIONS) == set(RIGHT)


@pytest.mark.parametrize("answers", [RIGHT, lambda: dict(RIGHT),
                                     {k: list(v) for k, v in RIGHT.items()},
                                     {k: torch.Size(v) for k, v in RIGHT.items()}])
def test_right_answers_pass(answers):
    result = labkit.check_shape_quiz(answers, verbose=False)
    assert result.passed and not result.mistakes, result.report


@pytest.mark.parametrize("key", list(RIGHT))
def test_each_wrong_answer_is_named_with_the_expected_shape(key):
    wrong = dict(RIGHT, **{key: RIGHT[key][::-1] + (1,)})
    result = labkit.check_shape_quiz(wrong, verbose=False)
    assert not result.passed and result.mistakes == ["quiz_wrong_shape"]
    bad = [m for m in result.messages if m.startswith("  ✗")]
    assert len(bad) == 1 and bad[0].startswith(f"  ✗ {key} ") and f"computed {RIGHT[key]}" in bad[0]
    assert f"{key} is {RIGHT[key]}, not {wrong[key]!r}" in result.report.replace("\n    ", " ")


def test_two_wrong_answers_and_a_missing_one_are_all_named():
    answers = dict(RIGHT, q2=(2, 7, 32), q5=(2, 3, 4, 8))
    del answers["q6"]
    result = labkit.check_shape_quiz(answers, verbose=False)
    assert result.mistakes == ["quiz_wrong_shape", "quiz_missing_answer"]
    text = "\n".join(result.messages)
    assert "q2 is (2, 5, 32), not (2, 7, 32)" in text and "q5 is (2, 4, 3, 8)" in text
    assert "q6: no answer; computed (4, 6, 128)" in text.replace(" (the logits of tx.Transformer"
                                                                   "(tx.ModelConfig()) for src "
                                                                   "(4, 9), tgt (4, 6))", "")


def test_expected_shapes_can_come_from_the_notebook():
    result = labkit.check_shape_quiz({"a": (1, 2)}, {"a": torch.Size([1, 3])}, verbose=False)
    assert not result.passed and "a is (1, 3), not (1, 2)" in result.report


def test_a_stub_and_a_non_dict_are_explained_not_raised():
    def shape_quiz_answers():
        raise NotImplementedError("fill in the dict")

    result = labkit.check_shape_quiz(shape_quiz_answers, verbose=False)
    assert result.mistakes == ["not_implemented"] and "fill in the dict" in result.report
    result = labkit.check_shape_quiz([(2, 4, 5, 7)], verbose=False)
    assert result.mistakes == ["wrong_output_type"]
    assert labkit.find_checks({"shape_quiz_answers": shape_quiz_answers}, None)[0][0] == \
        "check_shape_quiz(shape_quiz_answers)"
    assert "quiz_wrong_shape" in labkit.MISTAKES
