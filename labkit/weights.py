"""Putting the reference's weights into a learner's module: the one mechanism every check uses.

Each reference parameter is looked up in the learner's module by its path, one attribute at
a time (``getattr``), so an alias such as ``self.w_q = self.linears[0]`` is found exactly like
a plain attribute. Where a name is missing:

- other usual names for the same part are tried (:data:`SYNONYMS`: ``q_proj``, ``ffn``, ...);
- an attention module may hold its projections as a list of Linears, as one fused q/k/v
  Linear ``(3 d_model, d_model)`` (q, k, v stacked in that order), as a fused k/v Linear, or
  as ``nn.MultiheadAttention``'s ``in_proj_weight``;
- leftover Linears under the same parent are matched by shape, in definition order.

Lazy modules (``nn.LazyLinear``) are materialised first by one forward call.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from tx_helpers.attention import MultiHeadAttention

from .report import _call, _Failed, _Report

SYNONYMS: dict[str, tuple[str, ...]] = {
    "self_attn": ("attn", "self_attention", "attention", "mha", "sa", "self_mha"),
    "cross_attn": ("src_attn", "enc_attn", "enc_dec_attn", "encoder_attn", "multihead_attn",
                   "cross_attention", "cross_mha", "context_attn"),
    "feed_forward": ("ffn", "ff", "mlp", "pos_ffn", "feedforward", "ffwd", "fc"),
    "w_q": ("q_proj", "query", "linear_q", "wq", "to_q", "q_linear", "W_q", "q"),
    "w_k": ("k_proj", "key", "linear_k", "wk", "to_k", "k_linear", "W_k", "k"),
    "w_v": ("v_proj", "value", "linear_v", "wv", "to_v", "v_linear", "W_v", "v"),
    "w_o": ("out_proj", "o_proj", "w_out", "wo", "proj", "fc_out", "to_out", "out_linear",
            "linear_out", "W_o", "o"),
    "linear1": ("w_1", "w1", "fc1", "lin1", "linear_1", "dense1", "l1"),
    "linear2": ("w_2", "w2", "fc2", "lin2", "linear_2", "dense2", "l2"),
    "norm1": ("ln1", "ln_1", "layer_norm1", "norm_1", "layernorm1", "sublayer.0.norm"),
    "norm2": ("ln2", "ln_2", "layer_norm2", "norm_2", "layernorm2", "sublayer.1.norm"),
    "norm3": ("ln3", "ln_3", "layer_norm3", "norm_3", "layernorm3", "sublayer.2.norm"),
    "norm": ("final_norm", "ln_f", "layer_norm", "ln", "norm_f"),
    "embedding": ("embed", "tok_emb", "token_embedding", "emb", "embeddings", "src_embed",
                  "tgt_embed", "lut"),
    "generator": ("out_proj", "output", "proj", "fc_out", "lm_head", "output_proj", "out",
                  "output_layer", "project"),
    "layers": ("blocks", "layer", "stack", "encoder_layers", "decoder_layers"),
    "encoder": ("enc",),
    "decoder": ("dec",),
}


def _get(obj, dotted: str):
    for part in dotted.split("."):
        if part.isdigit() and isinstance(obj, (nn.ModuleList, nn.Sequential)):
            obj = obj[int(part)] if int(part) < len(obj) else None
        else:
            try:
                obj = getattr(obj, part, None)
            except Exception:  # noqa: BLE001 - a property that raises: not found
                obj = None
        if obj is None:
            return None
    return obj


def locate(module: nn.Module, path: str) -> tuple[nn.Module | None, str]:
    """The learner's submodule for the reference path ``path`` and where it was found."""
    parts = path.split(".") if path else []

    def walk(obj, i, found):
        if i == len(parts):
            return obj, ".".join(found)
        for name in (parts[i],) + SYNONYMS.get(parts[i], ()):
            sub = _get(obj, name)
            if isinstance(sub, nn.Module):
                hit = walk(sub, i + 1, found + [name])
                if hit[0] is not None:
                    return hit
        return None, ""

    return walk(module, 0, [])


def materialize(report: _Report, module: nn.Module, warmup) -> None:
    """Run ``warmup(module)`` once if lazy layers still have no weights."""
    lazy = [m for m in module.modules()
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()]
    if lazy and warmup is not None:
        _call(report, "a first forward call (to create the weights of lazy layers)", warmup,
              module)


