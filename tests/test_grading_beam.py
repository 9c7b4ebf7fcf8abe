"""labkit.check_beam_search and labkit.run_beam_search: a correct beam step written apart from
labkit's reference (Python loops over candidates, sorting instead of topk) passes, and each
planted mistake is named; the driver with a correct step equals tx.beam_search."""
import math

import pytest
import torch

import labkit as g
import tx_helpers as tx
from labkit import beam as gb

NEG = float("-inf")


def make_step(sum_scores=True, use_log_softmax=True, exclude=True, penalty="gnmt",
              eos_leaves=True, reorder="parent", sort=True, per_beam=False, renormalise=False,
              use_cache=True, ranked=2, beam_keeps=None):
    """A learner's beam step, correct by default; each argument plants one mistake."""

    def beam_step(model, memory, src_mask, cache, alive, alive_scores, *, bos_idx, eos_idx,
                  length_penalty):
        k, t = alive.shape
        pad = model.config.pad_idx
        if use_cache:
            hidden = model.decode(alive[:, -1:], memory, src_mask, cache=cache)[:, -1]
        else:
            hidden = model.decode(alive, memory, src_mask)[:, -1]
        logits = model.generator(hidden)  # (K, V)
        if renormalise:
            logits = logits.masked_fill(torch.isin(torch.arange(logits.size(1)),
                                                   torch.tensor([pad, bos_idx])), NEG)
        logp = logits.log_softmax(-1) if use_log_softmax else logits
        cands = []  # (score, parent, token)
        for b in range(k):
            base = float(alive_scores[b]) if sum_scores else 0.0
            if base == NEG:
                continue
            row = []
            for tok in range(logp.size(1)):
                if exclude and tok in (pad, bos_idx):
                    continue
                row.append((base + float(logp[b, tok]), b, tok))
            row.sort(key=lambda c: -c[0])
            cands += row[:1] if per_beam else row[:beam_keeps]  # per_beam: its own best only
        cands.sort(key=lambda c: -c[0])
        top = cands[: ranked * k]  # ranked=1: only the top K
        finished, live = [], []
        for rank, (score, b, tok) in enumerate(top):
            if tok == eos_idx and eos_leaves:
                if rank < k:
                    length = {"gnmt": t, "none": None, "with_bos": t + 1}[penalty]
                    lp = 1.0 if length is None else ((5 + length) / 6) ** length_penalty
                    finished.append((score / lp, b, tok))
            elif len(live) < k:
                live.append((score, b, tok))
        if not sort:
            live = live[::-1]
        parents = [b for _, b, _ in live]
        new_alive = torch.stack([torch.cat([alive[b], torch.tensor([tok])])
                                 for _, b, tok in live])
        if reorder == "parent":
            cache.reorder(torch.tensor(parents))
        elif reorder == "survivor":
            cache.reorder(torch.arange(k).flip(0))
        fin_tokens = torch.stack([torch.cat([alive[b], torch.tensor([tok])])
                                  for _, b, tok in finished]) if finished else \
            torch.zeros(0, t + 1, dtype=torch.long)
        return (new_alive, torch.tensor([s for s, _, _ in live]), fin_tokens,
                torch.tensor([s for s, _, _ in finished]))

    return beam_step


MISTAKES = {
    "beam_logp_not_summed": make_step(sum_scores=False),
    "beam_no_log_softmax": make_step(use_log_softmax=False),
    "beam_pad_bos_not_excluded": make_step(exclude=False),
    "beam_no_length_penalty": make_step(penalty="none"),
    "beam_penalty_length_off": make_step(penalty="with_bos"),
    "beam_finished_expanded": make_step(eos_leaves=False),
    "beam_cache_not_reordered": make_step(reorder="none"),
    "beam_cache_wrong_index": make_step(reorder="survivor"),
    "beam_cache_unused": make_step(use_cache=False),
    "beam_live_not_sorted": make_step(sort=False),
    "beam_wrong_selection": make_step(per_beam=True),
    "beam_renormalised": make_step(renormalise=True),
    "beam_top_k_only": make_step(ranked=1),
    "beam_per_beam_top_k": make_step(beam_keeps=3),
}


