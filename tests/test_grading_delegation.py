"""Marks that cannot be gamed (issue 29, item 5): delegation is caught however it is bound.

Each gamed submission is a notebook cell run with ``exec`` (no source file, as in a kernel that
lost its history, so only identity and the run can catch it) and marked as the grade script and
nbgrader's test cells mark it. Each earns 0 although its check passes. Correct code that uses
allowed parts (``tx.padding_mask`` inside a decoder mask, ``tx.MultiHeadAttention`` inside a
layer, ``model.decode`` inside a decoder) earns full marks.
"""
import pytest

import labkit as g
from labkit.course.nbgrader_export import TEST_CELL

GREEDY_ARGS = "model, src, *, bos_idx, eos_idx, max_len"
GREEDY_CALL = "model, src, bos_idx=bos_idx, eos_idx=eos_idx, max_len=max_len"

# route -> (exercise name, the learner's cell)
GAMED = {
    "the lab kit's own AMP step, bound to the exercise's name": ("amp_step", """
from labkit.amp import _amp_step as amp_step
"""),
    "the lab kit's own loss, bound to the exercise's name": ("token_mean_loss", """
from labkit.distributed import _reference as token_mean_loss
"""),
    "the lab kit's own parameter formula": ("parameter_counts", """
from labkit.parameters import _formula
def parameter_counts(config):
    return _formula(config)
"""),
    "alias import": ("greedy_decode", f"""
from tx_helpers.decoding import greedy_decode as _g
def greedy_decode({GREEDY_ARGS}):
    return _g({GREEDY_CALL})
"""),
    "assignment from a module alias": ("lookahead_mask", """
import tx_helpers.masks as M
lookahead_mask = M.lookahead_mask
"""),
    "module alias": ("padding_mask", """
import tx_helpers.masks as M
def padding_mask(seq, pad_idx):
    return M.padding_mask(seq, pad_idx)
"""),
    "getattr": ("padding_mask", """
import tx_helpers
def padding_mask(seq, pad_idx):
    return getattr(tx_helpers, "padding" + "_mask")(seq, pad_idx)
"""),
    "importlib": ("greedy_decode", f"""
import importlib
def greedy_decode({GREEDY_ARGS}):
    return importlib.import_module("tx_helpers.decoding").greedy_decode({GREEDY_CALL})
"""),
    "functools.partial": ("lookahead_mask", """
import functools
import tx_helpers
lookahead_mask = functools.partial(tx_helpers.lookahead_mask)
"""),
    "lambda wrapper": ("lookahead_mask", """
import tx_helpers as T
lookahead_mask = lambda size, device=None: T.lookahead_mask(size, device)
"""),
    "subclass": ("MultiHeadAttention", """
import tx_helpers as T
class MultiHeadAttention(T.MultiHeadAttention):
    pass
"""),
    "borrowed forward": ("FeedForward", """
from torch import nn
import tx_helpers as T
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
    forward = T.FeedForward.forward
"""),
    "composition": ("MultiHeadAttention", """
from torch import nn
import tx_helpers as T
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.inner = T.MultiHeadAttention(d_model, n_heads, dropout)
        self.w_q, self.w_k = self.inner.w_q, self.inner.w_k
        self.w_v, self.w_o = self.inner.w_v, self.inner.w_o
    def forward(self, query, key, value, mask=None):
        return self.inner(query, key, value, mask)
"""),
    "sys.modules": ("train_step", """
import sys
def train_step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    return sys.modules["tx_helpers"].train_step(model, batch, optimizer, criterion,
                                                 scheduler, clip_norm)
"""),
    "a copy of the code object": ("padding_mask", """
import types
import tx_helpers
padding_mask = types.FunctionType(tx_helpers.padding_mask.__code__,
                                  vars(tx_helpers.masks), "padding_mask")
"""),
    "the reference's source compiled again": ("padding_mask", """
import inspect
import tx_helpers.masks as M
namespace = dict(vars(M))
exec(inspect.getsource(M.padding_mask), namespace)
padding_mask = namespace["padding_mask"]
"""),
    "a wrapper around a copy of the source": ("greedy_decode", f"""
import inspect
import tx_helpers.decoding as D
namespace = dict(vars(D))
source = inspect.getsource(D.greedy_decode)
exec(source[source.index("def "):], namespace)  # without its decorator
def greedy_decode({GREEDY_ARGS}):
    return namespace["greedy_decode"]({GREEDY_CALL})
"""),
    "a method's source dedented and compiled again": ("DecoderLayer", """
import inspect
import textwrap
from torch import nn
import tx_helpers as T
namespace = dict(vars(inspect.getmodule(T.DecoderLayer)))
exec(textwrap.dedent(inspect.getsource(T.DecoderLayer.forward)), namespace)
class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        own = T.DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first=norm_first)
        for name, child in own.named_children():
            setattr(self, name, child)
        self.norm_first = norm_first
    forward = namespace["forward"]
"""),
    "eval": ("decoder_self_mask", """
def decoder_self_mask(tgt, pad_idx):
    return eval("__import__('tx_helpers').decoder_self_mask")(tgt, pad_idx)
"""),
    "own name bound to the reference": ("my_greedy", f"""
import tx_helpers as T
greedy_decode = T.greedy_decode
def my_greedy({GREEDY_ARGS}):
    return greedy_decode({GREEDY_CALL})
"""),
    "callable instance": ("greedy_decode", f"""
from tx_helpers import decoding as D
class _Decoder:
    def __call__(self, {GREEDY_ARGS}):
        return D.greedy_decode({GREEDY_CALL})
greedy_decode = _Decoder()
"""),
    "PyTorch's fused attention": ("attention", """
import torch.nn.functional as F
def attention(q, k, v, mask=None):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else ~mask)
    return out, None
"""),
    "beam search of width one": ("greedy_decode", f"""
import tx_helpers as T
def greedy_decode({GREEDY_ARGS}):
    return T.beam_search({GREEDY_CALL}, beam_size=1).tokens[:, 0]
"""),
    "a renamed copy of the source": ("padding_mask", """
import inspect
import tx_helpers.masks as M
namespace = dict(vars(M))
exec(inspect.getsource(M.padding_mask).replace("def padding_mask", "def _pm"), namespace)
def padding_mask(seq, pad_idx):
    return namespace["_pm"](seq, pad_idx)
"""),
    "the lab kit's own reference": ("greedy_decode", f"""
import labkit.decoding as K
def greedy_decode({GREEDY_ARGS}):
    mode = model.training
    model.eval()
    out = K._greedy_variant(model, src)
    model.train(mode)
    return out
"""),
    "the lab kit's private float64 table": ("positional_table", """
import torch
from labkit import positional_probes as pp
def positional_table(max_len, d_model, dtype=torch.float32):
    return pp._table_float64(max_len, d_model).to(dtype)
"""),
    "a thread": ("padding_mask", """
import threading
import tx_helpers
def padding_mask(seq, pad_idx):
    out = []
    worker = threading.Thread(target=lambda: out.append(tx_helpers.padding_mask(seq, pad_idx)))
    worker.start()
    worker.join()
    return out[0]
"""),
    "the watch switched off": ("lookahead_mask", """
import sys
import tx_helpers
def lookahead_mask(size, device=None):
    sys.setprofile(None)
    return tx_helpers.lookahead_mask(size, device=device)
"""),
    "PyTorch's smoothing through getattr": ("smoothed_loss", """
import torch
def smoothed_loss(logits, target, eps, pad_idx):
    loss = getattr(torch.nn.functional, "cross_" + "entropy")
    return loss(logits, target, **{"label_smoothing": eps, "ignore_index": pad_idx})
"""),
}

