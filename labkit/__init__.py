"""Diagnostic checks for the exercises: each one names the learner's likely mistake.

Call a check from a notebook cell with your own class or function::

    labkit.check_multi_head_attention(MultiHeadAttention)

It prints a short report (one line per probe, then a diagnosis and a hint) and
returns a :class:`CheckResult` with ``.passed``, ``.messages`` and ``.mistakes``
(stable keys from :data:`MISTAKES`). A check never raises because of the
learner's code: exceptions are caught and explained, and a crash of the check's
own code is reported as such (``checker_failed``), never as the learner's mistake.

How mistakes are named: besides comparing with the verified ``tx_helpers``
reference, each check computes the outputs of known wrong variants (no scaling,
softmax over the wrong axis, Pre-LN instead of Post-LN, ...) on the same inputs
and weights, alone and in pairs, and reports the variant the learner's output
matches. Targeted probes (perturbing ``w_o``, changing a future token, a
deterministic stand-in for dropout in train mode) find the rest. Checks run on
the CPU under a forked RNG, so they leave the notebook's random state untouched.

Layout of the package: ``mistakes`` (the catalogue), ``report`` (CheckResult and the
printed report), ``compare`` and ``weights`` (the comparison machinery; weights are
placed by parameter path, one mechanism for every check), then one module per block,
and ``discovery`` (pairing a notebook's names with checks).
"""
from .amp import check_amp_step
from .attention import check_attention
from .beam import check_beam_search, run_beam_search
from .decoding import check_greedy_decode
from .discovery import check_namespace, find_checks
from .distributed import check_token_mean_loss
from .feed_forward import check_feed_forward
from .g2p import check_phone_error_rate
from .g2p_batching import check_g2p_batches
from .g2p_training import check_g2p_training
from .label_smoothing import check_label_smoothing
from .layers import check_decoder_layer, check_encoder_layer
from .leak_map import check_leak_map
from .marks import (
    Mark,
    check_options,
    find_delegation,
    mark_exercise,
    mark_predictions,
    mark_result,
)
from .masks import check_masks
from .mistakes import MISTAKES
from .model import check_transformer
from .multi_head import check_multi_head_attention
from .parameters import check_parameter_counts
from .positional import check_positional_encoding
from .predict import check_prediction, seal_predictions, sealed_score
from .quiz import check_shape_quiz
from .report import CheckResult, clear_history, history
from .silent_bug_fixes import (
    check_init_embeddings,
    check_repaired_weights,
    check_shift_targets,
)
from .stacks import check_decoder
from .training import check_train_step

__all__ = [
    "CheckResult", "MISTAKES", "history", "clear_history",
    "check_positional_encoding", "check_attention", "check_multi_head_attention", "check_masks",
    "check_feed_forward", "check_encoder_layer", "check_decoder_layer", "check_decoder",
    "check_transformer",
    "check_train_step", "check_label_smoothing", "check_greedy_decode", "find_checks",
    "check_namespace", "check_shape_quiz", "check_prediction", "seal_predictions", "sealed_score",
    "check_token_mean_loss", "check_amp_step",
    "Mark", "mark_exercise", "mark_result", "mark_predictions", "find_delegation",
    "check_options",
    "check_phone_error_rate",
    "check_g2p_batches", "check_g2p_training",
    "check_shift_targets", "check_init_embeddings", "check_repaired_weights", "check_leak_map",
    "check_beam_search", "run_beam_search",
    "check_parameter_counts",
]
