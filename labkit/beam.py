"""Check: a learner's beam-search step, and the driver that turns a step into tx.beam_search.

The exercise (notebook 09) is one step of beam search for one source and K beams::

    beam_step(model, memory, src_mask, cache, alive, alive_scores, *,
              bos_idx, eos_idx, length_penalty)
        -> (alive (K, t+1), alive_scores (K,), finished_tokens (F, t+1), finished_scores (F,))

:func:`run_beam_search` drives such a step (the pool of finished hypotheses, the stopping rule,
the end at ``max_len``) and returns what :func:`tx_helpers.beam_search` returns.
:func:`check_beam_search` probes one step on a state built so that each usual mistake shows
alone (an ``<eos>`` in the top K, survivors whose parents are not in order, a step with
t = 3 so the length penalty is not 1), then runs the whole search against ``tx.beam_search``.
"""
from __future__ import annotations

import copy

import torch

from tx_helpers.attention import KVCache
from tx_helpers.config import ModelConfig
from tx_helpers.decoding import BeamOutput, beam_search, gnmt_length_penalty
from tx_helpers.masks import padding_mask
from tx_helpers.model import Transformer

from .report import CheckResult, _call, _Failed, _Report, _run_check

PAD, BOS, EOS, K, ALPHA, MAX_LEN = 0, 1, 2, 3, 0.6, 7
_PROBE_T = 3  # the probed step makes t = 3 tokens: ((5 + 3) / 6) ** 0.6 = 1.19, not 1
_NEG = float("-inf")
_SHAPES = ("memory (K, L_src, d_model), src_mask (K, 1, L_src), alive (K, t) starting with BOS, "
           "alive_scores (K,); model.decode(alive[:, -1:], memory, src_mask, cache=cache) is "
           "(K, 1, d_model) and model.generator(...[:, -1]) is (K, V)")


def _reference_step(model, memory, src_mask, cache, alive, alive_scores, *, bos_idx, eos_idx,
                    length_penalty, summed=True, log_softmax=True, exclude=True, per_beam=None):
    """One step as tx.beam_search takes it, for one source (the flags plant known mistakes;
    ``per_beam=n`` ranks only each beam's own top n candidates)."""
    k, t = alive.shape
    pad_idx = model.config.pad_idx
    hidden = model.decode(alive[:, -1:], memory, src_mask, cache=cache)  # (K, 1, d_model)
    logits = model.generator(hidden[:, -1])  # (K, V)
    logp = torch.log_softmax(logits, dim=-1) if log_softmax else logits.clone()  # (K, V)
    if exclude:
        logp[:, [pad_idx, bos_idx]] = _NEG
    cand = (alive_scores[:, None] if summed else 0.0) + logp  # (K, V)
    vocab = cand.size(1)
    if per_beam is not None:  # each row keeps its own top n; the rest can never be chosen
        cand = torch.full_like(cand, _NEG).scatter(1, *reversed(cand.topk(per_beam, 1)))
    top, idx = cand.view(-1).topk(2 * k)  # (2K,) best first
    parent, token = idx // vocab, idx % vocab  # (2K,)
    seqs = torch.cat([alive[parent], token[:, None]], dim=1)  # (2K, t+1)
    is_eos = token == eos_idx  # (2K,): at most K of them, one per beam
    fin = is_eos & (torch.arange(2 * k) < k)  # EOS candidates ranked in the top K
    live_scores, pos = top.masked_fill(is_eos, _NEG).topk(k)  # (K,)
    cache.reorder(parent[pos])
    return (seqs[pos], live_scores, seqs[fin],
            top[fin] / gnmt_length_penalty(t, length_penalty))


_lp = gnmt_length_penalty