CORRECT = {
    "decoder mask on tx.padding_mask": ("decoder_self_mask", """
import torch
import tx_helpers as tx
def decoder_self_mask(tgt, pad_idx):
    size = tgt.size(1)
    future = torch.ones(size, size, dtype=torch.bool, device=tgt.device).triu(1)  # (L, L)
    return tx.padding_mask(tgt, pad_idx) | future  # (N, L, L)
"""),
    "greedy decoder on model.decode and tx.padding_mask": ("greedy_decode", f"""
import torch
import tx_helpers as tx
def greedy_decode({GREEDY_ARGS}):
    was_training = model.training
    model.eval()
    pad = model.config.pad_idx
    src_mask = tx.padding_mask(src, pad)  # (N, 1, L_src)
    memory = model.encode(src, src_mask)  # (N, L_src, d_model)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)  # (N, 1)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    with torch.no_grad():
        for _ in range(max_len):
            logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])  # (N, V)
            logits[:, [pad, bos_idx]] = float("-inf")
            nxt = logits.argmax(-1).masked_fill(done, pad)  # (N,)
            ys = torch.cat([ys, nxt[:, None]], 1)
            done = done | (nxt == eos_idx)
            if done.all():
                break
    model.train(was_training)
    return ys
"""),
    "layer holding tx.MultiHeadAttention": ("EncoderLayer", """
from torch import nn
import tx_helpers as tx
class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = tx.MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = tx.FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)
    def forward(self, x, mask=None):
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.dropout2(self.feed_forward(x)))
"""),
    "multi-head attention on PyTorch's fused attention": ("MultiHeadAttention", """
import torch.nn.functional as F
from torch import nn
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.p = dropout
    def forward(self, query, key, value, mask=None):
        n = query.size(0)
        q, k, v = (w(x).view(n, -1, self.h, self.d_k).transpose(1, 2)
                   for w, x in ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
        keep = None if mask is None else ~mask.unsqueeze(1)  # (N, 1, L_q or 1, L_k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep,
                                             dropout_p=self.p if self.training else 0.0)
        return self.w_o(out.transpose(1, 2).reshape(n, -1, self.h * self.d_k))
"""),
    "own helper named like the reference": ("positional_table", """
import math
import torch
def sinusoidal_table(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
    freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table
def positional_table(max_len, d_model):
    return sinusoidal_table(max_len, d_model)
"""),
    "smoothing built on plain cross-entropy": ("smoothed_loss", """
import torch
import torch.nn.functional as F
def smoothed_loss(logits, target, eps, pad_idx):
    logp = torch.log_softmax(logits, dim=-1)  # (M, V)
    nll = F.cross_entropy(logits, target, reduction="none", label_smoothing=0.0)  # (M,)
    keep = target != pad_idx
    return ((1 - eps) * nll - eps * logp.mean(-1))[keep].mean()
"""),
}


