import math

import pytest
import torch

import tx_helpers as tx
from tx_helpers.training import (
    History,
    load_checkpoint,
    noam_lr,
    noam_scheduler,
    paper_adam,
    save_checkpoint,
    train,
)


def paper_formula(step, d_model, warmup):
    # lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)
    return (1 / math.sqrt(d_model)) * min(1 / math.sqrt(step), step / warmup ** 1.5)


def test_noam_lr_known_values():
    # at the peak step == warmup the two branches meet: (d_model * warmup)^-0.5
    assert noam_lr(4000, 512, 4000) == pytest.approx(1 / math.sqrt(512 * 4000), rel=1e-12)
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.987712429686844e-04, rel=1e-12)
    assert noam_lr(1, 512, 4000) == pytest.approx(1 / math.sqrt(512) / 4000 ** 1.5, rel=1e-12)
    assert noam_lr(16000, 512, 4000) == pytest.approx(noam_lr(4000, 512, 4000) / 2, rel=1e-12)
    assert noam_lr(0, 512, 4000) == noam_lr(1, 512, 4000)
    for step in (1, 10, 399, 400, 401, 1000, 10_000):
        assert noam_lr(step, 128, 400) == pytest.approx(paper_formula(step, 128, 400), rel=1e-12)


def test_scheduler_sets_the_formula_lr_on_the_optimizer():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = paper_adam([p])
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    sched = noam_scheduler(opt, d_model=64, warmup=10, factor=2.0)
    for k in range(1, 31):  # optimizer step k runs with the k-th Noam rate
        assert opt.param_groups[0]["lr"] == pytest.approx(2.0 * paper_formula(k, 64, 10),
                                                          rel=1e-12)
        p.grad = torch.ones(3)
        opt.step()
        sched.step()


def test_cooldown_decays_the_last_steps_linearly_and_leaves_the_rest_alone():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = paper_adam([p])
    sched = noam_scheduler(opt, d_model=64, warmup=10, factor=2.0, cooldown=4, total=20)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(1)
        opt.step()
        sched.step()
    for k in range(1, 18):  # steps 1-17: the paper's rate, untouched
        assert lrs[k - 1] == pytest.approx(2.0 * paper_formula(k, 64, 10), rel=1e-12)
    for k, share in ((18, 3 / 4), (19, 2 / 4), (20, 1 / 4)):  # the last 4 steps: 4/4 ... 1/4
        assert lrs[k - 1] == pytest.approx(share * 2.0 * paper_formula(k, 64, 10), rel=1e-12)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"cooldown": 5}, TypeError, "total must be an int, got NoneType"),
    ({"cooldown": 50, "total": 20}, ValueError, "cooldown=50 is longer than the run, total=20"),
    ({"cooldown": -1, "total": 20}, ValueError, "cooldown must be positive"),
])
def test_cooldown_needs_a_total_it_fits_in(kwargs, error, match):
    with pytest.raises(error, match=match):
        noam_scheduler(paper_adam([torch.nn.Parameter(torch.zeros(1))]), 64, 10, **kwargs)


def test_scheduler_refuses_a_base_lr_that_would_rescale_the_schedule():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    with pytest.raises(ValueError, match="base lr to be 1.0") as raised:
        noam_scheduler(opt, 128, 4000)
    assert str(raised.value).endswith(
        "build the optimizer with lr=1.0 (e.g. paper_adam(model.parameters())) and scale the curve "
        "with noam_scheduler(..., factor=...)")


