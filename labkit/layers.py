"""Checks: the encoder layer and the decoder layer (Post-LN or Pre-LN)."""
from __future__ import annotations

import itertools

import torch

from tx_helpers.layers import DecoderLayer, EncoderLayer
from tx_helpers.masks import decoder_self_mask

from .compare import (
    _as_output,
    _close,
    _compare,
    _deterministic,
    _instantiate,
    _randomize_norms,
)
from .dropout import dropout_probe
from .localize_stack import layer_probe
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Failed, _Report, _run_check
from .weights import copy_reference, locate

MISTAKES.update({
    "norm_called_repeatedly": (
        "a LayerNorm runs more than once per forward (the article's Pre-LN snippet calls "
        "norm1 three times, defect 10): the output is the same, the work is not",
        "normalise once into a local name and pass that name to every argument that needs it"),
    "dropout_placement_unknown": (
        "in train mode the output matches no dropout placement, although eval mode matches: "
        "dropout is drawn outside the layer's own dropout modules (for example inside "
        "another library's layer), or where the reference has none",
        "each sublayer's output passes the layer's own dropout once, before the residual "
        "add, and nothing else in the layer is dropped"),
    "cross_attn_on_norm_memory": (
        "cross-attention's keys and values are the memory passed through the decoder's own "
        "LayerNorm (norm2): Pre-LN normalises the sublayer's input x, the queries' side only",
        "pass memory to cross_attn as key and value as it comes from the encoder, whose final "
        "norm has already normalised it"),
})


def _norm_calls_probe(report: _Report, module, norms, run) -> None:
    """Each LayerNorm of the layer runs exactly once per forward, in either layout (probed
    only where the layer has them under these names: a ModuleList of norms is not counted)."""
    found = {name: getattr(module, name, None) for name in norms}
    if not all(isinstance(m, torch.nn.Module) for m in found.values()):
        return
    counts = dict.fromkeys(norms, 0)
    handles = []
    for name, norm in found.items():
        def hook(*_, name=name):
            counts[name] += 1
        handles.append(norm.register_forward_hook(hook))
    try:
        with torch.no_grad():
            run(module)
    finally:
        for h in handles:
            h.remove()
    extra = {n: c for n, c in counts.items() if c > 1}
    if not report.probe(not extra, "each of " + ", ".join(norms) + " runs once per forward"
                        + (f" (runs: {counts})" if extra else "")):
        report.mistake("norm_called_repeatedly",
                       ", ".join(f"{n} ran {c} times" for n, c in extra.items()))


def _sublayers(x, steps, order, residual):
    """Run (fn, norm) steps with one residual/LayerNorm arrangement."""
    for i, (fn, norm) in enumerate(steps):
        keep = 0 if residual in ("all", i) else x
        if order == "post":
            x = norm(keep + fn(x))
        elif order == "pre":
            x = keep + fn(norm(x))
        else:  # norm of the sublayer output, then the add
            x = keep + norm(fn(x))
    return x


def _layer_axes(norm_first: bool, n_sub: int):
    right, wrong = ("pre", "post") if norm_first else ("post", "pre")
    wrong_key = "post_ln_instead_of_pre_ln" if norm_first else "pre_ln_instead_of_post_ln"
    return {
        "order": [right, (wrong_key, wrong), ("norm_before_residual_add", "norm_before_add")],
        "residual": [None, ("missing_residual", "all")]
        + [("missing_residual", i) for i in range(n_sub)],
        "norms": [None] + [("norms_mixed_up", p) for p in
                           itertools.permutations(range(n_sub)) if list(p) != list(range(n_sub))]
        + [("norms_mixed_up", (0,) * n_sub)],
        "swap": [False, ("sublayers_out_of_order", True)],
    }


