"""labkit.silent_bugs (notebook 10's lab): each suspect is exposed by its one measurement, and
the checks of the fixes pass correct code and name the usual mistakes."""
from __future__ import annotations

import inspect
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import labkit
import tx_helpers as tx
from labkit import leak_map
from labkit import silent_bugs as sb

V, PAD, BOS, EOS, L = 16, 0, 1, 2, 8


def config(**kw):
    return tx.ModelConfig(**{**dict(src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4,
                                    d_ff=64, n_layers=2, dropout=0.0, pad_idx=PAD, max_len=32),
                             **kw})


def good_batches(n, batch_size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        src = torch.randint(3, V, (batch_size, L), generator=g)
        tgt = torch.cat([torch.full((batch_size, 1), BOS), src.flip(1),
                         torch.full((batch_size, 1), EOS)], 1)
        yield src, tgt[:, :-1], tgt[:, 1:]


SRC, TGT_IN, TGT_OUT = next(good_batches(1, 64, seed=9))


# ---------------------------------------------------------------- the four measurements

def pads_change(model):
    padded = F.pad(SRC, (0, 3), value=PAD)
    with torch.no_grad():
        return (model(SRC, TGT_IN) - model(padded, TGT_IN)).abs().max().item() > 1e-4


def sees_future(model, t=3):
    changed = TGT_IN.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1 - 3) % (V - 3) + 3
    with torch.no_grad():
        return (model(SRC, TGT_IN)[:, t] - model(SRC, changed)[:, t]).abs().max().item() > 1e-4


def entropy(model):
    with torch.no_grad():
        model.encode(SRC)
    w = torch.stack([layer.self_attn.attn_weights for layer in model.encoder.layers])
    return -torch.xlogy(w, w).sum(-1).mean().item()


def gap_reading(batches, steps=60):
    """Teacher-forced accuracy (last 10 steps) minus free-running accuracy after ``steps``."""
    torch.manual_seed(0)
    model = tx.Transformer(config())
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda e: 1e-2 * min((e + 1) / 30, math.sqrt(30 / (e + 1))))
    h = tx.train(model, itertools.islice(batches, steps), opt, sched, label_smoothing=0.0)
    ys = tx.greedy_decode(model, SRC, bos_idx=BOS, eos_idx=EOS, max_len=L + 1)
    pred = F.pad(ys[:, 1:], (0, L + 2 - ys.size(1)), value=PAD)
    free = (pred == TGT_OUT).float().mean().item()
    forced = sum(h.accuracy[-10:]) / 10
    return forced, forced - free


def gap(batches, steps=60):
    forced, difference = gap_reading(batches, steps)
    return forced > 0.9 and difference > 0.3


def future_count(model):
    return sum(sees_future(model, t) for t in range(TGT_IN.size(1) - 1))


NB_SRC, NB_IN, _ = next(good_batches(1, 200, seed=123))  # notebook 10's test batch


def pads_reading(model):
    padded = F.pad(NB_SRC, (0, 3), value=PAD)
    with torch.no_grad():
        return (model(NB_SRC, NB_IN) - model(padded, NB_IN)).abs().max().item()


def entropy_on(model, src):
    with torch.no_grad():
        model.encode(src)
    w = torch.stack([layer.self_attn.attn_weights for layer in model.encoder.layers])
    return -torch.xlogy(w, w).sum(-1).mean().item()


def readings_of(pipelines):
    """A learner's honest table, read as notebook 10's read_ functions read it."""
    torch.manual_seed(0)
    clean = entropy_on(tx.Transformer(config()), NB_SRC)
    return {name: {"future": future_count(p.model().eval()), "pads": pads_reading(p.model()),
                   "gap": gap_reading(p.batches(40), 40)[1],
                   "entropy": entropy_on(p.model(), NB_SRC) / clean}
            for name, p in pipelines.items()}


@pytest.fixture(scope="module")
def readings():
    return readings_of({name: sb.suspect(name, config()) for name in sb.PIPELINES})


def graded(name):
    """The one measurement that the private oracle accepts for suspect ``name``."""
    (answer,) = [m for m in sb.MEASUREMENTS if sb._is_exposed_by(name, m)]
    return answer


