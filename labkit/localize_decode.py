"""Localising probes for greedy decoding (issue 29, item 6).

:class:`DecodeTrace` records, with forward hooks, every call the learner's decoder makes to the
model: the encoder's source and mask, and for each decoder call the prefix fed in, the masks,
the cache and the hidden states that came out. :func:`localise_decode` then replays the
learner's own output against that record, step by step, and names the first part that goes
wrong: the source padding mask (encoder, cross-attention), the look-ahead mask, what is fed
back (the whole prefix generated so far, or the newest token with a cache), which logits are
read (the last position's, PAD and BOS excluded, the argmax) and what happens once a row has
produced EOS (PAD after it).
"""
from __future__ import annotations

import inspect

import torch

from .report import _Report


class DecodeTrace:
    """Forward hooks on ``model.encoder`` and ``model.decoder``; :meth:`remove` when done."""

    def __init__(self, model):
        self.encoder_calls: list[dict] = []
        self.decoder_calls: list[dict] = []
        self._hooks = [
            model.encoder.register_forward_hook(self._hook(model.encoder, self.encoder_calls),
                                                with_kwargs=True),
            model.decoder.register_forward_hook(self._hook(model.decoder, self.decoder_calls),
                                                with_kwargs=True)]

    @staticmethod
    def _hook(module, calls):
        signature = inspect.signature(module.forward)

        def hook(_module, args, kwargs, output):
            try:
                bound = signature.bind(*args, **kwargs).arguments
            except TypeError:
                return
            bound["output"] = output
            calls.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                          for k, v in bound.items()})
        return hook

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def _hides_pads(mask, src, pad: int) -> bool:
    """``mask`` hides exactly the padded source keys (for the first query row)."""
    if mask is None:
        return not bool((src == pad).any())
    try:
        m = mask.bool()
        m = m.reshape(m.size(0), -1, m.size(-1))[:, 0]  # (N, L_src): the first query's keys
        return bool(torch.equal(m.expand(src.shape), src == pad))
    except (RuntimeError, IndexError):
        return False


def _hides_future(mask, length: int) -> bool:
    if length == 1:
        return True
    if mask is None:
        return False
    try:
        m = mask.bool()
        m = m.reshape(-1, m.size(-2), m.size(-1))  # (N or 1, L, L)
        return bool(m[:, torch.ones(length, length, dtype=torch.bool).triu(1)].all())
    except (RuntimeError, IndexError):
        return False


def localise_decode(report: _Report, trace: DecodeTrace, out: torch.Tensor, model, src,
                    *, pad: int, bos: int, eos: int, max_len: int) -> None:
    """Name the first part of the learner's decoding loop that differs from greedy decoding."""
    n = src.size(0)
    enc_ok = all(_hides_pads(c.get("mask"), src, pad) for c in trace.encoder_calls
                 if c.get("src") is not None and c["src"].shape == src.shape)
    if not report.probe(enc_ok, "the encoder gets the source padding mask"):
        report.mistake("decode_encoder_unmasked")
        return
    calls = trace.decoder_calls
    if not report.probe(bool(calls) and all(_hides_pads(c.get("memory_mask"), src, pad)
                                            for c in calls),
                        "every decoder call gets the source padding mask for cross-attention"):
        report.mistake("decode_src_mask_missing")
        return
    for k, call in enumerate(calls):
        prefix, cached = call["tgt"], call.get("cache") is not None
        col = k + 1  # the column this call's prediction fills
        if col >= out.size(1):
            break
        if not cached and not _hides_future(call.get("tgt_mask"), prefix.size(1)):
            report.probe(False, f"decoder call {k + 1} hides the future positions of its prefix")
            report.mistake("decode_no_lookahead")
            return
        want = out[:, k:col] if cached else out[:, :col]
        if prefix.shape != want.shape or not torch.equal(prefix, want):
            report.probe(False, f"decoder call {k + 1} is fed BOS and the {k} token(s) "
                         f"generated so far (got a prefix of shape {tuple(prefix.shape)})")
            if k and prefix.size(1) == 1 and torch.equal(prefix, out[:, k:col]):
                report.mistake("decode_newest_token_only")
            elif prefix.size(1) == 1:
                report.mistake("decode_no_feedback")
            else:
                report.mistake("decode_prefix_wrong", f"at step {k + 1}")
            return
        hidden = call["output"]  # (N, L, d_model)
        with torch.no_grad():
            logits = model.generator(hidden[:, -1]).float()  # (N, V)
            first = model.generator(hidden[:, 0]).argmax(-1)  # (N,)
        raw = logits.argmax(-1)  # (N,)
        logits[:, [pad, bos]] = float("-inf")
        best = logits.argmax(-1)  # (N,)
        token = out[:, col]  # (N,)
        done = (out[:, 1:col] == eos).any(1) if col > 1 else torch.zeros(n, dtype=torch.bool)
        live = ~done
        if bool((token[live] != best[live]).any()):
            report.probe(False, f"step {k + 1} chooses the argmax of the last position's logits "
                         "over every token but PAD and BOS")
            wrong = live & (token != best)
            if bool(((token == pad) | (token == bos))[wrong].all()):
                report.mistake("decode_pad_bos_not_excluded")
            elif bool((token == raw)[wrong].all()):
                report.mistake("decode_pad_bos_not_excluded")
            elif k and bool((token == first)[wrong].all()):
                report.mistake("decode_no_feedback", "it reads the first position's logits")
            else:
                report.mistake("decode_not_argmax")
            return
        if bool((token[done] != pad).any()):
            report.probe(False, f"step {k + 1} puts PAD after a row's EOS")
            report.mistake("decode_eos_after_eos" if bool((token[done] == eos).all())
                           else "decode_no_padding_after_eos")
            return
    report.probe(True, "each step is fed the prefix generated so far and picks the argmax of "
                 "the last position, PAD after EOS")
    unfinished = ~(out[:, 1:] == eos).any(1)
    if bool(unfinished.any()) and out.size(1) - 1 < max_len:
        report.probe(False, "decoding goes on while a row has not produced EOS")
        report.mistake("decode_stops_at_first_eos")
