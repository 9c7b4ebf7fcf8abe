"""Self-check of tests/unseen_mistakes.py, independent of labkit.

Run: ``.venv/bin/python tests/unseen_mistakes_selfcheck.py``

Every CORRECT entry must equal the tx reference (same weights, eval mode, small inputs);
every UNSEEN entry must either raise or differ from it on the same inputs (so the mistake
is observable). Weights are mapped by this script's own name table, not the checks' code.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from torch import nn

import tx_helpers as tx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import unseen_mistakes as um  # noqa: E402

N, D, H, DFF, LS, LT = 3, 16, 4, 32, 7, 5
PAD, BOS, EOS = 1, 2, 3
CFG = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=D, n_heads=H, d_ff=DFF, n_layers=2,
           dropout=0.1, max_len=32, pad_idx=PAD)

# tx parameter name -> the learner's, for layouts whose names differ
RENAMES = {
    "mha_hf_names": {"w_q.": "q_proj.", "w_k.": "k_proj.", "w_v.": "v_proj.", "w_o.": "out_proj."},
    "ffn_sequential": {"linear1.": "net.0.", "linear2.": "net.3."},
    "encoder_layer_sublayer_list": {"norm1.": "sublayer.0.norm.", "norm2.": "sublayer.1.norm."},
    "decoder_layer_norm_list": {"norm1.": "norms.0.", "norm2.": "norms.1.", "norm3.": "norms.2.",
                                "feed_forward.linear1.": "feed_forward.net.0.",
                                "feed_forward.linear2.": "feed_forward.net.3."},
}


def load_from(ref: nn.Module, mine: nn.Module, entry_id: str) -> None:
    """Copy ref's parameters into mine by name (with RENAMES); fused qkv handled apart."""
    src = ref.state_dict()
    if entry_id == "mha_fused_qkv":
        with torch.no_grad():
            mine.qkv.weight.copy_(torch.cat([src[f"w_{c}.weight"] for c in "qkv"]))
            mine.qkv.bias.copy_(torch.cat([src[f"w_{c}.bias"] for c in "qkv"]))
            mine.out.load_state_dict({"weight": src["w_o.weight"], "bias": src["w_o.bias"]})
        return
    target = mine.state_dict()
    new = {}
    for name, value in src.items():
        for a, b in RENAMES.get(entry_id, {}).items():
            name = name.replace(a, b)
        if name.endswith("norm1.weight") and "norm1.a_2" in "".join(target):
            pass
        new[name] = value
    # Annotated LayerNorm: weight/bias are a_2/b_2
    for name in list(new):
        if name not in target and name.replace(".weight", ".a_2") in target:
            new[name.replace(".weight", ".a_2")] = new.pop(name)
        elif name not in target and name.replace(".bias", ".b_2") in target:
            new[name.replace(".bias", ".b_2")] = new.pop(name)
    usable = {k: v for k, v in new.items() if k in target and target[k].shape == v.shape}
    mine.load_state_dict(usable, strict=False)


def ids(n, length, vocab, lengths):
    x = torch.randint(4, vocab, (n, length))
    for i, k in enumerate(lengths):
        x[i, k:] = PAD
    return x


def close(a, b, tol=1e-5):
    if isinstance(a, (tuple, list)):
        a = a[0]
    if isinstance(b, (tuple, list)):
        b = b[0]
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=tol, rtol=tol)


def run_pe(obj):
    if isinstance(obj, type):
        out = []
        for d in (16,):
            torch.manual_seed(0)
            m = obj(d, 32, 0.1).eval()
            ref = tx.PositionalEncoding(d, 32, 0.1).eval()
            x = torch.randn(2, 9, d)
            out.append(close(m(x), ref(x)))
        return all(out)
    return all(close(obj(40, d), tx.sinusoidal_table(40, d), 2e-5) for d in (16, 8))


def run_attention(fn):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, H, 5, 8), torch.randn(2, H, 6, 8), torch.randn(2, H, 6, 12)
    mask = torch.zeros(2, 1, 5, 6, dtype=torch.bool)
    mask[0, ..., 4:] = True
    mask[1, ..., 2, :3] = True
    ok = True
    for m in (None, mask):
        ok &= close(fn(q, k, v, m), tx.scaled_dot_product_attention(q, k, v, m))
    return ok


