import pytest
import torch

import tx_helpers as tx
from tx_helpers.data import DATE_VOCAB, date_model_config
from tx_helpers.decoding import exact_match, exact_match_accuracy, greedy_decode, translate

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
