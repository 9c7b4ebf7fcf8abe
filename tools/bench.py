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
   the live run of ``g2p.LIVE_RECIPE`` (``g2p.live_run``; notebook 13's learner trains a
   shorter run of the same recipe in its lab) with its validation WER and PER.

Numbers from a busy machine are noisy: the header prints the load average at the start
and at the end of the run.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_timing, bench_cases beside it

import torch  # noqa: E402
from bench_cases import (  # noqa: E402
    bench_attention,
    bench_dates,
    bench_decoding,
    bench_g2p,
    bench_notebooks,
    bench_train_step,
    padded_batch,  # noqa: F401 - tests/test_bench_support.py reads it through this module
)
from bench_timing import CLOCKS, loadavg, machine_info, use_clock  # noqa: E402

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
    decode_tokens=(16, 64, 128), decode_batch=8, decode_src_len=32, decode_rounds=3,
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

GOAL_TRAIN_RATIO = 1.0  # tx step time / nn step time
GOAL_KV_SPEEDUP = 4.0  # at 64 new tokens, batch 8 (issue 30)
GOAL_NOTEBOOKS_S = 240.0  # the core series, 00-12
GOAL_REAL_DATA_NB_S = 150.0  # notebook 13 alone
GOAL_DATES_S = 60.0  # training time to 98% exact match
GOAL_G2P_WER, GOAL_G2P_PER = 0.30, 0.075  # shipped model, greedy, held-out words, no stress
GOAL_G2P_LIVE_S = 120.0  # notebook 13's live training


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
    use_clock(args.clock)
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
    report["machine"]["load_average_end"] = loadavg()
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
            subprocess.run([sys.executable, "-m", "labkit.course.exercises"], check=True,
                           cwd=REPO)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
