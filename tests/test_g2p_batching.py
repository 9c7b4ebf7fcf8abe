"""labkit.check_g2p_batches and check_g2p_training (notebook 13's lab): correct code passes,
each planted mistake is named."""
from __future__ import annotations

import copy
import itertools
import random

import pytest
import torch

import labkit
import tx_helpers as tx
from labkit.g2p_batching import _made_up_pairs
from labkit.g2p_training import TINY_RECIPE
from tx_helpers import g2p

# ---------------------------------------------------------------- batches, written independently

def batches_by_length(pairs, batch_size, *, seed=0, bucket=16):
    """One epoch: shuffle, sort runs of bucket * batch_size pairs by word length, cut, shuffle."""
    rng = random.Random(seed * 7919 + 3)
    order = rng.sample(list(pairs), len(pairs))
    n = len(order) // batch_size * batch_size
    groups = []
    for start in range(0, n, bucket * batch_size):
        run = sorted(order[start:min(start + bucket * batch_size, n)], key=lambda p: len(p[0]))
        groups.extend(run[i:i + batch_size] for i in range(0, len(run), batch_size))
    rng.shuffle(groups)
    for group in groups:
        yield g2p.make_g2p_batch(group)


def chunked_indices(pairs, batch_size, *, seed=0, bucket=16):
    """Also correct: shuffled indices, each run of bucket * batch_size sorted by (length, word)."""
    rng = random.Random(seed * 7 + 1)
    idx = rng.sample(range(len(pairs)), len(pairs))
    idx, span, out = idx[:len(idx) // batch_size * batch_size], bucket * batch_size, []
    for c in range(0, len(idx), span):
        chunk = sorted(idx[c:c + span], key=lambda i: (len(pairs[i][0]), pairs[i][0]))
        out.extend(chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size))
    rng.shuffle(out)
    return [g2p.make_g2p_batch([pairs[i] for i in b]) for b in out]