def test_the_graded_answer_reads_any_case_and_quotes_and_refuses_the_rest():
    assert sb._is_exposed_by("A", ' "PADS" ') and not sb._is_exposed_by("A", ...)
    assert not sb._is_exposed_by("B", "pads") and not sb._is_exposed_by("C", "gap")
    with pytest.raises(ValueError, match="name must be one of"):
        sb._is_exposed_by("D", "pads")


@pytest.fixture(autouse=True)
def fresh_session():
    sb._ASKED.clear()  # each test is a fresh kernel: one answer per suspect
    yield
    sb._ASKED.clear()


def test_the_readers_one_liner_no_longer_grades():
    # a cold reader's game: loop the public oracle over the four answers, no measurement run
    answers = ("future", "pads", "gap", "entropy")
    with pytest.raises(AttributeError):
        {n: next(m for m in answers if sb.is_exposed_by(n, m)) for n in "ABC"}
    # the same loop through the verdict, without a table of readings, credits nothing
    for name in "ABC":
        assert all(sb.verdict({}, name, m) != m for m in answers)
        assert all(sb.verdict(None, name, m).startswith("no credit yet") for m in answers)


def test_an_honest_table_credits_the_right_answers_only(readings):
    for name in "ABC":
        right = graded(name)
        assert sb.verdict(readings, name, right) == right
        assert sb.verdict(readings, name, f" '{right.upper()}' ") == f" '{right.upper()}' "
        for wrong in set(sb.MEASUREMENTS) - {right}:
            sb._ASKED.clear()
            assert sb.verdict(readings, name, wrong) == sb.NOT_CREDITED
    with pytest.raises(ValueError, match="name must be one of"):
        sb.verdict(readings, "control", "pads")


def test_the_same_loop_over_the_verdict_with_an_honest_table_earns_nothing(readings):
    # the reader's one-liner again, now through the verdict and a measured table: the first
    # answer asked is each suspect's only one, so trying the four in turn credits none
    looped = {n: next((m for m in sb.MEASUREMENTS if sb.verdict(readings, n, m) == m), None)
              for n in "ABC"}
    assert looped == {"A": None, "B": None, "C": None}
    assert "already answered 'future'" in sb.verdict(readings, "A", graded("A"))
    sb._ASKED.clear()  # a restarted kernel: the right answer is credited
    assert sb.verdict(readings, "A", graded("A")) == graded("A")
    assert sb.verdict(readings, "A", ...) == sb.NOT_CREDITED  # no answer yet: not recorded


def test_an_incomplete_table_is_named_not_graded(readings):
    partial = {name: dict(row) for name, row in readings.items()}
    del partial["B"]["gap"]
    partial["C"]["entropy"] = float("nan")
    message = sb.verdict(partial, "A", graded("A"))
    assert message.startswith("no credit yet") and "readings['B']['gap']" in message
    assert "readings['C']['entropy']" in message


def test_a_made_up_table_earns_nothing(readings):
    # every suspect read as the control, or one suspect's readings swapped for another's:
    # neither agrees with the lab kit's own re-measurement
    same = {name: dict(readings["control"]) for name in sb.PIPELINES}
    swapped = {**readings, "A": readings["C"], "C": readings["A"]}
    # a table that sets the right suspects apart but was typed, not measured: its pads and
    # entropy numbers are not the kit's (the brute force over 27 typed tables earns nothing)
    typed = {name: {"future": 0, "pads": 0.0, "gap": 0.0, "entropy": 1.0} for name in sb.PIPELINES}
    typed["A"]["pads"], typed["B"]["gap"], typed["C"]["entropy"] = 0.5, 0.9, 0.5
    for table in (same, swapped, typed):
        for name in "ABC":
            assert all(sb.verdict(table, name, m) != m for m in sb.MEASUREMENTS)
    assert sb.verdict(same, "A", "pads").startswith("no credit: these readings disagree")


def test_what_help_shows_does_not_name_the_bugs():
    # the handout ships labkit: help(silent_bugs) must not answer the lab's questions
    assert not hasattr(sb, "EXPOSED_BY") and not hasattr(sb, "is_exposed_by")
    for name in ("suspect_model", "suspect_batches", "suspect_init"):
        assert not hasattr(sb, name)  # which part of a pipeline is faulty is not in a public name
    docs = [sb.__doc__] + [inspect.getdoc(obj) or "" for name, obj in vars(sb).items()
                           if not name.startswith("_") and callable(obj)
                           and getattr(obj, "__module__", "") == sb.__name__]
    for text in docs:
        for clue in ("softmax", "not shifted", "same slice", "standard deviation 1", "cross-att"):
            assert clue not in text, (clue, text[:80])


