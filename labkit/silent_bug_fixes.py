"""The checks of the fixes in notebook 10's lab: the suspects' repaired attention weights, the
shifted targets and the re-initialised embeddings (the suspects themselves, and the graded
diagnosis, are in :mod:`labkit.silent_bugs`)."""
from __future__ import annotations

import torch

from tx_helpers import attention as _attention
from tx_helpers.model import Transformer

from .mistakes import MISTAKES
from .report import CheckResult, _call, _Report, _run_check
from .silent_bugs import _colleague_core, _colleague_init, _default_config, _entropy

MISTAKES.update({
    "shift_unshifted": (
        "the decoder input and the labels are the same slice of the target, so the decoder "
        "reads the token it must predict",
        "the decoder input starts with the start token and stops one short of the end; the "
        "labels are the same sequence one step later"),
    "shift_reversed": (
        "the shift goes the wrong way: the decoder input is the later slice",
        "the labels are the later slice: the decoder predicts each next token"),
    "shift_wrong_length": (
        "the decoder input and the labels do not both have one position fewer than the target",
        "each of the two drops exactly one token of the full target"),
    "repair_row_nan": (
        "the row with no visible key is NaN: its weights are all 0, and dividing by their sum "
        "is 0 / 0",
        "a row with no visible key has nothing to renormalise: give it what tx's finite fill "
        "gives, uniform weights over the keys"),
    "init_embeddings_unit": (
        "the embedding tables still have a standard deviation near 1, so the scaled embeddings "
        "dwarf the positions and the attention starts much peakier than a correct model's",
        "give the tables a scale that shrinks with the model width, as the weight matrices have"),
    "init_embeddings_other": (
        "the embedding tables do not have a width-dependent scale (their standard deviation is "
        "far from the expected one)",
        "the tables' standard deviation should be about the inverse square root of the width"),
    "init_touches_other_weights": (
        "the function changed weights other than the two embedding tables",
        "re-initialise only the encoder's and the decoder's embedding tables"),
})

