"""Notebook 05's cross-attention mask lab, graded by labkit.check_masks(cross_fn=...).

Correct masks written independently of tx (every shape that broadcasts to (N, L_tgt, L_src))
pass; each usual mistake is named; the notebook's own solution passes and keeps its contract
(the errors name the argument, what it got and what was expected).
"""
import json
from pathlib import Path

import pytest
import torch

import labkit

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05_masks.ipynb"


def quiet(**kwargs):
    return labkit.check_masks(**kwargs, verbose=False)


def full_by_repeat(src, tgt, pad_idx):
    return (src == pad_idx)[:, None, :].repeat(1, tgt.size(1), 1)  # (N, L_tgt, L_src), a copy


def thin_by_view(src, tgt, pad_idx):
    return src.eq(pad_idx).view(src.size(0), 1, src.size(1))  # (N, 1, L_src)


def four_d(src, tgt, pad_idx):
    return (src == pad_idx)[:, None, None, :]  # (N, 1, 1, L_src)


def full_by_or(src, tgt, pad_idx):
    empty = torch.zeros(src.size(0), tgt.size(1), src.size(1), dtype=torch.bool, device=src.device)
    return torch.logical_or(empty, (src == pad_idx).unsqueeze(-2))  # (N, L_tgt, L_src)


@pytest.mark.parametrize("fn", [full_by_repeat, thin_by_view, four_d, full_by_or])
def test_correct_cross_masks_pass(fn):
    result = quiet(cross_fn=fn)
    assert result.passed, result.report


def built_on_cpu(src, tgt, pad_idx):
    key = torch.zeros(src.shape, dtype=torch.bool)  # the CPU by default, whatever src's device
    key[src.cpu() == pad_idx] = True
    return key[:, None, :].expand(-1, tgt.size(1), -1)


@pytest.mark.parametrize("fn, key", [
    (lambda s, t, p: (s == p)[:, None, :].expand(-1, s.size(1), -1), "cross_mask_shape"),
    (lambda s, t, p: (t == p)[:, None, :], "cross_mask_uses_tgt"),
    (lambda s, t, p: (s == p)[:, None, :]
     | torch.ones(t.size(1), s.size(1), dtype=torch.bool).triu(1), "cross_mask_lookahead"),
    (lambda s, t, p: (s != p)[:, None, :].expand(-1, t.size(1), -1), "mask_inverted"),
    (lambda s, t, p: (s == p)[:, None, :].float() * -1e9, "mask_not_bool"),
])
def test_cross_mask_mistakes_are_named(fn, key):
    result = quiet(cross_fn=fn)
    assert not result.passed and key in result.mistakes, result.report


def test_a_cross_mask_built_off_the_inputs_device_is_named_when_devices_are_graded():
    assert quiet(cross_fn=built_on_cpu).passed  # a note only, by default
    result = labkit.check_masks(cross_fn=built_on_cpu, devices=True, verbose=False)
    assert not result.passed and "mask_device_ignored" in result.mistakes, result.report


def _notebook_masks():
    """The solved notebook's four mask functions, run from its own cells."""
    namespace = {"torch": torch}
    names = ("def padding_mask(", "def lookahead_mask(", "def decoder_self_mask(",
             "def cross_attention_mask(")
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith(names):
            exec(source, namespace)  # noqa: S102 - the project's own notebook
    assert all(n[4:-1] in namespace for n in names), "a mask exercise is missing from 05"
    return namespace


def test_the_notebooks_solution_passes_and_keeps_its_contract():
    ns = _notebook_masks()
    result = labkit.check_masks(ns["padding_mask"], ns["lookahead_mask"], ns["decoder_self_mask"],
                                ns["cross_attention_mask"], devices=True, full_contract=True,
                                verbose=False)
    assert result.passed, result.report
    assert not result.messages[-1].startswith("Note"), result.report  # the asked-for form
    src = torch.tensor([[4, 5, 1], [6, 1, 1]])  # (N=2, L_src=3)
    tgt = torch.tensor([[2, 7, 8, 1], [2, 9, 1, 1]])  # (N=2, L_tgt=4)
    mask = ns["cross_attention_mask"](src, tgt, 1)
    assert mask.shape == (2, 4, 3) and torch.equal(mask, (src == 1)[:, None, :].expand(2, 4, 3))
    cases = ((lambda: ns["cross_attention_mask"](src, tgt[:1], 1), ("tgt", "(1, 4)", "2")),
             (lambda: ns["padding_mask"](src[0], 1), ("seq", "(3,)", "(N, L)")),
             (lambda: ns["lookahead_mask"](0), ("size", "positive", "0")))
    for call, words in cases:
        with pytest.raises(ValueError) as err:
            call()
        assert all(w in str(err.value) for w in words), str(err.value)


