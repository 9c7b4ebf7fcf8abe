"""Localising probes: inputs built to isolate one part of a block, and forward hooks.

The variant lists in each check name the mistakes someone thought of. These probes run when
the output differs and no listed variant matches; each isolates one part and says which
quantity is off, so the diagnosis holds for a mistake nobody listed:

- attention: one-hot values make the output equal to the weights, which are then read off
  directly (do they sum to 1 over the keys? is log w linear in q.k, and with what slope? do
  masked keys get weight?);
- multi-head attention: one head with identity projections reduces the module to the
  attention function; zero query/key projections make every score equal, which isolates the
  heads split and merge; forward hooks show which tensor each projection received and
  whether w_o received the reference's merged heads;
- feed-forward: hooks on the two Linears show the hidden width, what the activation does to
  negative and positive pre-activations, and what happens after linear2;
- layers: hooks on every sublayer show what each one receives, computed from the learner's
  own previous outputs (so one error does not cascade), and what the layer returns.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from .compare import _close
from .report import _Report

# ----------------------------------------------------------------------------------------
# hooks


class _Recorder:
    def __init__(self):
        self.calls: list[tuple[tuple, dict, object]] = []

    def __call__(self, module, args, kwargs, output):
        self.calls.append((args, kwargs, output))

    @property
    def last(self):
        return self.calls[-1] if self.calls else None


@contextlib.contextmanager
def hooked(modules: dict[str, nn.Module | None]):
    """Record every call (args, kwargs, output) of the given modules while inside."""
    recs = {name: _Recorder() for name, m in modules.items() if m is not None}
    handles = [modules[name].register_forward_hook(rec, with_kwargs=True)
               for name, rec in recs.items()]
    try:
        yield recs
    finally:
        for h in handles:
            h.remove()


def _tensor(out):
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out if isinstance(out, torch.Tensor) else None


def _arg(call, index: int, names: tuple[str, ...]):
    """Positional argument ``index`` of a recorded call, or the first keyword in ``names``."""
    args, kwargs, _ = call
    if len(args) > index:
        return args[index]
    for n in names:
        if n in kwargs:
            return kwargs[n]
    return None


# ----------------------------------------------------------------------------------------
# attention read off through one-hot values


def localize_attention(report: _Report, attend, where: str = "") -> bool:
    """Read the attention weights off ``attend(q, k, v, mask)`` (4-D, one head) with one-hot
    values and name what is off. Returns whether something was named."""
    gen = torch.Generator().manual_seed(21)
    n_q, n_k, d = 3, 5, 8
    q = 0.7 * torch.randn(1, 1, n_q, d, generator=gen)
    k = 0.7 * torch.randn(1, 1, n_k, d, generator=gen)
    v = torch.zeros(1, 1, n_k, d)
    v[0, 0, torch.arange(n_k), torch.arange(n_k)] = 1.0  # value j = e_j: output = weights
    pre = f"{where}with one-hot values (value j = e_j, so the output row is the weights)"
    try:
        out = _tensor(attend(q, k, v, None))
    except Exception:  # noqa: BLE001 - the main probes already reported exceptions
        return False
    if out is None or out.numel() != n_q * d:
        return False
    out = out.reshape(n_q, d).double()
    w, rest = out[:, :n_k], out[:, n_k:]
    if float(rest.abs().max()) <= 1e-4 and float(w.max()) <= 1e-6 and torch.allclose(
            w.exp().sum(-1), torch.ones(n_q, dtype=w.dtype), atol=1e-4):
        report.mistake("attention_log_weights", f"{pre}, the weights are all <= 0 and "
                       "exp(weights) sums to 1 over the keys: log_softmax where softmax belongs")
        return True
    if float(rest.abs().max()) > 1e-4 or float(w.min()) < -1e-5:
        report.mistake("attention_values_wrong", f"{pre}, the output is not a mix of the value "
                       "rows: the weights must multiply v (and nothing else) last")
        return True
    rows = w.sum(-1)
    if not torch.allclose(rows, torch.ones_like(rows), atol=1e-4):
        cols = w.sum(-2)
        if torch.allclose(cols, torch.ones_like(cols), atol=1e-4) or n_q != n_k and torch.allclose(
                cols, cols.new_full(cols.shape, n_k / n_q), atol=1e-4):
            report.mistake("softmax_wrong_axis", f"{pre}, each query's weights over the keys sum "
                           f"to {_few(rows)} instead of 1: the normalisation runs over the "
                           "queries")
        else:
            report.mistake("attention_rows_not_normalised", f"{pre}, each query's weights over "
                           f"the keys sum to {_few(rows)} instead of 1")
        return True
    scores = (q @ k.transpose(-2, -1)).reshape(n_q, n_k).double()
    logw = torch.log(w.clamp_min(1e-300))
    ds = scores - scores.mean(-1, keepdim=True)
    dl = logw - logw.mean(-1, keepdim=True)
    c = float((ds * dl).sum() / (ds * ds).sum())
    resid = float((dl - c * ds).norm() / max(float(dl.norm()), 1e-12))
    if resid > 1e-2 and float(w.min()) > 1e-12:
        report.mistake("attention_weights_not_softmax", f"{pre}, log(weights) is not linear "
                       "in the scores q.k: the weights are not softmax(c q.k) for any scale c")
        return True
    named = False
    c0 = 1.0 / math.sqrt(d)
    if abs(c - c0) > 0.02 * c0:
        if c < 0:
            report.mistake("scale_other", f"{pre}, keys with a larger q.k get less weight: "
                           "the sign of the scores is flipped")
        elif abs(c - 1.0) < 0.02:
            report.mistake("no_scaling", f"{pre}, log(weights) grows by 1.0 per unit of q.k "
                           f"where 1/sqrt(d_k) = {c0:.4g} is expected (d_k = {d})")
        elif abs(c - 1.0 / d) < 0.02 / d:
            report.mistake("scale_d_k", f"{pre}, the scores are multiplied by {c:.4g} = 1/d_k "
                           f"where 1/sqrt(d_k) = {c0:.4g} is expected (d_k = {d})")
        else:
            report.mistake("scale_other", f"{pre}, the scores are multiplied by {c:.4g} (1/"
                           f"{1 / c:.4g}) where 1/sqrt(d_k) = {c0:.4g} is expected (d_k = {d})")
        named = True
    mask = torch.zeros(1, 1, n_q, n_k, dtype=torch.bool)
    mask[0, 0, 0, 1] = mask[0, 0, 1, 0] = mask[0, 0, 1, 3] = mask[0, 0, 2, 4] = True
    try:
        out_m = _tensor(attend(q, k, v, mask))
    except Exception:  # noqa: BLE001 - the main probes already reported exceptions
        return named
    if out_m is None or out_m.numel() != n_q * d:
        return named
    wm = out_m.reshape(n_q, d)[:, :n_k].double()
    m2 = mask.reshape(n_q, n_k)
    leaked = float(wm[m2].max())
    rows = wm.sum(-1)
    if leaked > 1e-6:
        if torch.allclose(wm, w, atol=1e-5):
            report.mistake("mask_ignored", f"{where}with a mask, the weights read off one-hot "
                           "values are the same as without it")
        elif float(wm[~m2].abs().max()) < 1e-6:
            report.mistake("mask_inverted", f"{where}the masked keys get all the weight and "
                           "the others none")
        else:
            report.mistake("mask_fill_weak", f"{where}a masked key still gets weight "
                           f"{leaked:.3g} (read off one-hot values): the masked scores are not "
                           "pushed far enough down before the softmax")
        return True
    if not torch.allclose(rows, torch.ones_like(rows), atol=1e-4):
        report.mistake("mask_after_softmax", f"{where}with a mask, each query's weights sum to "
                       f"{_few(rows)}: the masked weights are removed after the softmax")
        return True
    expected = torch.softmax((c * scores).masked_fill(m2, float("-inf")), -1)
    if not named and not torch.allclose(wm, expected, atol=1e-4):
        report.mistake("mask_other", f"{where}with a mask, the weights on the unmasked keys "
                       "are not a softmax over those keys alone")
        return True
    return named


def _few(t: torch.Tensor) -> str:
    vals = [f"{float(x):.3g}" for x in t.reshape(-1)[:4]]
    return "[" + ", ".join(vals) + (", ...]" if t.numel() > 4 else "]")


# ----------------------------------------------------------------------------------------
# multi-head attention


def split_merge_probe(report: _Report, module, placed: dict, x: torch.Tensor, n_heads: int
                      ) -> bool:
    """Zero query/key projections make every score equal; identity value/output projections
    make the output the heads' merged means. Which split and merge give it?"""
    names = [f"{p}.{t}" for p in ("w_q", "w_k", "w_v", "w_o") for t in ("weight", "bias")]
    if not all(n in placed for n in ("w_q.weight", "w_k.weight", "w_v.weight", "w_o.weight")):
        return False
    saved = {n: placed[n].detach().clone() for n in names if n in placed}
    d = x.size(-1)
    try:
        for n in names:
            if n in placed:
                eye = n.endswith("weight") and n[:3] in ("w_v", "w_o")
                placed[n].copy_(torch.eye(d) if eye else torch.zeros_like(placed[n]))
        try:
            out = _tensor(module(x.clone(), x.clone(), x.clone()))
        except Exception:  # noqa: BLE001 - the main probes already reported exceptions
            return False
    finally:
        for n, t in saved.items():
            placed[n].copy_(t)
    if out is None or out.shape != x.shape:
        return False
    n, length, _ = x.shape
    h, d_k = n_heads, d // n_heads

    def ctx(split):
        heads = {"ok": lambda t: t.view(n, length, h, d_k).transpose(1, 2),
                 "nhld": lambda t: t.reshape(n, h, length, d_k),
                 "nlhd": lambda t: t.reshape(n, length, h, d_k)}[split](x)
        return heads.mean(-2, keepdim=True).expand_as(heads)

    merges = {"ok": lambda c: c.transpose(1, 2).reshape(n, length, d),
              "flat": lambda c: c.reshape(n, length, d)}
    found = None
    for split in ("ok", "nhld", "nlhd"):
        for merge in ("ok", "flat"):
            if _close(out, merges[merge](ctx(split))):
                found = (split, merge)
                break
        if found:
            break
    text_split = {"ok": "correct (view to (N, L, H, d_k), then transpose(1, 2))",
                  "nhld": "view straight to (N, H, L, d_k) with no transpose, so each 'head' "
                          "holds pieces of several positions",
                  "nlhd": "view to (N, L, H, d_k) with no transpose, so attention runs across "
                          "the heads instead of the positions"}
    text_merge = {"ok": "correct (transpose(1, 2), then view to (N, L, d_model))",
                  "flat": "view straight to (N, L, d_model) with no transpose"}
    pre = "with every score equal (zero w_q, w_k) and identity w_v, w_o, "
    if found == ("ok", "ok"):
        report.probe(True, "heads split and merged back correctly (every score equal)")
        return False
    report.probe(False, "heads split and merged back correctly (every score equal)")
    if found is None:
        report.mistake("heads_split_wrong", pre + "every position should get the mean of the "
                       "values over all positions; yours does not: the heads split or merge "
                       "mixes positions and features")
    elif found[0] != "ok":
        report.mistake("heads_view_without_transpose", pre + f"the split is {text_split[found[0]]}"
                       f"; the merge is {text_merge[found[1]]}")
    else:
        report.mistake("heads_merge_without_transpose", pre + f"the split is correct; the merge "
                       f"is {text_merge[found[1]]}")
    return True


