"""check_token_mean_loss and check_amp_step (notebook 12's lab): right code passes, each likely
mistake is named, and the learner's bugs are reported, never raised."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit


def quiet(check, fn):
    return check(fn, verbose=False)


# ------------------------------------------------------------------------ token-mean loss

def token_mean_loss(logits, target, pad_idx, global_tokens, world_size):
    total = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_idx,
                            reduction="sum")
    return total * world_size / global_tokens


def per_rank_mean(logits, target, pad_idx, global_tokens, world_size):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_idx)


def no_world_size(logits, target, pad_idx, global_tokens, world_size):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_idx,
                           reduction="sum") / global_tokens


def pads_counted(logits, target, pad_idx, global_tokens, world_size):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum") \
        * world_size / global_tokens


def plain_sum(logits, target, pad_idx, global_tokens, world_size):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_idx,
                           reduction="sum")


def detached(logits, target, pad_idx, global_tokens, world_size):
    return token_mean_loss(logits, target, pad_idx, global_tokens, world_size).detach()


def tripled(logits, target, pad_idx, global_tokens, world_size):
    return token_mean_loss(logits, target, pad_idx, global_tokens, world_size) * 3


def smoothed(logits, target, pad_idx, global_tokens, world_size):
    # section 1's criterion (label smoothing 0.1) with the right scaling: not this lab's loss
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_idx,
                           reduction="sum", label_smoothing=0.1) * world_size / global_tokens


def smoothed_heavily(logits, target, pad_idx, global_tokens, world_size):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_idx,
                           reduction="sum", label_smoothing=0.4) * world_size / global_tokens


def gathered(logits, target, pad_idx, global_tokens, world_size):
    # a second correct form: gather the log-probabilities of the targets, mask the pads by hand
    logp = F.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N, L)
    return -(logp * (target != pad_idx)).sum() / (global_tokens / world_size)


def test_the_right_loss_passes():
    result = quiet(labkit.check_token_mean_loss, token_mean_loss)
    assert result.passed and not result.mistakes, result.report
    assert "2 ranks holding" in result.report and "3 ranks holding" in result.report
    result = quiet(labkit.check_token_mean_loss, gathered)
    assert result.passed and not result.mistakes, result.report


@pytest.mark.parametrize("fn, key", [
    (per_rank_mean, "dist_per_rank_mean"), (no_world_size, "dist_missing_world_size"),
    (pads_counted, "dist_pads_counted"), (plain_sum, "dist_plain_sum"),
    (detached, "loss_detached"), (tripled, "dist_wrong_value"),
    (smoothed, "dist_label_smoothing"), (smoothed_heavily, "dist_label_smoothing")])
def test_each_loss_mistake_is_named(fn, key):
    result = quiet(labkit.check_token_mean_loss, fn)
    assert not result.passed and result.mistakes == [key], result.report


def test_the_ranks_really_hold_different_token_counts():
    # the per-rank mean is only wrong when the counts differ: the probe line shows them
    result = quiet(labkit.check_token_mean_loss, per_rank_mean)
    line = next(m for m in result.messages if "2 ranks holding" in m)
    counts = eval(line.split("holding ")[1].split(" tokens")[0])  # noqa: S307 - our own text
    assert len(set(counts)) == len(counts) == 2


def test_the_projects_own_loss_is_delegation():
    # a cold reader's route: tools/train_ddp.GlobalTokenMeanLoss passed 4/4 under another name
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(labkit.__file__).resolve().parent.parent / "tools"))
    try:
        import train_ddp
    finally:
        sys.path.pop(0)

    def tml(logits, target, pad_idx, T, W):
        crit = train_ddp.GlobalTokenMeanLoss(pad_idx)
        crit.scale = W / T
        return crit(logits.flatten(0, 1), target.flatten())

    result = quiet(labkit.check_token_mean_loss, tml)
    assert not result.passed and result.mistakes == ["delegated"], result.report
    assert "GlobalTokenMeanLoss" in result.report
    result = quiet(labkit.check_token_mean_loss, token_mean_loss)  # the watch is gone after it
    assert result.passed, result.report


def test_a_hard_coded_pad_index_is_named():
    # a cold reader's loss: ignore_index=0 passed 4/4 while every probe padded with 0
    def pad_zero(logits, target, pad_idx, global_tokens, world_size):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0,
                               reduction="sum") * world_size / global_tokens

    result = quiet(labkit.check_token_mean_loss, pad_zero)
    assert not result.passed and result.mistakes == ["dist_pad_hard_coded"], result.report
    assert "pad index 2" in result.report


def test_a_stub_and_a_crash_are_reported_not_raised():
    def stub(logits, target, pad_idx, global_tokens, world_size):
        raise NotImplementedError("return one rank's loss")

    result = quiet(labkit.check_token_mean_loss, stub)
    assert result.mistakes == ["not_implemented"] and "return one rank's loss" in result.report

    def wrong_axis(logits, target, pad_idx, global_tokens, world_size):
        return F.cross_entropy(logits, target, ignore_index=pad_idx)  # (N, L, V): V is not dim 1

    result = quiet(labkit.check_token_mean_loss, wrong_axis)
    assert not result.passed and result.mistakes


# ------------------------------------------------------------------------ AMP step

def learner_step(*calls, returns="norm", flag="finite norm"):
    """A learner's AMP step, typed as the calls in ``calls`` in that order (written apart from
    the check's variants: a learner's mistake is a call moved, dropped or replaced). It returns
    (norm, skipped); ``flag`` says how skipped is found: from the norm (``not isfinite``, unlike
    the check's scale comparison), from the gradients, or one of the likely wrong ways."""

    def step(micro_losses, model, optimizer, scaler, clip_norm):
        grad_norm, bad_grads = None, None
        k = len(micro_losses)
        scale_at_start = scaler.get_scale()
        scale_before_update = None
        for call in calls:
            if call == "zero_grad":
                optimizer.zero_grad(set_to_none=True)
            elif call == "backward":  # one backward on the mean: accumulation skipped
                scaler.scale(sum(micro_losses) / k).backward()
            elif call == "backward per micro-batch":
                for loss in micro_losses:
                    scaler.scale(loss / k).backward()
            elif call == "backward, zeroing each":
                for loss in micro_losses:
                    optimizer.zero_grad()
                    scaler.scale(loss / k).backward()
            elif call == "backward, not divided":
                for loss in micro_losses:
                    scaler.scale(loss).backward()
            elif call == "backward, unscaled loss":
                (sum(micro_losses) / k).backward()
            elif call == "unscale":
                scaler.unscale_(optimizer)
                bad_grads = any(not torch.isfinite(p.grad).all() for p in model.parameters())
            elif call == "clear by hand":  # a correct variant: no zero_grad call
                for p in model.parameters():
                    p.grad = None
            elif call == "norm, no clip":  # measured by hand, never clipped
                grad_norm = torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))
            elif call == "clip":
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip_norm)
            elif call == "scaler.step":
                scaler.step(optimizer)
            elif call == "optimizer.step":
                optimizer.step()
            elif call == "update":
                scale_before_update = scaler.get_scale()
                scaler.update()
        norm = clip_norm if returns == "clip_norm" else grad_norm
        skipped = {
            "finite norm": lambda: ~torch.isfinite(grad_norm),  # a one-element bool tensor
            "gradients": lambda: bad_grads,
            "always False": lambda: False,
            "scale changed": lambda: scaler.get_scale() != scale_at_start,  # growth too
            "scale before update": lambda: scale_before_update is not None
            and scale_before_update < scale_at_start,  # step alone never changes the scale
            "inverted": lambda: scaler.get_scale() > scale_at_start,
        }[flag]()
        return norm if returns == "norm only" else (norm, skipped)
    return step


