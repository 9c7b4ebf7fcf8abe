"""Finding the learner's classes and functions by name and pairing them with checks."""
from __future__ import annotations

import functools

from torch import nn

from .amp import check_amp_step
from .attention import check_attention
from .beam import check_beam_search
from .decoding import check_greedy_decode
from .distributed import check_token_mean_loss
from .feed_forward import check_feed_forward
from .g2p import check_phone_error_rate
from .g2p_batching import check_g2p_batches, check_g2p_training
from .label_smoothing import check_label_smoothing
from .layers import check_decoder_layer, check_encoder_layer
from .leak_map import check_leak_map
from .masks import check_masks
from .model import check_transformer
from .multi_head import check_multi_head_attention
from .parameters import check_parameter_counts
from .positional import check_positional_encoding
from .quiz import check_shape_quiz
from .report import CheckResult
from .silent_bugs import (
    check_init_embeddings,
    check_repaired_weights,
    check_shift_targets,
)
from .training import check_train_step

_CLASS_RULES = (  # (substring of the lower-case name without "_", check)
    ("decoderlayer", check_decoder_layer),
    ("encoderlayer", check_encoder_layer),
    ("multihead", check_multi_head_attention),
    ("mha", check_multi_head_attention),
    ("feedforward", check_feed_forward),
    ("ffn", check_feed_forward),
    ("positional", check_positional_encoding),
)
_MASK_RULES = (  # function name substrings -> check_masks keyword
    ("cross", "cross_fn"),
    ("decoder", "decoder_fn"),
    ("tgt", "decoder_fn"),
    ("lookahead", "lookahead_fn"),
    ("causal", "lookahead_fn"),
    ("subsequent", "lookahead_fn"),
    ("padding", "padding_fn"),
    ("pad", "padding_fn"),
)


def find_checks(namespace: dict, module: str | None = "__main__") -> list[tuple[str, object]]:
    """Pair the learner's classes and functions in ``namespace`` with checks, by name.

    Returns ``[(label, run)]`` where ``run(verbose=True)`` runs the check. Only objects
    defined in ``module`` count (``"__main__"`` in a notebook; None: any). Names:
    ``*DecoderLayer``, ``*EncoderLayer`` (``*PreLN*``/``*PreNorm*``/``*NormFirst*`` in the name:
    checked with ``norm_first=True``), ``*MultiHead*``/``*MHA*``, ``*FeedForward*``/
    ``*FFN*``, ``*Positional*`` classes and ``*Transformer`` classes (``*Tied*Transformer``:
    ``share_embeddings=True``); functions named ``*positional*``/``*sinusoid*``,
    ``*attention*``, ``*train_step*``, ``*smooth*`` (label smoothing), ``*greedy*``,
    ``*beam*`` (a beam-search step), ``*bucket*`` (13's length-bucketed batches),
    ``*short_run*`` (13's training call), ``*phone_error*`` (13's PER), ``*token_mean*``
    and ``*amp_step*`` (12's loss and mixed-precision step), ``*shift_target*``,
    ``*init_embedding*`` and
    ``*repair*weights*`` (10's lab), ``*quiz*`` (the shape quiz: a function returning the
    answers) and
    ``*mask*`` (padding, look-ahead, decoder, cross: all mask functions go to one
    :func:`check_masks`).
    """
    found, masks = [], {}
    for name, obj in namespace.items():
        if name.startswith("_") or (module is not None
                                    and getattr(obj, "__module__", None) != module):
            continue
        key = name.lower().replace("_", "")
        if isinstance(obj, type) and issubclass(obj, nn.Module):
            check = next((c for sub, c in _CLASS_RULES if sub in key), None)
            if check is None and key.endswith("transformer"):
                check = (functools.partial(check_transformer, share_embeddings=True)
                         if "tied" in key else check_transformer)
                check.__name__ = "check_transformer"  # a partial has no name of its own
            if check in (check_encoder_layer, check_decoder_layer) and (
                    "preln" in key or "prenorm" in key or "normfirst" in key):
                name_of = check.__name__  # a Pre-LN layer (04's extension) is checked as one
                check = functools.partial(check, norm_first=True)
                check.__name__ = name_of
            if check is not None:
                found.append((f"{check.__name__}({name})", _bind(check, obj)))
        elif callable(obj) and not isinstance(obj, type):
            if "mask" in key:
                kw = next((k for sub, k in _MASK_RULES if sub in key), None)
                if kw is not None and kw not in masks:
                    masks[kw] = obj
            elif "positional" in key or "sinusoid" in key:
                found.append((f"check_positional_encoding({name})",
                              _bind(check_positional_encoding, obj)))
            elif "repair" in key and "weights" in key:
                found.append((f"check_repaired_weights({name})",
                              _bind(check_repaired_weights, obj)))
            elif "leakmap" in key:
                found.append((f"check_leak_map({name})", _bind(check_leak_map, obj)))
            elif "tokenmean" in key:
                found.append((f"check_token_mean_loss({name})",
                              _bind(check_token_mean_loss, obj)))
            elif "ampstep" in key:
                found.append((f"check_amp_step({name})", _bind(check_amp_step, obj)))
            elif "phoneerror" in key:
                found.append((f"check_phone_error_rate({name})",
                              _bind(check_phone_error_rate, obj)))
            elif "attention" in key:
                found.append((f"check_attention({name})", _bind(check_attention, obj)))
            elif "trainstep" in key:
                found.append((f"check_train_step({name})", _bind(check_train_step, obj)))
            elif "smooth" in key:
                found.append((f"check_label_smoothing({name})",
                              _bind(check_label_smoothing, obj)))
            elif "beam" in key:
                found.append((f"check_beam_search({name})", _bind(check_beam_search, obj)))
            elif "greedy" in key:
                found.append((f"check_greedy_decode({name})", _bind(check_greedy_decode, obj)))
            elif "bucket" in key:
                found.append((f"check_g2p_batches({name})", _bind(check_g2p_batches, obj)))
            elif "shortrun" in key:
                found.append((f"check_g2p_training({name})", _bind(check_g2p_training, obj)))
            elif "shifttarget" in key:
                found.append((f"check_shift_targets({name})", _bind(check_shift_targets, obj)))
            elif "initembedding" in key:
                found.append((f"check_init_embeddings({name})",
                              _bind(check_init_embeddings, obj)))
            elif "parametercount" in key:
                found.append((f"check_parameter_counts({name})",
                              _bind(check_parameter_counts, obj)))
            elif "quiz" in key:
                found.append((f"check_shape_quiz({name})", _bind(check_shape_quiz, obj)))
    if masks:
        label = ", ".join(f"{k}={getattr(v, '__name__', k)}" for k, v in masks.items())

        def run_masks(verbose=True, masks=masks):
            return check_masks(**masks, verbose=verbose)

        found.append((f"check_masks({label})", run_masks))
    return found


def _bind(check, obj):
    def run(verbose=True):
        return check(obj, verbose=verbose)
    return run


def check_namespace(namespace: dict, module: str | None = "__main__",
                    verbose: bool = True) -> list[CheckResult]:
    """Run every check :func:`find_checks` pairs with the objects in ``namespace``.

    In a notebook: ``labkit.check_namespace(globals())``.
    """
    return [run(verbose=verbose) for _, run in find_checks(namespace, module)]

