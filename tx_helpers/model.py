"""Encoder and decoder stacks and the full encoder-decoder Transformer."""
from __future__ import annotations

import math

from torch import nn

from ._checks import (
    check_features,
    check_positive_int,
    check_same_batch,
    check_tokens,
    checked_inputs,
    inputs_checked,
)
from .attention import KVCache
from .config import ModelConfig
from .layers import DecoderLayer, EncoderLayer
from .masks import decoder_self_mask, lookahead_mask, padding_mask
from .positional import PositionalEncoding


class _Stack(nn.Module):
    """What Encoder and Decoder share: token embedding, positional encoding, ``n_layers``
    layers of one kind, and a final LayerNorm ``norm``."""

    layer_cls: type[nn.Module]

    def __init__(self, vocab_size, d_model, n_heads, d_ff, n_layers, dropout=0.1,
                 max_len=512, norm_first=False, backend="manual"):
        super().__init__()
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("n_layers", n_layers)
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.layers = nn.ModuleList(
            [self.layer_cls(d_model, n_heads, d_ff, dropout, norm_first, backend)
             for _ in range(n_layers)]
        )
        self.norm = nn.LayerNorm(d_model)


class Encoder(_Stack):
    """Token ids (N, L_src) -> memory (N, L_src, d_model).

    embedding * sqrt(d_model), positional encoding, ``n_layers`` EncoderLayers,
    then a final LayerNorm ``norm``. Pre-LN needs that final norm, since its
    residual stream is never normalised otherwise. Post-LN does not strictly
    need it (each layer already ends in a LayerNorm), but torch.nn.Transformer
    applies it in both modes; keeping it makes the two map weight for weight.
    """

    layer_cls = EncoderLayer

    def forward(self, src, mask=None):
        if not inputs_checked():
            check_tokens("src", src, self.embedding.num_embeddings)
        x = self.embedding(src) * math.sqrt(self.d_model)  # (N, L_src, d_model)
        x = self.pos_encoding(x)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)  # (N, L_src, d_model)


def _check_decoder_inputs(tgt, memory, embedding: nn.Embedding) -> None:
    check_tokens("tgt", tgt, embedding.num_embeddings)
    check_features("memory", memory, embedding.embedding_dim, embedding.weight.dtype)
    check_same_batch(memory, tgt)


class Decoder(_Stack):
    """Token ids (N, L_tgt) and memory (N, L_src, d_model) -> hidden states (N, L_tgt, d_model).

    The final LayerNorm ``norm`` is kept for the same reason as in :class:`Encoder`.
    """

    layer_cls = DecoderLayer

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, cache: KVCache | None = None):
        """With a :class:`KVCache` ``tgt`` holds only the new tokens: their positions
        continue from ``cache.length`` and each layer keeps its keys and values in
        ``cache.layer(i)``.
        """
        if not inputs_checked():
            _check_decoder_inputs(tgt, memory, self.embedding)
        x = self.embedding(tgt) * math.sqrt(self.d_model)  # (N, L_tgt, d_model)
        x = self.pos_encoding(x, 0 if cache is None else cache.length)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, tgt_mask, memory_mask, None if cache is None else cache.layer(i))
        if cache is not None:
            cache.advance(tgt.size(1))
        return self.norm(x)  # (N, L_tgt, d_model)


class Transformer(nn.Module):
    """The 2017 encoder-decoder Transformer: ``encoder``, ``decoder`` and ``generator``.

    Masks left as None are built from ``config.pad_idx``: a key-padding mask
    (N, 1, L_src) for the source and padding OR look-ahead (N, L_tgt, L_tgt)
    for the target.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        c = config
        common = dict(d_model=c.d_model, n_heads=c.n_heads, d_ff=c.d_ff, n_layers=c.n_layers,
                      dropout=c.dropout, max_len=c.max_len, norm_first=c.norm_first,
                      backend=c.attn_backend)
        self.encoder = Encoder(c.src_vocab_size, **common)
        self.decoder = Decoder(c.tgt_vocab_size, **common)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        self._init_parameters()
        if c.share_embeddings:
            self.encoder.embedding.weight = self.generator.weight
            self.decoder.embedding.weight = self.generator.weight

    def _init_parameters(self):
        """Xavier-uniform for matrices only: LayerNorm gains stay 1, biases stay as built."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src, src_mask=None):
        """src (N, L_src) -> memory (N, L_src, d_model)."""
        if not inputs_checked():
            check_tokens("src", src, self.config.src_vocab_size)
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_idx)  # (N, 1, L_src)
        with checked_inputs():
            return self.encoder(src, src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None, cache=None):
        """tgt (N, L_tgt) and memory -> hidden states (N, L_tgt, d_model).

        ``decode`` cannot see the source tokens, so the memory is unmasked
        unless ``src_mask`` is given. With a :class:`KVCache` ``cache``, a None
        ``tgt_mask`` becomes the look-ahead mask shifted by the cached length.
        """
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a tx.KVCache (start with cache = tx.KVCache()), got "
                            f"{type(cache).__name__}")
        if not inputs_checked():
            _check_decoder_inputs(tgt, memory, self.decoder.embedding)
        if tgt_mask is None:
            if cache is None:
                tgt_mask = decoder_self_mask(tgt, self.config.pad_idx)  # (N, L_tgt, L_tgt)
            elif tgt.size(1) > 1:
                tgt_mask = lookahead_mask(tgt.size(1), tgt.device,
                                          past=cache.length)[None]  # (1, L, past + L)
        with checked_inputs():
            return self.decoder(tgt, memory, tgt_mask, src_mask, cache)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        """src (N, L_src), tgt (N, L_tgt) -> logits (N, L_tgt, tgt_vocab_size)."""
        if not inputs_checked():
            check_tokens("src", src, self.config.src_vocab_size)
            check_tokens("tgt", tgt, self.config.tgt_vocab_size)
            check_same_batch(src, tgt)
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_idx)  # (N, 1, L_src)
        with checked_inputs():
            memory = self.encode(src, src_mask)  # (N, L_src, d_model)
            hidden = self.decode(tgt, memory, src_mask, tgt_mask)  # (N, L_tgt, d_model)
        return self.generator(hidden)  # (N, L_tgt, tgt_vocab_size)