@torch.no_grad()
def run_beam_search(step_fn, model, src, *, bos_idx: int, eos_idx: int, max_len: int,
                    beam_size: int = 4, length_penalty: float = 0.6) -> BeamOutput:
    """Beam search from ``src`` (N, L_src), one source at a time, with ``step_fn`` as its step.

    Keeps each source's pool of the ``beam_size`` best finished hypotheses, stops a source as
    ``tx.beam_search`` does (the pool is full and the best live prefix, scored at its current
    length, does not beat the worst of it), and at ``max_len`` adds the live prefixes scored
    at that length. Returns ``BeamOutput(tokens (N, beam_size, L), scores (N, beam_size))``.
    """
    pad_idx, k = model.config.pad_idx, beam_size
    was_training = model.training
    model.eval()
    try:
        results = []
        for row in src:
            row = row[None]  # (1, L_src)
            row_mask = padding_mask(row, pad_idx)  # (1, 1, L_src)
            memory = model.encode(row, row_mask).repeat_interleave(k, dim=0)  # (K, L_src, d)
            row_mask = row_mask.repeat_interleave(k, dim=0)  # (K, 1, L_src)
            cache = KVCache()
            alive = torch.full((k, 1), bos_idx, dtype=torch.long, device=src.device)  # (K, 1)
            alive_scores = torch.full((k,), _NEG, device=src.device)  # (K,)
            alive_scores[0] = 0.0  # one real start; the copies keep the shapes fixed
            pool: list[tuple[torch.Tensor, torch.Tensor]] = []  # (score, tokens)
            for t in range(1, max_len + 1):
                nxt, nxt_scores, fin_tokens, fin_scores = step_fn(
                    model, memory, row_mask, cache, alive, alive_scores, bos_idx=bos_idx,
                    eos_idx=eos_idx, length_penalty=length_penalty)
                pool = sorted(pool + list(zip(fin_scores, fin_tokens, strict=True)),
                              key=lambda p: -float(p[0]))[:k]
                best_live = nxt_scores[0] / _lp(t, length_penalty)
                if len(pool) == k and bool(pool[-1][0] >= best_live):
                    break
                alive, alive_scores = nxt, nxt_scores
            else:
                live = list(zip(alive_scores / _lp(max_len, length_penalty), alive, strict=True))
                pool = sorted(pool + live, key=lambda p: -float(p[0]))[:k]
            results.append(pool)
        width = max(len(tokens) for pool in results for _, tokens in pool)
        tokens = torch.full((len(results), k, width), pad_idx, dtype=torch.long,
                            device=src.device)  # (N, K, L)
        scores = torch.full((len(results), k), _NEG, device=src.device)  # (N, K)
        for i, pool in enumerate(results):
            for j, (score, hyp) in enumerate(pool):
                tokens[i, j, : len(hyp)] = hyp
                scores[i, j] = score
        return BeamOutput(tokens, scores)
    finally:
        model.train(was_training)


def _probe_model() -> Transformer:
    """A random 2-layer model; the biases make EOS likely enough to finish inside the top K."""
    config = ModelConfig(src_vocab_size=13, tgt_vocab_size=11, d_model=32, n_heads=4, d_ff=64,
                         n_layers=2, dropout=0.0, max_len=16, pad_idx=PAD)
    torch.manual_seed(_SEED)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.generator.bias.add_(torch.tensor(_BIAS))
    return model


_SEED = 12  # with these, the probed step has all the properties the module docstring lists
_BIAS = [1.0, 1.0, 1.2] + [0.0] * 8  # PAD, BOS, EOS, then the other tokens
_SECOND_T = 2  # source 2's second step: <eos> ranked 3rd and 6th of the top 2K
_SRC = torch.tensor([[5, 9, 3, 12, 7, 4], [8, 4, 11, 0, 0, 0], [10, 3, 6, 5, 0, 0]])  # pad 0


