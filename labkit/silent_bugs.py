"""Notebook 10's lab: three suspects, each with one bug that does not crash, and the graded
diagnosis.

The suspects come as a colleague's code would: pipelines for the reverse task whose model, batch
maker and initialiser run, train and look right. Which suspect has which bug is the lab's
question, so this module does not say it: :func:`suspect` gives each as a :class:`Pipeline`
(a model builder and a batch maker); ``suspect("control", config)`` is a correct pipeline to
compare the readings with. :func:`verdict` grades a diagnosis from the learner's own table of
readings (``tests/test_silent_bugs.py`` re-measures every suspect under every measurement).
The learner's own measurement is checked by :func:`labkit.leak_map.check_leak_map`; the
fixes by :mod:`labkit.silent_bug_fixes`.
"""
from __future__ import annotations

import functools
import hashlib
import math
from unittest import mock

import torch
from torch import nn

from tx_helpers import attention as _attention
from tx_helpers.attention import MultiHeadAttention
from tx_helpers.model import Transformer

MEASUREMENTS = ("future", "pads", "gap", "entropy")
PIPELINES = ("control", "A", "B", "C")
#: sha256 of "<suspect>:<measurement>" for the measurement that exposes each suspect: the graded
#: answers, stored so that reading this file does not give them away
_EXPOSED_SHA256 = {
    "A": "edfeff80ecbd50b7ad4b2d3297c978f9ea3f22e04b8743aa3d21c93bd4272fd4",
    "B": "2a21048d1ad17f175dd0f5ddcba7254aa74072c2437198cb51a8fab544dbb3fd",
    "C": "d5863d0b09e70df121dcc64cc98509d23dece56115192ef90f61606c070766b7",
}
#: how far from the control's a reading must be to set a pipeline apart (the notebook's readings
#: sit either near the control's or well beyond these)
_FAR = {"future": 0.5, "pads": 1e-3, "gap": 0.3, "entropy": 0.15}
NOT_CREDITED = "another measurement"
#: the first answer graded for each suspect in this session: one answer each, so that a loop
#: over the four measurements cannot ask the verdict which one it credits
_ASKED: dict[str, str] = {}


def _answer_text(answer) -> str | None:
    if not isinstance(answer, str):
        return None
    return answer.strip().strip(chr(34) + chr(39)).lower()


def _is_exposed_by(name: str, answer) -> bool:
    """True when ``answer`` (one of :data:`MEASUREMENTS`, any case) exposes suspect ``name``."""
    if name not in _EXPOSED_SHA256:
        raise ValueError(f"name must be one of {sorted(_EXPOSED_SHA256)}, got {name!r}")
    text = _answer_text(answer)
    if text is None:
        return False
    return hashlib.sha256(f"{name}:{text}".encode()).hexdigest() == _EXPOSED_SHA256[name]


