"""beam_search: greedy at beam_size=1, sorted and recomputable scores, cache parity, a case
where the beam beats greedy; plus greedy cache parity on right-padded batches."""
import itertools
import math

import pytest
import torch
from torch import nn

import tx_helpers as tx
from tx_helpers.decoding import BeamOutput, beam_search, gnmt_length_penalty, greedy_decode

BOS, EOS, PAD = 1, 2, 0


def random_model(seed=0, dtype=torch.float64, vocab=13, n_layers=2, max_len=40):
    torch.manual_seed(seed)
    cfg = tx.ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32, n_heads=4,
                         d_ff=64, n_layers=n_layers, dropout=0.1, max_len=max_len, pad_idx=PAD)
    return tx.Transformer(cfg).to(dtype).eval()


def padded_src(n, seed, vocab=13, width=9):
    """Random sources, right-padded to random lengths 1..width (at least one full row)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (n, width), generator=g)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    lengths[0] = width
    src[torch.arange(width)[None] >= lengths[:, None]] = PAD
    return src


def teacher_forced_scores(model, src, tokens, alpha):
    """Rescore (N, K, L) hypotheses with one full forward pass per beam slot."""
    n, k, _ = tokens.shape
    out = torch.empty(n, k, dtype=torch.float64)
    for j in range(k):
        hyp = tokens[:, j]  # (N, L)
        logits = model(src, hyp[:, :-1])  # (N, L-1, V)
        logp = torch.log_softmax(logits.double(), dim=-1)
        labels = hyp[:, 1:]
        keep = labels != PAD
        picked = logp.gather(-1, labels[..., None]).squeeze(-1) * keep  # (N, L-1)
        length = keep.sum(-1).double()
        out[:, j] = picked.sum(-1) / gnmt_length_penalty(length, alpha)
    return out


@pytest.mark.parametrize("n", [1, 2, 5, 16])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_size_one_is_greedy(n, alpha):
    model = random_model(seed=n)
    src = padded_src(n, seed=n)
    greedy = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=20)
    for use_cache in (True, False):
        tokens, scores = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=20,
                                     beam_size=1, length_penalty=alpha, use_cache=use_cache)
        assert tokens.shape == (n, 1, greedy.size(1)) and scores.shape == (n, 1)
        assert torch.equal(tokens[:, 0], greedy)


def test_beam_size_one_is_greedy_on_the_dates_task_shape():
    """A float32 model that rarely emits EOS early: rows that hit max_len unfinished."""
    torch.manual_seed(3)
    model = tx.Transformer(tx.date_model_config(d_model=32, n_heads=4, d_ff=64,
                                                n_layers=2)).eval()
    texts = ["30 Nov 2026", "2026年11月30日", "11/30/26", "Monday, 30 November 2026"]
    src = tx.data.pad_sequences([tx.DATE_VOCAB.encode(t) for t in texts], PAD)
    greedy = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=12)
    tokens, _ = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=12, beam_size=1)
    assert torch.equal(tokens[:, 0], greedy)


@pytest.mark.parametrize("n", [1, 3, 8, 17])
@pytest.mark.parametrize("beam_size", [2, 4, 6])
def test_sorted_and_scores_match_teacher_forcing(n, beam_size):
    model = random_model(seed=10 + n)
    src = padded_src(n, seed=10 + n)
    out = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=15, beam_size=beam_size)
    assert isinstance(out, BeamOutput)
    tokens, scores = out
    assert tokens.shape[:2] == (n, beam_size) and scores.shape == (n, beam_size)
    assert tokens.dtype == torch.long and scores.dtype == torch.float64
    assert torch.isfinite(scores).all()
    assert (scores[:, :-1] >= scores[:, 1:]).all()  # best first
    assert (tokens[:, :, 0] == BOS).all() and not (tokens[:, :, 1:] == BOS).any()
    for row in tokens.view(-1, tokens.size(-1)).tolist():  # EOS then only padding
        if EOS in row:
            assert all(t == PAD for t in row[row.index(EOS) + 1:])
        else:
            assert PAD not in row and len(row) == 16
    for r in range(n):  # hypotheses of one row are distinct
        assert len({tuple(h) for h in tokens[r].tolist()}) == beam_size
    torch.testing.assert_close(scores, teacher_forced_scores(model, src, tokens, 0.6))


@pytest.mark.parametrize("n", [2, 7])
def test_cached_equals_uncached(n):
    model = random_model(seed=30 + n, dtype=torch.float64)
    src = padded_src(n, seed=30 + n)
    a = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=18, beam_size=4)
    b = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=18, beam_size=4,
                    use_cache=False)
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.scores, b.scores)


def test_rows_do_not_interact():
    """A row's hypotheses do not depend on the other rows of the batch (or their padding)."""
    model = random_model(seed=5)
    src = padded_src(6, seed=5)
    together = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=12, beam_size=3)
    for r in range(6):
        row = src[r:r + 1]
        row = row[:, : int((row != PAD).sum())]  # strip its padding
        alone = beam_search(model, row, bos_idx=BOS, eos_idx=EOS, max_len=12, beam_size=3)
        length = alone.tokens.size(-1)
        assert torch.equal(together.tokens[r, :, :length], alone.tokens[0])
        assert (together.tokens[r, :, length:] == PAD).all()
        torch.testing.assert_close(together.scores[r], alone.scores[0])


