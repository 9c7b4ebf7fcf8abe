"""check_parameter_counts (notebook 01's lab): correct counters pass, usual mistakes are named."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import labkit
import tx_helpers as tx
from labkit.parameters import GROUPS


def quiet(fn):
    return labkit.check_parameter_counts(fn, verbose=False)


def by_modules(config):
    """An independent counter: the shapes of each block's tensors, multiplied out."""
    def n(*shapes):
        return sum(math.prod(shape) for shape in shapes)

    d, f = config.d_model, config.d_ff
    attn = 4 * n((d, d), (d,))  # w_q, w_k, w_v, w_o
    ffn = n((f, d), (f,), (d, f), (d,))
    norm = n((d,), (d,))
    src, tgt = n((config.src_vocab_size, d)), n((config.tgt_vocab_size, d))
    gen = n((config.tgt_vocab_size, d), (config.tgt_vocab_size,))
    layers = config.n_layers
    return {
        "embeddings": src if config.share_embeddings else src + tgt,
        "attention": 3 * layers * attn,
        "feed-forward": 2 * layers * ffn,
        "layer norms": (5 * layers + 2) * norm,
        "generator": config.tgt_vocab_size if config.share_embeddings else gen,
    }


def test_an_independent_counter_passes_and_matches_tx_count_parameters():
    result = quiet(by_modules)
    assert result.passed, result.report
    for config in (tx.ModelConfig(), tx.ModelConfig(share_embeddings=True, n_layers=3)):
        counts = by_modules(config)
        assert sum(counts.values()) == tx.count_parameters(tx.Transformer(config))


def test_numpy_and_tensor_integers_are_accepted():
    def as_numpy(config):
        return {k: np.int64(v) for k, v in by_modules(config).items()}

    def as_tensor(config):
        return {k: torch.tensor(v) for k, v in by_modules(config).items()}

    def with_total(config):
        counts = by_modules(config)
        return counts | {"total": sum(counts.values())}

    assert quiet(as_numpy).passed
    assert quiet(as_tensor).passed
    result = quiet(with_total)
    assert result.passed and "['total'] are not groups" in result.report


def shifted(**changes):
    """A counter that applies the given per-config changes to the right counts."""
    def fn(config):
        counts = by_modules(config)
        for key, change in changes.items():
            counts[key] += change(config)
        return counts
    return fn


def d(c):
    return c.d_model


MISTAKES = {
    "param_no_biases": shifted(
        attention=lambda c: -3 * c.n_layers * 4 * d(c),
        **{"feed-forward": lambda c: -2 * c.n_layers * (c.d_ff + d(c))},
        generator=lambda c: -c.tgt_vocab_size),
    "param_layernorm_gain_only": shifted(**{"layer norms": lambda c: -(5 * c.n_layers + 2) * d(c)}),
    "param_no_final_norms": shifted(**{"layer norms": lambda c: -4 * d(c)}),
    "param_no_cross_attention": shifted(attention=lambda c: -c.n_layers * 4 * (d(c) ** 2 + d(c))),
    "param_tied_counted_twice": shifted(
        generator=lambda c: c.tgt_vocab_size * d(c) if c.share_embeddings else 0),
    "param_buffer_counted": shifted(embeddings=lambda c: 2 * c.max_len * d(c)),
    "param_d_ff_assumed": shifted(**{"feed-forward": lambda c: 2 * c.n_layers
                                     * (4 * d(c) - c.d_ff) * (2 * d(c) + 1)}),
}


@pytest.mark.parametrize("key", list(MISTAKES))
def test_each_usual_mistake_is_named(key):
    result = quiet(MISTAKES[key])
    assert not result.passed
    assert result.mistakes == [key], result.report


def test_two_mistakes_at_once_are_both_named():
    both = shifted(**{"layer norms": lambda c: -4 * d(c)},
                   embeddings=lambda c: 2 * c.max_len * d(c))
    result = quiet(both)
    assert sorted(result.mistakes) == ["param_buffer_counted", "param_no_final_norms"]


def test_an_unlisted_mistake_names_the_group_and_the_numbers():
    result = quiet(shifted(generator=lambda c: -c.tgt_vocab_size if c.share_embeddings else 0))
    assert result.mistakes == ["param_group_wrong"]
    assert "generator 0 (built model 60)" in result.report


def test_the_stub_and_a_wrong_return_type_are_named():
    def stub(config):
        raise NotImplementedError("return a dict with one int per name in GROUPS")

    assert quiet(stub).mistakes == ["not_implemented"]
    assert quiet(lambda config: 975488).mistakes == ["param_not_a_dict"]
    missing = quiet(lambda config: {k: 0 for k in GROUPS[:-1]})
    assert missing.mistakes == ["param_not_a_dict"] and "generator" in missing.report