def _probe_state(model, source: int = 0, t: int = _PROBE_T):
    """The source, memory, mask, cache and beams before the probed step that makes t tokens
    (reference steps)."""
    row = _SRC[source:source + 1]
    mask = padding_mask(row, PAD)  # (1, 1, L_src)
    memory = model.encode(row, mask).repeat_interleave(K, dim=0)  # (K, L_src, d_model)
    mask = mask.repeat_interleave(K, dim=0)  # (K, 1, L_src)
    cache = KVCache()
    alive = torch.full((K, 1), BOS, dtype=torch.long)  # (K, 1)
    scores = torch.tensor([0.0] + [_NEG] * (K - 1))
    for _ in range(t - 1):
        alive, scores, _, _ = _reference_step(model, memory, mask, cache, alive, scores,
                                              bos_idx=BOS, eos_idx=EOS, length_penalty=ALPHA)
    return memory, mask, cache, alive, scores


def _rows(tokens, scores):
    """{tuple of ids: score} for a set of hypotheses."""
    return {tuple(int(x) for x in hyp): float(s) for hyp, s in zip(tokens, scores, strict=True)}


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 + 1e-4 * abs(b)


def _check_outputs(report: _Report, out, t: int, short: str = "beam_top_k_only"):
    if not (isinstance(out, (tuple, list)) and len(out) == 4
            and all(isinstance(x, torch.Tensor) for x in out)):
        report.probe(False, "returns four tensors (alive, alive_scores, finished_tokens, "
                     f"finished_scores), got {type(out).__name__}")
        report.mistake("wrong_output_type", None, "return alive (K, t+1), alive_scores (K,), "
                       "finished_tokens (F, t+1), finished_scores (F,)")
        raise _Failed
    alive, scores, fin_tokens, fin_scores = out
    shapes = (tuple(alive.shape) == (K, t + 1) and tuple(scores.shape) == (K,)
              and fin_tokens.dim() == 2 and fin_tokens.size(1) == t + 1
              and tuple(fin_scores.shape) == (fin_tokens.size(0),))
    if (not shapes and alive.dim() == 2 and alive.size(1) == t + 1 and alive.size(0) < K
            and alive.size(0) + fin_tokens.size(0) == K):
        report.probe(False, f"the step returns K = {K} live prefixes (got {alive.size(0)}, "
                     f"and {fin_tokens.size(0)} finished)")
        report.mistake(short)  # too few ranked: all K, or each beam's own K (first step)
        raise _Failed
    if not report.probe(shapes, f"shapes: alive (K, t+1) = ({K}, {t + 1}), alive_scores ({K},), "
                        f"finished (F, {t + 1}) and (F,); got {tuple(alive.shape)}, "
                        f"{tuple(scores.shape)}, {tuple(fin_tokens.shape)}, "
                        f"{tuple(fin_scores.shape)}"):
        report.mistake("wrong_output_shape")
        raise _Failed
    return alive.long(), scores.float(), fin_tokens.long(), fin_scores.float()


def _score_parts(model, memory, mask, cache, alive, scores):
    """Per (parent, token): the summed score and the known wrong ones, from a copy of the cache."""
    hidden = model.decode(alive[:, -1:], memory, mask, cache=copy.deepcopy(cache))
    logits = model.generator(hidden[:, -1])  # (K, V)
    logp = torch.log_softmax(logits, dim=-1)
    renorm = logits.clone()
    renorm[:, [PAD, BOS]] = _NEG
    return {"right": scores[:, None] + logp, "beam_logp_not_summed": logp,
            "beam_no_log_softmax": scores[:, None] + logits,
            "beam_renormalised": scores[:, None] + torch.log_softmax(renorm, dim=-1)}


