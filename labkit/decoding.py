"""Check: a learner's greedy decoder, against tx.greedy_decode on a small random model."""
from __future__ import annotations

import torch

from tx_helpers.config import ModelConfig
from tx_helpers.decoding import greedy_decode
from tx_helpers.masks import padding_mask
from tx_helpers.model import Transformer

from .compare import _as_output, _compare
from .localize_decode import DecodeTrace, localise_decode
from .report import CheckResult, _call, _Failed, _Report, _run_check

PAD, BOS, EOS, MAX_LEN = 0, 1, 2, 6
_SHAPES = ("src is (N, L_src) and the encoder's memory (N, L_src, d_model); decoding a prefix "
           "of L tokens gives hidden states (N, L, d_model); the last position's logits are "
           "(N, V) and the next tokens (N,)")


def _greedy_variant(model, src, *, position="last", feed_back=True, after_eos="pad",
                    exclude=True, steps=0, memory_mask=True, lookahead=True, keep_bos=True):
    """tx.greedy_decode's loop and its known wrong variants (the defaults are right)."""
    src_mask = padding_mask(src, PAD)  # (N, 1, L_src)
    memory = model.encode(src, src_mask)  # (N, L_src, d_model)
    n = src.size(0)
    ys = torch.full((n, 1), BOS, dtype=torch.long)  # (N, 1)
    finished = torch.zeros(n, dtype=torch.bool)
    for _ in range(MAX_LEN + steps):
        prefix = ys if feed_back else ys[:, :1]
        tgt_mask = None if lookahead else torch.zeros(1, prefix.size(1), prefix.size(1),
                                                      dtype=torch.bool)
        hidden = model.decode(prefix, memory, src_mask if memory_mask else None, tgt_mask)
        if position == "positions":  # argmax over the positions axis of (N, L, V)
            next_token = model.generator(hidden).argmax(dim=1)[:, -1]  # (N,)
        else:
            logits = model.generator(hidden[:, -1])  # (N, V)
            if exclude:
                logits[:, [PAD, BOS]] = float("-inf")
            next_token = logits.argmax(dim=-1)  # (N,)
        if after_eos == "pad":
            next_token = next_token.masked_fill(finished, PAD)
        ys = torch.cat([ys, next_token[:, None]], dim=1)  # (N, L + 1)
        finished |= next_token == EOS
        if bool(finished.all()) or (after_eos == "stop_any" and bool(finished.any())):
            break
    return ys if keep_bos else ys[:, 1:]


_DECODE_AXES = {
    "position": ["last", ("decode_argmax_wrong_dim", "positions")],
    "feed_back": [True, ("decode_no_feedback", False)],
    "after_eos": ["pad", ("decode_no_padding_after_eos", "continue"),
                  ("decode_stops_at_first_eos", "stop_any")],
    "exclude": [True, ("decode_pad_bos_not_excluded", False)],
    "steps": [0, ("decode_max_len_off_by_one", -1), ("decode_max_len_off_by_one", 1)],
    "memory_mask": [True, ("decode_src_mask_missing", False)],
    "lookahead": [True, ("decode_no_lookahead", False)],
    "keep_bos": [True, ("decode_no_bos_column", False)],
}


def _probe_model() -> Transformer:
    """A random 2-layer model whose greedy outputs tell every listed mistake apart.

    The biases make PAD and BOS the raw argmax at some steps (so excluding them matters) and
    EOS likely enough that some rows finish early and one runs to max_len.
    """
    config = ModelConfig(src_vocab_size=13, tgt_vocab_size=11, d_model=32, n_heads=4, d_ff=64,
                         n_layers=2, dropout=0.1, max_len=16, pad_idx=PAD)
    torch.manual_seed(_SEED)
    model = Transformer(config)
    with torch.no_grad():
        model.generator.bias.add_(torch.tensor(_BIAS))
    return model


_SEED = 1  # with these biases, no two listed mistakes give the same ids (a test keeps it so)
_BIAS = [2.0, 1.5, 1.0] + [0.0] * 8  # PAD, BOS, EOS, then the other tokens
_SRC = torch.tensor([[5, 9, 3, 12, 7, 4], [8, 4, 11, 0, 0, 0],
                     [10, 3, 6, 5, 0, 0], [12, 12, 7, 9, 3, 8]])  # (N, L_src), pad 0


def _trim(ys: torch.Tensor) -> torch.Tensor:
    """Drop trailing columns that are PAD in every row (running on to max_len is harmless)."""
    keep = ys.size(1)
    while keep > 1 and bool((ys[:, keep - 1] == PAD).all()):
        keep -= 1
    return ys[:, :keep]


