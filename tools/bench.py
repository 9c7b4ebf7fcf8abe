#!/usr/bin/env python3
"""Speed you can see: one command that measures tx_helpers side by side and writes a table.

  .venv/bin/python tools/bench.py                      # full run (< 10 min on 2 CPU cores)
  .venv/bin/python tools/bench.py --quick --skip-notebooks --skip-dates   # smoke run, seconds
  .venv/bin/python tools/bench.py --update-readme      # also refresh README's bench block

Writes ``benchmarks/latest.md`` and ``benchmarks/latest.json`` (``--out`` changes the
folder) and prints the same Markdown. Sections:

1. Training step (forward + loss + backward + Adam step) of ``tx.Transformer`` with
   ``attn_backend="manual"`` and ``"sdpa"`` against the same model assembled from
   ``torch.nn`` (``tx_helpers.interop.reference_model``: ``nn.Transformer(batch_first=True)``
   plus the same embeddings * sqrt(d), sinusoidal PE, dropout and generator), same
   weights, same padded batch, masks built from the same ids. The three run interleaved
   in rounds; each round times a block of steps per model. Reported: median ms per step
   over rounds and the median of the per-round ratios (paired, so slow drifts of a shared
   machine cancel out).
2. Attention alone (one ``tx.MultiHeadAttention``, self-attention with a key-padding
   mask) at several lengths L: manual against SDPA, eval forward and training
   forward+backward, time and peak memory. Peak memory is the peak of the running sum
   of the CPU allocator's allocation/free events that ``torch.profiler`` records with
   ``profile_memory=True`` during one untimed call (tensors alive before the call,
   such as weights and inputs, are not counted). tracemalloc cannot see torch's
   allocator, and RSS is too coarse (the allocator keeps freed pages).
3. Greedy decoding of an untrained model with and without the KV cache. ``eos_idx`` is
   set to an id outside the vocabulary, so it is never produced and every run
   generates exactly the requested number of tokens.
4. Each notebook ``notebooks/[0-9]*.ipynb`` executed from a fresh kernel with nbclient
   (working directory ``notebooks/``, output written to a temporary copy, never in
   place), wall time including kernel start-up, and the series total.
5. Time to 98% exact match on the dates task: the package's ``DATES_RECIPE``,
   trained exactly as ``tx_helpers.pretrained.train_from_recipe`` does, paused
   periodically to measure free-running greedy exact match on held-out dates; the
   reported time is training time only (evaluation excluded), at the first evaluation
   that reaches the target.
6. English pronunciation (notebook 13): the shipped G2P model's word and phone error
   rates on every held-out test word, greedy and with a beam of 4, and the time of
   notebook 13's live run (``g2p.live_run(g2p.LIVE_RECIPE)``, the notebook's own call) with
   its validation WER and PER.

Numbers from a busy machine are noisy: the header prints the load average at the start
and at the end of the run.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

import tx_helpers as tx
from tx_helpers.data import random_padded_ids
from tx_helpers.interop import reference_model

REPO = Path(__file__).resolve().parent.parent
README_START = "<!-- bench:start -->"
README_END = "<!-- bench:end -->"
START_HERE_START = "<!-- start-here:start -->"
START_HERE_END = "<!-- start-here:end -->"
FORMAT_VERSION = 1

# Settings of a full run and of a --quick smoke run.
FULL = dict(
    train_batch=(32, 32), train_rounds=7, train_warmup=2, train_block_s=0.3,
    attn_lengths=(64, 256, 1024), attn_batch=2, attn_rounds=5, attn_block_s=0.15,
    decode_tokens=(16, 64, 128), decode_batch=32, decode_src_len=32, decode_rounds=3,
    decode_block_s=0.0,
    dates_eval_n=1000, dates_eval_every=25, dates_eval_every_near=10, dates_near=0.95,
    dates_target=0.98, dates_max_steps=None,
    g2p_test_n=None, g2p_live_steps=None,
)
QUICK = dict(
    train_batch=(4, 8), train_rounds=2, train_warmup=1, train_block_s=0.0,
    attn_lengths=(32,), attn_batch=2, attn_rounds=2, attn_block_s=0.0,
    decode_tokens=(4,), decode_batch=2, decode_src_len=8, decode_rounds=2,
    decode_block_s=0.0,
    dates_eval_n=100, dates_eval_every=5, dates_eval_every_near=5, dates_near=0.9,
    dates_target=0.98, dates_max_steps=10,
    g2p_test_n=200, g2p_live_steps=5,
)

# The clock of the timed blocks: wall time (default) or this process's CPU time
# (--clock cpu: with --threads 1 it is far less disturbed by other processes on a shared
# machine, but it hides waiting, so the final numbers should be wall time).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter

GOAL_TRAIN_RATIO = 1.0  # tx step time / nn step time
GOAL_KV_SPEEDUP = 3.0  # at 64 new tokens
GOAL_NOTEBOOKS_S = 240.0  # the core series, 00-12
GOAL_REAL_DATA_NB_S = 150.0  # notebook 13 alone
GOAL_DATES_S = 60.0  # training time to 98% exact match
GOAL_G2P_WER, GOAL_G2P_PER = 0.30, 0.075  # shipped model, greedy, held-out words, no stress
GOAL_G2P_LIVE_S = 120.0  # notebook 13's live training


# ---------------------------------------------------------------- timing helpers

def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def interleaved(cases: dict, *, rounds: int, warmup: int = 1, block_s: float = 0.0) -> dict:
    """Time callables in interleaved rounds: ``{name: [seconds per call, one per round]}``.

    Each callable first runs ``warmup`` times; with ``block_s`` > 0 the last warm-up
    call (there is at least one) sets the number of calls per timed block, so that a
    block lasts about ``block_s`` seconds (at least one call).
    The order rotates from round to round so that no case always runs first.
    """
    reps = {}
    for name, fn in cases.items():
        elapsed = 0.0
        for _ in range(max(1, warmup) if block_s > 0 else warmup):
            start = _clock()
            fn()
            elapsed = _clock() - start
        reps[name] = max(1, math.ceil(block_s / max(elapsed, 1e-9)))
    names = list(cases)
    times = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn, n = cases[name], reps[name]
            start = _clock()
            for _ in range(n):
                fn()
            times[name].append((_clock() - start) / n)
    return times


def paired_ratio(times: dict, a: str, b: str) -> float:
    """Median over rounds of time[a] / time[b] measured in the same round."""
    return _median([x / y for x, y in zip(times[a], times[b], strict=True)])


@contextlib.contextmanager
def _quiet_stderr():
    """Silence C++-level stderr (the profiler prints start/stop lines and warnings)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def peak_cpu_bytes(fn) -> int | None:
    """Peak extra CPU memory during one ``fn()``, from torch.profiler's allocator events.

    Running sum of every allocation (+) and free (-) the profiler records, in time
    order; the peak is relative to the memory in use when ``fn`` starts. None when this
    torch build does not expose the events.
    """
    with _quiet_stderr(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True) as prof:
            fn()
        try:
            events = [e for e in prof.profiler.kineto_results.events()
                      if e.name() == "[memory]"]
        except AttributeError:
            return None
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return peak


