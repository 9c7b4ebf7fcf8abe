"""English pronunciation from spelling (grapheme-to-phoneme, G2P) on the CMU Pronouncing Dictionary.

The public face of notebook 13's task: ``tx.g2p.*``. The dictionary reader, the
vocabularies, the split and the batches live in :mod:`tx_helpers.g2p_data`, the
recipes in :mod:`tx_helpers.recipes`; both are re-exported here. This module adds
the scores, the shipped model and what is done with a model: :func:`pronounce`,
:func:`evaluate`, :func:`cross_attention` and :func:`live_run`, the one code path
behind notebook 13's live run and ``make bench``.

Scoring: a word counts as right when its phones equal *any* of its reference
pronunciations (word error rate, WER). The phone error rate (PER) is the edit
distance to the closest reference, summed over words, over the summed length of
those references.
"""
from __future__ import annotations

import functools

import torch

from ._checks import check_positive_int
from .data import pad_sequences
from .decoding import _eval_mode, beam_search, greedy_decode
from .g2p_data import (
    LETTER_VOCAB,
    MAX_WORD_LEN,
    PHONE_VOCAB,
    PHONES,
    SHOWCASE,
    check_words,
    cmudict_path,
    g2p_batches,
    g2p_model_config,
    g2p_pairs,
    g2p_training,
    load_lexicon,
    make_g2p_batch,
    split_words,
    strip_stress,
)
from .notebook import get_device
from .pretrained import load_pretrained as _load_pretrained
from .pretrained import train_from_recipe
from .recipes import G2P_RECIPE, LIVE_RECIPE

__all__ = [
    "PHONES", "LETTER_VOCAB", "PHONE_VOCAB", "MAX_WORD_LEN", "SHOWCASE", "G2P_RECIPE",
    "LIVE_RECIPE", "cmudict_path", "strip_stress", "load_lexicon", "split_words", "check_words",
    "g2p_pairs", "make_g2p_batch", "g2p_batches", "g2p_model_config", "g2p_training",
    "edit_distance", "word_error_rate", "phone_error_rate", "load_pretrained", "pronounce",
    "evaluate", "cross_attention", "live_run",
]


# ---------------------------------------------------------------- metrics

