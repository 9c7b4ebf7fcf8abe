"""Check: scaled dot-product attention."""
from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from tx_helpers.attention import scaled_dot_product_attention

from .compare import (
    _as_output,
    _both_kinds_mask,
    _close,
    _compare,
    _deterministic,
    _diagnose,
)
from .localize import localize_attention
from .report import CheckResult, _call, _Failed, _Report, _run_check

_NEG = torch.finfo(torch.float32).min


def _attention_variant(q, k, v, mask, scale=None, axis=-1, masking=None, values="v",
                       d_model=None):
    d_k = q.size(-1)
    s = q @ k.transpose(-2, -1)
    divisor = {None: math.sqrt(d_k), "none": 1.0, "d_k": d_k, "d_v": math.sqrt(v.size(-1)),
               "d_model": math.sqrt(d_model or d_k)}[scale]
    s = s / divisor
    if mask is not None:
        if masking is None or masking == "after":
            s = s.masked_fill(mask, _NEG) if masking is None else s
        elif masking == "inverted":
            s = s.masked_fill(~mask, _NEG)
        elif masking == "zero":
            s = s.masked_fill(mask, 0.0)
    w = torch.softmax(s, dim=axis)
    if mask is not None and masking == "after":
        w = w.masked_fill(mask, 0.0)
    return w @ (k if values == "k" else v)


def _attention_axes(masked: bool, d_model: int | None = None, ndim: int = 4):
    axes = {
        "scale": [None, ("no_scaling", "none"), ("scale_d_k", "d_k"), ("scale_d_v", "d_v")],
        "axis": [-1] + [("softmax_wrong_axis", a) for a in range(-2, -ndim - 1, -1)],
        "values": ["v", ("weights_times_k", "k")],
    }
    if d_model is not None:
        axes["scale"].append(("scale_sqrt_d_model", "d_model"))
    if masked:
        axes["masking"] = [None, ("mask_inverted", "inverted"), ("mask_ignored", "ignored"),
                           ("mask_fill_zero", "zero"), ("mask_after_softmax", "after")]
    return axes


_ATTN_SHAPES = ("q and k are (N, H, L_q, d_k) and (N, H, L_k, d_k); the scores are "
                "(N, H, L_q, L_k); the mask broadcasts to the scores; the output is "
                "(N, H, L_q, d_v)")


def check_attention(fn, *, full_contract: bool = False, verbose: bool = True) -> CheckResult:
    """Check ``fn(q, k, v, mask=None) -> output`` or ``(output, weights)``.

    q (N, H, L_q, d_k), k (N, H, L_k, d_k), v (N, H, L_k, d_v); ``mask`` is bool,
    True = do not attend, broadcastable to (N, H, L_q, L_k). Reference:
    :func:`tx_helpers.scaled_dot_product_attention`.

    ``full_contract=True`` (notebook 03's exercise) also probes what the project's contract
    says beyond the numbers: a query whose keys are all masked gets uniform weights, finite
    (the fill is the dtype's most negative finite number, not -inf); masked keys get no weight
    even when every visible score is -1e5 (no fixed fill such as -1e4); float16 inputs work (a
    fill that fits the dtype: defect 8); and, when ``fn`` takes ``dropout``, a dropout module
    in train mode acts once, on the weights.
    """
    def body(report: _Report):
        gen = torch.Generator().manual_seed(2)
        n, h, l_q, l_k, d_k, d_v = 2, 3, 5, 6, 64, 8
        q = torch.randn(n, h, l_q, d_k, generator=gen)
        k = torch.randn(n, h, l_k, d_k, generator=gen)
        v = torch.randn(n, h, l_k, d_v, generator=gen)
        if isinstance(fn, type):
            report.note("check_attention expects a function; for a module use "
                        "check_multi_head_attention")

        def run(mask=None):
            args = (q.clone(), k.clone(), v.clone()) + (() if mask is None else (mask,))
            what = "fn(q, k, v)" if mask is None else "fn(q, k, v, mask)"
            return _call(report, what, fn, *args, shape_hint=_ATTN_SHAPES)

        raw = run()
        out = _as_output(report, raw)
        _deterministic(report, run, out)
        ref, ref_w = _scaled_reference(q, k, v, None)
        shape_ok = report.probe(tuple(out.shape) == tuple(ref.shape),
                                f"output shape (N, H, L_q, d_v) = {tuple(ref.shape)}"
                                + ("" if tuple(out.shape) == tuple(ref.shape)
                                   else f" (got {tuple(out.shape)})"))
        axes = _attention_axes(False)
        if not shape_ok:
            _diagnose(report, out, axes, lambda **kw: _attention_variant(q, k, v, None, **kw),
                      ref)
            report.mistake("wrong_output_shape", f"expected {tuple(ref.shape)}", _ATTN_SHAPES)
            raise _Failed
        ok = _compare(report, "values without a mask match softmax(q k^T / sqrt(d_k)) v", out,
                      ref, axes, lambda **kw: _attention_variant(q, k, v, None, **kw))
        if isinstance(raw, (tuple, list)) and len(raw) > 1 and isinstance(raw[1], torch.Tensor):
            w = raw[1]
            if tuple(w.shape) == tuple(ref_w.shape):
                if ok:
                    _compare(report, "returned weights match (N, H, L_q, L_k), rows sum to 1",
                             w, ref_w)
            else:
                report.note(f"the second returned value has shape {tuple(w.shape)}; the "
                            f"weights would be (N, H, L_q, L_k) = {tuple(ref_w.shape)}")
        if not ok:
            _scale_probe(report, fn)
        mask = _both_kinds_mask((n, 1, l_q, l_k), gen)
        try:
            out_m = _as_output(report, run(mask))
            ref_m, _ = _scaled_reference(q, k, v, mask)
            _compare(report, "with a mask (bool, True = do not attend) the masked keys get no "
                     "weight", out_m, ref_m, _attention_axes(True),
                     lambda **kw: _attention_variant(q, k, v, mask, **kw))
        finally:
            if report.only_mismatch():
                localize_attention(report, lambda q, k, v, m: fn(q, k, v) if m is None
                                   else fn(q, k, v, m))
        if ok and not report.found:
            _other_width_probe(report, fn)
        if full_contract and not report.found:
            _fully_masked_probe(report, fn, q, k, v)
            _large_scores_probe(report, fn)
            _half_probe(report, fn, q, k, v, mask)
            if _takes(fn, "dropout"):
                _dropout_probe(report, fn, q, k, v, mask)

    return _run_check("check_attention", body, verbose, fn)