def _probe_live(report, model, state, mine, expected):
    memory, mask, cache, alive, scores = state
    live, live_scores = mine[0], mine[1]
    ends_eos = bool((live[:, -1] == EOS).any())
    if not report.probe(not ends_eos, "no live prefix ends in <eos> (a finished hypothesis "
                        "leaves the beam)"):
        report.mistake("beam_finished_expanded")
    parents = [next((j for j in range(K) if torch.equal(live[i, :-1], alive[j])), None)
               for i in range(K)]
    tokens = live[:, -1].tolist()
    if any(tok in (PAD, BOS) for tok in tokens):
        report.mistake("beam_pad_bos_not_excluded")
    parts = _score_parts(model, memory, mask, cache, alive, scores)
    if None in parents:
        report.probe(False, "every live prefix extends one of the K prefixes it was given by "
                     "one token")
        report.mistake("mismatch", "a returned prefix is not an old prefix plus one token")
        return
    got = live_scores.tolist()
    for key, table in parts.items():
        if all(_same(got[i], float(table[parents[i], tokens[i]])) for i in range(K)):
            ok = report.probe(key == "right", "each live score is its parent's score plus the "
                              "new token's log-probability (softmax over the whole vocabulary)")
            if not ok:
                report.mistake(key)
            break
    else:
        report.probe(False, "each live score is its parent's score plus the new token's "
                     "log-probability (softmax over the whole vocabulary)")
        report.mistake("mismatch", "the live scores match none of the known mistakes")
    same = torch.equal(live, expected[0]) and torch.allclose(live_scores, expected[1],
                                                             atol=1e-4)
    if not report.probe(same, "the K live prefixes, best first, are tx's: the best non-<eos> "
                        "candidates over all K x V extensions"):
        if torch.equal(live, expected[0]) or (report.found and not report.only_mismatch()):
            return  # the right prefixes in the right order, or a named mistake explains them
        if (not ends_eos and sorted(map(tuple, live.tolist())) == sorted(
                map(tuple, expected[0].tolist()))):
            report.mistake("beam_live_not_sorted")
        else:
            report.mistake("beam_wrong_selection")


def _probe_finished(report, mine, expected, t):
    got, want = _rows(mine[2], mine[3]), _rows(expected[2], expected[3])
    if not report.probe(set(got) == set(want), f"the finished hypotheses are the <eos> "
                        f"candidates ranked in the top K ({len(want)} here)"):
        if report.found:  # wrong scores or a finished beam kept live: the set follows from it
            return
        if not got:
            report.mistake("beam_finished_expanded", "no hypothesis was finished")
        else:
            report.mistake("beam_finished_wrong_set")
        return
    raw = {h: s * _lp(t, ALPHA) for h, s in want.items()}
    ok = all(_same(got[h], want[h]) for h in want)
    if not report.probe(ok, f"a finished score is its summed log-probability divided by the "
                        f"GNMT length penalty (alpha {ALPHA}: {_lp(t, ALPHA):.2f} for these "
                        f"hypotheses)"):
        if all(_same(got[h], raw[h]) for h in want):
            report.mistake("beam_no_length_penalty")
        elif any(all(_same(got[h], raw[h] / _lp(n, ALPHA)) for h in want) for n in (t + 1, t - 1)):
            report.mistake("beam_penalty_length_off")
        elif not report.found:
            report.mistake("mismatch", "the finished scores match none of the known mistakes")


