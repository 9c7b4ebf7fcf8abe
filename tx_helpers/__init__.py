"""tx_helpers: the verified building blocks of the Transformer-from-scratch notebooks."""
from . import grading as grading  # diagnostic checks for the exercises
from .attention import MultiHeadAttention, scaled_dot_product_attention
from .config import ModelConfig
from .introspection import ShapeTrace, count_parameters, trace_shapes
from .layers import DecoderLayer, EncoderLayer, FeedForward
from .masks import decoder_self_mask, expand_mask, lookahead_mask, padding_mask
from .model import Decoder, Encoder, Transformer
from .notebook import expect_error, get_device, seed_everything, setup
from .positional import PositionalEncoding, sinusoidal_table

__all__ = [
    "ModelConfig",
    "PositionalEncoding", "sinusoidal_table",
    "scaled_dot_product_attention", "MultiHeadAttention",
    "FeedForward", "EncoderLayer", "DecoderLayer",
    "Encoder", "Decoder", "Transformer",
    "padding_mask", "lookahead_mask", "decoder_self_mask", "expand_mask",
    "count_parameters", "trace_shapes", "ShapeTrace",
    "setup", "get_device", "seed_everything", "expect_error",
]
__version__ = "0.1.0"
