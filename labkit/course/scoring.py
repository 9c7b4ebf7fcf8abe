"""Points, rubric and study time of each lab: notebooks/labs.toml over the defaults."""
from __future__ import annotations

import tomllib
from pathlib import Path

from labkit.course.layout import LABS_TOML, ROOT

DEFAULT_POINTS = {"exercise": 1, "prediction": 0.5, "written": 2}


def load_labs(root: Path = ROOT) -> dict:
    path = root / LABS_TOML
    data = {}
    if path.exists():
        with path.open("rb") as f:
            data = tomllib.load(f)
    data["points"] = {**DEFAULT_POINTS, **data.get("points", {})}
    data.setdefault("rubric", {})
    data.setdefault("lab", {})
    return data


def lab_settings(labs: dict, number: str) -> dict:
    """Points, rubric and the study-time estimate of one lab (its own values over defaults)."""
    own = labs["lab"].get(number, {})
    points = {**labs["points"], **own.get("points", {})}
    return {"points": points, "minutes": own.get("study_minutes"),
            "rubric": own.get("rubric", labs["rubric"].get("written", "")),
            "graded_note": own.get("graded_note", "")}


def lab_points(info: dict, settings: dict) -> dict:
    """Points of a lab: each exercise (solution region), prediction and written answer."""
    p = settings["points"]
    parts = {"exercises": p["exercise"] * len(info["exercises"]),
             "predictions": p["prediction"] * len(info["predictions"]),
             "written": p["written"] * len(info["written"])}
    parts["total"] = sum(parts.values())
    return parts


def graded_objects(exercises: list[dict]) -> list[tuple[str, list[str], list[str]]]:
    """(class or function, its exercises' method names, the checks that mark it), in order."""
    out: dict[str, tuple[list[str], set[str]]] = {}
    for e in exercises:
        top, _, method = e["name"].partition(".")
        parts, checks = out.setdefault(top, ([], set()))
        parts.append(method)
        checks.update(e["checks"])
    return [(top, [m for m in parts if m], sorted(checks)) for top, (parts, checks) in out.items()]
