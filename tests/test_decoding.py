import pytest
import torch

import tx_helpers as tx
from tx_helpers.data import (
    DATE_VOCAB,
    date_model_config,
    exact_match,
    exact_match_accuracy,
    translate,
)
from tx_helpers.decoding import greedy_decode

BOS, EOS, PAD = 1, 2, 0


def random_model(dtype, seed=0, n_layers=2, norm_first=False):
    torch.manual_seed(seed)
    cfg = tx.ModelConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=32, n_heads=4, d_ff=64,
                         n_layers=n_layers, dropout=0.1, max_len=40, pad_idx=PAD,
                         norm_first=norm_first)
    return tx.Transformer(cfg).to(dtype)


def padded_src(n, seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 11, (n, 9), generator=g)
    lengths = torch.randint(1, 10, (n,), generator=g)
    src[torch.arange(9)[None] >= lengths[:, None]] = PAD
    return src


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n", [1, 3, 8, 17])
def test_cached_equals_uncached(dtype, n):
    model = random_model(dtype, seed=n)
    src = padded_src(n, seed=n)
    plain = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=20)
    cached = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=20, use_cache=True)
    assert torch.equal(plain, cached)


def test_cached_equals_uncached_pre_ln():
    model = random_model(torch.float32, seed=7, n_layers=3, norm_first=True)
    src = padded_src(6, seed=7)
    a = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=25)
    b = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=25, use_cache=True)
    assert torch.equal(a, b)


def test_output_layout_and_modes():
    model = random_model(torch.float32, seed=1)
    model.train()
    src = padded_src(5, seed=1)
    out = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=12)
    assert model.training  # mode restored
    assert out.dtype == torch.long and out.size(0) == 5 and 2 <= out.size(1) <= 13
    assert (out[:, 0] == BOS).all()
    assert not (out[:, 1:] == BOS).any()
    for row in out.tolist():
        if EOS in row:  # everything after the first EOS is padding
            assert all(t == PAD for t in row[row.index(EOS) + 1:])
        else:
            assert PAD not in row
    # eval mode inside: two calls in train mode give the same result
    again = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=12)
    assert torch.equal(out, again)


def test_stops_early_when_every_row_has_finished():
    model = random_model(torch.float32, seed=2)
    with torch.no_grad():  # a generator that always prefers EOS
        model.generator.bias.fill_(0.0)
        model.generator.bias[EOS] = 1e4
    out = greedy_decode(model, padded_src(4, seed=2), bos_idx=BOS, eos_idx=EOS, max_len=30,
                        use_cache=True)
    assert out.tolist() == [[BOS, EOS]] * 4


def test_argument_checks():
    model = random_model(torch.float32)
    with pytest.raises(ValueError, match="positional table"):
        greedy_decode(model, padded_src(2, 0), bos_idx=BOS, eos_idx=EOS, max_len=40)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        greedy_decode(model, torch.full((1, 3), 50), bos_idx=BOS, eos_idx=EOS, max_len=5)


def test_string_helpers():
    assert exact_match(["a", "b", "c", "d"], ["a", "x", "c", "d"]) == 0.75
    torch.manual_seed(0)
    model = tx.Transformer(date_model_config(d_model=32, n_heads=4, d_ff=64, n_layers=1))
    texts = ["30 Nov 2026", "2026年11月30日", "11/30/26"]
    a = translate(model, texts, DATE_VOCAB, max_len=12, use_cache=False)
    b = translate(model, texts, DATE_VOCAB, max_len=12)
    assert a == b and all(isinstance(t, str) for t in a)
    assert len(translate(model, texts, DATE_VOCAB, max_len=12, batch_size=2)) == 3
    pairs = list(zip(texts, a, strict=True))
    assert exact_match_accuracy(model, pairs, DATE_VOCAB, max_len=12) == 1.0


# ---------------------------------------------------------------- arguments refused

def bad_call(decoder, **overrides):
    model = random_model(torch.float32, seed=3)
    kwargs = dict(src=padded_src(2, seed=3), bos_idx=BOS, eos_idx=EOS, max_len=5)
    kwargs.update(overrides)
    src = kwargs.pop("src")
    return lambda: decoder(model, src, **kwargs)