RIGHT = ("zero_grad", "backward per micro-batch", "unscale", "clip", "scaler.step", "update")
amp_step = learner_step(*RIGHT)
EACH = "backward per micro-batch"
clip_before_unscale = learner_step("zero_grad", EACH, "clip", "unscale", "scaler.step", "update")
update_before_step = learner_step("zero_grad", EACH, "unscale", "clip", "update", "scaler.step")
bypass = learner_step("zero_grad", EACH, "unscale", "clip", "optimizer.step", "update")
no_scaling = learner_step("zero_grad", "backward, unscaled loss", "unscale", "clip",
                          "scaler.step", "update")
no_update = learner_step(*RIGHT[:-1])
no_zero_grad = learner_step(*RIGHT[1:])
norm_after_clip = learner_step(*RIGHT, returns="clip_norm")
norm_only = learner_step(*RIGHT, returns="norm only")  # the contract before the skipped flag
one_backward = learner_step("zero_grad", "backward", *RIGHT[2:])  # the stacked mean, once
zero_each = learner_step("backward, zeroing each", *RIGHT[2:])
not_divided = learner_step("zero_grad", "backward, not divided", *RIGHT[2:])
zero_at_end = learner_step(*RIGHT[1:], "zero_grad")  # right from the second step on
cleared_by_hand = learner_step("clear by hand", *RIGHT[1:])
no_clip = learner_step("zero_grad", EACH, "unscale", "norm, no clip", "scaler.step",
                       "update")


