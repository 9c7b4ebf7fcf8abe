"""Check: the whole Transformer."""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math

import torch

from tx_helpers.config import ModelConfig
from tx_helpers.masks import decoder_self_mask, lookahead_mask, padding_mask
from tx_helpers.model import Transformer

from .compare import (
    _as_output,
    _close,
    _compare,
    _deterministic,
    _instantiate,
    _randomize_norms,
)
from .localize_stack import causality_probe, model_probe
from .report import CheckResult, _call, _Failed, _Report, _run_check
from .weights import copy_reference


def _transformer_variant(ref: Transformer, src, tgt, src_mask, tgt_mask, emb=None,
                         final_norm=None, output=None, memory_mask=True):
    d = ref.config.d_model
    enc, dec = ref.encoder, ref.decoder
    x = enc.embedding(src) * (1.0 if emb in ("both", "src") else math.sqrt(d))
    x = enc.pos_encoding(x)
    for layer in enc.layers:
        x = layer(x, src_mask)
    memory = x if final_norm in ("both", "enc") else enc.norm(x)
    y = dec.embedding(tgt) * (1.0 if emb in ("both", "tgt") else math.sqrt(d))
    y = dec.pos_encoding(y)
    for layer in dec.layers:
        y = layer(y, memory, tgt_mask, src_mask if memory_mask else None)
    y = y if final_norm in ("both", "dec") else dec.norm(y)
    logits = ref.generator(y)
    if output == "softmax":
        return torch.softmax(logits, -1)
    if output == "log_softmax":
        return torch.log_softmax(logits, -1)
    return logits


_TF_AXES = {
    "emb": [None, ("embeddings_not_scaled", "both"), ("embeddings_not_scaled", "src"),
            ("embeddings_not_scaled", "tgt")],
    "final_norm": [None, ("no_final_norm", "both"), ("no_final_norm", "enc"),
                   ("no_final_norm", "dec")],
    "output": [None, ("returns_probabilities", "softmax"),
               ("returns_probabilities", "log_softmax")],
    "memory_mask": [True, ("memory_mask_not_passed", False)],
}


_TF_SHAPES = ("src (N, L_src), tgt (N, L_tgt) token ids; src_mask (N, 1, L_src), "
              "tgt_mask (N, L_tgt, L_tgt); logits (N, L_tgt, tgt_vocab_size)")


def check_transformer(cls, *, norm_first: bool = False, share_embeddings: bool = False,
                      default_masks: bool = False, verbose: bool = True) -> CheckResult:
    """Check ``cls(config: tx.ModelConfig)`` with encoder, decoder, generator (tx's submodule
    names) and ``forward(src, tgt, src_mask=None, tgt_mask=None) -> logits``.

    The reference :class:`tx_helpers.Transformer` parameters are copied in by name
    (load_state_dict, strict=False); positional-encoding buffers stay the learner's.
    Masks are passed explicitly: src_mask (N, 1, L_src), tgt_mask (N, L_tgt, L_tgt).
    ``default_masks=True`` (notebook 07's contract, ``tx.Transformer.forward``'s) also calls
    ``forward(src, tgt)`` with both masks left as None and expects the reference's default
    masks, built from ``config.pad_idx``; without it a forward that takes the masks as given
    (06's ``MyTransformer``) passes.
    ``norm_first=True`` expects a Pre-LN model (the config passed has ``norm_first=True``).
    Submodules under other usual names are found (see :mod:`labkit.weights`).
    ``share_embeddings=True`` first passes a config with one vocabulary (29) and
    ``share_embeddings=True``, and expects the source embedding, the target embedding and the
    generator to hold one and the same Parameter (as in ``tx.Transformer``); then it runs the
    untied config too (vocabularies 23 and 29, ``share_embeddings=False``), where the
    embeddings and the generator must be separate Parameters: equal vocabularies cannot hide a
    generator sized by the source vocabulary or a tie that ignores the flag.
    """
    untied = ModelConfig(src_vocab_size=23, tgt_vocab_size=29, d_model=32, n_heads=4, d_ff=64,
                         n_layers=2, dropout=0.1, max_len=64, pad_idx=1, norm_first=norm_first)
    configs = ([dataclasses.replace(untied, src_vocab_size=29, share_embeddings=True), untied]
               if share_embeddings else [untied])

    def body(report: _Report):
        _check_one_config(report, cls, configs[0], default_masks, share_embeddings)
        if len(configs) > 1:
            with _suffixed(report, " [untied run]"):
                _check_one_config(report, cls, configs[1], default_masks, share_embeddings)

    return _run_check("check_transformer", body, verbose, cls)


