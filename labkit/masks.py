"""Check: the mask builders (padding, look-ahead, decoder, cross-attention)."""
from __future__ import annotations

import torch

from tx_helpers.attention import scaled_dot_product_attention
from tx_helpers.masks import decoder_self_mask, expand_mask, lookahead_mask, padding_mask

from .mask_contract import (
    _probe_device_argument,
    _probe_errors,
    _probe_input_device,
    _takes,
    parts_replaced,
)
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Failed, _Report, _run_check, slot_watch

MISTAKES.update({
    "mask_argument_unchecked": (
        "an input the contract refuses is accepted, or refused with another error than the "
        "ValueError the contract names",
        "check the argument on entry, before any tensor is built, and raise the error the "
        "exercise's contract names"),
    "mask_error_message": (
        "the ValueError does not name the argument it refuses",
        "a message that names the argument, what it got and what was expected tells the "
        "caller which input to fix"),
    "decoder_past_rows_first": (
        "with past > 0 the decoder mask gives the new queries the rows of the first positions "
        "(0, 1, ...) instead of their own (past, past + 1, ...)",
        "the new queries sit after the cached ones: the first new query is the position just "
        "after the last cached one, and it may see every key up to itself"),
    "decoder_past_keys_dropped": (
        "with past > 0 the decoder mask covers only the new positions as keys; the cached "
        "positions are keys too",
        "the keys are every position so far: the cached ones and the new ones"),
})


def _tensor_or_fail(report: _Report, value, what) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        report.probe(False, f"{what} returns a torch.Tensor (got {type(value).__name__})")
        report.mistake("wrong_output_type")
        raise _Failed
    if value.dtype != torch.bool:
        report.probe(False, f"{what} returns a bool tensor (got {value.dtype})")
        extra = (" (float masks, such as the additive 0/-inf masks of nn.Transformer, are "
                 "easy to misread: this project uses bool, True = do not attend)"
                 if value.is_floating_point() else "")
        report.mistake("mask_not_bool", f"got dtype {value.dtype}{extra}")
        raise _Failed
    return value


def _match_mask(report: _Report, what: str, got: torch.Tensor, expected: torch.Tensor,
                candidates: list[tuple[str, torch.Tensor]]) -> bool:
    if got.shape == expected.shape and bool((got == expected).all()):
        return report.probe(True, what)
    report.probe(False, what)
    for key, cand in candidates:
        if got.shape == cand.shape and bool((got == cand).all()):
            report.mistake(key)
            return False
    if got.shape == expected.shape and got.dim() >= 2 and torch.equal(
            got, expected.transpose(-2, -1)) and not torch.equal(got, expected):
        report.mistake("mask_transposed", "it equals the expected mask with its last two axes "
                       "swapped")
        return False
    if got.shape == expected.shape and got.dim() >= 2:
        diff = (got != expected).nonzero()
        idx = tuple(int(i) for i in diff[0][:-1])
        row_g, row_e = got[idx], expected[idx]
        hidden = [j for j in range(row_g.numel()) if bool(row_g[j])]
        want = [j for j in range(row_e.numel()) if bool(row_e[j])]
        leak = [j for j in want if j not in hidden]
        over = [j for j in hidden if j not in want]
        where = (f"batch {idx[0]}, query {idx[1]}" if len(idx) == 2 else f"query {idx[-1]}")
        parts = []
        if leak:
            parts.append(f"keys {leak} are visible but must be hidden")
        if over:
            parts.append(f"keys {over} are hidden but must be visible")
        report.mistake("mask_rows_wrong", f"{where}: " + "; ".join(parts)
                       + f" ({int((got != expected).sum())} entries differ in all)")
        return False
    report.mistake("mismatch", f"got\n{got.int().tolist()}\nexpected\n{expected.int().tolist()}"
                   if expected.numel() <= 40 else f"{int((got != expected).sum())} entries "
                   f"differ")
    return False


