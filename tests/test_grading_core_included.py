"""Notebook 11's timed exercise: multi-head attention from memory, the attention core included.

``check_multi_head_attention(cls, core_included=True)`` treats a forward that hands the core to
``tx.scaled_dot_product_attention`` or PyTorch's fused attention (directly, or through a helper)
as delegation; the default (notebook 03, whose ``MultiHeadAttention`` calls an attention
function marked at its own exercise) keeps the core a part. Honest code, written differently
from the reference, earns full marks either way. Each submission is a notebook cell run with
``exec``, marked as the grade script and nbgrader's test cells mark it.
"""
import sys

import pytest

import labkit as g
from labkit.course.nbgrader_export import TEST_CELL
from labkit.marks import check_options

HEAD = """
import math
import torch
import torch.nn.functional as F
from torch import nn
import tx_helpers as tx
class InterviewMultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.h, self.dk = n_heads, d_model // n_heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)
    def heads(self, x):                                  # (N, L, d) -> (N, H, L, d_k)
        n, length, _ = x.shape
        return x.reshape(n, length, self.h, self.dk).permute(0, 2, 1, 3)
    def forward(self, query, key, value, mask=None):
        q, k = self.heads(self.w_q(query)), self.heads(self.w_k(key))
        v = self.heads(self.w_v(value))
        m = None if mask is None else (mask[:, None] if mask.dim() == 3 else mask)
        ctx = CORE
        n, h, length, dk = ctx.shape
        return self.w_o(ctx.permute(0, 2, 1, 3).reshape(n, length, h * dk))
"""
OWN_ATTENTION = """
def attention(q, k, v, mask=None):                       # the learner's own core (03's exercise)
    s = torch.einsum("nhqd,nhkd->nhqk", q, k) * q.size(-1) ** -0.5
    if mask is not None:
        s = s.masked_fill(mask, -1e30)
    return torch.einsum("nhqk,nhkd->nhqd", s.softmax(-1), v)
"""
SUBMISSIONS = {  # route -> (the core line, extra definitions, delegates the core?)
    "tx's attention core": ("tx.scaled_dot_product_attention(q, k, v, m)[0]", "", True),
    "PyTorch's fused attention": (
        "F.scaled_dot_product_attention(q, k, v, attn_mask=None if m is None else ~m)", "", True),
    "a helper bound to tx's core": ("attention(q, k, v, m)",
                                    "core = tx.scaled_dot_product_attention\n"
                                    "def attention(q, k, v, mask=None):\n"
                                    "    return core(q, k, v, mask)[0]\n", True),
    "its own attention function": ("attention(q, k, v, m)", OWN_ATTENTION, False),
    "the core written inline": (
        "self.drop((q @ k.transpose(-2, -1) / math.sqrt(self.dk)).masked_fill("
        "torch.zeros(1, dtype=torch.bool) if m is None else m, -1e30).softmax(-1)) @ v", "", False),
}


