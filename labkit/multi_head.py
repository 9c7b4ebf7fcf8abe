"""Check: multi-head attention (w_q, w_k, w_v, w_o; any reasonable layout)."""
from __future__ import annotations

import inspect
import types

import torch

from tx_helpers.attention import MultiHeadAttention, scaled_dot_product_attention

from .attention import _attention_variant
from .compare import (
    _as_output,
    _both_kinds_mask,
    _by_name,
    _close,
    _compare,
    _deterministic,
    _instantiate,
)
from .delegation import CORE_REFERENCES, watch_references
from .localize import localize_attention, projection_inputs_probe, split_merge_probe
from .multi_head_probes import _merge_heads_probe, _stored_weights_probe, _train_mode_probe
from .report import CheckResult, _call, _Failed, _Report, _run_check
from .weights import copy_reference


def _mha_variant(ref: MultiHeadAttention, query, key, value, mask, scale=None, axis=-1,
                 split=None, masking=None, out_proj=True, kv=None):
    if kv == "swap":
        key, value = value, key
    n, l_q, d_model = query.shape
    l_k = key.size(1)
    h, d_k = ref.n_heads, ref.d_k

    def split_(x, length):
        if split == "nhld":  # view straight to (N, H, L, d_k)
            return x.reshape(n, h, length, d_k)
        if split == "nlhd":  # view to (N, L, H, d_k), no transpose: attention across heads
            return x.reshape(n, length, h, d_k)
        return x.view(n, length, h, d_k).transpose(1, 2)

    q, k, v = split_(ref.w_q(query), l_q), split_(ref.w_k(key), l_k), split_(ref.w_v(value), l_k)
    m = None
    if mask is not None:
        m = mask.unsqueeze(1) if mask.dim() == 3 else mask
    ctx = _attention_variant(q, k, v, m, scale=scale, axis=axis, masking=masking,
                             d_model=d_model)
    if split in ("nhld", "merge_only", "nlhd"):
        merged = ctx.reshape(n, l_q, d_model)
    else:
        merged = ctx.transpose(1, 2).reshape(n, l_q, d_model)
    return ref.w_o(merged) if out_proj else merged


def _mha_axes(masked: bool):
    axes = {
        "scale": [None, ("no_scaling", "none"), ("scale_sqrt_d_model", "d_model"),
                  ("scale_d_k", "d_k")],
        "axis": [-1, ("softmax_wrong_axis", -2), ("softmax_wrong_axis", 1)],
        "split": [None, ("heads_view_without_transpose", "nhld"),
                  ("heads_view_without_transpose", "nlhd"),
                  ("heads_merge_without_transpose", "merge_only")],
        "out_proj": [True, ("no_output_projection", False)],
        "kv": [None, ("key_value_swapped", "swap")],
    }
    if masked:
        axes["masking"] = [None, ("mask_inverted", "inverted"), ("mask_ignored", "ignored"),
                           ("mask_fill_zero", "zero"), ("mask_after_softmax", "after")]
    return axes


_MHA_SHAPES = ("query (N, L_q, d_model), key and value (N, L_k, d_model); heads (N, H, L, d_k); "
               "scores (N, H, L_q, L_k); the check passes masks (N, L_q, L_k) and (N, 1, L_k), "
               "which need a head axis to broadcast over the heads")


def _reference_mha(d_model, n_heads, seed=3):
    torch.manual_seed(seed)
    ref = MultiHeadAttention(d_model, n_heads, dropout=0.1).eval()
    return ref


