"""Trained models that ship with the repository, and the recipes that make them.

Notebooks 09-11 use the dates model of notebook 08, and notebook 13 the
pronunciation model of :mod:`tx_helpers.g2p`. Training the dates model takes about a
minute, and its weights depend on the machine (thread count and CPU kernels
change the arithmetic from step ~7 on), so every learner would see different
predictions. Instead the project ships the weights: ``make models`` trains each
entry of :data:`RECIPES` and writes ``tx_helpers/models/<name>.pt`` together
with ``tx_helpers/models/MANIFEST.json`` (the file's SHA-256, size and recipe
hash). :func:`load_pretrained` never trains and never writes. It refuses a file
that is missing, corrupt, replaced or made from another recipe, with an error
that names the file and the command that rebuilds it.

What a model file holds (all plain tensors and values, so it loads with
``torch.load(weights_only=True)``): the config, the weights, the recipe and its
hash, the vocabulary, a SHA-256 of the weights, the training history and the
machine that trained it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import platform
from pathlib import Path

import torch

from .data import DATE_VOCAB, DatePairs, date_batches, date_model_config
from .g2p_data import LETTER_VOCAB, PHONE_VOCAB, g2p_model_config, g2p_training
from .model import Transformer
from .notebook import get_device
from .recipes import DATES_RECIPE, RECIPES, is_g2p, recipe_hash
from .training import (
    History,
    atomic_write,
    load_checkpoint,
    noam_scheduler,
    paper_adam,
    save_checkpoint,
    train,
)

# The recipes and the registry of shipped models (RECIPES) live in .recipes, which imports
# nothing from tx_helpers; tx.pretrained.DATES_RECIPE, RECIPES and recipe_hash still work.
MODELS_DIR = Path(__file__).resolve().parent / "models"
MANIFEST = MODELS_DIR / "MANIFEST.json"
REBUILD = "make models"  # the command that rebuilds every shipped model
#: Where ``make models`` keeps its resumable checkpoints (ignored by git).
CHECKPOINT_DIR = Path(__file__).resolve().parents[1] / "build" / "checkpoints"
CHECKPOINT_EVERY = 100  # steps between checkpoints


class ModelFileError(ValueError):
    """A shipped model file is missing, corrupt, or does not match its recipe."""


def weights_sha256(state_dict: dict) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in key order."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def model_path(name: str) -> Path:
    _recipe(name)
    return MODELS_DIR / f"{name}.pt"


def _recipe(name: str) -> dict:
    if name not in RECIPES:
        raise ValueError(f"name must be one of {sorted(RECIPES)}, got {name!r}")
    return RECIPES[name]


def _config(recipe: dict):
    make = g2p_model_config if is_g2p(recipe) else date_model_config
    return make(**recipe["model"])


def _vocab(recipe: dict) -> str:
    """The vocabulary a model file must hold, as one string."""
    if is_g2p(recipe):
        return " ".join(LETTER_VOCAB.itos) + " | " + " ".join(PHONE_VOCAB.itos)
    return "".join(DATE_VOCAB.itos)


# ---------------------------------------------------------------- training

def dates_training(recipe: dict = DATES_RECIPE):
    """Seed, then build what the recipe names: ``(model, optimizer, scheduler, batches)``.

    The one place a dates recipe turns into objects: :func:`train_from_recipe`
    and ``tools/bench.py`` both start here. ``batches`` is a generator of
    ``recipe["steps"]`` fresh training batches.
    """
    torch.manual_seed(recipe["seed"])
    config = date_model_config(**recipe["model"])
    model = Transformer(config)
    optimizer = paper_adam(model.parameters())
    scheduler = noam_scheduler(optimizer, config.d_model, recipe["warmup"], recipe["factor"])
    pairs = DatePairs(recipe["test_fraction"], recipe["split_seed"])
    batches = date_batches(recipe["steps"], recipe["batch_size"], seed=recipe["seed"],
                           pairs=pairs, bucket=recipe["bucket"])
    return model, optimizer, scheduler, batches


def _training(recipe: dict, start: int):
    """``(model, optimizer, scheduler, batches)`` for any recipe, batches from step ``start``."""
    if is_g2p(recipe):
        return g2p_training(recipe, start)
    model, optimizer, scheduler, batches = dates_training(recipe)
    return model, optimizer, scheduler, itertools.islice(batches, start, None)


def train_from_recipe(recipe: dict = DATES_RECIPE, *, progress: bool = False,
                      checkpoint: Path | None = None):
    """Train a model from its recipe on the CPU: returns ``(model, history)``.

    With ``checkpoint`` (a path), the run saves model, optimizer, scheduler, RNG and
    history there every :data:`CHECKPOINT_EVERY` steps, and a run that finds a
    checkpoint of the same recipe there resumes from it: the result is the same
    as an uninterrupted run. Torch's global random state is put back afterwards,
    so a caller's random stream does not depend on whether it trained.

    A recipe with ``"average_last": k`` (and ``"average_every": m`` steps) returns the
    average of the weights at the last k of every m steps, as the paper did for its
    base models (section 6.1: the last 5 checkpoints, 10 minutes apart).
    """
    steps, count = recipe["steps"], recipe.get("average_last", 1)
    every = recipe.get("average_every", 1)
    state = torch.get_rng_state()
    try:
        start, history, snapshots = 0, History(), []
        if checkpoint is not None and Path(checkpoint).is_file():
            ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
            if ckpt["extra"].get("recipe_hash") == recipe_hash(recipe):
                start, history = ckpt["step"], History(**ckpt["extra"]["history"])
                snapshots = ckpt["extra"].get("snapshots", [])
                print(f"resuming from {checkpoint} at step {start}", flush=True)
        model, optimizer, scheduler, batches = _training(recipe, start)
        if start:
            load_checkpoint(checkpoint, model, optimizer, scheduler, restore_rng=True)

        def after_step(history):
            done = len(history)
            if count > 1 and (steps - done) % every == 0 and steps - done < count * every:
                snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            if checkpoint is not None and (done % CHECKPOINT_EVERY == 0 or done == steps):
                save_checkpoint(checkpoint, model, optimizer, scheduler, step=done,
                                extra={"recipe_hash": recipe_hash(recipe), "snapshots": snapshots,
                                       "history": dataclasses.asdict(history)})

        history = train(model, batches, optimizer, scheduler,
                        label_smoothing=recipe["label_smoothing"],
                        clip_norm=recipe["clip_norm"], progress=progress, total=steps,
                        history=history, callback=after_step)
        if count > 1:
            model.load_state_dict(average_weights(snapshots))
    finally:
        torch.set_rng_state(state)
    return model.eval(), history


def average_weights(state_dicts: list[dict]) -> dict:
    """The element-wise mean of several state dicts of one model (summed in float64, so
    a tensor that is the same in all of them comes back bit for bit)."""
    if not state_dicts:
        raise ValueError("average_weights needs at least one state dict, got none")
    return {name: torch.stack([sd[name] for sd in state_dicts]).double().mean(0)
            .to(state_dicts[0][name].dtype) for name in state_dicts[0]}


# ---------------------------------------------------------------- writing


def save_pretrained(name: str, model, history=None, *, folder: Path | None = None) -> Path:
    """Write ``<folder>/<name>.pt`` and its MANIFEST.json entry, each atomically."""
    recipe = _recipe(name)
    folder = MODELS_DIR if folder is None else Path(folder)
    path = folder / f"{name}.pt"
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    blob = {
        "config": dataclasses.asdict(model.config),
        "model": state,
        "extra": {
            "name": name,
            "recipe": recipe,
            "recipe_hash": recipe_hash(recipe),
            "vocab": _vocab(recipe),
            "weights_sha256": weights_sha256(state),
            "history": {} if history is None else dataclasses.asdict(history),
            "made_with": {"torch": str(torch.__version__), "threads": torch.get_num_threads(),
                          "machine": platform.machine()},
        },
    }
    atomic_write(path, lambda tmp: torch.save(blob, tmp))
    manifest_path = folder / MANIFEST.name
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    manifest[name] = {"file": path.name, "bytes": path.stat().st_size,
                      "sha256": file_sha256(path), "recipe_hash": recipe_hash(recipe)}
    text = json.dumps(dict(sorted(manifest.items())), indent=2) + "\n"
    atomic_write(manifest_path, lambda tmp: Path(tmp).write_text(text))
    return path


def build(names=None, *, progress: bool = True) -> list[Path]:
    """Train and save the named models (default: all of :data:`RECIPES`). ``make models``.

    Training runs on one CPU thread: the result then does not depend on how many cores
    the machine has (it still depends on the CPU's kernels), and one thread is also the
    steadiest choice on a busy machine.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    paths = []
    try:
        for name in names or sorted(RECIPES):
            print(f"{name}: training recipe {recipe_hash(_recipe(name))} on the CPU (1 thread)",
                  flush=True)
            model, history = train_from_recipe(_recipe(name), progress=progress,
                                               checkpoint=CHECKPOINT_DIR / f"{name}.pt")
            paths.append(save_pretrained(name, model, history))
            print(f"{name}: wrote {paths[-1]} ({paths[-1].stat().st_size:,} bytes)", flush=True)
    finally:
        torch.set_num_threads(threads)
    return paths


# ---------------------------------------------------------------- loading

def load_pretrained(name: str = "dates", device=None, *, folder: Path | None = None):
    """A shipped model, checked, in eval mode on ``device``: returns ``(model, info)``.

    ``info`` is the file's ``extra`` dict (recipe, history, ...). Raises
    :class:`ModelFileError`, naming the file and ``make models``, when the file is
    missing, does not match MANIFEST.json, cannot be read, or its recipe hash,
    config, vocabulary or weights checksum disagree with what this code expects.
    """
    recipe = _recipe(name)
    folder = MODELS_DIR if folder is None else Path(folder)
    path = folder / f"{name}.pt"
    fix = f"rebuild it with `{REBUILD}`"

    def fail(problem: str):
        raise ModelFileError(f"model file {path}: {problem}; {fix}")

    if not path.is_file():
        fail("not found")
    try:
        entry = json.loads((folder / MANIFEST.name).read_text())[name]
    except (OSError, ValueError, KeyError) as err:
        fail(f"no readable entry for {name!r} in {MANIFEST.name} ({type(err).__name__})")
    got = file_sha256(path)
    if got != entry["sha256"]:
        fail(f"SHA-256 is {got[:12]}..., but {MANIFEST.name} expects {entry['sha256'][:12]}... "
             f"(corrupt, truncated or replaced)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        extra, state = blob["extra"], blob["model"]
        config = _config(recipe)
        saved_config = blob["config"]
    except Exception as err:  # any unreadable file: name it instead of torch's internals
        first_line = str(err).strip().splitlines()[0][:120] if str(err).strip() else ""
        fail(f"cannot be read ({type(err).__name__}: {first_line})")
    expected = recipe_hash(recipe)
    if extra.get("recipe_hash") != expected or entry.get("recipe_hash") != expected:
        fail(f"made from recipe {extra.get('recipe_hash')}, but the code's recipe is {expected}")
    if saved_config != dataclasses.asdict(config):
        fail(f"config {saved_config} differs from the recipe's {dataclasses.asdict(config)}")
    if extra.get("vocab") != _vocab(recipe):
        fail("its vocabulary differs from the one this code uses")
    if weights_sha256(state) != extra.get("weights_sha256"):
        fail("its weights do not match the checksum stored with them")
    model = Transformer(config)
    model.load_state_dict(state)
    device = get_device() if device is None else torch.device(device)
    return model.to(device).eval(), extra


def load_dates_model(device=None):
    """The trained dates model of notebook 08 (shipped, checked), in eval mode on ``device``."""
    return load_pretrained("dates", device)[0]
