"""The measured sections of tools/bench.py: training step, attention, decoding, notebooks,
time to 98% on the dates task and the G2P error rates (each returns a report section)."""
from __future__ import annotations

import itertools
import tempfile
import time
import warnings
from pathlib import Path

import torch
from bench_timing import clock, interleaved, median, paired_ratio, peak_cpu_bytes, quiet_stderr
from torch import nn

import tx_helpers as tx
from tx_helpers.data import random_padded_ids
from tx_helpers.interop import reference_model

REPO = Path(__file__).resolve().parent.parent


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
        rows.append([name, median(times[name]) * 1e3, median(times["torch.nn"]) * 1e3,
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
            rows.append([length, mode, median(times["manual"]) * 1e3,
                         median(times["sdpa"]) * 1e3, paired_ratio(times, "manual", "sdpa"),
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
        rows.append([new_tokens, median(times["no cache"]) * 1e3,
                     median(times["kv cache"]) * 1e3,
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
                with quiet_stderr():
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
            start = clock()
            train(model, itertools.islice(batches, chunk), optimizer, scheduler,
                  label_smoothing=recipe["label_smoothing"], clip_norm=recipe["clip_norm"],
                  history=history)
            trained_s += clock() - start
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
    result = g2p.live_run(live, lexicon=lexicon)  # the one shared path; 13's lab checks against it
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
            "run (g2p.LIVE_RECIPE, through g2p.live_run; notebook 13's lab trains a shorter run). "
            "No <eos>: predictions cut at the decoding limit of 32 phones (each adds about 25 "
            "phone errors, so a few move the PER and not the WER).",
        ],
    }