def copy_batches(n_batches, batch_size=16, length=6, vocab=12, seed=0):
    """Copy task: tgt = src, with BOS=1, EOS=2, pad=0 and tokens in [3, vocab)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_batches):
        src = torch.randint(3, vocab, (batch_size, length), generator=g)
        lengths = torch.randint(2, length + 1, (batch_size,), generator=g)
        src[torch.arange(length)[None] >= lengths[:, None]] = 0  # real padding
        tgt = torch.cat([torch.ones(batch_size, 1, dtype=torch.long), src,
                         torch.zeros(batch_size, 1, dtype=torch.long)], 1)
        tgt[torch.arange(batch_size), lengths + 1] = 2
        yield src, tgt[:, :-1], tgt[:, 1:]


def small_model(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    cfg = tx.ModelConfig(src_vocab_size=12, tgt_vocab_size=12, d_model=32, n_heads=4,
                         d_ff=64, n_layers=1, dropout=dropout, max_len=32, pad_idx=0)
    return tx.Transformer(cfg)


def test_train_loop_learns_a_tiny_copy_task():
    model = small_model()
    opt = paper_adam(model.parameters())
    sched = noam_scheduler(opt, 32, warmup=20, factor=0.3)
    hist = train(model, copy_batches(120), opt, sched, label_smoothing=0.0)
    assert isinstance(hist, History) and len(hist) == 120
    assert len(hist.lr) == len(hist.grad_norm) == len(hist.accuracy) == 120
    first, last = sum(hist.loss[:10]) / 10, sum(hist.loss[-10:]) / 10
    assert last < 0.6 * first
    assert sum(hist.accuracy[-10:]) / 10 > 0.5
    assert hist.lr[0] == pytest.approx(0.3 * paper_formula(1, 32, 20))


def test_checkpoint_round_trip_and_exact_resume(tmp_path):
    batches = list(copy_batches(6, seed=1))
    model = small_model(seed=2)
    opt = paper_adam(model.parameters())
    sched = noam_scheduler(opt, 32, warmup=4)
    train(model, batches[:4], opt, sched)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model, opt, sched, step=4)
    # the uninterrupted run: two more steps
    ref = train(model, batches[4:], opt, sched)

    # resume: same architecture, fresh optimizer and scheduler, saved state loaded
    model2 = small_model(seed=99)
    opt2 = paper_adam(model2.parameters())
    sched2 = noam_scheduler(opt2, 32, warmup=4)
    _, ckpt = load_checkpoint(path, model2, opt2, sched2, restore_rng=True)
    assert ckpt["step"] == 4
    resumed = train(model2, batches[4:], opt2, sched2)
    assert resumed.loss == ref.loss  # exact, including dropout and Adam moments
    assert resumed.lr == ref.lr
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)

    # a model rebuilt from the file alone decodes exactly like the saved one
    model3, _ = load_checkpoint(path)
    model4 = small_model(seed=5)
    load_checkpoint(path, model4)
    src = batches[0][0]
    out3 = tx.greedy_decode(model3, src, bos_idx=1, eos_idx=2, max_len=8)
    out4 = tx.greedy_decode(model4, src, bos_idx=1, eos_idx=2, max_len=8)
    assert torch.equal(out3, out4)
    with pytest.raises(ValueError, match="config differs"):
        load_checkpoint(path, tx.Transformer(tx.ModelConfig()))


# ---------------------------------------------------------------- mixed precision (amp=)

def _one_step(amp, seed=0, scaler=None, scheduler=False):
    batch = next(copy_batches(1, batch_size=32, seed=seed))
    model = small_model(seed=seed, dropout=0.0)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # linear in the gradient
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if scheduler else None
    crit = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    out = tx.train_step(model, batch, opt, crit, sched, None, amp=amp, scaler=scaler)
    out["last_epoch"] = None if sched is None else sched.last_epoch
    return out, start, model.state_dict()


def test_bf16_autocast_step_is_finite_and_close_to_float32():
    # bfloat16 keeps 8 significant bits: each rounding is off by up to 2^-9 (0.2%) relative.
    # Measured on 3 seeds: loss within 5.4e-4 relative, grad norm within 0.2%, the update
    # (new - old weights) within 2.3% relative (L2); the tolerances leave 4-20x room.
    for seed in range(3):
        ref, start, ref_state = _one_step(None, seed)
        got, _, got_state = _one_step("bf16", seed)
        assert math.isfinite(got["loss"]) and math.isfinite(got["grad_norm"])
        assert all(torch.isfinite(v).all() for v in got_state.values())
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-2)
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=2e-2)
        err = sum(((got_state[k] - ref_state[k]) ** 2).sum() for k in start) ** 0.5
        size = sum(((ref_state[k] - start[k]) ** 2).sum() for k in start) ** 0.5
        assert 0 < err / size < 0.1  # close, and really computed in another precision
        assert all(v.dtype == torch.float32 for v in got_state.values())  # weights stay fp32


def test_masks_stay_exact_under_autocast():
    mha = tx.MultiHeadAttention(16, 4, dropout=0.0)
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(2, 5, 5, dtype=torch.bool)
    mask[0, :, 3:] = True  # padded keys
    mask[1, 2, :] = True  # a fully masked query row
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            out = mha(x, x, x, mask)
        w = mha.attn_weights  # (N, H, L_q, L_k)
        assert w.dtype == dtype  # the scores were filled with finfo(dtype).min, not fp32's
        assert torch.isfinite(out).all()
        assert (w[0, :, :, 3:] == 0).all()  # masked keys get exactly zero weight
        torch.testing.assert_close(w[1, :, 2], torch.full((4, 5), 0.2, dtype=dtype))  # uniform


def test_fp16_uses_a_grad_scaler_and_skips_overflowing_steps():
    model = small_model(dropout=0.0)
    opt = paper_adam(model.parameters())
    sched = noam_scheduler(opt, 32, warmup=4)
    hist = train(model, copy_batches(3), opt, sched, amp="fp16")  # train makes the scaler
    assert len(hist) == 3 and all(math.isfinite(v) for v in hist.loss)
    with pytest.raises(ValueError, match="amp='fp16' needs scaler="):
        _one_step("fp16")
    # a scale so large that the scaled gradients overflow: the step is skipped, the
    # weights and the schedule stay put, and the scaler halves its scale
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    out, start, state = _one_step("fp16", scaler=scaler, scheduler=True)
    assert not math.isfinite(out["grad_norm"])
    assert out["last_epoch"] == 0  # the scheduler did not step either
    assert all(torch.equal(start[k], state[k]) for k in start)
    assert scaler.get_scale() == 2.0 ** 126


@pytest.mark.parametrize("amp", ["bfloat16", "fp32", True, 16])
def test_bad_amp_values_are_refused(amp):
    model = small_model()
    opt = paper_adam(model.parameters())
    for call in (lambda: train(model, copy_batches(1), opt, amp=amp),
                 lambda: _one_step(amp)):
        with pytest.raises(ValueError, match=r"amp must be None \(off\) or one of "
                                             r"\('bf16', 'fp16'\), got amp="):
            call()


def test_pad_idx_has_one_source_the_models_config():
    """train_step refuses a criterion ignoring another id; train refuses another pad_idx."""
    model = tx.Transformer(tx.date_model_config(d_model=16, n_heads=2, d_ff=16, n_layers=1))
    batch = tx.make_batch(tx.DatePairs().sample(4, "train", seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    pad = model.config.pad_idx
    wrong = torch.nn.CrossEntropyLoss(ignore_index=pad + 1)
    with pytest.raises(ValueError, match=rf"ignore_index={pad + 1}.*config.pad_idx={pad}"):
        tx.train_step(model, batch, opt, wrong)
    with pytest.raises(ValueError, match=rf"pad_idx={pad + 1} differs.*config.pad_idx={pad}"):
        tx.train(model, [batch], opt, pad_idx=pad + 1)
    assert len(tx.train(model, [batch], opt, pad_idx=pad)) == 1