def check_repaired_weights(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(weights, mask) -> weights``: the weights the padding test's suspect returns,
    turned into the weights a correct masked attention gives (``tx.scaled_dot_product_attention``):
    0 where ``mask`` is True, each row with a visible key summing to 1, a row with no visible key
    uniform over the keys (the finite fill)."""

    def body(report: _Report):
        gen = torch.Generator().manual_seed(3)
        n, h, l_q, l_k, d_k = 2, 3, 4, 6, 8
        q = torch.randn(n, h, l_q, d_k, generator=gen)  # (N, H, L_q, d_k)
        k, v = (torch.randn(n, h, l_k, d_k, generator=gen) for _ in range(2))  # (N, H, L_k, d_k)
        mask = torch.zeros(n, 1, 1, l_k, dtype=torch.bool)  # (N, 1, 1, L_k): key padding
        mask[0, ..., 4:] = True
        mask[1, ..., 1:] = True
        mask = mask.expand(n, 1, l_q, l_k).clone()  # (N, 1, L_q, L_k)
        mask[1, 0, 2] = True  # query 2 of sequence 1 sees no key at all
        _, late = _colleague_core(q, k, v, mask)  # (N, H, L_q, L_k): the colleague's weights
        _, want = _attention.scaled_dot_product_attention(q, k, v, mask)
        got = _call(report, "fn(weights, mask)", fn, late.clone(), mask.clone())
        if not report.probe(isinstance(got, torch.Tensor) and got.shape == want.shape,
                            f"returns the weights, shape (N, H, L_q, L_k) = {tuple(want.shape)}"):
            report.mistake("wrong_output_shape", f"expected {tuple(want.shape)}")
            return
        full = mask.expand_as(want).all(-1)  # (N, H, L_q): rows with no visible key
        seen = ~full
        close = torch.allclose(got[seen], want[seen], atol=1e-6)
        if not report.probe(close, "rows with a visible key: masked keys 0, the rest sum to 1, "
                            "equal to a correct masked attention's"):
            sums = got[seen].sum(-1)
            if torch.allclose(got[seen], late[seen]) or bool((sums < 1 - 1e-4).any()):
                report.mistake("mask_after_softmax", "the rows with padded keys still sum to "
                               "less than 1")
            else:
                report.mistake("mismatch", "rows with a visible key differ from a correct "
                               "masked attention's")
        row = got[full]  # (rows, L_k)
        if report.probe(torch.allclose(row, torch.full_like(row, 1 / l_k)),
                        f"a query with no visible key: uniform weights 1/L_k = 1/{l_k}, finite, "
                        "as tx's finite fill gives"):
            return
        if not bool(torch.isfinite(row).all()):
            report.mistake("repair_row_nan")
        elif bool((row == 0).all()):
            report.mistake("mask_row_zeroed", "the row with no visible key is all zeros")
        else:
            report.mistake("mismatch", "the row with no visible key is not uniform")

    return _run_check("check_repaired_weights", body, verbose, fn)


def check_shift_targets(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(tgt) -> (tgt_in, tgt_out)`` for full targets ``<bos> y <eos>`` (N, L + 2)."""

    def body(report: _Report):
        for n, length in ((2, 5), (3, 1)):
            tgt = torch.cat([torch.ones(n, 1, dtype=torch.long),
                             torch.arange(3, 3 + n * length).view(n, length),
                             torch.full((n, 1), 2)], dim=1)  # (N, L + 2)
            out = _call(report, f"fn(tgt) on a ({n}, {length + 2}) target", fn, tgt.clone())
            ok = isinstance(out, tuple) and len(out) == 2
            want_in, want_out = tgt[:, :-1], tgt[:, 1:]
            if ok and torch.equal(out[0], want_in) and torch.equal(out[1], want_out):
                report.probe(True, f"({n}, {length + 2}) target: tgt_in is <bos> + y, tgt_out "
                             "is y + <eos>")
                continue
            report.probe(False, f"({n}, {length + 2}) target: tgt_in and tgt_out differ from "
                         "the shifted pair")
            if not ok or any(not isinstance(t, torch.Tensor) or t.shape != want_in.shape
                             for t in out):
                report.mistake("shift_wrong_length")
            elif torch.equal(out[0], out[1]):
                report.mistake("shift_unshifted")
            elif torch.equal(out[0], want_out) and torch.equal(out[1], want_in):
                report.mistake("shift_reversed")
            else:
                report.mistake("mismatch")
            return

    return _run_check("check_shift_targets", body, verbose, fn)


def check_init_embeddings(fn, *, config=None, verbose: bool = True) -> CheckResult:
    """Check ``fn(model)``: the two embedding tables re-initialised to a standard deviation
    within a factor of 2 of ``d_model ** -0.5`` (10% more for a sample's noise), nothing else."""
    config = config or _default_config()

    def body(report: _Report):
        torch.manual_seed(0)
        reference = Transformer(config).eval()
        model = Transformer(config).eval()
        model.load_state_dict(reference.state_dict())
        _colleague_init(model)  # the learner's function starts from the colleague's tables
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        _call(report, "fn(model)", fn, model)
        tables = {n for n in start if n.endswith("embedding.weight")}
        others = [n for n, p in model.named_parameters()
                  if n not in tables and not torch.equal(p, start[n])]
        stds = {n: p.std().item() for n, p in model.named_parameters() if n in tables}
        want = config.d_model ** -0.5
        good = all(0.45 * want <= s <= 2.2 * want for s in stds.values())
        if not report.probe(good, f"both embedding tables have a standard deviation within a "
                            f"factor of 2 of d_model^-0.5 = {want:.2f}"):
            unit = any(s > 0.6 for s in stds.values())
            report.mistake("init_embeddings_unit" if unit else "init_embeddings_other",
                           ", ".join(f"{n}: {s:.2f}" for n, s in sorted(stds.items())))
        src = torch.randint(3, config.src_vocab_size, (8, 8), generator=torch.Generator()
                            .manual_seed(1))  # (N, L)
        got, ref = _entropy(model, src), _entropy(reference, src)
        report.probe(got >= 0.75 * ref, "the attention entropy at initialisation is close to "
                     "tx's own model's")
        if others:
            report.probe(False, "no other parameter changed")
            report.mistake("init_touches_other_weights", ", ".join(others[:3]))
        _other_width_probe(report, fn, config)

    return _run_check("check_init_embeddings", body, verbose, fn)


def _other_width_probe(report: _Report, fn, config) -> None:
    """A second width, 16 times d_model: a scale typed for one width (0.18 for 32) fails, since
    the probe allows a factor of 2 either way and the right scale moves by a factor of 4."""
    import dataclasses

    wide = dataclasses.replace(config, d_model=16 * config.d_model, n_layers=1)
    torch.manual_seed(1)
    model = Transformer(wide).eval()
    _colleague_init(model)
    _call(report, f"fn(model) with d_model = {wide.d_model}", fn, model)
    want = wide.d_model ** -0.5
    stds = [getattr(model, part).embedding.weight.std().item() for part in ("encoder", "decoder")]
    if not report.probe(all(0.45 * want <= s <= 2.2 * want for s in stds),
                        f"at d_model = {wide.d_model} too, within a factor of 2 of "
                        f"d_model^-0.5 = {want:.3f} (the scale follows the width)"):
        report.mistake("init_embeddings_other", f"at d_model = {wide.d_model}: "
                       + ", ".join(f"{s:.3f}" for s in stds) + "; a scale typed for one width?")