def test_suspect_a_is_exposed_by_the_pads_only():
    model = sb.suspect("A", config()).model().eval()
    torch.manual_seed(0)
    clean = tx.Transformer(config()).eval()
    assert pads_change(model) and not pads_change(clean)
    assert not sees_future(model)
    assert entropy(model) == pytest.approx(entropy(clean))
    assert graded("A") == "pads"


def test_suspect_b_is_exposed_by_the_teacher_forced_gap_only():
    assert gap(sb.suspect("B", config()).batches(60)) and not gap(good_batches(60))
    src, tgt_in, tgt_out = next(sb.suspect("B", config()).batches(1))
    assert src.shape == (32, L) and tgt_in.shape == tgt_out.shape == (32, L + 1)
    assert graded("B") == "gap"


def test_suspect_c_is_exposed_by_the_entropy_only():
    torch.manual_seed(0)
    clean = tx.Transformer(config()).eval()
    model = sb.suspect("C", config()).model().eval()
    assert entropy(model) < 0.75 * entropy(clean)
    assert not pads_change(model) and not sees_future(model)
    assert graded("C") == "entropy"


def test_the_colleagues_core_is_named_by_check_attention():
    result = labkit.check_attention(sb._colleague_core, verbose=False)
    assert not result.passed and "mask_after_softmax" in result.mistakes


# ---------------------------------------------------------------- the target shift

def test_a_correct_shift_passes():
    def shift(tgt):
        n = tgt.size(1)
        return tgt.narrow(1, 0, n - 1), tgt.narrow(1, 1, n - 1)

    assert labkit.check_shift_targets(shift, verbose=False).passed


@pytest.mark.parametrize("fn, key", [
    (lambda t: (t[:, :-1], t[:, :-1]), "shift_unshifted"),
    (lambda t: (t[:, 1:], t[:, :-1]), "shift_reversed"),
    (lambda t: (t, t[:, 1:]), "shift_wrong_length"),
    (lambda t: (t[:, :-1], t[:, 1:] + 1), "mismatch"),
])
def test_each_shift_mistake_is_named(fn, key):
    result = labkit.check_shift_targets(fn, verbose=False)
    assert not result.passed and key in result.mistakes, result.report


# ---------------------------------------------------------------- the embedding init

def scaled_normal(model):
    for emb in (model.encoder.embedding, model.decoder.embedding):
        torch.nn.init.normal_(emb.weight, std=emb.embedding_dim ** -0.5)


def xavier(model):
    for emb in (model.encoder.embedding, model.decoder.embedding):
        torch.nn.init.xavier_uniform_(emb.weight)


@pytest.mark.parametrize("fn", [scaled_normal, xavier])
def test_a_correct_init_passes(fn):
    result = labkit.check_init_embeddings(fn, verbose=False)
    assert result.passed, result.report


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_the_stated_contract_passes_at_its_edges(factor):
    # notebook 10's stub: a std within a factor of 2 of d_model^-0.5 meets the contract
    def scaled(model):
        for emb in (model.encoder.embedding, model.decoder.embedding):
            torch.nn.init.normal_(emb.weight, std=factor * emb.embedding_dim ** -0.5)

    result = labkit.check_init_embeddings(scaled, verbose=False)
    assert result.passed, result.report


@pytest.mark.parametrize("factor", [0.35, 2.6])
def test_beyond_a_factor_of_2_and_its_margin_fails(factor):
    def scaled(model):
        for emb in (model.encoder.embedding, model.decoder.embedding):
            torch.nn.init.normal_(emb.weight, std=factor * emb.embedding_dim ** -0.5)

    result = labkit.check_init_embeddings(scaled, verbose=False)
    assert not result.passed and "init_embeddings_other" in result.mistakes, result.report


def test_one_over_d_model_is_outside_the_contract():
    # shrinks with the width, but far below d_model^-0.5: named, not passed
    result = labkit.check_init_embeddings(
        lambda m: [torch.nn.init.normal_(e.weight, std=1 / e.embedding_dim)
                   for e in (m.encoder.embedding, m.decoder.embedding)], verbose=False)
    assert not result.passed and "init_embeddings_other" in result.mistakes, result.report


