"""Notebook 10's measurement exercise: ``leak_map(model, src, tgt_in)``, which decoder inputs move
which outputs (the general case of ``sees_future``), checked on models whose reach is known:
:func:`check_leak_map`."""
from __future__ import annotations

import torch

from tx_helpers.model import Transformer

from .mistakes import MISTAKES
from .report import CheckResult, _call, _Report, _run_check

MISTAKES.update({
    "leak_map_transposed": (
        "the map is transposed: row s, column t instead of row t (the output), column s (the "
        "input changed)",
        "index the map by the position whose output you read first, then the input you changed"),
    "leak_map_cumulative": (
        "the map marks an input as read when it or any later input moves the output: the inputs "
        "after s were changed together with s",
        "change one decoder input at a time, starting again from the original target for each"),
    "leak_map_misses": (
        "the map misses inputs that do move the output",
        "compare the logits themselves, not the predicted tokens, and make sure each changed "
        "token really differs from the original"),
    "leak_map_spurious": (
        "the map marks inputs that cannot move the output",
        "compare with a threshold far above round-off, with the model in eval mode, one input "
        "changed at a time"),
})


def _masked_model(config, visible) -> Transformer:
    """A ``tx.Transformer`` whose default target mask is ``visible(L) -> (L, L)`` inverted: a
    model with a known leak (or none), for :func:`check_leak_map`. The mask is built inside
    ``forward`` and kept nowhere on the model, so a map can only be read by running it."""

    class _Masked(Transformer):
        def forward(self, src, tgt, src_mask=None, tgt_mask=None):
            if tgt_mask is None:
                tgt_mask = ~visible(tgt.size(1)).to(tgt.device)  # (L_tgt, L_tgt): True = hide
            return super().forward(src, tgt, src_mask, tgt_mask)

    _Masked.__name__ = _Masked.__qualname__ = "Transformer"
    return _Masked(config)


def _visible_within(ahead):
    """Position t may read inputs 0 .. t + ahead."""
    return lambda n: torch.ones(n, n, dtype=torch.bool).tril(ahead)


def _visible_self_and(offset):
    """Position t may read input t and input t + offset only (a leak with a hole)."""
    def visible(n):
        eye = torch.eye(n, dtype=torch.bool)
        return eye | eye.roll(offset, 1).triu(1)  # column t + offset of row t, when it exists
    return visible


_LEAK_CASES = (  # (what, n_layers, visible(L) -> (L, L) bool, what the right map shows)
    ("a correct 2-layer model", 2, _visible_within(0), "no output reads a later input"),
    ("a 1-layer model whose mask shows position t the input t + 1", 1, _visible_within(1),
     "output t reads inputs up to t + 1"),
    ("a 2-layer model with the same mask", 2, _visible_within(1),
     "output t reads inputs up to t + 2, one step per layer"),
    ("a 1-layer model whose position t reads only inputs t and t + 3", 1, _visible_self_and(3),
     "a leak with a hole: t + 1 and t + 2 do not move output t"),
    ("a 2-layer model with no look-ahead mask", 2, lambda n: torch.ones(n, n, dtype=torch.bool),
     "every output reads every input"),
)


def _reach(visible: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Which inputs reach which outputs through ``n_layers`` layers (each keeps its own input
    through the residual): the boolean matrix power of ``visible`` with the diagonal set."""
    step = visible | torch.eye(visible.size(0), dtype=torch.bool)
    out = step
    for _ in range(n_layers - 1):
        out = (out.float() @ step.float()) > 0
    return out


def check_leak_map(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(model, src, tgt_in) -> (L_tgt, L_tgt)`` bool: entry [t, s] True when changing
    only decoder input s moves the output at position t. Run on models whose reach is known: a
    correct one, look-ahead leaks of one step in one and two layers, a leak with a hole (t reads
    t and t + 3 only, which tells one input changed at a time from s and all later ones) and a
    model with no look-ahead mask. Vocabulary 16 (pad 0, <bos> 1, <eos> 2, symbols 3..15)."""
    from tx_helpers.config import ModelConfig

    def body(report: _Report):
        gen = torch.Generator().manual_seed(5)
        src = torch.randint(3, 16, (3, 7), generator=gen)  # (N, L_src)
        tgt = torch.cat([torch.ones(3, 1, dtype=torch.long),
                         torch.randint(3, 16, (3, 6), generator=gen)], dim=1)  # (N, L_tgt = 7)
        n = tgt.size(1)
        for what, n_layers, visible, shows in _LEAK_CASES:
            config = ModelConfig(src_vocab_size=16, tgt_vocab_size=16, d_model=32, n_heads=4,
                                 d_ff=64, n_layers=n_layers, dropout=0.0, pad_idx=0, max_len=32)
            torch.manual_seed(7)
            model = _masked_model(config, visible).eval()
            want = _reach(visible(n), n_layers)  # (L_tgt, L_tgt)
            with torch.enable_grad():  # a map read from gradients is as right as one from changes
                got = _call(report, f"fn(model, src, tgt_in) on {what}", fn, model, src.clone(),
                            tgt.clone())
            is_map = isinstance(got, torch.Tensor) and tuple(got.shape) == (n, n)
            if is_map and got.dtype != torch.bool:
                got = got != 0  # a 0/1 map is read as bool
            if not report.probe(is_map, f"returns an (L_tgt, L_tgt) = ({n}, {n}) map"):
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                report.mistake("wrong_output_shape", f"got {shape}")
                return
            got = got.detach().cpu().bool()
            if report.probe(torch.equal(got, want), f"{what}: the map is right ({shows})"):
                continue
            cumulative = want.flip(1).cumsum(1).flip(1) > 0  # [t, s]: any of s.. moves t
            if torch.equal(got, want.T):
                report.mistake("leak_map_transposed")
            elif torch.equal(got, cumulative):
                report.mistake("leak_map_cumulative")
            elif bool((want & ~got).any()) and not bool((got & ~want).any()):
                t, s = (want & ~got).nonzero()[0].tolist()
                report.mistake("leak_map_misses", f"{what}: input {s} moves output {t}, the map "
                               "says it does not")
            elif bool((got & ~want).any()) and not bool((want & ~got).any()):
                t, s = (got & ~want).nonzero()[0].tolist()
                report.mistake("leak_map_spurious", f"{what}: input {s} cannot reach output {t}, "
                               "the map says it does")
            else:
                report.mistake("mismatch", f"{what}: the map differs both ways")
            return

    return _run_check("check_leak_map", body, verbose, fn)