def _takes(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _split(raw):
    """(output, weights or None) from what fn returned."""
    if isinstance(raw, (tuple, list)):
        w = raw[1] if len(raw) > 1 and isinstance(raw[1], torch.Tensor) else None
        return raw[0], w
    return raw, None


def _fully_masked_probe(report: _Report, fn, q, k, v) -> None:
    """Query 1 sees no key at all: the contract's fill gives it uniform weights, finite."""
    mask = torch.zeros(q.size(-2), k.size(-2), dtype=torch.bool)  # (L_q, L_k)
    mask[1] = True
    mask[3, 2:] = True  # a partly masked row beside it
    out, w = _split(_call(report, "fn(q, k, v, mask) with query 1's keys all masked", fn,
                          q.clone(), k.clone(), v.clone(), mask, shape_hint=_ATTN_SHAPES))
    out = _as_output(report, out)
    ref, _ = _scaled_reference(q, k, v, mask)
    l_k = k.size(-2)
    text = (f"a query whose keys are all masked gets uniform weights 1/L_k = 1/{l_k}, "
            "finite (its output is the mean of the values)")
    if report.probe(_close(out, ref) and (w is None or _close(w[..., 1, :],
                                                              torch.full_like(w[..., 1, :],
                                                                              1 / l_k))), text):
        return
    row = out[..., 1, :]
    if not bool(torch.isfinite(row).all()):
        report.mistake("mask_fill_inf", "the fully masked query's output is NaN")
    elif bool((row == 0).all()):
        report.mistake("mask_row_zeroed", "the fully masked query's output is all zeros")
    else:
        report.mistake("mismatch", "with one query's keys all masked, the output differs from "
                       "the reference")


def _large_scores_probe(report: _Report, fn) -> None:
    """Every unmasked score is -1e5: a fixed fill such as -1e4 then outranks the visible keys,
    where the contract's fill (the dtype's most negative finite number) still gives them all."""
    d_k, l_k = 4, 5
    q = torch.zeros(1, 1, 2, d_k)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, l_k, d_k)
    k[..., 0] = -2e5  # scaled score -2e5 / sqrt(4) = -1e5 for every key
    v = torch.arange(l_k * 3, dtype=torch.float32).view(1, 1, l_k, 3)  # (1, 1, L_k, d_v)
    mask = torch.zeros(2, l_k, dtype=torch.bool)  # (L_q, L_k)
    mask[:, 3:] = True  # keys 3 and 4 hidden from both queries
    text = ("with scores of -1e5 the masked keys still get no weight (the fill is the dtype's "
            "most negative number, not a fixed constant)")
    try:
        out, _ = _split(fn(q.clone(), k.clone(), v.clone(), mask))
        out = _as_output(report, out)
    except Exception:  # noqa: BLE001 - the main probes already reported errors
        return
    ref, _ = _scaled_reference(q, k, v, mask)
    if not report.probe(_close(out, ref), text):
        report.mistake("mask_fill_weak", "with every visible score at -1e5 the output is not "
                       "the mean of the visible keys' values: a fill such as -1e4 outranks them")


