"""Training: the Noam schedule, the paper's Adam, a teachable loop, checkpoints.

The schedule is the paper's ``lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``.
``torch.optim.lr_scheduler.LambdaLR`` *multiplies* the optimizer's base lr by
what its lambda returns, so a lambda that returns the absolute Noam rate needs
an optimizer built with ``lr=1.0``; :func:`noam_scheduler` insists on it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from ._checks import check_positive_int
from .config import ModelConfig
from .model import Transformer

PAPER_BETAS = (0.9, 0.98)
PAPER_EPS = 1e-9


def noam_lr(step: int, d_model: int, warmup: int) -> float:
    """The paper's learning rate at optimizer step ``step`` (1-based; 0 is read as 1)."""
    step = max(int(step), 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


class NoamLambda:
    """LambdaLR multiplier: optimizer step k (1-based) gets ``factor * noam_lr(k)``.

    LambdaLR calls the lambda with 0 before the first step, 1 before the second, ...,
    hence the ``+ 1``. A callable object (not a lambda) so its settings are saved
    in the scheduler's state_dict.

    ``cooldown=c`` with ``total=T`` (not in the paper) also scales the last c of T
    steps linearly down, to 1/c of the Noam rate at step T: the paper's rate never
    reaches zero, and ending a short run with a decay to nearly zero is common practice.
    """

    def __init__(self, d_model: int, warmup: int, factor: float = 1.0, cooldown: int = 0,
                 total: int | None = None):
        self.d_model, self.warmup, self.factor = d_model, warmup, factor
        self.cooldown, self.total = cooldown, total

    def __call__(self, last_epoch: int) -> float:
        step = last_epoch + 1
        rate = self.factor * noam_lr(step, self.d_model, self.warmup)
        if self.cooldown:
            rate *= min(1.0, max(self.total - step + 1, 0) / self.cooldown)
        return rate


def paper_adam(params, lr: float = 1.0) -> torch.optim.Adam:
    """Adam with the paper's betas (0.9, 0.98) and eps 1e-9. ``lr=1.0`` for a Noam scheduler."""
    return torch.optim.Adam(params, lr=lr, betas=PAPER_BETAS, eps=PAPER_EPS)


def noam_scheduler(optimizer, d_model: int, warmup: int = 4000, factor: float = 1.0, *,
                   cooldown: int = 0, total: int | None = None):
    """A LambdaLR whose actual lr at optimizer step k is ``factor * noam_lr(k, d_model, warmup)``.

    ``cooldown`` and ``total``: a linear decay over the last ``cooldown`` of ``total``
    steps (see :class:`NoamLambda`); 0 (the default) is the paper's schedule.

    Raises ValueError unless every param group has base lr 1.0: LambdaLR
    multiplies that base lr, and anything else silently rescales the schedule
    (an Adam(lr=1e-3) makes it 1000x too small). Use ``factor`` to scale it.
    """
    for i, group in enumerate(optimizer.param_groups):
        base = group.get("initial_lr", group["lr"])
        if base != 1.0:
            raise ValueError(
                f"noam_scheduler needs the optimizer's base lr to be 1.0 (LambdaLR multiplies "
                f"it by the Noam rate), got lr={base} in param group {i}; build the optimizer "
                f"with lr=1.0 (e.g. paper_adam(model.parameters())) and scale the curve with "
                "noam_scheduler(..., factor=...)"
            )
    if cooldown:
        check_positive_int("cooldown", cooldown)
        check_positive_int("total", total)
        if cooldown > total:
            raise ValueError(f"cooldown={cooldown} is longer than the run, total={total}; "
                             f"expected cooldown <= total")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, NoamLambda(d_model, warmup, factor, cooldown, total))


def token_accuracy(logits: torch.Tensor, labels: torch.Tensor, pad_idx: int) -> float:
    """Share of non-pad labels whose argmax prediction is right (teacher forcing)."""
    keep = labels != pad_idx
    correct = (logits.argmax(-1) == labels) & keep
    return correct.sum().item() / max(keep.sum().item(), 1)


@dataclass
class History:
    """One entry per optimizer step."""

    loss: list[float] = field(default_factory=list)  # the (label-smoothed) training loss
    accuracy: list[float] = field(default_factory=list)  # teacher-forced token accuracy
    lr: list[float] = field(default_factory=list)  # the lr used by this step
    grad_norm: list[float] = field(default_factory=list)  # global grad norm before clipping
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.loss)