# ---------------------------------------------------------------- machine

def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "clock": "process CPU time" if _clock is time.process_time else "wall time",
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_average_start": _loadavg(),
    }


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------- 1. training step

def padded_batch(n: int, length: int, vocab: int, pad: int, generator) -> torch.Tensor:
    """(n, length) ids without ``pad``, each row padded after a random length in [L/2, L]."""
    lengths = torch.randint(max(1, length // 2), length + 1, (n,), generator=generator)
    lengths[0] = length  # one full row, so the batch really is `length` long
    return random_padded_ids(lengths, length, vocab, pad, generator)


def bench_train_step(s: dict) -> dict:
    config = tx.ModelConfig()  # the article's defaults
    n, length = s["train_batch"]
    gen = torch.Generator().manual_seed(0)
    src = padded_batch(n, length, config.src_vocab_size, config.pad_idx, gen)
    tgt = padded_batch(n, length + 1, config.tgt_vocab_size, config.pad_idx, gen)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]

    torch.manual_seed(0)
    manual = tx.Transformer(config)
    sdpa = tx.Transformer(tx.ModelConfig(attn_backend="sdpa"))
    sdpa.load_state_dict(manual.state_dict())
    ref = reference_model(manual)

    # The three compute the same function (eval mode, where dropout is off).
    keep = tgt_out != config.pad_idx
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nn's eval fast path: nested-tensor notice
        logits = [m.eval()(src, tgt_in)[keep] for m in (manual, sdpa, ref)]
    max_diff = max((logits[0] - other).abs().max().item() for other in logits[1:])
    if max_diff > 1e-3:
        raise AssertionError(f"the models disagree in eval mode: max |dlogits| = {max_diff}")

    criterion = nn.CrossEntropyLoss(ignore_index=config.pad_idx, label_smoothing=0.1)
    models = {"tx manual": manual, "tx sdpa": sdpa, "torch.nn": ref}
    optims = {k: tx.paper_adam(m.parameters(), lr=1e-4) for k, m in models.items()}

    def make_step(model, optimizer):
        def step():
            model.train()
            out = model(src, tgt_in)  # (N, L_tgt, V)
            loss = criterion(out.reshape(-1, out.size(-1)), tgt_out.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return step

    cases = {k: make_step(models[k], optims[k]) for k in models}
    times = interleaved(cases, rounds=s["train_rounds"], warmup=s["train_warmup"],
                        block_s=s["train_block_s"])
    rows = []
    for name in ("tx manual", "tx sdpa"):
        rows.append([name, _median(times[name]) * 1e3, _median(times["torch.nn"]) * 1e3,
                     paired_ratio(times, name, "torch.nn")])
    return {
        "title": "Training step (forward + loss + backward + Adam step)",
        "columns": ["path", "tx ms/step", "torch.nn ms/step", "ratio tx/nn"],
        "rows": rows,
        "raw_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
        "notes": [
            f"ModelConfig() defaults (d_model {config.d_model}, {config.n_heads} heads, d_ff "
            f"{config.d_ff}, {config.n_layers}+{config.n_layers} layers, dropout "
            f"{config.dropout}, Post-LN); batch {n} x {length} source and target tokens with "
            f"padding ({int((src == config.pad_idx).sum())} + "
            f"{int((tgt_in == config.pad_idx).sum())} pads); label smoothing 0.1.",
            f"Same weights in all three; eval-mode logits agree to {max_diff:.1e}. "
            f"{s['train_rounds']} interleaved rounds; ratio = median of per-round ratios.",
        ],
    }


# ---------------------------------------------------------------- 2. attention alone

def bench_attention(s: dict) -> dict:
    d_model, n_heads, n = 128, 8, s["attn_batch"]
    rows, raw = [], {}
    for length in s["attn_lengths"]:
        torch.manual_seed(0)
        manual = tx.MultiHeadAttention(d_model, n_heads, dropout=0.1)
        sdpa = tx.MultiHeadAttention(d_model, n_heads, dropout=0.1, backend="sdpa")
        sdpa.load_state_dict(manual.state_dict())
        x = torch.randn(n, length, d_model)
        mask = torch.zeros(n, 1, length, dtype=torch.bool)  # key padding (N, 1, L)
        mask[1:, :, (3 * length) // 4:] = True  # rows after the first: last quarter padded
        x_grad = x.clone().requires_grad_()

        def forward_eval(m, x=x, mask=mask):
            def run():
                m.eval()
                with torch.no_grad():
                    m(x, x, x, mask)
            return run

        def train_fwd_bwd(m, x_grad=x_grad, mask=mask):
            def run():
                m.train()
                m.zero_grad(set_to_none=True)
                x_grad.grad = None
                m(x_grad, x_grad, x_grad, mask).sum().backward()
            return run

        for mode, make in (("eval forward", forward_eval), ("train fwd+bwd", train_fwd_bwd)):
            cases = {"manual": make(manual), "sdpa": make(sdpa)}
            times = interleaved(cases, rounds=s["attn_rounds"], warmup=1,
                                block_s=s["attn_block_s"])
            peaks = {k: peak_cpu_bytes(fn) for k, fn in cases.items()}
            raw[f"L={length} {mode}"] = {k: [t * 1e3 for t in v] for k, v in times.items()}
            rows.append([length, mode, _median(times["manual"]) * 1e3,
                         _median(times["sdpa"]) * 1e3, paired_ratio(times, "manual", "sdpa"),
                         _mib(peaks["manual"]), _mib(peaks["sdpa"])])
        manual.attn_weights = None
    scores_mib = [n * n_heads * L * L * 4 / 2**20 for L in s["attn_lengths"]]
    return {
        "title": "Attention alone (tx.MultiHeadAttention, self-attention, key-padding mask)",
        "columns": ["L", "mode", "manual ms", "sdpa ms", "speed-up sdpa", "manual peak MiB",
                    "sdpa peak MiB"],
        "rows": rows,
        "raw_ms": raw,
        "notes": [
            f"d_model {d_model}, {n_heads} heads, batch {n}, dropout 0.1 (train mode). One "
            f"(N, H, L, L) float32 tensor is "
            + ", ".join(f"{m:.1f} MiB at L={L}"
                        for m, L in zip(scores_mib, s["attn_lengths"], strict=True)) + ".",
            "Peak memory: torch.profiler(profile_memory=True), peak of the running sum of "
            "allocator events during one call (inputs and weights excluded). The manual "
            "path also keeps its weights in attn_weights for plotting.",
            "On CPU, PyTorch's fused (flash) kernel serves SDPA only without dropout: in "
            "train mode with dropout_p > 0 SDPA falls back to its math kernel, which also "
            "materialises the (N, H, L, L) weights.",
        ],
    }


def _mib(nbytes):
    return None if nbytes is None else nbytes / 2**20


# ---------------------------------------------------------------- 3. greedy decoding

def bench_decoding(s: dict) -> dict:
    config = tx.ModelConfig()
    torch.manual_seed(0)
    model = tx.Transformer(config).eval()
    gen = torch.Generator().manual_seed(1)
    src = padded_batch(s["decode_batch"], s["decode_src_len"], config.src_vocab_size,
                       config.pad_idx, gen)
    eos = 2  # made unreachable below, so no row ever ends
    with torch.no_grad():
        model.generator.bias[eos] = float("-inf")
    rows, raw = [], {}
    for new_tokens in s["decode_tokens"]:
        outputs = {}

        def make(use_cache, new_tokens=new_tokens, outputs=outputs):
            def run():
                ids = tx.greedy_decode(model, src, bos_idx=0, eos_idx=eos,
                                       max_len=new_tokens, use_cache=use_cache)
                outputs[use_cache] = ids
            return run

        cases = {"no cache": make(False), "kv cache": make(True)}
        times = interleaved(cases, rounds=s["decode_rounds"],
                            warmup=1 if new_tokens == s["decode_tokens"][0] else 0,
                            block_s=s["decode_block_s"])
        for ids in outputs.values():
            if ids.shape != (src.size(0), new_tokens + 1):
                raise AssertionError(f"expected {new_tokens} new tokens, got {ids.shape}")
        same = bool(torch.equal(outputs[False], outputs[True]))
        raw[f"{new_tokens} tokens"] = {k: [t * 1e3 for t in v] for k, v in times.items()}
        rows.append([new_tokens, _median(times["no cache"]) * 1e3,
                     _median(times["kv cache"]) * 1e3,
                     paired_ratio(times, "no cache", "kv cache"), "yes" if same else "no"])
    return {
        "title": "Greedy decoding (untrained ModelConfig() model, manual attention)",
        "columns": ["new tokens", "no cache ms", "kv cache ms", "speed-up", "same tokens"],
        "rows": rows,
        "raw_ms": raw,
        "notes": [
            f"Batch of {src.size(0)} sources of {src.size(1)} tokens (padded); the "
            f"generator's bias for eos_idx = {eos} is -inf, so exactly that many tokens are "
            f"generated.",
        ],
    }


# ---------------------------------------------------------------- 4. notebooks

def bench_notebooks(s: dict) -> dict:
    import nbformat
    from nbclient import NotebookClient

    folder = REPO / "notebooks"
    paths = sorted(folder.glob(s["nb_glob"]))
    rows, total = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            nb = nbformat.read(path, as_version=4)
            client = NotebookClient(nb, timeout=600, kernel_name="python3",
                                    resources={"metadata": {"path": str(folder)}})
            start = time.perf_counter()
            status = "ok"
            try:
                with _quiet_stderr():
                    client.execute()
            except Exception as exc:  # a failing cell: record it, keep going
                status = f"error: {type(exc).__name__}"
            elapsed = time.perf_counter() - start
            nbformat.write(nb, Path(tmp) / path.name)
            total += elapsed
            rows.append([path.name, elapsed, status])
    rows.append(["total", total, f"{len(paths)} notebooks"])
    return {
        "title": "Notebooks (fresh kernel each, executed into a temporary copy)",
        "columns": ["notebook", "seconds", "status"],
        "rows": rows,
        "total_s": total,
        "subset": s["nb_glob"] != "[0-9]*.ipynb",
        "notes": [
            "Wall time of nbclient's execute(), kernel start-up included, working directory "
            "notebooks/. The trained models are the shipped files in tx_helpers/models/ "
            "(nothing is trained for notebooks 09-11).",
        ],
    }


# ---------------------------------------------------------------- 5. dates task

def bench_dates(s: dict) -> dict:
    from tx_helpers.data import DATE_VOCAB, DatePairs, exact_match_accuracy
    from tx_helpers.pretrained import DATES_RECIPE, dates_training
    from tx_helpers.training import History, train

    recipe = dict(DATES_RECIPE)
    if s.get("dates_steps"):  # --dates-steps: the same recipe, trained for longer or shorter
        recipe["steps"] = s["dates_steps"]
    steps = recipe["steps"] if s["dates_max_steps"] is None else s["dates_max_steps"]
    # The same objects tx_helpers.pretrained.train_from_recipe trains, paused to evaluate.
    state = torch.get_rng_state()
    model, optimizer, scheduler, batches = dates_training(recipe)
    pairs = DatePairs(recipe["test_fraction"], recipe["split_seed"])
    held_out = pairs.sample(s["dates_eval_n"], "test", seed=2024)
    history = History()
    trained_s, done, curve, reached = 0.0, 0, [], None
    eval_s = 0.0
    try:
        while done < steps:
            last = curve[-1][2] if curve else 0.0
            every = s["dates_eval_every_near"] if last >= s["dates_near"] else s["dates_eval_every"]
            chunk = min(every, steps - done)
            start = _clock()
            train(model, itertools.islice(batches, chunk), optimizer, scheduler,
                  label_smoothing=recipe["label_smoothing"], clip_norm=recipe["clip_norm"],
                  history=history)
            trained_s += _clock() - start
            done += chunk
            start = time.perf_counter()
            acc = exact_match_accuracy(model, held_out, DATE_VOCAB, max_len=12,
                                       batch_size=len(held_out))
            eval_s += time.perf_counter() - start
            curve.append((done, round(trained_s, 2), acc))
            if acc >= s["dates_target"]:
                reached = (done, trained_s, acc)
                break
    finally:
        torch.set_rng_state(state)
    last_step, last_s, last_acc = curve[-1]
    rows = [["steps", reached[0] if reached else f"not reached in {last_step}"],
            ["training seconds", reached[1] if reached else last_s],
            ["exact match", reached[2] if reached else last_acc]]
    return {
        "title": f"Dates task: training time to {s['dates_target']:.0%} exact match",
        "columns": ["", "value"],
        "rows": rows,
        "reached": reached is not None,
        "seconds": reached[1] if reached else None,
        "curve": curve,
        "notes": [
            ("DATES_RECIPE" if recipe == DATES_RECIPE else f"DATES_RECIPE with steps="
             f"{recipe['steps']}") + f" (d_model {recipe['model']['d_model']}, batch "
            f"{recipe['batch_size']}, up to {steps} steps, warmup {recipe['warmup']}); greedy "
            f"exact match on {len(held_out)} held-out dates every {s['dates_eval_every']} "
            f"steps, every {s['dates_eval_every_near']} once >= {s['dates_near']:.0%}. "
            f"Training time includes making the batches; the {eval_s:.1f} s of evaluation "
            f"are excluded.",
            "Curve (step, s, exact match): "
            + ", ".join(f"({a}, {b}, {c:.3f})" for a, b, c in curve),
        ],
    }


# ---------------------------------------------------------------- 6. pronunciation

def bench_g2p(s: dict) -> dict:
    from tx_helpers import g2p

    lexicon = g2p.load_lexicon()
    _, _, test = g2p.split_words(lexicon, **g2p.G2P_RECIPE["split"])
    test = test[: s["g2p_test_n"]] if s["g2p_test_n"] else test
    model = g2p.load_pretrained("cpu")
    rows = []
    for beam in (1, 4):
        start = time.perf_counter()
        result = g2p.evaluate(test, model=model, beam_size=beam, lexicon=lexicon)
        rows.append([f"shipped, {'greedy' if beam == 1 else f'beam of {beam}'}",
                     result["words"], f"{result['wer']:.1%}", f"{result['per']:.1%}",
                     result["unfinished"], time.perf_counter() - start])
    live = {**g2p.LIVE_RECIPE, "steps": s["g2p_live_steps"] or g2p.LIVE_RECIPE["steps"]}
    result = g2p.live_run(live, lexicon=lexicon)  # the call notebook 13 makes: one code path
    history = result["history"]
    rows.append([f"live run, {live['steps']} steps (validation words)", result["words"],
                 f"{result['wer']:.1%}", f"{result['per']:.1%}", result["unfinished"],
                 history.seconds])
    return {
        "title": "English pronunciation (notebook 13): shipped model and live run",
        "columns": ["model", "words", "WER", "PER", "no <eos>", "seconds"],
        "rows": rows,
        "wer": float(rows[0][2].rstrip("%")) / 100, "per": float(rows[0][3].rstrip("%")) / 100,
        "full_test": not (s["g2p_test_n"] or s["g2p_live_steps"]),
        "live_s": history.seconds,
        "notes": [
            "Held-out test words of g2p.split_words (none is a training word), stress digits "
            "removed; a word is right when it matches any of its pronunciations. Seconds: "
            "scoring time for the shipped model, training time (without scoring) for the live "
            "run (g2p.LIVE_RECIPE, through g2p.live_run, the call notebook 13 makes). "
            "No <eos>: predictions cut at the decoding limit of 32 phones (each adds about 25 "
            "phone errors, so a few move the PER and not the WER).",
        ],
    }


# ---------------------------------------------------------------- report

def _fmt(v) -> str:
    if v is None:
        return "n/a"  # also a goal that a partial run cannot judge
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    return str(v)


def goals(sections: dict) -> list[dict]:
    out = []

    def add(name, value, target, met):
        out.append({"goal": name, "value": value, "target": target, "met": met})

    if "train" in sections:
        for row in sections["train"]["rows"]:
            ratio = row[3]
            add(f"training step {row[0]} vs torch.nn", f"ratio {ratio:.2f}",
                f"<= {GOAL_TRAIN_RATIO:.1f}", ratio <= GOAL_TRAIN_RATIO)
    if "attention" in sections:
        longest = max(r[0] for r in sections["attention"]["rows"])
        for row in sections["attention"]["rows"]:
            if row[0] == longest:
                add(f"SDPA faster than manual, L={longest}, {row[1]}", f"x{row[4]:.2f}", "> 1",
                    row[4] > 1.0)
    if "decoding" in sections:
        for row in sections["decoding"]["rows"]:
            if row[0] == 64:
                add("KV cache speed-up at 64 new tokens", f"x{row[3]:.2f}",
                    f">= {GOAL_KV_SPEEDUP:.0f}", row[3] >= GOAL_KV_SPEEDUP)
    if "notebooks" in sections:
        rows = sections["notebooks"]["rows"][:-1]
        core = [r for r in rows if not r[0].startswith("13_")]
        total = sum(r[1] for r in core)
        ok = all(r[2] == "ok" for r in core)
        subset = sections["notebooks"]["subset"]
        add("notebook series 00-12" + (" (a subset: --nb-glob)" if subset else ""),
            f"{total:.0f} s" + ("" if ok else " (errors)"), f"< {GOAL_NOTEBOOKS_S:.0f} s",
            None if subset else ok and total < GOAL_NOTEBOOKS_S)
        for name, seconds, status in rows:
            if name.startswith("13_"):
                add("notebook 13 (real data)", f"{seconds:.0f} s" + (
                    "" if status == "ok" else " (errors)"), f"< {GOAL_REAL_DATA_NB_S:.0f} s",
                    status == "ok" and seconds < GOAL_REAL_DATA_NB_S)
    if "dates" in sections:
        d = sections["dates"]
        add("dates task to 98% exact match",
            f"{d['seconds']:.1f} s" if d["reached"] else "not reached",
            f"< {GOAL_DATES_S:.0f} s", bool(d["reached"] and d["seconds"] < GOAL_DATES_S))
    if "g2p" in sections:
        g = sections["g2p"]
        full = g["full_test"]
        add("G2P shipped model WER, greedy" + ("" if full else " (a subset: --quick)"),
            f"{g['wer']:.1%}", f"<= {GOAL_G2P_WER:.0%}", g["wer"] <= GOAL_G2P_WER if full else None)
        add("G2P shipped model PER, greedy" + ("" if full else " (a subset: --quick)"),
            f"{g['per']:.1%}", f"<= {GOAL_G2P_PER:.1%}",
            g["per"] <= GOAL_G2P_PER if full else None)
        add("G2P live run (notebook 13)" + ("" if full else " (shortened: --quick)"),
            f"{g['live_s']:.0f} s", f"< {GOAL_G2P_LIVE_S:.0f} s",
            g["live_s"] < GOAL_G2P_LIVE_S if full else None)
    return out


def to_markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "## Benchmarks",
        "",
        f"Measured {m['date']} with `tools/bench.py{report['argv']}` on {m['cpu']}, "
        f"{m['usable_cores']} usable of {m['logical_cores']} logical cores, torch {m['torch']} "
        f"({m['torch_threads']} threads), Python {m['python']}; sections 1-3 and 5 timed "
        f"in {m['clock']}. Load average (1, 5, 15 min): "
        f"{m['load_average_start']} at the start, {m.get('load_average_end')} at the end "
        f"(above the core count means shared, noisy numbers). Total run time "
        f"{report['seconds']:.0f} s.",
        "",
    ]
    if report["goals"]:
        lines += ["| goal | measured | target | met |", "|---|---|---|---|"]
        lines += [f"| {g['goal']} | {g['value']} | {g['target']} | {_fmt(g['met'])} |"
                  for g in report["goals"]]
        lines.append("")
    for sec in report["sections"].values():
        lines += [f"### {sec['title']}", ""]
        lines.append("| " + " | ".join(sec["columns"]) + " |")
        lines.append("|" + "---|" * len(sec["columns"]))
        for row in sec["rows"]:
            lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
        lines.append("")
        lines += [f"- {n}" for n in sec.get("notes", [])]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _replace_block(text: str, start_marker: str, end_marker: str, body: str, where: str) -> str:
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        raise SystemExit(f"README: add a line {start_marker} and a line {end_marker} "
                         f"where {where} goes, then run again")
    return text[: start + len(start_marker)] + "\n" + body + text[end:]


def start_here(report: dict) -> str | None:
    """The README's reading path: each notebook's title and its measured time (full runs only)."""
    section = report["sections"].get("notebooks")
    if not section or section["subset"]:
        return None
    import nbformat

    lines = ["| Notebook | Runs in |", "|---|---|"]
    for name, seconds, status in section["rows"][:-1]:
        nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
        title = nb.cells[0].source.splitlines()[0].lstrip("# ").strip()
        lines.append(f"| [{title}](notebooks/{name}) | "
                     f"{f'about {seconds:.0f} s' if status == 'ok' else status} |")
    total = section["total_s"]
    lines += ["", f"The whole series: about {total / 60:.0f} minutes of running, one notebook "
                  f"at a time (measured {report['machine']['date']})."]
    return "\n".join(lines) + "\n"


RUNS_IN = re.compile(r"(Runs in\W*)about \d+ s on \d+ CPU cores")


def update_notebook_times(report: dict) -> list[str]:
    """Rewrite each notebook's "Runs in about N s on C CPU cores" line with the measured N.

    Only the first (markdown) cell changes, which nbval does not compare. Returns the names of
    the notebooks that changed; a notebook without such a line is left alone.
    """
    import nbformat

    section = report["sections"].get("notebooks")
    if not section or section["subset"]:
        return []
    cores = report["machine"]["usable_cores"]
    changed = []
    for name, seconds, status in section["rows"][:-1]:
        path = REPO / "notebooks" / name
        nb = nbformat.read(path, as_version=4)
        old = nb.cells[0].source
        new = RUNS_IN.sub(lambda m, s=seconds: f"{m.group(1)}about {s:.0f} s on {cores} CPU cores",
                          old)
        if status == "ok" and new != old:
            nb.cells[0].source = new
            nbformat.write(nb, path)
            changed.append(name)
    return changed


def update_readme(readme: Path, markdown: str, report: dict | None = None) -> None:
    """Replace the text between the bench markers (and the start-here markers, after a full
    notebook run) in ``readme``; nothing else changes."""
    text = readme.read_text(encoding="utf-8")
    text = _replace_block(text, README_START, README_END,
                          markdown.replace("## Benchmarks\n\n", "", 1), "the benchmark table")
    path = None if report is None else start_here(report)
    if path is not None:
        text = _replace_block(text, START_HERE_START, START_HERE_END, path, "the reading path")
    readme.write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings: a smoke run")
    parser.add_argument("--skip-notebooks", action="store_true")
    parser.add_argument("--skip-dates", action="store_true")
    parser.add_argument("--only", nargs="+",
                        choices=["train", "attention", "decoding", "notebooks", "dates", "g2p"],
                        help="run only these sections")
    parser.add_argument("--dates-steps", type=int, default=None,
                        help="train the dates recipe for this many steps instead")
    parser.add_argument("--nb-glob", default="[0-9]*.ipynb",
                        help="which notebooks/ files the notebook section runs")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's own choice)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="timer of sections 1-3 and 5: wall (default) or process CPU time")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks",
                        help="folder for latest.md and latest.json")
    parser.add_argument("--update-readme", action="store_true",
                        help=f"rewrite the block between {README_START} and {README_END}")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, argv)
    finally:
        torch.set_num_threads(threads)


