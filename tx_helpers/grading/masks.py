"""Check: the mask builders (padding, look-ahead, decoder, cross-attention)."""
from __future__ import annotations

import torch

from ..masks import decoder_self_mask, lookahead_mask, padding_mask
from .report import CheckResult, _call, _Failed, _Report, _run_check


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
                verbose: bool = True) -> CheckResult:
    """Check mask builders (bool, True = do not attend); pass any subset:

    - ``padding_fn(seq, pad_idx)`` -> (N, 1, L) (an (N, L, L) or (N, 1, 1, L) mask with the
      same key pattern passes with a note),
    - ``lookahead_fn(size)`` -> (L, L), True strictly above the diagonal,
    - ``decoder_fn(tgt, pad_idx)`` -> (N, L, L) = padding OR look-ahead,
    - ``cross_fn(src, tgt, pad_idx)`` -> the cross-attention mask, which must broadcast to
      (N, L_tgt, L_src) and hide the source padding: (N, 1, L_src) is best.
    """
    src = torch.tensor([[5, 0, 7, 9, 1, 1], [4, 8, 1, 1, 1, 1], [3, 2, 6, 0, 9, 4]])
    tgt = torch.tensor([[2, 5, 6, 1], [2, 7, 1, 1], [2, 3, 4, 5]])

    def body(report: _Report):
        if not any((padding_fn, lookahead_fn, decoder_fn, cross_fn)):
            report.probe(False, "at least one mask function was passed")
            raise _Failed
        if padding_fn is not None:
            _probe_padding(report, padding_fn, src)
        if lookahead_fn is not None:
            _probe_lookahead(report, lookahead_fn)
        if decoder_fn is not None:
            _probe_decoder_mask(report, decoder_fn, tgt)
        if cross_fn is not None:
            _probe_cross_mask(report, cross_fn, src, tgt)

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


def _probe_cross_mask(report, fn, src, tgt):
    def probe():
        pad_idx = 1
        n, l_src = src.shape
        l_tgt = tgt.size(1)
        what = f"cross_fn(src (N, {l_src}), tgt (N, {l_tgt}), pad_idx=1)"
        m = _tensor_or_fail(report, _call(report, what, fn, src, tgt, pad_idx), what)
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
        if _match_mask(report, f"{what}: hides the padded source positions, broadcasts to "
                       f"{full}", b, expected, cands) and tuple(m.shape) != (n, 1, l_src):
            report.note(f"shape {tuple(m.shape)} works; (N, 1, L_src) is the usual form")
    _guard(report, probe)