# The look-ahead exercise takes notebook 09's cache offset: lookahead_fn(size, past=P) is
# (size, P + size), query i at position P + i. Written here independently of tx and of the
# notebook's triu solution.
def lookahead_by_positions(size, device=None, *, past=0):
    queries = torch.arange(past, past + size, device=device)[:, None]  # (size, 1)
    keys = torch.arange(past + size, device=device)[None, :]  # (1, past + size)
    return keys > queries  # (size, past + size)


def lookahead_by_cat(size, device=None, past=0):
    square = torch.ones(size, size, dtype=torch.bool, device=device).triu(1)
    return torch.cat([torch.zeros(size, past, dtype=torch.bool, device=device), square], dim=1)


def lookahead_without_past(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).triu(1)


@pytest.mark.parametrize("fn", [lookahead_by_positions, lookahead_by_cat, lookahead_without_past])
def test_correct_lookahead_masks_pass(fn):
    result = quiet(lookahead_fn=fn)
    assert result.passed, result.report


def _ones(size, past, device):
    return torch.ones(size, past + size, dtype=torch.bool, device=device)


@pytest.mark.parametrize("fn, key", [
    (lambda size, device=None, *, past=0: _ones(size, past, device).triu(1), "mask_rows_wrong"),
    (lambda size, device=None, *, past=0: _ones(size, 0, device).triu(1), "wrong_output_shape"),
    (lambda size, device=None, *, past=0: _ones(size, past, device).triu(past),
     "mask_rows_wrong"),
    (lambda size, device=None, *, past=0: ~lookahead_by_positions(size, device, past=past),
     "mask_inverted"),
    (lambda size, device=None, *, past=0: _ones(past + size, 0, device).triu(1),
     "wrong_output_shape"),
])
def test_lookahead_past_mistakes_are_named(fn, key):
    result = quiet(lookahead_fn=fn)
    assert not result.passed and key in result.mistakes, result.report


def test_the_notebooks_lookahead_mask_takes_the_cache_offset():
    ns = _notebook_masks()
    for size, past in ((1, 0), (3, 2), (2, 5)):
        assert torch.equal(ns["lookahead_mask"](size, past=past),
                           lookahead_by_positions(size, past=past))


# full_contract=True grades the ValueErrors of notebook 05's table. Written here independently
# of tx and of the notebook (other checks, other messages): each passes; without the checks, or
# with a message that does not name the argument, the check names the mistake.
def padding_checked(seq, pad_idx):
    if len(seq.shape) != 2:
        raise ValueError(f"expected seq with 2 axes (batch, length), got {seq.ndim}")
    return (seq == pad_idx)[:, None]  # (N, 1, L)


def lookahead_checked(size, device=None, *, past=0):
    if type(size) is not int or size <= 0:
        raise ValueError(f"bad size {size}: need an int of at least 1")
    return lookahead_by_positions(size, device, past=past)


def cross_checked(src, tgt, pad_idx):
    n_src, n_tgt = len(src), len(tgt)
    if n_src != n_tgt:
        raise ValueError(f"{n_src} source sentences but tgt has {n_tgt}")
    return full_by_repeat(src, tgt, pad_idx)


def test_correct_masks_with_their_errors_pass_the_full_contract():
    result = labkit.check_masks(padding_checked, lookahead_checked, None, cross_checked,
                                full_contract=True, verbose=False)
    assert result.passed, result.report
    assert sum("raises a ValueError" in m for m in result.messages) == 6, result.report
    assert not any(m.startswith("Note") for m in result.messages), result.report


def test_masks_without_their_errors_pass_unless_the_full_contract_is_graded():
    plain = dict(padding_fn=lambda s, p: (s == p)[:, None], lookahead_fn=lookahead_by_positions,
                 cross_fn=full_by_repeat)
    assert quiet(**plain).passed
    result = labkit.check_masks(**plain, full_contract=True, verbose=False)
    assert not result.passed and result.mistakes == ["mask_argument_unchecked"], result.report
    assert sum("✗" in m and "ValueError" in m for m in result.messages) == 6, result.report