def projection_inputs_probe(report: _Report, module, ref, query, key, value) -> str | None:
    """Hooks on w_q, w_k, w_v, w_o: which tensor each projection received, and whether w_o
    received the reference's merged heads. Returns "context" when w_o's input differs,
    "after" when only what follows w_o differs, None when nothing could be said."""
    from .weights import locate

    mods = {}
    for name in ("w_q", "w_k", "w_v", "w_o"):
        lin, at = locate(module, name)
        if isinstance(lin, nn.Linear) and at.count(".") == 0:
            mods[name] = lin
    if len(mods) < 4 or len({id(m) for m in mods.values()}) < 4:
        return None
    with hooked(mods) as recs, hooked({"w_o": ref.w_o}) as ref_recs:
        try:
            out = _tensor(module(query.clone(), key.clone(), value.clone()))
        except Exception:  # noqa: BLE001 - the main probes already reported exceptions
            return None
        ref_out = ref(query, key, value)
    inputs = {"query": query, "key": key, "value": value}
    want = {"w_q": "query", "w_k": "key", "w_v": "value"}
    wrong = []
    for name, tensor_name in want.items():
        got = [c[0][0] if c[0] else None for c in recs[name].calls]
        seen = [next((t for t, ten in inputs.items() if _close(g, ten)), "another tensor")
                for g in got]
        if seen != [tensor_name]:
            wrong.append((name, tensor_name, seen))
    if wrong:
        if sorted((w[0], tuple(w[2])) for w in wrong) == [("w_k", ("value",)),
                                                         ("w_v", ("key",))]:
            report.mistake("key_value_swapped", "forward hooks show w_k applied to the value "
                           "tensor and w_v to the key tensor")
        else:
            parts = [f"{name} was applied to {', '.join(seen) or 'nothing'} (expected the "
                     f"{tensor} tensor)" for name, tensor, seen in wrong]
            report.mistake("projection_inputs_wrong", "forward hooks show " + "; ".join(parts))
        return "inputs"
    ctx = _tensor(recs["w_o"].last[0]) if recs["w_o"].last else None
    ref_ctx = ref_recs["w_o"].last[0][0]
    if ctx is None:
        return None
    if not _close(ctx, ref_ctx):
        return "context"
    if out is not None and not _close(out, ref_out):
        w_o_out = _tensor(recs["w_o"].last[2])
        report.mistake("mha_output_changed", "w_o receives the right merged heads (seen through "
                       "a forward hook), but the module returns something other than w_o's "
                       "output" + (": w_o's output plus the query (a residual inside attention)"
                                   if _close(out, w_o_out + query) else ""))
        return "after"
    return None