def test_correct_step_passes():
    result = g.check_beam_search(make_step(), verbose=False)
    assert result.passed, result.report
    assert "beam_step" == result.subject


@pytest.mark.parametrize("key", sorted(MISTAKES))
def test_each_mistake_is_named(key):
    result = g.check_beam_search(MISTAKES[key], verbose=False)
    assert not result.passed, result.report
    assert key in result.mistakes, (key, result.mistakes, result.report)
    assert key in g.MISTAKES


def test_the_four_usual_mistakes_are_named_alone():
    """No length penalty, cache not reordered, finished beams expanded, log-probs not summed:
    each is the only mistake its report names."""
    for key in ("beam_no_length_penalty", "beam_cache_not_reordered", "beam_finished_expanded",
                "beam_logp_not_summed"):
        result = g.check_beam_search(MISTAKES[key], verbose=False)
        assert result.mistakes == [key], (key, result.report)


def test_the_probed_step_isolates_each_part():
    """The state the check probes: an <eos> in the top K, survivors whose parents are out of
    order (so a stale cache differs), a length penalty other than 1."""
    with torch.no_grad():
        model = gb._probe_model()
        memory, mask, cache, alive, scores = gb._probe_state(model)
        live, _, fin, _ = gb._reference_step(model, memory, mask, cache, alive, scores,
                                             bos_idx=gb.BOS, eos_idx=gb.EOS,
                                             length_penalty=gb.ALPHA)
    assert fin.size(0) >= 1 and bool(torch.isfinite(scores).all())
    parents = [next(j for j in range(gb.K) if torch.equal(live[i, :-1], alive[j]))
               for i in range(gb.K)]
    assert parents != list(range(gb.K))
    assert not math.isclose(tx.decoding.gnmt_length_penalty(alive.size(1), gb.ALPHA), 1.0)


def test_stub_is_reported_as_not_implemented():
    def beam_step(model, memory, src_mask, cache, alive, alive_scores, *, bos_idx, eos_idx,
                  length_penalty):
        raise NotImplementedError("one step")

    result = g.check_beam_search(beam_step, verbose=False)
    assert result.mistakes == ["not_implemented"], result.report


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_driver_with_a_correct_step_is_tx_beam_search(alpha):
    torch.manual_seed(4)
    cfg = tx.ModelConfig(src_vocab_size=13, tgt_vocab_size=11, d_model=32, n_heads=4, d_ff=64,
                         n_layers=2, dropout=0.1, max_len=16, pad_idx=0)
    model = tx.Transformer(cfg).train()
    with torch.no_grad():
        model.generator.bias[2] += 1.0  # some hypotheses end early
    src = torch.tensor([[5, 9, 3, 12, 7], [8, 4, 0, 0, 0], [10, 3, 6, 5, 0], [4, 4, 4, 0, 0]])
    want = tx.beam_search(model, src, bos_idx=1, eos_idx=2, max_len=9, beam_size=3,
                          length_penalty=alpha)
    got = g.run_beam_search(make_step(), model, src, bos_idx=1, eos_idx=2, max_len=9,
                            beam_size=3, length_penalty=alpha)
    assert model.training  # the caller's mode comes back
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.scores, want.scores)


def test_discovery_pairs_a_beam_step_with_the_check():
    step = make_step()
    found = dict(g.find_checks({"my_beam_step": step}, module=None))
    assert list(found) == ["check_beam_search(my_beam_step)"]


# ------------------------------------------------- mistakes found by a cold reader's own steps