def edit_distance(a, b) -> int:
    """Levenshtein distance between two sequences (insertions, deletions, substitutions)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def _check_scored(predictions, references) -> None:
    predictions, references = list(predictions), list(references)
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} words; "
                         f"expected one prediction per word")
    if not references:
        raise ValueError("references is empty: there is nothing to score")
    for i, refs in enumerate(references):
        if not refs or isinstance(refs[0], str):
            raise ValueError(f"references[{i}] must be a non-empty list of pronunciations "
                             f"(each a list of phones), got {refs!r}")


def word_error_rate(predictions, references) -> float:
    """Share of words whose predicted phones equal none of their reference pronunciations.

    ``predictions``: one list of phones per word; ``references``: per word, a list of
    its pronunciations (each a list of phones).
    """
    _check_scored(predictions, references)
    wrong = sum(list(p) not in [list(r) for r in refs]
                for p, refs in zip(predictions, references, strict=True))
    return wrong / len(references)


def phone_error_rate(predictions, references) -> float:
    """Edit distance to the closest reference pronunciation, summed over words, divided
    by the summed length of those closest references (ties: the first one listed)."""
    _check_scored(predictions, references)
    errors = length = 0
    for p, refs in zip(predictions, references, strict=True):
        distance, ref = min((edit_distance(p, r), i) for i, r in enumerate(refs))
        errors += distance
        length += len(refs[ref])
    return errors / length


# ---------------------------------------------------------------- the trained model

@functools.lru_cache(maxsize=1)
def _shipped(device: str):
    return _load_pretrained("g2p", device)[0]


def load_pretrained(device=None):
    """The shipped G2P model (checked against its checksum and recipe), in eval mode.

    ``make models`` trains it from :data:`G2P_RECIPE`; see :mod:`tx_helpers.pretrained`.
    """
    return _shipped(str(get_device() if device is None else torch.device(device)))


def _check_model(model) -> None:
    config = getattr(model, "config", None)
    sizes = (getattr(config, "src_vocab_size", None), getattr(config, "tgt_vocab_size", None))
    if sizes != (len(LETTER_VOCAB), len(PHONE_VOCAB)):
        raise ValueError(f"model must read {len(LETTER_VOCAB)} letter ids and write "
                         f"{len(PHONE_VOCAB)} phone ids (a tx.Transformer built with "
                         f"g2p_model_config()), got vocabulary sizes {sizes}")


@torch.no_grad()
def pronounce(words, *, model=None, beam_size: int = 1, batch_size: int = 512) -> list[list[str]]:
    """Phones for each word, no stress digits: ``pronounce(["knight"])`` -> ``[["N", "AY", "T"]]``.

    ``model`` defaults to the shipped one (:func:`load_pretrained`). ``beam_size=1``
    decodes greedily; a larger beam runs :func:`tx.beam_search` and keeps its best
    hypothesis. Words are batched by length (less padding); the output keeps their order.
    """
    words = check_words(words)
    check_positive_int("beam_size", beam_size)
    check_positive_int("batch_size", batch_size)
    model = load_pretrained() if model is None else model
    _check_model(model)
    device = next(model.parameters()).device
    order = sorted(range(len(words)), key=lambda i: len(words[i]))
    out: list[list[str]] = [[] for _ in words]
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        src = pad_sequences([LETTER_VOCAB.encode(words[i]) for i in chunk],
                            LETTER_VOCAB.pad_idx).to(device)  # (N, L_src)
        kw = dict(bos_idx=PHONE_VOCAB.bos_idx, eos_idx=PHONE_VOCAB.eos_idx, max_len=MAX_WORD_LEN)
        if beam_size == 1:
            ids = greedy_decode(model, src, **kw)  # (N, L)
        else:
            ids = beam_search(model, src, beam_size=beam_size, **kw).tokens[:, 0]  # (N, L)
        for i, row in zip(chunk, ids.cpu(), strict=True):
            out[i] = PHONE_VOCAB.decode_tokens(row)
    return out


def evaluate(words, *, model=None, beam_size: int = 1, lexicon=None) -> dict:
    """WER and PER of ``pronounce`` on ``words`` against the dictionary (no stress).

    Returns ``{"wer", "per", "words", "predictions", "unfinished"}``. ``unfinished``
    counts the predictions that never wrote ``<eos>`` and were cut at the decoding limit
    of :data:`MAX_WORD_LEN` phones (no dictionary entry is that long): each is a wrong
    word, and adds about 25 phone errors, so a few of them move the PER, not the WER.
    """
    lexicon = load_lexicon() if lexicon is None else lexicon
    missing = [w for w in words if w not in lexicon][:5]
    if missing:
        raise ValueError(f"words must be in the dictionary to be scored, got {missing}")
    predictions = pronounce(list(words), model=model, beam_size=beam_size)
    references = [lexicon[w] for w in words]
    return {"wer": word_error_rate(predictions, references),
            "per": phone_error_rate(predictions, references),
            "words": len(words), "predictions": predictions,
            "unfinished": sum(len(p) >= MAX_WORD_LEN for p in predictions)}


@torch.no_grad()
def cross_attention(word: str, phones=None, *, model=None):
    """Where each output phone looks among the letters: ``(phones, weights)``.

    Teacher-forces ``phones`` (default: the model's own greedy pronunciation) and
    returns every decoder layer's cross-attention weights, (n_layers, H, L_phones + 1,
    L_letters): row t is the step that predicts phone t, the last row predicts <eos>.
    The model must use the manual attention backend (it keeps its weights).
    """
    word = check_words([word])[0]
    model = load_pretrained() if model is None else model
    _check_model(model)
    if phones is None:
        phones = pronounce([word], model=model)[0]
    device = next(model.parameters()).device
    src = torch.tensor([LETTER_VOCAB.encode(word)], device=device)  # (1, L_letters)
    tgt_in = torch.tensor([PHONE_VOCAB.encode(phones, bos=True)], device=device)  # (1, L_ph+1)
    with _eval_mode(model):
        model(src, tgt_in)
    weights = [layer.cross_attn.attn_weights for layer in model.decoder.layers]
    if any(w is None for w in weights):
        raise ValueError("cross_attention needs attn_backend='manual' (the sdpa backend does "
                         f"not keep attention weights), got {model.config.attn_backend!r}")
    return list(phones), torch.stack([w[0] for w in weights]).cpu()  # (layers, H, L_ph+1, L_let)


def live_run(recipe: dict = LIVE_RECIPE, *, progress: bool = False, lexicon=None) -> dict:
    """Train ``recipe``'s model on the CPU, then score it greedily on the validation words.

    The one code path behind notebook 13's live run and the G2P live row of ``make
    bench``: the model is built and trained by :func:`tx_helpers.pretrained.train_from_recipe`
    (what ``make models`` runs, minus its single thread: torch's current thread count is
    used), and scored by :func:`evaluate` on ``split_words(**recipe["split"])[1]``.
    Returns :func:`evaluate`'s dict plus ``"model"`` (on the CPU, in eval mode) and
    ``"history"``. The numbers depend on the machine (CPU kernels and thread count change
    the arithmetic), never on who calls this.
    """
    lexicon = load_lexicon() if lexicon is None else lexicon
    valid = split_words(lexicon, **recipe["split"])[1]
    model, history = train_from_recipe(recipe, progress=progress)
    return {**evaluate(valid, model=model, lexicon=lexicon), "model": model, "history": history}
