"""Comparing a learner's output with the reference and with known wrong variants."""
from __future__ import annotations

import inspect
import itertools

import torch
from torch import nn

from .report import _call, _Failed, _Report

ATOL = 1e-4
RTOL = 1e-3
_MAX_COMBINED = 2  # wrong variants are tried alone and in pairs



def _as_output(report: _Report, out, what: str = "output"):
    """Accept a tensor or an (output, weights) tuple; anything else fails the probe."""
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        report.probe(False, f"{what} is a torch.Tensor (got {type(out).__name__})")
        report.mistake("wrong_output_type")
        raise _Failed
    return out


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def _close(a, b, atol: float = ATOL) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and bool(torch.isfinite(a).all())
            and torch.allclose(a.detach().double(), b.detach().double(), atol=atol, rtol=RTOL))


def _variants(axes: dict[str, list], fn, max_mistakes: int = _MAX_COMBINED):
    """Yield (mistake keys, output) for wrong combinations, fewest mistakes first.

    ``axes`` maps an argument of ``fn`` to its options; the first option of each
    axis is the correct one. Each wrong option is ``(mistake_key, value)``.
    """
    names = list(axes)
    wrong = {n: axes[n][1:] for n in names}
    for count in range(1, max_mistakes + 1):
        for chosen in itertools.combinations(names, count):
            for opts in itertools.product(*(wrong[n] for n in chosen)):
                kwargs = {n: axes[n][0] for n in names}
                kwargs.update({n: o[1] for n, o in zip(chosen, opts, strict=True)})
                try:
                    out = fn(**kwargs)
                except Exception:  # noqa: BLE001 - a variant may not fit these shapes
                    continue
                yield tuple(dict.fromkeys(o[0] for o in opts)), out


def _diagnose(report: _Report, out, axes, fn, expected, loose=None) -> bool:
    """Name the first variant ``out`` matches; else report a plain mismatch. Returns matched.

    ``loose`` (a slicing function) compares only that part, with a looser tolerance: for
    tables whose far entries are sines of huge angles, where float32 rounding differs.
    """
    for keys, variant in _variants(axes, fn):
        if (_close(loose(out), loose(variant), atol=5e-3) if loose is not None
                and isinstance(out, torch.Tensor) and out.shape == variant.shape
                else _close(out, variant)):
            for key in keys:
                report.mistake(key)
            return True
    if isinstance(out, torch.Tensor) and out.shape == expected.shape:
        if not bool(torch.isfinite(out).all()):
            report.mistake("nan_output")
        else:
            report.mistake("mismatch", f"max abs diff {_max_diff(out, expected):.4g}")
    return False


def _compare(report: _Report, what: str, out, expected, axes=None, fn=None, loose=None) -> bool:
    """Probe shape, then values; on a value mismatch try to name the mistake."""
    if tuple(out.shape) != tuple(expected.shape):
        report.probe(False, f"{what}: shape {tuple(out.shape)}, expected "
                     f"{tuple(expected.shape)}")
        if axes is not None and _diagnose(report, out, axes, fn, expected, loose):
            return False
        report.mistake("wrong_output_shape", f"got {tuple(out.shape)}, expected "
                       f"{tuple(expected.shape)}")
        return False
    if _close(out, expected):
        return report.probe(True, what)
    report.probe(False, f"{what} (max abs diff {_max_diff(out, expected):.3g})")
    if axes is not None:
        _diagnose(report, out, axes, fn, expected, loose)
    elif not bool(torch.isfinite(out).all()):
        report.mistake("nan_output")
    else:
        report.mistake("mismatch", f"max abs diff {_max_diff(out, expected):.4g}")
    return False


def _both_kinds_mask(shape, gen) -> torch.Tensor:
    """A random bool mask where every row and every column has both True and False."""
    while True:
        m = torch.rand(shape, generator=gen) < 0.4
        rows_ok = m.any(-1).all() and (~m).any(-1).all()
        cols_ok = m.any(-2).all() and (~m).any(-2).all()
        if rows_ok and cols_ok:
            return m


_ROLE_NAMES = {  # the usual parameter names for each constructor argument a check passes
    "d_model": ("d_model", "dim", "embed_dim", "d_embed", "model_dim", "n_embd", "emb_dim",
                "embedding_dim", "hidden_size", "size", "d_hid", "num_hiddens", "features",
                "d_emb", "dmodel"),
    "n_heads": ("n_heads", "num_heads", "h", "heads", "n_head", "nhead", "nheads", "head",
                "num_head", "n_h"),
    "d_ff": ("d_ff", "dim_feedforward", "d_hidden", "ff_dim", "d_inner", "hidden_dim", "dff",
             "ffn_dim", "d_ffn", "hidden", "ffn_hidden", "pf_dim", "inner_dim", "dim_ff",
             "ffn_num_hiddens", "middle_dim"),
    "dropout": ("dropout", "p", "drop", "dropout_rate", "p_drop", "dropout_p", "drop_prob",
                "dropout_prob", "attn_dropout", "rate", "pdrop"),
    "max_len": ("max_len", "max_seq_len", "max_length", "seq_len", "max_positions",
                "n_position", "length", "maxlen", "max_seq_length", "n_positions",
                "max_sequence_length", "position"),
}


