"""tx_helpers: the verified building blocks of the Transformer-from-scratch notebooks."""
from . import g2p as g2p  # English pronunciation from the CMU dictionary (notebook 13)
from . import interop as interop  # tx weights into the matching torch.nn modules
from .attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from .config import ModelConfig
from .data import (
    DATE_VOCAB,
    CharVocab,
    DatePairs,
    date_model_config,
    exact_match,
    exact_match_accuracy,
    make_batch,
    translate,
)
from .decoding import BeamOutput, beam_search, greedy_decode
from .introspection import ShapeTrace, count_parameters, trace_shapes
from .layers import DecoderLayer, EncoderLayer, FeedForward
from .masks import decoder_self_mask, expand_mask, lookahead_mask, padding_mask
from .model import Decoder, Encoder, Transformer
from .notebook import expect_error, get_device, seed_everything, setup
from .positional import PositionalEncoding, sinusoidal_table
from .pretrained import load_dates_model
from .training import (
    History,
    load_checkpoint,
    noam_lr,
    noam_scheduler,
    paper_adam,
    save_checkpoint,
    train,
    train_step,
)

__all__ = [
    "ModelConfig",
    "PositionalEncoding", "sinusoidal_table",
    "scaled_dot_product_attention", "MultiHeadAttention", "KVCache",
    "FeedForward", "EncoderLayer", "DecoderLayer",
    "Encoder", "Decoder", "Transformer",
    "padding_mask", "lookahead_mask", "decoder_self_mask", "expand_mask",
    "count_parameters", "trace_shapes", "ShapeTrace",
    "setup", "get_device", "seed_everything", "expect_error",
    "CharVocab", "DATE_VOCAB", "DatePairs", "make_batch", "date_model_config",
    "noam_lr", "noam_scheduler", "paper_adam", "train", "train_step", "History",
    "save_checkpoint", "load_checkpoint",
    "greedy_decode", "translate", "exact_match", "exact_match_accuracy", "load_dates_model",
    "beam_search", "BeamOutput",
]
__version__ = "0.1.0"