def _half_probe(report: _Report, fn, q, k, v, mask) -> None:
    """float16 inputs: a fill that does not fit float16 (-1e9, float32's minimum) overflows."""
    qh, kh, vh = q.half(), k.half(), v.half()
    try:  # can this torch compute attention in float16 on the CPU at all?
        ref = _scaled_reference(qh, kh, vh, mask)[0].float()
    except Exception:  # noqa: BLE001 - an old torch without float16 kernels on the CPU
        report.note("this PyTorch cannot compute attention in float16 on the CPU, so the "
                    "float16 probe (defect 8) was skipped")
        return
    text = "float16 inputs with a mask work and match the reference (the fill fits float16)"
    try:
        out, _ = _split(fn(qh, kh, vh, mask))
    except Exception as exc:  # noqa: BLE001 - reported below
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        report.probe(False, f"{text}: raised {type(exc).__name__}: {msg}")
        if "overflow" in msg.lower():
            report.mistake("mask_fill_overflow", msg)
        else:
            report.mistake("exception", f"{type(exc).__name__}: {msg}")
        return
    ok = (isinstance(out, torch.Tensor) and out.shape == ref.shape
          and bool(torch.isfinite(out).all())
          and torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2))
    if not report.probe(ok, text):
        if isinstance(out, torch.Tensor) and not bool(torch.isfinite(out).all()):
            report.mistake("mask_fill_overflow", "the float16 output holds NaN or inf")
        else:
            report.mistake("mismatch", "in float16 the output differs from the reference")
        return
    _half_fully_masked_probe(report, fn, qh[:1, :1], kh[:1, :1], vh[:1, :1])


def _half_fully_masked_probe(report: _Report, fn, qh, kh, vh) -> None:
    """float16 with query 1's keys all masked: -1e9 written as a float16 tensor is -inf, which
    passes a partial mask but gives this row NaN; the dtype's own minimum gives uniform weights."""
    mask = torch.zeros(qh.size(-2), kh.size(-2), dtype=torch.bool)  # (L_q, L_k)
    mask[1] = True
    text = "in float16 a query whose keys are all masked still gets uniform weights, finite"
    try:
        out, _ = _split(fn(qh.clone(), kh.clone(), vh.clone(), mask))
    except Exception as exc:  # noqa: BLE001 - reported below
        report.probe(False, f"{text}: raised {type(exc).__name__}")
        report.mistake("exception", f"{type(exc).__name__}: {exc}")
        return
    mean_v = vh.float().mean(-2)  # (1, 1, d_v): the uniform row's output
    row = out[..., 1, :].float() if isinstance(out, torch.Tensor) else None
    ok = row is not None and bool(torch.isfinite(row).all()) and torch.allclose(
        row, mean_v, atol=2e-2, rtol=2e-2)
    if not report.probe(ok, text) and row is not None and not bool(torch.isfinite(row).all()):
        report.mistake("mask_fill_half_inf", "in float16 the fully masked query's output is NaN")
    elif not ok:
        report.mistake("mismatch", "in float16 the fully masked query's output is not the mean "
                       "of the values")


class _RecordingDropout(nn.Dropout):
    """A dropout module in train mode whose mask is fixed (not the global RNG): it records
    every tensor it receives, so the check can tell where the learner's code applied it."""

    def __init__(self, p: float = 0.5):
        super().__init__(p)
        self.train()
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        self.seen.append(x.detach().clone())
        return x * _keep(x) / (1 - self.p)


