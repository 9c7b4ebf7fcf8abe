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
from .g2p_batching import check_g2p_batches
from .g2p_training import check_g2p_training
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
from .silent_bug_fixes import (
    check_init_embeddings,
    check_repaired_weights,
    check_shift_targets,
)
from .stacks import check_decoder
from .training import check_train_step

_CLASS_RULES = (  # (substring of the lower-case name without "_", check)
    ("decoderlayer", check_decoder_layer),
    ("encoderlayer", check_encoder_layer),
    ("decoder", check_decoder),  # a decoder stack (06's MyDecoder): after "decoderlayer"
    ("multihead", check_multi_head_attention),
    ("mha", check_multi_head_attention),
    ("feedforward", check_feed_forward),
    ("ffn", check_feed_forward),
    ("positional", check_positional_encoding),
)
_FUNCTION_RULES = (  # (substrings of the lower-case name without "_", "a+b": both; check),
    # the first rule that matches wins
    (("positional", "sinusoid"), check_positional_encoding),
    (("repair+weights",), check_repaired_weights),
    (("leakmap",), check_leak_map),
    (("tokenmean",), check_token_mean_loss),
    (("ampstep",), check_amp_step),
    (("phoneerror",), check_phone_error_rate),
    (("attention",), check_attention),
    (("trainstep",), check_train_step),
    (("smooth",), check_label_smoothing),
    (("beam",), check_beam_search),
    (("greedy",), check_greedy_decode),
    (("bucket",), check_g2p_batches),
    (("shortrun",), check_g2p_training),
    (("shifttarget",), check_shift_targets),
    (("initembedding",), check_init_embeddings),
    (("parametercount",), check_parameter_counts),
    (("quiz",), check_shape_quiz),
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
    ``share_embeddings=True``), other ``*Decoder*`` classes (the decoder stack); functions
    named ``*positional*``/``*sinusoid*``,
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
            else:
                check = next((c for subs, c in _FUNCTION_RULES
                              if any(all(part in key for part in sub.split("+"))
                                     for sub in subs)), None)
                if check is not None:
                    found.append((f"{check.__name__}({name})", _bind(check, obj)))
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

