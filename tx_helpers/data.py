"""A small real task with nothing to download: human-written dates -> ISO 8601.

"Monday, 30 November 2026", "11/30/26", "2026年11月30日" ... all become "2026-11-30".
Everything is generated from a seed with Python's own ``random.Random``, so the
data never touch (or depend on) torch's global random state.

Token ids: one character vocabulary, :data:`DATE_VOCAB`, shared by source and
target. Its special tokens come first: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2.
A model for this task must therefore be built with ``pad_idx=0``
(:func:`date_model_config` does it); the article's default ``pad_idx=1`` would
be the BOS token here.

Years run from 1969 to 2068: exactly the window in which Python's ``%y``
(two-digit year) is unambiguous ("69" -> 1969, "68" -> 2068), so every source
string has exactly one correct answer. Train and test come from disjoint sets
of calendar dates (:func:`split_dates`): a test date is never seen in training,
in any format.
"""
from __future__ import annotations

import datetime as dt
import random
from typing import Callable, NamedTuple

import torch

from ._checks import check_positive_int
from .config import ModelConfig
from .decoding import greedy_decode

FIRST_DAY = dt.date(1969, 1, 1)
LAST_DAY = dt.date(2068, 12, 31)

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


class CharVocab:
    """Characters <-> ids, with ``<pad>``, ``<bos>``, ``<eos>`` at ids 0, 1, 2.

    ``encode("2026-11-30", bos=True, eos=True)`` -> [1, ..., 2];
    ``decode(ids)`` skips pad/bos and stops at the first eos.
    ``chars`` may also be a list of multi-character symbols (``tx_helpers.g2p``'s
    phones): ``encode`` then takes a list of them and ``decode_tokens`` gives one back.
    """

    specials = ("<pad>", "<bos>", "<eos>")
    pad_idx, bos_idx, eos_idx = 0, 1, 2

    def __init__(self, chars: str):
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat a character")
        self.itos = list(self.specials) + list(chars)
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"CharVocab({len(self)} tokens: 3 specials + {len(self) - 3} characters)"

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        unknown = sorted({c for c in text if c not in self.stoi})
        if unknown:
            raise ValueError(f"text {text!r} has characters outside the vocabulary: {unknown}")
        ids = [self.stoi[c] for c in text]
        return ([self.bos_idx] if bos else []) + ids + ([self.eos_idx] if eos else [])

    def decode_tokens(self, ids) -> list[str]:
        """ids (list or 1-D tensor) -> symbols, skipping pad/bos, stopping at eos."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            if i == self.eos_idx:
                break
            if i in (self.pad_idx, self.bos_idx):
                continue
            out.append(self.itos[i])
        return out

    def decode(self, ids) -> str:
        """ids (list or 1-D tensor) -> text: :meth:`decode_tokens` joined."""
        return "".join(self.decode_tokens(ids))

    def decode_batch(self, ids) -> list[str]:
        """(N, L) ids -> N strings."""
        return [self.decode(row) for row in ids]


#: The fixed character set of the dates task (independent of any sample).
DATE_VOCAB = CharVocab(
    "0123456789"
    "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    " ,./-"
    "年月日"
)


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _mon(d: dt.date) -> str:
    return MONTHS[d.month - 1][:3]


def _month(d: dt.date) -> str:
    return MONTHS[d.month - 1]


def _weekday(d: dt.date) -> str:
    return WEEKDAYS[d.weekday()]


#: name -> function(date) -> human-written string. Every format names its year
#: unambiguously; the numeric day-first format uses dots so that it can never be
#: confused with the month-first US format.
DATE_FORMATS: dict[str, Callable[[dt.date], str]] = {
    "d Mon yyyy": lambda d: f"{d.day} {_mon(d)} {d.year}",                    # 30 Nov 2026
    "Month d, yyyy": lambda d: f"{_month(d)} {d.day}, {d.year}",              # November 30, 2026
    "mm/dd/yy": lambda d: f"{d.month:02d}/{d.day:02d}/{d.year % 100:02d}",    # 11/30/26
    "Weekday, d Month yyyy": lambda d: f"{_weekday(d)}, {d.day} {_month(d)} {d.year}",
    "yyyy年m月d日": lambda d: f"{d.year}年{d.month}月{d.day}日",                  # 2026年11月30日
    "dd.mm.yyyy": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",            # 30.11.2026
    "yyyy/mm/dd": lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",            # 2026/11/30
    "mon d yyyy": lambda d: f"{_mon(d).lower()} {d.day} {d.year}",            # nov 30 2026
    "dd-Mon-yyyy": lambda d: f"{d.day:02d}-{_mon(d)}-{d.year}",               # 30-Nov-2026
    "yyyymmdd": lambda d: f"{d.year}{d.month:02d}{d.day:02d}",                # 20261130
    "Dth Month yyyy": lambda d: f"{_ordinal(d.day)} {_month(d)} {d.year}",    # 30th November 2026
    "Wkd, Mon d, yyyy": lambda d: f"{_weekday(d)[:3]}, {_mon(d)} {d.day}, {d.year}",  # Mon, Nov 30
    "MONTH d yyyy": lambda d: f"{_month(d).upper()} {d.day} {d.year}",        # NOVEMBER 30 2026
    "m/d/yyyy": lambda d: f"{d.month}/{d.day}/{d.year}",                      # 11/30/2026
    "yyyy-mm-dd": lambda d: d.isoformat(),                                    # already ISO
}


def format_date(day: dt.date, fmt: str) -> str:
    """Write ``day`` in the format named ``fmt`` (a key of :data:`DATE_FORMATS`)."""
    if fmt not in DATE_FORMATS:
        raise ValueError(f"unknown date format {fmt!r}; expected one of {list(DATE_FORMATS)}")
    return DATE_FORMATS[fmt](day)


def all_dates(first: dt.date = FIRST_DAY, last: dt.date = LAST_DAY) -> list[dt.date]:
    """Every calendar date from ``first`` to ``last`` inclusive."""
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


def split_dates(test_fraction: float = 0.1, seed: int = 0) -> tuple[list[dt.date], list[dt.date]]:
    """Shuffle every date in [FIRST_DAY, LAST_DAY] and cut: (train_dates, test_dates).

    The two lists are disjoint by construction; both come back sorted.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    days = all_dates()
    random.Random(seed).shuffle(days)
    n_test = round(len(days) * test_fraction)
    return sorted(days[n_test:]), sorted(days[:n_test])


