import datetime as dt

import pytest
import torch

from tx_helpers.data import (
    DATE_FORMATS,
    DATE_VOCAB,
    FIRST_DAY,
    LAST_DAY,
    DatePairs,
    date_batches,
    date_model_config,
    format_date,
    make_batch,
    split_dates,
)

DAY = dt.date(2026, 11, 30)  # a Monday


def test_format_examples():
    assert format_date(DAY, "d Mon yyyy") == "30 Nov 2026"
    assert format_date(DAY, "Month d, yyyy") == "November 30, 2026"
    assert format_date(DAY, "mm/dd/yy") == "11/30/26"
    assert format_date(DAY, "Weekday, d Month yyyy") == "Monday, 30 November 2026"
    assert format_date(DAY, "yyyy年m月d日") == "2026年11月30日"
    assert format_date(DAY, "dd.mm.yyyy") == "30.11.2026"
    assert format_date(DAY, "yyyy/mm/dd") == "2026/11/30"
    assert format_date(DAY, "mon d yyyy") == "nov 30 2026"
    assert format_date(dt.date(2001, 3, 1), "Dth Month yyyy") == "1st March 2001"
    assert format_date(dt.date(2001, 3, 12), "Dth Month yyyy") == "12th March 2001"
    assert format_date(dt.date(2001, 3, 23), "Dth Month yyyy") == "23rd March 2001"
    with pytest.raises(ValueError, match="unknown date format"):
        format_date(DAY, "nope")


def test_weekdays_and_two_digit_years_agree_with_python():
    for day in (FIRST_DAY, LAST_DAY, dt.date(2000, 2, 29), DAY):
        text = format_date(day, "Weekday, d Month yyyy")
        assert dt.datetime.strptime(text, "%A, %d %B %Y").date() == day
        # the year window is exactly the one where %y is unambiguous
        assert dt.datetime.strptime(format_date(day, "mm/dd/yy"), "%m/%d/%y").date() == day


def test_every_format_encodes_and_round_trips():
    assert len(DATE_FORMATS) >= 10
    for fmt in DATE_FORMATS:
        text = format_date(DAY, fmt)
        assert DATE_VOCAB.decode(DATE_VOCAB.encode(text, bos=True, eos=True)) == text
        assert DATE_VOCAB.decode(torch.tensor(DATE_VOCAB.encode(text))) == text


def test_vocab_specials_and_errors():
    v = DATE_VOCAB
    assert (v.pad_idx, v.bos_idx, v.eos_idx) == (0, 1, 2)
    assert v.decode([v.bos_idx, v.stoi["7"], v.eos_idx, v.stoi["9"], v.pad_idx]) == "7"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        v.encode("30 Nov 2026 ☃")
    cfg = date_model_config()
    assert cfg.pad_idx == v.pad_idx and cfg.src_vocab_size == len(v)


def test_generator_is_deterministic_and_covers_all_formats():
    a = DatePairs().sample(500, "train", seed=3)
    b = DatePairs().sample(500, "train", seed=3)
    c = DatePairs().sample(500, "train", seed=4)
    assert a == b and a != c
    seen = set()
    for text, iso in a:
        day = dt.date.fromisoformat(iso)
        fmts = {f for f in DATE_FORMATS if format_date(day, f) == text}
        assert fmts, text  # every source is one of the formats of its target date
        seen |= fmts
    assert seen == set(DATE_FORMATS)  # and 500 samples use every format


def test_splits_share_no_date():
    train, test = split_dates()
    assert not set(train) & set(test)
    assert len(train) + len(test) == (LAST_DAY - FIRST_DAY).days + 1
    pairs = DatePairs()
    train_days = {t for _, t in pairs.sample(5000, "train", seed=0)}
    test_pairs = pairs.sample(1000, "test", seed=0)
    test_days = [t for _, t in test_pairs]
    assert len(set(test_days)) == 1000  # distinct held-out dates
    assert not train_days & set(test_days)
    assert split_dates() == (train, test)


def test_batch_shift_padding_and_specials():
    pairs = [("30 Nov 2026", "2026-11-30"), ("20261130", "2026-11-30")]
    b = make_batch(pairs)
    v = DATE_VOCAB
    assert b.src.shape == (2, 11) and b.tgt_in.shape == (2, 11) == b.tgt_out.shape
    assert b.src[1, 8:].tolist() == [v.pad_idx] * 3  # shorter source is right-padded
    assert (b.tgt_in[:, 0] == v.bos_idx).all() and (b.tgt_out[:, -1] == v.eos_idx).all()
    assert torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1])  # shifted by one
    assert int((b.tgt_out != v.pad_idx).sum()) == 22  # 2 x (10 characters + <eos>), no pad
    src, tgt_in, tgt_out = b  # unpacks like a tuple
    assert v.decode(tgt_out[0]) == "2026-11-30"
    batches = list(date_batches(3, 8, seed=1))
    assert len(batches) == 3 and batches[0].src.size(0) == 8
    again = date_batches(3, 8, seed=1)
    assert all(torch.equal(x.src, y.src) for x, y in zip(batches, again, strict=True))


def test_bucketed_batches_are_deterministic_and_less_padded():
    plain = list(date_batches(8, 32, seed=2))
    bucketed = list(date_batches(8, 32, seed=2, bucket=4))
    again = list(date_batches(8, 32, seed=2, bucket=4))
    assert len(bucketed) == 8 and all(b.src.size(0) == 32 for b in bucketed)
    assert all(torch.equal(x.src, y.src) for x, y in zip(bucketed, again, strict=True))
    def pads(batches):
        return sum(int((b.src == DATE_VOCAB.pad_idx).sum()) for b in batches)

    assert pads(bucketed) < pads(plain) / 2
    with pytest.raises(ValueError, match="bucket must be positive"):
        next(date_batches(1, 4, bucket=0))
