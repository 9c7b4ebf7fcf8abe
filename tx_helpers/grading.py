"""Diagnostic checks for the exercises: each one names the learner's likely mistake.

Call a check from a notebook cell with your own class or function::

    tx.grading.check_multi_head_attention(MultiHeadAttention)

It prints a short report (one line per probe, then a diagnosis and a hint) and
returns a :class:`CheckResult` with ``.passed``, ``.messages`` and ``.mistakes``
(stable keys from :data:`MISTAKES`). A check never raises because of the
learner's code: exceptions are caught and explained.

How mistakes are named: besides comparing with the verified ``tx_helpers``
reference, each check computes the outputs of known wrong variants (no scaling,
softmax over the wrong axis, Pre-LN instead of Post-LN, ...) on the same inputs
and weights, alone and in pairs, and reports the variant the learner's output
matches. Targeted probes (perturbing ``w_o``, changing a future token) find the
rest. Checks run on the CPU under a forked RNG, so they leave the notebook's
random state untouched.
"""
from __future__ import annotations

import itertools
import math
import os
import traceback
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .attention import MultiHeadAttention
from .config import ModelConfig
from .layers import DecoderLayer, EncoderLayer, FeedForward
from .masks import decoder_self_mask, lookahead_mask, padding_mask
from .model import Transformer
from .positional import sinusoidal_table
from .training import noam_scheduler

__all__ = [
    "CheckResult", "MISTAKES", "history", "clear_history",
    "check_positional_encoding", "check_attention", "check_multi_head_attention", "check_masks",
    "check_feed_forward", "check_encoder_layer", "check_decoder_layer", "check_transformer",
    "check_train_step", "find_checks", "check_namespace",
]

ATOL = 1e-4
RTOL = 1e-3
_MAX_COMBINED = 2  # wrong variants are tried alone and in pairs

_SPLIT_HINT = ("split heads with x.view(N, L, H, d_k).transpose(1, 2) and merge them back with "
               "context.transpose(1, 2).contiguous().view(N, L, d_model)")
_MASK_FILL_HINT = ("fill the masked scores before the softmax: "
                   "scores.masked_fill(mask, torch.finfo(scores.dtype).min) (or -1e9)")