#: Mixed-precision modes for ``amp=``: autocast to this dtype. None (the default) is plain
#: float32, exactly the arithmetic of a run without the option.
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_amp(amp) -> None:
    """``amp`` must be None (off), "bf16" or "fp16"; anything else is a ValueError."""
    if amp is not None and (not isinstance(amp, str) or amp not in AMP_DTYPES):
        raise ValueError(
            f"amp must be None (off) or one of {tuple(AMP_DTYPES)}, got amp={amp!r}"
        )


def autocast(amp, device_type: str):
    """``torch.autocast`` for ``amp`` ("bf16"/"fp16") on ``device_type``; a no-op for None."""
    check_amp(amp)
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=AMP_DTYPES[amp])


def _unpack(batch):
    src, tgt_in, tgt_out = batch  # a tx.data.Batch is a NamedTuple of the same three
    return src, tgt_in, tgt_out


def _pad_idx(model, criterion) -> int:
    """The model's pad id (one source of truth); a criterion ignoring another id is refused."""
    pad_idx = getattr(model, "module", model).config.pad_idx  # a DDP wrapper holds .module
    ignore = getattr(criterion, "ignore_index", pad_idx)
    if ignore != pad_idx:
        raise ValueError(f"criterion.ignore_index={ignore} differs from the model's "
                         f"config.pad_idx={pad_idx}: the loss would count padding as labels; "
                         f"expected ignore_index={pad_idx}")
    return pad_idx


def train_step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0, *,
               amp: str | None = None, scaler=None) -> dict:
    """One step: forward, loss, backward, clip, optimizer step, scheduler step.

    ``batch`` is (src, tgt_in, tgt_out) already on the model's device; the pad id is
    ``model.config.pad_idx`` (a ``criterion.ignore_index`` that differs is a ValueError). Returns
    ``loss``, ``accuracy``, ``lr`` (used by this step) and ``grad_norm`` (before clipping).

    ``amp="bf16"`` or ``"fp16"`` runs the forward pass under ``torch.autocast``; the
    loss is computed from float32 logits, and the weights, gradients and optimizer
    state stay float32. ``"fp16"`` needs ``scaler`` (a ``torch.amp.GradScaler`` that
    lives across steps; :func:`train` makes one): the loss is scaled before backward,
    the gradients are unscaled before clipping, and a step whose gradients overflowed
    is skipped, scheduler included.
    """
    check_amp(amp)
    if amp == "fp16" and scaler is None:
        raise ValueError(
            "amp='fp16' needs scaler=torch.amp.GradScaler(device_type), created once and "
            "passed to every step (float16 gradients underflow without loss scaling), "
            "got scaler=None"
        )
    pad_idx = _pad_idx(model, criterion)
    src, tgt_in, tgt_out = _unpack(batch)
    model.train()
    with autocast(amp, src.device.type):
        logits = model(src, tgt_in)  # (N, L_tgt, V)
    if amp is not None:
        logits = logits.float()  # the loss (log-softmax over V) in float32
    loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    max_norm = clip_norm if clip_norm is not None else math.inf
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]
    stepped = True
    if scaler is None:
        optimizer.step()
    else:
        scale = scaler.get_scale()
        scaler.step(optimizer)  # skipped when a gradient is inf/NaN
        scaler.update()
        stepped = scaler.get_scale() >= scale  # the scale only drops after a skipped step
    if scheduler is not None and stepped:
        scheduler.step()
    return {"loss": loss.item(), "accuracy": token_accuracy(logits.detach(), tgt_out, pad_idx),
            "lr": lr, "grad_norm": grad_norm.item()}


