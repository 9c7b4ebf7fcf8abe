"""Probes of check_multi_head_attention past the forward contract: merge_heads, the stored
weights, and dropout in train mode."""
from __future__ import annotations

import os
import sys

import torch

from .compare import _as_output, _close, dropout_stand_in, run_with_stand_in_dropout
from .report import _Report


def _merge_heads_probe(report: _Report, module, n, length, h, d_model) -> None:
    """A class that defines ``merge_heads`` (03's stub) is graded on it too: (N, H, L, d_k) in,
    (N, L, d_model) out, position p's row holding head 0's features, then head 1's, ..."""
    d_k = d_model // h
    heads = torch.arange(n * h * length * d_k, dtype=torch.float32).view(n, h, length, d_k)
    want = heads.transpose(1, 2).reshape(n, length, d_model)  # (N, L, d_model)
    text = (f"merge_heads turns heads (N, H, L, d_k) = {(n, h, length, d_k)} into "
            f"(N, L, d_model) = {(n, length, d_model)}, each position's heads side by side")
    try:
        got = module.merge_heads(heads.clone())
    except NotImplementedError:
        report.probe(False, text + " (it raises NotImplementedError)")
        report.mistake("not_implemented", "merge_heads is still the stub: forward may merge "
                       "the heads itself, but the exercise grades merge_heads")
        return
    except Exception as exc:  # noqa: BLE001 - a learner's error, reported by name
        report.probe(False, text + f" (it raised {type(exc).__name__}: {exc})")
        report.mistake("shape_error" if isinstance(exc, RuntimeError) else "mismatch",
                       f"merge_heads raised {type(exc).__name__}")
        return
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        report.probe(False, text + f" (got {shape})")
        report.mistake("mismatch", f"merge_heads returned {shape}, expected "
                       f"{tuple(want.shape)}")
        return
    if report.probe(torch.equal(got.float(), want), text):
        return
    if torch.equal(got.float(), heads.reshape(n, length, d_model)):
        report.mistake("heads_merge_without_transpose")
    else:
        report.mistake("mismatch", "merge_heads does not put each position's heads side by "
                       "side in head order")


def _stored_weights_probe(report: _Report, module, ref, x, mem, mem_v) -> None:
    """Eval mode, cross-attention: ``module.attn_weights`` is that call's (N, H, L_q, L_k)."""
    want = (x.size(0), ref.n_heads, x.size(1), mem.size(1))
    text = f"self.attn_weights holds the last call's weights {want}, each row summing to 1"
    was_training = module.training
    try:
        module.eval()
        with torch.no_grad():
            module(x.clone(), mem.clone(), mem_v.clone())
            ref(x, mem, mem_v)
    except Exception:  # noqa: BLE001 - the main probes already reported errors
        return
    finally:
        module.train(was_training)
    got = getattr(module, "attn_weights", None)
    if not isinstance(got, torch.Tensor):
        report.probe(False, f"{text} (it is {type(got).__name__})")
        report.mistake("attn_weights_not_stored")
    elif not report.probe(tuple(got.shape) == want and _close(got, ref.attn_weights), text):
        report.mistake("attn_weights_wrong", f"it has shape {tuple(got.shape)}"
                       if tuple(got.shape) != want else "it differs from this call's weights")


