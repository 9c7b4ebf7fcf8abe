"""check_transformer on notebook 07's generator contract: a bias, and tying by Parameter identity.

A generator written as a custom module (its own ``weight`` and ``bias`` attributes, tied to the
embeddings) is correct code and must pass; a generator without the bias the exercise asks for
must fail with ``generator_no_bias``, tied or not.
"""
import torch
from torch import nn

import labkit as g
import tx_helpers as tx


class Projection(nn.Module):
    """A hand-written linear map d_model -> vocab: weight (vocab, d_model), bias (vocab,)."""

    def __init__(self, d_model, vocab):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, d_model).uniform_(-0.1, 0.1))
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, h):
        return h @ self.weight.T + self.bias  # (N, L, vocab)


class Learner(nn.Module):
    """tx's stacks plus a generator; ``generator`` picks its kind."""

    def __init__(self, config, generator="custom"):
        super().__init__()
        c = self.config = config
        sizes = dict(d_model=c.d_model, n_heads=c.n_heads, d_ff=c.d_ff, n_layers=c.n_layers,
                     dropout=c.dropout, max_len=c.max_len, norm_first=c.norm_first)
        self.encoder = tx.Encoder(c.src_vocab_size, **sizes)
        self.decoder = tx.Decoder(c.tgt_vocab_size, **sizes)
        if generator == "custom":
            self.generator = Projection(c.d_model, c.tgt_vocab_size)
        else:  # "no_bias"
            self.generator = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        if c.share_embeddings:  # the embeddings take the generator's Parameter
            self.encoder.embedding.weight = self.generator.weight
            self.decoder.embedding.weight = self.generator.weight

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        pad = self.config.pad_idx
        if src_mask is None:
            src_mask = (src == pad)[:, None, :]  # (N, 1, L_src)
        if tgt_mask is None:
            ahead = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool).triu(1)
            tgt_mask = ahead | (tgt == pad)[:, None, :]  # (N, L_tgt, L_tgt)
        memory = self.encoder(src, src_mask)  # (N, L_src, d_model)
        return self.generator(self.decoder(tgt, memory, tgt_mask, src_mask))


def test_custom_projection_tied_by_identity_passes():
    for share in (True, False):
        result = g.check_transformer(Learner, share_embeddings=share, default_masks=True,
                                     verbose=False)
        assert result.passed, result.report
    tied = g.check_transformer(Learner, share_embeddings=True, verbose=False)
    assert "(3 uses, 1 distinct)" in tied.report, tied.report


def test_generator_without_bias_fails_by_name():
    for share in (True, False):
        result = g.check_transformer(lambda c: Learner(c, "no_bias"), share_embeddings=share,
                                     default_masks=True, verbose=False)
        assert not result.passed
        assert result.mistakes == ["generator_no_bias"], result.report
        assert "bias" in result.report


def test_two_way_tie_names_the_missing_use():
    def two_way(c):
        model = Learner(c, "custom")
        model.encoder.embedding.weight = nn.Parameter(torch.randn(c.src_vocab_size, c.d_model))
        return model

    result = g.check_transformer(two_way, share_embeddings=True, verbose=False)
    assert result.mistakes == ["embeddings_not_tied"], result.report


def _keep_masks(pad, src, tgt):
    """Default masks built True = keep (SDPA's convention), the inverse of tx's."""
    keep = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool).tril()
    return (src != pad)[:, None, :], (tgt != pad)[:, None, :] & keep


class Variant(Learner):
    """Learner with one of 07's real mistakes: ``how`` names it."""

    def __init__(self, config, how):
        super().__init__(config, "custom")
        self.how = how
        c = config
        if how == "source_vocab":  # the generator sized by the wrong vocabulary
            self.generator = Projection(c.d_model, c.src_vocab_size)
            if c.share_embeddings:
                self.encoder.embedding.weight = self.generator.weight
                self.decoder.embedding.weight = self.generator.weight
        if how == "always_tie":  # two-way tie whatever the flag says
            self.decoder.embedding.weight = self.generator.weight

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        if self.how == "keep_masks" and src_mask is None and tgt_mask is None:
            src_mask, tgt_mask = _keep_masks(self.config.pad_idx, src, tgt)
        return super().forward(src, tgt, src_mask, tgt_mask)


def test_tied_check_runs_the_untied_config_too():
    """Equal vocabularies in the tied config cannot hide a size or a tie that ignores the flag."""
    for how, key in (("source_vocab", "generator_sized_by_source_vocab"),
                     ("always_tie", "tied_although_not_shared"),
                     ("keep_masks", "mask_polarity_inverted")):
        result = g.check_transformer(lambda c, how=how: Variant(c, how), share_embeddings=True,
                                     default_masks=True, verbose=False)
        assert not result.passed and result.mistakes == [key], (how, result.report)
    right = g.check_transformer(Learner, share_embeddings=True, default_masks=True,
                                verbose=False)
    assert right.passed and "[untied run]" in right.report, right.report