def _by_name(cls, roles: tuple, args: tuple) -> dict | None:
    """Keyword arguments for ``cls`` when every role is one of its parameter names."""

    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    kwargs = {}
    for role, value in zip(roles, args, strict=True):
        name = next((n for n in _ROLE_NAMES.get(role, (role,)) if n in params), None)
        if name is None:
            if role in ("dropout", "max_len"):  # optional: the class may not take it
                continue
            return None
        kwargs[name] = value
    return kwargs


def _instantiate(report: _Report, cls, args: tuple, signature: str, roles: tuple = ()):
    """Build ``cls(*args)``; with ``roles`` (what each argument is), a class whose parameters
    come in another order or under other usual names (``h, d_model``; ``d_model, dropout,
    max_len``) is built by keyword, and one that fails positionally is tried by keyword."""
    if isinstance(cls, nn.Module):
        report.probe(False, f"got an instance of {type(cls).__name__}, expected the class")
        report.mistake("not_a_class")
        raise _Failed
    kwargs = _by_name(cls, roles, args) if roles else None

    try:
        names = list(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        names = []
    same_order = kwargs is not None and list(kwargs) == names[: len(kwargs)]
    attempts = [("kw", kwargs)] if kwargs is not None and not same_order else []
    attempts.append(("pos", args))
    if kwargs is not None and same_order:
        attempts.append(("kw", kwargs))
    module, used = None, None
    for kind, value in attempts:
        try:
            module = cls(**value) if kind == "kw" else cls(*value)
            used = kind
            break
        except Exception:  # noqa: BLE001 - the exercise's own form reports its error below
            continue
    if used is None:
        module = _call(report, signature, cls, *args)
    if not isinstance(module, nn.Module):
        report.probe(False, f"{signature} builds an nn.Module (got {type(module).__name__})")
        raise _Failed
    if used == "kw" and not same_order:
        report.note("built by keyword: " + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()))
    report.probe(True, f"{signature} builds an nn.Module")
    module.eval()
    return module


def _randomize_norms(module: nn.Module, gen) -> None:
    """LayerNorms start as the identity; random gains tell norm1 from norm2 in the probes."""
    for m in module.modules():
        if isinstance(m, nn.LayerNorm) and m.weight is not None:
            m.weight.copy_(1.0 + 0.3 * torch.randn(m.weight.shape, generator=gen))
            m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=gen))


def _deterministic(report: _Report, run, first: torch.Tensor) -> None:
    """A second identical call must give the same numbers; otherwise nothing can be compared."""
    try:
        second = run()
    except Exception:  # noqa: BLE001 - the first call worked; the probes report the rest
        return
    second = second[0] if isinstance(second, (tuple, list)) and second else second
    if not isinstance(second, torch.Tensor) or first.shape != second.shape:
        return
    same_nans = torch.equal(first.isnan(), second.isnan())
    if same_nans and _close(first.nan_to_num(), second.nan_to_num()):
        return
    report.probe(False, "two identical calls in eval mode give the same output")
    report.mistake("dropout_in_eval")
    raise _Failed


def dropout_stand_in(t: torch.Tensor) -> torch.Tensor:
    """What a train-mode probe's dropout returns instead of a random mask: elementwise (the
    same whatever the learner's layout), smooth and nonlinear (dropout(a + b), dropout(a) + b
    and a + dropout(b) all differ)."""
    return 2.0 * t * t


def run_with_stand_in_dropout(module: nn.Module, call):
    """``call()`` with ``module`` in train mode and every nn.Dropout in it returning
    :func:`dropout_stand_in` of its input, so no random numbers are compared.

    Returns (output, the inputs the dropouts received, whether train mode changed the output
    when no nn.Dropout ran: a forward that uses ``F.dropout``). The module's mode and the
    caller's random state are left as they were."""
    seen: list[torch.Tensor] = []

    def hook(_mod, inputs, _out):
        seen.append(inputs[0].detach().clone())
        return dropout_stand_in(inputs[0])

    was_training = module.training
    handles = [m.register_forward_hook(hook) for m in module.modules()
               if isinstance(m, nn.Dropout)]
    changed = False
    try:
        module.train()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = call()
            if not seen:  # no nn.Dropout called: does train mode change anything at all?
                module.eval()
                changed = not _close(out, call())
    finally:
        for handle in handles:
            handle.remove()
        module.train(was_training)
    return out, seen, changed
