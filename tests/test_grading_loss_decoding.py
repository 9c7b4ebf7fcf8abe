"""check_label_smoothing, check_greedy_decode and check_transformer(share_embeddings=True)."""
import itertools
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as g
import tx_helpers as tx
from labkit import decoding as gd
from labkit.compare import _variants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grading_learners_loss_decoding import (  # noqa: E402
    DECODING_MISTAKES,
    SMOOTHING_MISTAKES,
    greedy_full_length,
    make_greedy,
    make_smoothed_loss,
)
from test_grading import LearnerTransformer  # noqa: E402


def quiet(check, obj, **kw):
    return check(obj, verbose=False, **kw)


# ------------------------------------------------------------------ label smoothing

@pytest.mark.parametrize("fn", [make_smoothed_loss()], ids=["by hand"])
def test_label_smoothing_correct_passes(fn):
    result = quiet(g.check_label_smoothing, fn)
    assert result.passed, result.report


@pytest.mark.parametrize("key", list(SMOOTHING_MISTAKES))
def test_label_smoothing_mistake_named(key):
    result = quiet(g.check_label_smoothing, SMOOTHING_MISTAKES[key])
    assert not result.passed and result.mistakes == [key], result.report


def test_label_smoothing_report_shows_the_floor():
    result = quiet(g.check_label_smoothing, make_smoothed_loss())
    assert any("with logits = log q" in line for line in result.messages)


def test_label_smoothing_stub_and_float_return():
    def stub(logits, target, eps, pad_idx):
        raise NotImplementedError("use log_softmax")
    assert quiet(g.check_label_smoothing, stub).mistakes == ["not_implemented"]
    result = quiet(g.check_label_smoothing, lambda *a: make_smoothed_loss()(*a).item())
    assert "wrong_output_type" in result.mistakes


# ------------------------------------------------------------------ greedy decoding

@pytest.mark.parametrize("fn", [tx.greedy_decode, make_greedy()], ids=["tx", "by hand"])
def test_greedy_correct_passes(fn):
    result = quiet(g.check_greedy_decode, fn)
    assert result.passed, result.report


@pytest.mark.parametrize("key", list(DECODING_MISTAKES))
def test_greedy_mistake_named(key):
    result = quiet(g.check_greedy_decode, DECODING_MISTAKES[key])
    assert not result.passed and result.mistakes == [key], result.report


def test_greedy_max_len_plus_one_named():
    result = quiet(g.check_greedy_decode, make_greedy(extra_steps=1))
    assert result.mistakes == ["decode_max_len_off_by_one"], result.report


def test_greedy_probe_tells_every_mistake_apart():
    """The probe model's outputs differ for every listed mistake, and from the reference."""
    model = gd._probe_model().eval()
    with torch.no_grad():
        ref = gd._greedy_variant(model, gd._SRC)
        torch.testing.assert_close(ref, tx.greedy_decode(model, gd._SRC, bos_idx=gd.BOS,
                                                         eos_idx=gd.EOS, max_len=gd.MAX_LEN))
        singles = list(_variants(gd._DECODE_AXES,
                                 lambda **kw: gd._greedy_variant(model, gd._SRC, **kw), 1))
    outs = [(("reference",), ref)] + singles
    for (a, x), (b, y) in itertools.combinations(outs, 2):
        assert a == b or x.shape != y.shape or not torch.equal(x, y), (a, b)


@torch.no_grad()
def greedy_left_in_eval(model, src, *, bos_idx, eos_idx, max_len):
    """Right tokens, but the caller's train mode is never given back."""
    model.eval()
    pad = model.config.pad_idx
    src_mask = (src == pad).unsqueeze(1)  # (N, 1, L_src): True at padding
    memory = model.encode(src, src_mask)  # (N, L_src, d_model)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)  # (N, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool)  # (N,)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])  # (N, V)
        logits[:, pad] = logits[:, bos_idx] = float("-inf")
        nxt = logits.argmax(-1).masked_fill(finished, pad)  # (N,)
        ys = torch.cat([ys, nxt[:, None]], 1)  # (N, t + 1)
        finished |= nxt == eos_idx
        if finished.all():
            break
    return ys


def test_greedy_left_in_eval_passes_with_a_note():
    """Leaving the model in eval mode is common in correct public decoders: a note, not a fail."""
    result = quiet(g.check_greedy_decode, greedy_left_in_eval)
    assert result.passed and result.mistakes == [], result.report
    assert "left in eval mode afterwards" in result.report and ".train(" not in result.report


def test_greedy_restoring_the_mode_passes():
    def restored(model, src, **kw):
        was = model.training
        try:
            return greedy_left_in_eval(model, src, **kw)
        finally:
            model.train(was)
    result = quiet(g.check_greedy_decode, restored)
    assert result.passed, result.report
    assert "left in eval mode afterwards" not in result.report


def test_greedy_restores_nothing_else():
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    quiet(g.check_greedy_decode, make_greedy())
    assert torch.equal(torch.rand(2), expected)