# key -> (what went wrong, how to fix it). Checks add details to the text.
MISTAKES: dict[str, tuple[str, str]] = {
    # exceptions
    "not_implemented": ("this exercise is not implemented yet",
                        "replace the `raise NotImplementedError(...)` line with your code, "
                        "run the cell, then run this check again"),
    "missing_contiguous": ("`.view()` was called on a non-contiguous tensor (after a transpose)",
                           "call .contiguous() after transpose, or use reshape"),
    "shape_error": ("a shape mismatch inside your code", "compare your shapes with the "
                    "expected ones above; print x.shape at each step"),
    "signature": ("your class or function does not take the arguments the check passes",
                  "keep the signature given in the exercise"),
    "attribute_error": ("an attribute is missing", "set it in __init__ (self.name = ...); "
                        "the checks rely on the attribute names of the exercise"),
    "exception": ("your code raised an exception", "read the message and the line shown"),
    "device_mismatch": ("tensors on different devices", "the checks run on the CPU: create "
                        "new tensors on the input's device (device=x.device), not on a fixed "
                        "one"),
    "not_a_class": ("an instance was passed where the class is expected",
                    "pass the class itself, e.g. check(MyModule), not check(MyModule(...))"),
    "missing_weights": ("some parameters were not found under the expected names",
                        "use the attribute names of the exercise (w_q, w_k, w_v, w_o, "
                        "linear1, linear2, self_attn, cross_attn, feed_forward, norm1, ...)"),
    "wrong_output_shape": ("the output has the wrong shape", "compare with the expected shape"),
    "wrong_output_type": ("the output is not a tensor", "return a torch.Tensor"),
    "nan_output": ("the output contains NaN or inf", "look for a division by zero or a "
                   "softmax over a row filled entirely with -inf"),
    "dropout_in_eval": ("two identical calls in eval mode gave different outputs: dropout (or "
                        "other randomness) is active in eval mode",
                        "use an nn.Dropout module (it switches off in .eval()), or "
                        "F.dropout(x, p, training=self.training)"),
    "submodule_differs": ("one of your submodules already differs from the reference",
                          "fix that building block first (its own check names the mistake)"),
    # attention
    "no_scaling": ("the scores are not scaled: softmax(q @ k^T) without dividing by sqrt(d_k)",
                   "divide the scores by math.sqrt(d_k), with d_k = q.size(-1)"),
    "scale_d_k": ("the scores are divided by d_k instead of sqrt(d_k)",
                  "divide by math.sqrt(d_k)"),
    "scale_sqrt_d_model": ("the scores are divided by sqrt(d_model) instead of sqrt(d_k); "
                           "d_k = d_model / n_heads is the size of one head",
                           "divide by math.sqrt(self.d_k)"),
    "scale_other": ("the scores are scaled by the wrong factor", "divide by math.sqrt(d_k)"),
    "softmax_wrong_axis": ("the softmax runs over the wrong axis: each query's weights over the "
                           "keys must sum to 1", "use torch.softmax(scores, dim=-1)"),
    "mask_inverted": ("the mask semantics are inverted: positions marked True were attended and "
                      "the others masked", "in this project True means 'do not attend': "
                      "scores.masked_fill(mask, ...) masks where the mask is True"),
    "mask_ignored": ("the mask is ignored: masked positions still get attention weight",
                     _MASK_FILL_HINT),
    "mask_fill_zero": ("masked scores are filled with 0, which still gives them weight after "
                       "the softmax", "fill with a very negative number "
                       "(torch.finfo(scores.dtype).min or -1e9), not 0"),
    "mask_after_softmax": ("the mask is applied after the softmax: the weights are zeroed but "
                           "the rows no longer sum to 1", "mask the scores before the softmax"),
    "weights_times_k": ("the attention weights multiply k instead of v", "return weights @ v"),
    # multi-head attention
    "heads_view_without_transpose": ("the heads are split with view alone, without transpose: "
                                     "positions and features get mixed, or attention runs "
                                     "across heads instead of positions", _SPLIT_HINT),
    "heads_merge_without_transpose": ("the heads are merged back with view alone, without "
                                      "transposing (N, H, L, d_k) back to (N, L, H, d_k)",
                                      _SPLIT_HINT),
    "no_output_projection": ("w_o is not used: the merged heads are returned without the "
                             "output projection", "return self.w_o(context)"),
    "unused_projection": ("a projection layer is not used", "project query, key and value with "
                          "their own layer: q = self.w_q(query), k = self.w_k(key), "
                          "v = self.w_v(value)"),
    "mask_needs_head_axis": ("a 3-D mask (N, L_q, L_k) or (N, 1, L_k) does not broadcast over "
                             "the heads", "add the head axis inside forward: "
                             "mask = mask.unsqueeze(1) gives (N, 1, L_q, L_k)"),
    # masks
    "mask_not_bool": ("the mask is not a bool tensor", "build it with comparisons or "
                      "dtype=torch.bool; True means 'do not attend'"),
    "padding_mask_shape": ("the padding mask has no query axis", "return "
                           "(seq == pad_idx).unsqueeze(1), shape (N, 1, L): it broadcasts "
                           "over every query"),
    "pad_idx_ignored": ("the pad id is hard-coded instead of taken from the pad_idx argument",
                        "compare with the pad_idx argument: seq == pad_idx"),
    "padding_on_queries": ("padding masks the query rows instead of the key columns",
                           "a padding mask hides keys: shape (N, 1, L_k) broadcasts over "
                           "the query rows"),
    "lookahead_diagonal_0": ("the look-ahead mask uses diagonal=0: the diagonal is masked too, "
                             "so a token cannot attend to itself (row 0 is fully masked)",
                             "torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)"),
    "lookahead_diagonal_2": ("the look-ahead mask uses diagonal=2: each token also sees the "
                             "next token", "torch.triu(torch.ones(L, L, dtype=torch.bool), "
                             "diagonal=1)"),
    "lookahead_masks_past": ("the look-ahead mask hides the past instead of the future",
                             "mask strictly above the diagonal: torch.triu(..., diagonal=1)"),
    "decoder_mask_no_padding": ("the decoder mask has the look-ahead part but no padding",
                                "combine both: padding_mask(tgt, pad_idx) | lookahead_mask(L)"),
    "decoder_mask_no_lookahead": ("the decoder mask has the padding part but no look-ahead",
                                  "combine both: padding_mask(tgt, pad_idx) | "
                                  "lookahead_mask(L)"),
    "decoder_mask_and": ("padding and look-ahead are combined with & (AND) instead of | (OR)",
                         "a position is hidden if either mask hides it: pad | causal"),
    "cross_mask_shape": ("the cross-attention mask has shape (N, L_src, L_src): that is the "
                         "encoder's self-attention mask; cross-attention scores are "
                         "(N, H, L_tgt, L_src)", "use the source key-padding mask "
                         "(N, 1, L_src): it broadcasts over the L_tgt queries"),
    "cross_mask_uses_tgt": ("the cross-attention mask is built from the target; it must hide "
                            "padded source (memory) positions", "padding_mask(src, pad_idx)"),
    "cross_mask_lookahead": ("the cross-attention mask contains a look-ahead part; the decoder "
                             "may see every source position", "use only the source padding "
                             "mask for cross-attention"),
    # positional encoding
    "pe_sin_cos_swapped": ("sin and cos are swapped: sin belongs on the even columns (0, 2, ...) "
                           "and cos on the odd ones", "pe[:, 0::2] = sin(...); "
                           "pe[:, 1::2] = cos(...)"),
    "pe_exponent_i": ("the frequency exponent uses the pair index i instead of 2i "
                      "(10000^(i/d_model))", "use 10000^(2i/d_model): "
                      "torch.arange(0, d_model, 2) / d_model as the exponent"),
    "pe_exponent_column": ("each column uses its own index j in the exponent (10000^(j/d_model)); "
                           "columns 2i and 2i+1 must share 10000^(2i/d_model)",
                           "compute one frequency per pair: torch.arange(0, d_model, 2)"),
    "pe_frequency_inverted": ("positions are multiplied by 10000^(2i/d_model) instead of divided",
                              "angle = pos / 10000^(2i/d_model) = pos * exp(-2i ln(10000) / "
                              "d_model)"),
    "pe_concatenated": ("sin and cos are concatenated as two halves instead of interleaved on "
                        "even/odd columns", "pe[:, 0::2] = sin(...); pe[:, 1::2] = cos(...)"),
    "pe_positions_from_1": ("positions start at 1 instead of 0", "torch.arange(max_len)"),
    "pe_not_buffer": ("`pe` is not a registered buffer", "self.register_buffer('pe', table): a "
                      "buffer moves with .to(), is saved in state_dict and is never trained"),
    "pe_scales_input": ("forward multiplies x by sqrt(d_model); that scaling belongs to the "
                        "embedding in the Encoder/Decoder", "return x + self.pe[:L] "
                        "(then dropout)"),
    "pe_seq_first": ("forward treats x as (L, N, d_model); the exercise uses (N, L, d_model)",
                     "add self.pe[:x.size(1)] (shape (L, d_model)), which broadcasts over N"),
    # feed-forward
    "ffn_no_activation": ("there is no ReLU between linear1 and linear2",
                          "linear2(dropout(relu(linear1(x))))"),
    "ffn_other_activation": ("the activation is not ReLU (GELU?); the 2017 paper uses ReLU",
                             "use F.relu"),
    "ffn_activation_on_output": ("a ReLU is applied to the output of linear2 as well",
                                 "return linear2(...) without an activation"),
    "ffn_residual_inside": ("the feed-forward adds its input back: the residual belongs to the "
                            "layer around it", "return only linear2(...)"),
    # layers
    "pre_ln_instead_of_post_ln": ("Pre-LN order (LayerNorm before the sublayer, "
                                  "x + sublayer(norm(x))) where Post-LN is expected",
                                  "Post-LN (the paper): x = norm(x + dropout(sublayer(x)))"),
    "post_ln_instead_of_pre_ln": ("Post-LN order (norm(x + sublayer(x))) where Pre-LN is "
                                  "expected", "Pre-LN: x = x + dropout(sublayer(norm(x)))"),
    "norm_before_residual_add": ("the LayerNorm is applied to the sublayer output before the "
                                 "residual add (x + norm(sublayer(x)))",
                                 "Post-LN normalises the sum: norm(x + sublayer(x))"),
    "missing_residual": ("a residual connection is missing", "add the sublayer's input back: "
                         "norm(x + dropout(sublayer(x)))"),
    "norms_mixed_up": ("the LayerNorms are used in the wrong sublayers (or one is shared)",
                       "norm1 after self-attention, norm2 after the next sublayer, ..."),
    "sublayers_out_of_order": ("the sublayers run in the wrong order", "self-attention first, "
                               "(cross-attention next,) feed-forward last"),
    "mask_not_passed": ("the mask is not passed to self-attention",
                        "self.self_attn(x, x, x, mask)"),
    "tgt_mask_not_passed": ("tgt_mask is not passed to the decoder self-attention",
                            "self.self_attn(x, x, x, tgt_mask)"),
    "memory_mask_not_passed": ("memory_mask is not passed to cross-attention",
                               "self.cross_attn(x, memory, memory, memory_mask)"),
    "cross_attn_on_x": ("cross-attention attends to the decoder states x instead of memory",
                        "self.cross_attn(x, memory, memory, memory_mask): queries from the "
                        "decoder, keys and values from the encoder memory"),
    "masks_swapped": ("tgt_mask and memory_mask are swapped: the layer works when the check "
                      "passes them the other way round", "forward(x, memory, tgt_mask, "
                      "memory_mask): self-attention gets tgt_mask, cross-attention memory_mask"),
    "self_attn_reused_for_cross": ("self_attn is called for cross-attention; cross_attn has "
                                   "its own weights", "use self.cross_attn for the second "
                                   "sublayer"),
    # transformer
    "embeddings_not_scaled": ("the embeddings are not multiplied by sqrt(d_model)",
                              "x = self.embedding(tokens) * math.sqrt(d_model) before the "
                              "positional encoding"),
    "no_final_norm": ("the final LayerNorm after the last encoder/decoder layer is missing",
                      "apply self.norm(x) after the loop over layers"),
    "no_generator": ("the output has d_model features: the generator (the final Linear to the "
                     "target vocabulary) is missing", "self.generator = "
                     "nn.Linear(d_model, tgt_vocab_size); return self.generator(hidden)"),
    "returns_probabilities": ("forward returns (log-)probabilities instead of raw logits",
                              "return the generator's logits; CrossEntropyLoss applies "
                              "log-softmax itself"),
    "decoder_sees_future": ("changing a later target token changes earlier outputs: the "
                            "decoder sees the future", "pass tgt_mask (padding | look-ahead) "
                            "to every decoder layer's self-attention"),
    "source_padding_leaks": ("changing source tokens under the padding mask changes the "
                             "output: src_mask is not applied everywhere",
                             "pass src_mask to every encoder layer and as memory_mask to "
                             "every decoder layer"),
    # training step
    "no_update": ("the parameters did not change: loss.backward() or optimizer.step() is "
                  "missing", "loss.backward(), then optimizer.step()"),
    "no_zero_grad": ("the gradients are never zeroed, so each step adds its gradients to the "
                     "previous steps' ones", "call optimizer.zero_grad() before loss.backward()"),
    "no_clipping": ("the gradients are not clipped before optimizer.step()",
                    "nn.utils.clip_grad_norm_(model.parameters(), clip_norm) between "
                    "loss.backward() and optimizer.step()"),
    "scheduler_not_stepped": ("the learning-rate scheduler is never stepped: the warmup never "
                              "advances", "call scheduler.step() once per step, after "
                              "optimizer.step()"),
    "scheduler_before_optimizer": ("scheduler.step() runs before optimizer.step(), so every "
                                   "step uses the next step's learning rate (PyTorch warns)",
                                   "optimizer.step() first, then scheduler.step()"),
    "decoder_reads_labels": ("the decoder reads tgt_out (the labels) instead of tgt_in, so it "
                             "can copy the answer", "logits = model(src, tgt_in)"),
    "labels_not_shifted": ("the loss compares the logits with tgt_in instead of tgt_out: the "
                           "labels are not shifted", "criterion(logits.reshape(-1, V), "
                           "tgt_out.reshape(-1))"),
    "grad_norm_after_clip": ("the returned gradient norm is measured after clipping (it equals "
                             "clip_norm)", "return what clip_grad_norm_ returns: the norm before "
                             "clipping"),
    "wrong_return": ("the step does not return (loss, grad_norm) as two numbers",
                     "return loss.item(), grad_norm.item()"),
    "mismatch": ("the numbers differ from the reference and match none of the known mistakes",
                 "print intermediate shapes and values and compare them with tx_helpers"),
}


@dataclass
class CheckResult:
    """What a check found: ``passed``, the report lines and the diagnosed mistake keys."""

    name: str
    passed: bool
    messages: list[str] = field(default_factory=list)
    mistakes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        status = "passed" if self.passed else "FAILED"
        found = f"; mistakes: {', '.join(self.mistakes)}" if self.mistakes else ""
        return f"<{self.name}: {status}{found}>"

    def _repr_pretty_(self, p, cycle) -> None:  # IPython display: one line
        p.text(repr(self))

    @property
    def report(self) -> str:
        return "\n".join(self.messages)

    def as_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "mistakes": list(self.mistakes),
                "messages": list(self.messages)}