class _Copier:
    """Copies the reference's parameters into the learner's module and records what is off."""

    def __init__(self, report: _Report, learner: nn.Module, ref: nn.Module):
        self.report, self.learner, self.ref = report, learner, ref
        self.used: set[int] = set()  # ids of learner tensors already filled
        self.missing: list[str] = []
        self.shape_bad: list[str] = []
        self.moved: list[str] = []
        self.placed: dict[str, torch.Tensor] = {}  # reference path -> the learner's tensor

    def put(self, ref_name: str, ref_p: torch.Tensor, target, where: str) -> None:
        """Copy one reference tensor into ``target`` (a tensor, a view of one, or None)."""
        if target is None:
            if ref_name.endswith(".bias") or ref_name == "bias":
                ref_p.zero_()  # the learner has no bias: compare with a zero one
                self.report.note(f"{where or ref_name} has no bias: compared with a reference "
                                 "whose bias is zero")
            elif isinstance(_get(self.ref, ref_name.rsplit(".", 1)[0]) if "." in ref_name
                            else self.ref, nn.LayerNorm):
                ref_p.fill_(1.0)
            else:
                self.missing.append(ref_name)
            return
        base = target._base if target._base is not None else target
        self.used.add(id(base))
        if tuple(target.shape) != tuple(ref_p.shape):
            self.shape_bad.append(f"{where} {tuple(target.shape)} (expected "
                                  f"{tuple(ref_p.shape)})")
            return
        target.copy_(ref_p.detach())
        self.placed[ref_name] = target

    def leaf(self, path: str, ref_mod: nn.Module, mine: nn.Module | None, where: str) -> None:
        if mine is not None and not isinstance(mine, type(ref_mod)):  # a wrapper around it
            inner = [m for m in mine.modules() if isinstance(m, type(ref_mod))]
            if len(inner) == 1:
                mine = inner[0]
        for pname, p in ref_mod.named_parameters(recurse=False):
            full = f"{path}.{pname}" if path else pname
            target = getattr(mine, pname, None) if mine is not None else None
            if mine is None:
                self.missing.append(full)
                continue
            self.put(full, p, target if isinstance(target, torch.Tensor) else None,
                     f"{where}.{pname}" if where else pname)
        if mine is not None and where != path:
            self.moved.append(f"{path} as {where}")

    def attention(self, path: str, ref_mha: MultiHeadAttention, mine: nn.Module,
                  where: str) -> None:
        """w_q, w_k, w_v, w_o by name, fused, listed or by shape."""
        d = ref_mha.w_q.weight.shape[0]
        slots, found = {}, {}
        prefix = f"{path}." if path else ""
        for name in ("w_q", "w_k", "w_v", "w_o"):
            lin, at = locate(mine, name)
            if isinstance(lin, nn.Linear) and at.count(".") == 0:
                slots[name] = (lin.weight, lin.bias)
                found[name] = at
        in_w = getattr(mine, "in_proj_weight", None)
        if len(slots) < 4 and isinstance(in_w, torch.Tensor) and in_w.shape[0] == 3 * d:
            in_b = getattr(mine, "in_proj_bias", None)
            for i, name in enumerate(("w_q", "w_k", "w_v")):
                slots.setdefault(name, (in_w[i * d:(i + 1) * d],
                                        None if in_b is None else in_b[i * d:(i + 1) * d]))
        used = {id(w) for w, _ in slots.values()}
        rest = [m for m in mine.modules() if isinstance(m, nn.Linear) and id(m.weight) not in used]
        need = [n for n in ("w_q", "w_k", "w_v", "w_o") if n not in slots]
        fused = {3: ("w_q", "w_k", "w_v"), 2: ("w_k", "w_v")}
        for lin in list(rest):
            k = lin.weight.shape[0] // d if lin.weight.shape[0] % d == 0 else 0
            if k in fused and all(n in need for n in fused[k]) and lin.weight.shape[1] == d:
                for i, name in enumerate(fused[k]):
                    slots[name] = (lin.weight[i * d:(i + 1) * d],
                                   None if lin.bias is None else lin.bias[i * d:(i + 1) * d])
                    need.remove(name)
                rest.remove(lin)
        for name in list(need):
            lin = next((m for m in rest if tuple(m.weight.shape) == (d, d)), None)
            if lin is not None:
                slots[name] = (lin.weight, lin.bias)
                rest.remove(lin)
                need.remove(name)
        for name in ("w_q", "w_k", "w_v", "w_o"):
            ref_lin = getattr(ref_mha, name)
            full = f"{path}.{name}" if path else name
            if name not in slots:
                self.missing.append(f"{full}.weight")
                continue
            w, b = slots[name]
            self.put(f"{full}.weight", ref_lin.weight, w, f"{full}.weight")
            self.put(f"{full}.bias", ref_lin.bias, b, full)
        for name in ("w_q", "w_k", "w_v", "w_o"):
            if name in slots and found.get(name) != name:
                how = found.get(name) or "a layer of matching shape (fused or listed)"
                self.moved.append(f"{prefix}{name} as {prefix if name in found else ''}{how}")

    def run(self) -> None:
        handled: list[str] = []
        pending: dict[str, list[tuple[str, nn.Module]]] = {}
        for path, ref_mod in self.ref.named_modules():
            if any(h == "" or path == h or path.startswith(h + ".") for h in handled):
                continue
            if isinstance(ref_mod, MultiHeadAttention):
                mine, where = locate(self.learner, path)
                handled.append(path)
                if mine is None:
                    self.missing += [f"{path}.{n}" for n, _ in ref_mod.named_parameters()]
                else:
                    self.attention(path, ref_mod, mine, where)
                continue
            if not list(ref_mod.parameters(recurse=False)):
                continue
            mine, where = locate(self.learner, path)
            if mine is None and isinstance(ref_mod, (nn.Linear, nn.LayerNorm)):
                parent = path.rsplit(".", 1)[0] if "." in path else ""
                pending.setdefault(parent, []).append((path, ref_mod))
                continue
            self.leaf(path, ref_mod, mine, where)
        for parent, items in pending.items():  # leftover Linears/LayerNorms: by shape, in order
            owner = locate(self.learner, parent)[0] if parent else self.learner
            for path, ref_mod in items:
                kind = type(ref_mod) if isinstance(ref_mod, (nn.Linear, nn.LayerNorm)) else None
                rest = [m for m in (owner.modules() if owner is not None else [])
                        if isinstance(m, kind) and getattr(m, "weight", None) is not None
                        and id(m.weight) not in self.used]
                lin = next((m for m in rest if m.weight.shape == ref_mod.weight.shape), None)
                if lin is not None:
                    self.used.add(id(lin.weight))
                self.leaf(path, ref_mod, lin, f"{path} (matched by shape)" if lin else path)