def _missing(readings) -> list[str]:
    """The entries of a readings table that are absent or not a finite number."""
    if not isinstance(readings, dict):
        return ["the whole table (a dict of dicts, readings[pipeline][measurement])"]
    out = []
    for p in PIPELINES:
        row = readings.get(p)
        for m in MEASUREMENTS:
            value = row.get(m) if isinstance(row, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                out.append(f"readings[{p!r}][{m!r}]")
    return out


def _apart(readings) -> dict[str, frozenset]:
    """For each suspect, the measurements whose reading is far from the control's."""
    control = readings["control"]
    return {p: frozenset(m for m in MEASUREMENTS
                         if abs(readings[p][m] - control[m]) > _FAR[m]) for p in PIPELINES[1:]}


def verdict(readings: dict, name: str, answer):
    """The value to grade a diagnosis of suspect ``name`` against: ``answer`` itself when it is
    credited, otherwise a sentence that says why not.

    ``readings[pipeline][measurement]`` is the learner's own table, a number for every pipeline
    of :data:`PIPELINES` and every measurement of :data:`MEASUREMENTS`, read as notebook 10's
    read_ functions read them (its ``small_config()`` and test batch). ``answer`` is credited
    only when the table is complete, agrees with the lab kit's own re-measurement of fresh
    pipelines, and its readings set suspect ``name`` apart from the control on that measurement
    alone. Each suspect takes one answer a session (a kernel): another answer is refused."""
    if name not in _EXPOSED_SHA256:
        raise ValueError(f"name must be one of {sorted(_EXPOSED_SHA256)}, got {name!r}")
    missing = _missing(readings)
    if missing:
        return ("no credit yet: the readings table lacks a number at " + ", ".join(missing[:4])
                + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
    if not _agrees_with_kit(readings):
        return ("no credit: these readings disagree with the lab kit's re-measurement of fresh "
                "pipelines; build the table from the four read_ functions")
    text = _answer_text(answer)
    if text is None:
        return NOT_CREDITED  # no answer yet: nothing is recorded
    first = _ASKED.setdefault(name, text)
    if first != text:
        return (f"no credit: suspect {name} was already answered {first!r} in this session; one "
                "answer per suspect: restart the kernel and run the notebook to grade another")
    if _apart(readings)[name] == {text} and _is_exposed_by(name, text):
        return answer
    return NOT_CREDITED




# ---------------------------------------------------------------- a colleague's model

def _colleague_core(q, k, v, mask=None, dropout=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., L_q, L_k)
    weights = torch.softmax(scores, dim=-1)  # (..., L_q, L_k)
    if mask is not None:
        weights = weights.masked_fill(mask, 0.0)  # masked keys end at weight 0
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights  # (..., L_q, d_v), (..., L_q, L_k)


class _ColleagueCrossAttention(MultiHeadAttention):
    """The colleague's cross-attention: tx's module with its own attention core."""

    def forward(self, query, key, value, mask=None, cache=None):
        with mock.patch.object(_attention, "scaled_dot_product_attention", _colleague_core):
            return super().forward(query, key, value, mask, cache)


def _colleague_model(config, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(config)
    for layer in model.decoder.layers:
        layer.cross_attn.__class__ = _ColleagueCrossAttention
    return model


# ---------------------------------------------------------------- a colleague's batches

_SLICES = {"tgt_in": slice(0, -1), "tgt_out": slice(0, -1)}  # the colleague's config


def _reverse_targets(n_batches: int, batch_size: int, seed: int, vocab: int, length: int,
                     bos: int, eos: int):
    """Reverse-task sources and full targets ``<bos> reversed(src) <eos>``, seeded."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_batches):
        src = torch.randint(3, vocab, (batch_size, length), generator=g)  # (N, L)
        tgt = torch.cat([torch.full((batch_size, 1), bos), src.flip(1),
                         torch.full((batch_size, 1), eos)], dim=1)  # (N, L + 2)
        yield src, tgt


def _colleague_batches(n_batches: int, batch_size: int = 32, seed: int = 0, *, vocab: int = 16,
                       length: int = 8, bos: int = 1, eos: int = 2):
    for src, tgt in _reverse_targets(n_batches, batch_size, seed, vocab, length, bos, eos):
        yield src, tgt[:, _SLICES["tgt_in"]], tgt[:, _SLICES["tgt_out"]]  # (N, L + 1) each


# ---------------------------------------------------------------- a colleague's initialiser

_INIT = {"matrices": "xavier", "embeddings": "normal"}  # the colleague's config


def _colleague_init(model: Transformer) -> Transformer:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                continue
            kind = _INIT["embeddings"] if name.endswith("embedding.weight") else _INIT["matrices"]
            if kind == "xavier":
                nn.init.xavier_uniform_(p)
            else:
                nn.init.normal_(p)
    return model


# ---------------------------------------------------------------- the suspects as pipelines

def _reverse_batches(n_batches: int, batch_size: int = 32, seed: int = 0, *, vocab: int = 16,
                     length: int = 8, bos: int = 1, eos: int = 2):
    for src, tgt in _reverse_targets(n_batches, batch_size, seed, vocab, length, bos, eos):
        yield src, tgt[:, :-1], tgt[:, 1:]  # (N, L + 1) each: shifted by one


class Pipeline:
    """A colleague's pipeline for the reverse task: ``model(seed=0)`` builds a fresh,
    initialised model; ``batches(n_batches, batch_size=32, seed=0)`` yields training batches
    ``(src, tgt_in, tgt_out)``. Which part holds the bug is for the measurements to say."""

    def __init__(self, name: str, config, build, batches):
        self.name, self.config, self._build, self._batches = name, config, build, batches

    def model(self, seed: int = 0) -> Transformer:
        return self._build(self.config, seed)

    def batches(self, n_batches: int, batch_size: int = 32, seed: int = 0):
        return self._batches(n_batches, batch_size, seed, vocab=self.config.tgt_vocab_size)

    def __repr__(self) -> str:
        return f"<suspect {self.name}: a model builder and a batch maker>"


def _plain(config, seed):
    torch.manual_seed(seed)
    return Transformer(config)


_PARTS = ("model", "batches", "init")


def _faulty_part(name: str) -> str | None:
    """The part of pipeline ``name`` that is the colleague's (None for the control)."""
    if name == "control":
        return None
    digest = hashlib.sha256(f"pipeline-20:{name}".encode()).hexdigest()
    return _PARTS[int(digest, 16) % len(_PARTS)]


def suspect(name: str, config) -> Pipeline:
    """Suspect ``"A"``, ``"B"`` or ``"C"`` as a :class:`Pipeline` for ``config``; ``"control"``
    is a correct pipeline (a plain ``tx.Transformer`` and shifted batches), the reference that
    each measurement's readings on the suspects are compared with."""
    if name not in PIPELINES:
        raise ValueError(f"name must be one of {sorted(PIPELINES)}, got {name!r}")
    part = _faulty_part(name)
    build = {"model": _colleague_model,
             "init": lambda c, s: _colleague_init(_plain(c, s))}.get(part, _plain)
    batches = _colleague_batches if part == "batches" else _reverse_batches
    return Pipeline(name, config, build, batches)


def _default_config():
    from tx_helpers.config import ModelConfig

    return ModelConfig(src_vocab_size=16, tgt_vocab_size=16, d_model=32, n_heads=4, d_ff=64,
                       n_layers=2, dropout=0.0, pad_idx=0, max_len=32)


#: the notebook's test batch: 200 reverse-task sequences drawn under seed 123
_TEST_BATCH = {"n_batches": 1, "batch_size": 200, "seed": 123}


@functools.lru_cache(maxsize=1)
def _kit_readings() -> dict[str, dict]:
    """The lab kit's own quick readings of fresh pipelines: the pads and entropy readings as the
    notebook defines them, on its test batch; the future reading on a fresh model by changing
    every later input; the gap, which needs a training run, read from one batch instead (labels
    equal to the decoder input make the teacher-forced accuracy a copy)."""
    config = _default_config()
    src, tgt_in, _ = next(_reverse_batches(**_TEST_BATCH, vocab=config.tgt_vocab_size))
    padded = torch.nn.functional.pad(src, (0, 3), value=config.pad_idx)  # (N, L + 3)
    clean = _entropy(_plain(config, 0), src)
    table = {}
    for name in PIPELINES:
        pipe = suspect(name, config)
        model = pipe.model()
        with torch.no_grad():
            base = model(src, tgt_in)  # (N, L_tgt, V)
            future = 0
            for t in range(tgt_in.size(1) - 1):
                changed = tgt_in[:16].clone()
                changed[:, t + 1:] = 3 + (changed[:, t + 1:] - 2) % (config.tgt_vocab_size - 3)
                future += int((model(src[:16], changed)[:, t] - base[:16, t]).abs().max() > 1e-4)
            pads = (base - model(padded, tgt_in)).abs().max().item()
        _, b_in, b_out = next(pipe.batches(1, 4))
        table[name] = {"future": future, "pads": pads, "gap": float(torch.equal(b_in, b_out)),
                       "entropy": _entropy(pipe.model(), src) / clean}
    return table


def _agrees_with_kit(readings) -> bool:
    """The readings set the same suspects apart as the kit's, and the pads and entropy readings
    are the kit's numbers (to round-off)."""
    kit = _kit_readings()
    if _apart(readings) != _apart(kit):
        return False
    return all(math.isclose(readings[p][m], kit[p][m], rel_tol=1e-3, abs_tol=1e-4)
               for p in PIPELINES for m in ("pads", "entropy"))


def _entropy(model, src) -> float:
    with torch.no_grad():
        model.encode(src)
    w = torch.stack([layer.self_attn.attn_weights for layer in model.encoder.layers])
    return -torch.xlogy(w, w).sum(-1).mean().item()  # nats, mean over layers, heads, queries


# ---------------------------------------------------------------- the learner's measurement
