"""The localising probes past attention (issue 29, item 6): label smoothing, greedy decoding,
the train step. Correct code written in other public styles passes (the probes never fail it);
mistakes no variant lists are pinned to the part they break, and the report says which.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as g

# ----------------------------------------------------------------- correct, other styles


def ls_nll_plus_uniform(logits, target, eps, pad_idx):
    """(1 - eps) * NLL + eps * the mean of -log p over the classes (a common tutorial form)."""
    log_p = F.log_softmax(logits, dim=-1)  # (M, V)
    nll = F.nll_loss(log_p, target, ignore_index=pad_idx, reduction="sum")
    smooth = -log_p.mean(-1)[target != pad_idx].sum()
    return ((1 - eps) * nll + eps * smooth) / (target != pad_idx).sum()


def ls_logsumexp(logits, target, eps, pad_idx):
    """The log-softmax by hand (logits - logsumexp), the target by scatter, masked_select."""
    v = logits.size(-1)
    log_p = logits - torch.logsumexp(logits, dim=-1, keepdim=True)  # (M, V)
    q = torch.full_like(logits, eps / v).scatter(1, target[:, None], 1 - eps + eps / v)
    per = -(q * log_p).sum(-1)  # (M,)
    return per.masked_select(target != pad_idx).mean()


@torch.no_grad()
def greedy_one_row_at_a_time(model, src, *, bos_idx, eos_idx, max_len):
    """The Annotated Transformer's single-sentence loop, run per row, rows padded at the end."""
    pad = model.config.pad_idx
    was = model.training
    model.eval()
    rows = []
    for i in range(src.size(0)):
        s = src[i:i + 1]
        mask = (s == pad).unsqueeze(1)  # (1, 1, L_src)
        memory = model.encode(s, mask)
        ys = torch.tensor([[bos_idx]])
        for _ in range(max_len):
            logits = model.generator(model.decode(ys, memory, mask)[:, -1])  # (1, V)
            logits[:, [pad, bos_idx]] = float("-inf")
            nxt = logits.argmax(-1, keepdim=True)
            ys = torch.cat([ys, nxt], dim=1)
            if nxt.item() == eos_idx:
                break
        rows.append(ys[0])
    model.train(was)
    return nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad)


@torch.no_grad()
def greedy_full_forward(model, src, *, bos_idx, eos_idx, max_len):
    """model(src, ys) at every step (the encoder re-run each time), finished rows padded."""
    pad = model.config.pad_idx
    was = model.training
    model.eval()
    ys = torch.full((src.size(0), 1), bos_idx)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        logits = model(src, ys)[:, -1].clone()  # (N, V)
        logits[:, pad] = logits[:, bos_idx] = -float("inf")
        nxt = torch.where(finished, torch.full_like(finished, pad, dtype=torch.long),
                          logits.argmax(-1))
        ys = torch.cat([ys, nxt[:, None]], 1)
        finished = finished | (nxt == eos_idx)
        if finished.all():
            break
    model.train(was)
    return ys


def step_manual_clip(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    """model.zero_grad(), the norm and the rescaling by hand (clip_grad_norm_'s formula)."""
    src, tgt_in, tgt_out = batch
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(src, tgt_in)  # (N, L, V)
    loss = criterion(logits.flatten(0, 1), tgt_out.flatten())
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.sqrt(sum((gr ** 2).sum() for gr in grads))
    scale = (clip_norm / (total + 1e-6)).clamp(max=1.0)
    for gr in grads:
        gr.mul_(scale)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"loss": float(loss), "grad_norm": float(total)}