def check_greedy_decode(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(model, src, *, bos_idx, eos_idx, max_len) -> ids``, a greedy decoder.

    The result must equal :func:`tx_helpers.greedy_decode` on a small random model: ids
    (N, L) with L <= max_len + 1, column 0 BOS, a finished row padded with the model's
    ``config.pad_idx`` after its EOS, PAD and BOS never predicted, the loop stopping once
    every row has finished (extra all-PAD columns at the end are accepted), and the model
    in eval mode while decoding (it is handed over in train mode, dropout 0.1); a model not
    given back in train mode afterwards gets a note, not a failure.

    Two more runs change nothing for a right loop: every logit lowered by 10 (a PAD or BOS
    "excluded" with a 0 now wins) and the rows in the order they finish (a loop that stops on
    row 0 now stops early). When the ids differ and no known variant explains them, forward
    hooks replay the learner's output step by step (:mod:`.localize_decode`) and name the first
    part that goes wrong: the source masks, what is fed back, which logits are read, what
    follows EOS.
    """

    def body(report: _Report):
        model = _probe_model().train()
        modes = []
        hooks = [m.register_forward_pre_hook(lambda mod, _args: modes.append(mod.training))
                 for m in (model.encoder, model.decoder)]
        trace = DecodeTrace(model)
        try:
            out = _call(report, f"fn(model, src (4, 6), bos_idx={BOS}, eos_idx={EOS}, "
                        f"max_len={MAX_LEN})", fn, model, _SRC.clone(), bos_idx=BOS,
                        eos_idx=EOS, max_len=MAX_LEN, shape_hint=_SHAPES)
        finally:
            trace.remove()
            for h in hooks:
                h.remove()
        out = _as_output(report, out, "the generated ids")
        report.probe(bool(modes), "the model's encoder and decoder are called")
        if not report.probe(not any(modes), "the model runs in eval mode while decoding "
                            "(no dropout)"):
            report.mistake("decode_no_eval")
        if not model.training:  # a note, not a failure: leaving eval on is common, correct code
            report.note("the model is left in eval mode afterwards; tx.greedy_decode gives it "
                        "back the mode it was handed in")
        model.eval()
        expected = greedy_decode(model, _SRC, bos_idx=BOS, eos_idx=EOS, max_len=MAX_LEN)
        if out.dtype.is_floating_point or out.dim() != 2:
            report.probe(False, f"returns token ids (N, L), got {out.dtype} "
                         f"{tuple(out.shape)}")
            report.mistake("wrong_output_type" if out.dim() == 2 else "wrong_output_shape",
                           None, "return ys: a long tensor (N, L) whose column 0 is BOS")
            raise _Failed
        trimmed = _trim(out.long())
        if trimmed.shape != out.shape and trimmed.shape == expected.shape:
            report.note("trailing all-PAD columns were ignored: stopping once every row has "
                        "produced EOS saves the remaining steps")
        random = "decode_no_eval" in report.found  # dropout: no variant can line up
        ok = _compare(report, f"the ids {tuple(expected.shape)} match tx.greedy_decode", trimmed,
                      expected, None if random else _DECODE_AXES,
                      lambda **kw: _greedy_variant(model, _SRC, **kw))
        if random:
            report.found.pop("mismatch", None)
        elif not ok:
            _localise(report, trace, out.long(), model, _SRC)
        else:
            _isolating_runs(report, fn, model, expected)

    return _run_check("check_greedy_decode", body, verbose, fn)


def _localise(report: _Report, trace: DecodeTrace, out, model, src) -> None:
    """Which part of the loop differs (only when no known variant explained the ids)."""
    generic = {"mismatch", "wrong_output_shape"}
    if set(report.found) <= generic:
        localise_decode(report, trace, out, model, src, pad=PAD, bos=BOS, eos=EOS,
                        max_len=MAX_LEN)
        if set(report.found) - generic:
            for key in generic:
                report.found.pop(key, None)


def _isolating_runs(report: _Report, fn, model, expected) -> None:
    """Runs that change nothing for a correct loop: every logit lowered by 10 (the argmax is
    the same; PAD and BOS excluded with a 0 would now win), the rows in the order they finish
    (a loop stopping on row 0 now stops early), and EOS raised so every row ends before
    max_len (a loop that never stops early returns all-PAD columns: ``decode_no_early_stop``)."""
    finish = [int(row.tolist().index(EOS)) if EOS in row.tolist() else row.numel()
              for row in expected]
    order = torch.tensor(sorted(range(len(finish)), key=finish.__getitem__))
    early = torch.zeros(model.generator.bias.shape)
    early[EOS] = 1.5  # every row now ends within two steps, well before max_len
    for what, src, shift in (("with every logit lowered by 10 (the same argmax) the ids match "
                              "too", _SRC, -10.0),
                             ("with the rows in the order they finish the ids match too",
                              _SRC[order], 0.0),
                             ("with every row ending before max_len the loop stops there too",
                              _SRC, early)):
        model.eval()
        trace = DecodeTrace(model)
        with torch.no_grad():
            model.generator.bias.add_(shift)
        try:
            out = _call(report, f"fn(model, src, ...) {what.split(' the ids')[0]}", fn, model,
                        src.clone(), bos_idx=BOS, eos_idx=EOS, max_len=MAX_LEN,
                        shape_hint=_SHAPES)
            model.eval()
            want = greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=MAX_LEN)
        finally:
            trace.remove()
            with torch.no_grad():
                model.generator.bias.sub_(shift)
        out = _as_output(report, out, "the generated ids").long()
        if isinstance(shift, torch.Tensor) and out.shape != want.shape and _trim(out).shape == \
                want.shape and torch.equal(_trim(out), want):
            report.probe(False, f"{what}: {tuple(want.shape)}, got {tuple(out.shape)}")
            report.mistake("decode_no_early_stop")
            return
        if not _compare(report, what, _trim(out), want):
            _localise(report, trace, out, model, src)
            return

