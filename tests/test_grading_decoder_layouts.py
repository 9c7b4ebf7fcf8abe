"""check_decoder_layer(cls, both_layouts=True): notebook 06's exercise 1 asks for both layouts,
so one check (and the grade, which runs the lab's recorded check call) covers both.

A cold reader's layer had a right Post-LN branch and a broken Pre-LN one: the Post-LN check
alone gave it 1/1. A Pre-LN branch that normalises the memory was told "attends to x".
"""
from torch import nn

import labkit
import tx_helpers as tx


class MyDecoderLayer(nn.Module):
    """A layer written our own way: one loop over (sublayer, norm, dropout) triples."""

    bug = None

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = tx.MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = tx.MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = tx.FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        def cross(h, norm):
            mem = norm(memory) if self.bug == "norm_memory" and self.norm_first else memory
            return self.cross_attn(h, mem, mem, memory_mask)

        steps = [(lambda h, n: self.self_attn(h, h, h, tgt_mask), self.norm1, self.dropout1),
                 (cross, self.norm2, self.dropout2),
                 (lambda h, n: self.feed_forward(h), self.norm3, self.dropout3)]
        for fn, norm, drop in steps:
            if self.norm_first and self.bug != "ignores_norm_first":
                h = norm(x)
                x = (h if self.bug == "residual_from_norm" else x) + drop(fn(h, norm))
            else:
                x = norm(x + drop(fn(x, norm)))
        return x


def _with(bug):
    return type("MyDecoderLayer", (MyDecoderLayer,), {"bug": bug})


def test_a_correct_layer_passes_both_layouts():
    result = labkit.check_decoder_layer(MyDecoderLayer, both_layouts=True, verbose=False)
    assert result.passed, result.messages
    assert sum(m.startswith("  ✓ Pre-LN: ") for m in result.messages) >= 6


def test_a_broken_pre_ln_branch_fails_and_costs_marks():
    for bug in ("residual_from_norm", "ignores_norm_first", "norm_memory"):
        cls = _with(bug)
        assert labkit.check_decoder_layer(cls, verbose=False).passed  # Post-LN alone: blind
        result = labkit.check_decoder_layer(cls, both_layouts=True, verbose=False)
        assert not result.passed, bug
        mark = labkit.mark_exercise("MyDecoderLayer", cls, both_layouts=True, verbose=False,
                                    methods=["forward"])
        assert mark.score < 1, (bug, mark)


def test_pre_ln_mistakes_are_named():
    ignores = labkit.check_decoder_layer(_with("ignores_norm_first"), both_layouts=True,
                                         verbose=False)
    assert ignores.mistakes == ["post_ln_instead_of_pre_ln"], ignores.messages
    normed = labkit.check_decoder_layer(_with("norm_memory"), both_layouts=True, verbose=False)
    assert normed.mistakes == ["cross_attn_on_norm_memory"], normed.messages
    assert any(m.startswith("Diagnosis: Pre-LN: ") for m in normed.messages)


def test_the_lab_records_the_option_the_grade_uses():
    from labkit.marks import check_options

    assert check_options("labkit.check_decoder_layer(MyDecoderLayer, both_layouts=True)",
                         "MyDecoderLayer") == {"both_layouts": True}