def _layer_probes(report, module, ref, run_mine, run_ref, variant, axes, subs, what,
                  shape_hint="", swapped=None):
    try:
        out = _as_output(report, _call(report, what, run_mine, module, shape_hint=shape_hint))
    except _Failed:
        if swapped is not None:
            try:
                if _close(_as_output(report, swapped(module)), run_ref()):
                    report.mistake("masks_swapped")
            except Exception:  # noqa: BLE001 - the first error is already reported
                pass
        raise
    _deterministic(report, lambda: run_mine(module), out)
    if _compare(report, f"{what} matches the reference", out, run_ref(), axes, variant):
        return
    for name, call in subs:
        mine = getattr(module, name, None)
        if mine is None:
            continue
        try:
            got = _as_output(report, call(mine))
        except Exception:  # noqa: BLE001 - reported as a submodule difference below
            got = None
        if not _close(got, call(getattr(ref, name))):
            report.mistake("submodule_differs", f"self.{name} alone gives other numbers than "
                           f"the reference" + _sub_diagnosis(name, mine), f"run the check for "
                           f"{name} first (check_multi_head_attention or check_feed_forward)")


_LAYER_SHAPES = ("x (N, L_tgt, d_model), memory (N, L_src, d_model); self-attention gets "
                 "tgt_mask (N, L_tgt, L_tgt) (encoder: mask (N, 1, L)), cross-attention gets "
                 "memory_mask (N, 1, L_src) with queries from x and keys/values from memory")


def check_encoder_layer(cls, *, norm_first: bool = False, verbose: bool = True) -> CheckResult:
    """Check ``cls(d_model, n_heads, d_ff, dropout)`` with self_attn (w_q..w_o), feed_forward
    (linear1, linear2), norm1, norm2 and ``forward(x, mask=None)``.

    The reference is :class:`tx_helpers.EncoderLayer` in Post-LN order (the paper); pass
    ``norm_first=True`` when the exercise asks for Pre-LN.
    """
    d_model, n_heads, d_ff = 32, 4, 64

    def body(report: _Report):
        module = _instantiate(report, cls, (d_model, n_heads, d_ff, 0.1),
                              f"cls(d_model={d_model}, n_heads={n_heads}, d_ff={d_ff}, "
                              f"dropout=0.1)", ("d_model", "n_heads", "d_ff", "dropout"))
        torch.manual_seed(7)
        gen = torch.Generator().manual_seed(8)
        ref = EncoderLayer(d_model, n_heads, d_ff, 0.1, norm_first=norm_first).eval()
        _randomize_norms(ref, gen)
        x = torch.randn(2, 6, d_model, generator=gen)
        mask = torch.zeros(2, 1, 6, dtype=torch.bool)
        mask[0, 0, -2:] = True
        copy_reference(report, module, ref, warmup=lambda m: m(x))

        for m, label in ((None, "forward(x)"), (mask, "forward(x, mask (N, 1, L))")):
            def variant(order, residual, norms, swap, masking=None, m=m):
                mm = None if masking else m
                norm_mods = [ref.norm1, ref.norm2]
                if norms is not None:
                    norm_mods = [norm_mods[i] for i in norms]
                fns = [lambda h: ref.self_attn(h, h, h, mm), ref.feed_forward]
                if swap:
                    fns = fns[::-1]
                return _sublayers(x, list(zip(fns, norm_mods, strict=True)), order, residual)

            axes = _layer_axes(norm_first, 2)
            if m is not None:
                axes["masking"] = [None, ("mask_not_passed", "dropped")]
            args = (x.clone(),) if m is None else (x.clone(), m)
            _layer_probes(report, module, ref, lambda mod, a=args: mod(*a),
                          lambda m=m: ref(x, m), variant, axes,
                          [("self_attn", lambda s, m=m: s(x, x, x, m)),
                           ("feed_forward", lambda f: f(x))], label, _LAYER_SHAPES)
        if report.only_mismatch():
            _localize_layer(report, module, [("self_attn", "norm1", [(3, "mask", mask)]),
                                             ("feed_forward", "norm2", [])], x,
                            lambda: module(x.clone(), mask), norm_first)
        if not report.found:
            parts = [("self_attn", lambda a, h: a(h, h, h, mask), "norm1"),
                     ("feed_forward", lambda f, h: f(h), "norm2")]
            dropout_probe(report, module, ref, lambda mod: mod(x.clone(), mask), parts, x,
                          norm_first, unknown_fails=True)
        if not report.found:
            _norm_calls_probe(report, module, ("norm1", "norm2"),
                              lambda mod: mod(x.clone(), mask))

    return _run_check("check_encoder_layer", body, verbose, cls)