def vector_step(fault=None):
    """A learner's step with topk over K x V, as the notebook's hints suggest; ``fault``
    plants one mistake: 'top2k' finishes every <eos> of the top 2K, 'raw' adds logits, 'renorm'
    renormalises after masking, 'length' scores finished ones one token too long."""

    def beam_step(model, memory, src_mask, cache, alive, alive_scores, *, bos_idx, eos_idx,
                  length_penalty):
        k, t = alive.shape
        logits = model.generator(model.decode(alive[:, -1:], memory, src_mask,
                                              cache=cache)[:, -1])  # (K, V)
        v = logits.size(-1)
        if fault == "renorm":
            logits[:, [model.config.pad_idx, bos_idx]] = NEG
            logp = logits.log_softmax(-1)  # (K, V)
        else:
            logp = logits if fault == "raw" else logits.log_softmax(-1)  # (K, V)
            logp = logp.index_fill(1, torch.tensor([model.config.pad_idx, bos_idx]), NEG)
        total = (alive_scores.unsqueeze(1) + logp).flatten()  # (K * V,)
        best, flat = total.topk(2 * k)  # (2K,)
        beam, tok = flat.div(v, rounding_mode="floor"), flat.remainder(v)  # (2K,)
        hyps = torch.cat([alive.index_select(0, beam), tok.unsqueeze(1)], 1)  # (2K, t+1)
        eos = tok.eq(eos_idx)  # (2K,)
        done = eos if fault == "top2k" else eos & (torch.arange(2 * k) < k)  # (2K,)
        keep = (~eos).nonzero().squeeze(1)[:k]  # (K,) the best non-<eos>, best first
        cache.reorder(beam[keep])
        n = t + 1 if fault == "length" else t
        lp = ((5 + n) / 6) ** length_penalty
        return hyps[keep], best[keep], hyps[done], best[done] / lp

    return beam_step


def test_a_vectorised_right_step_passes():
    result = g.check_beam_search(vector_step(), verbose=False)
    assert result.passed, result.report
    assert "✓ with two <eos> candidates in the top 2K" in result.report, result.report


def test_the_second_state_has_an_eos_below_the_top_k():
    """Source 2's step at t = 2: <eos> ranked in the top K and another ranked below it."""
    with torch.no_grad():
        model = gb._probe_model()
        memory, mask, cache, alive, scores = gb._probe_state(model, 2, gb._SECOND_T)
        logp = model.generator(model.decode(alive[:, -1:], memory, mask, cache=cache)[:, -1])
        logp = logp.log_softmax(-1)
        logp[:, [gb.PAD, gb.BOS]] = NEG
        idx = (scores[:, None] + logp).flatten().topk(2 * gb.K).indices
    ranks = [r for r, i in enumerate(idx.tolist()) if i % logp.size(1) == gb.EOS]
    assert len(ranks) >= 2 and min(ranks) < gb.K <= max(ranks), ranks


def test_eos_from_the_whole_top_2k_is_named():
    result = g.check_beam_search(vector_step("top2k"), verbose=False)
    assert not result.passed and result.mistakes == ["beam_finished_from_top_2k"], result.report
    assert "✗ with two <eos> candidates in the top 2K" in result.report, result.report
    assert "match none of the known mistakes" not in result.report, result.report


@pytest.mark.parametrize("fault, key", [("raw", "beam_no_log_softmax"),
                                        ("renorm", "beam_renormalised")])
def test_wrong_scores_do_not_claim_the_prefixes_are_right(fault, key):
    result = g.check_beam_search(vector_step(fault), verbose=False)
    assert not result.passed and key in result.mistakes, result.report
    assert "✗ the K live prefixes, best first" in result.report, result.report
    assert "beam_live_not_sorted" not in result.mistakes, result.report
    assert "not best first" not in result.report, result.report


def test_penalty_off_by_one_prints_no_worked_answer():
    result = g.check_beam_search(vector_step("length"), verbose=False)
    assert result.mistakes == ["beam_penalty_length_off"], result.report
    assert "✗ a finished score is its summed log-probability divided by the GNMT length " \
           "penalty" in result.report, result.report
    assert "(5 +" not in result.report and "** 0.6" not in result.report, result.report


def test_a_stale_cache_decides_the_check():
    """A step right in everything but the cache earns nothing: its other probes are a note."""
    from labkit.marks import mark_result

    result = g.check_beam_search(MISTAKES["beam_cache_not_reordered"], verbose=False)
    assert mark_result("beam_step", result, 2).score == 0, result.report
    assert "the cache decides this check" in result.report and "all passed" in result.report


def test_each_beam_offering_k_plus_one_candidates_passes():
    """Each beam's own top K + 1, then one ranking across beams: enough, and correct."""
    result = g.check_beam_search(make_step(beam_keeps=4), verbose=False)
    assert result.passed, result.report