def test_each_init_mistake_is_named():
    assert "init_embeddings_unit" in labkit.check_init_embeddings(
        lambda m: None, verbose=False).mistakes
    assert "init_embeddings_other" in labkit.check_init_embeddings(
        lambda m: [torch.nn.init.normal_(e.weight, std=0.01)
                   for e in (m.encoder.embedding, m.decoder.embedding)], verbose=False).mistakes

    def everything(model):
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.1)

    assert "init_touches_other_weights" in labkit.check_init_embeddings(
        everything, verbose=False).mistakes


def test_pipelines_hide_which_part_is_suspect():
    cfg = config()
    a, b, c = (sb.suspect(name, cfg) for name in "ABC")
    assert pads_change(a.model().eval()) and not pads_change(b.model().eval())
    assert not pads_change(c.model().eval())
    assert entropy(c.model().eval()) < 0.75 * entropy(a.model().eval())
    for p in (a, c):
        src, tgt_in, tgt_out = next(p.batches(1, 4))
        assert torch.equal(tgt_in[:, 1:], tgt_out[:, :-1])
    src, tgt_in, tgt_out = next(b.batches(1, 4))
    assert torch.equal(tgt_in, tgt_out)
    with pytest.raises(ValueError, match="name must be one of"):
        sb.suspect("D", cfg)


def test_the_control_pipeline_is_correct_under_every_quick_measurement():
    cfg = config()
    control = sb.suspect("control", cfg)
    model = control.model().eval()
    torch.manual_seed(0)
    clean = tx.Transformer(cfg).eval()
    assert not pads_change(model) and not sees_future(model)
    assert entropy(model) == pytest.approx(entropy(clean))
    src, tgt_in, tgt_out = next(control.batches(1, 4))
    assert torch.equal(tgt_in[:, 1:], tgt_out[:, :-1]) and tgt_in.shape == (4, L + 1)


# ---------------------------------------------------------------- repairing suspect A's weights

def repair_by_division(weights, mask):
    total = weights.sum(-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(1e-30),
                       torch.full_like(weights, 1 / weights.size(-1)))


def repair_through_logs(weights, mask):
    # an independent route: back to scores (log w), masked with the finite fill, softmax again
    scores = torch.log(weights).masked_fill(mask, torch.finfo(weights.dtype).min)
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("fn", [repair_by_division, repair_through_logs])
def test_a_correct_repair_passes(fn):
    result = labkit.check_repaired_weights(fn, verbose=False)
    assert result.passed, result.report


@pytest.mark.parametrize("fn, key", [
    (lambda w, m: w, "mask_after_softmax"),
    (lambda w, m: w / w.sum(-1, keepdim=True), "repair_row_nan"),  # 0 / 0 on the row with no key
    (lambda w, m: w.masked_fill(m, 0) / w.masked_fill(m, 0).sum(-1, keepdim=True),
     "repair_row_nan"),  # a cold reader's try: the same 0 / 0
    (lambda w, m: torch.nan_to_num(w / w.sum(-1, keepdim=True)), "mask_row_zeroed"),
    (lambda w, m: torch.softmax(w, -1), "mismatch"),
    (lambda w, m: w[..., :-1], "wrong_output_shape"),
])
def test_each_repair_mistake_is_named(fn, key):
    result = labkit.check_repaired_weights(fn, verbose=False)
    assert not result.passed and key in result.mistakes, result.report


def test_the_repair_is_found_by_name():
    def repair_weights(weights, mask):
        return repair_by_division(weights, mask)

    labels = [label for label, _ in labkit.find_checks({"repair_weights": repair_weights},
                                                       module=None)]
    assert labels == ["check_repaired_weights(repair_weights)"]


# ---------------------------------------------------------------- the learner's leak map

def leak_map_by_replacement(model, src, tgt_in):
    # change one decoder input at a time to another symbol; compare the logits at every position
    n = tgt_in.size(1)
    moved = torch.zeros(n, n, dtype=torch.bool)
    with torch.no_grad():
        base = model(src, tgt_in)
        for s in range(n):
            changed = tgt_in.clone()
            changed[:, s] = 3 + (changed[:, s] - 2) % (V - 3)
            moved[:, s] = (model(src, changed) - base).abs().amax(dim=(0, 2)) > 1e-4
    return moved


