"""labkit.check_decoder (06's MyDecoder): passes stacks written differently, names the usual
stack mistakes, grades the stack alone (its layers are replaced by the reference's)."""
import math

import pytest
from torch import nn

import labkit
import tx_helpers as tx


class Good(nn.Module):
    def __init__(self, vocab_size, d_model, n_heads, d_ff, n_layers, dropout=0.1, max_len=512):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = tx.PositionalEncoding(d_model, max_len, dropout)
        self.layers = nn.ModuleList([tx.DecoderLayer(d_model, n_heads, d_ff, dropout)
                                     for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model)

    def stream(self, tgt, scale=True, pe=True):
        x = self.embedding(tgt) * (math.sqrt(self.d_model) if scale else 1.0)
        return self.pos_encoding(x) if pe else x

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        x = self.stream(tgt)
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)
        return self.norm(x)


class Other(Good):
    """Written differently: keywords, indexing, another spelling of the scale."""

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        h = self.pos_encoding(self.embedding(tgt).mul(self.d_model ** 0.5))
        for i in range(len(self.layers)):
            h = self.layers[i](h, memory=memory, tgt_mask=tgt_mask, memory_mask=memory_mask)
        return self.norm(h)


def _variant(scale=True, pe=True, norm=True, tm=True, mm=True):
    class Bad(Good):
        def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
            x = self.stream(tgt, scale, pe)
            for layer in self.layers:
                x = layer(x, memory, tgt_mask if tm else None, memory_mask if mm else None)
            return self.norm(x) if norm else x
    return Bad


class BrokenLayer(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.inner = tx.DecoderLayer(*args)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return 2 * self.inner(x, memory, tgt_mask, memory_mask)


class GoodStackBrokenLayer(Good):
    def __init__(self, vocab_size, d_model, n_heads, d_ff, n_layers, dropout=0.1, max_len=512):
        super().__init__(vocab_size, d_model, n_heads, d_ff, n_layers, dropout, max_len)
        self.layers = nn.ModuleList([BrokenLayer(d_model, n_heads, d_ff, dropout)
                                     for _ in range(n_layers)])


@pytest.mark.parametrize("cls", [Good, Other, GoodStackBrokenLayer])
def test_correct_stacks_pass(cls):
    result = labkit.check_decoder(cls, verbose=False)
    assert result.passed, result.report


@pytest.mark.parametrize("kw, key", [
    ({"scale": False}, "embeddings_not_scaled"),
    ({"pe": False}, "pe_not_added"),
    ({"norm": False}, "no_final_norm"),
    ({"mm": False}, "memory_mask_not_passed"),
    ({"tm": False}, "tgt_mask_not_passed"),
])
def test_stack_mistakes_are_named(kw, key):
    result = labkit.check_decoder(_variant(**kw), verbose=False)
    assert not result.passed and key in result.mistakes, result.report


ARTICLE = tx.ModelConfig()  # the notebook's global config, d_model 128


class ScaleFromGlobalConfig(Good):
    """06's stub stores no d_model: the scale taken from the notebook's cfg instead."""

    def stream(self, tgt, scale=True, pe=True):
        return self.pos_encoding(self.embedding(tgt) * math.sqrt(ARTICLE.d_model))


class ScaleFromEmbedding(Good):
    """Correct: the width read off the embedding."""

    def stream(self, tgt, scale=True, pe=True):
        return self.pos_encoding(self.embedding(tgt) * math.sqrt(self.embedding.embedding_dim))


def test_hard_coded_scale_is_named_and_the_embedding_width_passes():
    result = labkit.check_decoder(ScaleFromGlobalConfig, verbose=False)
    assert not result.passed and result.mistakes == ["embedding_scale_hard_coded"], result.report
    assert labkit.check_decoder(ScaleFromEmbedding, verbose=False).passed


def test_discovery_pairs_a_decoder_stack_and_keeps_the_layer_rule():
    found = [label for label, _ in labkit.find_checks(
        {"MyDecoder": Good, "MyDecoderLayer": BrokenLayer}, module=None)]
    assert found == ["check_decoder(MyDecoder)", "check_decoder_layer(MyDecoderLayer)"]


class PENoDropout(Good):
    """The table added by hand: the positional encoding's dropout never runs."""

    def stream(self, tgt, scale=True, pe=True):
        x = self.embedding(tgt) * math.sqrt(self.d_model)  # (N, L, d_model)
        return x + tx.sinusoidal_table(x.size(1), self.d_model)


class PEDropoutTwice(Good):
    def stream(self, tgt, scale=True, pe=True):
        return self.pos_encoding.dropout(super().stream(tgt))


class OwnPEFunctionalDropout(Good):
    """Correct, written differently: its own positions with F.dropout (random in train mode)."""

    def stream(self, tgt, scale=True, pe=True):
        x = self.embedding(tgt) * math.sqrt(self.d_model)
        x = x + tx.sinusoidal_table(x.size(1), self.d_model)
        return nn.functional.dropout(x, self.pos_encoding.dropout.p, self.training)


@pytest.mark.parametrize("cls, key", [(PENoDropout, "pe_dropout_unused"),
                                      (PEDropoutTwice, "pe_dropout_misplaced")])
def test_train_mode_dropout_mistakes_are_named(cls, key):
    result = labkit.check_decoder(cls, verbose=False)
    assert not result.passed and key in result.mistakes, result.report


def test_functional_dropout_stack_passes_with_a_note():
    result = labkit.check_decoder(OwnPEFunctionalDropout, verbose=False)
    assert result.passed, result.report
