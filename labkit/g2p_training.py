"""Checks: notebook 13's lab, the training call on real data (the batches are
:mod:`labkit.g2p_batching`'s).

``check_g2p_training(fn, ...)``: ``fn(recipe, batches) -> (model, history)`` trains the recipe's
model (built by the notebook's set-up: Adam and the Noam schedule) on the first
``recipe["steps"]`` batches with ``tx.train`` and returns the *average* of the weights at the last
``recipe["average_last"]`` checkpoints, ``recipe["average_every"]`` steps apart, the last one after
the final step (the paper's checkpoint averaging). The check runs it on a tiny recipe and
compares the history and the returned weights with the reference run (and with its usual wrong
variants: no copy of the checkpoints, checkpoints at the wrong steps); given the notebook's
trained model it also scores the validation WER of the short run against a stated margin.
"""
from __future__ import annotations

import itertools
import math

import torch

from tx_helpers.g2p import (
    LIVE_RECIPE,
    evaluate,
    g2p_model_config,
    make_g2p_batch,
)
from tx_helpers.model import Transformer
from tx_helpers.training import History, noam_scheduler, paper_adam, train

from .g2p_batching import _made_up_pairs
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Report, _run_check

MISTAKES.update({
    "g2p_train_wrong_steps": (
        "the history does not have one entry per step of the recipe",
        "train on exactly as many batches as the recipe's steps"),
    "g2p_train_no_scheduler": (
        "the learning rate never changes: the Noam schedule is not passed to the training call",
        "pass the scheduler to the training call: the optimizer's base rate is 1.0 and only "
        "the schedule scales it"),
    "g2p_train_wrong_schedule": (
        "the learning rates differ from the recipe's Noam schedule",
        "build the schedule from the model's d_model and the recipe's warmup, factor, cooldown "
        "and steps"),
    "g2p_train_not_seeded": (
        "the first loss differs from the reference: the model was not built right after seeding "
        "with the recipe's seed (or with another config)",
        "seed with the recipe's seed, then build the model from the recipe's model settings"),
    "g2p_train_label_smoothing": (
        "the loss is not the recipe's label-smoothed loss",
        "pass the recipe's label smoothing to the training call"),
    "g2p_train_no_clipping": (
        "the gradients are not clipped at the recipe's norm",
        "pass the recipe's clip_norm to the training call"),
    "g2p_train_wrong_return": (
        "the function does not return (the trained model, its History)",
        "return the model you trained and the History the training call gave back"),
    "g2p_avg_final_weights": (
        "the returned weights are the final step's, not an average: either nothing is averaged, "
        "or every checkpoint you kept is the model's live tensors (a state dict holds references "
        "to the weights, which the following steps overwrite)",
        "keep a copy of each checkpoint's tensors, detached from the model, and average those"),
    "g2p_avg_wrong_steps": (
        "the returned weights are an average, but of checkpoints taken after other steps than "
        "the recipe's (off by one, not average_every apart, or too many)",
        "the last checkpoint is the one after the final step; count back the spacing "
        "between checkpoints for each earlier one"),
    "g2p_avg_not_eval": (
        "the returned model is still in training mode",
        "return the model in evaluation mode, as the contract says"),
    "g2p_run_wer_above_margin": (
        "the validation WER of the short run is above the margin a correct run stays under",
        "run the two checks above first; then look at the loss curve and the learning rate"),
})


# the checkpoints after steps 3, 5 and 7: neither the multiples of average_every (2, 4, 6) nor
# the first average_last of them, nor any other way of picking, lands on the same steps
TINY_RECIPE = {**LIVE_RECIPE, "steps": 7, "batch_size": 8, "warmup": 2, "clip_norm": 0.05,
               "average_last": 3, "average_every": 2,
               "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
                         "dropout": 0.0, "norm_first": True}}


def _reference(recipe, batches, *, label_smoothing=None, clip_norm=-1.0, schedule=True,
               states=None):
    """The reference short run (and, through its keywords, the usual wrong variants): the model
    holds the average of the recipe's checkpoints. ``states``, a dict, receives a copy of the
    weights after every step (step number -> state dict)."""
    torch.manual_seed(recipe["seed"])
    model = Transformer(g2p_model_config(**recipe["model"]))
    optimizer = paper_adam(model.parameters())
    scheduler = noam_scheduler(optimizer, model.config.d_model, recipe["warmup"],
                               recipe["factor"], cooldown=recipe["cooldown"],
                               total=recipe["steps"]) if schedule else None
    states = {} if states is None else states

    def keep(history):
        states[len(history)] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    history = train(model, itertools.islice(batches, recipe["steps"]), optimizer, scheduler,
                    label_smoothing=recipe["label_smoothing"] if label_smoothing is None
                    else label_smoothing,
                    clip_norm=recipe["clip_norm"] if clip_norm == -1.0 else clip_norm,
                    callback=keep)
    model.load_state_dict(_mean_state([states[s] for s in _checkpoint_steps(recipe)
                                       if s in states]))
    return model.eval(), history


def _checkpoint_steps(recipe) -> list[int]:
    """The steps after which the recipe's averaged checkpoints are taken, the last one last."""
    steps, every = recipe["steps"], recipe.get("average_every", 1)
    return [steps - every * i for i in reversed(range(recipe.get("average_last", 1)))
            if steps - every * i > 0]