def _train_mode_probe(report: _Report, module, ref, x, mem, mem_v) -> None:
    """Train mode: the module's nn.Dropout, whatever its name, acts on the weights only.

    Each nn.Dropout returns :func:`~labkit.compare.dropout_stand_in` of its input, so the
    expected output is the reference computed with ``dropout_stand_in(weights)``: no random
    numbers are compared. A correct forward calls its dropout once on the weights (or once per
    head on each head's weights) and matches; one that skips it, or drops the scores or the
    output, does not. A forward that never calls an nn.Dropout submodule fails
    (``attn_dropout_unused``), unless it calls ``F.dropout`` with that module's p on the
    weights (the same computation, accepted as notebook 04's FFN check accepts it).
    """
    text = ("train mode: dropout acts on the weights (N, H, L_q, L_k), once, before they mix "
            "the values")
    out, seen, changed = run_with_stand_in_dropout(module, lambda: _as_output(
        report, module(x.clone(), mem.clone(), mem_v.clone())))
    n, l_q, d_model = x.shape
    h, d_k, l_k = ref.n_heads, ref.d_k, mem.size(1)
    with torch.no_grad():
        ref(x, mem, mem_v)  # eval mode: the plain weights
        weights = ref.attn_weights  # (N, H, L_q, L_k)
        v = ref.w_v(mem_v).view(n, l_k, h, d_k).transpose(1, 2)  # (N, H, L_k, d_k)
        ctx = (dropout_stand_in(weights) @ v).transpose(1, 2).reshape(n, l_q, d_model)
        expected = ref.w_o(ctx)  # (N, L_q, d_model)
    if not seen and changed:  # F.dropout with the module's own p is the same computation
        out, ps = _functional_dropout_run(module, lambda: _as_output(
            report, module(x.clone(), mem.clone(), mem_v.clone())))
        own = {m.p for m in module.modules() if isinstance(m, torch.nn.Dropout)} or {0.1}
        if ps and set(ps) <= own and report.probe(_close(out, expected), text):
            report.note("dropout is F.dropout with self.dropout's p: the same computation as "
                        "calling self.dropout")
            return
    if not seen:
        report.probe(False, text + " (self.dropout, the module's nn.Dropout, was never called)")
        report.mistake("attn_dropout_unused", "in train mode self.dropout is never called"
                       + (": the output changes, but not through self.dropout nor through "
                          "F.dropout with its p on the weights"
                          if changed else " and the output equals the eval-mode output"))
        return
    if report.probe(_close(out, expected), text):
        return
    total = sum(t.numel() for t in seen)
    row_sums = [t.sum(-1) for t in seen if t.size(-1) == l_k]
    if any(t.size(-1) == d_model and t.numel() == n * l_q * d_model for t in seen):
        report.mistake("attn_dropout_on_output", f"self.dropout received a tensor of shape "
                       f"{tuple(seen[-1].shape)}, not the weights (N, H, L_q, L_k) = "
                       f"{(n, h, l_q, l_k)}")
    elif d_k != l_k and any(tuple(t.shape) == (n, h, l_q, d_k) for t in seen):
        report.mistake("attn_dropout_on_output", f"self.dropout received the heads' context "
                       f"(N, H, L_q, d_k) = {(n, h, l_q, d_k)}, weights @ v, not the weights "
                       f"(N, H, L_q, L_k) = {(n, h, l_q, l_k)}")
    elif total > weights.numel():
        report.mistake("attn_dropout_twice", f"dropout saw {total} numbers in one forward, "
                       f"where the weights hold {weights.numel()}")
    elif row_sums and not all(_close(r, torch.ones_like(r)) for r in row_sums):
        report.mistake("attn_dropout_before_softmax", "the tensor self.dropout received has "
                       "rows that do not sum to 1: the scores, not the weights")
    else:
        report.mistake("mismatch", "in train mode the output differs from the reference "
                       "with dropout on the weights")


def _functional_dropout_run(module, call):
    """``call()`` in train mode with ``F.dropout`` returning :func:`dropout_stand_in` of its
    input; returns (output, the p of each call that dropped). Mode and random state restored."""
    import torch.nn.functional as F

    ps, real, was_training = [], F.dropout, module.training
    torch_dir = os.path.dirname(torch.__file__)

    def stand_in(input, p=0.5, training=True, inplace=False):  # noqa: A002 - F's own names
        if training and p > 0:  # a call from PyTorch's own layer (a kernel given p) is not kept
            if not sys._getframe(1).f_code.co_filename.startswith(torch_dir):
                ps.append(p)
            return dropout_stand_in(input)
        return input

    F.dropout = stand_in
    try:
        module.train()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = call()
    finally:
        F.dropout = real
        module.train(was_training)
    return out, ps