def _probe_top_k_only(report: _Report, fn, model) -> None:
    """A second step (source 2, t = 2) whose top 2K holds two <eos> candidates, ranked 3rd and
    6th: only the first is finished."""
    memory, mask, cache, alive, scores = _probe_state(model, source=2, t=_SECOND_T)
    expected = _reference_step(model, memory, mask, copy.deepcopy(cache), alive, scores,
                               bos_idx=BOS, eos_idx=EOS, length_penalty=ALPHA)
    out = _call(report, f"fn(...) on a second state (alive {tuple(alive.shape)})", fn, model,
                memory, mask, copy.deepcopy(cache), alive.clone(), scores.clone(),
                bos_idx=BOS, eos_idx=EOS, length_penalty=ALPHA, shape_hint=_SHAPES)
    mine = _check_outputs(report, out, alive.size(1))
    got, want = set(_rows(mine[2], mine[3])), set(_rows(expected[2], expected[3]))
    if report.probe(got == want, f"with two <eos> candidates in the top 2K, one ranked below "
                    f"the top K, the finished hypotheses are the top K's ({len(want)} here)"):
        return
    hidden = model.decode(alive[:, -1:], memory, mask, cache=copy.deepcopy(cache))
    logp = torch.log_softmax(model.generator(hidden[:, -1]), dim=-1)  # (K, V)
    logp[:, [PAD, BOS]] = _NEG
    idx = (scores[:, None] + logp).view(-1).topk(2 * K).indices  # (2K,) best first
    parent, token = idx // logp.size(1), idx % logp.size(1)  # (2K,)
    seqs = torch.cat([alive[parent], token[:, None]], dim=1)[token == EOS]  # (F', t+1)
    every = {tuple(int(x) for x in hyp) for hyp in seqs}
    report.mistake("beam_finished_from_top_2k" if got == every else "beam_finished_wrong_set")


def _cache_decides(report: _Report, rest: _Report, cache_report: _Report) -> None:
    """A stale cache makes every later step wrong: the check fails on it alone; the step's other
    probes (the shapes too) are a note, for no credit."""
    report.probes = cache_report.probes
    report.found.update(cache_report.found)
    report.found.update({k: v for k, v in rest.found.items() if k != "mismatch"})
    wrong = "; ".join(text for ok, text in rest.probes if not ok)
    report.note(f"the cache decides this check: with it wrong, every later step reads another "
                f"hypothesis's history, so the step's other {len(rest.probes) + 1} probes earn "
                "nothing; of them, " + (f"these failed: {wrong}" if wrong else "all passed (the "
                "shapes, the live prefixes and their scores, the finished hypotheses)"))


def _probe_first_step(report: _Report, fn, model) -> None:
    """The first step of source 1 (one real beam, the K - 1 copies at -inf): every survivor
    extends beam 0, which needs more than its own top K candidates when one of them is <eos>."""
    memory, mask, cache, alive, scores = _probe_state(model, source=1, t=1)
    expected = _reference_step(model, memory, mask, copy.deepcopy(cache), alive, scores,
                               bos_idx=BOS, eos_idx=EOS, length_penalty=ALPHA)
    out = _call(report, "fn(...) on a first step (alive (K, 1), one real beam)", fn, model,
                memory, mask, copy.deepcopy(cache), alive.clone(), scores.clone(),
                bos_idx=BOS, eos_idx=EOS, length_penalty=ALPHA, shape_hint=_SHAPES)
    mine = _check_outputs(report, out, 1, short="beam_per_beam_top_k")
    if report.probe(torch.equal(mine[0], expected[0])
                    and torch.allclose(mine[1], expected[1], atol=1e-4),
                    "on a first step (one real beam, an <eos> among its top K) the K live "
                    "prefixes all extend that beam"):
        return
    per_beam = _reference_step(model, memory, mask, copy.deepcopy(cache), alive, scores,
                               bos_idx=BOS, eos_idx=EOS, length_penalty=ALPHA, per_beam=K)
    real = per_beam[1].isfinite()  # the copies' -inf candidates tie: any of them will do
    same = (torch.equal(mine[1].isfinite(), real) and torch.equal(mine[0][real], per_beam[0][real])
            and torch.allclose(mine[1][real], per_beam[1][real], atol=1e-4))
    report.mistake("beam_per_beam_top_k" if same else "beam_wrong_selection")