def _cell(source: str, route: str) -> dict:
    namespace = {"__name__": "__main__"}
    exec(compile(source, f"<cell: {route}>", "exec"), namespace)  # noqa: S102 - the learner's cell
    return namespace


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("route", list(GAMED))
def test_gamed_submission_earns_nothing(route):
    name, source = GAMED[route]
    namespace = _cell(source, route)
    mark = g.mark_exercise(name, namespace[name], points=2, verbose=False)
    # the check alone would give full marks (the smoothing check now refuses PyTorch's own)
    assert (mark.result.passed  # the check alone passes, or names the route itself
            or mark.result.mistakes in (["ls_builtin_smoothing"], ["delegated"])), \
        mark.result.report
    assert mark.score == 0 and not mark.passed and mark.delegated, (route, mark.lines)
    assert any("Not credited" in line for line in mark.lines)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("route", list(CORRECT))
def test_correct_code_with_allowed_parts_earns_full_marks(route):
    name, source = CORRECT[route]
    namespace = _cell(source, route)
    mark = g.mark_exercise(name, namespace[name], points=2, verbose=False)
    assert mark.delegated is None and mark.score == 2, mark.lines


@pytest.mark.filterwarnings("ignore")
def test_nbgrader_test_cell_catches_an_aliased_import():
    """nbgrader's route: the export's own test cell, run after the learner's cell."""
    namespace = _cell("import tx_helpers as T\n"
                      "def padding_mask(seq, pad_idx):\n    return T.padding_mask(seq, pad_idx)\n",
                      "nbgrader")
    test = TEST_CELL.format(points=2, s="s", items="padding_mask", name="padding_mask",
                            options="")
    exec(compile(test, "<nbgrader test cell>", "exec"), namespace)  # noqa: S102
    mark = namespace["_mark"]
    assert mark.score == 0 and "tx_helpers' padding_mask" in mark.delegated


def test_the_watch_leaves_no_profiler_behind():
    import sys

    from labkit.delegation import watch_references

    before = sys.getprofile()
    with watch_references({"padding_mask"}) as watch:
        assert sys.getprofile() is not before
    assert sys.getprofile() is before and watch.found == []


GIVEN_INIT = """
import torch
from torch import nn
import tx_helpers as tx
class MyPositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=512, dropout=0.1):  # the lab's given code
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", tx.sinusoidal_table(max_len, d_model))
    def forward(self, x):
        {forward}
"""