def test_building_a_tx_model_is_reported_and_the_blocks_are_restored():
    def builds(config):
        with torch.device("meta"):
            model = tx.Transformer(config)
        return {k: 0 for k in GROUPS} | {"embeddings": tx.count_parameters(model)}

    def counts_a_layer(config):
        tx.MultiHeadAttention(config.d_model, config.n_heads)
        return by_modules(config)

    assert quiet(builds).mistakes == ["param_built_model"]
    assert quiet(counts_a_layer).mistakes == ["param_built_model"]
    assert tx.count_parameters(tx.Transformer(tx.ModelConfig(n_layers=1))) > 0  # restored


def grouped(built, config):
    """Counts per group of a built nn.Transformer plus the two embedding lines."""
    counts = dict.fromkeys(GROUPS, 0)
    for name, p in built.named_parameters():
        group = ("attention" if "attn" in name else "layer norms" if "norm" in name
                 else "feed-forward" if "linear" in name else "embeddings")
        counts[group] += p.numel()
    v_src, v_tgt, d = config.src_vocab_size, config.tgt_vocab_size, config.d_model
    counts["embeddings"] += v_src * d if config.share_embeddings else (v_src + v_tgt) * d
    counts["generator"] = v_tgt if config.share_embeddings else v_tgt * (d + 1)
    return counts


def via_nn_transformer(c):  # a cold reader's route: PyTorch's own model on meta, grouped by name
    with torch.device("meta"):
        built = nn.Transformer(c.d_model, c.n_heads, c.n_layers, c.n_layers, c.d_ff,
                               batch_first=True)
    return grouped(built, c)


_SAVED = {}


def via_restored_constructors(c):  # a cold reader's route: the saved tx __init__s put back
    current = {cls: cls.__init__ for cls in _SAVED}
    for cls, init in _SAVED.items():
        cls.__init__ = init
    try:
        with torch.device("meta"):
            built = tx.Transformer(c)
    finally:
        for cls, init in current.items():
            cls.__init__ = init
    counts = dict.fromkeys(GROUPS, 0)
    for name, p in built.named_parameters():
        counts[labkit.parameters.group_of(name)] += p.numel()
    return counts


def swallows_the_refusal(c):  # builds, catches every refusal, then counts by hand
    try:
        nn.Linear(c.d_model, c.d_model)
    except BaseException:  # noqa: BLE001 - the point of the case
        pass
    return by_modules(c)


@pytest.mark.parametrize("saved", [(), ("module",)], ids=["tx inits", "tx and nn.Module inits"])
def test_a_model_built_any_way_fails(saved):
    from tx_helpers import attention, layers, model, positional

    _SAVED.clear()
    _SAVED.update({cls: cls.__init__ for cls in (
        model.Transformer, model.Encoder, model.Decoder, layers.EncoderLayer,
        layers.DecoderLayer, layers.FeedForward, attention.MultiHeadAttention,
        positional.PositionalEncoding)})
    if saved:
        _SAVED[nn.Module] = nn.Module.__init__
    init = nn.Module.__init__
    for fn in (via_nn_transformer, via_restored_constructors, swallows_the_refusal):
        assert fn(tx.ModelConfig()) == labkit.parameters.measured_counts(tx.ModelConfig())
        result = quiet(fn)
        assert not result.passed and "param_built_model" in result.mistakes, result.report
    assert nn.Module.__init__ is init and all(cls.__init__ is i for cls, i in _SAVED.items())
    assert quiet(by_modules).passed  # hooks removed, constructors back


def test_the_kits_own_counts_are_delegation():
    parameters = labkit.parameters

    def via_formula(c):
        return parameters._formula(c)

    def via_cache(c):
        return next(r for _, cc, r in parameters._references() if cc == c)

    def via_cache_list(c):
        return next(r for _, cc, r in parameters._REFS if cc == c)

    for fn in (via_formula, via_cache):
        result = quiet(fn)
        assert not result.passed and "delegated" in result.mistakes, result.report
    assert not quiet(via_cache_list).passed  # the cache is empty while fn runs
    assert len(parameters._references()) == 3  # and back afterwards


def test_every_new_mistake_has_text_and_a_hint():
    keys = [k for k in labkit.MISTAKES if k.startswith("param_")]
    assert len(keys) == 11
    for key in keys:
        text, hint = labkit.MISTAKES[key]
        assert text and hint