@contextlib.contextmanager
def _suffixed(report: _Report, suffix: str):
    """Probes added inside end with ``suffix``, so a second config's lines stay distinct."""
    probe = report.probe
    report.probe = lambda ok, text: probe(ok, text + suffix)
    try:
        yield
    finally:
        del report.probe  # the instance attribute goes: the class's method again


def _check_one_config(report: _Report, cls, config: ModelConfig, default_masks: bool,
                      tied_asked: bool) -> None:
    """All of :func:`check_transformer`'s probes for one config. ``tied_asked``: the class is
    checked with ``share_embeddings=True``, so its untied config must not tie anyway."""
    norm_first, share_embeddings = config.norm_first, config.share_embeddings
    flags = "".join(f", {k}=True" for k, v in (("norm_first", norm_first),
                                               ("share_embeddings", share_embeddings)) if v)
    flags += ", share_embeddings=False" if tied_asked and not share_embeddings else ""
    module = _instantiate(report, cls, (config,), f"cls(ModelConfig(src_vocab_size="
                          f"{config.src_vocab_size}, tgt_vocab_size=29, d_model=32, "
                          f"n_heads=4, d_ff=64, n_layers=2{flags}))")
    if share_embeddings:
        _check_tied(report, module, config)
    elif tied_asked:
        _check_untied(report, module, config)
    gen_weight = getattr(getattr(module, "generator", None), "weight", None)
    if (isinstance(gen_weight, torch.Tensor) and config.src_vocab_size != config.tgt_vocab_size
            and tuple(gen_weight.shape) == (config.src_vocab_size, config.d_model)):
        report.probe(False, f"the generator scores the target vocabulary: weight "
                     f"({config.tgt_vocab_size}, {config.d_model}) (got {tuple(gen_weight.shape)})")
        report.mistake("generator_sized_by_source_vocab")
        raise _Failed
    torch.manual_seed(11)
    gen = torch.Generator().manual_seed(12)
    ref = Transformer(config).eval()
    _randomize_norms(ref, gen)
    src = torch.tensor([[4, 9, 12, 7, 3, 1, 1], [5, 6, 22, 8, 10, 11, 2]])
    tgt = torch.tensor([[2, 7, 3, 28, 1], [2, 4, 13, 9, 17]])
    src_mask = padding_mask(src, 1)
    tgt_mask = decoder_self_mask(tgt, 1)
    placed = copy_reference(report, module, ref,
                            warmup=lambda m: m(src, tgt, src_mask, tgt_mask))
    if "generator.weight" in placed and not report.probe(
            "generator.bias" in placed, f"the generator has a bias ({config.tgt_vocab_size},),"
            " like tx.Transformer's"):
        report.mistake("generator_no_bias")

    def run(s, t, sm, tm, what):
        return _as_output(report, _call(
            report, what, module, s.clone(), t.clone(), sm.clone(), tm.clone(),
            shape_hint=_TF_SHAPES))

    what = "forward(src, tgt, src_mask, tgt_mask) with L_src=7, L_tgt=5"
    out = run(src, tgt, src_mask, tgt_mask, what)
    expected = ref(src, tgt, src_mask, tgt_mask)
    if out.dim() == 3 and out.shape[-1] == config.d_model != config.tgt_vocab_size:
        report.probe(False, f"logits shape (N, L_tgt, tgt_vocab_size) = "
                     f"{tuple(expected.shape)} (got {tuple(out.shape)})")
        report.mistake("no_generator")
        raise _Failed

    def variant(**kw):
        return _transformer_variant(ref, src, tgt, src_mask, tgt_mask, **kw)

    _deterministic(report, lambda: module(src, tgt, src_mask, tgt_mask), out)
    if not _compare(report, f"logits {tuple(expected.shape)} match the reference", out,
                    expected, _TF_AXES, variant):
        other = Transformer(dataclasses.replace(config, norm_first=not norm_first)).eval()
        other.load_state_dict(ref.state_dict())
        if _close(out, other(src, tgt, src_mask, tgt_mask)):
            report.found.pop("mismatch", None)
            report.mistake("post_ln_instead_of_pre_ln" if norm_first
                           else "pre_ln_instead_of_post_ln")
        _localize_transformer(report, module, ref, src, tgt, src_mask, tgt_mask)
    if report.only_mismatch():
        model_probe(report, module, ref, src, tgt, src_mask, tgt_mask,
                    lambda: module(src, tgt, src_mask, tgt_mask))
    # the decoder must not see the future: change the last target token
    tgt2 = tgt.clone()
    tgt2[:, -1] = torch.tensor([20, 21])
    out2 = run(src, tgt2, src_mask, decoder_self_mask(tgt2, 1),
               "forward with the last target token changed")
    if not report.probe(_close(out[:, :-1], out2[:, :-1]), "changing the last target "
                        "token leaves the earlier positions' logits unchanged"):
        if not causality_probe(report, lambda t: module(src, t, src_mask,
                                                        decoder_self_mask(t, 1)),
                               tgt, config.tgt_vocab_size):
            report.mistake("decoder_sees_future")
    # masked source positions must not matter
    src2 = src.clone()
    src2[0, -2:] = torch.tensor([15, 16])
    out3 = run(src2, tgt, src_mask, tgt_mask,
               "forward with different tokens under the source padding mask")
    if not report.probe(_close(out, out3), "tokens under src_mask do not change the logits"):
        report.mistake("source_padding_leaks")
    if default_masks and _check_default_masks(report, module, ref, src, tgt):
        _check_pad_from_config(report, cls, module, ref, src, tgt)