def check_decoder_layer(cls, *, norm_first: bool = False, both_layouts: bool = False,
                        verbose: bool = True) -> CheckResult:
    """Check ``cls(d_model, n_heads, d_ff, dropout)`` with self_attn, cross_attn, feed_forward,
    norm1..norm3 and ``forward(x, memory, tgt_mask=None, memory_mask=None)``.

    The reference is :class:`tx_helpers.DecoderLayer` (Post-LN unless ``norm_first=True``).
    ``both_layouts=True``: one check of both, ``cls(...)`` as Post-LN and
    ``cls(..., norm_first=True)`` as Pre-LN; it passes only if both do.
    """
    if both_layouts:
        return _both_layouts(cls, verbose)
    d_model, n_heads, d_ff = 32, 4, 64

    def body(report: _Report):
        module = _instantiate(report, cls, (d_model, n_heads, d_ff, 0.1),
                              f"cls(d_model={d_model}, n_heads={n_heads}, d_ff={d_ff}, "
                              f"dropout=0.1)", ("d_model", "n_heads", "d_ff", "dropout"))
        torch.manual_seed(9)
        gen = torch.Generator().manual_seed(10)
        ref = DecoderLayer(d_model, n_heads, d_ff, 0.1, norm_first=norm_first).eval()
        _randomize_norms(ref, gen)
        n, l_tgt, l_src = 2, 5, 7
        x = torch.randn(n, l_tgt, d_model, generator=gen)
        memory = torch.randn(n, l_src, d_model, generator=gen)
        copy_reference(report, module, ref, warmup=lambda m: m(x, memory))
        tgt = torch.tensor([[2, 5, 6, 7, 1], [2, 3, 1, 1, 1]])
        tgt_mask = decoder_self_mask(tgt, 1)  # (N, L_tgt, L_tgt)
        mem_mask = torch.zeros(n, 1, l_src, dtype=torch.bool)
        mem_mask[0, 0, -3:] = True

        cases = ((None, None, "forward(x, memory)"),
                 (tgt_mask, mem_mask, "forward(x, memory, tgt_mask (N, L_tgt, L_tgt), "
                                      "memory_mask (N, 1, L_src))"))
        for t_m, m_m, label in cases:
            def variant(order, residual, norms, swap, masking=None, cross=None, t_m=t_m,
                        m_m=m_m):
                tm = None if masking in ("tgt", "both") else t_m
                mm = None if masking in ("memory", "both") else m_m
                norm_mods = [ref.norm1, ref.norm2, ref.norm3]
                if norms is not None:
                    norm_mods = [norm_mods[i] for i in norms]
                if cross == "on_x":
                    def ca(h):
                        return ref.cross_attn(h, h, h, tm)
                elif cross == "norm_memory":  # the query's norm applied to memory as well
                    def ca(h, norm=norm_mods[1]):
                        return ref.cross_attn(h, norm(memory), norm(memory), mm)
                elif cross == "self":
                    def ca(h):
                        return ref.self_attn(h, memory, memory, mm)
                else:
                    def ca(h):
                        return ref.cross_attn(h, memory, memory, mm)
                fns = [lambda h: ref.self_attn(h, h, h, tm), ca, ref.feed_forward]
                if swap:
                    fns = [fns[1], fns[0], fns[2]]
                return _sublayers(x, list(zip(fns, norm_mods, strict=True)), order, residual)

            axes = _layer_axes(norm_first, 3)
            axes["cross"] = [None, ("cross_attn_on_x", "on_x"),
                             ("self_attn_reused_for_cross", "self")]
            if norm_first:
                axes["cross"].append(("cross_attn_on_norm_memory", "norm_memory"))
            if t_m is not None:
                axes["masking"] = [None, ("tgt_mask_not_passed", "tgt"),
                                   ("memory_mask_not_passed", "memory")]
            args = (x.clone(), memory.clone()) + (() if t_m is None else (t_m, m_m))
            subs = [("self_attn", lambda s, t_m=t_m: s(x, x, x, t_m)),
                    ("cross_attn", lambda s, m_m=m_m: s(x, memory, memory, m_m)),
                    ("feed_forward", lambda f: f(x))]
            swapped = None if t_m is None else (
                lambda mod, t_m=t_m, m_m=m_m: mod(x.clone(), memory.clone(), m_m, t_m))
            _layer_probes(report, module, ref, lambda mod, a=args: mod(*a),
                          lambda t_m=t_m, m_m=m_m: ref(x, memory, t_m, m_m), variant, axes,
                          subs, label, _LAYER_SHAPES, swapped)
        if report.only_mismatch():
            _localize_layer(report, module, [
                ("self_attn", "norm1", [(3, "tgt_mask", tgt_mask)]),
                ("cross_attn", "norm2", [(1, "keys and values", memory),
                                         (2, "keys and values", memory),
                                         (3, "memory_mask", mem_mask)]),
                ("feed_forward", "norm3", [])], x,
                lambda: module(x.clone(), memory.clone(), tgt_mask, mem_mask), norm_first)
        if not report.found:
            def first(a, h):  # the same seed as run: dropout a sublayer draws itself lines up
                torch.manual_seed(11)
                return a(h, h, h, tgt_mask)

            def run(mod):
                torch.manual_seed(11)
                return mod(x.clone(), memory.clone(), tgt_mask, mem_mask)

            parts = [("self_attn", first, "norm1"),
                     ("cross_attn", lambda a, h: a(h, memory, memory, mem_mask), "norm2"),
                     ("feed_forward", lambda f, h: f(h), "norm3")]
            dropout_probe(report, module, ref, run, parts, x, norm_first, unknown_fails=True)
        if not report.found:
            _norm_calls_probe(report, module, ("norm1", "norm2", "norm3"),
                              lambda mod: mod(x.clone(), memory.clone(), tgt_mask, mem_mask))

    return _run_check("check_decoder_layer", body, verbose, cls)


