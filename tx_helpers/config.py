"""Model configuration, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass

from ._checks import check_divisible, check_dropout, check_positive_int

BACKENDS = ("manual", "sdpa")  # attention implementations: see tx_helpers.attention


@dataclass
class ModelConfig:
    """Hyper-parameters of the Transformer. Defaults are the article's small CPU model."""

    src_vocab_size: int = 128
    tgt_vocab_size: int = 128
    d_model: int = 128
    n_heads: int = 8
    d_ff: int = 512
    n_layers: int = 2
    dropout: float = 0.1
    max_len: int = 512
    pad_idx: int = 1
    norm_first: bool = False  # False: Post-LN as in the paper; True: Pre-LN
    share_embeddings: bool = False  # one Parameter for both embeddings and the generator
    attn_backend: str = "manual"  # "manual" (teachable, keeps weights) or "sdpa" (fused)

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
                     "n_layers", "max_len"):
            check_positive_int(name, getattr(self, name))
        check_divisible(self.d_model, self.n_heads)
        check_dropout("dropout", self.dropout)
        if isinstance(self.pad_idx, bool) or not isinstance(self.pad_idx, int):
            raise TypeError(f"pad_idx must be an int, got {type(self.pad_idx).__name__}")
        for name in ("src_vocab_size", "tgt_vocab_size"):
            size = getattr(self, name)
            if not 0 <= self.pad_idx < size:
                raise ValueError(
                    f"pad_idx={self.pad_idx} is outside the vocabulary: expected "
                    f"0 <= pad_idx < {name}={size}"
                )
        for name in ("norm_first", "share_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings=True needs one shared vocabulary, got "
                f"src_vocab_size={self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )
        if self.attn_backend not in BACKENDS:
            raise ValueError(f"attn_backend must be one of {BACKENDS}, got {self.attn_backend!r}")

    @property
    def d_k(self) -> int:
        """Features per head."""
        return self.d_model // self.n_heads

    @classmethod
    def paper_base(cls, **overrides) -> "ModelConfig":
        """Transformer base (Vaswani et al. 2017, Table 3): 37000 shared BPE tokens, tied."""
        kw = dict(src_vocab_size=37000, tgt_vocab_size=37000, d_model=512, n_heads=8,
                  d_ff=2048, n_layers=6, dropout=0.1, max_len=512, pad_idx=0,
                  share_embeddings=True)
        return cls(**{**kw, **overrides})

    @classmethod
    def paper_big(cls, **overrides) -> "ModelConfig":
        """Transformer big (Table 3): d_model 1024, 16 heads, d_ff 4096, dropout 0.3."""
        kw = dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
        return cls.paper_base(**{**kw, **overrides})