def _cell(route: str) -> type:
    core, extra, _ = SUBMISSIONS[route]
    namespace = {"__name__": "__main__"}
    source = HEAD.replace("CORE", core) + extra
    exec(compile(source, f"<cell: {route}>", "exec"), namespace)  # noqa: S102 - the learner's cell
    return namespace["InterviewMultiHeadAttention"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("route", list(SUBMISSIONS))
def test_core_included_marks_the_core_as_delegation(route):
    cls, delegates = _cell(route), SUBMISSIONS[route][2]
    result = g.check_multi_head_attention(cls, verbose=False, core_included=True)
    mark = g.mark_exercise("InterviewMultiHeadAttention", cls, points=2, verbose=False,
                           core_included=True)
    if delegates:
        assert not result.passed and "attention core itself" in result.report
        assert mark.score == 0 and mark.delegated, mark.lines
    else:
        assert result.passed, result.report
        assert mark.delegated is None and mark.score == 2, mark.lines


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("route", list(SUBMISSIONS))
def test_by_default_the_core_is_a_part(route):
    """Notebook 03's rule: its MultiHeadAttention may call an attention function."""
    mark = g.mark_exercise("InterviewMultiHeadAttention", _cell(route), points=2, verbose=False)
    assert mark.delegated is None and mark.score == 2, mark.lines


@pytest.mark.filterwarnings("ignore")
def test_the_graded_routes_pass_the_option_on():
    """grade.py and nbgrader read the option from the notebook's own check call."""
    call = "_ = labkit.check_multi_head_attention(InterviewMultiHeadAttention, core_included=True)"
    options = check_options(call, "InterviewMultiHeadAttention")
    assert options == {"core_included": True}
    cls = _cell("tx's attention core")
    namespace = {"InterviewMultiHeadAttention": cls}
    test = TEST_CELL.format(points=2, s="s", items="InterviewMultiHeadAttention",
                            name="InterviewMultiHeadAttention",
                            options="".join(f", {k}={v!r}" for k, v in options.items()))
    exec(compile(test, "<nbgrader test cell>", "exec"), namespace)  # noqa: S102
    assert namespace["_mark"].score == 0 and namespace["_mark"].delegated


def test_a_nested_watch_reports_to_the_outer_one_and_restores_it():
    import tx_helpers as tx
    from labkit.delegation import watch_references

    def learner_core(q):
        return tx.scaled_dot_product_attention(q, q, q)

    import torch

    before = sys.getprofile()
    with watch_references({"MultiHeadAttention"}) as outer:
        hook = sys.getprofile()
        with watch_references({"scaled_dot_product_attention"}) as inner:
            learner_core(torch.zeros(1, 2, 3))
        assert sys.getprofile() is hook
    assert sys.getprofile() is before
    assert inner.found and outer.found == inner.found


SUBCLASS = """
import torch
from torch import nn
import tx_helpers as tx
class InterviewMultiHeadAttention(tx.MultiHeadAttention):
    pass
"""
BORROWED = """
import torch
from torch import nn
import tx_helpers as tx
class InterviewMultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.inner = tx.MultiHeadAttention(d_model, n_heads, dropout)
        self.w_q, self.w_k = self.inner.w_q, self.inner.w_k
        self.w_v, self.w_o = self.inner.w_v, self.inner.w_o
    def forward(self, query, key, value, mask=None):
        return self.inner(query, key, value, mask)
"""
# the notebook's own call (cell 8): the dropout probe and the (L, L) mask are on
NB11_OPTIONS = {"core_included": True, "lookahead_mask": True, "train_mode": True}


def _exec(source: str) -> type:
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - the learner's cell
    return namespace["InterviewMultiHeadAttention"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("source", [SUBCLASS, BORROWED], ids=["subclass", "wrapper"])
def test_the_check_and_the_mark_agree_on_tx_multi_head_attention(source):
    """A cold reader's `class X(tx.MultiHeadAttention): pass` passed the check but was marked 0."""
    cls = _exec(source)
    result = g.check_multi_head_attention(cls, verbose=False, **NB11_OPTIONS)
    mark = g.mark_exercise("InterviewMultiHeadAttention", cls, points=2, verbose=False,
                           **NB11_OPTIONS)
    assert not result.passed and "attention core itself (not credited" in result.report
    assert mark.score == 0 and mark.delegated, mark.lines


DROPOUT_VARIANTS = {  # where the learner's dropout acts -> the mistake key (None: correct)
    "on the weights, a different name and layout": ("self.drop(w)", None),
    "missing": ("w", "attn_dropout_unused"),
    "on the scores, before the softmax": ("self.drop(s).softmax(-1)",
                                          "attn_dropout_before_softmax"),
}


def _dropout_cell(weights_line: str) -> type:
    core = ("(lambda s: (lambda w: WEIGHTS @ v)(s.softmax(-1)))("
            "(torch.einsum('nhqd,nhkd->nhqk', q, k) * self.dk ** -0.5).masked_fill("
            "torch.zeros(1, dtype=torch.bool) if m is None else m, float('-inf')))")
    if "softmax" in weights_line:  # dropout before the softmax: the lambda's s is the scores
        core = core.replace("(lambda w: WEIGHTS @ v)(s.softmax(-1))", "WEIGHTS @ v")
    return _exec(HEAD.replace("CORE", core.replace("WEIGHTS", weights_line)))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("where", list(DROPOUT_VARIANTS))
def test_the_timed_exercise_checks_dropout(where):
    cls = _dropout_cell(DROPOUT_VARIANTS[where][0])
    key = DROPOUT_VARIANTS[where][1]
    result = g.check_multi_head_attention(cls, verbose=False, **NB11_OPTIONS)
    if key is None:
        assert result.passed, result.report
    else:
        assert not result.passed and key in result.mistakes, result.report