def test_unfinished_rows_are_returned_at_max_len():
    model = random_model(seed=2)
    with torch.no_grad():  # EOS is never likely: every hypothesis runs to max_len
        model.generator.bias[EOS] = -1e4
    tokens, scores = beam_search(model, padded_src(3, 2), bos_idx=BOS, eos_idx=EOS, max_len=7,
                                 beam_size=3)
    assert tokens.shape == (3, 3, 8) and not (tokens == EOS).any() and not (tokens == PAD).any()
    assert torch.isfinite(scores).all() and (scores[:, :-1] >= scores[:, 1:]).all()


def test_length_penalty_formula():
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(7, 0.0) == 1.0
    assert math.isclose(gnmt_length_penalty(10, 0.6), (15 / 6) ** 0.6)


class MarkovModel(nn.Module):
    """A stand-in 'model' whose next-token distribution depends only on the last token.

    It has what beam_search and greedy_decode use: config, encode, decode, generator.
    decode returns the one-hot of each position's token; generator's weight holds the
    log transition probabilities, so logits = log P(next | last).
    """

    def __init__(self, transitions, vocab):
        super().__init__()
        self.config = tx.ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=vocab,
                                     n_heads=1, d_ff=4, n_layers=1, max_len=16, pad_idx=PAD)
        probs = torch.full((vocab, vocab), 1e-12, dtype=torch.float64)
        for prev, row in transitions.items():
            for nxt, p in row.items():
                probs[prev, nxt] = p
        self.generator = nn.Linear(vocab, vocab, bias=False).double()
        with torch.no_grad():
            self.generator.weight.copy_(probs.log().T)  # logits[next] = log P(next | prev)

    def encode(self, src, src_mask=None):
        return torch.zeros(src.size(0), src.size(1), self.config.d_model, dtype=torch.float64)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None, cache=None):
        return nn.functional.one_hot(tgt, self.config.d_model).double()  # (N, L, V)


def test_beam_finds_a_more_probable_sequence_than_greedy():
    # tokens: 3=a 4=b 5=c 6=x 7=y 8=z.  BOS -> a 0.6 | b 0.4;  a -> x 0.4 | y 0.3 | z 0.3;
    # b -> c 0.9 | x 0.1; everything else -> EOS.  Greedy takes a (0.6) then x: 0.24.
    # The best sequence is b c: 0.36.
    a, b, c, x, y, z = 3, 4, 5, 6, 7, 8
    rows = {BOS: {a: 0.6, b: 0.4}, a: {x: 0.4, y: 0.3, z: 0.3}, b: {c: 0.9, x: 0.1}}
    rows.update({t: {EOS: 1.0} for t in (c, x, y, z)})
    model = MarkovModel(rows, vocab=9)
    src = torch.tensor([[3, 4]])
    greedy = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=5)
    assert greedy.tolist() == [[BOS, a, x, EOS]]
    for use_cache in (True, False):
        tokens, scores = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=5,
                                     beam_size=2, length_penalty=0.0, use_cache=use_cache)
        assert tokens[0, 0].tolist() == [BOS, b, c, EOS]
        assert tokens[0, 1].tolist() == [BOS, a, x, EOS]
        torch.testing.assert_close(scores[0], torch.tensor([0.36, 0.24]).double().log())
    one = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=5, beam_size=1)
    assert torch.equal(one.tokens[:, 0], greedy)


