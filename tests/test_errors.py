"""A learner's likely mistakes give a ValueError/TypeError naming the argument, got and expected."""
from __future__ import annotations

import re

import pytest
import torch
from conftest import D_MODEL, N_HEADS, SRC_VOCAB, TGT_VOCAB, small_config

import tx_helpers as tx


@pytest.fixture(scope="module")
def model():
    return tx.Transformer(small_config(max_len=10)).eval()


@pytest.fixture(scope="module")
def mha():
    return tx.MultiHeadAttention(D_MODEL, N_HEADS, dropout=0.0)


def _ids(n, length, vocab=SRC_VOCAB):
    return torch.randint(2, vocab, (n, length))


# ---------------------------------------------------------------- configuration

def test_d_model_not_divisible_by_n_heads():
    with pytest.raises(ValueError, match=r"d_model=100 is not divisible by n_heads=8"):
        tx.ModelConfig(d_model=100, n_heads=8)
    # the message suggests a d_model and the divisors of d_model nearest to n_heads
    with pytest.raises(ValueError, match=r"\(try d_model=96, or n_heads=5 or 10\)"):
        tx.ModelConfig(d_model=100, n_heads=8)
    with pytest.raises(ValueError, match=r"\(try d_model=1020, or n_heads=8 or 16\)"):
        tx.ModelConfig.paper_big(n_heads=12)
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_heads=4"):
        tx.MultiHeadAttention(10, 4)


@pytest.mark.parametrize("pad_idx", [128, -1, 500])
def test_pad_idx_outside_vocab(pad_idx):
    with pytest.raises(ValueError, match=rf"pad_idx={pad_idx} .*0 <= pad_idx < src_vocab_size=128"):
        tx.ModelConfig(pad_idx=pad_idx)


def test_pad_idx_outside_smaller_tgt_vocab():
    with pytest.raises(ValueError, match=r"pad_idx=20 .*tgt_vocab_size=10"):
        tx.ModelConfig(src_vocab_size=50, tgt_vocab_size=10, pad_idx=20)


@pytest.mark.parametrize("p", [1.0, -0.1, 1.5])
def test_dropout_outside_unit_interval(p):
    with pytest.raises(ValueError, match=rf"dropout must be in \[0, 1\), got dropout={p}"):
        tx.ModelConfig(dropout=p)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        tx.MultiHeadAttention(D_MODEL, N_HEADS, dropout=p)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        tx.PositionalEncoding(D_MODEL, 10, dropout=p)


@pytest.mark.parametrize("p", [0.0, 0.5, 0])
def test_dropout_inside_unit_interval_is_fine(p):
    assert tx.ModelConfig(dropout=p).dropout == p
    tx.FeedForward(D_MODEL, 32, dropout=p)


def test_dropout_wrong_type():
    with pytest.raises(TypeError, match=r"dropout must be a float in \[0, 1\), got str"):
        tx.ModelConfig(dropout="0.1")


@pytest.mark.parametrize("name", ["src_vocab_size", "tgt_vocab_size", "d_model", "n_heads",
                                  "d_ff", "n_layers", "max_len"])
@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_sizes(name, value):
    with pytest.raises(ValueError, match=rf"{name} must be positive, got {name}={value}"):
        tx.ModelConfig(**{name: value})


@pytest.mark.parametrize("name", ["d_model", "n_heads", "d_ff", "n_layers", "max_len"])
def test_non_int_sizes(name):
    with pytest.raises(TypeError, match=rf"{name} must be an int, got float \(128.0\)"):
        tx.ModelConfig(**{name: 128.0})


def test_bool_sizes_are_refused():
    with pytest.raises(TypeError, match=r"n_layers must be an int, got bool"):
        tx.ModelConfig(n_layers=True)