def globally_sorted(pairs, batch_size, *, seed=0, bucket=16):
    """Ignores bucket: one sort of all pairs (after a shuffle for ties), batches shuffled."""
    rng = random.Random(seed)
    order = sorted(rng.sample(list(pairs), len(pairs)), key=lambda p: len(p[0]))
    groups = [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    rng.shuffle(groups)
    return [g2p.make_g2p_batch(g) for g in groups]


def ragged(pairs, batch_size, *, seed=0, bucket=16):
    out = list(batches_by_length(pairs, batch_size, seed=seed, bucket=bucket))
    rest = len(pairs) % batch_size
    return out + [g2p.make_g2p_batch(list(pairs)[:rest])]


def unshifted(pairs, batch_size, *, seed=0, bucket=16):
    for src, _, tgt_out in batches_by_length(pairs, batch_size, seed=seed, bucket=bucket):
        yield src, tgt_out, tgt_out


def not_bucketed(pairs, batch_size, *, seed=0, bucket=16):
    rng = random.Random(seed)
    order = rng.sample(list(pairs), len(pairs))
    return [g2p.make_g2p_batch(order[i:i + batch_size])
            for i in range(0, len(order) - batch_size + 1, batch_size)]


def no_shuffle(pairs, batch_size, *, seed=0, bucket=16):
    rng = random.Random(seed)
    n = len(pairs) // batch_size * batch_size
    groups = []
    for start in range(0, n, bucket * batch_size):
        run = sorted(pairs[start:min(start + bucket * batch_size, n)], key=lambda p: len(p[0]))
        groups += [run[i:i + batch_size] for i in range(0, len(run), batch_size)]
    rng.shuffle(groups)
    return [g2p.make_g2p_batch(g) for g in groups]


def order_sorted(pairs, batch_size, *, seed=0, bucket=16):
    rng = random.Random(seed)
    order = sorted(rng.sample(list(pairs), len(pairs)), key=lambda p: len(p[0]))
    return [g2p.make_g2p_batch(order[i:i + batch_size])
            for i in range(0, len(order) - batch_size + 1, batch_size)]


def in_place(pairs, batch_size, *, seed=0, bucket=16):
    random.Random(seed).shuffle(pairs)
    return list(batches_by_length(pairs, batch_size, seed=seed, bucket=bucket))


def global_random(pairs, batch_size, *, seed=0, bucket=16):
    random.shuffle(pairs := list(pairs))  # the global generator: another epoch each call
    return list(batches_by_length(pairs, batch_size, seed=random.randrange(10 ** 6), bucket=bucket))


def seed_ignored(pairs, batch_size, *, seed=0, bucket=16):
    return list(batches_by_length(pairs, batch_size, seed=0, bucket=bucket))


def repeats(pairs, batch_size, *, seed=0, bucket=16):
    out = list(batches_by_length(pairs, batch_size, seed=seed, bucket=bucket))
    return out[:-1] + [out[0]]


def fixed_bucket(pairs, batch_size, *, seed=0, bucket=16):
    return list(batches_by_length(pairs, batch_size, seed=seed, bucket=8))


@pytest.mark.parametrize("fn", [batches_by_length, chunked_indices])
def test_correct_batching_passes(fn):
    result = labkit.check_g2p_batches(fn, verbose=False)
    assert result.passed, result.report


@pytest.mark.parametrize("fn, key", [
    (ragged, "g2p_batch_ragged_kept"),
    (unshifted, "g2p_batch_unshifted"),
    (not_bucketed, "g2p_batch_not_bucketed"),
    (no_shuffle, "g2p_batch_no_shuffle"),
    (order_sorted, "g2p_batch_order_sorted"),
    (in_place, "g2p_batch_mutates_pairs"),
    (global_random, "g2p_batch_not_reproducible"),
    (seed_ignored, "g2p_batch_ignores_seed"),
    (repeats, "g2p_batch_repeats_pairs"),
    (globally_sorted, "g2p_batch_ignores_bucket"),
    (fixed_bucket, "g2p_batch_ignores_bucket"),
])
def test_each_batching_mistake_is_named(fn, key):
    result = labkit.check_g2p_batches(fn, verbose=False)
    assert not result.passed and key in result.mistakes, result.report


def test_batches_served_longest_first_are_named():
    # a cold reader's batcher: no shuffle of the batches, each chunk served longest first; it
    # passed 10/10, since the order probe looked only for rising lengths
    def longest_first(pairs, batch_size, *, seed=0, bucket=16):
        n = len(pairs) // batch_size * batch_size
        rng = random.Random(seed)
        order = list(pairs)
        rng.shuffle(order)
        for s in range(0, n, bucket * batch_size):
            run = sorted(order[s:min(s + bucket * batch_size, n)], key=lambda q: -len(q[0]))
            for i in range(0, len(run), batch_size):
                yield g2p.make_g2p_batch(run[i:i + batch_size])

    result = labkit.check_g2p_batches(longest_first, verbose=False)
    assert not result.passed and result.mistakes == ["g2p_batch_order_sorted"], result.report


@pytest.mark.parametrize("seed", range(20))
def test_a_shuffled_batch_order_is_never_read_as_sorted(seed):
    # correct bucketing under many shuffles: the batch order's rank correlation stays far from 1
    from labkit.g2p_batching import _rank_correlation
    pairs = _made_up_pairs()
    for fn in (batches_by_length, chunked_indices):
        lengths = [(b[0] != 0).sum().item() / 8
                   for b in fn(pairs, 8, seed=seed + 100, bucket=len(pairs) // 8)]
        assert abs(_rank_correlation(lengths)) < 0.5
    assert _rank_correlation([1, 2, 2, 3]) > 0.9 and _rank_correlation([3, 2, 1]) == -1.0


def test_the_reference_differs_from_the_lab_only_in_the_rest():
    # notebook 13 says the shipped model's batches (g2p.g2p_batches) are the lab's, except that
    # an epoch's rest comes as one smaller batch: one epoch of the reference, graded by the check
    from tx_helpers import g2p

    def one_epoch(pairs, batch_size, *, seed=0, bucket=16):
        full = len(pairs) // batch_size
        steps = full + (len(pairs) % batch_size > 0 and full % bucket > 0)
        return g2p.g2p_batches(pairs, batch_size, seed=seed, bucket=bucket, steps=steps)

    result = labkit.check_g2p_batches(one_epoch, verbose=False)
    assert set(result.mistakes) == {"g2p_batch_ragged_kept", "delegated"}, result.report


def test_a_returned_reference_generator_is_delegation():
    # returning the reference's generator (bare or wrapped in map) ran it only when the check
    # iterated it, where the delegation watch took the lab kit for the caller
    from tx_helpers import g2p

    def handed_back(pairs, batch_size, *, seed=0, bucket=16):
        full = len(pairs) // batch_size
        gen = g2p.g2p_batches(pairs, batch_size, seed=seed, bucket=bucket, steps=full)
        return map(lambda batch: batch, gen)

    result = labkit.check_g2p_batches(handed_back, verbose=False)
    assert not result.passed and "delegated" in result.mistakes, result.report
    assert "g2p_batches" in result.report
    result = labkit.check_g2p_batches(batches_by_length, verbose=False)  # the watch is gone
    assert result.passed, result.report


def test_a_stub_is_reported_not_raised():
    def stub(pairs, batch_size, *, seed=0, bucket=16):
        raise NotImplementedError("one epoch of batches")

    result = labkit.check_g2p_batches(stub, verbose=False)
    assert result.mistakes == ["not_implemented"]


def test_made_up_pairs_are_distinct_and_sorted():
    pairs = _made_up_pairs()
    words = [w for w, _ in pairs]
    assert words == sorted(set(words)) and len(words) == 300
    assert all(phones and set(phones) <= set(g2p.PHONES) for _, phones in pairs)


# ---------------------------------------------------------------- the training call

def _setup(recipe, seed=None):
    torch.manual_seed(recipe["seed"] if seed is None else seed)
    config = g2p.g2p_model_config(**recipe["model"])
    model = tx.Transformer(config)
    optimizer = tx.paper_adam(model.parameters())
    scheduler = tx.noam_scheduler(optimizer, config.d_model, recipe["warmup"], recipe["factor"],
                                  cooldown=recipe["cooldown"], total=recipe["steps"])
    return model, optimizer, scheduler


def short_run(recipe, batches):
    """Written independently: keep copies at the chosen steps, average them at the end."""
    model, optimizer, scheduler = _setup(recipe)
    n, every, last = recipe["steps"], recipe["average_every"], recipe["average_last"]
    kept = []

    def keep(history):
        if (n - len(history)) % every == 0 and n - len(history) < every * last:
            kept.append(copy.deepcopy(model.state_dict()))

    steps = itertools.islice(batches, recipe["steps"])
    history = tx.train(model, steps, optimizer, scheduler, clip_norm=recipe["clip_norm"],
                       label_smoothing=recipe["label_smoothing"], callback=keep)
    model.load_state_dict({k: sum(sd[k] for sd in kept) / len(kept) for k in kept[0]})
    return model.eval(), history


def running_sum_run(recipe, batches):
    """Also correct: a running float64 sum of the parameters, no list of checkpoints."""
    model, optimizer, scheduler = _setup(recipe)
    wanted = {recipe["steps"] - recipe["average_every"] * i for i in range(recipe["average_last"])}
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in model.state_dict().items()}

    def add(history):
        if len(history) in wanted:
            for k, v in model.state_dict().items():
                total[k] += v.double()

    history = tx.train(model, itertools.islice(batches, recipe["steps"]), optimizer, scheduler,
                       label_smoothing=recipe["label_smoothing"], clip_norm=recipe["clip_norm"],
                       callback=add)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(total[k] / len(wanted))
    model.eval()
    return model, history


def _variant(**change):
    def run(recipe, batches):
        recipe = dict(recipe)
        model, optimizer, scheduler = _setup(recipe, change.get("seed"))
        if "warmup" in change:
            scheduler = tx.noam_scheduler(optimizer, model.config.d_model, change["warmup"],
                                          recipe["factor"])
        if change.get("no_scheduler"):
            scheduler = None
        n, every = change.get("steps", recipe["steps"]), recipe["average_every"]
        live = change.get("no_copy")
        kept = {}

        def keep(history):
            state = model.state_dict()
            kept[len(history)] = state if live else {k: v.clone() for k, v in state.items()}

        history = tx.train(model, itertools.islice(batches, n), optimizer, scheduler,
                           clip_norm=change.get("clip_norm", recipe["clip_norm"]),
                           label_smoothing=change.get("label_smoothing",
                                                      recipe["label_smoothing"]),
                           callback=keep)
        if change.get("no_average"):
            chosen = [n]
        elif change.get("all_multiples"):  # every multiple of average_every: 2, 4, 6
            chosen = list(range(every, n + 1, every))
        elif change.get("first_multiples"):  # the first average_last multiples: 2, 4, 6 too
            chosen = [every * (i + 1) for i in range(recipe["average_last"])]
        elif change.get("every_step"):  # the last average_last steps, 1 apart: 5, 6, 7
            chosen = [n - i for i in range(recipe["average_last"])]
        elif change.get("off_by_one"):  # counted from 0: the checkpoints after steps 2, 4, 6
            chosen = [n - 1 - every * i for i in range(recipe["average_last"])]
        else:
            chosen = [n - every * i for i in range(recipe["average_last"])]
        if n in kept:
            model.load_state_dict({k: torch.stack([kept[s][k] for s in chosen]).mean(0)
                                   for k in kept[n]})
        if change.get("fresh_model"):
            model = tx.Transformer(model.config)
        return model if change.get("train_mode") else model.eval(), history
    return run


@pytest.mark.parametrize("fn", [short_run, running_sum_run])
def test_correct_training_call_passes(fn):
    result = labkit.check_g2p_training(fn, verbose=False)
    assert result.passed, result.report
    assert "mean of the checkpoints after steps 3, 5 and 7" in result.report


@pytest.mark.parametrize("change, key", [
    ({"no_scheduler": True}, "g2p_train_no_scheduler"),
    ({"warmup": 7}, "g2p_train_wrong_schedule"),
    ({"seed": 5}, "g2p_train_not_seeded"),
    ({"label_smoothing": 0.0}, "g2p_train_label_smoothing"),
    ({"clip_norm": None}, "g2p_train_no_clipping"),
    ({"steps": 6}, "g2p_train_wrong_steps"),
    ({"fresh_model": True}, "g2p_train_wrong_return"),
    ({"no_copy": True}, "g2p_avg_final_weights"),
    ({"no_average": True}, "g2p_avg_final_weights"),
    ({"off_by_one": True}, "g2p_avg_wrong_steps"),
    ({"all_multiples": True}, "g2p_avg_wrong_steps"),
    ({"first_multiples": True}, "g2p_avg_wrong_steps"),
    ({"every_step": True}, "g2p_avg_wrong_steps"),
    ({"train_mode": True}, "g2p_avg_not_eval"),
])
def test_each_training_mistake_is_named(change, key):
    result = labkit.check_g2p_training(_variant(**change), verbose=False)
    assert not result.passed and key in result.mistakes, result.report


def test_a_wrong_pick_of_checkpoints_is_named_with_its_steps():
    """A cold reader's two wrong picks passed the old 4-step recipe, whose checkpoints {2, 4}
    were also every multiple of 2 and the first two multiples."""
    result = labkit.check_g2p_training(_variant(first_multiples=True), verbose=False)
    assert "after steps 2, 4 and 6; the recipe's are 3, 5 and 7" in result.report, result.report
    assert labkit.mark_result("3", result).score < 1


def test_delegating_to_the_reference_average_is_named():
    from tx_helpers.pretrained import average_weights

    def borrowed(recipe, batches):
        model, optimizer, scheduler = _setup(recipe)
        kept = []
        history = tx.train(model, itertools.islice(batches, recipe["steps"]), optimizer,
                           scheduler, label_smoothing=recipe["label_smoothing"],
                           clip_norm=recipe["clip_norm"],
                           callback=lambda h: kept.append(copy.deepcopy(model.state_dict()))
                           if len(h) % 2 == 0 else None)
        model.load_state_dict(average_weights(kept))
        return model.eval(), history

    mark = labkit.mark_exercise("train_short_run", borrowed, check=labkit.check_g2p_training,
                                verbose=False)
    assert mark.delegated and "average_weights" in mark.delegated and mark.score == 0, mark.lines


def test_the_wer_margin_is_scored_on_the_given_model(lexicon_words=("knight", "phone", "debt")):
    lexicon = g2p.load_lexicon()
    untrained = _setup(TINY_RECIPE)[0].eval()
    words = list(lexicon_words)
    failed = labkit.check_g2p_training(short_run, model=untrained, words=words, lexicon=lexicon,
                                       max_wer=0.5, verbose=False)
    assert "g2p_run_wer_above_margin" in failed.mistakes
    shipped = g2p.load_pretrained("cpu")
    passed = labkit.check_g2p_training(short_run, model=shipped, words=words, lexicon=lexicon,
                                       max_wer=0.5, verbose=False)
    assert passed.passed, passed.report
