"""The shipped models: they load, match their recipes, and every kind of damage is refused
with an error that names the file and `make models`; writes are atomic."""
import json
import os
import shutil

import pytest
import torch

import tx_helpers as tx
from tx_helpers import pretrained, training
from tx_helpers.g2p import g2p_model_config
from tx_helpers.pretrained import ModelFileError, load_pretrained, save_pretrained


@pytest.fixture
def shipped(tmp_path):
    """A private copy of the shipped models folder."""
    folder = tmp_path / "models"
    shutil.copytree(pretrained.MODELS_DIR, folder)
    return folder


def damaged(folder, name, transform):
    path = folder / f"{name}.pt"
    path.write_bytes(transform(path.read_bytes()))
    return path


def expect_refusal(folder, match):
    with pytest.raises(ModelFileError, match=match) as info:
        load_pretrained("dates", "cpu", folder=folder)
    message = str(info.value)
    assert str(folder / "dates.pt") in message and "make models" in message
    return message


@pytest.mark.parametrize("name", sorted(pretrained.RECIPES))
def test_every_shipped_model_loads_and_matches_its_recipe(name):
    model, info = load_pretrained(name, "cpu")
    recipe = pretrained.RECIPES[name]
    assert not model.training
    assert info["recipe_hash"] == pretrained.recipe_hash(recipe)
    assert info["recipe"] == recipe
    make_config = g2p_model_config if recipe.get("task") == "g2p" else tx.date_model_config
    assert model.config == make_config(**recipe["model"])
    manifest = json.loads(pretrained.MANIFEST.read_text())
    assert manifest[name]["sha256"] == pretrained.file_sha256(pretrained.model_path(name))


def test_shipped_models_fit_the_size_budget():
    total = sum(p.stat().st_size for p in pretrained.MODELS_DIR.iterdir())
    assert total <= 16 * 2**20


def test_the_dates_model_is_trained():
    """Not just any weights with the right shapes: it translates held-out dates."""
    model = tx.load_dates_model("cpu")
    pairs = tx.DatePairs().sample(200, "test", seed=3)
    assert tx.exact_match_accuracy(model, pairs, tx.DATE_VOCAB, max_len=12) >= 0.95


def test_flipped_bytes_are_refused(shipped):
    def flip(data):
        data = bytearray(data)
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xFF
        return bytes(data)

    damaged(shipped, "dates", flip)
    expect_refusal(shipped, "SHA-256 .* expects")


@pytest.mark.parametrize("transform", [
    pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
    pytest.param(lambda data: b"", id="empty"),
    pytest.param(lambda data: os.urandom(4096), id="garbage"),
])
def test_truncated_empty_and_garbage_files_are_refused(shipped, transform):
    damaged(shipped, "dates", transform)
    expect_refusal(shipped, "corrupt, truncated or replaced")


def test_unreadable_file_with_a_matching_manifest_names_the_file(shipped):
    """Even if the manifest were rewritten to match garbage, torch's error is not shown raw."""
    path = damaged(shipped, "dates", lambda data: b"not a torch file")
    manifest = json.loads((shipped / "MANIFEST.json").read_text())
    manifest["dates"]["sha256"] = pretrained.file_sha256(path)
    (shipped / "MANIFEST.json").write_text(json.dumps(manifest))
    expect_refusal(shipped, r"cannot be read \(")


def test_missing_file_and_missing_manifest_entry(shipped):
    (shipped / "dates.pt").unlink()
    expect_refusal(shipped, "not found")
    shutil.copy(pretrained.MODELS_DIR / "dates.pt", shipped / "dates.pt")
    (shipped / "MANIFEST.json").write_text("{}")
    expect_refusal(shipped, "no readable entry")


def test_an_untrained_model_saved_under_the_name_is_refused(shipped):
    untrained = tx.Transformer(tx.date_model_config(**pretrained.DATES_RECIPE["model"]))
    tx.save_checkpoint(shipped / "dates.pt", untrained)
    expect_refusal(shipped, "SHA-256")


def test_another_recipe_is_refused(shipped, monkeypatch):
    """A file (and manifest) written from a different recipe no longer matches the code's."""
    model = tx.load_dates_model("cpu")
    other = {**pretrained.DATES_RECIPE, "steps": 701}
    monkeypatch.setitem(pretrained.RECIPES, "dates", other)
    save_pretrained("dates", model, folder=shipped)
    monkeypatch.setitem(pretrained.RECIPES, "dates", pretrained.DATES_RECIPE)
    expect_refusal(shipped, f"made from recipe {pretrained.recipe_hash(other)}")


def test_tampered_weights_with_a_consistent_manifest_are_refused(shipped):
    """The checksum stored *inside* the file guards the weights themselves."""
    blob = torch.load(shipped / "dates.pt", weights_only=True)
    blob["model"]["generator.bias"] += 1.0
    torch.save(blob, shipped / "dates.pt")
    manifest = json.loads((shipped / "MANIFEST.json").read_text())
    manifest["dates"]["sha256"] = pretrained.file_sha256(shipped / "dates.pt")
    (shipped / "MANIFEST.json").write_text(json.dumps(manifest))
    expect_refusal(shipped, "weights do not match the checksum")


def test_other_vocabulary_is_refused(shipped):
    blob = torch.load(shipped / "dates.pt", weights_only=True)
    blob["extra"]["vocab"] = blob["extra"]["vocab"][::-1]
    torch.save(blob, shipped / "dates.pt")
    manifest = json.loads((shipped / "MANIFEST.json").read_text())
    manifest["dates"]["sha256"] = pretrained.file_sha256(shipped / "dates.pt")
    (shipped / "MANIFEST.json").write_text(json.dumps(manifest))
    expect_refusal(shipped, "vocabulary differs")