def copy_reference(report: _Report, learner: nn.Module, ref: nn.Module, *, warmup=None,
                   what: str = "every reference parameter found by name and shape",
                   strict: bool = False) -> dict[str, torch.Tensor]:
    """Copy every reference parameter into ``learner``; report what could not be placed.

    Only parameters travel: buffers such as a positional-encoding table stay the learner's own.
    ``strict``: stop the check when something is missing (nothing could be compared).
    Returns reference path -> the learner's tensor (or view of one) that now holds it.
    """
    materialize(report, learner, warmup)
    copier = _Copier(report, learner, ref)
    with torch.no_grad():
        copier.run()
    missing, shape_bad = copier.missing, copier.shape_bad
    ok = not (missing or shape_bad)
    report.probe(ok, what + ("" if ok else f" ({len(missing) + len(shape_bad)} not)"))
    if missing:
        report.mistake("missing_weights", "not found: " + ", ".join(missing[:8])
                       + (" ..." if len(missing) > 8 else ""))
    if shape_bad:
        report.mistake("wrong_output_shape" if not missing else "missing_weights",
                       "wrong shape: " + ", ".join(shape_bad[:6]))
    if copier.moved:
        report.note("found under other names: " + "; ".join(copier.moved[:6]))
    extra = [n for n, p in learner.named_parameters() if id(p) not in copier.used]
    if extra and ok:
        report.note("parameters the reference does not have (left as they are): "
                    + ", ".join(extra[:8]))
    if not ok and strict:
        raise _Failed
    return copier.placed