def _run(args, argv) -> int:
    global _clock
    _clock = CLOCKS[args.clock]
    settings = dict(QUICK if args.quick else FULL, dates_steps=args.dates_steps,
                    nb_glob=args.nb_glob)
    wanted = args.only or ["train", "attention", "decoding", "notebooks", "dates", "g2p"]
    if args.skip_notebooks and "notebooks" in wanted:
        wanted.remove("notebooks")
    if args.skip_dates and "dates" in wanted:
        wanted.remove("dates")

    flags = [f for f, on in (("--quick", args.quick), ("--skip-notebooks", args.skip_notebooks),
                             ("--skip-dates", args.skip_dates)) if on]
    if args.only:
        flags.append("--only " + " ".join(args.only))
    if args.threads:
        flags.append(f"--threads {args.threads}")
    if args.dates_steps:
        flags.append(f"--dates-steps {args.dates_steps}")
    if args.nb_glob != "[0-9]*.ipynb":
        flags.append(f"--nb-glob '{args.nb_glob}'")
    if args.clock != "wall":
        flags.append(f"--clock {args.clock}")
    report = {"format": FORMAT_VERSION, "argv": "".join(f" {a}" for a in flags),
              "machine": machine_info(), "settings": settings, "sections": {}}
    started = time.perf_counter()
    runners = {"train": bench_train_step, "attention": bench_attention,
               "decoding": bench_decoding, "notebooks": bench_notebooks, "dates": bench_dates,
               "g2p": bench_g2p}
    for name in wanted:
        t = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        report["sections"][name] = runners[name](settings)
        report["sections"][name]["section_s"] = round(time.perf_counter() - t, 1)
        print(f"[bench] {name} done in {time.perf_counter() - t:.1f} s", file=sys.stderr,
              flush=True)
    report["seconds"] = time.perf_counter() - started
    report["machine"]["load_average_end"] = _loadavg()
    report["goals"] = goals(report["sections"])

    markdown = to_markdown(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.md").write_text(markdown, encoding="utf-8")
    (args.out / "latest.json").write_text(json.dumps(report, indent=1, default=str) + "\n",
                                          encoding="utf-8")
    if args.update_readme:
        update_readme(args.readme, markdown, report)
        changed = update_notebook_times(report)
        for name in changed:
            print(f"[bench] updated the run time in {name}", file=sys.stderr)
        if changed:  # the student copies repeat the first cell: keep them in step
            subprocess.run([sys.executable, str(REPO / "tools" / "make_exercises.py")], check=True)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