def step_each(micro_losses, model, optimizer, scaler, clip_norm):
    """The single-batch step of tx.train_step, run once per micro-batch."""
    start = scaler.get_scale()
    for loss in micro_losses:
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        scaler.step(optimizer)
        scaler.update()
    return norm, scaler.get_scale() < start


def unscale_each(micro_losses, model, optimizer, scaler, clip_norm):
    optimizer.zero_grad()
    for loss in micro_losses:
        scaler.scale(loss / len(micro_losses)).backward()
        scaler.unscale_(optimizer)  # the second call raises
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm, not torch.isfinite(norm)


def keeps_graph(micro_losses, model, optimizer, scaler, clip_norm):
    """Right in every number, but each backward keeps its graph (retain_graph=True)."""
    optimizer.zero_grad()
    for loss in micro_losses:
        scaler.scale(loss / len(micro_losses)).backward(retain_graph=True)
    scaler.unscale_(optimizer)
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    start = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return norm, scaler.get_scale() < start


def test_a_backward_that_keeps_its_graph_is_named():
    result = quiet(labkit.check_amp_step, keeps_graph)
    assert not result.passed and result.mistakes == ["amp_retain_graph"], result.report
    right = quiet(labkit.check_amp_step, amp_step)
    assert "each backward freed its micro-batch's graph" in right.report


@pytest.mark.parametrize("fn", [amp_step, cleared_by_hand])
def test_the_right_step_passes(fn):
    result = quiet(labkit.check_amp_step, fn)
    assert result.passed and not result.mistakes, result.report
    assert "an infinite loss is reported as skipped (skipped: True)" in result.report
    assert "gradients overflow is reported as skipped (skipped: True)" in result.report


@pytest.mark.parametrize("fn, key", [
    (zero_each, "amp_accum_zero_each"), (not_divided, "amp_accum_not_averaged"),
    (step_each, "amp_accum_step_each"), (unscale_each, "amp_accum_step_each"),
    (one_backward, "amp_accum_one_backward")])
def test_each_accumulation_mistake_is_named(fn, key):
    result = quiet(labkit.check_amp_step, fn)
    assert not result.passed and key in result.mistakes, result.report


def test_two_micro_batches_make_the_step_of_the_whole_batch():
    torch.manual_seed(0)
    model, twin = nn.Linear(4, 3), nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    opt, opt2 = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    s1, s2 = (torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) for _ in range(2))
    micro = [F.cross_entropy(model(x[i::2]), y[i::2]) for i in range(2)]
    norm, _ = amp_step(micro, model, opt, s1, 100.0)
    norm2, _ = amp_step([F.cross_entropy(twin(x), y)], twin, opt2, s2, 100.0)
    torch.testing.assert_close(model.weight, twin.weight)
    assert abs(float(norm) - float(norm2)) < 1e-5


def test_a_flag_read_from_the_gradients_passes():
    result = quiet(labkit.check_amp_step, learner_step(*RIGHT, flag="gradients"))
    assert result.passed and not result.mistakes, result.report