def run_mha(cls, entry_id):
    torch.manual_seed(0)
    ref = tx.MultiHeadAttention(D, H, 0.1).eval()
    mine = cls(D, H, 0.1).eval()
    load_from(ref, mine, entry_id)
    x, mem = torch.randn(N, LT, D), torch.randn(N, LS, D)
    val = torch.randn(N, LS, D)
    pad = tx.padding_mask(ids(N, LS, 11, (7, 5, 3)), PAD)
    dec = tx.decoder_self_mask(ids(N, LT, 13, (5, 2, 4)), PAD)
    with torch.no_grad():
        return (close(mine(x, x, x, dec), ref(x, x, x, dec))
                and close(mine(x, mem, val, pad), ref(x, mem, val, pad))
                and close(mine(x, x, x), ref(x, x, x)))


def as_4d(mask, n, length):
    return torch.broadcast_to(mask if mask.dim() == 4 else mask.unsqueeze(-3)
                              if mask.dim() == 3 else mask, (n, 1, length, length))


def run_masks(kw):
    seq = ids(N, 6, 13, (6, 2, 4))
    ok = True
    if "padding_fn" in kw:
        m = kw["padding_fn"](seq, PAD)
        m = m[:, 0] if m.dim() == 4 else m  # (N, 1, 1, L) -> (N, 1, L)
        ok &= m.dtype == torch.bool and m.dim() == 3 and torch.equal(
            torch.broadcast_to(m, (N, 6, 6)),
            torch.broadcast_to(tx.padding_mask(seq, PAD), (N, 6, 6)))
        ok &= m.size(1) == 1  # one row for every query, so it serves cross-attention too
    if "lookahead_fn" in kw:
        m = kw["lookahead_fn"](6)
        ok &= m.dtype == torch.bool and torch.equal(
            torch.broadcast_to(m, (1, 6, 6))[0], tx.lookahead_mask(6))
    if "decoder_fn" in kw:
        m = kw["decoder_fn"](seq, PAD)
        ok &= m.dtype == torch.bool and torch.equal(
            as_4d(m, N, 6), as_4d(tx.decoder_self_mask(seq, PAD), N, 6))
    return ok


# mistakes that only show in training mode: compared with the same dropout seed
TRAIN_ONLY = {"ffn_dropout_on_output", "enc_dropout_on_residual_stream"}


def run_module(cls, entry_id, kind):
    torch.manual_seed(0)
    if kind == "feed_forward":
        ref, mine = tx.FeedForward(D, DFF, 0.1), cls(D, DFF, 0.1)
    elif kind == "encoder_layer":
        ref, mine = tx.EncoderLayer(D, H, DFF, 0.1), cls(D, H, DFF, 0.1)
    else:
        ref, mine = tx.DecoderLayer(D, H, DFF, 0.1), cls(D, H, DFF, 0.1)
    for p in ref.parameters():  # LayerNorm gains and biases away from 1 and 0
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    load_from(ref, mine, entry_id)
    if entry_id in TRAIN_ONLY:
        x = torch.randn(N, LT, D)
        out = []
        for m in (ref, mine):
            torch.manual_seed(7)
            out.append(m(x) if kind == "feed_forward" else m(x, None))
        return close(*out)
    ref.eval()
    mine.eval()
    x, mem = torch.randn(N, LT, D), torch.randn(N, LS, D)
    src, tgt = ids(N, LS, 11, (7, 5, 3)), ids(N, LT, 13, (5, 2, 4))
    with torch.no_grad():
        if kind == "feed_forward":
            return close(mine(x), ref(x))
        if kind == "encoder_layer":
            m = tx.padding_mask(src, PAD)
            return close(mine(mem, m), ref(mem, m)) and close(mine(mem), ref(mem))
        tm, mm = tx.decoder_self_mask(tgt, PAD), tx.padding_mask(src, PAD)
        return close(mine(x, mem, tm, mm), ref(x, mem, tm, mm))


def run_transformer(cls):
    torch.manual_seed(0)
    cfg = tx.ModelConfig(**CFG)
    ref, mine = tx.Transformer(cfg).eval(), cls(cfg).eval()
    mine.load_state_dict(ref.state_dict(), strict=False)
    src, tgt = ids(N, LS, 11, (7, 5, 3)), ids(N, LT, 13, (5, 2, 4))
    with torch.no_grad():
        return close(mine(src, tgt), ref(src, tgt))