_HISTORY: list[CheckResult] = []


def history() -> list[CheckResult]:
    """Every result returned by a check in this Python process, oldest first."""
    return list(_HISTORY)


def clear_history() -> None:
    _HISTORY.clear()


# ----------------------------------------------------------------------------------------
# reporting


class _Failed(Exception):
    """Stops a check early; the report already says why."""


class _Report:
    def __init__(self, name: str, verbose: bool = True):
        self.name = name
        self.verbose = verbose
        self.probes: list[tuple[bool, str]] = []
        self.found: dict[str, tuple[str, str]] = {}
        self.notes: list[str] = []

    def probe(self, ok: bool, text: str) -> bool:
        self.probes.append((bool(ok), text))
        return bool(ok)

    def mistake(self, key: str, detail: str | None = None, hint: str | None = None) -> None:
        if key in self.found:
            return
        text, default_hint = MISTAKES[key]
        self.found[key] = (f"{text}{': ' + detail if detail else ''}", hint or default_hint)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def finish(self) -> CheckResult:
        if len(self.found) > 1:  # a named mistake explains the mismatch
            self.found.pop("mismatch", None)
        passed = bool(self.probes) and all(ok for ok, _ in self.probes) and not self.found
        n_ok = sum(ok for ok, _ in self.probes)
        head = (f"{self.name}: passed ({n_ok}/{len(self.probes)} probes)" if passed else
                f"{self.name}: FAILED ({n_ok}/{len(self.probes)} probes passed)")
        lines = [head] + [f"  {'✓' if ok else '✗'} {text}" for ok, text in self.probes]
        for text, hint in self.found.values():
            lines += [f"Diagnosis: {text}", f"Hint: {hint}"]
        lines += [f"Note: {text}" for text in self.notes]
        result = CheckResult(self.name, passed, lines, list(self.found))
        _HISTORY.append(result)
        if self.verbose:
            report = "\n".join(lines)
            try:
                print(report)
            except UnicodeEncodeError:  # a terminal without UTF-8
                print(report.replace("✓", "ok").replace("✗", "XX"))
        return result


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _learner_frame(exc: BaseException) -> str:
    """Where in the learner's code the exception came from (not torch, not this package)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if path.startswith(_TORCH_DIR) or path.startswith(_PACKAGE_DIR):
            continue
        line = (frame.line or "").strip()
        return f" (line {frame.lineno} in {frame.name}: {line})" if line else ""
    return ""


def _explain(report: _Report, what: str, exc: BaseException, shape_hint: str = "") -> None:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = _learner_frame(exc)
    report.probe(False, f"{what}: raised {type(exc).__name__}: {msg}{where}")
    low = msg.lower()
    if isinstance(exc, NotImplementedError):
        report.mistake("not_implemented", msg or None)
    elif "view" in low and ("stride" in low or "contiguous" in low):
        report.mistake("missing_contiguous")
    elif "device" in low and ("expected" in low or "same" in low):
        report.mistake("device_mismatch", msg)
    elif isinstance(exc, AttributeError):
        report.mistake("attribute_error", msg)
    elif isinstance(exc, TypeError) and ("argument" in low or "positional" in low):
        report.mistake("signature", msg)
    elif any(s in low for s in ("size of tensor", "shape", "size mismatch", "cannot be multiplied",
                                "invalid for input of size", "dimension", "broadcast")):
        report.mistake("shape_error", msg, shape_hint or None)
    else:
        report.mistake("exception", f"{type(exc).__name__}: {msg}")


def _call(report: _Report, what: str, fn, *args, shape_hint: str = "", **kwargs):
    """Run learner code; on an exception, explain it and raise _Failed."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any learner bug is reported, never raised
        _explain(report, what, exc, shape_hint)
        raise _Failed from None


def _run_check(name: str, body, verbose: bool) -> CheckResult:
    report = _Report(name, verbose)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra threads only add contention
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            try:
                with torch.no_grad():
                    body(report)
            except _Failed:
                pass
            except Exception as exc:  # noqa: BLE001 - never crash on learner code
                _explain(report, "the check", exc)
    finally:
        torch.set_num_threads(threads)
    return report.finish()


# ----------------------------------------------------------------------------------------
# comparing with the reference and with wrong variants


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


def _instantiate(report: _Report, cls, args: tuple, signature: str):
    if isinstance(cls, nn.Module):
        report.probe(False, f"got an instance of {type(cls).__name__}, expected the class")
        report.mistake("not_a_class")
        raise _Failed
    module = _call(report, f"{signature}", cls, *args)
    if not isinstance(module, nn.Module):
        report.probe(False, f"{signature} builds an nn.Module (got {type(module).__name__})")
        raise _Failed
    report.probe(True, f"{signature} builds an nn.Module")
    module.eval()
    return module


def _randomize_norms(module: nn.Module, gen) -> None:
    """LayerNorms start as the identity; random gains tell norm1 from norm2 in the probes."""
    for m in module.modules():
        if isinstance(m, nn.LayerNorm) and m.weight is not None:
            m.weight.copy_(1.0 + 0.3 * torch.randn(m.weight.shape, generator=gen))
            m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=gen))


def _copy_parameters(report: _Report, learner: nn.Module, ref: nn.Module) -> None:
    """Copy the reference parameters into the learner's module by name; report what is off.

    Only parameters travel: buffers such as a positional-encoding table stay the learner's own.
    """
    ref_params = dict(ref.named_parameters())
    mine = dict(learner.named_parameters())
    shape_bad, state = [], {}
    for name, p in ref_params.items():
        if name in mine and mine[name].shape != p.shape:
            shape_bad.append(f"{name} {tuple(mine[name].shape)} (expected {tuple(p.shape)})")
        elif name in mine:
            state[name] = p.detach().clone()
    result = learner.load_state_dict(state, strict=False)
    missing = [k for k in ref_params if k not in mine]
    unexpected = [k for k in result.unexpected_keys]
    extra = [k for k in mine if k not in ref_params]
    ok = not (missing or shape_bad)
    report.probe(ok, "every reference parameter found by name and shape"
                 + ("" if ok else f" ({len(missing) + len(shape_bad)} not)"))
    if missing:
        report.mistake("missing_weights", "not found: " + ", ".join(missing[:8])
                       + (" ..." if len(missing) > 8 else ""))
    if shape_bad:
        report.mistake("wrong_output_shape" if not missing else "missing_weights",
                       "wrong shape: " + ", ".join(shape_bad[:6]))
    if extra or unexpected:
        report.note("parameters the reference does not have (left as they are): "
                    + ", ".join((extra + unexpected)[:8]))


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


# ----------------------------------------------------------------------------------------
# positional encoding