def step_zero_at_end(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    """Gradients zeroed after the update: a mistake once the model arrives with stale ones."""
    src, tgt_in, tgt_out = batch
    model.train(True)
    out = model(src, tgt_in)
    loss = criterion(out.view(-1, out.size(-1)), tgt_out.contiguous().view(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip_norm)
    optimizer.step()
    optimizer.zero_grad()
    if scheduler:
        scheduler.step()
    return {"loss": loss.item(), "grad_norm": norm.item()}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("check, fn", [
    (g.check_label_smoothing, ls_nll_plus_uniform), (g.check_label_smoothing, ls_logsumexp),
    (g.check_greedy_decode, greedy_one_row_at_a_time),
    (g.check_greedy_decode, greedy_full_forward),
    (g.check_train_step, step_manual_clip),
], ids=lambda x: getattr(x, "__name__", ""))
def test_correct_code_in_other_styles_passes(check, fn):
    result = check(fn, verbose=False)
    assert result.passed, result.report


def test_zeroing_after_the_update_lets_stale_gradients_in():
    """The model arrives with stale gradients: clearing them only after the update is named."""
    result = g.check_train_step(step_zero_at_end, verbose=False)
    assert result.mistakes == ["zero_grad_at_end"], result.report


# ------------------------------------------------------------ mistakes no variant lists


def ls_probabilities(logits, target, eps, pad_idx):
    # the smoothed target weighs the probabilities, not their logarithms
    v = logits.size(-1)
    q = F.one_hot(target, v) * (1 - eps) + eps / v
    per = -(q * logits.softmax(-1)).sum(-1)
    return per[target != pad_idx].mean()


def ls_mean_then_divide(logits, target, eps, pad_idx):
    # the mean over the non-pad positions, divided once more by the number of positions
    return ls_logsumexp(logits, target, eps, pad_idx) / target.numel()


def ls_half_eps(logits, target, eps, pad_idx):
    # eps / (2 V) on every class: the target does not sum to one
    v = logits.size(-1)
    q = F.one_hot(target, v) * (1 - eps) + eps / (2 * v)
    per = -(q * logits.log_softmax(-1)).sum(-1)
    return per[target != pad_idx].mean()


def _greedy(mutate):
    @torch.no_grad()
    def greedy(model, src, *, bos_idx, eos_idx, max_len):
        pad = model.config.pad_idx
        was = model.training
        model.eval()
        mask = mutate.get("src_mask", lambda s, p: (s == p).unsqueeze(1))(src, pad)
        memory = model.encode(src, mask)
        ys = torch.full((src.size(0), 1), bos_idx)
        done = torch.zeros(src.size(0), dtype=torch.bool)
        for _ in range(max_len):
            prefix = mutate.get("prefix", lambda y: y)(ys)
            logits = model.generator(model.decode(prefix, memory, mask)[:, -1])
            logits[:, [pad, bos_idx]] = float("-inf")
            nxt = logits.argmax(-1)
            nxt[done] = mutate.get("fill", pad)
            ys = torch.cat([ys, nxt[:, None]], 1)
            done |= nxt == eos_idx
            if done.all():
                break
        model.train(was)
        return ys
    return greedy


def _step(mutate):
    def step(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
        src, tgt_in, tgt_out = batch
        (model.eval if mutate.get("eval") else model.train)()
        logits = model(src, tgt_in)
        loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm * mutate.get("clip", 1))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return {"loss": loss.item(), "grad_norm": norm.item() * mutate.get("norm", 1)}
    return step


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("check, fn, key, words", [
    (g.check_label_smoothing, ls_probabilities, "ls_not_cross_entropy", "log-probabilities"),
    (g.check_label_smoothing, ls_mean_then_divide, "loss_divided_twice", "four equal positions"),
    (g.check_label_smoothing, ls_half_eps, "ls_target_wrong", "sums to 0.9"),
    (g.check_greedy_decode, _greedy({"fill": 1}), "decode_no_padding_after_eos", "puts pad after"),
    (g.check_greedy_decode, _greedy({"prefix": lambda y: y.flip(1)}), "decode_prefix_wrong",
     "fed bos and the"),
    (g.check_greedy_decode, _greedy({"src_mask": lambda s, p: None}), "decode_src_mask_missing",
     "source padding mask"),
    (g.check_train_step, _step({"eval": True}), "step_eval_mode", "train mode"),
    (g.check_train_step, _step({"clip": 100}), "no_clipping", "at most clip_norm"),
], ids=["ls-probabilities", "ls-divided-again", "ls-half-eps", "greedy-bos-fill",
        "greedy-prefix-flipped", "greedy-no-encoder-mask", "step-eval", "step-clip-100x"])
def test_unlisted_mistake_is_pinned_to_its_part(check, fn, key, words):
    result = check(fn, verbose=False)
    assert not result.passed and key in result.mistakes, result.report
    assert "mismatch" not in result.mistakes, result.report
    assert words in result.report.lower(), result.report


def step_no_zero_grad(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    # gradients accumulate across steps: nothing clears them
    src, tgt_in, tgt_out = batch
    model.train()
    out = model(src, tgt_in)  # (N, L, V)
    loss = criterion(out.flatten(0, 1), tgt_out.flatten())
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"loss": loss.item(), "grad_norm": float(norm)}


def step_schedule_first(model, batch, optimizer, criterion, scheduler=None, clip_norm=1.0):
    # the learning rate moves on before the update that should use it
    src, tgt_in, tgt_out = batch
    model.train()
    model.zero_grad()
    out = model(src, tgt_in)  # (N, L, V)
    loss = criterion(out.flatten(0, 1), tgt_out.flatten())
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    if scheduler is not None:
        scheduler.step()
    optimizer.step()
    return {"loss": loss.item(), "grad_norm": float(norm)}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("fn, key, calls", [
    (step_no_zero_grad, "no_zero_grad", "backward, step, scheduler"),
    (step_schedule_first, "scheduler_before_optimizer", "zero_grad, backward, scheduler, step"),
], ids=["no-zero-grad", "scheduler-first"])
def test_wrong_call_order_is_a_failing_probe(fn, key, calls):
    result = g.check_train_step(fn, verbose=False)
    assert not result.passed and key in result.mistakes, result.report
    assert f"✗ the step's calls, in order: {calls}\n" in result.report + "\n", result.report
    assert "✓ the step's calls" not in result.report, result.report


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("fn", [step_manual_clip, step_zero_at_end], ids=lambda f: f.__name__)
def test_right_call_order_is_a_passing_probe(fn):
    """A wrong return value makes the trace report; the calls themselves are right."""
    def step(*args, **kwargs):
        out = fn(*args, **kwargs)
        return {"loss": out["loss"] * 2, "grad_norm": out["grad_norm"]}
    result = g.check_train_step(step, verbose=False)
    assert not result.passed, result.report
    assert "✓ the step's calls, in order: " in result.report, result.report


@pytest.mark.filterwarnings("ignore")
def test_item_on_a_float_is_not_called_a_missing_layer():
    """`.item()` on a norm already made a float raises AttributeError: the report must not tell
    the learner to create a layer in the constructor (notebook 08's stub now returns float())."""
    def step(*args, **kwargs):
        out = step_manual_clip(*args, **kwargs)
        return {"loss": out["loss"], "grad_norm": out["grad_norm"].item()}
    result = g.check_train_step(step, verbose=False)
    assert not result.passed and "attribute_error" not in result.mistakes, result.report
    assert "exception" in result.mistakes, result.report
