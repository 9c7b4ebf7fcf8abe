"""Localising probes for layers, stacks and the whole model (blocks: :mod:`.localize`).

- layers: hooks on every sublayer show what each one receives, computed from the learner's
  own previous outputs (so one error does not cascade), and what the layer returns;
- the model: hooks on each stage (embedding scale, positional encoding, layer chaining, the
  final norms, the generator) say where the learner's model first parts from the reference;
- causality: which output position moves when a later target token changes.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .compare import _close
from .localize import _arg, _ratio, _tensor, hooked
from .report import _Report


def layer_probe(report: _Report, module, steps, x, final, norm_first: bool) -> bool:
    """Follow the residual stream through hooks on every sublayer.

    ``steps``: [(name, sublayer module, norm module, checks)], checks being (argument
    position, keyword names, label, expected tensor) for the arguments after the query (keys,
    values, masks); ``final()`` runs the layer. Each sublayer's input is predicted from the
    learner's own previous sublayer output, so the first divergence is named and nothing
    after it is blamed.
    """
    subs = {name: sub for name, sub, _, _ in steps}
    if any(s is None for s in subs.values()) or len({id(s) for s in subs.values()}) < len(subs):
        return False
    if any(norm is None for _, _, norm, _ in steps):
        return False
    with hooked(subs) as recs:
        try:
            out = _tensor(final())
        except Exception:  # noqa: BLE001 - the main probes already reported exceptions
            return False
    norms = [norm for _, _, norm, _ in steps]
    stream = x
    order = "Pre-LN" if norm_first else "Post-LN"
    for i, (name, _sub, norm, checks) in enumerate(steps):
        if len(recs[name].calls) != 1:
            report.mistake("sublayer_calls", f"self.{name} is called "
                           f"{len(recs[name].calls)} times in one forward pass (once expected)")
            return True
        call = recs[name].last
        q_in = _arg(call, 0, ("query", "x", "q"))
        if i == 0 and not _close(q_in, norm(stream) if norm_first else stream):
            what = _describe_input(q_in, stream, norm)
            report.mistake("pre_ln_instead_of_post_ln" if what.startswith("norm(x)") and not
                           norm_first else "post_ln_instead_of_pre_ln" if norm_first and
                           what.startswith("x without") else "sublayer_input_wrong",
                           f"self.{name} (the first sublayer) receives {what} (seen through a "
                           f"forward hook; {order} expects {'norm(x)' if norm_first else 'x'})")
            return True
        for pos, arg_names, label, tensor in checks:
            got = _arg(call, pos, arg_names)
            if tensor is None:
                continue
            if not isinstance(got, torch.Tensor):
                key = ("tgt_mask_not_passed" if label == "tgt_mask" else
                       "memory_mask_not_passed" if label == "memory_mask" else
                       "mask_not_passed" if "mask" in label else "sublayer_input_wrong")
                report.mistake(key, f"self.{name} is called without its {label} (seen through a "
                               "forward hook)")
                return True
            same = got.shape == tensor.shape and (torch.equal(got, tensor) or (
                got.is_floating_point() and _close(got, tensor)))
            if not same and tensor.dtype == torch.bool and got.shape != tensor.shape:
                g2 = got
                while g2.dim() > tensor.dim() and g2.shape[1] == 1:
                    g2 = g2.squeeze(1)  # a head axis added before the call
                try:
                    same = torch.equal(torch.broadcast_to(g2, tensor.shape).bool(), tensor) or \
                        torch.equal(g2.expand_as(tensor).bool(), tensor)
                except RuntimeError:
                    same = False
            if not same and tensor.dtype == torch.bool and got.shape == tensor.shape and \
                    torch.equal(got.bool(), ~tensor):
                report.mistake("mask_inverted", f"self.{name} receives the inverted {label} "
                               "(~mask): True must mean 'do not attend' when it is passed on")
                return True
            if not same:
                report.mistake("cross_attn_on_x" if label == "keys and values" else
                               "sublayer_input_wrong", f"self.{name} receives another tensor as "
                               f"its {label} (seen through a forward hook)")
                return True
        s = _tensor(call[2])
        stream_next = stream + s if norm_first else norm(stream + s)
        if i + 1 < len(steps):
            nxt_name, _, nxt_norm, _ = steps[i + 1]
            got = _arg(recs[nxt_name].last, 0, ("query", "x", "q"))
            wrap = nxt_norm if norm_first else (lambda t: t)
            if _close(got, wrap(stream_next)):
                stream = stream_next
                continue
            if i > 0 and _close(got, wrap(x)):
                report.mistake("sublayer_input_wrong", f"self.{nxt_name} (sublayer {i + 2}) "
                               "receives the layer's input x instead of the stream after "
                               f"self.{name} (seen through a forward hook)")
                return True
            key, text = _residual_form(got, stream, s, norm, norm_first, wrap, norms)
            if key == "residual_wrong" and norm_first:
                ratio = _ratio(got, wrap(stream_next))
                report.mistake("sublayer_input_wrong", f"self.{nxt_name} (sublayer {i + 2}) "
                               "receives something other than its LayerNorm applied to the "
                               f"stream x + self.{name}(...)"
                               + (f" (it is that tensor x {ratio.split(' times')[0]})"
                                  if "times" in ratio else "")
                               + " (seen through a forward hook)")
                return True
            report.mistake(key, f"after self.{name}, the stream is {text} (seen through the "
                           f"input of self.{nxt_name}, sublayer {i + 2})")
            return True
        if out is not None and not _close(out, stream_next):
            key, text = _residual_form(out, stream, s, norm, norm_first, lambda t: t, norms)
            report.mistake(key, f"after self.{name}, the last sublayer, the layer returns {text}")
            return True
    return False


def _describe_input(got, stream, norm) -> str:
    if _close(got, norm(stream)):
        return "norm(x): the LayerNorm comes before the sublayer (Pre-LN)"
    if _close(got, stream):
        return "x without the LayerNorm (Post-LN order)"
    return "a tensor that is neither x nor norm(x)"


def _residual_form(got, a, s, norm, norm_first, wrap, norms) -> tuple[str, str]:
    """Name how the sublayer output s was combined with the stream a."""
    forms = [
        ("sublayer_output_dropped", "the stream from before the sublayer: its output is never "
         "added", lambda: a),
        ("missing_residual", "norm(sublayer(x)): the residual x is not added", lambda: norm(s)),
        ("missing_residual", "sublayer(x) alone, the sublayer's raw output: the residual x is "
         "not added", lambda: s),
        ("layernorm_missing", "x + sublayer(x) without its LayerNorm (an unnormalised sum)",
         lambda: a + s),
        ("norm_before_residual_add", "x + norm(sublayer(x)): the LayerNorm is applied before "
         "the residual add", lambda: a + norm(s)),
        ("post_ln_instead_of_pre_ln" if norm_first else "layernorm_missing",
         "norm(x + sublayer(x)) (Post-LN)" if norm_first else "x + sublayer(x)",
         lambda: norm(a + s) if norm_first else a + s),
        ("residual_doubled", "x + 2 sublayer(x) (the sublayer output added twice)"
         if norm_first else "norm(x + 2 sublayer(x)) (the sublayer output added twice)",
         lambda: a + 2 * s if norm_first else norm(a + 2 * s)),
    ] + [("norms_mixed_up", f"normalised by another sublayer's LayerNorm (number {j + 1})",
          (lambda other=other: other(a + s))) for j, other in enumerate(norms)
         if other is not norm and not norm_first]
    for key, text, fn in forms:
        try:
            if _close(got, wrap(fn())):
                return key, text
        except Exception:  # noqa: BLE001 - shapes that do not fit: not this form
            continue
    return "residual_wrong", ("neither x + sublayer(norm(x)) nor a usual slip of it" if norm_first
                              else "neither norm(x + sublayer(x)) nor a usual slip of it")


# ----------------------------------------------------------------------------------------
# the whole model


def model_probe(report: _Report, module, ref, src, tgt, src_mask, tgt_mask, run) -> bool:
    """Hooks on the learner's embeddings, layers, final norms and generator: each stage is
    compared with the reference's stage applied to the learner's own input to it."""
    from tx_helpers.positional import sinusoidal_table

    from .weights import locate

    d = ref.config.d_model
    mods = {}
    for side in ("encoder", "decoder"):
        stack = locate(module, side)[0]
        if stack is None:
            return False
        mods[f"{side}.embedding"] = locate(stack, "embedding")[0]
        layers = locate(stack, "layers")[0]
        if not isinstance(layers, (nn.ModuleList, nn.Sequential)) or len(layers) != len(
                getattr(ref, side).layers):
            return False
        if len({id(layer) for layer in layers}) < len(layers):
            report.mistake("layers_shared", f"the {side}'s {len(layers)} layers are "
                           f"{len({id(layer) for layer in layers})} distinct module(s)")
            return True
        for i, layer in enumerate(layers):
            mods[f"{side}.layers.{i}"] = layer
        mods[f"{side}.norm"] = locate(stack, "norm")[0]
    mods["generator"] = locate(module, "generator")[0]
    if any(m is None for k, m in mods.items() if not k.endswith("norm")):
        return False
    with hooked(mods) as recs:
        try:
            out = _tensor(run())
        except Exception:  # noqa: BLE001 - the main probes already reported exceptions
            return False
    if any(not recs[k].calls for k in recs if ".layers." in k or k == "generator"):
        return False
    n_layers = len(ref.encoder.layers)
    for side in ("encoder", "decoder"):
        emb = _tensor(recs[f"{side}.embedding"].last[2]) if recs.get(f"{side}.embedding") and \
            recs[f"{side}.embedding"].calls else None
        z = _arg(recs[f"{side}.layers.0"].last, 0, ("x", "src", "tgt"))
        if emb is None or not isinstance(z, torch.Tensor) or z.shape != emb.shape:
            continue
        table = sinusoidal_table(z.size(1), d).to(z.dtype)
        if _close(z, emb * math.sqrt(d) + table):
            continue
        what = f"the {side}'s first layer receives"
        if _close(z - table, emb):
            report.mistake("embeddings_not_scaled", f"{what} embedding + PE, without the "
                           "factor sqrt(d_model) (seen through forward hooks)")
        elif _close(z, emb * math.sqrt(d)) or _close(z, emb):
            report.mistake("pe_not_added", f"{what} the embeddings without the positional "
                           "encoding (seen through forward hooks)")
        else:
            diff = (z - table).double()
            c = float((diff * emb.double()).sum() / (emb.double() ** 2).sum().clamp_min(1e-30))
            if _close(diff, c * emb.double()):
                report.mistake("embedding_scale_wrong", f"{what} embedding x {c:.4g} + PE, "
                               f"where x sqrt(d_model) = {math.sqrt(d):.4g} is expected")
            else:
                report.mistake("embedding_stage_wrong", f"{what} something other than "
                               "embedding x sqrt(d_model) + PE (seen through forward hooks)")
        return True
    for side in ("encoder", "decoder"):
        for i in range(n_layers):
            args, kwargs, got = recs[f"{side}.layers.{i}"].last
            x_in = _arg((args, kwargs, got), 0, ("x",))
            ref_layer = getattr(ref, side).layers[i]
            if side == "decoder":
                memory = _arg((args, kwargs, got), 1, ("memory",))
                want = ref_layer(x_in, memory, tgt_mask, src_mask)
            else:
                want = ref_layer(x_in, src_mask)
            if not _close(_tensor(got), want):
                mask_pos = 1 if side == "encoder" else 2
                names = ("mask", "src_mask") if side == "encoder" else ("tgt_mask",)
                passed = _arg((args, kwargs, got), mask_pos, names)
                if passed is None:
                    key = "mask_not_passed" if side == "encoder" else "tgt_mask_not_passed"
                    report.mistake(key, f"{side} layer {i} is called without its mask "
                                   "(seen through a forward hook)")
                elif side == "decoder" and _arg((args, kwargs, got), 3,
                                                ("memory_mask", "src_mask")) is None:
                    report.mistake("memory_mask_not_passed", f"decoder layer {i} is called "
                                   "without the source padding mask (seen through a forward "
                                   "hook)")
                elif isinstance(passed, torch.Tensor) and not _same_mask(
                        passed, src_mask if side == "encoder" else tgt_mask):
                    report.mistake("layer_mask_differs", f"{side} layer {i} is given a mask "
                                   "that hides other positions than " + (
                                       "the source padding" if side == "encoder" else
                                       "padding OR look-ahead") + " (seen through a forward hook)")
                else:
                    report.mistake("submodule_differs", f"{side} layer {i} gives other numbers "
                                   "than a correct layer given the same input (seen through a "
                                   "forward hook)", f"run check_{side}_layer on your "
                                   f"{side} layer class")
                return True
            if i + 1 < n_layers:
                nxt = _arg(recs[f"{side}.layers.{i + 1}"].last, 0, ("x",))
                if not _close(nxt, _tensor(got)):
                    report.mistake("layers_not_chained", f"{side} layer {i + 1} does not receive "
                                   f"the output of layer {i} (seen through forward hooks)")
                    return True
        last = _tensor(recs[f"{side}.layers.{n_layers - 1}"].last[2])
        if side == "encoder":
            memory = _arg(recs["decoder.layers.0"].last, 1, ("memory",))
            final_norm = getattr(ref, side).norm
            if not _close(memory, final_norm(last)):
                if _close(memory, last):
                    report.mistake("no_final_norm", "the decoder receives the last encoder "
                                   "layer's output without the encoder's final LayerNorm")
                else:
                    report.mistake("memory_wrong", "the decoder layers receive as memory "
                                   "something other than the encoder's output")
                return True
        else:
            g_in = _arg(recs["generator"].last, 0, ("input", "x"))
            if not _close(g_in, ref.decoder.norm(last)):
                if _close(g_in, last):
                    report.mistake("no_final_norm", "the generator receives the last decoder "
                                   "layer's output without the decoder's final LayerNorm")
                else:
                    report.mistake("generator_input_wrong", "the generator receives something "
                                   "other than the decoder's normalised output")
                return True
    g_out = _tensor(recs["generator"].last[2])
    if out is not None and g_out is not None and not _close(out, g_out):
        if _close(out, torch.softmax(g_out, -1)) or _close(out, torch.log_softmax(g_out, -1)):
            report.mistake("returns_probabilities", "the model returns the softmax of the "
                           "generator's output")
        else:
            report.mistake("output_changed", "the model changes the generator's output before "
                           "returning it")
        return True
    return False


def causality_probe(report: _Report, run, tgt: torch.Tensor, vocab: int) -> bool:
    """Change one target token at a time: which earlier output positions move?"""
    try:
        base = _tensor(run(tgt))
    except Exception:  # noqa: BLE001 - the main probes already reported exceptions
        return False
    leaks = []
    for j in range(1, tgt.size(1)):
        t2 = tgt.clone()
        t2[:, j] = (t2[:, j] + 5) % vocab
        t2[:, j] = torch.where(t2[:, j] < 3, t2[:, j] + 3, t2[:, j])
        try:
            out = _tensor(run(t2))
        except Exception:  # noqa: BLE001
            return False
        leaks += [(i, j) for i in range(j) if not _close(out[:, i], base[:, i])]
    if not leaks:
        return False
    i, j = min(leaks, key=lambda p: (p[1] - p[0], -p[1]))
    reach = max(b - a for a, b in leaks)
    report.mistake("decoder_sees_future", f"output position {i} changes when target position "
                   f"{j} changes: the mask leaks {j - i} step(s) ahead"
                   + (f" (through the stacked layers, up to {reach} steps)" if reach > j - i
                      else ""))
    return True


def _same_mask(got: torch.Tensor, want: torch.Tensor) -> bool:
    g = got.bool() if got.dtype == torch.bool else got < -1e4 if got.is_floating_point() else got
    while g.dim() > want.dim() and g.shape[1] == 1:
        g = g.squeeze(1)
    try:
        full = torch.broadcast_shapes(g.shape, want.shape)
        return torch.equal(g.expand(full).bool(), want.expand(full))
    except RuntimeError:
        return False