def _mean_state(states: list[dict]) -> dict:
    return {k: torch.stack([s[k].double() for s in states]).mean(0).to(states[0][k].dtype)
            for k in states[0]}


def _same_weights(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(
        got[k].shape == want[k].shape and torch.allclose(got[k].double(), want[k].double(),
                                                         rtol=1e-5, atol=1e-6) for k in want)


def _averaged_steps(got: dict, states: dict, chosen: list[int]) -> tuple[int, ...] | None:
    """Which checkpoints ``got`` is the mean of (two or more, other than ``chosen``), if any.

    The tiny run's 7 steps give 120 candidate sets; a set's mean is matched tensor by tensor."""
    steps = sorted(states)
    for n in range(2, len(steps) + 1):
        for c in itertools.combinations(steps, n):
            if list(c) != chosen and _same_weights(got, _mean_state([states[s] for s in c])):
                return c
    return None


def _steps_text(steps) -> str:
    steps = [str(s) for s in steps]
    return ", ".join(steps[:-1]) + " and " + steps[-1] if len(steps) > 1 else "".join(steps)


def _close(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(y))
                                    for x, y in zip(a, b, strict=True))


def check_g2p_training(fn, *, model=None, words=None, lexicon=None, max_wer: float | None = None,
                       verbose: bool = True) -> CheckResult:
    """Check ``fn(recipe, batches) -> (model, history)`` against the reference short run.

    With ``model``, ``words``, ``lexicon`` and ``max_wer`` (the notebook's trained model, the
    validation words and the margin), also score that model's greedy WER on ``words``.
    """

    def body(report: _Report):
        pairs = _made_up_pairs(80, seed=1)
        batches = [make_g2p_batch(pairs[i:i + 8]) for i in range(0, 72, 8)]  # 9 > 7 steps
        with torch.enable_grad():
            out = _call(report, "fn(recipe, batches) on a tiny recipe", fn, dict(TINY_RECIPE),
                        iter(batches))
            states = {}
            want_model, want = _reference(TINY_RECIPE, iter(batches), states=states)
        if not report.probe(isinstance(out, tuple) and len(out) == 2
                            and isinstance(out[0], torch.nn.Module)
                            and isinstance(out[1], History), "returns (model, History)"):
            report.mistake("g2p_train_wrong_return", f"got {type(out).__name__}")
            return
        got_model, got = out
        steps = TINY_RECIPE["steps"]
        if not report.probe(len(got) == steps, f"{steps} steps for a recipe of {steps} steps "
                            f"(given {len(batches)} batches)"):
            report.mistake("g2p_train_wrong_steps", f"got {len(got)}")
            return
        if not report.probe(_close(got.lr, want.lr), "the learning rate follows the recipe's "
                            "Noam schedule"):
            constant = len(set(round(x, 12) for x in got.lr)) == 1
            report.mistake("g2p_train_no_scheduler" if constant else "g2p_train_wrong_schedule")
        if not report.probe(_close(got.loss, want.loss), "the losses equal the reference run's"):
            with torch.enable_grad():
                variants = {
                    "g2p_train_label_smoothing": _reference(TINY_RECIPE, iter(batches),
                                                            label_smoothing=0.0)[1].loss,
                    "g2p_train_no_clipping": _reference(TINY_RECIPE, iter(batches),
                                                        clip_norm=None)[1].loss,
                }
            named = [k for k, v in variants.items() if _close(got.loss, v)]
            first = abs(got.loss[0] - want.loss[0]) > 1e-5 * max(1.0, abs(want.loss[0]))
            report.mistake(named[0] if named else
                           "g2p_train_not_seeded" if first and got.lr and _close(got.lr, want.lr)
                           else "mismatch")
            return  # another run: its weights say nothing about the averaging
        got_state = {k: v.detach() for k, v in got_model.state_dict().items()}
        chosen = _checkpoint_steps(TINY_RECIPE)
        if not report.probe(_same_weights(got_state, want_model.state_dict()),
                            f"the returned weights are the mean of the checkpoints after steps "
                            f"{_steps_text(chosen)}"):
            final = states.get(steps)
            picked = _averaged_steps(got_state, states, chosen)
            if final is not None and _same_weights(got_state, final):
                report.mistake("g2p_avg_final_weights")
            elif picked is not None:
                report.mistake("g2p_avg_wrong_steps", f"yours averages the checkpoints after "
                               f"steps {_steps_text(picked)}; the recipe's are "
                               f"{_steps_text(chosen)}")
            else:
                report.mistake("g2p_train_wrong_return", "its weights are none of the run's "
                               "checkpoints, nor an average of them")
        elif not report.probe(not got_model.training, "the returned model is in evaluation mode"):
            report.mistake("g2p_avg_not_eval")
        if model is None:
            return
        result = evaluate(list(words), model=model, lexicon=lexicon)
        ok = math.isfinite(result["wer"]) and result["wer"] <= max_wer
        if not report.probe(ok, f"your short run's validation WER is below the {max_wer:.0%} "
                            f"margin (on {result['words']:,} validation words)"):
            report.mistake("g2p_run_wer_above_margin", f"WER {result['wer']:.1%}")

    return _run_check("check_g2p_training", body, verbose, fn)
