"""Notebook 03's lab: a hard-coded divisor fails check_attention (a second width), and a mistake
in the learner's ``attention`` is charged at that exercise only, not again at
``MultiHeadAttention`` (which is checked with tx's attention in its place)."""
import math

import torch
from torch import nn

import labkit


def _scores_eight(q, k, v, mask=None, dropout=None):
    s = q @ k.transpose(-2, -1) / 8  # right for d_k = 64 only
    if mask is not None:
        s = s.masked_fill(mask, torch.finfo(s.dtype).min)
    w = torch.softmax(s, dim=-1)
    return w @ v, w


def _mask_after(q, k, v, mask=None, dropout=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    if mask is not None:
        w = w.masked_fill(mask, 0.0)
    if dropout is not None:
        w = dropout(w)
    return w @ v, w


def _layer(attention_fn, drop_context=False):
    """A correct layer, in words unlike the notebook's, calling ``attention`` as 03's does."""
    scope = {"nn": nn, "attention": attention_fn, "DROP_CONTEXT": drop_context}
    exec(  # noqa: S102 - a learner's cell: its globals hold its own attention
        "class MultiHeadAttention(nn.Module):\n"
        "    def __init__(self, d_model, n_heads, dropout=0.1):\n"
        "        super().__init__()\n"
        "        self.h, self.d_k, self.d_model = n_heads, d_model // n_heads, d_model\n"
        "        self.w_q, self.w_k, self.w_v, self.w_o = (\n"
        "            nn.Linear(d_model, d_model) for _ in range(4))\n"
        "        self.dropout = nn.Dropout(dropout)\n"
        "        self.attn_weights = None\n"
        "    def forward(self, query, key, value, mask=None):\n"
        "        n = query.size(0)\n"
        "        q, k, v = (lin(t).reshape(n, -1, self.h, self.d_k).permute(0, 2, 1, 3)\n"
        "                   for lin, t in ((self.w_q, query), (self.w_k, key),\n"
        "                                  (self.w_v, value)))\n"
        "        if mask is not None and mask.dim() == 3:\n"
        "            mask = mask[:, None]\n"
        "        ctx, w = attention(q, k, v, mask, None if DROP_CONTEXT else self.dropout)\n"
        "        if DROP_CONTEXT:\n"
        "            ctx = self.dropout(ctx)\n"
        "        self.attn_weights = w.detach()\n"
        "        return self.w_o(ctx.permute(0, 2, 1, 3).reshape(n, -1, self.d_model))\n", scope)
    return scope["MultiHeadAttention"]


def _mha(cls):
    return labkit.check_multi_head_attention(cls, verbose=False, train_mode=True,
                                             lookahead_mask=True, stored_weights=True)


def test_a_hard_coded_divisor_fails_at_a_second_width():
    result = labkit.check_attention(_scores_eight, full_contract=True, verbose=False)
    assert not result.passed and "scale_other" in result.mistakes
    assert "sqrt(d_k) = 4" in result.report


def test_an_attention_mistake_is_not_charged_again_at_multi_head_attention():
    for wrong in (_scores_eight, _mask_after):
        result = _mha(_layer(wrong))
        assert result.passed, (wrong.__name__, result.report)
        assert "in place of your attention" in result.report


def test_dropout_on_the_heads_context_is_named_by_its_shape():
    result = _mha(_layer(_mask_after, drop_context=True))
    assert not result.passed and result.mistakes == ["attn_dropout_on_output"]
    assert "context" in result.report