def _check_default_masks(report: _Report, module, ref: Transformer, src, tgt) -> bool:
    """``forward(src, tgt)`` with both masks left as None must build the reference's defaults:
    the padding mask (N, 1, L_src) for the encoder and cross-attention, and padding OR
    look-ahead (N, L_tgt, L_tgt) for the decoder's self-attention. True when it does."""
    out = _as_output(report, _call(report, "forward(src, tgt) with both masks left as None",
                                   module, src.clone(), tgt.clone(), shape_hint=_TF_SHAPES))
    if report.probe(_close(out, ref(src, tgt)), "forward(src, tgt) with both masks left as "
                    "None builds them from config.pad_idx, as the reference does"):
        return True
    pad = ref.config.pad_idx
    src_mask, tgt_mask = padding_mask(src, pad), decoder_self_mask(tgt, pad)
    src_cases = [(src_mask, True, None),
                 (None, True, ("source_padding_leaks", "with src_mask left as None, forward "
                               "does not build the source padding mask")),
                 (src_mask, False, ("memory_mask_not_passed", "the source mask forward builds "
                                    "for None reaches the encoder but not cross-attention")),
                 (~src_mask, True, ("mask_polarity_inverted", "source"))]
    tgt_cases = [(tgt_mask, None),
                 (None, ("decoder_sees_future", "with tgt_mask left as None, forward does not "
                         "build the target mask")),
                 (padding_mask(tgt, pad), ("decoder_mask_no_lookahead", "in the mask forward "
                                           "builds for tgt_mask=None")),
                 (lookahead_mask(tgt.size(1)), ("decoder_mask_no_padding", "in the mask "
                                                "forward builds for tgt_mask=None")),
                 (~tgt_mask, ("mask_polarity_inverted", "target"))]
    with torch.no_grad():
        for (sm, memory_mask, src_wrong), (tm, tgt_wrong) in itertools.product(src_cases,
                                                                               tgt_cases):
            wrong = [w for w in (src_wrong, tgt_wrong) if w is not None]
            if wrong and _close(out, _transformer_variant(ref, src, tgt, sm, tm,
                                                          memory_mask=memory_mask)):
                sides = " and ".join(d for k, d in wrong if k == "mask_polarity_inverted")
                for key, detail in wrong:
                    report.mistake(key, f"the default {sides} mask" if sides and key ==
                                   "mask_polarity_inverted" else detail)
                return
    report.mistake("mismatch", "forward(src, tgt) with both masks left as None")
    return False