def _probe_cache(report, model, state, mine, cache_after):
    """The next step with the learner's cache must equal decoding the learner's prefixes whole."""
    memory, mask, cache_before, alive, _ = state
    live = mine[0]
    full = model.decode(live, memory, mask)[:, -1]  # (K, d_model)
    length = getattr(cache_after, "length", None)
    if length != alive.size(1):
        report.probe(False, f"the step feeds the newest token through the cache once (its "
                     f"length goes {alive.size(1) - 1} -> {alive.size(1)}, got {length})")
        report.mistake("beam_cache_unused")
        return
    nxt = model.decode(live[:, -1:], memory, mask, cache=copy.deepcopy(cache_after))[:, -1]
    if report.probe(torch.allclose(nxt, full, atol=1e-5), "cache row i holds the history of "
                    "live prefix i (the next cached step equals decoding the prefixes whole)"):
        return
    plain = copy.deepcopy(cache_before)
    model.decode(alive[:, -1:], memory, mask, cache=plain)  # advanced, rows in the old order
    stale = model.decode(live[:, -1:], memory, mask, cache=plain)[:, -1]
    report.mistake("beam_cache_not_reordered" if torch.allclose(nxt, stale, atol=1e-5)
                   else "beam_cache_wrong_index")


def check_beam_search(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn``, one beam-search step (the contract is in this module's docstring).

    Probes one step from a prepared state (K = 3, t = 3, an ``<eos>`` in the top K, parents
    out of order) for each part: the live prefixes and their summed log-probabilities, the
    finished hypotheses and their GNMT length penalty, and the cache (the next cached step
    must equal decoding the returned prefixes whole). A second step (two ``<eos>`` in the
    top 2K, one below the top K) must finish only the top K's. Then :func:`run_beam_search` with
    ``fn`` must equal :func:`tx_helpers.beam_search` on three sources of a random model.
    """

    def body(report: _Report):
        model = _probe_model()
        state = _probe_state(model)
        memory, mask, cache, alive, scores = state
        expected = _reference_step(model, memory, mask, copy.deepcopy(cache), alive, scores,
                                   bos_idx=BOS, eos_idx=EOS, length_penalty=ALPHA)
        mine_cache = copy.deepcopy(cache)
        out = _call(report, f"fn(model, memory {tuple(memory.shape)}, src_mask, cache, alive "
                    f"{tuple(alive.shape)}, alive_scores ({K},), bos_idx={BOS}, eos_idx={EOS}, "
                    f"length_penalty={ALPHA})", fn, model, memory, mask, mine_cache,
                    alive.clone(), scores.clone(), bos_idx=BOS, eos_idx=EOS,
                    length_penalty=ALPHA, shape_hint=_SHAPES)
        mine = _check_outputs(report, out, alive.size(1))
        rest = _Report(report.name)  # the live and finished probes: they count only with the cache
        _probe_live(rest, model, state, mine, expected)
        _probe_finished(rest, mine, expected, alive.size(1))
        cache_report = _Report(report.name)
        _probe_cache(cache_report, model, state, mine, mine_cache)
        if cache_report.found:
            _cache_decides(report, rest, cache_report)
            return
        report.probes += rest.probes + cache_report.probes
        report.found.update(rest.found)
        if report.found:
            return
        _probe_top_k_only(report, fn, model)
        if not report.found:
            _probe_first_step(report, fn, model)
        if report.found:
            return
        want = beam_search(model, _SRC, bos_idx=BOS, eos_idx=EOS, max_len=MAX_LEN,
                           beam_size=K, length_penalty=ALPHA)
        got = _call(report, "run_beam_search(fn, ...) on 3 sources", run_beam_search, fn,
                    model, _SRC, bos_idx=BOS, eos_idx=EOS, max_len=MAX_LEN, beam_size=K,
                    length_penalty=ALPHA)
        same = (got.tokens.shape == want.tokens.shape and torch.equal(got.tokens, want.tokens)
                and torch.allclose(got.scores, want.scores, atol=1e-4))
        if not report.probe(same, f"the whole search driven by your step equals "
                            f"tx.beam_search on 3 sources (beam {K}, alpha {ALPHA})"):
            report.mistake("mismatch", "one step is right but the search differs")

    return _run_check("check_beam_search", body, verbose, fn)