def check_multi_head_attention(cls, *, verbose: bool = True, core_included: bool = False,
                               train_mode: bool = False,
                               lookahead_mask: bool = False,
                               stored_weights: bool = False) -> CheckResult:
    """Check ``cls(d_model, n_heads, dropout)`` with w_q, w_k, w_v, w_o and
    ``forward(query, key, value, mask=None)`` (mask bool, True = masked).

    The reference weights of a :class:`tx_helpers.MultiHeadAttention` are copied in
    by name and both run in eval mode.

    ``core_included=True``: the exercise includes the attention core (notebook 11's timed
    exercise), so a forward that calls ``tx.scaled_dot_product_attention`` or PyTorch's
    ``F.scaled_dot_product_attention``, by any route, or runs ``tx.MultiHeadAttention``'s
    code (a subclass, a borrowed ``forward``), fails a probe, and under
    :func:`labkit.mark_exercise` it is delegation (0 points). Off by default: 03's lab marks
    the core at its own exercise, and its ``MultiHeadAttention`` calls an attention function.

    ``train_mode=True`` (03's lab) also probes dropout, in train mode: the module's
    ``nn.Dropout`` must act once per element on the weights ``(N, H, L_q, L_k)``, before they
    mix the values (see :func:`labkit.multi_head_probes._train_mode_probe`).

    ``lookahead_mask=True`` (03's lab, whose contract lists it) also probes a 2-D
    ``(L_q, L_k)`` mask, the look-ahead mask shared by every sentence and head; a forward that
    gives it a head axis at dim 1, as a 3-D mask needs, lines its query axis up with the heads.

    ``stored_weights=True`` (03's lab, whose contract asks for it) also probes that after an
    eval-mode cross-attention call ``module.attn_weights`` holds the weights
    ``(N, H, L_q, L_k)`` of that call (each row sums to 1; 05 and later plot them).
    """
    d_model, n_heads = 32, 4
    names = ("w_q", "w_k", "w_v", "w_o")

    def body(report: _Report):
        if not core_included:
            return checked(report)
        # the class itself is watched too, as mark_exercise watches it: a subclass of
        # tx.MultiHeadAttention (or a borrowed forward) runs the reference's code
        with watch_references(set(CORE_REFERENCES) | {"MultiHeadAttention"}) as watch:
            try:
                checked(report)
            finally:
                report.probe(not watch.found, "forward computes the heads and the attention "
                             "core itself"
                             + (f" (not credited: {'; '.join(watch.found)})" if watch.found
                                else ""))

    def checked(report: _Report):
        state = {}
        try:
            main(report, state)
        finally:
            if report.only_mismatch() and "module" in state:
                _localize_mha(report, cls, state)
            elif "shape_error" in report.found and "module" in state:
                # equal lengths, three different tensors: which projection reads which?
                x = state["x"]
                gen = torch.Generator().manual_seed(31)
                k2, v2 = (torch.randn(x.shape, generator=gen) for _ in range(2))
                projection_inputs_probe(report, state["module"], state["ref"], x, k2, v2)

    def main(report: _Report, state: dict):
        run_cls, swapped = (cls, False) if core_included else with_reference_attention(cls)
        if swapped:
            report.note("checked with tx.scaled_dot_product_attention in place of your "
                        "attention (marked at its own exercise), so a mistake there costs once")
        module = _instantiate(report, run_cls, (d_model, n_heads, 0.1),
                              f"cls(d_model={d_model}, n_heads={n_heads}, dropout=0.1)",
                              ("d_model", "n_heads", "dropout"))
        ref = _reference_mha(d_model, n_heads)
        gen = torch.Generator().manual_seed(4)
        n, l_q, l_k = 2, 5, 7
        x = torch.randn(n, l_q, d_model, generator=gen)
        mem = torch.randn(n, l_k, d_model, generator=gen)
        mem_v = torch.randn(n, l_k, d_model, generator=gen)  # values differ from the keys
        placed = copy_reference(report, module, ref, warmup=lambda m: m(x, x, x),
                       what=f"attributes {', '.join(names)} are nn.Linear layers", strict=True)
        state.update(module=module, ref=ref, placed=placed, x=x, mem=mem, mem_v=mem_v,
                     n_heads=n_heads)

        def run(query, key, value, mask=None, what="forward(x, x, x)"):
            args = (query.clone(), key.clone(), value.clone()) + (() if mask is None else (mask,))
            out = _call(report, what, module, *args, shape_hint=_MHA_SHAPES)
            if isinstance(out, (tuple, list)):
                report.note("forward returns a tuple; the exercise returns only the output")
            return _as_output(report, out)

        def variants(query, key, value, mask):
            return lambda **kw: _mha_variant(ref, query, key, value, mask, **kw)

        out = run(x, x, x)
        _deterministic(report, lambda: run(x, x, x), out)
        _compare(report, f"self-attention output (N, L, d_model) = {(n, l_q, d_model)} "
                 "matches the reference", out, ref(x, x, x), _mha_axes(False),
                 variants(x, x, x, None))
        # each projection must matter: perturb it and look for a change
        unused = []
        for name in names:
            weight = placed[f"{name}.weight"]
            saved = weight.detach().clone()
            weight.add_(0.5 * torch.randn(saved.shape, generator=gen))
            try:
                changed = not _close(_as_output(report, module(x, x, x)), out)
            except Exception:  # noqa: BLE001 - the main probe already reported errors
                changed = True
            weight.copy_(saved)
            if not changed:
                unused.append(name)
        report.probe(not unused, "changing w_q, w_k, w_v or w_o changes the output"
                     + (f" (no effect: {', '.join(unused)})" if unused else ""))
        if "w_o" in unused:
            report.mistake("no_output_projection")
        for name in unused:
            if name != "w_o":
                report.mistake("unused_projection", f"self.{name} has no effect on the output")
        out_c = run(x, mem, mem_v, what="cross-attention forward(x, key, value), L_q != L_k, "
                    "key and value different tensors")
        _compare(report, f"cross-attention (L_q={l_q}, L_k={l_k}, key != value) matches the "
                 "reference", out_c, ref(x, mem, mem_v), _mha_axes(False),
                 variants(x, mem, mem_v, None))
        mask = _both_kinds_mask((n, l_q, l_q), gen)
        try:
            out_m = run(x, x, x, mask, what="forward(x, x, x, mask) with mask (N, L, L)")
        except _Failed:
            try:
                module(x, x, x, mask.unsqueeze(1))
                report.mistake("mask_needs_head_axis")
            except Exception:  # noqa: BLE001
                pass
            raise
        _compare(report, "with a mask (N, L, L), True = masked, matches the reference", out_m,
                 ref(x, x, x, mask), _mha_axes(True), variants(x, x, x, mask))
        pad = torch.zeros(n, 1, l_k, dtype=torch.bool)
        pad[0, 0, -2:] = True
        pad[1, 0, -4:] = True
        out_p = run(x, mem, mem, pad, what="forward(x, memory, memory, pad_mask (N, 1, L_k))")
        _compare(report, "with a padding mask (N, 1, L_k) matches the reference", out_p,
                 ref(x, mem, mem, pad), _mha_axes(True), variants(x, mem, mem, pad))
        if lookahead_mask:
            causal = torch.triu(torch.ones(l_q, l_q, dtype=torch.bool), diagonal=1)  # (L, L)
            try:
                out_la = run(x, x, x, causal, what="forward(x, x, x, mask) with a look-ahead "
                             "mask (L, L)")
            except _Failed:
                try:
                    module(x, x, x, causal.unsqueeze(0))  # (1, L, L): a 3-D mask works
                    report.mistake("mask_2d_head_axis")
                except Exception:  # noqa: BLE001
                    pass
                raise
            _compare(report, f"with a look-ahead mask (L, L) = {(l_q, l_q)}, shared by every "
                     "sentence and head, matches the reference", out_la, ref(x, x, x, causal),
                     _mha_axes(True), variants(x, x, x, causal))
        if callable(getattr(type(module), "merge_heads", None)):
            _merge_heads_probe(report, module, n, l_q, n_heads, d_model)
        if stored_weights:
            _stored_weights_probe(report, module, ref, x, mem, mem_v)
        if train_mode and not report.found and all(ok for ok, _ in report.probes):
            _train_mode_probe(report, module, ref, x, mem, mem_v)

    return _run_check("check_multi_head_attention", body, verbose, cls)