def test_read_only_checkout_loads(shipped, monkeypatch):
    """Every way of writing fails, as in a read-only checkout (root ignores chmod, so the
    write calls themselves are made to fail): the model still loads."""
    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    real_open = open

    def read_only_open(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wax+"):
            refuse()
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", read_only_open)
    for name in ("mkstemp", "NamedTemporaryFile"):
        monkeypatch.setattr(training.tempfile, name, refuse)
    for name in ("replace", "remove", "mkdir", "chmod"):
        monkeypatch.setattr(training.os, name, refuse)
    model, _ = load_pretrained("dates", "cpu", folder=shipped)
    assert not model.training


def test_loading_never_writes(shipped):
    before = {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()}
    load_pretrained("dates", "cpu", folder=shipped)
    assert {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()} == before


def test_a_failed_write_keeps_the_old_file(shipped, monkeypatch):
    before = (shipped / "dates.pt").read_bytes()
    model = tx.load_dates_model("cpu")

    def broken_save(obj, path):
        with open(path, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pretrained.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained("dates", model, folder=shipped)
    assert (shipped / "dates.pt").read_bytes() == before
    assert sorted(p.name for p in shipped.iterdir()) == sorted(
        ["MANIFEST.json"] + [f"{name}.pt" for name in pretrained.RECIPES])  # no temp file left
    monkeypatch.undo()
    load_pretrained("dates", "cpu", folder=shipped)


def test_save_then_load_round_trip(tmp_path):
    model = tx.load_dates_model("cpu")
    save_pretrained("dates", model, folder=tmp_path)
    again, info = load_pretrained("dates", "cpu", folder=tmp_path)
    for (name, p), (_, q) in zip(model.state_dict().items(), again.state_dict().items(),
                                 strict=True):
        assert torch.equal(p, q), name
    assert info["made_with"]["torch"] == str(torch.__version__)


def test_unknown_name():
    with pytest.raises(ValueError, match=r"name must be one of \['dates', "):
        load_pretrained("dates-v0")


@pytest.mark.slow  # two builds; the recipe and checksum tests stay fast
def test_an_interrupted_build_resumes_to_the_same_weights(tmp_path, monkeypatch):
    """make models checkpoints every CHECKPOINT_EVERY steps; a rerun after a crash picks up
    there and ends with the weights and history of an uninterrupted run."""
    from tx_helpers import g2p
    recipe = {**g2p.G2P_RECIPE, "steps": 6, "batch_size": 8, "cooldown": 3, "average_last": 2,
              "average_every": 2,  # the result is the mean of the weights at steps 4 and 6
              "model": {**g2p.G2P_RECIPE["model"], "d_model": 16, "d_ff": 32, "n_layers": 1}}
    monkeypatch.setattr(pretrained, "CHECKPOINT_EVERY", 2)
    whole, whole_history = pretrained.train_from_recipe(recipe)

    real_step, calls = training.train_step, []

    def crash_at_step_5(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    checkpoint = tmp_path / "g2p.pt"
    monkeypatch.setattr(training, "train_step", crash_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        pretrained.train_from_recipe(recipe, checkpoint=checkpoint)
    assert torch.load(checkpoint, weights_only=True)["step"] == 4
    monkeypatch.setattr(training, "train_step", real_step)
    resumed, history = pretrained.train_from_recipe(recipe, checkpoint=checkpoint)
    assert history.loss == whole_history.loss and len(history) == 6
    for name, tensor in whole.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    # a checkpoint of another recipe is ignored, not resumed
    _, fresh = pretrained.train_from_recipe({**recipe, "seed": 1}, checkpoint=checkpoint)
    assert len(fresh) == 6 and fresh.loss != whole_history.loss


def test_average_weights_is_the_elementwise_mean_and_keeps_shared_tensors_exact():
    a = {"w": torch.tensor([1.0, 2.0]), "pe": torch.tensor([0.1, 0.7])}
    b = {"w": torch.tensor([3.0, 6.0]), "pe": torch.tensor([0.1, 0.7])}
    c = {"w": torch.tensor([2.0, 1.0]), "pe": torch.tensor([0.1, 0.7])}
    mean = pretrained.average_weights([a, b, c])
    assert torch.equal(mean["w"], torch.tensor([2.0, 3.0]))
    assert torch.equal(mean["pe"], a["pe"]) and mean["pe"].dtype == torch.float32
    with pytest.raises(ValueError, match="at least one state dict"):
        pretrained.average_weights([])


def test_averaging_takes_the_last_snapshots(monkeypatch):
    """average_last=2, average_every=2 on 4 steps: the mean of the weights after steps 2 and 4."""
    from tx_helpers import g2p
    base = {**g2p.G2P_RECIPE, "steps": 4, "batch_size": 8, "cooldown": 2,
            "model": {**g2p.G2P_RECIPE["model"], "d_model": 16, "d_ff": 32, "n_layers": 1}}
    seen = []
    real_train = training.train

    def spy(model, *args, callback=None, **kwargs):
        def record(history):
            seen.append({k: v.clone() for k, v in model.state_dict().items()})
            if callback is not None:
                callback(history)
        return real_train(model, *args, callback=record, **kwargs)

    monkeypatch.setattr(pretrained, "train", spy)
    averaged, _ = pretrained.train_from_recipe({**base, "average_last": 2, "average_every": 2})
    expected = pretrained.average_weights([seen[1], seen[3]])
    for name, tensor in averaged.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert not torch.equal(averaged.generator.weight, seen[3]["generator.weight"])