@pytest.mark.parametrize("flag", ["always False", "scale changed", "scale before update",
                                  "inverted"])
def test_a_wrong_skipped_flag_is_named(flag):
    result = quiet(labkit.check_amp_step, learner_step(*RIGHT, flag=flag))
    assert not result.passed and result.mistakes == ["amp_skipped_flag"], result.report


def test_a_flag_read_from_the_losses_is_named():
    # a cold reader's flag: it passed 7/7, yet fp16's overflow is a finite loss with inf gradients
    def from_losses(micro_losses, model, optimizer, scaler, clip_norm):
        n, _ = amp_step(micro_losses, model, optimizer, scaler, clip_norm)
        return n, not all(torch.isfinite(loss) for loss in micro_losses)

    result = quiet(labkit.check_amp_step, from_losses)
    assert not result.passed and result.mistakes == ["amp_skipped_flag"], result.report
    assert "gradients overflow is reported as skipped (skipped: False)" in result.report


def test_a_flag_that_reads_no_growth_as_skipped_is_named():
    # a cold reader's flag: it passed 10/10 while the check's scaler grew the scale after every
    # finite step; under PyTorch's default growth_interval a good step leaves the scale unchanged
    def not_grown(micro_losses, model, optimizer, scaler, clip_norm):
        optimizer.zero_grad()
        for loss in micro_losses:
            scaler.scale(loss / len(micro_losses)).backward()
        scaler.unscale_(optimizer)
        n = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        s = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        return n, scaler.get_scale() <= s  # "the scale did not grow" = skipped

    result = quiet(labkit.check_amp_step, not_grown)
    assert not result.passed and result.mistakes == ["amp_skipped_flag"], result.report
    assert "default growth interval" in result.report and "skipped: True, True, True" \
        in result.report


def test_a_bare_norm_is_named():
    result = quiet(labkit.check_amp_step, norm_only)
    assert not result.passed and result.mistakes == ["amp_not_a_pair"], result.report
    assert "it returned a Tensor" in result.report


def test_the_right_step_matches_tx_train_step():
    # the check's reference order is the one tx.train_step uses for amp="fp16"
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    twin = nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    opt, opt2 = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    s1, s2 = (torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) for _ in range(2))
    norm, skipped = amp_step([F.cross_entropy(model(x), y) * 5], model, opt, s1, 0.5)
    opt2.zero_grad()
    s2.scale(F.cross_entropy(twin(x), y) * 5).backward()
    s2.unscale_(opt2)
    norm2 = nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    s2.step(opt2)
    s2.update()
    assert torch.equal(model.weight, twin.weight) and float(norm) == float(norm2)
    assert not skipped


@pytest.mark.parametrize("fn, key", [
    (clip_before_unscale, "amp_clip_before_unscale"),
    (update_before_step, "amp_update_before_step"),
    (bypass, "amp_optimizer_step_bypasses_scaler"), (no_scaling, "amp_no_loss_scaling"),
    (no_update, "amp_no_update"), (no_zero_grad, "no_zero_grad"),
    (norm_after_clip, "amp_grad_norm"), (zero_at_end, "amp_zero_at_end"),
    (no_clip, "amp_no_clip")])
def test_each_step_mistake_is_named(fn, key):
    result = quiet(labkit.check_amp_step, fn)
    assert not result.passed and key in result.mistakes, result.report


def test_an_overflow_that_is_not_skipped_is_named():
    result = quiet(labkit.check_amp_step, bypass)
    assert "amp_overflow_not_skipped" in result.mistakes, result.report


def test_a_stub_is_reported_not_raised():
    def stub(micro_losses, model, optimizer, scaler, clip_norm):
        raise NotImplementedError("finish the step; return the norm before clipping")

    result = quiet(labkit.check_amp_step, stub)
    assert result.mistakes == ["not_implemented"]
    assert "return the norm before clipping" in result.report


def test_every_new_mistake_has_text_and_a_hint():
    for key, (text, hint) in labkit.MISTAKES.items():
        if key.startswith(("dist_", "amp_")):
            assert text and hint
