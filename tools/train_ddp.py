#!/usr/bin/env python3
"""The series' own training loop on several processes: DistributedDataParallel (DDP).

  torchrun --standalone --nproc_per_node=2 tools/train_ddp.py          # 2 CPU processes
  torchrun --standalone --nproc_per_node=4 tools/train_ddp.py --amp bf16   # 4 GPUs, bf16
  .venv/bin/python tools/train_ddp.py --steps 50                         # 1 process, no torchrun
  make ddp-demo                                                          # the recorded demo

Nothing here is a new trainer. Every rank builds the same ``tx.Transformer`` (same seed;
DDP also copies rank 0's weights to the others when it wraps the model), wraps it in
``DistributedDataParallel`` and calls the package's own ``tx.train_step``. DDP hooks into
backward: as buckets of gradients become ready it averages them over the ranks
(all-reduce), so every replica's optimizer sees the same gradient and the replicas stay
identical without ever sending weights.

Data: the dates task with the package's ``DATES_RECIPE`` (tx_helpers/pretrained.py),
imported, not copied. Every rank draws the same global batch from ``date_batches`` and
keeps its own rows ``rank::world_size`` (the split ``DistributedSampler`` makes), so
the ranks' shares are disjoint and their union is exactly the batch a single process
would train on. A global batch of 128 on 2 ranks is 64 rows each: the same recipe, the
same data order, the same step count.

Loss normalisation: ``GlobalTokenMeanLoss`` sums the loss over this rank's target tokens
and divides by (global token count / world size). DDP's average of those per-rank
losses' gradients is then exactly the gradient of the mean over all tokens of the global
batch, whatever the padding of each share. A plain per-rank mean would weight every
rank equally instead of every token (see tests/test_ddp.py).

Backend: nccl with one process per GPU (``torch.cuda.set_device(local_rank)``) when CUDA
is available, gloo on CPU. Rank 0 alone prints and writes the checkpoint (with
``tx.save_checkpoint``, which writes atomically). The process group is destroyed in a ``finally``.

After training: rank 0 measures free-running exact match on 1000 held-out dates (as
notebook 08 does), reloads its checkpoint into a plain single-process model, and all
ranks measure the cost model: an all-reduce of a gradient-sized float32 tensor against
the compute of one local forward+backward (under ``no_sync``, so without communication)
and a full DDP forward+backward.
"""
from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import tx_helpers as tx
from tx_helpers.data import DATE_VOCAB, Batch, DatePairs, date_batches, date_model_config
from tx_helpers.pretrained import DATES_RECIPE
from tx_helpers.training import AMP_DTYPES

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- process group

@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port that was free a moment ago (for a rendezvous on 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str | None = None, *, init_method: str = "env://",
                     rank: int | None = None, world_size: int | None = None,
                     local_rank: int | None = None) -> DistContext:
    """Join (or, alone, create) the process group; returns this process's :class:`DistContext`.

    Under torchrun the rank, world size and local rank come from the environment
    (RANK, WORLD_SIZE, LOCAL_RANK). Run without torchrun, the process is a world of
    one. ``backend`` None picks nccl when CUDA is available, else gloo; with nccl each
    process takes the GPU of its local rank.
    """
    if rank is None and "RANK" not in os.environ and init_method == "env://":
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    rank = int(os.environ["RANK"]) if rank is None else rank
    world_size = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", rank)) if local_rank is None else local_rank
    if backend is None:  # nccl only with one GPU per process on this machine (notebook 12's rule)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        backend = "nccl" if torch.cuda.device_count() >= local_world else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got backend={backend!r}")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend='nccl' needs CUDA, and torch.cuda.is_available() is False")
        torch.cuda.set_device(local_rank)  # one process per GPU, before any CUDA work
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return DistContext(rank, world_size, local_rank, backend, device)


# ---------------------------------------------------------------- data and loss

def shard(batch, rank: int, world_size: int) -> Batch:
    """This rank's rows ``rank::world_size`` of a global batch (DistributedSampler's split).

    Disjoint across ranks, together exactly the global batch. The global batch size
    must divide evenly, so every rank does the same amount of work per step.
    """
    src, tgt_in, tgt_out = batch
    if src.size(0) % world_size:
        raise ValueError(f"the global batch size must be divisible by world_size={world_size}, "
                         f"got a batch of {src.size(0)} rows")
    return Batch(src[rank::world_size], tgt_in[rank::world_size], tgt_out[rank::world_size])


