"""DDP is the same training: 2 gloo processes == 1 process stepping on the whole batch.

Two processes are spawned once per module (gloo on CPU, a file:// rendezvous in tmp,
so no port can be taken by someone else). Each runs ``tools/train_ddp.py``'s own pieces
(init_distributed, shard, GlobalTokenMeanLoss) and tx.save_checkpoint around the
package's ``tx.train_step`` and saves its parameters after every step.

Why the losses can be compared exactly: the rows below have different target lengths,
so the two ranks' shares hold different numbers of non-pad target tokens (the test
checks that they do). DDP averages the ranks' gradients, so two per-rank *means* would
weight each rank equally rather than each token, and the result would differ from the
single-process mean over the concatenated batch. GlobalTokenMeanLoss sums over the rank's
tokens and divides by (global token count / world size); averaging that over ranks is
exactly the global mean. Dropout is 0: with dropout each process draws its own masks,
so DDP would match the single process in distribution only, not number for number.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import tx_helpers as tx

TOOL = Path(__file__).resolve().parent.parent / "tools" / "train_ddp.py"
sys.path.insert(0, str(TOOL.parent))
import train_ddp  # noqa: E402

WORLD, STEPS, ROWS, LENGTH, VOCAB, PAD = 2, 4, 8, 6, 12, 0
SMOOTHING, CLIP = 0.1, 1.0


def tiny_model() -> tx.Transformer:
    torch.manual_seed(0)
    cfg = tx.ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, n_heads=2,
                         d_ff=32, n_layers=1, dropout=0.0, max_len=16, pad_idx=PAD)
    return tx.Transformer(cfg)


def optimizer_and_scheduler(model):
    """SGD with momentum under the Noam schedule: the update is linear in the gradient.

    Not Adam: the key projections' biases (w_k.bias) have a true gradient of exactly 0
    (softmax ignores a shift shared by all keys of a query), so their computed gradient
    is float round-off (~1e-9), and Adam's g / sqrt(v) turns round-off of either sign into
    a full +-lr step. Comparing Adam runs would compare noise; comparing SGD runs compares
    the gradients that DDP averaged. tools/train_ddp.py itself uses the paper's Adam.
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    return optimizer, tx.noam_scheduler(optimizer, 16, warmup=2, factor=1.0)


def global_batches():
    """STEPS copy-task batches (BOS=1, EOS=2, pad=0) whose rows have different lengths."""
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        lengths = torch.randint(1, LENGTH + 1, (ROWS,), generator=g)
        src = torch.randint(3, VOCAB, (ROWS, LENGTH), generator=g)
        src[torch.arange(LENGTH)[None] >= lengths[:, None]] = PAD
        tgt = torch.cat([torch.ones(ROWS, 1, dtype=torch.long), src,
                         torch.zeros(ROWS, 1, dtype=torch.long)], 1)
        tgt[torch.arange(ROWS), lengths + 1] = 2
        yield src, tgt[:, :-1], tgt[:, 1:]


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    ctx = train_ddp.init_distributed("gloo", init_method=f"file://{init_file}", rank=rank,
                                     world_size=WORLD)
    try:
        model = tiny_model()
        ddp_model = DDP(model)
        optimizer, scheduler = optimizer_and_scheduler(ddp_model)
        criterion = train_ddp.GlobalTokenMeanLoss(PAD, label_smoothing=SMOOTHING)
        after, counts = [], []
        for batch in global_batches():
            local = train_ddp.shard(batch, ctx.rank, ctx.world_size)
            criterion.count_tokens(local.tgt_out)
            counts.append(int((local.tgt_out != PAD).sum()))
            tx.train_step(ddp_model, local, optimizer, criterion, scheduler, CLIP)
            after.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        torch.save({"after": after, "counts": counts}, Path(out_dir) / f"rank{rank}.pt")
        if ctx.is_main:
            tx.save_checkpoint(Path(out_dir) / "ckpt.pt", model, optimizer, scheduler,
                               step=STEPS)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(str(folder / "rendezvous"), str(folder)), nprocs=WORLD, join=True)
    return folder, [torch.load(folder / f"rank{r}.pt") for r in range(WORLD)]


def single_process_reference():
    """The same model, optimizer and batches in one process: parameters after each step."""
    model = tiny_model()
    optimizer, scheduler = optimizer_and_scheduler(model)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=SMOOTHING)
    after = []
    for batch in global_batches():
        tx.train_step(model, batch, optimizer, criterion, scheduler, CLIP)
        after.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return model, optimizer, scheduler, after