# ----------------------------------------------------------------------------------------
# feed-forward


def ffn_probe(report: _Report, module, lin1: nn.Module | None, lin2: nn.Module | None,
              x: torch.Tensor) -> bool:
    """Hooks on linear1 and linear2: the activation, then what follows linear2."""
    if lin1 is None or lin2 is None:
        return False
    with hooked({"l1": lin1, "l2": lin2}) as recs:
        try:
            out = _tensor(module(x.clone()))
        except Exception:  # noqa: BLE001 - the main probes already reported exceptions
            return False
    if not recs["l1"].calls or not recs["l2"].calls or out is None:
        return False
    a_in = recs["l1"].last[0][0]
    h = _tensor(recs["l1"].last[2])
    g = recs["l2"].last[0][0]
    y = _tensor(recs["l2"].last[2])
    if not _close(a_in, x):
        report.mistake("ffn_input_changed", "linear1 does not receive x itself (seen through a "
                       "forward hook)")
        return True
    if h.shape == g.shape and not _close(g, F.relu(h)):
        neg, pos = h < 0, h > 0
        if _close(g, h):
            report.mistake("ffn_no_activation", "linear2 receives linear1's output unchanged "
                           "(negative pre-activations pass through)")
        elif _close(g, F.gelu(h)) or _close(g, F.gelu(h, approximate="tanh")):
            report.mistake("ffn_other_activation", "linear2 receives gelu(linear1(x))")
        elif float(g[neg].abs().max()) < 1e-6:
            report.mistake("ffn_activation_wrong", "negative pre-activations give 0, as ReLU, "
                           "but positive ones are changed: " + _ratio(g[pos], h[pos]))
        else:
            ratio = _ratio(g[neg], h[neg])
            report.mistake("ffn_activation_wrong", "negative pre-activations reach linear2 as "
                           f"{ratio} (ReLU gives 0)"
                           + ("" if _close(g[pos], h[pos]) else "; positive ones are changed "
                              "too"))
        return True
    if y is not None and not _close(out, y):
        if _close(out, y + x):
            report.mistake("ffn_residual_inside", "the module returns linear2's output plus x")
        elif _close(out, F.relu(y)):
            report.mistake("ffn_activation_on_output", "the module returns relu(linear2(...))")
        else:
            report.mistake("ffn_output_changed", "linear2's output is changed before it is "
                           "returned (seen through a forward hook)")
        return True
    return False


def _ratio(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.numel() == 0:
        return "other values"
    r = float((got * want).sum() / (want * want).sum().clamp_min(1e-30))
    if _close(got, r * want):
        return f"{r:.3g} times their value"
    return "values that are not a fixed multiple of them"


def hidden_width_probe(report: _Report, module, d_model: int, d_ff: int) -> bool:
    """The first Linear that reads d_model features: how wide is the hidden layer?"""
    lins = [m for m in module.modules() if isinstance(m, nn.Linear)]
    first = next((m for m in lins if m.in_features == d_model), None)
    if first is None or first.out_features == d_ff:
        return False
    report.mistake("ffn_hidden_width", f"the hidden layer is {first.out_features} wide"
                   + (" (d_model)" if first.out_features == d_model else "")
                   + f", not d_ff = {d_ff}")
    return True


# ----------------------------------------------------------------------------------------
# encoder and decoder layers


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
        ("missing_residual", "sublayer(x) alone: the residual x is not added", lambda: s),
        ("layernorm_missing", "x + sublayer(x) without its LayerNorm", lambda: a + s),
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
    from ..positional import sinusoidal_table
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