class DatePairs:
    """Train and test (source, target) string pairs for the dates task.

    ``DatePairs(split_seed=0).sample(n, "train", seed=1)`` draws ``n`` dates from
    the training dates and a random format for each; the same arguments always
    give the same pairs. ``test`` pairs use each test date at most once (as long
    as ``n`` does not exceed the number of test dates).
    """

    def __init__(self, test_fraction: float = 0.1, split_seed: int = 0):
        self.train_dates, self.test_dates = split_dates(test_fraction, split_seed)
        self.formats = list(DATE_FORMATS)

    def sample(self, n: int, split: str = "train", seed: int = 0) -> list[tuple[str, str]]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = random.Random(f"{split}-{seed}")
        pool = self.train_dates if split == "train" else self.test_dates
        if split == "test" and n <= len(pool):
            days = rng.sample(pool, n)  # distinct held-out dates
        else:
            days = [rng.choice(pool) for _ in range(n)]
        return [(format_date(d, rng.choice(self.formats)), d.isoformat()) for d in days]


class Batch(NamedTuple):
    """One padded batch: ``src`` (N, L_src), decoder input ``tgt_in`` (N, L_tgt)
    = <bos> y, and labels ``tgt_out`` (N, L_tgt) = y <eos>, i.e. the target
    shifted by one: position t of the decoder sees tokens < t+1 and predicts
    token t+1.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device) for t in self))


def pad_sequences(seqs: list[list[int]], pad_idx: int) -> torch.Tensor:
    """Right-pad lists of ids to one length: (N, max_len) long tensor."""
    length = max(len(s) for s in seqs)
    return torch.tensor([list(s) + [pad_idx] * (length - len(s)) for s in seqs], dtype=torch.long)



def random_padded_ids(lengths, length: int, vocab: int, pad: int, generator=None) -> torch.Tensor:
    """(len(lengths), length) random ids in [0, vocab) other than ``pad``; row i is ``pad``
    after its first ``lengths[i]`` ids (test and benchmark batches)."""
    ids = torch.randint(0, vocab - 1, (len(lengths), length), generator=generator)
    ids = ids + (ids >= pad).long()  # skip the pad id: values in [0, vocab) \ {pad}
    ids[torch.arange(length)[None, :] >= torch.as_tensor(lengths)[:, None]] = pad
    return ids

def make_batch(pairs, vocab: CharVocab = DATE_VOCAB, device=None) -> Batch:
    """[(source, target), ...] -> :class:`Batch` with padding, BOS/EOS and the shift.

    The full target is <bos> y <eos>; the decoder reads all of it but the last
    token and must predict all of it but the first.
    """
    src = pad_sequences([vocab.encode(s) for s, _ in pairs], vocab.pad_idx)  # (N, L_src)
    tgt = pad_sequences([vocab.encode(t, bos=True, eos=True) for _, t in pairs],
                        vocab.pad_idx)  # (N, L_tgt + 1)
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:])
    return batch if device is None else batch.to(device)


def date_batches(n_batches: int, batch_size: int, seed: int = 0, device=None,
                 pairs: DatePairs | None = None, bucket: int = 1):
    """Yield ``n_batches`` training batches, each drawn afresh with replacement (no epochs).

    ``bucket > 1`` samples ``bucket * batch_size`` pairs at a time, sorts them by
    source length, cuts them into ``bucket`` batches and yields those in random
    order: batches of similar lengths carry less padding, so each step is cheaper.
    """
    check_positive_int("bucket", bucket)
    pairs = pairs or DatePairs()
    rng = random.Random(f"batches-{seed}")
    for chunk in range(0, n_batches, bucket):
        size = min(bucket, n_batches - chunk)
        sample = pairs.sample(size * batch_size, "train", seed=seed * 1_000_003 + chunk)
        if size > 1:
            sample.sort(key=lambda pair: len(pair[0]))
        groups = [sample[i * batch_size:(i + 1) * batch_size] for i in range(size)]
        rng.shuffle(groups)
        for group in groups:
            yield make_batch(group, device=device)


def date_model_config(**overrides) -> ModelConfig:
    """A :class:`ModelConfig` sized to :data:`DATE_VOCAB`, with its ``pad_idx`` (0)."""
    kw = dict(src_vocab_size=len(DATE_VOCAB), tgt_vocab_size=len(DATE_VOCAB),
              pad_idx=DATE_VOCAB.pad_idx, max_len=64)
    return ModelConfig(**{**kw, **overrides})


# ---------------------------------------------------------------- text in, text out

def translate(model, texts, vocab, *, max_len: int = 16, batch_size: int = 512,
              use_cache: bool = True, device=None) -> list[str]:
    """Greedy-decode a list of strings with a character ``vocab``; return strings."""
    if vocab.pad_idx != model.config.pad_idx:
        raise ValueError(f"the vocabulary's pad id ({vocab.pad_idx}) differs from the model's "
                         f"config.pad_idx ({model.config.pad_idx}): build the model for this "
                         f"vocabulary (e.g. tx.date_model_config for tx.DATE_VOCAB)")
    device = device or next(model.parameters()).device
    out = []
    for i in range(0, len(texts), batch_size):
        chunk = texts[i:i + batch_size]
        src = pad_sequences([vocab.encode(t) for t in chunk], vocab.pad_idx)  # (N, L_src)
        ids = greedy_decode(model, src.to(device), bos_idx=vocab.bos_idx, eos_idx=vocab.eos_idx,
                            max_len=max_len, use_cache=use_cache)
        out.extend(vocab.decode_batch(ids.cpu()))
    return out


def exact_match(predictions, targets) -> float:
    """Share of predictions equal to their target string."""
    predictions, targets = list(predictions), list(targets)
    if len(predictions) != len(targets):
        raise ValueError(f"got {len(predictions)} predictions for {len(targets)} targets")
    return sum(p == t for p, t in zip(predictions, targets, strict=True)) / max(len(targets), 1)


def exact_match_accuracy(model, pairs, vocab, *, max_len: int = 16, batch_size: int = 512,
                         use_cache: bool = True, device=None) -> float:
    """Free-running greedy exact-match accuracy on [(source, target), ...] string pairs."""
    sources = [s for s, _ in pairs]
    targets = [t for _, t in pairs]
    predictions = translate(model, sources, vocab, max_len=max_len, batch_size=batch_size,
                            use_cache=use_cache, device=device)
    return exact_match(predictions, targets)