def _broadcast(m: torch.Tensor, shape) -> torch.Tensor | None:
    try:
        return torch.broadcast_to(m, shape)
    except RuntimeError:
        return None


def check_masks(padding_fn=None, lookahead_fn=None, decoder_fn=None, cross_fn=None, *,
                devices: bool = False, full_contract: bool = False,
                verbose: bool = True) -> CheckResult:
    """Check mask builders (bool, True = do not attend); pass any subset:

    - ``padding_fn(seq, pad_idx)`` -> (N, 1, L) (an (N, L, L) or (N, 1, 1, L) mask with the
      same key pattern passes with a note),
    - ``lookahead_fn(size)`` -> (L, L), True strictly above the diagonal; one that takes
      ``past`` must return (size, past + size), query i at position past + i,
    - ``decoder_fn(tgt, pad_idx)`` -> (N, L, L) = padding OR look-ahead; one that takes
      ``past`` gets ids (N, past + L) and must return (N, L, past + L): the L new queries at
      positions past .. past + L - 1 against every key so far,
    - ``cross_fn(src, tgt, pad_idx)`` -> the cross-attention mask, which must broadcast to
      (N, L_tgt, L_src) and hide the source padding: (N, 1, L_src) is best.

    Devices: a ``lookahead_fn`` with a ``device`` parameter must build the mask there; a
    function that takes token ids should build its mask on their device. These run on the
    ``meta`` device (no GPU needed). A ``device`` parameter that is ignored always fails;
    a mask built off the input's device is a note unless ``devices=True``.

    ``full_contract=True`` (notebook 05's exercise) also probes the errors of its contract,
    for each function whose masks passed: a ValueError naming ``seq`` for token ids that are
    not 2-D, naming ``size`` for a size of 0 or below or a float (a TypeError there passes
    too), naming ``tgt`` when the batch sizes of
    ``src`` and ``tgt`` differ; and a cross-attention mask of shape (N, 1, L_src) or
    (N, L_tgt, L_src) that, given a head axis as tx does, leaves weight 0 on every source pad
    of (N, H, L_tgt, L_src) scores.
    """
    src = torch.tensor([[5, 0, 7, 9, 1, 1], [4, 8, 1, 1, 1, 1], [3, 2, 6, 0, 9, 4]])
    tgt = torch.tensor([[2, 5, 6, 1], [2, 7, 1, 1], [2, 3, 4, 5]])

    def body(report: _Report):
        if not any((padding_fn, lookahead_fn, decoder_fn, cross_fn)):
            report.probe(False, "at least one mask function was passed")
            raise _Failed
        if padding_fn is not None:
            with slot_watch(report, "padding_fn", padding_fn):
                _probe_padding(report, padding_fn, src)
        if lookahead_fn is not None:
            with slot_watch(report, "lookahead_fn", lookahead_fn):
                _probe_lookahead(report, lookahead_fn)
                _probe_lookahead_past(report, lookahead_fn)
                _probe_device_argument(report, lookahead_fn)
        dec = decoder_fn if decoder_fn is None else parts_replaced(report, decoder_fn, tgt)
        if dec is not None:
            with slot_watch(report, "decoder_fn", decoder_fn):
                _probe_decoder_mask(report, dec, tgt)
                _probe_decoder_past(report, dec)
        if cross_fn is not None:
            with slot_watch(report, "cross_fn", cross_fn):
                _probe_cross_mask(report, cross_fn, src, tgt, explicit=full_contract)
        if full_contract:
            _probe_errors(report, padding_fn, lookahead_fn, cross_fn, src, tgt)
        for name, fn, args in (("padding_fn", padding_fn, (src, 1)),
                               ("decoder_fn", dec, (tgt, 1)),
                               ("cross_fn", cross_fn, (src, tgt, 1))):
            if fn is not None and not report.found:
                _probe_input_device(report, name, fn, args, devices)

    return _run_check("check_masks", body, verbose, ",".join(
        getattr(f, "__name__", "") for f in (padding_fn, lookahead_fn, decoder_fn, cross_fn)
        if f is not None))


