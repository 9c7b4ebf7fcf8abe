"""tx_helpers.g2p: the CMU dictionary, its split, the metrics, pronounce() and the shipped model."""
import random

import pytest
import torch

import tx_helpers as tx
from tx_helpers import g2p


@pytest.fixture(scope="module")
def lexicon():
    return g2p.load_lexicon()


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return tx.Transformer(g2p.g2p_model_config(d_model=16, n_heads=2, d_ff=32, n_layers=1,
                                               dropout=0.0)).eval()


# ---------------------------------------------------------------- the dictionary

def test_lexicon_words_are_letters_and_phones_are_arpabet_without_stress(lexicon):
    assert len(lexicon) > 100_000
    assert all(w.isalpha() and w.islower() and w.isascii() for w in lexicon)
    phones = {p for prons in lexicon.values() for pron in prons for p in pron}
    assert phones == set(g2p.PHONES) and len(g2p.PHONES) == 39
    assert "'bout" not in lexicon and "a." not in lexicon


def test_alternative_pronunciations_stay_with_their_word(lexicon):
    assert lexicon["read"] == [["R", "EH", "D"], ["R", "IY", "D"]]
    assert lexicon["knight"] == [["N", "AY", "T"]]
    stressed = g2p.load_lexicon(stress=True)
    assert stressed["read"] == [["R", "EH1", "D"], ["R", "IY1", "D"]]
    # pronunciations that differ only in stress become one without it
    assert len(stressed["abstract"]) == 2
    assert lexicon["abstract"] == [["AE", "B", "S", "T", "R", "AE", "K", "T"]]


def test_stress_must_be_a_bool():
    with pytest.raises(TypeError, match="stress must be True or False"):
        g2p.load_lexicon(stress="no")


def test_split_is_disjoint_complete_and_deterministic(lexicon):
    train, valid, test = g2p.split_words(lexicon)
    assert not set(train) & set(valid) and not set(train) & set(test)
    assert not set(valid) & set(test)
    assert sorted(train + valid + test) == sorted(lexicon)
    assert 0.09 < len(test) / len(lexicon) < 0.11 and 0.015 < len(valid) / len(lexicon) < 0.025
    assert (train, valid, test) == g2p.split_words(lexicon)
    assert {w for group in g2p.SHOWCASE.values() for w in group} <= set(test)


def test_a_words_split_does_not_depend_on_the_other_words(lexicon):
    words = sorted(lexicon)
    subset = dict.fromkeys(random.Random(0).sample(words, 5000))
    train, valid, test = g2p.split_words(lexicon)
    sub_train, sub_valid, sub_test = g2p.split_words(subset)
    assert set(sub_test) == set(test) & set(subset) and set(sub_train) == set(train) & set(subset)
    assert g2p.split_words(lexicon, seed=1)[2] != test


@pytest.mark.parametrize("kwargs, match", [
    ({"test_fraction": 0}, "test_fraction must be a number in"),
    ({"valid_fraction": 1.5}, "valid_fraction must be a number in"),
    ({"valid_fraction": 0.5, "test_fraction": 0.5}, "must be below 1"),
])
def test_bad_split_fractions(kwargs, match):
    with pytest.raises(ValueError, match=match):
        g2p.split_words({"a": [["AH"]]}, **kwargs)


# ---------------------------------------------------------------- metrics

def test_edit_distance_on_known_cases():
    assert g2p.edit_distance("kitten", "sitting") == 3
    assert g2p.edit_distance([], ["AH"]) == 1
    assert g2p.edit_distance(["N", "AY", "T"], ["N", "AY", "T"]) == 0
    assert g2p.edit_distance(["K", "N", "AY", "T"], ["N", "AY", "T"]) == 1


def test_a_word_is_right_when_it_matches_any_reference():
    refs = [[["R", "EH", "D"], ["R", "IY", "D"]], [["N", "AY", "T"]]]
    assert g2p.word_error_rate([["R", "IY", "D"], ["N", "AY", "T"]], refs) == 0.0
    assert g2p.word_error_rate([["R", "IY", "D"], ["K", "N", "AY", "T"]], refs) == 0.5
    assert g2p.word_error_rate([["R", "AY", "D"], []], refs) == 1.0


def test_phone_error_rate_uses_the_closest_reference():
    refs = [[["R", "EH", "D"], ["R", "IY", "D", "Z"]], [["N", "AY", "T"]]]
    # "R IY D": 1 edit from the 4-phone reference (the closest), 1 from the 3-phone one;
    # ties go to the first, so 1 error over 3 phones; then "K N AY T": 1 over 3.
    assert g2p.phone_error_rate([["R", "IY", "D"], ["K", "N", "AY", "T"]], refs) == 2 / 6
    # closest is the second reference: 0 errors over its 4 phones, plus 0 over 3
    assert g2p.phone_error_rate([["R", "IY", "D", "Z"], ["N", "AY", "T"]], refs) == 0.0
    assert g2p.phone_error_rate([[], ["N", "AY", "T"]], refs) == 3 / 6