def _both_layouts(cls, verbose: bool) -> CheckResult:
    """Post-LN on ``cls(...)`` and Pre-LN on ``cls(..., norm_first=True)``, one report."""
    import functools

    pre = functools.partial(cls, norm_first=True) if callable(cls) else cls
    merged = _Report("check_decoder_layer", verbose, getattr(cls, "__name__", ""))
    for layout, result in (("Post-LN", check_decoder_layer(cls, verbose=False)),
                           ("Pre-LN", check_decoder_layer(pre, norm_first=True,
                                                          verbose=False))):
        for line in result.messages:
            if line.startswith(("  ✓ ", "  ✗ ")):
                merged.probe(line.startswith("  ✓ "), f"{layout}: {line[4:]}")
            elif line.startswith("Note: "):
                merged.note(line[len("Note: "):])
        lines = result.messages + [""]
        found = [(text[len("Diagnosis: "):], after[len("Hint: "):] if after.startswith("Hint: ")
                  else "") for text, after in zip(lines, lines[1:], strict=False)
                 if text.startswith("Diagnosis: ")]
        for key, (text, hint) in zip(result.mistakes, found, strict=False):
            if key not in merged.found:
                merged.found[key] = (f"{layout}: {text}", hint or MISTAKES.get(key, ("", ""))[1])
    return merged.finish()



_ARG_NAMES = {"mask": ("mask", "attn_mask", "src_mask"), "tgt_mask": ("mask", "attn_mask",
              "tgt_mask"), "memory_mask": ("mask", "attn_mask", "memory_mask", "src_mask"),
              "keys and values": ("key", "value", "k", "v", "memory")}


def _localize_layer(report, module, parts, x, run, norm_first) -> None:
    """Hooks on the learner's own sublayers: where does the residual stream first go wrong?"""
    steps = []
    for name, norm_name, checks in parts:
        sub = locate(module, name)[0]
        norm = locate(module, norm_name)[0]
        steps.append((name, sub, norm, [(pos, _ARG_NAMES[label], label, t)
                                        for pos, label, t in checks]))
    layer_probe(report, module, steps, x, run, norm_first)


def _sub_diagnosis(name: str, mine) -> str:
    """What the submodule's own check says about its class (its first diagnosis), if any."""
    from .feed_forward import check_feed_forward
    from .multi_head import check_multi_head_attention

    check = check_feed_forward if name == "feed_forward" else check_multi_head_attention
    try:
        result = check(type(mine), verbose=False)
    except Exception:  # noqa: BLE001 - the sub-check is extra information only
        return ""
    first = next((m for m in result.messages if m.startswith("Diagnosis: ")), "")
    return (f"; its class, checked alone by {result.name}, shows: {first[len('Diagnosis: '):]}"
            if first and not result.passed else "")