def _guard(report: _Report, probe):
    """Run one mask probe; a failure there does not stop the other mask probes."""
    try:
        probe()
    except _Failed:
        pass


def _probe_padding(report, fn, src):
    def probe():
        for pad_idx in (1, 0):
            what = f"padding_fn(seq, pad_idx={pad_idx})"
            m = _tensor_or_fail(report, _call(report, what, fn, src, pad_idx), what)
            n, length = src.shape
            keys = src == pad_idx  # (N, L)
            expected = keys.unsqueeze(1)
            if m.dim() == 2 and tuple(m.shape) == (n, length):
                report.probe(False, f"{what} has shape (N, 1, L) = {(n, 1, length)} "
                             f"(got {tuple(m.shape)})")
                report.mistake("padding_mask_shape")
                raise _Failed
            if tuple(m.shape) == (n, length, 1):
                report.probe(False, f"{what} has shape (N, 1, L) = {(n, 1, length)} "
                             f"(got {tuple(m.shape)})")
                report.mistake("padding_mask_keys_last_axis_missing")
                raise _Failed
            if m.dim() == 4 and m.shape[1] == 1:
                report.note("the padding mask is 4-D (N, 1, 1, L); (N, 1, L) is the convention "
                            "and broadcasts the same way")
                m = m.squeeze(1)
            if tuple(m.shape) == (n, length, length):
                if bool((m == expected.expand(n, length, length)).all()):
                    report.note("the padding mask is (N, L, L): right for self-attention, but "
                                "only (N, 1, L) also broadcasts in cross-attention")
                    m = m[:, :1, :]
            other = src == (0 if pad_idx == 1 else 1)
            cands = [("mask_inverted", ~expected), ("pad_idx_ignored", other.unsqueeze(1))]
            if m.dim() == 3 and m.shape[1] == length:
                cands = [("padding_on_queries", keys.unsqueeze(2).expand(n, length, length)),
                         ("mask_inverted", ~expected.expand(n, length, length))]
            if not _match_mask(report, f"{what}: True exactly at the pad tokens, shape (N, 1, L)",
                               m, expected, cands):
                return
    _guard(report, probe)


def _probe_lookahead(report, fn):
    def probe():
        for size in (5, 1):
            what = f"lookahead_fn({size})"
            m = _tensor_or_fail(report, _call(report, what, fn, size), what)
            while m.dim() > 2 and m.shape[0] == 1:
                m = m[0]
            expected = lookahead_mask(size)
            ones = torch.ones(size, size, dtype=torch.bool)
            cands = [("lookahead_diagonal_0", torch.triu(ones, 0)),
                     ("lookahead_diagonal_2", torch.triu(ones, 2)),
                     ("mask_inverted", ~expected),
                     ("lookahead_masks_past", torch.tril(ones, -1))]
            if not _match_mask(report, f"{what}: ({size}, {size}), True strictly above the "
                               "diagonal", m, expected, cands):
                return
    _guard(report, probe)


def _probe_lookahead_past(report, fn):
    """``lookahead_fn(size, past=P)``, when it takes ``past`` (notebook 05's exercise, the
    cache of notebook 09): (size, P + size), query i at position P + i sees keys 0 .. P + i."""
    if not _takes(fn, "past"):
        return

    def probe():
        for size, past in ((3, 2), (2, 4)):
            what = f"lookahead_fn({size}, past={past})"
            m = _tensor_or_fail(report, _call(report, what, fn, size, past=past), what)
            while m.dim() > 2 and m.shape[0] == 1:
                m = m[0]
            expected = lookahead_mask(size, past=past)  # (size, past + size)
            if tuple(m.shape) != tuple(expected.shape):
                report.probe(False, f"{what} has shape (size, past + size) = "
                             f"{tuple(expected.shape)} (got {tuple(m.shape)})")
                report.mistake("wrong_output_shape", "the keys are the past positions and the "
                               "new ones, past + size of them")
                raise _Failed
            ones = torch.ones(expected.shape, dtype=torch.bool)
            cands = [("mask_inverted", ~expected),
                     ("lookahead_masks_past", torch.tril(ones, past - 1))]
            if not _match_mask(report, f"{what}: {tuple(expected.shape)}, query i sees keys "
                               f"0 .. {past} + i", m, expected, cands):
                return
    _guard(report, probe)