@pytest.mark.parametrize("predictions, references, match", [
    ([["AH"]], [], "got 1 predictions for 0 words"),
    ([], [], "nothing to score"),
    ([["AH"]], [["AH"]], r"references\[0\] must be a non-empty list of pronunciations"),
    ([["AH"]], [[]], r"references\[0\] must be a non-empty list"),
])
def test_metrics_refuse_mismatched_input(predictions, references, match):
    for metric in (g2p.word_error_rate, g2p.phone_error_rate):
        with pytest.raises(ValueError, match=match):
            metric(predictions, references)


# ---------------------------------------------------------------- batches

def test_batches_are_deterministic_and_resume_where_they_stopped(lexicon):
    pairs = g2p.g2p_pairs(["read", "knight", "through", "phone", "cat", "a"], lexicon)
    assert len(pairs) == 8  # "read" and "a" have two pronunciations each
    full = list(g2p.g2p_batches(pairs, 2, steps=9, bucket=2))
    again = list(g2p.g2p_batches(pairs, 2, steps=9, bucket=2))
    resumed = list(g2p.g2p_batches(pairs, 2, start=4, steps=9, bucket=2))
    assert len(full) == 9 and len(resumed) == 5
    for a, b in zip(full, again, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    for a, b in zip(full[4:], resumed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    src, tgt_in, tgt_out = full[0]
    assert src.shape[0] == tgt_in.shape[0] == 2 and tgt_in.shape == tgt_out.shape
    assert (tgt_in[:, 0] == g2p.PHONE_VOCAB.bos_idx).all()
    assert torch.equal(tgt_in[:, 1:], tgt_out[:, :-1].masked_fill(
        tgt_out[:, :-1] == g2p.PHONE_VOCAB.eos_idx, g2p.PHONE_VOCAB.pad_idx))


def test_the_rest_is_one_smaller_batch_and_a_resume_counts_it(lexicon):
    # 7 pairs in batches of 2, bucket 2: 3 full batches and the rest, 1 pair, as a fourth
    words = ["read", "knight", "through", "phone", "cat", "a"]
    pairs = g2p.g2p_pairs(words, lexicon)[:7]
    full = list(g2p.g2p_batches(pairs, 2, steps=12, bucket=2))
    assert [b[0].shape[0] for b in full[:4]].count(1) == 1  # one epoch: 2 + 2 + 2 + 1 rows
    assert sum(b[0].shape[0] for b in full[:4]) == len(pairs)
    for start in (5, 9):  # past the first and the second epoch
        resumed = list(g2p.g2p_batches(pairs, 2, start=start, steps=12, bucket=2))
        for a, b in zip(full[start:], resumed, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # when the full batches fill whole runs, the rest is dropped: 2 full batches, bucket 2
    sizes = [b[0].shape[0] for b in g2p.g2p_batches(pairs[:5], 2, steps=4, bucket=2)]
    assert sizes == [2, 2, 2, 2]


def test_phone_vocab_round_trip():
    ids = g2p.PHONE_VOCAB.encode(["N", "AY", "T"], bos=True, eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 5
    assert g2p.PHONE_VOCAB.decode_tokens(ids + [0, 0]) == ["N", "AY", "T"]


# ---------------------------------------------------------------- pronounce

@pytest.mark.parametrize("words, error, match", [
    (["o'neil"], ValueError, r"words\[0\]=\"o'neil\" must be letters a-z only .*\[\"'\"\]"),
    (["ok", ""], ValueError, r"words\[1\]='' must be letters a-z only .*empty string"),
    (["naïve"], ValueError, r"\['ï'\]"),
    (["a" * 40], ValueError, "has 40 letters; expected at most 32"),
    ("knight", TypeError, r"words must be a list of strings, got str .* pass \[word\]"),
    ([3], TypeError, r"words\[0\] must be a str, got int"),
])
def test_bad_words_are_refused_with_a_clear_error(tiny_model, words, error, match):
    with pytest.raises(error, match=match):
        g2p.pronounce(words, model=tiny_model)


def test_pronounce_keeps_order_and_case_is_ignored(tiny_model):
    words = ["Knight", "a", "through", "psychology", "cat"]
    one_by_one = [g2p.pronounce([w], model=tiny_model)[0] for w in words]
    assert g2p.pronounce(words, model=tiny_model, batch_size=2) == one_by_one
    assert g2p.pronounce(["knight"], model=tiny_model) == one_by_one[:1]
    assert all(set(p) <= set(g2p.PHONES) for p in one_by_one)


def test_beam_of_one_is_greedy_and_a_beam_returns_phones(tiny_model):
    words = ["knight", "read", "schwarzenegger"]
    greedy = g2p.pronounce(words, model=tiny_model)
    ids = tx.greedy_decode(tiny_model, tx.data.pad_sequences(
        [g2p.LETTER_VOCAB.encode(w) for w in words], 0), bos_idx=1, eos_idx=2, max_len=32)
    assert greedy == [g2p.PHONE_VOCAB.decode_tokens(row) for row in ids]
    beam = g2p.pronounce(words, model=tiny_model, beam_size=3)
    assert len(beam) == 3 and all(set(p) <= set(g2p.PHONES) for p in beam)


def test_a_model_for_another_task_is_refused():
    with pytest.raises(ValueError, match="model must read 29 letter ids and write 42 phone ids"):
        g2p.pronounce(["cat"], model=tx.load_dates_model("cpu"))


def test_evaluate_refuses_unknown_words(tiny_model):
    with pytest.raises(ValueError, match="must be in the dictionary"):
        g2p.evaluate(["blorft"], model=tiny_model)


# ---------------------------------------------------------------- the shipped model

@pytest.mark.slow  # notebook 13 evaluates the shipped model on the same test words
def test_shipped_model_is_the_trained_one(lexicon):
    """A regression guard on the whole test split, greedy, no stress. The shipped recipe
    measured WER 31.3% and PER 7.7% (notebook 13 prints them; the project's target of 30% and
    7.5% is not met in one CPU hour, as the notebook and the benchmark report say)."""
    test = g2p.split_words(lexicon)[2]
    result = g2p.evaluate(test, model=g2p.load_pretrained("cpu"), lexicon=lexicon)
    assert result["wer"] <= 0.32 and result["per"] <= 0.08, (result["wer"], result["per"])
    assert g2p.pronounce(["knight", "phone"]) == [["N", "AY", "T"], ["F", "OW", "N"]]


# ---------------------------------------------------------------- the live run: one code path

TINY_LIVE = {**g2p.LIVE_RECIPE, "steps": 3, "batch_size": 16,
             "model": {**g2p.LIVE_RECIPE["model"], "d_model": 16, "d_ff": 32, "n_layers": 1}}


@pytest.mark.slow  # notebook 13 runs a live short run; the evaluate tests stay fast
def test_live_run_is_train_from_recipe_then_evaluate_on_the_validation_words(lexicon):
    from tx_helpers.pretrained import train_from_recipe

    result = g2p.live_run(TINY_LIVE, lexicon=lexicon)
    model, history = train_from_recipe(TINY_LIVE)
    valid = g2p.split_words(lexicon, **TINY_LIVE["split"])[1]
    expected = g2p.evaluate(valid, model=model, lexicon=lexicon)
    assert result["words"] == len(valid) == 2349
    assert result["predictions"] == expected["predictions"]
    assert (result["wer"], result["per"], result["unfinished"]) == (
        expected["wer"], expected["per"], expected["unfinished"])
    assert result["history"].loss == history.loss and not result["model"].training


def test_unfinished_counts_outputs_cut_without_eos_and_they_move_per_not_wer(tiny_model, lexicon):
    # The cause of the README/notebook mismatch: a live model that never writes <eos> for
    # some words. Each such word is wrong either way, but adds about 25 phone errors.
    words = ["knight", "phone", "through", "debt"]
    refs = [lexicon[w] for w in words]
    finishing = g2p.evaluate(words, model=tiny_model, lexicon=lexicon)
    runaway = tx.Transformer(tiny_model.config).eval()
    runaway.load_state_dict(tiny_model.state_dict())
    with torch.no_grad():
        runaway.generator.bias[g2p.PHONE_VOCAB.eos_idx] = -1e4  # <eos> can never win
        runaway.generator.bias[g2p.PHONE_VOCAB.stoi["AH"]] = 1e4  # always AH
    cut = g2p.evaluate(words, model=runaway, lexicon=lexicon)
    assert cut["unfinished"] == len(words)
    assert all(p == ["AH"] * g2p.MAX_WORD_LEN for p in cut["predictions"])
    assert cut["wer"] == 1.0
    closest = [min(refs[i], key=lambda r: g2p.edit_distance(cut["predictions"][i], r))
               for i in range(len(words))]
    assert cut["per"] == pytest.approx(
        sum(g2p.edit_distance(["AH"] * 32, r) for r in closest) / sum(map(len, closest)))
    assert cut["per"] > 4  # far above 1: PER counts every extra phone
    assert finishing["unfinished"] == sum(len(p) == g2p.MAX_WORD_LEN
                                          for p in finishing["predictions"])


def test_bench_gets_its_live_numbers_from_g2p_live_run_and_13_checks_its_run_against_it():
    """The bench's G2P numbers come from the one shared path, g2p.live_run. Notebook 13's short
    run is the learner's lab (the training call is theirs to write), so it is not a second
    hand-written path that could drift: labkit.check_g2p_training compares it with the reference
    and grades its validation WER against the notebook's margin."""
    import inspect
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tools"))
    try:
        import bench
    finally:
        sys.path.remove(str(root / "tools"))
    source = inspect.getsource(bench.bench_g2p)
    assert "g2p.live_run(" in source and "train_from_recipe" not in source
    cells = json.loads((root / "notebooks" / "13_real_data_g2p.ipynb").read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    checks = [c for c in code if "labkit.check_g2p_training(train_short_run" in c]
    assert len(checks) >= 2, "13 checks the learner's training call, then its trained model"
    assert any("words=" in c for c in checks), "the WER of the notebook's own run is graded"
    assert not any("train_from_recipe(" in c for c in code)
