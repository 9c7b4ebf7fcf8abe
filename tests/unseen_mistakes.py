"""A second, independent catalogue of learner mistakes in Transformer building blocks.

Written without reading ``labkit`` or its tests, to measure how often the
``labkit.check_*`` functions name a mistake they were not written for. Each buggy
block below is correct code with one change, written the way a learner would write it;
many changes come from public bug reports on tutorials and from-scratch implementations.

Where a change comes from a public report, the comment above the buggy code names the
repository and issue; "defect N" refers to docs/defects.md (the article's own pitfalls).
This is a plain module: the grading helper writes the test.
``python tests/unseen_mistakes_selfcheck.py`` checks the entries against ``tx`` without
the grading code: every CORRECT entry equals tx with the same weights, every UNSEEN entry
differs from it or raises.

``UNSEEN``: dicts ``{"id", "block", "make", "what", "words"}``.
``CORRECT``: dicts ``{"id", "block", "make"}``, correct code in layouts that differ from
the project's; every one must pass its check.

Four mistakes raise instead of returning numbers whenever the lengths differ, as they
would for a learner: ``mha_key_from_query`` (cross-attention with L_k != L_q),
``dec_cross_query_from_memory`` and ``dec_cross_keys_from_decoder`` (L_src != L_tgt),
``decoder_mask_batch_size`` (N != L). Two only show in training mode:
``ffn_dropout_on_output`` and ``enc_dropout_on_residual_stream``.

``make()`` returns what the check named by ``block`` takes:

- ``positional_encoding``: ``fn(max_len, d_model)`` or ``cls(d_model, max_len, dropout)``
- ``attention``: ``fn(q, k, v, mask=None)``
- ``multi_head_attention``: ``cls(d_model, n_heads, dropout)``
- ``masks``: a dict of keyword arguments for ``check_masks`` (``padding_fn``,
  ``lookahead_fn``, ``decoder_fn``), called as ``check_masks(**make())``
- ``feed_forward``: ``cls(d_model, d_ff, dropout)``
- ``encoder_layer`` / ``decoder_layer``: ``cls(d_model, n_heads, d_ff, dropout)``
- ``transformer``: ``cls(config)``
- ``label_smoothing``: ``fn(logits, target, eps, pad_idx)``
- ``greedy_decode``: ``fn(model, src, *, bos_idx, eos_idx, max_len)``
- ``train_step``: ``fn(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0)``
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

BLOCKS = ("positional_encoding", "attention", "multi_head_attention", "masks", "feed_forward",
          "encoder_layer", "decoder_layer", "transformer", "label_smoothing", "greedy_decode",
          "train_step")


# ---------------------------------------------------------------- correct learner blocks
# The learner's own correct building blocks (no tx code). Each buggy block below changes
# one line of one of them.

def sinusoid_table(max_len, d_model):
    """(max_len, d_model): sin on even columns, cos on odd ones, base 10000."""
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)
                         * (-math.log(10000.0) / d_model))  # (ceil(d/2),)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe.float()


class MyPositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=512, dropout=0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoid_table(max_len, d_model))  # (max_len, d_model)

    def forward(self, x):
        return self.dropout(x + self.pe[: x.size(1)])


def _mask4(mask):
    """Give a bool mask a head axis: (L_q, L_k) -> (1, 1, L_q, L_k), 3-D -> (N, 1, ?, L_k)"""
    if mask is None:
        return None
    if mask.dim() == 2:
        return mask[None, None]
    if mask.dim() == 3:
        return mask.unsqueeze(1)
    return mask


class MyMHA(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        assert d_model % n_heads == 0
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x):  # (N, L, d_model) -> (N, H, L, d_k)
        n, length, _ = x.shape
        return x.view(n, length, self.n_heads, self.d_k).transpose(1, 2)

    def merge_heads(self, x):  # (N, H, L, d_k) -> (N, L, d_model)
        n, _, length, _ = x.shape
        return x.transpose(1, 2).contiguous().view(n, length, self.d_model)

    def project(self, query, key, value):
        return (self.split_heads(self.w_q(query)), self.split_heads(self.w_k(key)),
                self.split_heads(self.w_v(value)))

    def forward(self, query, key, value, mask=None):
        q, k, v = self.project(query, key, value)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (N, H, L_q, L_k)
        if mask is not None:
            scores = scores.masked_fill(_mask4(mask), -1e9)
        weights = self.dropout(torch.softmax(scores, dim=-1))
        return self.w_o(self.merge_heads(weights @ v))


class MyFFN(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class MyEncoderLayer(nn.Module):
    mha_cls = MyMHA

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = self.mha_cls(d_model, n_heads, dropout)
        self.feed_forward = MyFFN(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.dropout2(self.feed_forward(x)))


class MyDecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MyMHA(d_model, n_heads, dropout)
        self.cross_attn = MyMHA(d_model, n_heads, dropout)
        self.feed_forward = MyFFN(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, tgt_mask)))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class MyEncoder(nn.Module):
    def __init__(self, vocab_size, d_model, n_heads, d_ff, n_layers, dropout=0.1, max_len=512):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = MyPositionalEncoding(d_model, max_len, dropout)
        self.layers = nn.ModuleList(
            [MyEncoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model)

    def forward(self, src, mask=None):
        x = self.pos_encoding(self.embedding(src) * math.sqrt(self.d_model))
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class MyDecoder(nn.Module):
    def __init__(self, vocab_size, d_model, n_heads, d_ff, n_layers, dropout=0.1, max_len=512):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = MyPositionalEncoding(d_model, max_len, dropout)
        self.layers = nn.ModuleList(
            [MyDecoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        x = self.pos_encoding(self.embedding(tgt) * math.sqrt(self.d_model))
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)
        return self.norm(x)


def my_padding_mask(seq, pad_idx):
    return (seq == pad_idx).unsqueeze(1)  # (N, 1, L)


def my_lookahead_mask(size, device=None):
    return torch.triu(torch.ones(size, size, dtype=torch.bool, device=device), diagonal=1)


def my_decoder_mask(tgt, pad_idx):
    return my_padding_mask(tgt, pad_idx) | my_lookahead_mask(tgt.size(1), tgt.device)


class MyTransformer(nn.Module):
    encoder_cls = MyEncoder
    decoder_cls = MyDecoder

    def __init__(self, config):
        super().__init__()
        c = config
        sizes = (c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout, c.max_len)
        self.config = c
        self.encoder = self.encoder_cls(c.src_vocab_size, *sizes)
        self.decoder = self.decoder_cls(c.tgt_vocab_size, *sizes)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src, src_mask=None):
        if src_mask is None:
            src_mask = my_padding_mask(src, self.config.pad_idx)
        return self.encoder(src, src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        if tgt_mask is None:
            tgt_mask = my_decoder_mask(tgt, self.config.pad_idx)
        return self.decoder(tgt, memory, tgt_mask, src_mask)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        if src_mask is None:
            src_mask = my_padding_mask(src, self.config.pad_idx)
        memory = self.encode(src, src_mask)
        return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))


def my_smoothed_loss(logits, target, eps, pad_idx):
    v = logits.size(-1)
    log_p = torch.log_softmax(logits, dim=-1)  # (M, V)
    q = torch.full_like(log_p, eps / v)
    q.scatter_(1, target.unsqueeze(1), 1 - eps + eps / v)
    per_position = -(q * log_p).sum(-1)  # (M,)
    keep = target != pad_idx
    return per_position[keep].mean()


@torch.no_grad()
def my_greedy(model, src, *, bos_idx, eos_idx, max_len):
    pad_idx = model.config.pad_idx
    was_training = model.training
    model.eval()
    src_mask = (src == pad_idx).unsqueeze(1)  # (N, 1, L_src)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])  # (N, V)
        logits[:, pad_idx] = float("-inf")
        logits[:, bos_idx] = float("-inf")
        nxt = logits.argmax(-1)
        nxt[done] = pad_idx
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_idx
        if done.all():
            break
    model.train(was_training)
    return ys


def my_train_step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    src, tgt_in, tgt_out = batch
    model.train()
    logits = model(src, tgt_in)  # (N, L, V)
    loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"loss": loss.item(), "grad_norm": grad_norm.item()}


# ======================================================================== the mistakes
# ---------------------------------------------------------------- positional encoding

def pe_log10_base(max_len, d_model):
    # exp(-2i ln(10000) / d) written with math.log10: the base becomes e**4 ~ 54.6, not 10000
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)
                         * (-math.log10(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe.float()


def pe_loop_exponent_doubled(max_len, d_model):
    # The loop from the intro-llm book issue #34: i already steps by 2, and the exponent
    # doubles it again; the cosine uses i + 1 as well.
    pe = torch.zeros(max_len, d_model)
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            pe[pos, i] = math.sin(pos / (10000 ** ((2 * i) / d_model)))
            if i + 1 < d_model:
                pe[pos, i + 1] = math.cos(pos / (10000 ** ((2 * (i + 1)) / d_model)))
    return pe


class PEPrecedence(nn.Module):
    # LoFTR issue #41: "-math.log(10000.0) / d_model // 2" floors the factor to -1, so every
    # column pair turns at exp(-2i) instead of 10000 ** (-2i / d_model).
    def __init__(self, d_model, max_len=512, dropout=0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        position = torch.arange(max_len).float().unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float()
                             * (-math.log(10000.0) / d_model // 2))
        pe = torch.zeros(1, max_len, d_model)
        pe[0, :, 0::2] = torch.sin(position * div_term)
        pe[0, :, 1::2] = torch.cos(position * div_term[: d_model // 2])
        self.register_buffer("pe", pe)  # (1, max_len, d_model)

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)])


class PEOneRow(nn.Module):
    # DiffPoseTalk issue #20: pe[:, x.shape[1], :] instead of pe[:, :x.shape[1], :] adds the
    # row of position L to every position.
    def __init__(self, d_model, max_len=512, dropout=0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoid_table(max_len, d_model).unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, x.shape[1], :])


def pe_sin_everywhere(max_len, d_model):
    # copy-paste: the odd columns also get torch.sin
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)
                         * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.sin(position * div_term[: d_model // 2])
    return pe.float()


def pe_stack_wrong_dim(max_len, d_model):
    # meant to interleave sin and cos with stack + view, but stacked on dim 1:
    # (max_len, 2, d/2).view(max_len, d) puts all sines first, then all cosines
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)
                         * (-math.log(10000.0) / d_model))
    angles = position * div_term  # (max_len, d_model/2), even d_model
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=1).view(max_len, d_model).float()


# ---------------------------------------------------------------- attention

def attn_scale_by_size1(q, k, v, mask=None):
    # d_k read from the wrong axis (written for (N, L, d), size(1) is not the feature axis)
    d_k = q.size(1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask, -1e9)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attn_mask_added(q, k, v, mask=None):
    # the bool mask added to the scores, as if it were nn.Transformer's additive float mask
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attn_fill_positive(q, k, v, mask=None):
    # sign slip: masked scores set to +1e9, so masked keys take all the weight
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask, 1e9)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attn_scale_after_softmax(q, k, v, mask=None):
    # the 1/sqrt(d_k) factor applied to the weights after the softmax, not to the scores
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(mask, -1e9)
    weights = torch.softmax(scores, dim=-1) / math.sqrt(q.size(-1))
    return weights @ v, weights


def attn_log_softmax(q, k, v, mask=None):
    # autocomplete picked log_softmax: the weights are log-probabilities
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask, -1e9)
    weights = torch.log_softmax(scores, dim=-1)
    return weights @ v, weights


# ---------------------------------------------------------------- multi-head attention

class MHAMergePermute(MyMHA):
    # merge with permute(0, 2, 3, 1): each position's features come out ordered (d_k, H)
    def merge_heads(self, x):
        n, _, length, _ = x.shape
        return x.permute(0, 2, 3, 1).reshape(n, length, self.d_model)


class MHAStridedHeads(MyMHA):
    # split as (d_k, H) instead of (H, d_k): head h gets features h, H + h, 2H + h, ...
    # (the merge is the exact inverse, so only the split is wrong)
    def split_heads(self, x):
        n, length, _ = x.shape
        return x.view(n, length, self.d_k, self.n_heads).permute(0, 3, 1, 2)

    def merge_heads(self, x):
        n, _, length, _ = x.shape
        return x.permute(0, 2, 3, 1).reshape(n, length, self.d_model)


class MHAKeyFromQuery(MyMHA):
    # copy-paste: the keys are projected from `query` (right in self-attention only)
    def project(self, query, key, value):
        return (self.split_heads(self.w_q(query)), self.split_heads(self.w_k(query)),
                self.split_heads(self.w_v(value)))


class MHAFlatBatchMaskRepeat(MyMHA):
    # heads folded into the batch as (N*H), row index n*H + h, but the mask repeated with
    # mask.repeat(H, 1, 1), row index h*N + n (lsdefine/attention-is-all-you-need-keras #36)
    def forward(self, query, key, value, mask=None):
        n, l_q, _ = query.shape
        l_k = key.size(1)
        h, d_k = self.n_heads, self.d_k
        q = self.w_q(query).view(n, l_q, h, d_k).transpose(1, 2).reshape(n * h, l_q, d_k)
        k = self.w_k(key).view(n, l_k, h, d_k).transpose(1, 2).reshape(n * h, l_k, d_k)
        v = self.w_v(value).view(n, l_k, h, d_k).transpose(1, 2).reshape(n * h, l_k, d_k)
        scores = q @ k.transpose(1, 2) / math.sqrt(d_k)  # (N*H, L_q, L_k)
        if mask is not None:
            if mask.dim() == 2:
                mask = mask.unsqueeze(0).expand(n, -1, -1)
            scores = scores.masked_fill(mask.repeat(h, 1, 1), -1e9)
        weights = self.dropout(torch.softmax(scores, dim=-1))
        context = (weights @ v).view(n, h, l_q, d_k).transpose(1, 2).reshape(n, l_q, self.d_model)
        return self.w_o(context)


class MHAMaskedFillDiscarded(MyMHA):
    # DI-engine issue #333: masked_fill (not masked_fill_) and the result thrown away
    def forward(self, query, key, value, mask=None):
        q, k, v = self.project(query, key, value)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores.masked_fill(_mask4(mask), -1e9)
        weights = self.dropout(torch.softmax(scores, dim=-1))
        return self.w_o(self.merge_heads(weights @ v))


# ---------------------------------------------------------------- masks

def padding_mask_keep_convention(seq, pad_idx):
    # Hugging Face's attention_mask convention (True/1 = real token) where True = masked is asked
    return (seq != pad_idx).unsqueeze(1)


def padding_mask_article_square(seq, pad_idx):
    # the article's padding mask (defect 4): the key row copied for every query, (N, L, L);
    # fine for encoder self-attention, wrong shape for cross-attention (L_tgt queries)
    return (seq == pad_idx).unsqueeze(1).expand(-1, seq.size(1), -1)


def lookahead_allowed_convention(size):
    # hkproj/pytorch-transformer's causal_mask: "== 0" turns it into the allowed positions
    return torch.triu(torch.ones(size, size), diagonal=1) == 0


def decoder_mask_pad_on_queries(tgt, pad_idx):
    # padding put on the query axis (N, L, 1): pad rows are blanked, pad keys stay visible
    return (tgt == pad_idx).unsqueeze(2) | my_lookahead_mask(tgt.size(1))


def decoder_mask_size0(tgt, pad_idx):
    # look-ahead mask sized with tgt.size(0), the batch, instead of the length
    return my_padding_mask(tgt, pad_idx) | my_lookahead_mask(tgt.size(0))


def decoder_mask_transposed(tgt, pad_idx):
    # built as (key, query): the combined mask is transposed
    return (my_padding_mask(tgt, pad_idx) | my_lookahead_mask(tgt.size(1))).transpose(-2, -1)


# ---------------------------------------------------------------- feed-forward

class FFNHiddenDModel(nn.Module):
    # the hidden layer is d_model wide; d_ff is never used
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_model)
        self.linear2 = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class FFNDropoutOnOutput(MyFFN):
    # dropout moved from the hidden activations to the output of linear2
    def forward(self, x):
        return self.dropout(self.linear2(torch.relu(self.linear1(x))))


class FFNNoBias(nn.Module):
    # Linear layers without bias (as in some LLM code bases), not the paper's xW1 + b1
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=False)
        self.linear2 = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class FFNReluOnInput(MyFFN):
    # the ReLU applied to the input, before linear1, instead of between the two layers
    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(torch.relu(x))))


# ---------------------------------------------------------------- encoder layer

class EncFFNResidualFromInput(MyEncoderLayer):
    # strutive07/transformer-tensorflow2.0 #14: the FFN's residual adds the layer's input
    def forward(self, x, mask=None):
        h = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.dropout2(self.feed_forward(h)))


class EncFFNOnUnnormalised(MyEncoderLayer):
    # SHI-Labs/Compact-Transformers #25: the FFN reads the sum before norm1
    def forward(self, x, mask=None):
        s = x + self.dropout1(self.self_attn(x, x, x, mask))
        h = self.norm1(s)
        return self.norm2(h + self.dropout2(self.feed_forward(s)))


class EncSharedNorm(MyEncoderLayer):
    # one LayerNorm for both sublayers: norm1 is used twice, norm2 never
    def forward(self, x, mask=None):
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask)))
        return self.norm1(x + self.dropout2(self.feed_forward(x)))


class EncDropoutOnResidual(MyEncoderLayer):
    # dropout on the residual stream (the skip path) instead of on the sublayer output
    def forward(self, x, mask=None):
        x = self.norm1(self.dropout1(x) + self.self_attn(x, x, x, mask))
        return self.norm2(self.dropout2(x) + self.feed_forward(x))


class EncResidualFromNormed(MyEncoderLayer):
    # Howuhh/faster-trajectory-transformer #3: the residual starts from the normalised input
    def forward(self, x, mask=None):
        h = self.norm1(x)
        x = h + self.dropout1(self.self_attn(h, h, h, mask))
        h = self.norm2(x)
        return h + self.dropout2(self.feed_forward(h))


class MHAKeepMaskConvention(MyMHA):
    # hkproj-style attention: masked_fill(mask == 0, ...) expects True = attend
    def forward(self, query, key, value, mask=None):
        q, k, v = self.project(query, key, value)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(_mask4(mask) == 0, -1e9)
        weights = self.dropout(torch.softmax(scores, dim=-1))
        return self.w_o(self.merge_heads(weights @ v))


class EncInvertedMaskAttention(MyEncoderLayer):
    # the layer's own attention reads the mask the other way round (True = attend)
    mha_cls = MHAKeepMaskConvention


class AnnotatedLayerNorm(nn.Module):
    # The Annotated Transformer's LayerNorm: unbiased std, eps added to the std
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class EncAnnotatedLayerNorm(MyEncoderLayer):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.norm1 = AnnotatedLayerNorm(d_model)
        self.norm2 = AnnotatedLayerNorm(d_model)


# ---------------------------------------------------------------- decoder layer

class DecCrossQueryFromMemory(MyDecoderLayer):
    # rexrex9/nlp_torchtext PR #2: the queries come from the encoder output, keys/values from x
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, tgt_mask)))
        x = self.norm2(x + self.dropout2(self.cross_attn(memory, x, x, memory_mask)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class DecCrossKeysFromDecoder(MyDecoderLayer):
    # cross-attention fed the decoder state as keys; only the values come from memory
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, tgt_mask)))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, x, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class DecCrossResidualFromInput(MyDecoderLayer):
    # the cross-attention residual adds the layer's input instead of the self-attention output
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        h = self.norm1(x + self.dropout1(self.self_attn(x, x, x, tgt_mask)))
        h = self.norm2(x + self.dropout2(self.cross_attn(h, memory, memory, memory_mask)))
        return self.norm3(h + self.dropout3(self.feed_forward(h)))


class DecOwnCausalMask(MyDecoderLayer):
    # builds its own look-ahead mask and ignores tgt_mask, so target padding is never masked
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        causal = my_lookahead_mask(x.size(1), x.device)
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, causal)))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class DecCrossQueryFromAttnOutput(MyDecoderLayer):
    # keitakurita/Practical_NLP_in_PyTorch #1: the cross-attention queries are the raw
    # self-attention output, not the normalised residual stream
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        att = self.self_attn(x, x, x, tgt_mask)
        x = self.norm1(x + self.dropout1(att))
        x = self.norm2(x + self.dropout2(self.cross_attn(att, memory, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


# ---------------------------------------------------------------- full model

class EncoderScaleAfterPE(MyEncoder):
    # sqrt(d_model) applied after the positions were added: the table is scaled too
    def forward(self, src, mask=None):
        x = self.pos_encoding(self.embedding(src)) * math.sqrt(self.d_model)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class DecoderScaleAfterPE(MyDecoder):
    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        x = self.pos_encoding(self.embedding(tgt)) * math.sqrt(self.d_model)
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)
        return self.norm(x)


class TFScaleAfterPE(MyTransformer):
    encoder_cls = EncoderScaleAfterPE
    decoder_cls = DecoderScaleAfterPE


class EncoderOneLayerRepeated(MyEncoder):
    # [layer] * n_layers: the ModuleList holds the same EncoderLayer n_layers times, so every
    # layer shares one set of weights
    def __init__(self, vocab_size, d_model, n_heads, d_ff, n_layers, dropout=0.1, max_len=512):
        super().__init__(vocab_size, d_model, n_heads, d_ff, n_layers, dropout, max_len)
        self.layers = nn.ModuleList([MyEncoderLayer(d_model, n_heads, d_ff, dropout)] * n_layers)


class TFEncoderLayersShared(MyTransformer):
    encoder_cls = EncoderOneLayerRepeated


class EncoderLoopNotChained(MyEncoder):
    # every layer reads the embeddings: only the last layer's output is used
    def forward(self, src, mask=None):
        x = self.pos_encoding(self.embedding(src) * math.sqrt(self.d_model))
        out = x
        for layer in self.layers:
            out = layer(x, mask)
        return self.norm(out)


class TFEncoderLoopNotChained(MyTransformer):
    encoder_cls = EncoderLoopNotChained


class DecoderNoPositions(MyDecoder):
    # the decoder forgets the positional encoding
    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        x = self.embedding(tgt) * math.sqrt(self.d_model)
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)
        return self.norm(x)


class TFDecoderNoPositions(MyTransformer):
    decoder_cls = DecoderNoPositions


# ---------------------------------------------------------------- label smoothing

def ls_raw_logits(logits, target, eps, pad_idx):
    # the smoothed target multiplied with the raw logits: log_softmax forgotten
    v = logits.size(-1)
    q = torch.full_like(logits, eps / v)
    q.scatter_(1, target.unsqueeze(1), 1 - eps + eps / v)
    per_position = -(q * logits).sum(-1)
    keep = target != pad_idx
    return per_position[keep].mean()


def ls_uniform_one_over_v(logits, target, eps, pad_idx):
    # TimDettmers/ConvE #55: (1 - eps) * one_hot + 1 / V, where eps / V is meant
    v = logits.size(-1)
    log_p = torch.log_softmax(logits, dim=-1)
    q = (1 - eps) * F.one_hot(target, v).float() + 1.0 / v
    per_position = -(q * log_p).sum(-1)
    keep = target != pad_idx
    return per_position[keep].mean()


def ls_sign_flipped(logits, target, eps, pad_idx):
    # the minus sign of the cross-entropy forgotten
    v = logits.size(-1)
    log_p = torch.log_softmax(logits, dim=-1)
    q = torch.full_like(log_p, eps / v)
    q.scatter_(1, target.unsqueeze(1), 1 - eps + eps / v)
    per_position = (q * log_p).sum(-1)
    keep = target != pad_idx
    return per_position[keep].mean()


def ls_pad_keep_inverted(logits, target, eps, pad_idx):
    # awslabs/sockeye #200: the keep condition inverted, only pad positions are counted
    v = logits.size(-1)
    log_p = torch.log_softmax(logits, dim=-1)
    q = torch.full_like(log_p, eps / v)
    q.scatter_(1, target.unsqueeze(1), 1 - eps + eps / v)
    per_position = -(q * log_p).sum(-1)
    keep = target == pad_idx
    return per_position[keep].mean()


def ls_eps_swapped(logits, target, eps, pad_idx):
    # eps and 1 - eps swapped: the true class gets eps, the uniform part (1 - eps)
    v = logits.size(-1)
    log_p = torch.log_softmax(logits, dim=-1)
    q = eps * F.one_hot(target, v).float() + (1 - eps) / v
    per_position = -(q * log_p).sum(-1)
    keep = target != pad_idx
    return per_position[keep].mean()


# ---------------------------------------------------------------- greedy decoding

@torch.no_grad()
def greedy_last_token_only(model, src, *, bos_idx, eos_idx, max_len):
    # each step decodes only the newest token (no cache), so it always sits at position 0
    # and never sees the earlier outputs (xberg-io/xberg #1210: positions restart)
    pad_idx = model.config.pad_idx
    was_training = model.training
    model.eval()
    src_mask = (src == pad_idx).unsqueeze(1)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys[:, -1:], memory, src_mask)[:, -1])
        logits[:, pad_idx] = float("-inf")
        logits[:, bos_idx] = float("-inf")
        nxt = logits.argmax(-1)
        nxt[done] = pad_idx
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_idx
        if done.all():
            break
    model.train(was_training)
    return ys


@torch.no_grad()
def greedy_stops_on_row0(model, src, *, bos_idx, eos_idx, max_len):
    # the single-sentence stopping test kept for a batch: stops when row 0 ends
    pad_idx = model.config.pad_idx
    was_training = model.training
    model.eval()
    src_mask = (src == pad_idx).unsqueeze(1)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])
        logits[:, pad_idx] = float("-inf")
        logits[:, bos_idx] = float("-inf")
        nxt = logits.argmax(-1)
        nxt[done] = pad_idx
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_idx
        if nxt[0].item() == eos_idx:
            break
    model.train(was_training)
    return ys


@torch.no_grad()
def greedy_eos_after_eos(model, src, *, bos_idx, eos_idx, max_len):
    # finished rows are filled with EOS instead of PAD
    pad_idx = model.config.pad_idx
    was_training = model.training
    model.eval()
    src_mask = (src == pad_idx).unsqueeze(1)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])
        logits[:, pad_idx] = float("-inf")
        logits[:, bos_idx] = float("-inf")
        nxt = logits.argmax(-1)
        nxt[done] = eos_idx
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_idx
        if done.all():
            break
    model.train(was_training)
    return ys


@torch.no_grad()
def greedy_samples(model, src, *, bos_idx, eos_idx, max_len):
    # samples from the softmax (torch.multinomial) instead of taking the argmax
    pad_idx = model.config.pad_idx
    was_training = model.training
    model.eval()
    src_mask = (src == pad_idx).unsqueeze(1)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])
        logits[:, pad_idx] = float("-inf")
        logits[:, bos_idx] = float("-inf")
        nxt = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
        nxt[done] = pad_idx
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_idx
        if done.all():
            break
    model.train(was_training)
    return ys


@torch.no_grad()
def greedy_encoder_unmasked(model, src, *, bos_idx, eos_idx, max_len):
    # memory from model.encoder(src) directly: the encoder runs without the source mask
    # (the decoder still gets it)
    pad_idx = model.config.pad_idx
    was_training = model.training
    model.eval()
    src_mask = (src == pad_idx).unsqueeze(1)
    memory = model.encoder(src)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])
        logits[:, pad_idx] = float("-inf")
        logits[:, bos_idx] = float("-inf")
        nxt = logits.argmax(-1)
        nxt[done] = pad_idx
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_idx
        if done.all():
            break
    model.train(was_training)
    return ys


@torch.no_grad()
def greedy_exclude_with_zero(model, src, *, bos_idx, eos_idx, max_len):
    # PAD and BOS "removed" by setting their logits to 0, which still beats negative logits
    pad_idx = model.config.pad_idx
    was_training = model.training
    model.eval()
    src_mask = (src == pad_idx).unsqueeze(1)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])
        logits[:, pad_idx] = 0.0
        logits[:, bos_idx] = 0.0
        nxt = logits.argmax(-1)
        nxt[done] = pad_idx
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_idx
        if done.all():
            break
    model.train(was_training)
    return ys


# ---------------------------------------------------------------- training step

def step_clip_by_value(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    # clip_grad_value_ (each entry to [-1, 1]) where the paper-style recipe clips the norm
    src, tgt_in, tgt_out = batch
    model.train()
    logits = model(src, tgt_in)
    loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = torch.norm(torch.stack([g.norm() for g in grads]))
    nn.utils.clip_grad_value_(model.parameters(), clip_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"loss": loss.item(), "grad_norm": grad_norm.item()}


def step_norm_summed(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    # the reported grad_norm is the sum of per-tensor norms, not the global L2 norm
    src, tgt_in, tgt_out = batch
    model.train()
    logits = model(src, tgt_in)
    loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    grad_norm = sum(p.grad.norm() for p in model.parameters() if p.grad is not None)
    nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"loss": loss.item(), "grad_norm": grad_norm.item()}


def step_clip_after_step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    # gradients clipped after optimizer.step(): the update used the unclipped gradients
    src, tgt_in, tgt_out = batch
    model.train()
    logits = model(src, tgt_in)
    loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    if scheduler is not None:
        scheduler.step()
    return {"loss": loss.item(), "grad_norm": grad_norm.item()}


def step_loss_over_ntokens(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    # The Annotated Transformer's SimpleLossCompute habit of dividing by the token count,
    # kept with a criterion that already averages: the loss is divided twice
    src, tgt_in, tgt_out = batch
    model.train()
    logits = model(src, tgt_in)
    ntokens = (tgt_out != model.config.pad_idx).sum()
    loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1)) / ntokens
    optimizer.zero_grad()
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"loss": loss.item(), "grad_norm": grad_norm.item()}


def _entry(id, block, make, what, words):
    assert block in BLOCKS, block
    return {"id": id, "block": block, "make": make, "what": what, "words": words}


UNSEEN = [
    # positional encoding
    _entry("pe_log10_base", "positional_encoding", lambda: pe_log10_base,
           "The frequencies use math.log10(10000) in the exponent, so the base is e**4 "
           "(about 54.6) instead of 10000.",
           ["10000", "base", "frequency", "frequencies"]),
    _entry("pe_loop_exponent_doubled", "positional_encoding", lambda: pe_loop_exponent_doubled,
           "The loop index i already steps by 2 and the exponent doubles it again (2*i/d and "
           "2*(i+1)/d), so the frequencies fall twice as fast and sin/cos of a pair differ.",
           ["exponent", "frequency", "frequencies", "2i"]),
    _entry("pe_precedence_floor", "positional_encoding", lambda: PEPrecedence,
           "-log(10000)/d_model // 2 floors the factor to -1, so column pair i turns at "
           "exp(-2i) instead of 10000^(-2i/d_model).",
           ["frequency", "frequencies", "exponent", "10000"]),
    _entry("pe_one_row_for_all", "positional_encoding", lambda: PEOneRow,
           "pe[:, L, :] instead of pe[:, :L, :]: the row of position L is added to every "
           "position.",
           ["every position", "one row", "same row", "constant", "slice"]),
    _entry("pe_sin_in_odd_columns", "positional_encoding", lambda: pe_sin_everywhere,
           "The odd columns hold sin instead of cos (copy-paste).",
           ["cos", "cosine", "odd column", "odd columns"]),
    _entry("pe_stack_wrong_dim", "positional_encoding", lambda: pe_stack_wrong_dim,
           "sin and cos are stacked on dim 1 before the view, so the table holds all sines "
           "then all cosines instead of interleaving them column by column.",
           ["interleav", "concatenat", "first half", "sines first"]),
    # attention
    _entry("attn_scale_from_size1", "attention", lambda: attn_scale_by_size1,
           "d_k is read as q.size(1), which is not the feature axis, so the scores are "
           "divided by the square root of the wrong number.",
           ["scale", "sqrt", "d_k", "factor"]),
    _entry("attn_bool_mask_added", "attention", lambda: attn_mask_added,
           "The bool mask is added to the scores (+1 on masked keys) instead of filling them "
           "with a large negative number.",
           ["added", "additive", "+1", "masked_fill"]),
    _entry("attn_fill_positive", "attention", lambda: attn_fill_positive,
           "Masked scores are filled with +1e9 instead of -1e9, so the masked keys get all "
           "the weight.",
           ["sign", "positive", "+1e9", "masked keys get"]),
    _entry("attn_scale_after_softmax", "attention", lambda: attn_scale_after_softmax,
           "The weights are divided by sqrt(d_k) after the softmax instead of the scores "
           "before it, so they no longer sum to 1.",
           ["after the softmax", "scale", "sum to 1", "sqrt"]),
    _entry("attn_log_softmax", "attention", lambda: attn_log_softmax,
           "log_softmax is used instead of softmax, so the weights are log-probabilities.",
           ["log_softmax", "log-probabilities", "log probabilities", "sum to 1", "negative"]),
    # multi-head attention
    _entry("mha_merge_permute_order", "multi_head_attention", lambda: MHAMergePermute,
           "The heads are merged with permute(0, 2, 3, 1), so the features of a position are "
           "ordered (d_k, H) instead of (H, d_k).",
           ["merge", "merged", "order", "permute"]),
    _entry("mha_split_strided", "multi_head_attention", lambda: MHAStridedHeads,
           "The split views the features as (d_k, H), so head h gets the strided features "
           "h, H + h, ... instead of a contiguous block (the merge undoes it exactly).",
           ["split", "strided", "contiguous block", "interleav"]),
    _entry("mha_key_from_query", "multi_head_attention", lambda: MHAKeyFromQuery,
           "The keys are projected from the query input (w_k(query)), which only matters "
           "when key differs from query, as in cross-attention.",
           ["keys from the query", "w_k(query)", "key input", "key tensor"]),
    _entry("mha_mask_repeat_order", "multi_head_attention", lambda: MHAFlatBatchMaskRepeat,
           "Heads are folded into the batch as n*H + h, but the mask is repeated as h*N + n, "
           "so batch rows get each other's padding masks.",
           ["repeat", "batch row", "other row", "wrong row", "mask order"]),
    _entry("mha_masked_fill_discarded", "multi_head_attention", lambda: MHAMaskedFillDiscarded,
           "scores.masked_fill(...) returns a new tensor that is thrown away, so the mask has "
           "no effect.",
           ["ignored", "no effect", "not applied", "masked_fill"]),
    # masks
    _entry("padding_mask_keep_convention", "masks",
           lambda: {"padding_fn": padding_mask_keep_convention},
           "The padding mask is True on real tokens (the attend convention) where True must "
           "mean padding, do not attend.",
           ["inverted", "real token", "opposite", "flipped"]),
    _entry("padding_mask_article_square", "masks",
           lambda: {"padding_fn": padding_mask_article_square},
           "The padding mask is (N, L, L), one copy of the key row per source query, instead "
           "of (N, 1, L), so it cannot serve cross-attention with L_tgt queries.",
           ["(n, 1, l)", "(n, l, l)", "query axis", "cross-attention"]),
    _entry("lookahead_allowed_convention", "masks",
           lambda: {"lookahead_fn": lookahead_allowed_convention},
           "The look-ahead mask is True on and below the diagonal (allowed positions) instead "
           "of strictly above it.",
           ["inverted", "allowed", "opposite", "below the diagonal", "lower triangle"]),
    _entry("decoder_mask_pad_on_queries", "masks",
           lambda: {"decoder_fn": decoder_mask_pad_on_queries},
           "The target padding is put on the query axis (N, L, 1), so pad keys stay visible "
           "and pad query rows are blanked.",
           ["query axis", "pad queries", "pad keys", "rows"]),
    _entry("decoder_mask_batch_size", "masks", lambda: {"decoder_fn": decoder_mask_size0},
           "The look-ahead part is built with tgt.size(0), the batch size, instead of the "
           "target length tgt.size(1).",
           ["size(0)", "batch size", "batch"]),
    _entry("decoder_mask_transposed", "masks", lambda: {"decoder_fn": decoder_mask_transposed},
           "The combined mask is built as (key, query) and so is transposed: queries see the "
           "future and not the past, and pad rows instead of pad keys are masked.",
           ["transpose", "sees the future", "masks the past", "past"]),
    # feed-forward
    _entry("ffn_hidden_d_model", "feed_forward", lambda: FFNHiddenDModel,
           "The hidden layer is d_model wide; d_ff is ignored.",
           ["d_ff", "hidden", "wide", "width"]),
    _entry("ffn_dropout_on_output", "feed_forward", lambda: FFNDropoutOnOutput,
           "Dropout acts on the output of linear2 instead of on the hidden activations "
           "(visible only in training mode).",
           ["dropout on the output", "hidden", "after linear2", "dropout position"]),
    _entry("ffn_no_bias", "feed_forward", lambda: FFNNoBias,
           "Both Linear layers are built with bias=False.",
           ["bias", "bias=false"]),
    _entry("ffn_relu_on_input", "feed_forward", lambda: FFNReluOnInput,
           "The ReLU is applied to the input before linear1 instead of between linear1 and "
           "linear2.",
           ["relu", "activation", "before linear1", "on the input"]),
    # encoder layer
    _entry("enc_ffn_residual_from_input", "encoder_layer", lambda: EncFFNResidualFromInput,
           "The FFN sublayer's residual adds the layer's input x instead of the output of the "
           "attention sublayer.",
           ["residual", "layer's input", "skip"]),
    _entry("enc_ffn_reads_unnormalised", "encoder_layer", lambda: EncFFNOnUnnormalised,
           "The FFN reads the attention sum before norm1 instead of norm1's output.",
           ["norm1", "unnormali", "before norm1", "ffn input"]),
    _entry("enc_layernorm_shared", "encoder_layer", lambda: EncSharedNorm,
           "norm1 is used after both sublayers; norm2 is never used.",
           ["norm2", "shared", "same layernorm", "not used", "twice"]),
    _entry("enc_dropout_on_residual_stream", "encoder_layer", lambda: EncDropoutOnResidual,
           "Dropout is applied to the residual stream (the skip path x) instead of to the "
           "sublayer's output.",
           ["residual stream", "skip path", "dropout on the residual", "residual"]),
    _entry("enc_residual_from_normed_input", "encoder_layer", lambda: EncResidualFromNormed,
           "Each residual starts from the normalised input (h = norm(x); h + sublayer(h)) "
           "instead of adding the sublayer to x and normalising the sum.",
           ["normalised input", "normalized input", "residual", "pre-ln"]),
    _entry("enc_attention_mask_inverted", "encoder_layer", lambda: EncInvertedMaskAttention,
           "The layer's own attention fills where mask == 0, reading True as 'attend', so "
           "only the padding is attended to.",
           ["inverted", "opposite", "== 0", "only to padding"]),
    _entry("enc_annotated_layernorm", "encoder_layer", lambda: EncAnnotatedLayerNorm,
           "A hand-written LayerNorm (a_2, b_2) uses the unbiased std and adds eps to the std "
           "instead of nn.LayerNorm's biased variance with eps inside the square root.",
           ["layernorm", "std", "unbiased", "variance", "eps"]),
    # decoder layer
    _entry("dec_cross_query_from_memory", "decoder_layer", lambda: DecCrossQueryFromMemory,
           "Cross-attention takes its queries from the encoder memory and its keys and values "
           "from the decoder state, the roles reversed.",
           ["queries", "roles", "reversed", "swapped"]),
    _entry("dec_cross_keys_from_decoder", "decoder_layer", lambda: DecCrossKeysFromDecoder,
           "Cross-attention takes its keys from the decoder state x; only the values come "
           "from the encoder memory.",
           ["keys", "key input", "decoder state"]),
    _entry("dec_cross_residual_from_input", "decoder_layer", lambda: DecCrossResidualFromInput,
           "The cross-attention sublayer's residual adds the layer's input instead of the "
           "self-attention sublayer's output.",
           ["residual", "layer's input", "skip"]),
    _entry("dec_ignores_tgt_mask", "decoder_layer", lambda: DecOwnCausalMask,
           "Self-attention uses a look-ahead mask the layer builds itself and ignores "
           "tgt_mask, so target padding is never masked.",
           ["tgt_mask", "padding", "ignored", "not passed"]),
    _entry("dec_cross_query_raw_attention", "decoder_layer", lambda: DecCrossQueryFromAttnOutput,
           "Cross-attention's queries are the raw self-attention output instead of the "
           "normalised residual stream after norm1.",
           ["queries", "self-attention output", "raw", "norm1"]),
    # full model
    _entry("tf_scale_after_positions", "transformer", lambda: TFScaleAfterPE,
           "The embeddings are multiplied by sqrt(d_model) after the positional encoding was "
           "added, so the positions are scaled too.",
           ["sqrt(d_model)", "scale", "scaled", "positional"]),
    _entry("tf_encoder_layers_shared", "transformer", lambda: TFEncoderLayersShared,
           "The encoder's ModuleList is built as [layer] * n_layers, so all encoder layers are "
           "one module with one set of weights.",
           ["shared", "same module", "one layer", "copies", "same weights"]),
    _entry("tf_encoder_layers_not_chained", "transformer", lambda: TFEncoderLoopNotChained,
           "The encoder loop feeds the embeddings to every layer (out = layer(x)), so only the "
           "last layer's output reaches the memory.",
           ["loop", "chained", "only the last layer", "previous layer"]),
    _entry("tf_decoder_no_positions", "transformer", lambda: TFDecoderNoPositions,
           "The decoder adds no positional encoding to the target embeddings.",
           ["positional encoding", "positional", "pos_encoding"]),
    # label smoothing
    _entry("ls_raw_logits", "label_smoothing", lambda: ls_raw_logits,
           "The smoothed target is multiplied with the raw logits; log_softmax is missing.",
           ["log_softmax", "log-softmax", "raw logits", "log"]),
    _entry("ls_one_over_v", "label_smoothing", lambda: ls_uniform_one_over_v,
           "The uniform part is 1/V instead of eps/V, so the target sums to 2 - eps.",
           ["eps / v", "1 / v", "eps/v", "1/v"]),
    _entry("ls_sign_flipped", "label_smoothing", lambda: ls_sign_flipped,
           "The minus sign of the cross-entropy is missing: the loss is negative.",
           ["sign", "negative", "minus"]),
    _entry("ls_pad_keep_inverted", "label_smoothing", lambda: ls_pad_keep_inverted,
           "The keep mask is inverted (target == pad_idx): only the pad positions are averaged.",
           ["inverted", "only pad", "pad positions", "non-pad"]),
    _entry("ls_eps_swapped", "label_smoothing", lambda: ls_eps_swapped,
           "eps and 1 - eps are swapped: the true class gets eps and the uniform part "
           "(1 - eps)/V.",
           ["swapped", "1 - eps", "true class", "confidence"]),
    # greedy decoding
    _entry("greedy_last_token_only", "greedy_decode", lambda: greedy_last_token_only,
           "Each step decodes only the newest token without a cache, so the decoder never "
           "sees the earlier outputs and every step sits at position 0.",
           ["prefix", "last token", "previous", "feed"]),
    _entry("greedy_stops_on_row0", "greedy_decode", lambda: greedy_stops_on_row0,
           "The loop stops as soon as row 0 produces EOS, even if other rows have not "
           "finished.",
           ["row 0", "first row", "every row", "finished"]),
    _entry("greedy_eos_after_eos", "greedy_decode", lambda: greedy_eos_after_eos,
           "Finished rows are filled with EOS instead of PAD.",
           ["pad after", "after eos", "filled with eos", "instead of pad"]),
    _entry("greedy_samples", "greedy_decode", lambda: greedy_samples,
           "Tokens are sampled from the softmax (torch.multinomial) instead of taken by argmax.",
           ["argmax", "sampl", "random", "multinomial"]),
    _entry("greedy_encoder_unmasked", "greedy_decode", lambda: greedy_encoder_unmasked,
           "The memory comes from model.encoder(src) without the source mask, so the encoder "
           "attends to padding (the decoder still gets the mask).",
           ["source mask", "src_mask", "encoder mask", "source padding"]),
    _entry("greedy_exclude_with_zero", "greedy_decode", lambda: greedy_exclude_with_zero,
           "PAD and BOS are excluded by setting their logits to 0 instead of -inf, so they "
           "can still win the argmax.",
           ["excluded", "-inf", "never predicted", "pad or bos", "pad/bos"]),
    # training step
    _entry("step_clip_by_value", "train_step", lambda: step_clip_by_value,
           "The gradients are clipped element-wise with clip_grad_value_ instead of by their "
           "global norm.",
           ["clip_grad_value", "by value", "element-wise", "elementwise"]),
    _entry("step_grad_norm_summed", "train_step", lambda: step_norm_summed,
           "The reported grad_norm is the sum of the per-tensor norms instead of the global "
           "L2 norm.",
           ["sum of", "per-tensor", "global norm", "grad_norm"]),
    _entry("step_clip_after_step", "train_step", lambda: step_clip_after_step,
           "The gradients are clipped after optimizer.step(), so the update used the "
           "unclipped gradients.",
           ["after optimizer.step", "after the step", "order", "unclipped"]),
    _entry("step_loss_over_ntokens", "train_step", lambda: step_loss_over_ntokens,
           "The averaged loss is divided again by the number of target tokens, shrinking the "
           "loss and the gradients.",
           ["divided", "number of tokens", "ntokens", "loss scale", "twice"]),
]


# ======================================================================== correct code
# Correct blocks in layouts other than the project's.

def pe_annotated(max_len, d_model):
    # The Annotated Transformer's construction (even d_model only: cos fills d/2 columns)
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def pe_python_loops(max_len, d_model):
    # the formula written out with two loops, float64 math, odd d_model included
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for col in range(d_model):
            angle = pos / 10000 ** (2 * (col // 2) / d_model)
            pe[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return pe.float()


class PEPlainAttribute(nn.Module):
    # table kept as a plain attribute (no buffer), batch axis in front
    def __init__(self, d_model, max_len=512, dropout=0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.table = sinusoid_table(max_len, d_model).unsqueeze(0)  # (1, max_len, d_model)

    def forward(self, x):
        return self.dropout(x + self.table[:, : x.size(1)].to(x.device))


class PEBufferNoBatch(nn.Module):
    # buffer (max_len, d_model) with another name, built with torch.pow
    def __init__(self, d_model, max_len=512, dropout=0.1):
        super().__init__()
        self.drop = nn.Dropout(p=dropout)
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]
        freq = 1.0 / torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        table = torch.zeros(max_len, d_model, dtype=torch.float64)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq)[:, : d_model // 2]
        self.register_buffer("encoding", table.float())

    def forward(self, x):
        return self.drop(x + self.encoding[: x.size(1)])


def attention_sdpa(q, k, v, mask=None):
    # PyTorch's fused kernel; its bool mask means True = may attend. Output only.
    attn_mask = None if mask is None else ~mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def attention_einsum(q, k, v, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", q, k) * q.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(mask, float("-1e9"))
    p = scores.softmax(dim=-1)
    return torch.einsum("...qk,...kd->...qd", p, v), p


class MHAFusedQKV(nn.Module):
    # one Linear(d, 3d) for q, k and v; cross-attention slices its weight
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.h, self.d = n_heads, d_model
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        d = self.d
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(query, w[:d], b[:d])
        k = F.linear(key, w[d:2 * d], b[d:2 * d])
        v = F.linear(value, w[2 * d:], b[2 * d:])
        n, lq, lk = query.size(0), query.size(1), key.size(1)
        q = q.reshape(n, lq, self.h, -1).permute(0, 2, 1, 3)
        k = k.reshape(n, lk, self.h, -1).permute(0, 2, 1, 3)
        v = v.reshape(n, lk, self.h, -1).permute(0, 2, 1, 3)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores.masked_fill(_mask4(mask), -1e9)
        ctx = self.drop(scores.softmax(-1)) @ v  # (N, H, L_q, d_k)
        return self.out(ctx.permute(0, 2, 1, 3).reshape(n, lq, d))


class MHAHFNames(nn.Module):
    # Hugging Face names (q_proj, k_proj, v_proj, out_proj), heads via reshape(-1)
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.num_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def _shape(self, t):
        return t.reshape(t.size(0), -1, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, query, key, value, mask=None):
        q, k, v = self._shape(self.q_proj(query)), self._shape(self.k_proj(key)), \
            self._shape(self.v_proj(value))
        scores = torch.matmul(q, k.transpose(2, 3)) / self.head_dim ** 0.5
        if mask is not None:
            scores = scores.masked_fill(_mask4(mask), torch.finfo(scores.dtype).min)
        ctx = torch.matmul(self.attn_dropout(F.softmax(scores, dim=-1)), v)
        ctx = ctx.transpose(1, 2).reshape(query.size(0), query.size(1), -1)
        return self.out_proj(ctx)


def padding_mask_4d(seq, pad_idx):
    return (seq == pad_idx)[:, None, None, :]  # (N, 1, 1, L)


def lookahead_with_batch_axis(size):
    # the Annotated Transformer's shape (1, L, L), in this project's True = masked convention
    return torch.triu(torch.ones(1, size, size), diagonal=1).bool()


def decoder_mask_4d(tgt, pad_idx):
    n, length = tgt.shape
    future = torch.ones(length, length).triu(1).bool()  # (L, L)
    return (tgt == pad_idx)[:, None, None, :] | future  # (N, 1, L, L)


class FFNSequential(nn.Module):
    # nn.Sequential, no linear1/linear2 names
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(d_ff, d_model))

    def forward(self, x):
        return self.net(x)


class SublayerPostLN(nn.Module):
    # the Annotated Transformer's SublayerConnection, put back in the paper's Post-LN order
    def __init__(self, size, dropout):
        super().__init__()
        self.norm = nn.LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayerSublayers(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MyMHA(d_model, n_heads, dropout)
        self.feed_forward = MyFFN(d_model, d_ff, dropout)
        self.sublayer = nn.ModuleList([SublayerPostLN(d_model, dropout) for _ in range(2)])

    def forward(self, x, mask=None):
        x = self.sublayer[0](x, lambda t: self.self_attn(t, t, t, mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayerNormList(nn.Module):
    # norms and dropouts in ModuleLists, fused-qkv attention for the self-attention
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MyMHA(d_model, n_heads, dropout)
        self.cross_attn = MyMHA(d_model, n_heads, dropout)
        self.feed_forward = FFNSequential(d_model, d_ff, dropout)
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(3)])
        self.drops = nn.ModuleList([nn.Dropout(dropout) for _ in range(3)])

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self.norms[0](x + self.drops[0](self.self_attn(x, x, x, tgt_mask)))
        x = self.norms[1](x + self.drops[1](self.cross_attn(x, memory, memory, memory_mask)))
        return self.norms[2](x + self.drops[2](self.feed_forward(x)))


def smoothed_loss_fairseq(logits, target, eps, pad_idx):
    # fairseq's form: (1 - eps) * nll + eps * mean over classes of -log p
    lprobs = F.log_softmax(logits, dim=-1)
    nll = -lprobs.gather(dim=-1, index=target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    loss = (1.0 - eps) * nll + eps * smooth
    keep = target.ne(pad_idx)
    return loss.masked_select(keep).sum() / keep.sum()


@torch.no_grad()
def greedy_preallocated(model, src, *, bos_idx, eos_idx, max_len):
    # a preallocated (N, max_len + 1) PAD tensor, trimmed at the end
    pad_idx = model.config.pad_idx
    mode = model.training
    model.eval()
    n = src.size(0)
    src_mask = (src == pad_idx)[:, None, :]
    memory = model.encode(src, src_mask)
    out = torch.full((n, max_len + 1), pad_idx, dtype=torch.long)
    out[:, 0] = bos_idx
    alive = torch.ones(n, dtype=torch.bool)
    t = 0
    for t in range(1, max_len + 1):
        hidden = model.decode(out[:, :t], memory, src_mask)  # (N, t, d_model)
        scores = model.generator(hidden[:, -1])
        scores[:, [pad_idx, bos_idx]] = -float("inf")
        tok = scores.argmax(dim=-1)
        out[alive, t] = tok[alive]
        alive &= tok != eos_idx
        if not alive.any():
            break
    model.train(mode)
    return out[:, : t + 1]


def train_step_channels_first(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    # CrossEntropyLoss on (N, V, L) logits and (N, L) labels, zero_grad(set_to_none) first
    src, tgt_in, tgt_out = batch
    optimizer.zero_grad(set_to_none=True)
    model.train()
    logits = model(src, tgt_in)  # (N, L, V)
    loss = criterion(logits.transpose(1, 2), tgt_out)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"loss": loss.item(), "grad_norm": norm.item()}


def _ok(id, block, make):
    assert block in BLOCKS, block
    return {"id": id, "block": block, "make": make}


CORRECT = [
    _ok("pe_annotated_even_only", "positional_encoding", lambda: pe_annotated),
    _ok("pe_python_loops", "positional_encoding", lambda: pe_python_loops),
    _ok("pe_plain_attribute_batch_axis", "positional_encoding", lambda: PEPlainAttribute),
    _ok("pe_buffer_no_batch_axis", "positional_encoding", lambda: PEBufferNoBatch),
    _ok("attention_sdpa_output_only", "attention", lambda: attention_sdpa),
    _ok("attention_einsum", "attention", lambda: attention_einsum),
    _ok("mha_fused_qkv", "multi_head_attention", lambda: MHAFusedQKV),
    _ok("mha_hf_names", "multi_head_attention", lambda: MHAHFNames),
    _ok("masks_4d_and_batch_axis", "masks",
        lambda: {"padding_fn": padding_mask_4d, "lookahead_fn": lookahead_with_batch_axis,
                 "decoder_fn": decoder_mask_4d}),
    _ok("ffn_sequential", "feed_forward", lambda: FFNSequential),
    _ok("encoder_layer_sublayer_list", "encoder_layer", lambda: EncoderLayerSublayers),
    _ok("encoder_layer_own_blocks", "encoder_layer", lambda: MyEncoderLayer),
    _ok("decoder_layer_norm_list", "decoder_layer", lambda: DecoderLayerNormList),
    _ok("transformer_own_blocks", "transformer", lambda: MyTransformer),
    _ok("label_smoothing_fairseq", "label_smoothing", lambda: smoothed_loss_fairseq),
    _ok("greedy_preallocated", "greedy_decode", lambda: greedy_preallocated),
    _ok("train_step_channels_first", "train_step", lambda: train_step_channels_first),
    # the learner's own blocks that the mistakes above start from (the project's layout)
    _ok("label_smoothing_own", "label_smoothing", lambda: my_smoothed_loss),
    _ok("greedy_own", "greedy_decode", lambda: my_greedy),
    _ok("train_step_own", "train_step", lambda: my_train_step),
]