@pytest.mark.parametrize("build, message", [
    (lambda: tx.MultiHeadAttention(0, 1), r"d_model must be positive, got d_model=0"),
    (lambda: tx.MultiHeadAttention(16, 2.0), r"n_heads must be an int, got float"),
    (lambda: tx.FeedForward(16, -1), r"d_ff must be positive, got d_ff=-1"),
    (lambda: tx.Encoder(0, 16, 2, 32, 1), r"vocab_size must be positive, got vocab_size=0"),
    (lambda: tx.Decoder(10, 16, 2, 32, 0), r"n_layers must be positive, got n_layers=0"),
    (lambda: tx.PositionalEncoding(16, 0), r"max_len must be positive, got max_len=0"),
    (lambda: tx.sinusoidal_table(10, 16.0), r"d_model must be an int, got float"),
])
def test_module_sizes_checked(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_share_embeddings_needs_one_vocab():
    with pytest.raises(ValueError, match=r"share_embeddings=True .*src_vocab_size=100 "
                                         r"and tgt_vocab_size=120"):
        tx.ModelConfig(src_vocab_size=100, tgt_vocab_size=120, share_embeddings=True)


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"attn_backend must be one of .*'flash'"):
        tx.ModelConfig(attn_backend="flash")
    with pytest.raises(ValueError, match=r"backend must be one of .*backend='flash'"):
        tx.MultiHeadAttention(16, 2, backend="flash")


def test_transformer_needs_a_config():
    with pytest.raises(TypeError, match=r"config must be a ModelConfig, got dict"):
        tx.Transformer({"d_model": 16})


# ---------------------------------------------------------------- token ids

def test_sequence_longer_than_max_len_through_full_model(model):
    with pytest.raises(ValueError, match=r"L=11 tokens from start=0 need positions 0\.\.10, "
                       r"but the table has max_len=10 rows"):
        model(_ids(2, 11), _ids(2, 3, TGT_VOCAB))
    with pytest.raises(ValueError, match=r"L=12 tokens from start=0 .* max_len=10 rows"):
        model(_ids(2, 3), _ids(2, 12, TGT_VOCAB))


def test_float_token_ids(model):
    with pytest.raises(TypeError, match=r"src must hold integer token ids .*dtype torch.float32"):
        model(_ids(2, 4).float(), _ids(2, 3, TGT_VOCAB))
    with pytest.raises(TypeError, match=r"tgt must hold integer token ids .*torch.float32"):
        model(_ids(2, 4), _ids(2, 3, TGT_VOCAB).float())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.bool])
def test_token_dtypes_embedding_cannot_take(model, dtype):
    """nn.Embedding takes only int64/int32 ids; others used to fail inside F.embedding."""
    with pytest.raises(TypeError, match=rf"src must hold integer token ids .*{dtype}"):
        model(_ids(2, 4).to(dtype), _ids(2, 3, TGT_VOCAB))


def test_int32_token_ids_work(model):
    assert model(_ids(2, 4).int(), _ids(2, 3, TGT_VOCAB).int()).shape == (2, 3, TGT_VOCAB)


def test_token_ids_out_of_vocab(model):
    src = _ids(2, 4)
    src[1, 2] = SRC_VOCAB
    with pytest.raises(ValueError, match=rf"src contains token id {SRC_VOCAB}, outside the "
                                         rf"vocabulary \[0, {SRC_VOCAB}\)"):
        model(src, _ids(2, 3, TGT_VOCAB))
    tgt = _ids(2, 3, TGT_VOCAB)
    tgt[0, 0] = -3
    with pytest.raises(ValueError, match=rf"tgt contains token id -3, outside the vocabulary "
                                         rf"\[0, {TGT_VOCAB}\)"):
        model(_ids(2, 4), tgt)


def test_token_ids_missing_batch_dimension(model):
    with pytest.raises(ValueError, match=r"src must have shape \(N, L\), got \(4,\) "
                                         r"\(missing batch dimension"):
        model(torch.tensor([2, 3, 4, 5]), _ids(1, 3, TGT_VOCAB))
    with pytest.raises(ValueError, match=r"tgt must have shape \(N, L\), got \(3,\)"):
        model.decode(torch.tensor([2, 3, 4]), torch.randn(1, 4, D_MODEL))


def test_src_tgt_batch_sizes_differ(model):
    with pytest.raises(ValueError, match=r"batch sizes differ: src has N=2 .*tgt has N=3"):
        model(_ids(2, 4), _ids(3, 3, TGT_VOCAB))


def test_list_instead_of_tensor(model):
    with pytest.raises(TypeError, match=r"src must be a torch.Tensor of token ids, got list"):
        model([[2, 3, 4]], [[2, 3]])
    with pytest.raises(TypeError, match=r"seq must be a torch.Tensor of token ids .*got list"):
        tx.padding_mask([[2, 3, 1]], 1)