def _probe_decoder_mask(report, fn, tgt):
    def probe():
        pad_idx = 1
        n, length = tgt.shape
        what = "decoder_fn(tgt, pad_idx=1)"
        m = _tensor_or_fail(report, _call(report, what, fn, tgt, pad_idx), what)
        if m.dim() == 4 and m.shape[1] == 1:
            report.note("the decoder mask is 4-D (N, 1, L, L); (N, L, L) is the convention")
            m = m.squeeze(1)
        expected = decoder_self_mask(tgt, pad_idx)
        b = _broadcast(m, expected.shape)
        if b is None:
            report.probe(False, f"{what} has shape (N, L, L) = {tuple(expected.shape)} "
                         f"(got {tuple(m.shape)})")
            report.mistake("wrong_output_shape")
            raise _Failed
        pad = padding_mask(tgt, pad_idx)
        causal = lookahead_mask(length)
        ones = torch.ones(length, length, dtype=torch.bool)
        full = expected.shape
        cands = [("decoder_mask_no_padding", causal.expand(full)),
                 ("decoder_mask_no_lookahead", pad.expand(full)),
                 ("decoder_mask_and", (pad & causal).expand(full)),
                 ("padding_on_queries", pad.transpose(1, 2) | causal),
                 ("lookahead_diagonal_0", pad | torch.triu(ones, 0)),
                 ("lookahead_diagonal_2", pad | torch.triu(ones, 2)),
                 ("mask_inverted", ~expected)]
        _match_mask(report, f"{what}: padding OR look-ahead, (N, L, L)", b, expected, cands)
    _guard(report, probe)


def _probe_decoder_past(report, fn):
    """``decoder_fn(tgt, pad_idx, past=P)``, when it takes ``past`` (notebook 05's exercise):
    ids (N, P + L) of the cached and the new positions -> (N, L, P + L), query i at position
    P + i; a key is hidden if it is a pad (cached ones included) or after the query."""
    if not _takes(fn, "past"):
        return
    # left padding in row 0 puts pads among the cached positions; row 1 pads the new ones
    tgt = torch.tensor([[1, 1, 2, 5, 6, 7], [2, 7, 8, 9, 1, 1], [2, 3, 4, 5, 6, 8]])

    def probe():
        pad_idx = 1
        n, total = tgt.shape
        for past in (2, 4):
            new = total - past
            what = f"decoder_fn(tgt (N, {total}), pad_idx=1, past={past})"
            m = _tensor_or_fail(report, _call(report, what, fn, tgt, pad_idx, past=past), what)
            if m.dim() == 4 and m.shape[1] == 1:
                m = m.squeeze(1)
            pad = padding_mask(tgt, pad_idx)  # (N, 1, past + L)
            expected = pad | lookahead_mask(new, past=past)  # (N, L, past + L)
            b = _broadcast(m, expected.shape)
            if b is None:
                report.probe(False, f"{what} has shape (N, L, past + L) = "
                             f"{tuple(expected.shape)} (got {tuple(m.shape)})")
                if m.shape[-1] == new:
                    report.mistake("decoder_past_keys_dropped")
                else:
                    report.mistake("wrong_output_shape", f"{new} new queries (the ids after "
                                   f"the {past} cached ones) against {total} keys")
                raise _Failed
            square = pad | lookahead_mask(total)  # (N, P + L, P + L)
            cands = [("decoder_past_rows_first", square[:, :new]),
                     ("decoder_mask_no_padding", lookahead_mask(new, past=past).expand(
                         expected.shape)),
                     ("decoder_mask_no_lookahead", pad.expand(expected.shape)),
                     ("decoder_mask_and", pad & lookahead_mask(new, past=past)),
                     ("mask_inverted", ~expected)]
            if not _match_mask(report, f"{what}: (N, {new}, {total}), query i at position "
                               f"{past} + i, pads hidden", b, expected, cands):
                return
    _guard(report, probe)


