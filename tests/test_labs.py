"""The labs as a teacher hands them out (issue 22): stub messages that state the contract only,
exercise copies without answers, graded predictions in every notebook, a teaching table that
cannot drift, a handout without solutions, a learner's work that no command overwrites, and
the small frictions of JupyterLab."""
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import make_exercises as mx  # noqa: E402

SOLVED = mx.solved_notebooks(ROOT)
NUMBERS = [f"{n:02d}" for n in range(14)]


def _read(path):
    return nbformat.read(path, as_version=4)


def _regions():
    """(notebook, cell index, region) for every solution region of the solved notebooks."""
    found = []
    for path in SOLVED:
        nb = _read(path)
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                for region in mx.find_regions(cell.source):
                    owner = mx.region_owner(cell.source, region)
                    found.append(pytest.param(path, index, region,
                                              id=f"{path.stem[:2]}-{owner}"))
    return found


# ----------------------------------------------------------------------------------------
# Item 1: a stub's message states the contract, never the solution's operations


def test_key_operations_are_read_from_the_code():
    cell = '''def attention(q, k, v, mask=None, dropout=None):
    """doc"""
    ### BEGIN SOLUTION
    ### HINT: anything
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    pe[:, 0::2] = weights.T * 10000
    return weights @ v, weights
    ### END SOLUTION'''
    region = mx.find_regions(cell)[0]
    ops = mx.key_operations(cell, region)
    assert {"transpose", "sqrt", "masked_fill", "finfo", "softmax", "@", ".T", "0::2",
            "10000"} <= set(ops), ops
    assert "dropout" not in ops  # a parameter: the contract's own word
    assert "size" not in ops  # a size accessor, not an operation
    leaks = mx.leaked_operations("scores = q @ k.transpose(-2, -1); Softmax over keys", ops)
    assert set(leaks) == {"@", "transpose", "softmax"}
    contract = ("q (..., L_q, d_k), k (..., L_k, d_k), v (..., L_k, d_v), mask bool "
                "broadcastable to (..., L_q, L_k), True = masked -> (output (..., L_q, d_v), "
                "weights (..., L_q, L_k)); the weights of each query sum to 1")
    assert mx.leaked_operations(contract, ops) == []


def test_the_function_name_and_locals_are_contract_words():
    cell = '''def my_train_step(model, batch, optimizer, criterion, scheduler=None):
    ### BEGIN SOLUTION
    loss = criterion(model(batch[0]), batch[1])
    for layer in model.layers:
        layer(loss)
    loss.backward()
    optimizer.step()
    ### END SOLUTION'''
    ops = mx.key_operations(cell, mx.find_regions(cell)[0])
    assert set(ops) == {"backward"}, ops  # step: a word of the name; criterion, layer: names
    assert mx.leaked_operations("one training step: returns the loss", ops) == []
    assert mx.leaked_operations("zero the grads, Backward, then step", ops) == ["backward"]


@pytest.mark.parametrize("path, index, region", _regions())
def test_stub_message_does_not_name_the_solution_operations(path, index, region):
    """Fails on a message that gives the solution away (issue 22, item 1)."""
    source = _read(path).cells[index].source
    ops = mx.key_operations(source, region)
    leaks = mx.leaked_operations(region.hint or "", ops)
    assert not leaks, (
        f"{path.name}, {mx.region_owner(source, region)}: the stub message names the "
        f"solution's operations {leaks}. State the contract (inputs, outputs, shapes) and put "
        f"the operations in the folded hints below the exercise.\nmessage: {region.hint!r}")