@pytest.mark.parametrize("kwargs", [
    dict(padding_fn=lambda s, p: padding_checked(s, p) if s.dim() == 2 else 1 / 0),
    dict(lookahead_fn=lambda size, device=None, *, past=0: lookahead_by_positions(size, device,
                                                                                  past=past)),
])
def test_the_wrong_error_or_none_is_named(kwargs):
    result = labkit.check_masks(**kwargs, full_contract=True, verbose=False)
    assert not result.passed and "mask_argument_unchecked" in result.mistakes, result.report


def lookahead_range_only(size, device=None, *, past=0):
    """Refuses sizes below 1 but lets a float through (a cold reader's case): torch then
    raises its own TypeError, which names no argument of the contract."""
    if size < 1:
        raise ValueError(f"size must be a positive int; got {size!r}")
    return torch.ones(size, past + size, dtype=torch.bool, device=device).triu(past + 1)


def lookahead_type_error(size, device=None, *, past=0):
    """Correct too: a float size refused with a TypeError naming size."""
    if not isinstance(size, int):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    return lookahead_checked(size, device, past=past)


def test_a_float_size_must_be_refused_naming_size():
    result = labkit.check_masks(lookahead_fn=lookahead_range_only, full_contract=True,
                                verbose=False)
    assert not result.passed and "mask_argument_unchecked" in result.mistakes, result.report
    assert any("✗ lookahead_fn(2.0)" in m for m in result.messages), result.report
    assert labkit.check_masks(lookahead_fn=lookahead_type_error, full_contract=True,
                              verbose=False).passed


def test_an_error_that_does_not_name_the_argument_is_named():
    def cross_vague(src, tgt, pad_idx):
        if src.size(0) != tgt.size(0):
            raise ValueError("batch sizes differ")
        return full_by_repeat(src, tgt, pad_idx)

    result = labkit.check_masks(cross_fn=cross_vague, full_contract=True, verbose=False)
    assert not result.passed and result.mistakes == ["mask_error_message"], result.report


def test_error_probes_wait_for_a_wrong_mask_to_be_fixed():
    result = labkit.check_masks(cross_fn=lambda s, t, p: (s != p)[:, None, :], full_contract=True,
                                verbose=False)
    assert result.mistakes == ["mask_inverted"], result.report
    assert not any("raises a ValueError" in m for m in result.messages), result.report


@pytest.mark.parametrize("fn", [full_by_repeat, full_by_or])
def test_the_explicit_cross_mask_gets_no_note(fn):
    result = quiet(cross_fn=fn)
    assert result.passed and not any(m.startswith("Note") for m in result.messages), result.report


# The decoder exercise takes the cache offset too: decoder_fn(tgt, pad_idx, past=P) gets the
# ids (N, P + L) of the cached and the new positions and returns (N, L, P + L). Written here
# independently of tx and of the notebook's solution (which ORs its own two masks).
def decoder_by_positions(tgt, pad_idx, *, past=0):
    total = tgt.size(1)
    queries = torch.arange(past, total, device=tgt.device)[:, None]  # (L, 1): positions
    keys = torch.arange(total, device=tgt.device)[None, :]  # (1, P + L)
    return (keys > queries)[None] | tgt.eq(pad_idx)[:, None, :]  # (N, L, P + L)


def decoder_square_then_rows(tgt, pad_idx, past=0):
    total = tgt.size(1)
    square = torch.ones(total, total, dtype=torch.bool, device=tgt.device).triu(1)
    full = torch.logical_or(square, (tgt == pad_idx).unsqueeze(1))  # (N, P + L, P + L)
    return full[:, past:, :]  # the rows of the new queries


def decoder_without_past(tgt, pad_idx):
    return decoder_by_positions(tgt, pad_idx)


@pytest.mark.parametrize("fn", [decoder_by_positions, decoder_square_then_rows,
                                decoder_without_past])
def test_correct_decoder_masks_with_past_pass(fn):
    result = quiet(decoder_fn=fn)
    assert result.passed, result.report
    if fn is not decoder_without_past:
        assert any("past=4" in m for m in result.messages), result.report