def run_ls(fn):
    torch.manual_seed(0)
    ok = True
    for eps in (0.1, 0.3):
        logits = torch.randn(10, 9, requires_grad=True)
        target = torch.randint(0, 9, (10,))
        target[[2, 5]] = PAD
        ref = nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=PAD)(logits, target)
        ok &= close(fn(logits, target, eps, PAD), ref)
    return bool(ok)


def run_greedy(fn):
    """Same ids as tx.greedy_decode on two models: one whose rows end at different steps,
    and the same one with every logit shifted down by 3 (same argmax for correct code)."""
    ok = True
    for shift in (0.0, -3.0):
        torch.manual_seed(0)
        model = tx.Transformer(tx.ModelConfig(**CFG))
        with torch.no_grad():  # rows 0 and 1 end at step 1, rows 2 and 3 at steps 2 and 3
            model.generator.bias[EOS] = 1.0
            model.generator.bias.add_(shift)
        src = ids(4, LS, 11, (7, 5, 3, 6))
        model.train()
        ref = tx.greedy_decode(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8)
        model.train()
        torch.manual_seed(1)
        out = fn(model, src, bos_idx=BOS, eos_idx=EOS, max_len=8)
        # trailing all-PAD columns are accepted
        while out.size(1) > ref.size(1) and bool((out[:, -1] == PAD).all()):
            out = out[:, :-1]
        ok &= torch.equal(out, ref)
    return ok


def run_step(fn):
    torch.manual_seed(0)
    cfg = tx.ModelConfig(**CFG)
    base = tx.Transformer(cfg)
    runs = []
    for step_fn in (tx.train_step, fn):
        torch.manual_seed(0)
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = tx.noam_scheduler(opt, D, warmup=4)
        crit = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
        g = torch.Generator().manual_seed(3)
        record = []
        for _ in range(3):
            src = torch.randint(4, 11, (N, LS), generator=g)
            tgt = torch.randint(4, 13, (N, LT + 1), generator=g)
            tgt[1, 3:] = PAD
            torch.manual_seed(5)
            out = step_fn(model, (src, tgt[:, :-1], tgt[:, 1:]), opt, crit, sched, 1.0)
            record.append((out["loss"], out["grad_norm"]))
        runs.append((record, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (r_ref, w_ref), (r_mine, w_mine) = runs
    same_numbers = all(abs(a[0] - b[0]) < 1e-5 and abs(a[1] - b[1]) < 1e-4
                       for a, b in zip(r_ref, r_mine, strict=True))
    return same_numbers and torch.allclose(w_ref, w_mine, atol=1e-6)


def matches_reference(entry):
    obj, block, entry_id = entry["make"](), entry["block"], entry["id"]
    if block == "positional_encoding":
        return run_pe(obj)
    if block == "attention":
        return run_attention(obj)
    if block == "multi_head_attention":
        return run_mha(obj, entry_id)
    if block == "masks":
        return run_masks(obj)
    if block in ("feed_forward", "encoder_layer", "decoder_layer"):
        return run_module(obj, entry_id, block)
    if block == "transformer":
        return run_transformer(obj)
    if block == "label_smoothing":
        return run_ls(obj)
    if block == "greedy_decode":
        return run_greedy(obj)
    return run_step(obj)


def main() -> int:
    bad = 0
    for entry in um.CORRECT:
        try:
            ok = matches_reference(entry)
        except Exception as e:  # noqa: BLE001
            ok, why = False, f"{type(e).__name__}: {e}"
        else:
            why = "" if ok else "differs from tx"
        bad += not ok
        print(f"CORRECT {entry['id']:<36} {'ok' if ok else 'BAD ' + why}")
    for entry in um.UNSEEN:
        try:
            same = matches_reference(entry)
            status = "BAD: same as tx" if same else "differs"
        except Exception as e:  # noqa: BLE001
            same, status = False, f"raises {type(e).__name__}: {str(e)[:70]}"
        bad += bool(same)
        print(f"UNSEEN  {entry['id']:<36} {status}")
    print(f"{len(um.CORRECT)} correct, {len(um.UNSEEN)} mistakes, {bad} problem(s)")
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