def _keep(x: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    return (torch.rand(x.shape, generator=gen) >= 0.5).to(x.dtype)


def _dropout_probe(report: _Report, fn, q, k, v, mask) -> None:
    drop = _RecordingDropout(0.5)
    out, _ = _split(_call(report, "fn(q, k, v, mask, dropout=nn.Dropout(0.5) in train mode)",
                          fn, q.clone(), k.clone(), v.clone(), mask, dropout=drop,
                          shape_hint=_ATTN_SHAPES))
    out = _as_output(report, out)
    plain, w = _scaled_reference(q, k, v, mask)
    expected = (w * _keep(w) / 0.5) @ v
    text = "dropout (a module in train mode) acts once, on the weights, before they mix v"
    if report.probe(len(drop.seen) == 1 and _close(out, expected), text):
        return
    shapes = [tuple(t.shape) for t in drop.seen]
    if not drop.seen:
        report.mistake("attn_dropout_unused", "the dropout module passed in was never called"
                       + (": the output is the one without dropout" if _close(out, plain)
                          else ": call the module itself on the weights, dropout(weights), "
                          "not F.dropout with its p (the contract names the module)"))
    elif tuple(plain.shape) in shapes and tuple(w.shape) != tuple(plain.shape):
        report.mistake("attn_dropout_on_output", f"it received a tensor of the output's shape "
                       f"{tuple(plain.shape)} instead of the weights {tuple(w.shape)}")
    elif len(drop.seen) > 1:
        report.mistake("attn_dropout_twice", f"it was called {len(drop.seen)} times")
    elif not _close(drop.seen[0].sum(-1), torch.ones_like(drop.seen[0].sum(-1))):
        report.mistake("attn_dropout_before_softmax", "the tensor it received has rows that do "
                       "not sum to 1: the scores, not the weights")
    else:
        report.mistake("mismatch", "with dropout in train mode the output differs from "
                       "dropout(weights) @ v")


def _scaled_reference(q, k, v, mask):
    return scaled_dot_product_attention(q, k, v, mask)


def _other_width_probe(report: _Report, fn) -> None:
    """The main probes use d_k = 64, where a hard-coded divisor of 8 is right: d_k = 16 tells."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 3, 16, generator=gen), torch.randn(1, 2, 4, 16, generator=gen),
               torch.randn(1, 2, 4, 5, generator=gen))  # d_k = 16, d_v = 5
    text = "with d_k = 16 too (the divisor follows q's last axis)"
    try:
        out = _as_output(report, _split(fn(q.clone(), k.clone(), v.clone()))[0])
    except Exception as exc:  # noqa: BLE001 - reported as a failed probe
        report.probe(False, f"{text}: raised {type(exc).__name__}")
        report.mistake("exception", f"with d_k = 16: {type(exc).__name__}: {exc}")
        return
    if report.probe(_close(out, _scaled_reference(q, k, v, None)[0]), text):
        return
    before = len(report.found)
    _scale_probe(report, fn, d_k=16, d_v=4)
    if len(report.found) == before:
        report.mistake("mismatch", "with d_k = 16 the output differs from the reference")


def _scale_probe(report: _Report, fn, d_k: int = 64, d_v: int = 16) -> None:
    """Two keys, one query: the weight on key 1 reveals the scale the learner used.

    d_v differs from d_k, so dividing by sqrt(d_v) is told from no scaling.
    """
    q = torch.zeros(1, 1, 1, d_k)
    q[..., 0] = 0.5  # small: even scores multiplied by sqrt(d_k) stay short of saturation
    k = torch.zeros(1, 1, 2, d_k)
    k[..., 1, 0] = 1.0  # q.k0 = 0, q.k1 = 0.5
    v = torch.zeros(1, 1, 2, d_v)
    v[..., 1, :] = 1.0  # every output feature is the weight on key 1
    try:
        out = fn(q, k, v)
        out = out[0] if isinstance(out, (tuple, list)) else out
        p = float(out.reshape(-1)[0])
    except Exception:  # noqa: BLE001 - the main probes already reported it
        return
    if not 0.0 < p < 1.0:
        return
    scale = math.log(p / (1 - p)) / 0.5  # sigmoid(scale * 0.5) = p
    if scale <= 0:
        return
    divisor = 1.0 / scale
    if abs(divisor - math.sqrt(d_k)) / math.sqrt(d_k) < 0.02:
        return
    if abs(divisor - 1.0) < 0.02:
        report.mistake("no_scaling")
    elif abs(divisor - d_k) / d_k < 0.02:
        report.mistake("scale_d_k")
    elif abs(divisor - math.sqrt(d_v)) / math.sqrt(d_v) < 0.02:
        report.mistake("scale_d_v")
    else:
        report.mistake("scale_other", f"with d_k={d_k} your code divides the scores by about "
                       f"{divisor:.3g} = sqrt({divisor ** 2:.4g}) instead of sqrt(d_k) = "
                       f"{math.sqrt(d_k):.3g}; a hard-coded number? The divisor must follow "
                       "q's last axis")