def _square(tgt, pad_idx):
    return decoder_by_positions(tgt, pad_idx)  # (N, P + L, P + L)


@pytest.mark.parametrize("fn, key", [
    (lambda t, p, *, past=0: _square(t, p)[:, :t.size(1) - past], "decoder_past_rows_first"),
    (lambda t, p, *, past=0: _square(t, p), "wrong_output_shape"),
    (lambda t, p, *, past=0: _square(t[:, past:], p), "decoder_past_keys_dropped"),
    (lambda t, p, *, past=0: decoder_by_positions(torch.full_like(t, p + 1), p, past=past),
     "decoder_mask_no_padding"),
    (lambda t, p, *, past=0: t.eq(p)[:, None, :].expand(-1, t.size(1) - past, -1),
     "decoder_mask_no_lookahead"),
    (lambda t, p, *, past=0: ~decoder_by_positions(t, p, past=past), "mask_inverted"),
    (lambda t, p, *, past=0: decoder_by_positions(t, p, past=past)
     & decoder_by_positions(torch.full_like(t, p + 1), p, past=past) & t.eq(p)[:, None, :],
     "decoder_mask_and"),
])
def test_decoder_past_mistakes_are_named(fn, key):
    result = quiet(decoder_fn=fn)
    assert not result.passed and key in result.mistakes, result.report


# Notebook 05's table accepts both forms that broadcast correctly against the cross-attention
# scores (N, H, L_tgt, L_src): the key row shared by every query, (N, 1, L_src) (tx's own), and
# one row per target query, (N, L_tgt, L_src). With full_contract=True the check also uses the
# mask in attention and proves weight 0 on every source pad. A head axis is outside the contract.
@pytest.mark.parametrize("fn", [thin_by_view, lambda s, t, p: labkit_tx_padding(s, p),
                                full_by_repeat, full_by_or])
def test_the_full_contract_accepts_both_cross_mask_shapes(fn):
    result = labkit.check_masks(cross_fn=fn, full_contract=True, verbose=False)
    assert not result.passed and result.mistakes == ["mask_argument_unchecked"], result.report
    assert any("in attention on scores" in m and "✓" in m for m in result.messages), result.report
    assert any("a shape of the contract" in m and "✓" in m for m in result.messages), result.report


def test_the_full_contract_refuses_a_head_axis_in_the_cross_mask():
    result = labkit.check_masks(cross_fn=four_d, full_contract=True, verbose=False)
    assert not result.passed and "wrong_output_shape" in result.mistakes, result.report
    assert any("a shape of the contract" in m and "(3, 1, 1, 6)" in m for m in result.messages)


def test_a_cross_mask_that_leaks_in_attention_fails_the_full_contract():
    def keeps_last_pad_visible(src, tgt, pad_idx):  # broadcasts, but one pad stays visible
        if src.size(0) != tgt.size(0):
            raise ValueError(f"tgt has {tgt.size(0)} sentences, src has {src.size(0)}")
        m = (src == pad_idx)[:, None, :].clone()
        m[0, 0, -1] = False
        return m

    result = labkit.check_masks(cross_fn=keeps_last_pad_visible, full_contract=True, verbose=False)
    assert not result.passed, result.report


def labkit_tx_padding(src, pad_idx):
    import tx_helpers as tx
    return tx.padding_mask(src, pad_idx)  # (N, 1, L_src): tx's own cross-attention mask


def cross_checked_by_or(src, tgt, pad_idx):
    if src.size(0) != tgt.size(0):
        raise ValueError(f"tgt has {tgt.size(0)} sentences, src has {src.size(0)}")
    return full_by_or(src, tgt, pad_idx)


def cross_thin_checked(src, tgt, pad_idx):
    if tgt.size(0) != src.size(0):
        raise ValueError(f"tgt must have src's {src.size(0)} sentences; got {tgt.size(0)}")
    return thin_by_view(src, tgt, pad_idx)


@pytest.mark.parametrize("fn", [cross_checked, cross_checked_by_or, cross_thin_checked])
def test_explicit_cross_masks_pass_the_full_contract_on_any_device(fn):
    result = labkit.check_masks(cross_fn=fn, full_contract=True, devices=True, verbose=False)
    assert result.passed, result.report
    assert any("builds its mask on the device of its input" in m for m in result.messages)