def test_answers_cached_for_the_fixed_configs_fail():
    """A cold reader's route: the measured counts of the three fixed configs, stored beforehand."""
    parameters = labkit.parameters
    cache = {repr(c): parameters.measured_counts(c) for _, c in parameters._CONFIGS}
    result = quiet(lambda c: dict(cache[repr(c)]))
    assert not result.passed, result.report
    assert "drawn at random" in result.report


_CHILD = ("import json, sys; from tx_helpers.config import ModelConfig; "
          "from labkit.parameters import measured_counts; "
          "print(json.dumps(measured_counts(ModelConfig(**json.loads(sys.argv[1])))))")


def via_subprocess(config):  # a cold reader's route: the model built in a child process
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(dataclasses.asdict(config))],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def via_os_fork(config):  # the same, by hand
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return by_modules(config)


def via_spawned_process(config):  # multiprocessing's spawn start method: no audited fork
    process = multiprocessing.get_context("spawn").Process(target=len, args=((),))
    process.start()
    process.join()
    return by_modules(config)


def swallows_the_child_refusal(config):
    try:
        subprocess.run(["true"], check=False)
    except BaseException:  # noqa: BLE001 - the point of the case
        pass
    return by_modules(config)


@pytest.mark.parametrize("fn", [via_subprocess, via_os_fork, via_spawned_process,
                                swallows_the_child_refusal])
def test_a_child_process_fails(fn):
    if fn is not via_subprocess:  # that one works too, but a fresh interpreter takes seconds
        assert fn(tx.ModelConfig()) == labkit.parameters.measured_counts(tx.ModelConfig())
    result = quiet(fn)
    assert not result.passed and result.mistakes == ["param_child_process"], result.report
    subprocess.run(["true"], check=True)  # allowed again after the check
    assert quiet(by_modules).passed


def test_a_pool_started_before_the_call_is_refused():
    with concurrent.futures.ProcessPoolExecutor(1, multiprocessing.get_context("fork")) as pool:
        pool.submit(len, ()).result()  # the worker is up before the check runs

        def via_pool(config):
            return pool.submit(by_modules, config).result()

        assert via_pool(tx.ModelConfig()) == by_modules(tx.ModelConfig())
        result = quiet(via_pool)
        assert not result.passed and result.mistakes == ["param_child_process"], result.report
        assert pool.submit(len, ()).result() == 0  # the pool works again


def test_switching_the_guard_off_is_caught():
    def unguarded(config):
        labkit.parameters._CHILD_REFUSALS.clear()
        return by_modules(config)

    result = quiet(unguarded)
    assert not result.passed and result.mistakes == ["param_child_process"], result.report



_INIT = nn.Module.__init__  # taken before any check runs, as a learner's notebook could


def _meta_counts(config):
    with torch.device("meta"):
        built = tx.Transformer(config)
    out = dict.fromkeys(GROUPS, 0)
    for name, p in built.named_parameters():
        out[labkit.parameters.group_of(name)] += p.numel()
    return out


def clears_the_hooks(config):
    """The cold reader's attack: clear PyTorch's global hook dicts, restore nn.Module.__init__."""
    from torch.nn.modules import module as m
    for d in (m._global_parameter_registration_hooks, m._global_buffer_registration_hooks,
              m._global_module_registration_hooks):
        d.clear()
    saved, nn.Module.__init__ = nn.Module.__init__, _INIT
    try:
        return _meta_counts(config)
    finally:
        nn.Module.__init__ = saved


def _swap_hooks_and_count(config):
    """A helper that swaps the hook dicts for empty ones and puts them back afterwards."""
    from torch.nn.modules import module as m
    saved = (m._global_parameter_registration_hooks, m._global_buffer_registration_hooks,
             m._global_module_registration_hooks, nn.Module.__init__)
    m._global_parameter_registration_hooks = m._global_buffer_registration_hooks = {}
    m._global_module_registration_hooks, nn.Module.__init__ = {}, _INIT
    try:
        return _meta_counts(config)
    finally:
        (m._global_parameter_registration_hooks, m._global_buffer_registration_hooks,
         m._global_module_registration_hooks, nn.Module.__init__) = saved


def swaps_the_hooks(config):
    return _swap_hooks_and_count(config)


@pytest.mark.parametrize("fn", [clears_the_hooks, swaps_the_hooks], ids=["cleared", "swapped back"])
def test_undoing_the_locks_is_caught(fn):
    """The locks undone through PyTorch's private hook dicts: still param_built_model."""
    result = quiet(fn)
    assert not result.passed and "param_built_model" in result.mistakes, result.report
    from torch.nn.modules import module as m
    for name in labkit.parameters._HOOK_DICTS:  # the test restores what clears_the_hooks broke
        assert isinstance(getattr(m, name), dict)
    assert quiet(by_modules).passed  # the locks are gone after the check