def test_length_penalty_prefers_longer_hypotheses():
    # BOS -> EOS 0.5 | a 0.5;  a -> EOS 0.95 | b 0.05.  Without a penalty "" (0.5) beats
    # "a" (0.475); with alpha=2 the two-token hypothesis is divided by less: -0.547 > -0.693.
    a, b = 3, 4
    rows = {BOS: {EOS: 0.5, a: 0.5}, a: {EOS: 0.95, b: 0.05}, b: {EOS: 1.0}}
    model = MarkovModel(rows, vocab=5)
    src = torch.tensor([[3]])
    short = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=6, beam_size=2,
                        length_penalty=0.0)
    assert short.tokens[0, 0].tolist() == [BOS, EOS, PAD]
    torch.testing.assert_close(short.scores, teacher_free_scores(rows, short.tokens, 0.0))
    long = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=6, beam_size=2,
                       length_penalty=2.0)
    assert long.tokens[0, 0].tolist() == [BOS, a, EOS]
    torch.testing.assert_close(long.scores, teacher_free_scores(rows, long.tokens, 2.0))


def teacher_free_scores(rows, tokens, alpha):
    """Exact scores of hypotheses under a Markov chain (a check that does not use the model)."""
    out = torch.empty(tokens.shape[:2], dtype=torch.float64)
    for r, hyps in enumerate(tokens.tolist()):
        for j, hyp in enumerate(hyps):
            hyp = [t for t in hyp if t != PAD]
            logp = sum(math.log(rows[p].get(nx, 1e-12)) for p, nx in itertools.pairwise(hyp))
            out[r, j] = logp / gnmt_length_penalty(len(hyp) - 1, alpha)
    return out


def test_mode_restored_and_argument_checks():
    model = random_model(seed=1)
    model.train()
    src = padded_src(2, 1)
    a = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8)
    b = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8)
    assert model.training and torch.equal(a.tokens, b.tokens)  # eval inside: no dropout
    with pytest.raises(ValueError, match="beam_size=11 is too large"):
        beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8, beam_size=11)
    with pytest.raises(ValueError, match="positional table"):
        beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=40)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8, length_penalty=-1.0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8, beam_size=0)


@pytest.mark.parametrize("n", [1, 4, 9, 32])
def test_greedy_cache_parity_with_padding_and_long_outputs(n):
    """greedy_decode(use_cache=True) == use_cache=False on right-padded batches, with EOS
    suppressed so every row runs the full 30 steps (long caches, float32)."""
    model = random_model(seed=50 + n, dtype=torch.float32, n_layers=3)
    with torch.no_grad():
        model.generator.bias[EOS] = -1e4
    src = padded_src(n, seed=50 + n, width=12)
    plain = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=30)
    cached = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=30, use_cache=True)
    assert plain.shape == (n, 31) and torch.equal(plain, cached)


def test_early_truncated_hypotheses_do_not_end_the_search():
    """Unlikely early EOS candidates fill the pool of finished hypotheses before the likely
    output ends; stopping as soon as beam_size are finished would return a truncated output."""
    a, b, c = 3, 4, 5
    rows = {BOS: {a: 0.97, EOS: 0.03}, a: {b: 0.97, EOS: 0.03}, b: {c: 0.97, EOS: 0.03},
            c: {EOS: 1.0}}
    model = MarkovModel(rows, vocab=7)
    src = torch.tensor([[3, 4]])
    greedy = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8)
    assert greedy.tolist() == [[BOS, a, b, c, EOS]]
    for alpha in (0.0, 0.6):
        out = beam_search(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8, beam_size=2,
                          length_penalty=alpha)
        assert torch.equal(out.tokens[:, 0], greedy)
        torch.testing.assert_close(out.scores, teacher_free_scores(rows, out.tokens, alpha))