@pytest.mark.slow  # two spawned processes; notebook 12 runs a real 2-process torchrun
def test_each_ddp_step_equals_one_process_on_the_concatenated_batch(ddp_run):
    _, ranks = ddp_run
    # the shares really differ in token count, so a per-rank mean would not do
    assert any(a != b for a, b in zip(ranks[0]["counts"], ranks[1]["counts"], strict=True))
    *_, reference = single_process_reference()
    assert len(reference) == len(ranks[0]["after"]) == STEPS
    for step, ref in enumerate(reference, 1):
        for rank in ranks:
            got = rank["after"][step - 1]
            for name in ref:
                # float32 sums in another order: ulp-level differences, nothing more
                torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6,
                                           msg=lambda m, s=step, n=name: f"step {s} {n}: {m}")
    # the replicas never exchange weights, yet they stay bit-identical
    for a, b in zip(ranks[0]["after"], ranks[1]["after"], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # two spawned processes; notebook 12 runs a real 2-process torchrun
def test_rank0_checkpoint_reloads_into_a_single_process_model(ddp_run):
    folder, ranks = ddp_run
    path = folder / "ckpt.pt"
    assert not list(folder.glob("*.tmp"))  # the atomic write left no temporary file
    model, ckpt = tx.load_checkpoint(path)  # a plain Transformer, no DDP, no "module." keys
    assert ckpt["step"] == STEPS
    final = ranks[0]["after"][-1]
    assert all(torch.equal(model.state_dict()[k], final[k]) for k in final)
    # ...and training resumes from it like the single-process run continues
    ref_model, ref_opt, ref_sched, _ = single_process_reference()
    model2 = tiny_model()
    opt2, sched2 = optimizer_and_scheduler(model2)
    tx.load_checkpoint(path, model2, opt2, sched2)
    assert sched2.last_epoch == ref_sched.last_epoch == STEPS
    batch = next(global_batches())
    criterion = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=SMOOTHING)
    tx.train_step(model2, batch, opt2, criterion, sched2, CLIP)
    tx.train_step(ref_model, batch, ref_opt, criterion, ref_sched, CLIP)
    for k, v in ref_model.state_dict().items():
        torch.testing.assert_close(model2.state_dict()[k], v, rtol=1e-5, atol=1e-6)


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_global_token_mean_is_needed_when_token_counts_differ():
    """Two replicas simulated in one process: average of per-rank gradients vs the full batch."""
    model = tiny_model()
    src, tgt_in, tgt_out = next(global_batches())
    mean = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=SMOOTHING)

    def loss_of(crit, s, ti, to):
        logits = model(s, ti)
        return crit(logits.reshape(-1, VOCAB), to.reshape(-1))

    full = _grads(model, loss_of(mean, src, tgt_in, tgt_out))
    shares = [train_ddp.shard((src, tgt_in, tgt_out), r, WORLD) for r in range(WORLD)]
    total = sum(int((s.tgt_out != PAD).sum()) for s in shares)
    naive, exact = [], []
    for share in shares:
        naive.append(_grads(model, loss_of(mean, *share)))
        crit = train_ddp.GlobalTokenMeanLoss(PAD, label_smoothing=SMOOTHING)
        assert crit.count_tokens(share.tgt_out) == int((share.tgt_out != PAD).sum())
        crit.scale = WORLD / total  # what count_tokens sets after its all-reduce
        exact.append(_grads(model, loss_of(crit, *share)))
    average = [[(a + b) / WORLD for a, b in zip(*g, strict=True)] for g in (naive, exact)]
    for got, want in zip(average[1], full, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    worst = max((a - b).abs().max().item() for a, b in zip(average[0], full, strict=True))
    assert worst > 1e-4  # the per-rank mean is a different gradient


def test_shard_is_disjoint_complete_and_refuses_an_uneven_split():
    batch = next(global_batches())
    rows = torch.cat([train_ddp.shard(batch, r, WORLD).src for r in range(WORLD)])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, batch[0].tolist()))
    assert torch.equal(train_ddp.shard(batch, 1, WORLD).src, batch[0][1::2])
    with pytest.raises(ValueError, match="divisible by world_size=3"):
        train_ddp.shard(batch, 0, 3)


@pytest.mark.slow  # a whole run in a subprocess; notebook 12 runs the script under torchrun
def test_the_entry_point_runs_as_a_world_of_one(tmp_path):
    """``python tools/train_ddp.py`` without torchrun: the whole run, tiny, in a subprocess."""
    ckpt = tmp_path / "dates-ddp.pt"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run(
        [sys.executable, str(TOOL), "--steps", "2", "--global-batch", "4", "--log-every", "1",
         "--eval-n", "4", "--cost-repeats", "1", "--checkpoint", str(ckpt)],
        capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    for line in ("world_size=1 backend=gloo", "step    2  loss", "replicas identical after "
                 "training: True", "reloads into a single-process model: True",
                 "free-running exact match on 4 held-out dates", "all-reduce / compute"):
        assert line in out.stdout, f"missing {line!r} in:\n{out.stdout}"
    _, saved = tx.load_checkpoint(ckpt)
    assert saved["step"] == 2 and saved["extra"] == {"world_size": 1}
