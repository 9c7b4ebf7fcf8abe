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
  negative and positive pre-activations, and what happens after linear2.

Layers, stacks and the whole model: :mod:`.localize_stack`.
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