@pytest.mark.filterwarnings("ignore")
def test_a_given_method_that_calls_tx_is_not_the_learners_delegation():
    """02's exercise is forward; the given __init__ builds the table with tx (it earned 0)."""
    own = _cell(GIVEN_INIT.format(forward="return self.dropout(x + self.pe[: x.size(1)])"),
                "given __init__")["MyPositionalEncoding"]
    mark = g.mark_exercise("MyPositionalEncoding", own, verbose=False, methods=["forward"])
    assert mark.delegated is None and mark.score == 1, mark.lines
    # without the scope the given __init__ is read as the learner's: the old false 0
    assert g.mark_exercise("MyPositionalEncoding", own, verbose=False).score == 0
    gamed = _cell(GIVEN_INIT.format(forward="return tx.PositionalEncoding.forward(self, x)"),
                  "forward delegates")["MyPositionalEncoding"]
    mark = g.mark_exercise("MyPositionalEncoding", gamed, verbose=False, methods=["forward"])
    assert mark.score == 0 and "forward" in mark.delegated, mark.lines


# PyTorch's own whole-exercise routes: the check may fail on them too, the mark is 0 either way
TORCH_GAMED = {
    "an ATen attention operator": ("attention", """
import torch
def attention(q, k, v, mask=None):
    out, weights = torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, attn_mask=None if mask is None else ~mask)
    return out, weights
"""),
    "PyTorch's multi-head attention function": ("MultiHeadAttention", """
import torch
import torch.nn.functional as F
from torch import nn
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.h, self.p = n_heads, dropout
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
    def forward(self, query, key, value, mask=None):
        n, l_q, l_k = query.size(0), query.size(1), key.size(1)
        blocked = None if mask is None else mask.expand(n, l_q, l_k).repeat_interleave(self.h, 0)
        out, _ = F.multi_head_attention_forward(
            query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1),
            self.w_q.in_features, self.h, None,
            torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias]), None, None, False, self.p,
            self.w_o.weight, self.w_o.bias, training=self.training, attn_mask=blocked,
            use_separate_proj_weight=True, q_proj_weight=self.w_q.weight,
            k_proj_weight=self.w_k.weight, v_proj_weight=self.w_v.weight, need_weights=False)
        return out.transpose(0, 1)  # (N, L_q, d_model)
"""),
    "PyTorch's ATen cross-entropy with its smoothing": ("smoothed_loss", """
import torch
def smoothed_loss(logits, target, eps, pad_idx):
    return torch.ops.aten.cross_entropy_loss(logits, target, None, 1, pad_idx, eps)
"""),
    "PyTorch's multi-head attention as the attention core": ("attention", """
import torch
import torch.nn.functional as F
def attention(q, k, v, mask=None):
    n, h, l_q, d = q.shape
    l_k = k.size(2)
    q2, k2 = (t.reshape(n * h, -1, d).transpose(0, 1) for t in (q, k))  # (L, N*H, d_k)
    eye = torch.eye(d)
    blocked = None if mask is None else mask.expand(n, h, l_q, l_k).reshape(n * h, l_q, l_k)
    _, weights = F.multi_head_attention_forward(
        q2, k2, k2, d, 1, None, None, None, None, False, 0.0, eye, None, training=False,
        attn_mask=blocked, use_separate_proj_weight=True, q_proj_weight=eye,
        k_proj_weight=eye, v_proj_weight=eye, need_weights=True, average_attn_weights=False)
    weights = weights.reshape(n, h, l_q, l_k)  # PyTorch's softmax(q k^T / sqrt(d_k))
    return weights @ v, weights
"""),
    "PyTorch's causal bias as the look-ahead mask": ("lookahead_mask", """
import torch
from torch.nn.attention.bias import causal_lower_right
def lookahead_mask(size, device=None, *, past=0):
    return ~causal_lower_right(size, past + size)._materialize(device)
"""),
    "PyTorch's cross-entropy entry with its smoothing": ("smoothed_loss", """
import torch
def smoothed_loss(logits, target, eps, pad_idx):
    return torch._C._nn.cross_entropy_loss(logits, target, None, 1, pad_idx, eps)
"""),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("route", list(TORCH_GAMED))
def test_pytorchs_own_version_of_the_exercise_earns_nothing(route):
    name, source = TORCH_GAMED[route]
    mark = g.mark_exercise(name, _cell(source, route)[name], points=2, verbose=False)
    assert mark.score == 0 and "PyTorch's" in (mark.delegated or ""), (route, mark.lines)


@pytest.mark.parametrize("names, layer, args", [
    ({"EncoderLayer"}, "TransformerEncoderLayer", 1),
    ({"DecoderLayer"}, "TransformerDecoderLayer", 2)])
def test_pytorchs_transformer_layer_inside_a_forward_is_delegation(names, layer, args):
    import torch

    from labkit.delegation import watch_references

    def forward(x):  # the learner's forward, building PyTorch's layer on the spot
        return getattr(torch.nn, layer)(16, 2, 32, 0.0, batch_first=True)(*[x] * args)

    with watch_references(names) as watch:
        forward(torch.randn(2, 3, 16))
    assert watch.found == [f"it calls PyTorch's {layer}.forward, the whole of this exercise "
                           "in one call"]
    with watch_references({"FeedForward"}) as other:  # another exercise: a part, not watched
        forward(torch.randn(2, 3, 16))
    assert other.found == []


@pytest.mark.filterwarnings("ignore")
def test_a_check_run_in_the_notebook_says_what_the_grade_will_say():
    """Called directly, a check fails delegation as the grade does; the reference itself shown
    to the check passes with a note; a given __init__ that uses tx is not the learner's."""
    import tx_helpers as tx

    wrapper = _cell(GAMED["module alias"][1], "in-notebook")["padding_mask"]
    assert g.check_masks(padding_fn=wrapper, verbose=False).mistakes == ["delegated"]
    part = _cell(CORRECT["decoder mask on tx.padding_mask"][1], "in-notebook")
    assert g.check_masks(decoder_fn=part["decoder_self_mask"], verbose=False).passed  # a part
    attention = _cell("import tx_helpers.attention as A\n"
                      "def attention(q, k, v, mask=None, dropout=None):\n"
                      "    return A.scaled_dot_product_attention(q, k, v, mask, dropout)\n",
                      "in-notebook")["attention"]
    result = g.check_attention(attention, verbose=False)
    assert not result.passed and result.mistakes == ["delegated"], result.report
    assert "your attention calls tx_helpers' scaled_dot_product_attention" in " ".join(
        result.messages)
    shown = g.check_attention(tx.scaled_dot_product_attention, verbose=False)
    assert shown.passed and "tx_helpers' own scaled_dot_product_attention" in shown.report
    own = _cell(GIVEN_INIT.format(forward="return self.dropout(x + self.pe[: x.size(1)])"),
                "given __init__")["MyPositionalEncoding"]
    assert g.check_positional_encoding(own, verbose=False).passed
    gamed = _cell(GIVEN_INIT.format(forward="return tx.PositionalEncoding.forward(self, x)"),
                  "forward delegates")["MyPositionalEncoding"]
    assert "delegated" in g.check_positional_encoding(gamed, verbose=False).mistakes


LOOKAHEAD_FROM_PYTORCH = """
import torch
from torch import nn
def lookahead_mask(size, device=None, *, past=0):
    scores = nn.Transformer.generate_square_subsequent_mask(past + size, device=device)
    return torch.isinf(scores)[past:]  # (size, past + size): True above the diagonal
"""


@pytest.mark.filterwarnings("ignore")
def test_pytorchs_square_subsequent_mask_is_not_the_learners_lookahead_mask():
    fn = _cell(LOOKAHEAD_FROM_PYTORCH, "generate_square_subsequent_mask")["lookahead_mask"]
    in_notebook = g.check_masks(lookahead_fn=fn, verbose=False)
    assert in_notebook.passed and "generate_square_subsequent_mask" in in_notebook.report
    mark = g.mark_exercise("lookahead_mask", fn, points=1, verbose=False)
    assert mark.score == 0 and "generate_square_subsequent_mask" in mark.delegated


@pytest.mark.filterwarnings("ignore")
def test_pytorchs_smoothing_under_a_new_name_fails_the_check_itself():
    """A renamed F.cross_entropy escapes the check's patch of F; the watch names it."""
    fn = _cell("from torch.nn.functional import cross_entropy as ce\n"
               "def smoothed_loss(logits, target, eps, pad_idx):\n"
               "    return ce(logits, target, label_smoothing=eps, ignore_index=pad_idx)\n",
               "renamed")["smoothed_loss"]
    result = g.check_label_smoothing(fn, verbose=False)
    assert not result.passed and result.mistakes == ["ls_builtin_smoothing"], result.report
