"""tools/bench.py runs and writes a well-formed table; the two attention backends agree.

Equality between ``attn_backend="manual"`` and ``"sdpa"`` (tests/test_parity.py covers
eval mode, forward and backward, every mask form): here the training-mode side.
Both apply dropout with probability p to the attention weights (after the softmax,
survivors scaled by 1/(1-p)), but SDPA draws its mask its own way (on CUDA its fused
kernels use their own Philox stream), so in training the two are equal in
distribution, not sample by sample. With dropout=0 they are equal in training mode too.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    L_SRC,
    L_TGT,
    SRC_LENGTHS,
    SRC_VOCAB,
    TGT_LENGTHS,
    TGT_VOCAB,
    padded_ids,
    small_config,
)
from torch import nn

import tx_helpers as tx
from tx_helpers.interop import reference_model

REPO = Path(__file__).resolve().parent.parent
DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-10)


def _load_bench():
    spec = importlib.util.spec_from_file_location("tx_bench", REPO / "tools" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tx_bench"] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- backends in training mode

@pytest.mark.parametrize("norm_first", [False, True])
def test_backends_equal_in_train_mode_without_dropout(norm_first):
    """dropout=0: training mode has nothing random, so forward and every gradient match."""
    manual = tx.Transformer(small_config(dropout=0.0, norm_first=norm_first)).to(DT).train()
    sdpa = tx.Transformer(small_config(dropout=0.0, norm_first=norm_first,
                                       attn_backend="sdpa")).to(DT).train()
    sdpa.load_state_dict(manual.state_dict())
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)
    outs = []
    for model in (manual, sdpa):
        logits = model(src, tgt)
        logits.square().sum().backward()
        outs.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    (lm, gm), (ls, gs) = outs
    torch.testing.assert_close(ls, lm, **TOL)
    assert gm.keys() == gs.keys()
    for name in gm:
        torch.testing.assert_close(gs[name], gm[name], **TOL, msg=name)


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_attention_dropout_drops_weights_and_rescales_survivors(backend):
    """With v = identity the output *is* the dropped-out weight matrix, so both backends
    can be inspected: about p of the weights are zero, the rest are w / (1 - p)."""
    p, n, h, l_q, l_k, d_k = 0.3, 8, 4, 16, 16, 8
    q, k = torch.randn(n, h, l_q, d_k, dtype=DT), torch.randn(n, h, l_k, d_k, dtype=DT)
    eye = torch.eye(l_k, dtype=DT).expand(n, h, l_k, l_k)  # (N, H, L_k, L_k) values
    _, weights = tx.scaled_dot_product_attention(q, k, eye)  # eval weights, all > 0
    if backend == "manual":
        dropped, _ = tx.scaled_dot_product_attention(q, k, eye, dropout=nn.Dropout(p).train())
    else:
        dropped = F.scaled_dot_product_attention(q, k, eye, dropout_p=p)
    zero = dropped == 0
    share, count = zero.double().mean().item(), zero.numel()
    assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / count), share
    torch.testing.assert_close(dropped[~zero], weights[~zero] / (1 - p), **TOL)


def test_train_mode_outputs_average_to_eval_output_for_both_backends():
    """Dropout is unbiased and the output is linear in the weights: over many draws the
    training-mode output averages to the eval output, with the same spread in both
    backends (equal in distribution)."""
    copies, length, d_model, heads = 4000, 5, 16, 4
    manual = tx.MultiHeadAttention(d_model, heads, dropout=0.2).to(DT)
    sdpa = tx.MultiHeadAttention(d_model, heads, dropout=0.2, backend="sdpa").to(DT)
    sdpa.load_state_dict(manual.state_dict())
    x = torch.randn(1, length, d_model, dtype=DT)
    mask = torch.tensor([[False, False, False, True, True]])  # (1, L_k): two padded keys
    with torch.no_grad():
        expected = manual.eval()(x, x, x, mask)[0]  # (L, d_model)
        xs = x.expand(copies, length, d_model)  # one independent dropout draw per copy
        stds = []
        for module in (manual.train(), sdpa.train()):
            out = module(xs, xs, xs, mask)  # (copies, L, d_model)
            mean, std = out.mean(0), out.std(0)
            assert (mean - expected).abs().max() < (6 * std / math.sqrt(copies)).max() + 1e-12
            stds.append(std)
    ratio = stds[1] / stds[0]
    assert 0.9 < ratio.median() < 1.1, ratio.median()


# ---------------------------------------------------------------- tools/bench.py

@pytest.mark.slow  # a quick bench run; the table and README tests stay fast
def test_bench_quick_run_writes_well_formed_table(tmp_path):
    bench = _load_bench()
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nbefore\n<!-- bench:start -->\nold table\n<!-- bench:end -->\n"
                      "after\n", encoding="utf-8")
    threads = torch.get_num_threads()
    assert bench.main(["--quick", "--skip-notebooks", "--skip-dates", "--threads", "1",
                       "--out", str(tmp_path), "--update-readme", "--readme", str(readme)]) == 0
    assert torch.get_num_threads() == threads  # restored

    md = (tmp_path / "latest.md").read_text(encoding="utf-8")
    report = json.loads((tmp_path / "latest.json").read_text(encoding="utf-8"))
    assert md.startswith("## Benchmarks\n")
    assert "torch " + torch.__version__ in md
    assert set(report["sections"]) == {"train", "attention", "decoding", "g2p"}
    for key in ("date", "cpu", "logical_cores", "torch", "torch_threads"):
        assert report["machine"][key] not in (None, "")
    assert report["machine"]["torch_threads"] == 1

    for section in report["sections"].values():
        assert f"### {section['title']}" in md
        header = "| " + " | ".join(section["columns"]) + " |"
        lines = md.splitlines()
        start = lines.index(header)
        assert lines[start + 1] == "|" + "---|" * len(section["columns"])
        table = lines[start + 2:start + 2 + len(section["rows"])]
        assert all(line.count("|") == len(section["columns"]) + 1 for line in table)
        assert all(len(row) == len(section["columns"]) for row in section["rows"])
    numbers = [v for s in report["sections"].values() for row in s["rows"] for v in row
               if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) and v > 0 for v in numbers)
    goals = {g["goal"] for g in report["goals"]}
    assert {"training step tx manual vs torch.nn", "training step tx sdpa vs torch.nn"} <= goals
    assert all(line in md for line in ("| goal | measured | target | met |",))
    assert all(row[-1] == "yes" for row in report["sections"]["decoding"]["rows"])

    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# Title\n\nbefore\n<!-- bench:start -->\n")
    assert text.endswith("<!-- bench:end -->\nafter\n")
    assert "old table" not in text and "### Training step" in text


def test_update_readme_needs_both_markers(tmp_path):
    bench = _load_bench()
    readme = tmp_path / "README.md"
    readme.write_text("# no markers here\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="bench:start"):
        bench.update_readme(readme, "## Benchmarks\n\ntable\n")
    assert readme.read_text(encoding="utf-8") == "# no markers here\n"


def test_nn_assembly_computes_the_same_function():
    """The torch.nn model the benchmark races against is the same model, weight for weight."""
    config = small_config()
    mine = tx.Transformer(config).to(DT).eval()
    ref = reference_model(mine)
    assert not ref.training and next(ref.parameters()).dtype == DT
    src = padded_ids(SRC_LENGTHS, L_SRC, SRC_VOCAB)
    tgt = padded_ids(TGT_LENGTHS, L_TGT, TGT_VOCAB)
    keep = tgt != config.pad_idx
    with torch.no_grad():
        torch.testing.assert_close(ref(src, tgt)[keep], mine(src, tgt)[keep], **TOL)


def test_bench_batches_are_padded_after_a_random_length():
    ids = _load_bench().padded_batch(6, 9, 11, 1, torch.Generator().manual_seed(0))
    real = (ids != 1).sum(1)
    assert ids.shape == (6, 9) and real[0] == 9 and bool((real >= 4).all())
    assert all(bool((row[n:] == 1).all()) for row, n in zip(ids, real.tolist(), strict=True))


def test_start_here_table_lists_every_notebook_with_its_time(tmp_path):
    bench = _load_bench()
    names = sorted(p.name for p in (bench.REPO / "notebooks").glob("[0-9]*.ipynb"))
    rows = [[name, 10.0 + i, "ok"] for i, name in enumerate(names)] + [["total", 99.0, ""]]
    report = {"machine": {"date": "today"},
              "sections": {"notebooks": {"rows": rows, "subset": False, "total_s": 600.0}}}
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- bench:start -->\n<!-- bench:end -->\n"
                      "<!-- start-here:start -->\nold\n<!-- start-here:end -->\nb\n")
    bench.update_readme(readme, "## Benchmarks\n\ntable\n", report)
    text = readme.read_text()
    assert "old" not in text and "about 10 minutes" in text
    for i, name in enumerate(names):
        assert f"(notebooks/{name}) | about {10 + i} s |" in text
    assert "[00 · Overview" in text


def test_notebook_run_times_are_rewritten_from_the_measurement(tmp_path, monkeypatch):
    import nbformat

    bench = _load_bench()
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "# 99 · Test\n\n**Runs in** about 8 s on 2 CPU cores (measured by `make bench`).")])
    nbformat.write(nb, tmp_path / "notebooks" / "99_test.ipynb")
    monkeypatch.setattr(bench, "REPO", tmp_path)
    report = {"machine": {"usable_cores": 2},
              "sections": {"notebooks": {"rows": [["99_test.ipynb", 12.4, "ok"], ["total", 1, ""]],
                                         "subset": False}}}
    assert bench.update_notebook_times(report) == ["99_test.ipynb"]
    text = nbformat.read(tmp_path / "notebooks" / "99_test.ipynb", as_version=4).cells[0].source
    assert "**Runs in** about 12 s on 2 CPU cores (measured by `make bench`)." in text
    assert bench.update_notebook_times(report) == []  # nothing left to change