def leak_map_by_gradient(model, src, tgt_in):
    # an independent route: the gradient of each output row with respect to the embedded inputs
    leaf = {}

    def hook(_module, _inputs, output):
        leaf["x"] = output.detach().requires_grad_(True)
        return leaf["x"]

    handle = model.decoder.embedding.register_forward_hook(hook)
    try:
        logits = model(src[:1], tgt_in[:1])
    finally:
        handle.remove()
    rows = [torch.autograd.grad(logits[0, t].square().sum(), leaf["x"], retain_graph=True)[0][0]
            .abs().sum(-1) > 0 for t in range(tgt_in.size(1))]
    return torch.stack(rows)


def leak_map_cumulative(model, src, tgt_in):
    # the mistake: every input from s on changed at once
    n = tgt_in.size(1)
    out = []
    with torch.no_grad():
        base = model(src, tgt_in)
        for s in range(n):
            changed = tgt_in.clone()
            changed[:, s:] = 3 + (changed[:, s:] - 2) % (V - 3)
            out.append((model(src, changed) - base).abs().amax(dim=(0, 2)) > 1e-4)
    return torch.stack(out, 1)


def leak_map_argmax(model, src, tgt_in):
    # the mistake: predicted tokens compared instead of logits, on one sequence
    n = tgt_in.size(1)
    moved = torch.zeros(n, n, dtype=torch.bool)
    with torch.no_grad():
        base = model(src[:1], tgt_in[:1]).argmax(-1)[0]
        for s in range(n):
            changed = tgt_in[:1].clone()
            changed[:, s] = 3 + (changed[:, s] - 2) % (V - 3)
            moved[:, s] = model(src[:1], changed).argmax(-1)[0] != base
    return moved


def leak_map_noise(model, src, tgt_in):
    # the mistake: a threshold of 0 and the model run twice in train mode (dropout-free here,
    # so simulated by adding noise to the comparison)
    return leak_map_by_replacement(model, src, tgt_in) | torch.eye(tgt_in.size(1)).roll(1, 1).bool()


@pytest.mark.parametrize("fn", [leak_map_by_replacement, leak_map_by_gradient])
def test_a_correct_leak_map_passes(fn):
    result = labkit.check_leak_map(fn, verbose=False)
    assert result.passed, result.report
    assert sum("the map is right" in m for m in result.messages) == len(leak_map._LEAK_CASES)


@pytest.mark.parametrize("fn, key", [
    (lambda m, s, t: leak_map_by_replacement(m, s, t).T, "leak_map_transposed"),
    (leak_map_cumulative, "leak_map_cumulative"),
    (leak_map_argmax, "leak_map_misses"),
    (leak_map_noise, "leak_map_spurious"),
    (lambda m, s, t: leak_map_by_replacement(m, s, t)[None], "wrong_output_shape"),
])
def test_each_leak_map_mistake_is_named(fn, key):
    result = labkit.check_leak_map(fn, verbose=False)
    assert not result.passed and key in result.mistakes, result.report


def test_a_map_read_from_the_test_models_mask_fails():
    # a cold reader's spoof: read the check's private mask off the model and compute the reach
    def spoof(model, src, tgt_in):
        return leak_map._reach(model._visible(tgt_in.size(1)), len(model.decoder.layers))

    result = labkit.check_leak_map(spoof, verbose=False)
    assert not result.passed, result.report
    probe = leak_map._masked_model(config(), leak_map._visible_within(1))
    assert not any("visible" in name for name in vars(probe))


def test_the_leak_map_is_found_by_name():
    def leak_map(model, src, tgt_in):
        return leak_map_by_replacement(model, src, tgt_in)

    labels = [label for label, _ in labkit.find_checks({"leak_map": leak_map}, module=None)]
    assert labels == ["check_leak_map(leak_map)"]


def test_init_embeddings_scale_typed_for_one_width_fails():
    """0.18 is d_model^-0.5 at the lab's width 32 only: the second width catches it."""
    def typed(model):
        with torch.no_grad():
            for table in (model.encoder.embedding, model.decoder.embedding):
                table.weight.normal_(0, 0.18)

    result = labkit.check_init_embeddings(typed, verbose=False)
    assert not result.passed and "init_embeddings_other" in result.mistakes