def _pe_variant(max_len, d_model, swap=False, layout="interleaved", exponent="2i", start=0):
    pos = torch.arange(start, start + max_len, dtype=torch.float32).unsqueeze(1)
    pairs = (d_model + 1) // 2
    if exponent == "2i":
        ex = torch.arange(0, d_model, 2, dtype=torch.float32)
    elif exponent == "i":
        ex = torch.arange(pairs, dtype=torch.float32)
    elif exponent == "column":
        ex = None
    else:  # inverted: pos * 10000^(2i/d)
        ex = torch.arange(0, d_model, 2, dtype=torch.float32)
    first, second = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
    pe = torch.zeros(max_len, d_model)
    if exponent == "column":
        cols = torch.arange(d_model, dtype=torch.float32)
        ang = pos / torch.pow(10000.0, cols / d_model)
        pe[:, 0::2] = first(ang[:, 0::2])
        pe[:, 1::2] = second(ang[:, 1::2])
        return pe
    if exponent == "inverted":
        ang = pos * torch.pow(10000.0, ex / d_model)
    else:
        ang = pos / torch.pow(10000.0, ex / d_model)  # (max_len, pairs)
    if layout == "interleaved":
        pe[:, 0::2] = first(ang)
        pe[:, 1::2] = second(ang[:, : d_model // 2])
    else:
        pe[:, :pairs] = first(ang)
        pe[:, pairs:] = second(ang[:, : d_model - pairs])
    return pe


_PE_AXES = {
    "swap": [False, ("pe_sin_cos_swapped", True)],
    "layout": ["interleaved", ("pe_concatenated", "halves")],
    "exponent": ["2i", ("pe_exponent_i", "i"), ("pe_exponent_column", "column"),
                 ("pe_frequency_inverted", "inverted")],
    "start": [0, ("pe_positions_from_1", 1)],
}


def _FIRST_ROWS(t):
    return t[:4]


def _squeeze_table(report: _Report, table, max_len, d_model, what):
    table = _as_output(report, table, what)
    if table.dim() == 3 and 1 in table.shape[:2]:
        table = table.reshape(table.shape[0] * table.shape[1], table.shape[2])
    if tuple(table.shape) != (max_len, d_model):
        report.probe(False, f"{what} has shape (max_len, d_model) = {(max_len, d_model)} "
                     f"(got {tuple(table.shape)})")
        report.mistake("wrong_output_shape")
        raise _Failed
    return table.float()


def check_positional_encoding(fn_or_cls, *, verbose: bool = True) -> CheckResult:
    """Check a sinusoidal positional encoding against :func:`tx_helpers.sinusoidal_table`.

    Accepts a function ``fn(max_len, d_model) -> (max_len, d_model)`` or a class
    ``cls(d_model, max_len, dropout)`` with a buffer ``pe`` and/or ``forward(x)``
    that adds the table to x of shape (N, L, d_model).
    """
    max_len, d_model = 50, 16
    ref = sinusoidal_table(max_len, d_model)

    def variant_table(**kw):
        return _pe_variant(max_len, d_model, **kw)

    def body(report: _Report):
        is_class = isinstance(fn_or_cls, type) and issubclass(fn_or_cls, nn.Module)
        if not is_class and not isinstance(fn_or_cls, nn.Module):
            table = _call(report, f"fn({max_len}, {d_model})", fn_or_cls, max_len, d_model)
            table = _squeeze_table(report, table, max_len, d_model, f"fn({max_len}, {d_model})")
            _compare(report, "the table matches sinusoidal_table (sin on even columns, cos on "
                     "odd, frequencies 1/10000^(2i/d_model))", table, ref, _PE_AXES,
                     variant_table, _FIRST_ROWS)
            return
        module = _instantiate(report, fn_or_cls, (d_model, max_len, 0.1),
                              f"cls(d_model={d_model}, max_len={max_len}, dropout=0.1)")
        pe = getattr(module, "pe", None)
        if isinstance(pe, torch.Tensor):
            buffers = dict(module.named_buffers(recurse=False))
            params = dict(module.named_parameters(recurse=False))
            if "pe" in buffers:
                report.probe(True, "pe is a registered buffer")
            else:
                report.probe(False, "pe is a registered buffer")
                report.mistake("pe_not_buffer", "it is an nn.Parameter, so the optimizer would "
                               "train it" if "pe" in params else "it is a plain attribute: "
                               ".to(device) would leave it behind")
            table = _squeeze_table(report, pe.detach(), max_len, d_model, "pe")
            _compare(report, "pe matches sinusoidal_table", table, ref, _PE_AXES, variant_table,
                     _FIRST_ROWS)
        else:
            report.note("no `pe` attribute found: only forward(x) is checked")
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(3, 7, d_model, generator=gen)
        out = _as_output(report, _call(report, "forward(x) with x (N=3, L=7, d_model)",
                                       module, x.clone(),
                                       shape_hint="slice the table to the input length: "
                                       "self.pe[:x.size(1)]"))
        expected = x + ref[:7]
        axes = dict(_PE_AXES)
        axes["extra"] = [None, ("pe_scales_input", "scale"), ("pe_seq_first", "seq_first")]

        def variant_forward(extra=None, **kw):
            table = variant_table(**kw)
            if extra == "scale":
                return x * math.sqrt(d_model) + table[:7]
            if extra == "seq_first":
                return x + table[:3].unsqueeze(1)
            return x + table[:7]

        _deterministic(report, lambda: module(x.clone()), out)
        _compare(report, "forward(x) returns x + pe[:L] (eval mode, no dropout)", out,
                 expected, axes, variant_forward, lambda t: t[:, :4])

    return _run_check("check_positional_encoding", body, verbose)


# ----------------------------------------------------------------------------------------
# scaled dot-product attention

_NEG = torch.finfo(torch.float32).min


def _attention_variant(q, k, v, mask, scale=None, axis=-1, masking=None, values="v",
                       d_model=None):
    d_k = q.size(-1)
    s = q @ k.transpose(-2, -1)
    divisor = {None: math.sqrt(d_k), "none": 1.0, "d_k": d_k,
               "d_model": math.sqrt(d_model or d_k)}[scale]
    s = s / divisor
    if mask is not None:
        if masking is None or masking == "after":
            s = s.masked_fill(mask, _NEG) if masking is None else s
        elif masking == "inverted":
            s = s.masked_fill(~mask, _NEG)
        elif masking == "zero":
            s = s.masked_fill(mask, 0.0)
    w = torch.softmax(s, dim=axis)
    if mask is not None and masking == "after":
        w = w.masked_fill(mask, 0.0)
    return w @ (k if values == "k" else v)


def _attention_axes(masked: bool, d_model: int | None = None, ndim: int = 4):
    axes = {
        "scale": [None, ("no_scaling", "none"), ("scale_d_k", "d_k")],
        "axis": [-1] + [("softmax_wrong_axis", a) for a in range(-2, -ndim - 1, -1)],
        "values": ["v", ("weights_times_k", "k")],
    }
    if d_model is not None:
        axes["scale"].append(("scale_sqrt_d_model", "d_model"))
    if masked:
        axes["masking"] = [None, ("mask_inverted", "inverted"), ("mask_ignored", "ignored"),
                           ("mask_fill_zero", "zero"), ("mask_after_softmax", "after")]
    return axes


_ATTN_SHAPES = ("q, k: (N, H, L_q, d_k) and (N, H, L_k, d_k); scores q @ k.transpose(-2, -1): "
                "(N, H, L_q, L_k); mask broadcasts to the scores; output (N, H, L_q, d_v)")


def check_attention(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(q, k, v, mask=None) -> output`` or ``(output, weights)``.

    q (N, H, L_q, d_k), k (N, H, L_k, d_k), v (N, H, L_k, d_v); ``mask`` is bool,
    True = do not attend, broadcastable to (N, H, L_q, L_k). Reference:
    :func:`tx_helpers.scaled_dot_product_attention`.
    """
    def body(report: _Report):
        gen = torch.Generator().manual_seed(2)
        n, h, l_q, l_k, d_k, d_v = 2, 3, 5, 6, 64, 8
        q = torch.randn(n, h, l_q, d_k, generator=gen)
        k = torch.randn(n, h, l_k, d_k, generator=gen)
        v = torch.randn(n, h, l_k, d_v, generator=gen)
        if isinstance(fn, type):
            report.note("check_attention expects a function; for a module use "
                        "check_multi_head_attention")

        def run(mask=None):
            args = (q.clone(), k.clone(), v.clone()) + (() if mask is None else (mask,))
            what = "fn(q, k, v)" if mask is None else "fn(q, k, v, mask)"
            return _call(report, what, fn, *args, shape_hint=_ATTN_SHAPES)

        raw = run()
        out = _as_output(report, raw)
        _deterministic(report, run, out)
        ref, ref_w = _scaled_reference(q, k, v, None)
        shape_ok = report.probe(tuple(out.shape) == tuple(ref.shape),
                                f"output shape (N, H, L_q, d_v) = {tuple(ref.shape)}"
                                + ("" if tuple(out.shape) == tuple(ref.shape)
                                   else f" (got {tuple(out.shape)})"))
        axes = _attention_axes(False)
        if not shape_ok:
            _diagnose(report, out, axes, lambda **kw: _attention_variant(q, k, v, None, **kw),
                      ref)
            report.mistake("wrong_output_shape", f"expected {tuple(ref.shape)}", _ATTN_SHAPES)
            raise _Failed
        ok = _compare(report, "values without a mask match softmax(q k^T / sqrt(d_k)) v", out,
                      ref, axes, lambda **kw: _attention_variant(q, k, v, None, **kw))
        if isinstance(raw, (tuple, list)) and len(raw) > 1 and isinstance(raw[1], torch.Tensor):
            w = raw[1]
            if tuple(w.shape) == tuple(ref_w.shape):
                if ok:
                    _compare(report, "returned weights match (N, H, L_q, L_k), rows sum to 1",
                             w, ref_w)
            else:
                report.note(f"the second returned value has shape {tuple(w.shape)}; the "
                            f"weights would be (N, H, L_q, L_k) = {tuple(ref_w.shape)}")
        if not ok:
            _scale_probe(report, fn)
        mask = _both_kinds_mask((n, 1, l_q, l_k), gen)
        out_m = _as_output(report, run(mask))
        ref_m, _ = _scaled_reference(q, k, v, mask)
        _compare(report, "with a mask (bool, True = do not attend) the masked keys get no "
                 "weight", out_m, ref_m, _attention_axes(True),
                 lambda **kw: _attention_variant(q, k, v, mask, **kw))

    return _run_check("check_attention", body, verbose)


def _scaled_reference(q, k, v, mask):
    from .attention import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, mask)


def _scale_probe(report: _Report, fn) -> None:
    """Two keys, one query: the output weight on key 1 reveals the scale the learner used."""
    d_k = 64
    q = torch.zeros(1, 1, 1, d_k)
    q[..., 0] = 4.0
    k = torch.zeros(1, 1, 2, d_k)
    k[..., 1, 0] = 1.0  # q.k0 = 0, q.k1 = 4
    v = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
    try:
        out = fn(q, k, v)
        out = out[0] if isinstance(out, (tuple, list)) else out
        p = float(out.reshape(-1)[0])
    except Exception:  # noqa: BLE001 - the main probes already reported it
        return
    if not 0.0 < p < 1.0:
        return
    scale = math.log(p / (1 - p)) / 4.0  # sigmoid(scale * 4) = p
    if scale <= 0:
        return
    divisor = 1.0 / scale
    if abs(divisor - math.sqrt(d_k)) / math.sqrt(d_k) < 0.02:
        return
    if abs(divisor - 1.0) < 0.02:
        report.mistake("no_scaling")
    elif abs(divisor - d_k) / d_k < 0.02:
        report.mistake("scale_d_k")
    else:
        report.mistake("scale_other", f"with d_k={d_k} your code divides the scores by about "
                       f"{divisor:.3g} = sqrt({divisor ** 2:.4g}) instead of sqrt(d_k) = "
                       f"{math.sqrt(d_k):.3g}; a hard-coded d_model?")


# ----------------------------------------------------------------------------------------
# multi-head attention


def _mha_variant(ref: MultiHeadAttention, query, key, value, mask, scale=None, axis=-1,
                 split=None, masking=None, out_proj=True):
    n, l_q, d_model = query.shape
    l_k = key.size(1)
    h, d_k = ref.n_heads, ref.d_k

    def split_(x, length):
        if split == "nhld":  # view straight to (N, H, L, d_k)
            return x.reshape(n, h, length, d_k)
        if split == "nlhd":  # view to (N, L, H, d_k), no transpose: attention across heads
            return x.reshape(n, length, h, d_k)
        return x.view(n, length, h, d_k).transpose(1, 2)

    q, k, v = split_(ref.w_q(query), l_q), split_(ref.w_k(key), l_k), split_(ref.w_v(value), l_k)
    m = None
    if mask is not None:
        m = mask.unsqueeze(1) if mask.dim() == 3 else mask
    ctx = _attention_variant(q, k, v, m, scale=scale, axis=axis, masking=masking,
                             d_model=d_model)
    if split in ("nhld", "merge_only", "nlhd"):
        merged = ctx.reshape(n, l_q, d_model)
    else:
        merged = ctx.transpose(1, 2).reshape(n, l_q, d_model)
    return ref.w_o(merged) if out_proj else merged


def _mha_axes(masked: bool):
    axes = {
        "scale": [None, ("no_scaling", "none"), ("scale_sqrt_d_model", "d_model"),
                  ("scale_d_k", "d_k")],
        "axis": [-1, ("softmax_wrong_axis", -2), ("softmax_wrong_axis", 1)],
        "split": [None, ("heads_view_without_transpose", "nhld"),
                  ("heads_view_without_transpose", "nlhd"),
                  ("heads_merge_without_transpose", "merge_only")],
        "out_proj": [True, ("no_output_projection", False)],
    }
    if masked:
        axes["masking"] = [None, ("mask_inverted", "inverted"), ("mask_ignored", "ignored"),
                           ("mask_fill_zero", "zero"), ("mask_after_softmax", "after")]
    return axes


_MHA_SHAPES = ("query (N, L_q, d_model), key/value (N, L_k, d_model); heads (N, H, L, d_k); "
               "scores (N, H, L_q, L_k); the check passes masks (N, L_q, L_k) and (N, 1, L_k): "
               "add the head axis with mask.unsqueeze(1)")


def _reference_mha(d_model, n_heads, seed=3):
    torch.manual_seed(seed)
    ref = MultiHeadAttention(d_model, n_heads, dropout=0.1).eval()
    return ref


def _copy_linears(report: _Report, module, ref, names) -> None:
    missing = []
    for name in names:
        mine, theirs = getattr(module, name, None), getattr(ref, name)
        if not isinstance(mine, nn.Linear):
            missing.append(name)
            continue
        if mine.weight.shape != theirs.weight.shape:
            report.probe(False, f"{name} is nn.Linear{tuple(theirs.weight.shape[::-1])} "
                         f"(got weight {tuple(mine.weight.shape)})")
            report.mistake("wrong_output_shape", f"{name}.weight has shape "
                           f"{tuple(mine.weight.shape)}, expected {tuple(theirs.weight.shape)}")
            raise _Failed
        mine.weight.copy_(theirs.weight)
        if mine.bias is not None:
            mine.bias.copy_(theirs.bias)
        else:
            theirs.bias.zero_()
            report.note(f"{name} has no bias: compared with a reference whose bias is zero")
    ok = report.probe(not missing, f"attributes {', '.join(names)} are nn.Linear layers"
                      + (f" (missing or not nn.Linear: {', '.join(missing)})" if missing else ""))
    if not ok:
        report.mistake("missing_weights", ", ".join(missing))
        raise _Failed


def check_multi_head_attention(cls, *, verbose: bool = True) -> CheckResult:
    """Check ``cls(d_model, n_heads, dropout)`` with w_q, w_k, w_v, w_o and
    ``forward(query, key, value, mask=None)`` (mask bool, True = masked).

    The reference weights of a :class:`tx_helpers.MultiHeadAttention` are copied in
    by name and both run in eval mode.
    """
    d_model, n_heads = 32, 4
    names = ("w_q", "w_k", "w_v", "w_o")

    def body(report: _Report):
        module = _instantiate(report, cls, (d_model, n_heads, 0.1),
                              f"cls(d_model={d_model}, n_heads={n_heads}, dropout=0.1)")
        ref = _reference_mha(d_model, n_heads)
        _copy_linears(report, module, ref, names)
        gen = torch.Generator().manual_seed(4)
        n, l_q, l_k = 2, 5, 7
        x = torch.randn(n, l_q, d_model, generator=gen)
        mem = torch.randn(n, l_k, d_model, generator=gen)

        def run(query, key, value, mask=None, what="forward(x, x, x)"):
            args = (query.clone(), key.clone(), value.clone()) + (() if mask is None else (mask,))
            out = _call(report, what, module, *args, shape_hint=_MHA_SHAPES)
            if isinstance(out, (tuple, list)):
                report.note("forward returns a tuple; the exercise returns only the output")
            return _as_output(report, out)

        def variants(query, key, value, mask):
            return lambda **kw: _mha_variant(ref, query, key, value, mask, **kw)

        out = run(x, x, x)
        _deterministic(report, lambda: run(x, x, x), out)
        _compare(report, f"self-attention output (N, L, d_model) = {(n, l_q, d_model)} "
                 "matches the reference", out, ref(x, x, x), _mha_axes(False),
                 variants(x, x, x, None))
        # each projection must matter: perturb it and look for a change
        unused = []
        for name in names:
            layer = getattr(module, name)
            saved = layer.weight.detach().clone()
            layer.weight.add_(0.5 * torch.randn(saved.shape, generator=gen))
            try:
                changed = not _close(_as_output(report, module(x, x, x)), out)
            except Exception:  # noqa: BLE001 - the main probe already reported errors
                changed = True
            layer.weight.copy_(saved)
            if not changed:
                unused.append(name)
        report.probe(not unused, "changing w_q, w_k, w_v or w_o changes the output"
                     + (f" (no effect: {', '.join(unused)})" if unused else ""))
        if "w_o" in unused:
            report.mistake("no_output_projection")
        for name in unused:
            if name != "w_o":
                report.mistake("unused_projection", f"self.{name} has no effect on the output")
        out_c = run(x, mem, mem, what="cross-attention forward(x, memory, memory), L_q != L_k")
        _compare(report, f"cross-attention (L_q={l_q}, L_k={l_k}) matches the reference",
                 out_c, ref(x, mem, mem), _mha_axes(False), variants(x, mem, mem, None))
        mask = _both_kinds_mask((n, l_q, l_q), gen)
        try:
            out_m = run(x, x, x, mask, what="forward(x, x, x, mask) with mask (N, L, L)")
        except _Failed:
            try:
                module(x, x, x, mask.unsqueeze(1))
                report.mistake("mask_needs_head_axis")
            except Exception:  # noqa: BLE001
                pass
            raise
        _compare(report, "with a mask (N, L, L), True = masked, matches the reference", out_m,
                 ref(x, x, x, mask), _mha_axes(True), variants(x, x, x, mask))
        pad = torch.zeros(n, 1, l_k, dtype=torch.bool)
        pad[0, 0, -2:] = True
        pad[1, 0, -4:] = True
        out_p = run(x, mem, mem, pad, what="forward(x, memory, memory, pad_mask (N, 1, L_k))")
        _compare(report, "with a padding mask (N, 1, L_k) matches the reference", out_p,
                 ref(x, mem, mem, pad), _mha_axes(True), variants(x, mem, mem, pad))

    return _run_check("check_multi_head_attention", body, verbose)


# ----------------------------------------------------------------------------------------
# masks


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

    return _run_check("check_masks", body, verbose)


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


# ----------------------------------------------------------------------------------------
# feed-forward


def check_feed_forward(cls, *, verbose: bool = True) -> CheckResult:
    """Check ``cls(d_model, d_ff, dropout)`` with ``linear1``, ``linear2`` against
    :class:`tx_helpers.FeedForward` (linear2(dropout(relu(linear1(x))))."""
    d_model, d_ff = 16, 48

    def body(report: _Report):
        module = _instantiate(report, cls, (d_model, d_ff, 0.1),
                              f"cls(d_model={d_model}, d_ff={d_ff}, dropout=0.1)")
        torch.manual_seed(5)
        ref = FeedForward(d_model, d_ff, 0.1).eval()
        _copy_linears(report, module, ref, ("linear1", "linear2"))
        x = torch.randn(2, 5, d_model, generator=torch.Generator().manual_seed(6))
        out = _as_output(report, _call(report, "forward(x)", module, x.clone(),
                                       shape_hint="linear1: d_model -> d_ff, "
                                       "linear2: d_ff -> d_model"))

        def variant(act="relu", out_act=False, residual=False):
            h = ref.linear1(x)
            h = {"relu": F.relu, "none": lambda t: t, "gelu": F.gelu}[act](h)
            y = ref.linear2(h)
            y = F.relu(y) if out_act else y
            return y + x if residual else y

        axes = {"act": ["relu", ("ffn_no_activation", "none"), ("ffn_other_activation", "gelu")],
                "out_act": [False, ("ffn_activation_on_output", True)],
                "residual": [False, ("ffn_residual_inside", True)]}
        _deterministic(report, lambda: module(x.clone()), out)
        _compare(report, "output matches linear2(relu(linear1(x))) (eval mode)", out, ref(x),
                 axes, variant)

    return _run_check("check_feed_forward", body, verbose)


# ----------------------------------------------------------------------------------------
# encoder and decoder layers


def _sublayers(x, steps, order, residual):
    """Run (fn, norm) steps with one residual/LayerNorm arrangement."""
    for i, (fn, norm) in enumerate(steps):
        keep = 0 if residual in ("all", i) else x
        if order == "post":
            x = norm(keep + fn(x))
        elif order == "pre":
            x = keep + fn(norm(x))
        else:  # norm of the sublayer output, then the add
            x = keep + norm(fn(x))
    return x


def _layer_axes(norm_first: bool, n_sub: int):
    right, wrong = ("pre", "post") if norm_first else ("post", "pre")
    wrong_key = "post_ln_instead_of_pre_ln" if norm_first else "pre_ln_instead_of_post_ln"
    return {
        "order": [right, (wrong_key, wrong), ("norm_before_residual_add", "norm_before_add")],
        "residual": [None, ("missing_residual", "all")]
        + [("missing_residual", i) for i in range(n_sub)],
        "norms": [None] + [("norms_mixed_up", p) for p in
                           itertools.permutations(range(n_sub)) if list(p) != list(range(n_sub))]
        + [("norms_mixed_up", (0,) * n_sub)],
        "swap": [False, ("sublayers_out_of_order", True)],
    }


def _layer_probes(report, module, ref, run_mine, run_ref, variant, axes, subs, what,
                  shape_hint="", swapped=None):
    try:
        out = _as_output(report, _call(report, what, run_mine, module, shape_hint=shape_hint))
    except _Failed:
        if swapped is not None:
            try:
                if _close(_as_output(report, swapped(module)), run_ref()):
                    report.mistake("masks_swapped")
            except Exception:  # noqa: BLE001 - the first error is already reported
                pass
        raise
    _deterministic(report, lambda: run_mine(module), out)
    if _compare(report, f"{what} matches the reference", out, run_ref(), axes, variant):
        return
    for name, call in subs:
        mine = getattr(module, name, None)
        if mine is None:
            continue
        try:
            got = _as_output(report, call(mine))
        except Exception:  # noqa: BLE001 - reported as a submodule difference below
            got = None
        if not _close(got, call(getattr(ref, name))):
            report.mistake("submodule_differs", f"self.{name} alone gives other numbers than "
                           f"the reference", f"run the check for {name} first "
                           f"(check_multi_head_attention / check_feed_forward)")


_LAYER_SHAPES = ("x (N, L_tgt, d_model), memory (N, L_src, d_model); self-attention gets "
                 "tgt_mask (N, L_tgt, L_tgt) (encoder: mask (N, 1, L)), cross-attention gets "
                 "memory_mask (N, 1, L_src) with queries from x and keys/values from memory")


def check_encoder_layer(cls, *, norm_first: bool = False, verbose: bool = True) -> CheckResult:
    """Check ``cls(d_model, n_heads, d_ff, dropout)`` with self_attn (w_q..w_o), feed_forward
    (linear1, linear2), norm1, norm2 and ``forward(x, mask=None)``.

    The reference is :class:`tx_helpers.EncoderLayer` in Post-LN order (the paper); pass
    ``norm_first=True`` when the exercise asks for Pre-LN.
    """
    d_model, n_heads, d_ff = 32, 4, 64

    def body(report: _Report):
        module = _instantiate(report, cls, (d_model, n_heads, d_ff, 0.1),
                              f"cls(d_model={d_model}, n_heads={n_heads}, d_ff={d_ff}, "
                              f"dropout=0.1)")
        torch.manual_seed(7)
        gen = torch.Generator().manual_seed(8)
        ref = EncoderLayer(d_model, n_heads, d_ff, 0.1, norm_first=norm_first).eval()
        _randomize_norms(ref, gen)
        _copy_parameters(report, module, ref)
        x = torch.randn(2, 6, d_model, generator=gen)
        mask = torch.zeros(2, 1, 6, dtype=torch.bool)
        mask[0, 0, -2:] = True

        for m, label in ((None, "forward(x)"), (mask, "forward(x, mask (N, 1, L))")):
            def variant(order, residual, norms, swap, masking=None, m=m):
                mm = None if masking else m
                norm_mods = [ref.norm1, ref.norm2]
                if norms is not None:
                    norm_mods = [norm_mods[i] for i in norms]
                fns = [lambda h: ref.self_attn(h, h, h, mm), ref.feed_forward]
                if swap:
                    fns = fns[::-1]
                return _sublayers(x, list(zip(fns, norm_mods, strict=True)), order, residual)

            axes = _layer_axes(norm_first, 2)
            if m is not None:
                axes["masking"] = [None, ("mask_not_passed", "dropped")]
            args = (x.clone(),) if m is None else (x.clone(), m)
            _layer_probes(report, module, ref, lambda mod, a=args: mod(*a),
                          lambda m=m: ref(x, m), variant, axes,
                          [("self_attn", lambda s, m=m: s(x, x, x, m)),
                           ("feed_forward", lambda f: f(x))], label, _LAYER_SHAPES)

    return _run_check("check_encoder_layer", body, verbose)


def check_decoder_layer(cls, *, norm_first: bool = False, verbose: bool = True) -> CheckResult:
    """Check ``cls(d_model, n_heads, d_ff, dropout)`` with self_attn, cross_attn, feed_forward,
    norm1..norm3 and ``forward(x, memory, tgt_mask=None, memory_mask=None)``.

    The reference is :class:`tx_helpers.DecoderLayer` (Post-LN unless ``norm_first=True``).
    """
    d_model, n_heads, d_ff = 32, 4, 64

    def body(report: _Report):
        module = _instantiate(report, cls, (d_model, n_heads, d_ff, 0.1),
                              f"cls(d_model={d_model}, n_heads={n_heads}, d_ff={d_ff}, "
                              f"dropout=0.1)")
        torch.manual_seed(9)
        gen = torch.Generator().manual_seed(10)
        ref = DecoderLayer(d_model, n_heads, d_ff, 0.1, norm_first=norm_first).eval()
        _randomize_norms(ref, gen)
        _copy_parameters(report, module, ref)
        n, l_tgt, l_src = 2, 5, 7
        x = torch.randn(n, l_tgt, d_model, generator=gen)
        memory = torch.randn(n, l_src, d_model, generator=gen)
        tgt = torch.tensor([[2, 5, 6, 7, 1], [2, 3, 1, 1, 1]])
        tgt_mask = decoder_self_mask(tgt, 1)  # (N, L_tgt, L_tgt)
        mem_mask = torch.zeros(n, 1, l_src, dtype=torch.bool)
        mem_mask[0, 0, -3:] = True

        cases = ((None, None, "forward(x, memory)"),
                 (tgt_mask, mem_mask, "forward(x, memory, tgt_mask (N, L_tgt, L_tgt), "
                                      "memory_mask (N, 1, L_src))"))
        for t_m, m_m, label in cases:
            def variant(order, residual, norms, swap, masking=None, cross=None, t_m=t_m,
                        m_m=m_m):
                tm = None if masking in ("tgt", "both") else t_m
                mm = None if masking in ("memory", "both") else m_m
                norm_mods = [ref.norm1, ref.norm2, ref.norm3]
                if norms is not None:
                    norm_mods = [norm_mods[i] for i in norms]
                if cross == "on_x":
                    def ca(h):
                        return ref.cross_attn(h, h, h, tm)
                elif cross == "self":
                    def ca(h):
                        return ref.self_attn(h, memory, memory, mm)
                else:
                    def ca(h):
                        return ref.cross_attn(h, memory, memory, mm)
                fns = [lambda h: ref.self_attn(h, h, h, tm), ca, ref.feed_forward]
                if swap:
                    fns = [fns[1], fns[0], fns[2]]
                return _sublayers(x, list(zip(fns, norm_mods, strict=True)), order, residual)

            axes = _layer_axes(norm_first, 3)
            axes["cross"] = [None, ("cross_attn_on_x", "on_x"),
                             ("self_attn_reused_for_cross", "self")]
            if t_m is not None:
                axes["masking"] = [None, ("tgt_mask_not_passed", "tgt"),
                                   ("memory_mask_not_passed", "memory")]
            args = (x.clone(), memory.clone()) + (() if t_m is None else (t_m, m_m))
            subs = [("self_attn", lambda s, t_m=t_m: s(x, x, x, t_m)),
                    ("cross_attn", lambda s, m_m=m_m: s(x, memory, memory, m_m)),
                    ("feed_forward", lambda f: f(x))]
            swapped = None if t_m is None else (
                lambda mod, t_m=t_m, m_m=m_m: mod(x.clone(), memory.clone(), m_m, t_m))
            _layer_probes(report, module, ref, lambda mod, a=args: mod(*a),
                          lambda t_m=t_m, m_m=m_m: ref(x, memory, t_m, m_m), variant, axes,
                          subs, label, _LAYER_SHAPES, swapped)

    return _run_check("check_decoder_layer", body, verbose)


# ----------------------------------------------------------------------------------------
# the whole model


def _transformer_variant(ref: Transformer, src, tgt, src_mask, tgt_mask, emb=None,
                         final_norm=None, output=None, memory_mask=True):
    d = ref.config.d_model
    enc, dec = ref.encoder, ref.decoder
    x = enc.embedding(src) * (1.0 if emb in ("both", "src") else math.sqrt(d))
    x = enc.pos_encoding(x)
    for layer in enc.layers:
        x = layer(x, src_mask)
    memory = x if final_norm in ("both", "enc") else enc.norm(x)
    y = dec.embedding(tgt) * (1.0 if emb in ("both", "tgt") else math.sqrt(d))
    y = dec.pos_encoding(y)
    for layer in dec.layers:
        y = layer(y, memory, tgt_mask, src_mask if memory_mask else None)
    y = y if final_norm in ("both", "dec") else dec.norm(y)
    logits = ref.generator(y)
    if output == "softmax":
        return torch.softmax(logits, -1)
    if output == "log_softmax":
        return torch.log_softmax(logits, -1)
    return logits


_TF_AXES = {
    "emb": [None, ("embeddings_not_scaled", "both"), ("embeddings_not_scaled", "src"),
            ("embeddings_not_scaled", "tgt")],
    "final_norm": [None, ("no_final_norm", "both"), ("no_final_norm", "enc"),
                   ("no_final_norm", "dec")],
    "output": [None, ("returns_probabilities", "softmax"),
               ("returns_probabilities", "log_softmax")],
    "memory_mask": [True, ("memory_mask_not_passed", False)],
}


def check_transformer(cls, *, verbose: bool = True) -> CheckResult:
    """Check ``cls(config: tx.ModelConfig)`` with encoder, decoder, generator (tx's submodule
    names) and ``forward(src, tgt, src_mask=None, tgt_mask=None) -> logits``.

    The reference :class:`tx_helpers.Transformer` parameters are copied in by name
    (load_state_dict, strict=False); positional-encoding buffers stay the learner's.
    Masks are passed explicitly: src_mask (N, 1, L_src), tgt_mask (N, L_tgt, L_tgt).
    """
    config = ModelConfig(src_vocab_size=23, tgt_vocab_size=29, d_model=32, n_heads=4, d_ff=64,
                         n_layers=2, dropout=0.1, max_len=64, pad_idx=1)

    def body(report: _Report):
        module = _instantiate(report, cls, (config,), "cls(ModelConfig(src_vocab_size=23, "
                              "tgt_vocab_size=29, d_model=32, n_heads=4, d_ff=64, n_layers=2))")
        torch.manual_seed(11)
        gen = torch.Generator().manual_seed(12)
        ref = Transformer(config).eval()
        _randomize_norms(ref, gen)
        _copy_parameters(report, module, ref)
        src = torch.tensor([[4, 9, 12, 7, 3, 1, 1], [5, 6, 22, 8, 10, 11, 2]])
        tgt = torch.tensor([[2, 7, 3, 28, 1], [2, 4, 13, 9, 17]])
        src_mask = padding_mask(src, 1)
        tgt_mask = decoder_self_mask(tgt, 1)

        def run(s, t, sm, tm, what):
            return _as_output(report, _call(
                report, what, module, s.clone(), t.clone(), sm.clone(), tm.clone(),
                shape_hint="src (N, L_src), tgt (N, L_tgt) token ids; src_mask (N, 1, L_src), "
                "tgt_mask (N, L_tgt, L_tgt); logits (N, L_tgt, tgt_vocab_size)"))

        what = "forward(src, tgt, src_mask, tgt_mask) with L_src=7, L_tgt=5"
        out = run(src, tgt, src_mask, tgt_mask, what)
        expected = ref(src, tgt, src_mask, tgt_mask)
        if out.dim() == 3 and out.shape[-1] == config.d_model != config.tgt_vocab_size:
            report.probe(False, f"logits shape (N, L_tgt, tgt_vocab_size) = "
                         f"{tuple(expected.shape)} (got {tuple(out.shape)})")
            report.mistake("no_generator")
            raise _Failed

        def variant(**kw):
            return _transformer_variant(ref, src, tgt, src_mask, tgt_mask, **kw)

        _deterministic(report, lambda: module(src, tgt, src_mask, tgt_mask), out)
        if not _compare(report, f"logits {tuple(expected.shape)} match the reference", out,
                        expected, _TF_AXES, variant):
            _localize_transformer(report, module, ref, src, tgt, src_mask, tgt_mask)
        # the decoder must not see the future: change the last target token
        tgt2 = tgt.clone()
        tgt2[:, -1] = torch.tensor([20, 21])
        out2 = run(src, tgt2, src_mask, decoder_self_mask(tgt2, 1),
                   "forward with the last target token changed")
        if not report.probe(_close(out[:, :-1], out2[:, :-1]), "changing the last target "
                            "token leaves the earlier positions' logits unchanged"):
            report.mistake("decoder_sees_future")
        # masked source positions must not matter
        src2 = src.clone()
        src2[0, -2:] = torch.tensor([15, 16])
        out3 = run(src2, tgt, src_mask, tgt_mask,
                   "forward with different tokens under the source padding mask")
        if not report.probe(_close(out, out3), "tokens under src_mask do not change the logits"):
            report.mistake("source_padding_leaks")

    return _run_check("check_transformer", body, verbose)


def _localize_transformer(report, module, ref, src, tgt, src_mask, tgt_mask) -> None:
    """Say whether the encoder alone already differs (when it can be called like tx's)."""
    encoder = getattr(module, "encoder", None)
    if encoder is None:
        return
    try:
        mine = encoder(src, src_mask)
    except Exception:  # noqa: BLE001 - a different encoder signature: nothing to say
        return
    if isinstance(mine, torch.Tensor) and not _close(mine, ref.encoder(src, src_mask)):
        report.note("the encoder's output already differs from the reference encoder; "
                    "check its embedding scaling, layers and final norm")


# ----------------------------------------------------------------------------------------
# one training step


_STEP_SHAPES = ("batch = (src (N, L_src), tgt_in (N, L_tgt), tgt_out (N, L_tgt)); logits = "
                "model(src, tgt_in) is (N, L_tgt, V); flatten to (N * L_tgt, V) and "
                "(N * L_tgt,) for the criterion")


def _step_batches(n_steps: int, gen) -> list:
    """Right-padded copy-with-noise batches: pad 0, bos 1, eos 2, tokens 3..10."""
    batches = []
    for _ in range(n_steps):
        src = torch.randint(3, 11, (4, 6), generator=gen)  # (N, L_src)
        src[1, 4:], src[3, 3:] = 0, 0
        body = torch.randint(3, 11, (4, 4), generator=gen)
        tgt = torch.cat([torch.ones(4, 1, dtype=torch.long), body,
                         torch.full((4, 1), 2)], 1)  # (N, 6): <bos> y <eos>
        tgt[2, 4:] = torch.tensor([2, 0])
        batches.append((src, tgt[:, :-1], tgt[:, 1:]))
    return batches


def _number(x) -> float:
    """A float from a Python number or a one-element tensor (which may require grad)."""
    return x.item() if isinstance(x, torch.Tensor) else float(x)


def check_train_step(fn, *, verbose: bool = True) -> CheckResult:
    """Check ``fn(model, batch, optimizer, scheduler, criterion, clip_norm=1.0)``, one training
    step returning ``(loss, grad_norm before clipping)``, against :func:`tx_helpers.train_step`.

    Three steps from the same start must give the reference's losses, norms and weights. A
    plain SGD (lr = the Noam rate) makes zeroing, clipping and the schedule's order visible.
    """
    n_steps, clip = 3, 0.1
    batches = _step_batches(n_steps, torch.Generator().manual_seed(12))
    config = ModelConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2, d_ff=32,
                         n_layers=1, dropout=0.0, max_len=16, pad_idx=0)
    torch.manual_seed(13)
    start = Transformer(config).state_dict()

    def fresh():
        model = Transformer(config)
        model.load_state_dict(start)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = noam_scheduler(optimizer, config.d_model, warmup=2, factor=20.0)
        return model, optimizer, scheduler, nn.CrossEntropyLoss(ignore_index=0,
                                                                 label_smoothing=0.1)

    def flat(model):
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    def variant(zero_grad=True, max_norm=clip, schedule="after", dec_in=1, labels=2):
        model, optimizer, scheduler, criterion = fresh()
        losses, norms = [], []
        for batch in batches:
            logits = model(batch[0], batch[dec_in])  # (N, L_tgt, V)
            loss = criterion(logits.reshape(-1, logits.size(-1)), batch[labels].reshape(-1))
            if zero_grad:
                optimizer.zero_grad()
            loss.backward()
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(),
                                                        max_norm or math.inf)))
            if schedule == "before":
                with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()"
                    warnings.simplefilter("ignore")
                    scheduler.step()
            optimizer.step()
            if schedule == "after":
                scheduler.step()
            losses.append(loss.item())
        return torch.tensor(losses), torch.tensor(norms), flat(model)

    def body(report: _Report):
        with torch.enable_grad():
            model, optimizer, scheduler, criterion = fresh()
            returned = []
            for i, batch in enumerate(batches):
                returned.append(_call(report, f"step {i + 1}: fn(model, batch, optimizer, "
                                      f"scheduler, criterion, clip_norm={clip})", fn, model,
                                      batch, optimizer, scheduler, criterion, clip_norm=clip,
                                      shape_hint=_STEP_SHAPES))
            report.probe(True, f"{n_steps} steps ran without an exception")
            ref_losses, ref_norms, ref_params = variant()
            params = flat(model)
            if not report.probe(not torch.equal(params, flat(fresh()[0])),
                                "the parameters change"):
                report.mistake("no_update")
                raise _Failed
            pairs = [r for r in returned if isinstance(r, (tuple, list)) and len(r) == 2]
            try:
                losses = torch.tensor([_number(r[0]) for r in pairs])
                norms = torch.tensor([_number(r[1]) for r in pairs])
            except (TypeError, ValueError, RuntimeError):
                pairs = []
            if report.probe(len(pairs) == n_steps, "returns (loss, grad_norm) as numbers"):
                _compare(report, "the losses of the three steps match the reference", losses,
                         ref_losses)
                if not _compare(report, "the returned norms are the norms before clipping",
                                norms, ref_norms) and _close(norms, torch.full_like(norms, clip)):
                    report.found.pop("mismatch", None)
                    report.mistake("grad_norm_after_clip")
            else:
                report.mistake("wrong_return", f"got {returned[0]!r}"[:120])
            axes = {"zero_grad": [True, ("no_zero_grad", False)],
                    "max_norm": [clip, ("no_clipping", None)],
                    "schedule": ["after", ("scheduler_not_stepped", "never"),
                                 ("scheduler_before_optimizer", "before")],
                    "dec_in": [1, ("decoder_reads_labels", 2)],
                    "labels": [2, ("labels_not_shifted", 1)]}
            _compare(report, f"the weights after {n_steps} steps match the reference", params,
                     ref_params, axes, lambda **kw: variant(**kw)[2])

    return _run_check("check_train_step", body, verbose)


# ----------------------------------------------------------------------------------------
# finding the learner's objects by name (for grading scripts and the exercise tests)

_CLASS_RULES = (  # (substring of the lower-case name without "_", check)
    ("decoderlayer", check_decoder_layer),
    ("encoderlayer", check_encoder_layer),
    ("multihead", check_multi_head_attention),
    ("mha", check_multi_head_attention),
    ("feedforward", check_feed_forward),
    ("ffn", check_feed_forward),
    ("positional", check_positional_encoding),
)
_MASK_RULES = (  # function name substrings -> check_masks keyword
    ("cross", "cross_fn"),
    ("decoder", "decoder_fn"),
    ("tgt", "decoder_fn"),
    ("lookahead", "lookahead_fn"),
    ("causal", "lookahead_fn"),
    ("subsequent", "lookahead_fn"),
    ("padding", "padding_fn"),
    ("pad", "padding_fn"),
)


def find_checks(namespace: dict, module: str | None = "__main__") -> list[tuple[str, object]]:
    """Pair the learner's classes and functions in ``namespace`` with checks, by name.

    Returns ``[(label, run)]`` where ``run(verbose=True)`` runs the check. Only objects
    defined in ``module`` count (``"__main__"`` in a notebook; None: any). Names:
    ``*DecoderLayer``, ``*EncoderLayer``, ``*MultiHead*``/``*MHA*``, ``*FeedForward*``/
    ``*FFN*``, ``*Positional*`` classes and ``*Transformer`` classes; functions named
    ``*positional*``/``*sinusoid*``, ``*attention*``, ``*train_step*`` and ``*mask*``
    (padding, look-ahead, decoder, cross: all mask functions go to one :func:`check_masks`).
    """
    found, masks = [], {}
    for name, obj in namespace.items():
        if name.startswith("_") or (module is not None
                                    and getattr(obj, "__module__", None) != module):
            continue
        key = name.lower().replace("_", "")
        if isinstance(obj, type) and issubclass(obj, nn.Module):
            check = next((c for sub, c in _CLASS_RULES if sub in key), None)
            if check is None and key.endswith("transformer"):
                check = check_transformer
            if check is not None:
                found.append((f"{check.__name__}({name})", _bind(check, obj)))
        elif callable(obj) and not isinstance(obj, type):
            if "mask" in key:
                kw = next((k for sub, k in _MASK_RULES if sub in key), None)
                if kw is not None and kw not in masks:
                    masks[kw] = obj
            elif "positional" in key or "sinusoid" in key:
                found.append((f"check_positional_encoding({name})",
                              _bind(check_positional_encoding, obj)))
            elif "attention" in key:
                found.append((f"check_attention({name})", _bind(check_attention, obj)))
            elif "trainstep" in key:
                found.append((f"check_train_step({name})", _bind(check_train_step, obj)))
    if masks:
        label = ", ".join(f"{k}={v.__name__}" for k, v in masks.items())

        def run_masks(verbose=True, masks=masks):
            return check_masks(**masks, verbose=verbose)

        found.append((f"check_masks({label})", run_masks))
    return found


def _bind(check, obj):
    def run(verbose=True):
        return check(obj, verbose=verbose)
    return run


def check_namespace(namespace: dict, module: str | None = "__main__",
                    verbose: bool = True) -> list[CheckResult]:
    """Run every check :func:`find_checks` pairs with the objects in ``namespace``.

    In a notebook: ``tx.grading.check_namespace(globals())``.
    """
    return [run(verbose=verbose) for _, run in find_checks(namespace, module)]