def test_empty_batch_works(model):
    assert model(_ids(0, 4), _ids(0, 3, TGT_VOCAB)).shape == (0, 3, TGT_VOCAB)


def test_empty_sequence_is_refused(model):
    with pytest.raises(ValueError, match=r"tgt must have at least one token .*\(2, 0\)"):
        model(_ids(2, 4), _ids(2, 0, TGT_VOCAB))
    with pytest.raises(ValueError, match=r"src must have at least one token .*\(2, 0\)"):
        model(_ids(2, 0), _ids(2, 3, TGT_VOCAB))


# ---------------------------------------------------------------- features and masks

def test_feature_size_differs_from_d_model(mha):
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(ValueError, match=rf"query has feature size 12, expected d_model={D_MODEL}"):
        mha(torch.randn(2, 5, 12), x, x)
    with pytest.raises(ValueError, match=rf"x has feature size 8, expected d_model={D_MODEL}"):
        tx.PositionalEncoding(D_MODEL, 10, 0.0)(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=rf"query has feature size 8, expected d_model={D_MODEL}"):
        tx.EncoderLayer(D_MODEL, N_HEADS, 32, 0.0)(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=rf"memory has feature size 8, expected d_model={D_MODEL}"):
        tx.Transformer(small_config()).decode(torch.randint(2, 5, (2, 3)), torch.randn(2, 5, 8))


def test_features_missing_batch_dimension(mha):
    x = torch.randn(5, D_MODEL)
    with pytest.raises(ValueError, match=rf"query must have shape \(N, L, d_model={D_MODEL}\), "
                                         rf"got \(5, {D_MODEL}\) \(missing batch dimension"):
        mha(x, x, x)


def test_token_ids_into_attention(mha):
    ids = torch.randint(0, 5, (2, 5, D_MODEL))
    with pytest.raises(TypeError, match=r"query must be a floating-point tensor .*torch.int64"):
        mha(ids, ids, ids)


def test_features_list_instead_of_tensor(mha):
    with pytest.raises(TypeError, match=r"query must be a torch.Tensor, got list"):
        mha([[0.0] * D_MODEL], None, None)


def test_query_key_batch_sizes_differ(mha):
    with pytest.raises(ValueError, match=r"query and key batch sizes differ: \(2, 5, 16\) vs "
                                         r"\(3, 5, 16\)"):
        mha(torch.randn(2, 5, D_MODEL), torch.randn(3, 5, D_MODEL), torch.randn(3, 5, D_MODEL))


def test_key_value_lengths_differ(mha):
    with pytest.raises(ValueError, match=r"key and value must have the same \(N, L_k\)"):
        mha(torch.randn(2, 5, D_MODEL), torch.randn(2, 4, D_MODEL), torch.randn(2, 6, D_MODEL))


@pytest.mark.parametrize("shape", [(2, 1, 4), (5, 7), (3, 5, 6), (2, 3, 5, 6)])
def test_mask_that_does_not_broadcast(mha, shape):
    x, mem = torch.randn(2, 5, D_MODEL), torch.randn(2, 6, D_MODEL)
    mask = torch.zeros(shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=re.escape(f"mask of shape {tuple(shape)} does not "
                                                   f"broadcast") + r".*\(N, H, L_q, L_k\) = "
                                         rf"\(2, {N_HEADS}, 5, 6\)"):
        mha(x, mem, mem, mask)