def _localize_mha(report: _Report, cls, state: dict) -> None:
    """Hooks on the projections, then the heads split alone, then the attention core alone."""
    module, ref, placed = state["module"], state["ref"], state["placed"]
    x, mem, mem_v = state["x"], state["mem"], state["mem_v"]
    where = projection_inputs_probe(report, module, ref, x, mem, mem_v)
    if where in ("inputs", "after"):
        return
    if split_merge_probe(report, module, placed, x, state["n_heads"]):
        return
    if _mask_batch_probe(report, module, x):
        return
    # one head and identity projections: the module is the attention function itself
    scratch = _Report("scratch", verbose=False)
    d = 8
    try:
        kwargs = _by_name(cls, ("d_model", "n_heads", "dropout"), (d, 1, 0.1))
        try:
            single = cls(d, 1, 0.1)
        except Exception:  # noqa: BLE001 - try the keyword form
            if kwargs is None:
                return
            single = cls(**kwargs)
        single.eval()
        ident = MultiHeadAttention(d, 1, dropout=0.1).eval()
        for lin in (ident.w_q, ident.w_k, ident.w_v, ident.w_o):
            lin.weight.copy_(torch.eye(d))
            lin.bias.zero_()
        probe_x = torch.zeros(1, 3, d)
        copy_reference(scratch, single, ident, warmup=lambda m: m(probe_x, probe_x, probe_x),
                       strict=True)
    except Exception:  # noqa: BLE001 - a layout the single-head probe cannot build
        return

    def attend(q, k, v, m):
        args = (q[:, 0], k[:, 0], v[:, 0]) + (() if m is None else (m[:, 0],))
        out = single(*args)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.unsqueeze(1)

    localize_attention(report, attend, "with one head and identity projections, ")


