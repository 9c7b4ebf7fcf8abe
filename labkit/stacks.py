"""Check: the decoder stack (embedding, scale, positions, layers, final norm) on its own."""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from tx_helpers.masks import decoder_self_mask, padding_mask
from tx_helpers.model import Decoder

from .compare import (
    _as_output,
    _close,
    _compare,
    _deterministic,
    _instantiate,
    _randomize_norms,
    run_with_stand_in_dropout,
)
from .report import CheckResult, _call, _Report, _run_check
from .weights import copy_reference

_SHAPES = ("tgt (N, L_tgt) token ids, memory (N, L_src, d_model), tgt_mask (N, L_tgt, L_tgt), "
           "memory_mask (N, 1, L_src); it returns (N, L_tgt, d_model)")


def _decoder_variant(ref: Decoder, tgt, memory, tgt_mask, memory_mask, emb=None, pe=True,
                     final_norm=True, masks="both"):
    """The reference decoder's forward with one or more of the usual stack mistakes."""
    x = ref.embedding(tgt)  # (N, L_tgt, d_model)
    scale = math.sqrt(ref.d_model)
    if emb in ("fixed_128", "fixed_512"):  # the width of the notebook's config or the paper's
        scale = math.sqrt(int(emb.removeprefix("fixed_")))
    if emb in (None, "fixed_128", "fixed_512"):
        x = x * scale
    x = ref.pos_encoding(x) if pe else x
    if emb == "after_pe":
        x = x * scale
    tm = None if masks in ("memory_only", "none") else tgt_mask
    mm = None if masks in ("tgt_only", "none") else memory_mask
    for layer in ref.layers:
        x = layer(x, memory, tm, mm)  # (N, L_tgt, d_model)
    return ref.norm(x) if final_norm else x


_AXES = {
    "emb": [None, ("embeddings_not_scaled", "unscaled"), ("embedding_stage_wrong", "after_pe"),
            ("embedding_scale_hard_coded", "fixed_128"),
            ("embedding_scale_hard_coded", "fixed_512")],
    "pe": [True, ("pe_not_added", False)],
    "final_norm": [True, ("no_final_norm", False)],
    "masks": ["both", ("memory_mask_not_passed", "tgt_only"),
              ("tgt_mask_not_passed", "memory_only")],
}


def _use_reference_layers(report: _Report, module: nn.Module, ref: Decoder) -> bool:
    """Put copies of the reference layers into the learner's ``layers``, so that this check
    grades the stack alone (the layer has its own check). True when it could."""
    layers = getattr(module, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers) == len(ref.layers):
        for i, layer in enumerate(ref.layers):
            layers[i] = copy.deepcopy(layer)
        report.note("the check runs your stack on tx.DecoderLayer layers: a bug in your own "
                    "layer is check_decoder_layer's business, not this check's")
        return True
    return False


def _train_mode_probe(report: _Report, module: nn.Module, ref: Decoder, call) -> None:
    """Train mode, every nn.Dropout a fixed stand-in: the positional encoding's dropout acts
    once, on the scaled embeddings plus positions (the layers are the reference's copies)."""
    text = "train mode: the positional encoding's dropout acts once, as in the reference"
    outs = []
    for seed in (1, 2):  # a random dropout outside nn.Dropout would differ between seeds
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            outs.append(run_with_stand_in_dropout(module, lambda: call(module)))
    (mine, seen, _), (again, _, _) = outs
    if not _close(mine, again):
        report.note("in train mode the output is random although every nn.Dropout is a fixed "
                    "stand-in (F.dropout?): dropout placement not checked")
        return
    expected, ref_seen, _ = run_with_stand_in_dropout(ref, lambda: call(ref))
    if report.probe(_close(mine, expected), text):
        return
    if len(seen) > len(ref_seen):
        report.mistake("pe_dropout_misplaced", f"{len(seen)} dropout calls in one forward, "
                       f"where the reference makes {len(ref_seen)}: one acts twice")
    elif len(seen) < len(ref_seen):
        report.mistake("pe_dropout_unused", "the stack's dropout after the positions is "
                       "never called in train mode")
    else:
        report.mistake("mismatch", "in train mode the output differs from the reference's "
                       "(dropout after the positions)")