@pytest.mark.parametrize("l_k", [5, 6])  # self- and cross-attention
def test_two_d_mask_is_ambiguous_when_batch_equals_query_length(mha, l_k):
    """An nn-style key-padding mask (N, L_k) with N == L_q has the shape of (L_q, L_k):
    refused, with both fixes named, instead of being read as (L_q, L_k) silently."""
    x, mem = torch.randn(5, 5, D_MODEL), torch.randn(5, l_k, D_MODEL)
    key_padding = torch.zeros(5, l_k, dtype=torch.bool)
    key_padding[:, -1] = True
    message = (f"a 2-D mask of shape (5, {l_k}) is ambiguous when N == L_q == 5: it could be "
               f"(L_q, L_k) or a key-padding mask (N, L_k); say which: mask[None] gives "
               f"(1, L_q, L_k), one mask for the whole batch, mask[:, None] gives (N, 1, L_k), "
               f"key padding (what tx.padding_mask returns)")
    with pytest.raises(ValueError, match=re.escape(message)):
        mha(x, mem, mem, key_padding)
    with pytest.raises(ValueError, match=re.escape(message)):
        tx.expand_mask(key_padding, 5, N_HEADS, 5, l_k)
    # each explicit form is accepted and means what it says
    as_padding = mha(x, mem, mem, key_padding[:, None])  # (N, 1, L_k)
    as_shared = mha(x, mem, mem, key_padding[None])  # (1, L_q, L_k)
    torch.testing.assert_close(as_padding, mha(x, mem[:, :-1], mem[:, :-1]))
    torch.testing.assert_close(as_shared, as_padding)  # every row hides the last key here


def test_two_d_mask_is_read_as_query_by_key_when_unambiguous(mha):
    causal = tx.lookahead_mask(4)  # (L_q, L_k)
    for n in (1, 3):  # N != L_q, or N == 1 (then both readings are the same)
        x = torch.randn(n, 4, D_MODEL)
        torch.testing.assert_close(mha(x, x, x, causal), mha(x, x, x, causal[None]))


def test_mask_with_too_many_dims(mha):
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(ValueError, match=r"mask must be 2-D, 3-D or 4-D, got shape "
                                         r"\(1, 2, 1, 1, 5\)"):
        mha(x, x, x, torch.zeros(1, 2, 1, 1, 5, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_non_bool_mask(mha, dtype):
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(TypeError, match=rf"mask must be a bool tensor .*got dtype {dtype}"):
        mha(x, x, x, torch.zeros(2, 1, 5, dtype=dtype))


def test_float_mask_through_full_model(model):
    with pytest.raises(TypeError, match=r"mask must be a bool tensor"):
        model(_ids(2, 4), _ids(2, 3, TGT_VOCAB), src_mask=torch.zeros(2, 1, 4))


def test_mask_as_list(mha):
    x = torch.randn(1, 2, D_MODEL)
    with pytest.raises(TypeError, match=r"mask must be a bool torch.Tensor, got list"):
        mha(x, x, x, [[False, True]])


# ---------------------------------------------------------------- mask builders and PE

@pytest.mark.parametrize("size, exc, message", [
    (0, ValueError, r"size must be positive, got size=0"),
    (2.0, TypeError, r"size must be an int, got float"),
])
def test_lookahead_mask_bad_size(size, exc, message):
    with pytest.raises(exc, match=message):
        tx.lookahead_mask(size)


@pytest.mark.parametrize("past, exc, message", [
    (-1, ValueError, r"past must be >= 0, got past=-1"),
    (1.5, TypeError, r"past must be an int, got float"),
])
def test_lookahead_mask_bad_past(past, exc, message):
    with pytest.raises(exc, match=message):
        tx.lookahead_mask(3, past=past)


def test_padding_mask_needs_2d_ids():
    with pytest.raises(ValueError, match=r"seq must be token ids of shape \(N, L\), got \(3,\)"):
        tx.padding_mask(torch.tensor([2, 3, 1]), 1)


@pytest.mark.parametrize("start, exc, message", [
    (-1, ValueError, r"start must be >= 0, got start=-1"),
    (1.0, TypeError, r"start must be an int, got float"),
])
def test_positional_encoding_bad_start(start, exc, message):
    with pytest.raises(exc, match=message):
        tx.PositionalEncoding(8, 10, 0.0)(torch.zeros(1, 3, 8), start=start)


def test_positional_encoding_past_max_len_names_length_start_and_max_len():
    # the message names the three numbers that clash (notebook 02's second exercise asks the same)
    with pytest.raises(ValueError, match=r"^L=3 tokens from start=510 need positions 510\.\.512, "
                       r"but the table has max_len=512 rows \(positions 0\.\.511\)"):
        tx.PositionalEncoding(8, 512, 0.0)(torch.zeros(1, 3, 8), start=510)
    tx.PositionalEncoding(8, 512, 0.0)(torch.zeros(1, 2, 8), start=510)  # the last two rows exist