def _probe_cross_in_attention(report, what, mask, expected, key_is_pad, heads=2) -> None:
    """Use ``mask`` against cross-attention scores (N, H, L_tgt, L_src), as tx does (a head
    axis inserted by ``expand_mask``): the weights must equal the reference mask's and be
    exactly 0 on every source pad."""
    n, l_tgt, l_src = expected.shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(n, heads, l_tgt, 8, generator=g)  # (N, H, L_tgt, d_k)
    k = torch.randn(n, heads, l_src, 8, generator=g)  # (N, H, L_src, d_k)
    _, w_ref = scaled_dot_product_attention(q, k, k, expand_mask(expected, n, heads, l_tgt, l_src))
    _, w = scaled_dot_product_attention(q, k, k, expand_mask(mask, n, heads, l_tgt, l_src))
    on_pads = (w * key_is_pad[:, None, None, :]).sum(-1).max().item()  # (N, H, L_tgt) -> max
    ok = torch.equal(w, w_ref) and on_pads == 0.0
    if not report.probe(ok, f"{what} in attention on scores (N, H, L_tgt, L_src) = "
                        f"{(n, heads, l_tgt, l_src)}: weight 0 on every source pad, the "
                        "reference's weights"):
        report.mistake("mismatch", f"largest weight a query puts on source pads: {on_pads:.4f}")
        raise _Failed


def _probe_cross_mask(report, fn, src, tgt, explicit=False):
    def probe():
        pad_idx = 1
        n, l_src = src.shape
        l_tgt = tgt.size(1)
        what = f"cross_fn(src (N, {l_src}), tgt (N, {l_tgt}), pad_idx=1)"
        m = _tensor_or_fail(report, _call(report, what, fn, src, tgt, pad_idx), what)
        shape = tuple(m.shape)
        if m.dim() == 4 and m.shape[1] == 1:
            m = m.squeeze(1)
        full = (n, l_tgt, l_src)
        b = _broadcast(m, full)
        if b is None:
            report.probe(False, f"{what} broadcasts to (N, L_tgt, L_src) = {full} "
                         f"(got {tuple(m.shape)})")
            if m.shape[-2:] == (l_src, l_src):
                report.mistake("cross_mask_shape")
            elif m.shape[-1] == l_tgt:
                report.mistake("cross_mask_uses_tgt")
            else:
                report.mistake("wrong_output_shape")
            raise _Failed
        expected = padding_mask(src, pad_idx).expand(full)
        rect = torch.triu(torch.ones(l_tgt, l_src, dtype=torch.bool), 1)
        cands = [("cross_mask_lookahead", expected | rect), ("mask_inverted", ~expected)]
        if not _match_mask(report, f"{what}: hides the padded source positions, broadcasts to "
                           f"{full}", b, expected, cands):
            return
        if explicit:  # notebook 05's contract: (N, 1, L_src) or (N, L_tgt, L_src)
            _probe_cross_in_attention(report, what, m, expected, src == pad_idx)
            thin = (n, 1, l_src)
            if not report.probe(shape in (thin, full), f"{what} has a shape of the contract: "
                                f"{thin} or {full}" + ("" if shape in (thin, full)
                                                       else f" (got {shape})")):
                report.mistake("wrong_output_shape", f"got {shape}: tx masks carry no head "
                               "axis (the attention inserts it), so the contract names the "
                               f"key row shared by every query, {thin}, or one row per target "
                               f"query, {full}")
        elif shape not in ((n, 1, l_src), full):
            report.note(f"shape {shape} works; (N, 1, L_src) and (N, L_tgt, L_src) are the "
                        "usual forms")
    _guard(report, probe)