class GlobalTokenMeanLoss(nn.CrossEntropyLoss):
    """Cross-entropy summed over this rank's tokens, times world_size / global token count.

    DDP averages gradients over ranks: grad = (1/W) sum_r grad(loss_r). With
    loss_r = W * sum_r / T (T = non-pad target tokens of the whole global batch) that is
    grad(sum over all tokens / T), the single-process mean loss of the global batch,
    however the tokens are spread over the ranks. Call :meth:`count_tokens` with this
    rank's labels before each step: it all-reduces the token count (one integer).
    ``ignore_index`` stays an attribute, so ``tx.train_step`` reads the pad id from it.
    """

    def __init__(self, ignore_index: int, label_smoothing: float = 0.0):
        super().__init__(ignore_index=ignore_index, label_smoothing=label_smoothing,
                         reduction="sum")
        self.scale = None

    def count_tokens(self, tgt_out: torch.Tensor) -> int:
        count = (tgt_out != self.ignore_index).sum().reshape(1).to(torch.float64)
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world > 1:
            dist.all_reduce(count)  # sum over ranks: the global batch's token count
        total = int(count.item())
        self.scale = world / max(total, 1)
        return total

    def forward(self, logits, target):
        if self.scale is None:
            raise RuntimeError("call count_tokens(tgt_out) before each step")
        return super().forward(logits, target) * self.scale


# ---------------------------------------------------------------- checkpoints

# ---------------------------------------------------------------- cost model

#: all-reduce sizes (float32 elements) timed to fit t = latency + bytes / bandwidth
SWEEP_NUMELS = (2**10, 2**14, 2**18, 2**20, 2**22)


def fit_latency_bandwidth(sweep, world_size: int) -> tuple[float, float]:
    """The line t = latency + traffic / bandwidth through the smallest and the largest
    all-reduce of a sweep: (latency in s, bus bandwidth in bytes/s).

    ``traffic`` is what each rank sends in a ring all-reduce, 2 (W - 1) / W * bytes, so
    the bandwidth is comparable across world sizes. (A least-squares fit over all sizes
    is dominated by the largest and can return a negative latency.)
    """
    if world_size < 2:
        raise ValueError(f"a world of {world_size} process sends nothing: no line to fit")
    (n0, t0), (n1, t1) = min(sweep), max(sweep)
    traffic = [2 * (world_size - 1) / world_size * 4 * n for n in (n0, n1)]
    bandwidth = (traffic[1] - traffic[0]) / (t1 - t0)
    return t0 - traffic[0] / bandwidth, bandwidth


def _median_seconds(fn, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_cost(ddp_model, batch, criterion, ctx: DistContext, repeats: int) -> dict:
    """Median seconds of: an all-reduce of a gradient-sized tensor; one local forward+backward
    without communication (``no_sync``); one DDP forward+backward (with its all-reduce).

    Every rank runs the same calls (collectives must match); returns this rank's numbers.
    Gradients are zeroed afterwards; the weights and the optimizer are not touched.
    """
    n_grad = sum(p.numel() for p in ddp_model.parameters() if p.requires_grad)
    flat = torch.zeros(n_grad, device=ctx.device)
    src, tgt_in, tgt_out = batch

    def allreduce():
        dist.all_reduce(flat)

    def fwd_bwd():
        logits = ddp_model(src, tgt_in)
        criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1)).backward()

    def local_only():
        with ddp_model.no_sync():  # backward without DDP's all-reduce
            fwd_bwd()

    criterion.count_tokens(tgt_out)
    ddp_model.train()
    for fn in (allreduce, local_only, fwd_bwd):  # warm-up, untimed
        fn()
    dist.barrier()
    out = {"n_grad": n_grad, "allreduce_s": _median_seconds(allreduce, repeats, ctx.device)}
    out["sweep"] = []  # (float32 elements, median seconds): the latency + bandwidth model
    for numel in SWEEP_NUMELS:
        buf = torch.zeros(numel, device=ctx.device)
        dist.all_reduce(buf)  # warm-up
        dist.barrier()
        out["sweep"].append((numel, _median_seconds(lambda b=buf: dist.all_reduce(b),
                                                    repeats, ctx.device)))
    dist.barrier()
    out["compute_s"] = _median_seconds(local_only, repeats, ctx.device)
    dist.barrier()
    out["ddp_s"] = _median_seconds(fwd_bwd, repeats, ctx.device)
    ddp_model.zero_grad(set_to_none=True)
    return out


