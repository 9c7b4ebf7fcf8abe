"""check_masks' contract probes (:mod:`labkit.masks`): the ValueErrors of the contract's table
and the device a mask is built on."""
from __future__ import annotations

import inspect
import types

import torch

from tx_helpers.masks import lookahead_mask, padding_mask

from .report import _Report


def _probe_errors(report: _Report, padding_fn, lookahead_fn, cross_fn, src, tgt) -> None:
    """The ValueErrors of notebook 05's contract, for each function none of whose probes failed."""
    failed = " ".join(text for ok, text in report.probes if not ok)
    cases = []
    if padding_fn is not None and "padding_fn" not in failed:
        cases += [("padding_fn(seq of shape (6,), pad_idx=1)", "seq", padding_fn, (src[0], 1)),
                  ("padding_fn(seq of shape (3, 6, 1), pad_idx=1)", "seq", padding_fn,
                   (src[..., None], 1))]
    if lookahead_fn is not None and "lookahead_fn" not in failed:
        cases += [(f"lookahead_fn({size})", "size", lookahead_fn, (size,)) for size in (0, -2, 2.0)]
    if cross_fn is not None and "cross_fn" not in failed:
        cases.append(("cross_fn(src (3, 6), tgt (2, 4), pad_idx=1)", "tgt", cross_fn,
                      (src, tgt[:2], 1)))
    for call, name, fn, args in cases:
        what = f"{call} raises a ValueError naming {name}"
        try:
            fn(*args)
        except TypeError as exc:  # right for a float size when it names the argument
            if isinstance(args[0], float) and name in str(exc):
                report.probe(True, what + " (or a TypeError)")
                continue
            first = str(exc).splitlines()[0] if str(exc) else ""
            report.probe(False, f"{what} (it raised TypeError: {first})")
            report.mistake("mask_argument_unchecked", f"{call} raised TypeError")
            continue
        except ValueError as exc:
            msg = str(exc).splitlines()[0] if str(exc) else ""
            if not report.probe(name in str(exc), what + ("" if name in str(exc)
                                                          else f" (it says: {msg})")):
                report.mistake("mask_error_message", f"{call}: {msg}")
            continue
        except Exception as exc:  # noqa: BLE001 - the wrong error, or none checked at all
            first = str(exc).splitlines()[0] if str(exc) else ""
            report.probe(False, f"{what} (it raised {type(exc).__name__}: {first})")
            report.mistake("mask_argument_unchecked", f"{call} raised {type(exc).__name__}")
            continue
        report.probe(False, f"{what} (it returned without an error)")
        report.mistake("mask_argument_unchecked", f"{call} returned a mask")


def _device_error(exc: BaseException) -> bool:
    low = str(exc).lower()
    return "device" in low or "meta" in low


def _takes(fn, name: str) -> bool:
    """True when ``fn``'s signature has a parameter ``name`` (False when it cannot be read)."""

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _probe_device_argument(report: _Report, fn) -> None:
    """``lookahead_fn(size, device=...)`` must build the mask on that device."""
    if not _takes(fn, "device"):
        return
    what = "lookahead_fn(5, device='meta') builds the mask on that device"
    try:
        m = fn(5, device=torch.device("meta"))
    except Exception as exc:  # noqa: BLE001 - reported below
        report.probe(False, f"{what} (raised {type(exc).__name__}: "
                     f"{str(exc).splitlines()[0] if str(exc) else ''})")
        if not isinstance(exc, NotImplementedError):  # a stub: not_implemented says it all
            report.mistake("mask_device_ignored", "it raised on the meta device")
        return
    ok = isinstance(m, torch.Tensor) and m.device.type == "meta"
    if not report.probe(ok, what + ("" if ok else f" (got a mask on "
                                    f"{getattr(m, 'device', '?')})")):
        report.mistake("mask_device_ignored", "the device argument is accepted but not used")


def _probe_input_device(report: _Report, name, fn, args, required: bool) -> None:
    """A mask built from token ids should live on their device (here: ``meta``)."""
    meta = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    problem = None
    try:
        m = fn(*meta)
        if isinstance(m, torch.Tensor) and m.device.type != "meta":
            problem = f"returns a mask on {m.device} for token ids on another device"
    except Exception as exc:  # noqa: BLE001 - only device errors say anything
        if not _device_error(exc):
            return
        problem = ("builds part of the mask on a fixed device and combines it with one on the "
                   "input's device (" + str(exc).splitlines()[0][:120] + ")")
    what = f"{name} builds its mask on the device of its input"
    if problem is None:
        if required:
            report.probe(True, what)
        return
    if required:
        report.probe(False, f"{what}: it {problem}")
        report.mistake("mask_device_ignored", f"{name} {problem}")
    else:
        report.note(f"{name} {problem}; on a GPU this fails. Build every part on the input's "
                    "device: lookahead_mask(L, device=tgt.device)")


def parts_replaced(report: _Report, fn, tgt):
    """``fn`` (a decoder mask) with the learner's own padding or look-ahead helpers that it
    calls replaced by tx's where they are wrong, so that such a mistake is charged once, at its
    own probes (notebook 11's ``decoder_mask_from_memory`` calls ``padding_mask_from_memory``).
    A helper is recognised by its name ("pad"; "ahead", "causal", "subsequent")."""
    from .delegation import _is_tx

    if not isinstance(fn, types.FunctionType):
        return fn
    scope, swapped = fn.__globals__, {}
    for name in fn.__code__.co_names:
        value, low = scope.get(name), name.lower()
        if not isinstance(value, types.FunctionType) or value is fn or _is_tx(value):
            continue
        ref, args = ((padding_mask, (tgt, 1)) if "pad" in low else (lookahead_mask, (
            tgt.size(1),)) if any(w in low for w in ("ahead", "causal", "subsequent"))
            else (None, ()))
        try:
            same = ref is None or torch.equal(value(*args), ref(*args))
        except Exception:  # noqa: BLE001 - a helper that fails is wrong too
            same = False
        if not same:
            swapped[name] = ref
    if not swapped:
        return fn
    report.note(f"decoder_fn calls {', '.join(sorted(swapped))}, which differs from tx's: "
                "graded with tx's in its place, so that mistake counts once, at its own probes")
    new = types.FunctionType(fn.__code__, {**scope, **swapped}, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new