def _mask_batch_probe(report: _Report, module, x) -> bool:
    """A mask set for batch element 0 only must leave batch element 1's output alone."""
    n, length = x.shape[:2]
    mask = torch.zeros(n, length, length, dtype=torch.bool)
    mask[0, :, -2:] = True
    try:
        plain = module(x.clone(), x.clone(), x.clone())
        masked = module(x.clone(), x.clone(), x.clone(), mask)
        plain = plain[0] if isinstance(plain, (tuple, list)) else plain
        masked = masked[0] if isinstance(masked, (tuple, list)) else masked
    except Exception:  # noqa: BLE001 - the main probes already reported exceptions
        return False
    if _close(masked[1:], plain[1:]):
        return False
    report.mistake("mask_wrong_batch", "a mask that hides keys only for batch element 0 "
                   "changes batch element 1's output: the mask is repeated or reshaped over "
                   "batch and heads in another order than the scores")
    return True


_ATTENTION_PARAMS = ["q", "k", "v", "mask", "dropout"]


def with_reference_attention(cls):
    """``cls`` whose methods call ``tx.scaled_dot_product_attention`` where they call the
    learner's own ``attention(q, k, v, mask=None, dropout=None)`` (03's first exercise), so a
    mistake there is charged once, at its own exercise. Returns (the class to check, whether
    it swapped). A global ``attention`` with another signature, or one that returns only the
    output, is left alone: the learner's ``forward`` is written against it."""
    if not isinstance(cls, type):
        return cls, False
    methods = {n: f for n, f in vars(cls).items()
               if isinstance(f, types.FunctionType) and "attention" in f.__code__.co_names}
    own = next((f.__globals__.get("attention") for f in methods.values()), None)
    if not isinstance(own, types.FunctionType) or own is scaled_dot_product_attention:
        return cls, False
    try:
        if list(inspect.signature(own).parameters) != _ATTENTION_PARAMS:
            return cls, False
    except (TypeError, ValueError):
        return cls, False
    x = torch.zeros(1, 2, 3)
    try:
        out = own(x, x, x)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            return cls, False
    except NotImplementedError:
        pass  # the stub: the contract returns (output, weights)
    except Exception:  # noqa: BLE001 - a broken attention: its own exercise reports it
        pass
    swapped = {}
    for name, f in methods.items():
        g = types.FunctionType(f.__code__, {**f.__globals__,
                                            "attention": scaled_dot_product_attention},
                               f.__name__, f.__defaults__, f.__closure__)
        g.__kwdefaults__, g.__qualname__, g.__doc__ = f.__kwdefaults__, f.__qualname__, f.__doc__
        swapped[name] = g
    return type(cls.__name__, (cls,), {**swapped, "__module__": cls.__module__}), True