DECODERS = [pytest.param(greedy_decode, id="greedy"), pytest.param(tx.beam_search, id="beam")]


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("overrides, exc, message", [
    ({"eos_idx": 11}, ValueError, r"eos_idx=11 is outside the target vocabulary \[0, 11\)"),
    ({"bos_idx": -1}, ValueError, r"bos_idx must be >= 0, got bos_idx=-1"),
    ({"eos_idx": 2.0}, TypeError, r"eos_idx must be an int, got float"),
    ({"eos_idx": BOS}, ValueError, r"bos_idx and eos_idx must differ, got 1 for both"),
    ({"eos_idx": PAD}, ValueError, r"eos_idx=0 is the model's pad id \(config.pad_idx=0\)"),
    ({"bos_idx": PAD}, ValueError, r"bos_idx=0 is the model's pad id"),
    ({"pad_idx": 3}, ValueError, r"pad_idx=3 differs from the model's config.pad_idx=0"),
    ({"pad_idx": 99}, ValueError, r"pad_idx=99 differs from the model's config.pad_idx=0"),
    ({"src": torch.zeros(0, 4, dtype=torch.long)}, ValueError,
     r"src must hold at least one sequence, got shape \(0, 4\)"),
    ({"src": torch.full((2, 3), 11)}, ValueError, r"src contains token id 11, outside"),
    ({"max_len": 0}, ValueError, r"max_len must be positive"),
    ({"max_len": 40}, ValueError, r"positional table has max_len=40"),
])
def test_decoders_refuse_bad_arguments(decoder, overrides, exc, message):
    with pytest.raises(exc, match=message):
        bad_call(decoder, **overrides)()


@pytest.mark.parametrize("penalty, exc, message", [
    (float("nan"), ValueError, r"length_penalty must be a finite number >= 0, got nan"),
    (float("inf"), ValueError, r"finite number >= 0, got inf"),
    (-0.5, ValueError, r"finite number >= 0, got -0.5"),
    ("0.6", TypeError, r"length_penalty must be a float >= 0, got str"),
])
def test_beam_refuses_bad_length_penalty(penalty, exc, message):
    with pytest.raises(exc, match=message):
        bad_call(tx.beam_search, length_penalty=penalty)()


def test_memory_of_another_dtype_is_refused():
    model = random_model(torch.float32, seed=3)
    src = padded_src(2, seed=3)
    memory = model.encode(src).double()  # (N, L_src, d_model) float64
    with pytest.raises(TypeError, match=r"memory has dtype torch.float64, but the model's "
                                        r"weights are torch.float32"):
        model.decode(torch.full((2, 1), BOS), memory)


def test_translate_refuses_a_vocabulary_with_another_pad_id():
    model = tx.Transformer(tx.ModelConfig(src_vocab_size=len(DATE_VOCAB),
                                          tgt_vocab_size=len(DATE_VOCAB)))  # pad_idx=1
    with pytest.raises(ValueError, match=r"vocabulary's pad id \(0\) differs from the model's "
                                         r"config.pad_idx \(1\)"):
        translate(model, ["1 Jan 2000"], DATE_VOCAB)


@pytest.mark.parametrize("bos, eos", [(3, 4), (10, 5), (5, 10)])
def test_cached_equals_uncached_for_accepted_special_ids(bos, eos):
    """Any accepted BOS/EOS pair (not PAD, not equal) decodes the same with and without cache."""
    model = random_model(torch.float32, seed=bos + eos)
    src = padded_src(6, seed=bos)
    for decoder in (greedy_decode, tx.beam_search):
        plain = decoder(model, src, bos_idx=bos, eos_idx=eos, max_len=15, use_cache=False)
        cached = decoder(model, src, bos_idx=bos, eos_idx=eos, max_len=15, use_cache=True)
        if decoder is greedy_decode:
            assert torch.equal(plain, cached)
        else:
            assert torch.equal(plain.tokens, cached.tokens)
            torch.testing.assert_close(plain.scores, cached.scores)


def test_token_checks_run_once_per_entry_point(monkeypatch):
    """check_tokens (a host sync on CUDA) runs at the public entry point only: twice for one
    forward (src and tgt), once for a whole 10-step cached greedy decode (src), once for a
    direct encode or decode call; the inner encode/decode/stack calls skip it."""
    import tx_helpers._checks as checks
    import tx_helpers.decoding as decoding
    import tx_helpers.model as model_module

    calls = []
    real = checks.check_tokens

    def counting(name, ids, vocab_size):
        calls.append(name)
        real(name, ids, vocab_size)

    for module in (checks, decoding, model_module):
        monkeypatch.setattr(module, "check_tokens", counting)
    model = random_model(torch.float32).eval()
    model.generator.bias.data[EOS] = -1e4  # never ends: exactly 10 steps
    src = padded_src(3, seed=0)
    with torch.no_grad():
        model(src, torch.full((3, 4), BOS))
        assert calls == ["src", "tgt"]
        calls.clear()
        out = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=10, use_cache=True)
        assert out.shape == (3, 11) and calls == ["src"]
        calls.clear()
        memory = model.encode(src)
        model.decode(out, memory)
        assert calls == ["src", "tgt"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(src, torch.full((3, 4), 99))  # bad input is still refused at the door