def train(model, batches, optimizer, scheduler=None, *, label_smoothing: float = 0.1,
          clip_norm: float | None = 1.0, pad_idx: int | None = None, progress: bool = False,
          total: int | None = None, history: History | None = None,
          amp: str | None = None, callback=None) -> History:
    """Train ``model`` on an iterable of (src, tgt_in, tgt_out) batches; return a :class:`History`.

    Loss: ``CrossEntropyLoss(ignore_index=pad_idx, label_smoothing=label_smoothing)``
    with ``pad_idx = model.config.pad_idx`` (a different ``pad_idx`` is a ValueError).
    Gradients are clipped to ``clip_norm`` (None: no clipping; the norm is still recorded).
    Batches are moved to the model's device, so the same call runs on CPU and CUDA.
    ``progress=True`` shows a tqdm bar (``total`` = number of batches, if known).
    Pass an existing ``history`` to append to it when resuming (the bar then starts at
    ``len(history)``). ``callback(history)``, if given, runs after every step (a
    checkpoint every k steps, a live plot, ...).
    ``amp``: None (default, float32), ``"bf16"`` (CPU or CUDA) or ``"fp16"`` (meant for
    CUDA; a ``torch.amp.GradScaler`` is created here): see :func:`train_step`.
    """
    check_amp(amp)
    if pad_idx is not None and pad_idx != model.config.pad_idx:
        raise ValueError(f"pad_idx={pad_idx} differs from the model's config.pad_idx="
                         f"{model.config.pad_idx}; leave pad_idx out, the model's own is used "
                         f"(build the model for the data's vocabulary, e.g. tx.date_model_config)")
    pad_idx = model.config.pad_idx
    device = next(model.parameters()).device
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    criterion = nn.CrossEntropyLoss(ignore_index=pad_idx, label_smoothing=label_smoothing)
    history = History() if history is None else history
    bar = None
    if progress:  # a plain-text bar: it looks the same live, in a saved notebook and in a log
        bar = tqdm(total=total, initial=len(history), desc="train", unit="step",
                   file=sys.stdout, mininterval=1.0, ascii=True)
    start = time.perf_counter()
    try:
        for batch in batches:
            batch = tuple(t.to(device) for t in _unpack(batch))
            out = train_step(model, batch, optimizer, criterion, scheduler, clip_norm,
                             amp=amp, scaler=scaler)
            for key, value in out.items():
                getattr(history, key).append(value)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{out['loss']:.3f}", acc=f"{out['accuracy']:.3f}",
                                refresh=False)
            if callback is not None:
                history.seconds += time.perf_counter() - start
                start = time.perf_counter()
                callback(history)
    finally:
        if bar is not None:
            bar.close()
    history.seconds += time.perf_counter() - start
    return history


# ---------------------------------------------------------------- checkpoints

def atomic_write(path, write) -> None:
    """``write(tmp_path)``, then rename over ``path``: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_checkpoint(path, model, optimizer=None, scheduler=None, *, step: int | None = None,
                    extra: dict | None = None) -> None:
    """Save weights, config (as a plain dict), optimizer/scheduler state and torch RNG state.

    Everything saved is tensors and plain Python values, so :func:`load_checkpoint`
    can use ``torch.load(weights_only=True)``. The RNG state (CPU and, when present,
    CUDA) lets a resumed run draw the same dropout masks as an uninterrupted one.
    The file is written atomically: an interrupted save leaves the previous one intact.
    """
    ckpt = {
        "config": dataclasses.asdict(model.config),
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "step": step,
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "extra": extra or {},
    }
    atomic_write(path, lambda tmp: torch.save(ckpt, tmp))


def load_checkpoint(path, model=None, optimizer=None, scheduler=None, *, device=None,
                    restore_rng: bool = False):
    """Load a :func:`save_checkpoint` file: returns ``(model, checkpoint)``.

    Uses ``torch.load(weights_only=True)``: plain tensors and values, no pickled
    code. Without ``model`` a new :class:`Transformer` is built from the saved
    config (on ``device``, default CPU); with one, the weights are loaded into it.
    To resume training, build the model, optimizer and scheduler as before and
    pass all three: each gets its saved state. ``restore_rng=True`` also puts
    back torch's RNG state, so dropout continues exactly as it would have.
    """
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if model is None:
        model = Transformer(ModelConfig(**ckpt["config"]))
        if device is not None:
            model.to(device)
    elif dataclasses.asdict(model.config) != ckpt["config"]:
        raise ValueError(
            f"the model's config differs from the checkpoint's: got {model.config}, "
            f"expected ModelConfig(**{ckpt['config']})"
        )
    model.load_state_dict(ckpt["model"])
    if optimizer is not None and ckpt["optimizer"] is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    if scheduler is not None and ckpt["scheduler"] is not None:
        scheduler.load_state_dict(ckpt["scheduler"])
    if restore_rng:
        restore_rng_state(ckpt)
    return model, ckpt


def restore_rng_state(ckpt: dict) -> None:
    """Put back the RNG state saved by :func:`save_checkpoint`."""
    torch.set_rng_state(ckpt["rng_cpu"])
    if ckpt.get("rng_cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng_cuda"])
