"""Did a submission patch the grader? ``make grade`` snapshots, before the learner's first cell,
every function and class member of the lab kit, the comparisons of torch the checks rely on and
Python's builtins; after the last cell it asks which of them now point elsewhere. A submission
that replaced one (``labkit.report._Report.probe = ...``, ``torch.allclose = ...``) scores 0 on
every automatic mark. A higher bar, not a seal: a teacher reading the notebook sees the patch."""
from __future__ import annotations

import builtins
import inspect
import sys

import torch

import labkit  # noqa: F401 - every check module, loaded before the learner's code runs

_TORCH = {"torch": torch, "torch.testing": torch.testing, "torch.Tensor": torch.Tensor}
_TORCH_NAMES = ("allclose", "equal", "isclose", "isfinite", "isnan", "assert_close", "all",
                "any", "item", "tolist", "__eq__", "__ne__", "__bool__")


def _members(owner) -> dict:
    return {k: v for k, v in list(vars(owner).items())
            if callable(v) or isinstance(v, (staticmethod, classmethod, property))}


def snapshot() -> dict[str, object]:
    """Qualified name -> the object it points to now."""
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "labkit" or name.startswith("labkit.")):
            continue
        for attr, obj in _members(module).items():
            found[f"{name}.{attr}"] = obj
            if isinstance(obj, type) and obj.__module__ == name:
                found.update({f"{name}.{attr}.{k}": v for k, v in _members(obj).items()})
    for prefix, owner in _TORCH.items():
        found.update({f"{prefix}.{k}": inspect.getattr_static(owner, k) for k in _TORCH_NAMES
                      if hasattr(owner, k)})  # static: a bound method is new at each access
    found.update({f"builtins.{k}": v for k, v in _members(builtins).items()
                  if k != "input"})  # a Jupyter kernel swaps input() in for every cell
    return found


def patched(before: dict[str, object]) -> list[str]:
    """The names of ``before`` that now point to another object, or are gone."""
    now = snapshot()
    return sorted(k for k, v in before.items() if now.get(k, None) is not v)