# ------------------------------------------------------------------ tied embeddings

class TiedLearner(LearnerTransformer):
    def __init__(self, config, how="share"):
        super().__init__(config)
        if not config.share_embeddings or how == "none":
            return
        if how == "share":
            self.encoder.embedding.weight = self.generator.weight
            self.decoder.embedding.weight = self.generator.weight
        else:  # "copy": equal numbers, three Parameters
            self.encoder.embedding.weight = nn.Parameter(self.generator.weight.detach().clone())
            self.decoder.embedding.weight = nn.Parameter(self.generator.weight.detach().clone())


def test_tied_transformer():
    assert quiet(g.check_transformer, TiedLearner, share_embeddings=True).passed
    assert quiet(g.check_transformer, TiedLearner).passed  # ties only when asked
    assert quiet(g.check_transformer, tx.Transformer, share_embeddings=True).passed
    untied = quiet(g.check_transformer, lambda c: TiedLearner(c, "none"), share_embeddings=True)
    assert untied.mistakes == ["embeddings_not_tied"], untied.report
    copied = quiet(g.check_transformer, lambda c: TiedLearner(c, "copy"), share_embeddings=True)
    assert copied.mistakes == ["embeddings_copied_not_tied"], copied.report


def test_discovery_finds_the_new_checks():
    def smoothed_loss(logits, target, eps, pad_idx):
        return make_smoothed_loss()(logits, target, eps, pad_idx)

    def my_greedy_decode(model, src, *, bos_idx, eos_idx, max_len):
        return make_greedy()(model, src, bos_idx=bos_idx, eos_idx=eos_idx, max_len=max_len)

    class MyTiedTransformer(TiedLearner):
        pass

    space = {"smoothed_loss": smoothed_loss, "my_greedy_decode": my_greedy_decode,
             "MyTiedTransformer": MyTiedTransformer}
    found = dict(g.find_checks(space, module=None))
    assert set(found) == {"check_label_smoothing(smoothed_loss)",
                          "check_greedy_decode(my_greedy_decode)",
                          "check_transformer(MyTiedTransformer)"}
    results = [run(verbose=False) for run in found.values()]
    assert all(r.passed for r in results), [r.report for r in results]


def test_greedy_never_stopping_early_named():
    # the stub's contract says the loop stops once every row has ended
    result = quiet(g.check_greedy_decode, greedy_full_length)
    assert not result.passed and result.mistakes == ["decode_no_early_stop"], result.report


def _ls_builtin(logits, target, eps, pad_idx):
    return F.cross_entropy(logits, target, label_smoothing=eps, ignore_index=pad_idx)


def _ls_module(logits, target, eps, pad_idx):
    return nn.CrossEntropyLoss(ignore_index=pad_idx, label_smoothing=eps)(logits, target)


@pytest.mark.parametrize("fn", [_ls_builtin, _ls_module], ids=["functional", "module"])
def test_label_smoothing_builtin_named(fn):
    result = quiet(g.check_label_smoothing, fn)
    assert not result.passed and result.mistakes == ["ls_builtin_smoothing"], result.report


def test_label_smoothing_from_plain_cross_entropy_passes():
    # (1 - eps) * NLL + eps * mean(-log p): written without building q, still correct
    def smoothed(logits, target, eps, pad_idx):
        keep = target != pad_idx  # (M,)
        nll = F.cross_entropy(logits[keep], target[keep])
        uniform = -torch.log_softmax(logits[keep], dim=-1).mean(-1).mean()
        return (1 - eps) * nll + eps * uniform
    result = quiet(g.check_label_smoothing, smoothed)
    assert result.passed, result.report


def test_train_step_without_model_train_named():
    def step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
        src, tgt_in, tgt_out = batch
        optimizer.zero_grad()
        logits = model(src, tgt_in)  # (N, L, V)
        loss = criterion(logits.flatten(0, 1), tgt_out.flatten())
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return {"loss": loss.item(), "grad_norm": float(norm)}
    result = quiet(g.check_train_step, step)
    assert not result.passed and "step_eval_mode" in result.mistakes, result.report


def test_train_step_fetched_by_getattr_fails_in_the_notebook_too():
    """A cold reader's step: tx.train_step reached through getattr passed check_train_step
    7/7 in the notebook while the grade gave 0; the in-notebook watch now names it."""
    def my_train_step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
        return getattr(tx, "train" + "_step")(model, batch, optimizer, criterion, scheduler,
                                               clip_norm)

    result = quiet(g.check_train_step, my_train_step)
    assert not result.passed and "delegated" in result.mistakes


def test_train_fetched_for_one_batch_fails_in_the_notebook_too():
    """The same through tx.train on a one-batch list."""
    def my_train_step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
        h = tx.train(model, [batch], optimizer, scheduler, label_smoothing=0.1,
                     clip_norm=clip_norm)
        return {"loss": h.loss[0], "grad_norm": h.grad_norm[0]}

    result = quiet(g.check_train_step, my_train_step)
    assert not result.passed and "delegated" in result.mistakes