# ---------------------------------------------------------------- the run

def parse_args(argv=None) -> argparse.Namespace:
    r = DATES_RECIPE
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=r["steps"],
                   help=f"optimizer steps (recipe: {r['steps']})")
    p.add_argument("--global-batch", type=int, default=r["batch_size"],
                   help=f"rows per step over all ranks (recipe: {r['batch_size']})")
    p.add_argument("--amp", choices=["none", *AMP_DTYPES], default="none",
                   help="mixed precision for the forward pass (default: none, float32)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--checkpoint", default=str(REPO / ".cache" / "ddp" / "dates-ddp.pt"),
                   help="where rank 0 writes the final checkpoint ('' for none)")
    p.add_argument("--eval-n", type=int, default=1000,
                   help="held-out dates for the final exact match (0: skip)")
    p.add_argument("--cost-repeats", type=int, default=20,
                   help="timed repeats per cost-model measurement (0: skip)")
    return p.parse_args(argv)


def run(args, ctx: DistContext) -> None:
    r = DATES_RECIPE
    amp = None if args.amp == "none" else args.amp

    def log(*parts):
        if ctx.is_main:
            print(*parts, flush=True)

    torch.manual_seed(r["seed"])  # same initial weights on every rank (DDP checks and syncs)
    model = tx.Transformer(date_model_config(**r["model"])).to(ctx.device)
    ddp_model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    optimizer = tx.paper_adam(ddp_model.parameters())
    scheduler = tx.noam_scheduler(optimizer, model.config.d_model, r["warmup"], r["factor"])
    scaler = torch.amp.GradScaler(ctx.device.type) if amp == "fp16" else None
    criterion = GlobalTokenMeanLoss(model.config.pad_idx, r["label_smoothing"])
    pairs = DatePairs(r["test_fraction"], r["split_seed"])
    batches = date_batches(args.steps, args.global_batch, seed=r["seed"], pairs=pairs,
                           bucket=r["bucket"])
    local_rows = args.global_batch // ctx.world_size
    log(f"torchrun DDP run of {time.strftime('%Y-%m-%d %H:%M')}: torch {torch.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average at start "
        f"{os.getloadavg()[0]:.2f}")
    log(f"world_size={ctx.world_size} backend={ctx.backend} device={ctx.device.type} "
        f"threads/process={torch.get_num_threads()} amp={args.amp}")
    log(f"model: DATES_RECIPE v{r['version']}, {tx.count_parameters(model):,} parameters; "
        f"global batch {args.global_batch} = {ctx.world_size} x {local_rows} rows; "
        f"{args.steps} steps")

    samples = tokens = 0
    start = time.perf_counter()
    local = None
    for step, batch in enumerate(batches, 1):
        local = shard(batch, ctx.rank, ctx.world_size).to(ctx.device)
        n_global = criterion.count_tokens(local.tgt_out)
        out = tx.train_step(ddp_model, local, optimizer, criterion, scheduler, r["clip_norm"],
                            amp=amp, scaler=scaler)
        samples += local.src.size(0)
        n_local = int((local.tgt_out != model.config.pad_idx).sum())
        tokens += n_local
        if step % args.log_every == 0 or step == args.steps:
            # loss_r already carries the factor W / T, so the sum over ranks / W is the
            # global mean loss; accuracy is re-weighted by each rank's token count.
            stats = torch.tensor([out["loss"], out["accuracy"] * n_local], device=ctx.device,
                                 dtype=torch.float64)
            dist.all_reduce(stats)
            log(f"step {step:4d}  loss {stats[0].item() / ctx.world_size:.4f}  "
                f"token acc {stats[1].item() / n_global:.4f}  lr {out['lr']:.2e}  "
                f"{time.perf_counter() - start:6.1f} s")
    seconds = time.perf_counter() - start

    # per-rank throughput, gathered so that rank 0 prints every rank's line
    mine = torch.tensor([samples, tokens, seconds], dtype=torch.float64, device=ctx.device)
    every = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(every, mine)
    for rank, (n_samples, n_tokens, secs) in enumerate(t.tolist() for t in every):
        log(f"rank {rank}: {int(n_samples)} samples, {int(n_tokens)} target tokens in "
            f"{secs:.1f} s = {n_samples / secs:.0f} samples/s, {n_tokens / secs:.0f} tokens/s")

    # the replicas never exchanged weights, only gradients: are they still identical?
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    fingerprint = torch.stack([flat.sum(), (flat * flat).sum()])
    prints = [torch.zeros_like(fingerprint) for _ in range(ctx.world_size)]
    dist.all_gather(prints, fingerprint)
    log(f"replicas identical after training: "
        f"{all(torch.equal(prints[0], p) for p in prints[1:])}")

    if ctx.is_main:
        if args.checkpoint:
            path = Path(args.checkpoint)  # rank 0 only, the unwrapped model: no "module." keys
            tx.save_checkpoint(path, model, optimizer, scheduler, step=args.steps,
                               extra={"world_size": ctx.world_size})  # atomic
            single, _ = tx.load_checkpoint(path)  # a plain model on the CPU, no DDP
            same = all(torch.equal(a.cpu(), b) for a, b in
                       zip(model.state_dict().values(), single.state_dict().values(),
                           strict=True))
            log(f"rank 0 wrote {path.name}; it reloads into a single-process model: {same}")
        if args.eval_n:
            test_pairs = pairs.sample(args.eval_n, "test", seed=0)
            exact = tx.exact_match_accuracy(model.eval(), test_pairs, DATE_VOCAB, max_len=12)
            log(f"free-running exact match on {args.eval_n} held-out dates: {exact:.1%}")
    dist.barrier()  # the other ranks wait for rank 0's checkpoint and evaluation

    if args.cost_repeats:
        cost = measure_cost(ddp_model, local, criterion, ctx, args.cost_repeats)
        numbers = torch.tensor([cost["allreduce_s"], cost["compute_s"], cost["ddp_s"]],
                               dtype=torch.float64, device=ctx.device)
        slowest = numbers.clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step waits for the slowest rank
        a, c, d = slowest.tolist()
        mb = cost["n_grad"] * 4 / 2**20
        log(f"cost model (median of {args.cost_repeats}, slowest rank):")
        log(f"  all-reduce of {cost['n_grad']:,} float32 ({mb:.2f} MiB), {ctx.backend}: "
            f"{a * 1e3:.2f} ms")
        sweep = torch.tensor([t for _, t in cost["sweep"]], dtype=torch.float64,
                             device=ctx.device)
        dist.all_reduce(sweep, op=dist.ReduceOp.MAX)
        sweep = [(n, t) for (n, _), t in zip(cost["sweep"], sweep.tolist(), strict=True)]
        for n, t in sweep:
            log(f"  all-reduce sweep: {n:>9,} float32 ({n * 4 / 2**20:7.3f} MiB): "
                f"{t * 1e3:8.3f} ms")
        if ctx.world_size > 1:
            latency, bandwidth = fit_latency_bandwidth(sweep, ctx.world_size)
            log(f"  line t = latency + 2(W-1)/W * bytes / bandwidth through the smallest and "
                f"largest: latency {latency * 1e3:.3f} ms, "
                f"bandwidth {bandwidth / 1e9:.2f} GB/s")
        log(f"  local forward+backward, {local_rows} rows, no communication: {c * 1e3:.2f} ms")
        log(f"  DDP forward+backward (all-reduce inside backward): {d * 1e3:.2f} ms")
        log(f"  all-reduce / compute = {a / c:.3f}; DDP overhead over compute = "
            f"{(d - c) * 1e3:.2f} ms ({(d - c) / c:.1%})")
    log(f"load average at the end {os.getloadavg()[0]:.2f} "
        f"({os.cpu_count()} CPUs, shared with other work)")


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = None if args.backend == "auto" else args.backend
    ctx = init_distributed(backend)
    try:
        run(args, ctx)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