def check_decoder(cls, *, norm_first: bool = False, verbose: bool = True) -> CheckResult:
    """Check ``cls(vocab_size, d_model, n_heads, d_ff, n_layers, dropout, max_len)`` with
    embedding, pos_encoding, layers (an nn.ModuleList), norm and
    ``forward(tgt, memory, tgt_mask=None, memory_mask=None) -> (N, L_tgt, d_model)``.

    The reference is :class:`tx_helpers.Decoder` (Post-LN unless ``norm_first=True``). Its
    layers replace the learner's (when ``layers`` is a ModuleList of the right length), so
    only the stack is graded. Then: a changed last target token must leave the earlier
    positions alone, noise at masked memory positions must change nothing, and in train
    mode (every nn.Dropout a fixed stand-in) the positional encoding's dropout acts once.
    """
    vocab, d_model, n_heads, d_ff, n_layers = 29, 32, 4, 64, 2

    def body(report: _Report):
        module = _instantiate(report, cls, (vocab, d_model, n_heads, d_ff, n_layers, 0.1, 64),
                              f"cls(vocab_size={vocab}, d_model={d_model}, n_heads={n_heads}, "
                              f"d_ff={d_ff}, n_layers={n_layers}, dropout=0.1, max_len=64)",
                              ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers",
                               "dropout", "max_len"))
        torch.manual_seed(13)
        gen = torch.Generator().manual_seed(14)
        ref = Decoder(vocab, d_model, n_heads, d_ff, n_layers, 0.1, 64,
                      norm_first=norm_first).eval()
        _randomize_norms(ref, gen)
        replaced = _use_reference_layers(report, module, ref)
        module.eval()
        tgt = torch.tensor([[2, 7, 3, 28, 1], [2, 4, 13, 1, 1]])  # (N, L_tgt=5), padded
        memory = torch.randn(2, 7, d_model, generator=gen)  # (N, L_src=7, d_model)
        src = torch.tensor([[4, 9, 12, 7, 3, 1, 1], [5, 6, 22, 8, 10, 11, 2]])
        tgt_mask = decoder_self_mask(tgt, 1)  # (N, L_tgt, L_tgt)
        memory_mask = padding_mask(src, 1)  # (N, 1, L_src)
        copy_reference(report, module, ref,
                       warmup=lambda m: m(tgt, memory, tgt_mask, memory_mask))

        def run(t, mem, tm, what):
            with torch.no_grad():
                return _as_output(report, _call(report, what, module, t.clone(), mem.clone(),
                                                tm.clone(), memory_mask.clone(),
                                                shape_hint=_SHAPES))

        what = "forward(tgt, memory, tgt_mask, memory_mask) with L_tgt=5, L_src=7"
        out = run(tgt, memory, tgt_mask, what)
        with torch.no_grad():
            expected = ref(tgt, memory, tgt_mask, memory_mask)
            _deterministic(report, lambda: module(tgt.clone(), memory.clone(), tgt_mask,
                                                  memory_mask), out)

            def variant(**kw):
                return _decoder_variant(ref, tgt, memory, tgt_mask, memory_mask, **kw)

            _compare(report, f"output {tuple(expected.shape)} matches the reference", out,
                     expected, _AXES, variant)
        tgt2 = tgt.clone()
        tgt2[0, -2] = 20  # the last real token of row 0
        out2 = run(tgt2, memory, decoder_self_mask(tgt2, 1),
                   "forward with a later target token changed")
        if not report.probe(_close(out[0, :-2], out2[0, :-2]), "changing a later target "
                            "token leaves the earlier positions unchanged"):
            report.mistake("decoder_sees_future")
        noisy = memory.clone()
        noisy[0, -2:] = 100 * torch.randn(2, d_model, generator=gen)  # under memory_mask
        out3 = run(tgt, noisy, tgt_mask, "forward with noise at the masked memory positions")
        if not report.probe(_close(out, out3), "noise at memory positions hidden by "
                            "memory_mask does not change the output"):
            report.mistake("source_padding_leaks")
        if replaced and not report.found:
            _train_mode_probe(report, module, ref, lambda m: _as_output(report, _call(
                report, "forward in train mode", m, tgt.clone(), memory.clone(),
                tgt_mask.clone(), memory_mask.clone(), shape_hint=_SHAPES)))

    return _run_check("check_decoder", body, verbose, cls)
