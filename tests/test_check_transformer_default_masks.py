"""check_transformer(..., default_masks=True): forward(src, tgt) with both masks left as None.

Notebook 07's contract (tx.Transformer.forward's): a mask left as None is built from
config.pad_idx. The probe must pass every correct model (tx.Transformer itself, a learner's
model written apart from the reference) and name what a forward that ignores None does wrong.
Without the flag, a model that takes its masks as given (06's MyTransformer) still passes.
"""
import pytest
import torch
from torch import nn

import labkit as g
import tx_helpers as tx


def quiet(check, obj, **kw):
    return check(obj, verbose=False, **kw)


class Assembled(nn.Module):
    """tx.Encoder + tx.Decoder + generator; ``how`` picks what forward does with None masks.

    The masks are built by hand here (not with tx's mask functions), so the correct case is an
    implementation independent of the reference's.
    """

    def __init__(self, config, how="build"):
        super().__init__()
        c = self.config = config
        self.how = how
        sizes = dict(d_model=c.d_model, n_heads=c.n_heads, d_ff=c.d_ff, n_layers=c.n_layers,
                     dropout=c.dropout, max_len=c.max_len, norm_first=c.norm_first)
        self.encoder = tx.Encoder(c.src_vocab_size, **sizes)
        self.decoder = tx.Decoder(c.tgt_vocab_size, **sizes)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        if c.share_embeddings:
            self.encoder.embedding.weight = self.decoder.embedding.weight = self.generator.weight

    def _src_mask(self, src):
        return (src == self.config.pad_idx)[:, None, :]  # (N, 1, L_src)

    def _tgt_mask(self, tgt):
        n = tgt.size(1)
        future = torch.ones(n, n, dtype=torch.bool).triu(1)  # (L_tgt, L_tgt)
        pads = (tgt == self.config.pad_idx)[:, None, :]  # (N, 1, L_tgt)
        if self.how == "tgt_padding_only":
            return pads
        if self.how == "tgt_lookahead_only":
            return future
        return pads | future  # (N, L_tgt, L_tgt)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        memory_mask = src_mask
        if src_mask is None and self.how not in ("ignore", "tgt_only"):
            src_mask = self._src_mask(src)
            if self.how != "encoder_only":
                memory_mask = src_mask
        elif self.how != "encoder_only":
            memory_mask = src_mask
        if tgt_mask is None and self.how not in ("ignore", "src_only"):
            tgt_mask = self._tgt_mask(tgt)
        memory = self.encoder(src, src_mask)  # (N, L_src, d_model)
        return self.generator(self.decoder(tgt, memory, tgt_mask, memory_mask))


class MasksAsGiven(nn.Module):
    """06's MyTransformer: the masks it is given, None included, go straight to the stacks."""

    def __init__(self, config):
        super().__init__()
        c = config
        stack = (c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout, c.max_len)
        self.encoder = tx.Encoder(c.src_vocab_size, *stack)
        self.decoder = tx.Decoder(c.tgt_vocab_size, *stack)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        memory = self.encoder(src, src_mask)
        return self.generator(self.decoder(tgt, memory, tgt_mask, src_mask))


@pytest.mark.parametrize("share", [False, True])
def test_correct_models_pass(share):
    for cls in (tx.Transformer, Assembled):
        result = quiet(g.check_transformer, cls, default_masks=True, share_embeddings=share)
        assert result.passed, result.report
        assert any("masks left as None" in m for m in result.messages), result.report


def test_masks_as_given_passes_without_the_flag_and_is_named_with_it():
    assert quiet(g.check_transformer, MasksAsGiven).passed
    result = quiet(g.check_transformer, MasksAsGiven, default_masks=True)
    assert not result.passed
    assert set(result.mistakes) == {"source_padding_leaks", "decoder_sees_future"}, result.report


@pytest.mark.parametrize("how, keys", [
    ("ignore", {"source_padding_leaks", "decoder_sees_future"}),
    ("tgt_only", {"source_padding_leaks"}),
    ("src_only", {"decoder_sees_future"}),
    ("encoder_only", {"memory_mask_not_passed"}),
    ("tgt_padding_only", {"decoder_mask_no_lookahead"}),
    ("tgt_lookahead_only", {"decoder_mask_no_padding"}),
])
def test_what_forward_does_with_none_is_named(how, keys):
    # every one of these passes the explicit-mask probes: only the new probe fails
    assert quiet(g.check_transformer, lambda c: Assembled(c, how)).passed
    result = quiet(g.check_transformer, lambda c: Assembled(c, how), default_masks=True)
    assert not result.passed and set(result.mistakes) == keys, result.report



class PadOne(Assembled):
    """Builds its default masks with the id 1, whatever config.pad_idx says."""

    def _src_mask(self, src):
        return (src == 1).unsqueeze(1)  # (N, 1, L_src)

    def _tgt_mask(self, tgt):
        n = tgt.size(1)
        return (tgt == 1).unsqueeze(1) | torch.ones(n, n, dtype=torch.bool).triu(1)


class PadFromMaskBuilders(nn.Module):
    """A second correct forward, apart from Assembled: tx's builders, pad id kept as an int."""

    def __init__(self, config):
        super().__init__()
        c = config
        self.pad = c.pad_idx
        stack = (c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout, c.max_len)
        self.encoder = tx.Encoder(c.src_vocab_size, *stack)
        self.decoder = tx.Decoder(c.tgt_vocab_size, *stack)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        src_mask = tx.padding_mask(src, self.pad) if src_mask is None else src_mask
        tgt_mask = tx.decoder_self_mask(tgt, self.pad) if tgt_mask is None else tgt_mask
        return self.generator(self.decoder(tgt, self.encoder(src, src_mask), tgt_mask, src_mask))


def test_pad_id_comes_from_the_config():
    result = quiet(g.check_transformer, PadFromMaskBuilders, default_masks=True)
    assert result.passed, result.report
    assert any("pad_idx=0" in m for m in result.messages), result.report
    assert quiet(g.check_transformer, PadOne).passed  # the explicit-mask probes cannot see it
    result = quiet(g.check_transformer, PadOne, default_masks=True)
    assert not result.passed and set(result.mistakes) == {"pad_idx_ignored"}, result.report
