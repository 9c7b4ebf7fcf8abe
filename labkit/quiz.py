"""Check: the "predict the shape" quiz, answers against shapes computed by tx.

Notebook 11 now grades its shape questions one by one with :func:`check_prediction`
(``### PREDICTION`` lines); this check stays for compatibility, for answers kept as a dict."""
from __future__ import annotations

import torch

from tx_helpers.attention import KVCache, MultiHeadAttention
from tx_helpers.config import ModelConfig
from tx_helpers.masks import decoder_self_mask, lookahead_mask, padding_mask
from tx_helpers.model import Transformer

from .mistakes import MISTAKES
from .report import CheckResult, _call, _Report, _run_check

MISTAKES.update({
    "quiz_wrong_shape": ("a predicted shape differs from the shape the code computes",
                         "read the ✗ lines: each gives the computed shape; work out which "
                         "axis you missed, then open the answer"),
    "quiz_missing_answer": ("a question of the quiz has no answer",
                            "return one shape tuple for every key listed in the report"),
})

QUESTIONS = {  # key -> what the question asks (notebook 11, "Predict the shape")
    "q1": "cross-attention weights, N=2, H=4, L_tgt=5, L_src=7",
    "q2": "the output of that cross-attention (d_model=32)",
    "q3": "tx.lookahead_mask(3, past=4)",
    "q4a": "tx.padding_mask(src) for src (2, 7)",
    "q4b": "tx.decoder_self_mask(tgt, pad) for tgt (2, 5)",
    "q5": "one decoder layer's self-attention key cache after 3 steps, batch 2",
    "q6": "the logits of tx.Transformer(tx.ModelConfig()) for src (4, 9), tgt (4, 6)",
}


def quiz_shapes() -> dict[str, tuple[int, ...]]:
    """The quiz's shapes, computed on real tensors with tx_helpers (small untrained models)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        cross = MultiHeadAttention(32, 4, dropout=0.0).eval()
        out = cross(torch.randn(2, 5, 32), torch.randn(2, 7, 32), torch.randn(2, 7, 32))
        small = Transformer(ModelConfig(d_model=32, n_heads=4, d_ff=64)).eval()
        memory = small.encode(torch.randint(3, 128, (2, 7)))
        cache = KVCache()
        for _ in range(3):
            small.decode(torch.randint(3, 128, (2, 1)), memory, cache=cache)
        logits = Transformer(ModelConfig()).eval()(torch.randint(3, 128, (4, 9)),
                                                    torch.randint(3, 128, (4, 6)))
        shapes = [cross.attn_weights, out, lookahead_mask(3, past=4),
                  padding_mask(torch.ones(2, 7, dtype=torch.long), 0),
                  decoder_self_mask(torch.ones(2, 5, dtype=torch.long), 0),
                  cache.layers[0].self_attn.k, logits]
    return {key: tuple(t.shape) for key, t in zip(QUESTIONS, shapes, strict=True)}


def _as_shape(value):
    """A tuple of ints from a tuple, list or torch.Size; None when it is not a shape."""
    if not isinstance(value, (tuple, list, torch.Size)):
        return None
    ok = all(isinstance(d, int) and not isinstance(d, bool) for d in value)
    return tuple(value) if ok else None


def check_shape_quiz(answers, expected: dict | None = None, *, verbose: bool = True) -> CheckResult:
    """Compare ``answers`` (a dict ``{"q1": (2, 4, 5, 7), ...}``, or a function returning one)
    with ``expected`` (default: :func:`quiz_shapes`), naming each wrong answer and its shape."""

    def body(report: _Report):
        given = _call(report, "answers()", answers) if callable(answers) else answers
        if not report.probe(isinstance(given, dict), "the answers are a dict {question: shape}"):
            report.mistake("wrong_output_type", f"got {type(given).__name__}")
            return
        want = quiz_shapes() if expected is None else {k: tuple(v) for k, v in expected.items()}
        wrong, missing = [], []
        for key, shape in want.items():
            label = f"{key} ({QUESTIONS[key]})" if key in QUESTIONS else key
            if key not in given:
                missing.append(key)
                report.probe(False, f"{label}: no answer; computed {shape}")
                continue
            got = _as_shape(given[key])
            if report.probe(got == shape, f"{label}: {given[key]!r}"
                            + ("" if got == shape else f", computed {shape}")):
                continue
            wrong.append(f"{key} is {shape}, not {given[key]!r}")
        if wrong:
            report.mistake("quiz_wrong_shape", "; ".join(wrong))
        if missing:
            report.mistake("quiz_missing_answer", ", ".join(missing))

    return _run_check("check_shape_quiz", body, verbose, answers if callable(answers) else "")