def _check_pad_from_config(report: _Report, cls, module, ref: Transformer, src, tgt) -> None:
    """The default masks must use ``config.pad_idx``, not the id 1 the first config happens to
    use: a second model built with ``pad_idx=0`` (same weights) on the same batch, its pads
    now written as 0."""
    config0 = dataclasses.replace(ref.config, pad_idx=0)
    try:
        other = cls(config0)
        other.load_state_dict(module.state_dict())
        other.eval()
    except Exception:  # noqa: BLE001 - the first build worked; nothing more to learn here
        report.note("a second model built with pad_idx=0 could not take the first one's "
                    "weights: the default masks' pad id was not probed")
        return
    ref0 = Transformer(config0).eval()
    ref0.load_state_dict(ref.state_dict())
    src0, tgt0 = src.masked_fill(src == 1, 0), tgt.masked_fill(tgt == 1, 0)  # no id 1 left
    out = _as_output(report, _call(report, "forward(src, tgt) of a model built with pad_idx=0",
                                   other, src0.clone(), tgt0.clone(), shape_hint=_TF_SHAPES))
    if report.probe(_close(out, ref0(src0, tgt0)), "a model built with pad_idx=0 hides the "
                    "tokens with id 0 in its default masks"):
        return
    with torch.no_grad():
        as_if_one = ref0(src0, tgt0, padding_mask(src0, 1), decoder_self_mask(tgt0, 1))
    if _close(out, as_if_one):
        report.mistake("pad_idx_ignored", "forward builds its default masks with the pad id 1, "
                       "not with config.pad_idx")
    else:
        report.mistake("mismatch", "forward(src, tgt) of a model built with pad_idx=0")


def _check_tied(report: _Report, module, config) -> None:
    """The source embedding, target embedding and generator must be one Parameter: every
    (vocab, d_model) Parameter the module holds, under any attribute of any submodule, counted
    by identity (a custom embedding or projection module counts like nn.Embedding/nn.Linear)."""
    shape = (config.tgt_vocab_size, config.d_model)
    weights = [p for _, p in module.named_parameters(remove_duplicate=False)
               if tuple(p.shape) == shape]
    distinct = list({id(w): w for w in weights}.values())
    if report.probe(len(weights) >= 3 and len(distinct) == 1, f"the two embeddings and the "
                    f"generator hold one Parameter {shape} ({len(weights)} uses, "
                    f"{len(distinct)} distinct)"):
        return
    if len(distinct) > 1 and all(torch.equal(w, distinct[0]) for w in distinct):
        report.mistake("embeddings_copied_not_tied")
    elif len(distinct) == 1:
        report.mistake("embeddings_not_tied", f"only {len(weights)} of the three modules use "
                       "the shared matrix")
    else:
        report.mistake("embeddings_not_tied", f"{len(distinct)} separate matrices")


def _check_untied(report: _Report, module, config) -> None:
    """With ``share_embeddings=False`` nothing is tied: every (tgt_vocab, d_model) Parameter
    use (the decoder embedding, the generator) is a Parameter of its own."""
    shape = (config.tgt_vocab_size, config.d_model)
    weights = [p for _, p in module.named_parameters(remove_duplicate=False)
               if tuple(p.shape) == shape]
    distinct = {id(w) for w in weights}
    if not report.probe(len(distinct) == len(weights), f"with share_embeddings=False the "
                        f"decoder embedding and the generator are separate Parameters {shape} "
                        f"({len(weights)} uses, {len(distinct)} distinct)"):
        report.mistake("tied_although_not_shared")
        raise _Failed  # the reference is untied: its weights cannot be copied into one matrix


def _localize_transformer(report, module, ref, src, tgt, src_mask, tgt_mask) -> None:
    """Say whether the encoder alone already differs (when it can be called like tx's)."""
    encoder = getattr(module, "encoder", None)
    if encoder is None:
        return
    try:
        mine = encoder(src, src_mask)
    except Exception:  # noqa: BLE001 - a different encoder signature: nothing to say
        return
    if isinstance(mine, torch.Tensor) and not _close(mine, ref.encoder(src, src_mask)):
        report.note("the encoder's output already differs from the reference encoder; "
                    "check its embedding scaling, layers and final norm")



