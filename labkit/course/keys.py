#!/usr/bin/env python3
"""Write one teacher key per lab, from the solved notebooks: everything the exercise copies drop.

For each solved notebook notebooks/NN_*.ipynb, writes teacher/keys/NN_*.md with

- the lab's points (from notebooks/labs.toml) and its estimated study time;
- each exercise: its stub message, its solution (the region's code) and the checks that
  grade it;
- each graded check: every mistake it can name (the keys its module in labkit
  uses), with the text and the hint labkit.MISTAKES gives the learner;
- each prediction: the question, the expected answer, the tolerance, the wrong answers the
  cell names and what they mean, and what the check printed in the solved notebook;
- each written question with its expected answer and the rubric;
- every answer the copies drop (``<details>`` Answer blocks, ``<!-- answer -->`` text, cells
  tagged ``answer``, with their stored text output).

The keys are for teachers: never hand them out. teacher/ is git-ignored; regenerate the keys
whenever the notebooks change (they are never committed, so they cannot go stale).

  python -m labkit.course.keys                 # writes teacher/keys/
  python -m labkit.course.keys --out DIR       # somewhere else
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
import textwrap
from pathlib import Path

import nbformat

from labkit.course import labinfo, layout, markup, regions, scoring  # noqa: E402

ROOT = layout.ROOT
OWN_RUBRIC = re.compile(r"\*\*Rubric \((?P<points>\d+(?:\.\d+)?) points?\)\.?\*\*")
KEYS_DIR = Path("teacher") / "keys"
# Modules of labkit that every check shares: their mistakes are listed once.
SHARED_MODULES = ("report", "compare", "weights", "mistakes")


def _grading():
    import labkit as grading

    return grading


def _module_keys(module_name: str, seen: set[str]) -> set[str]:
    """MISTAKES keys named in a grading module and the block modules it imports."""
    if module_name in seen:
        return set()
    seen.add(module_name)
    grading = _grading()
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(module))
    keys = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and n.value in grading.MISTAKES}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module \
                and node.module.split(".")[0] not in SHARED_MODULES:
            keys |= _module_keys(f"{grading.__name__}.{node.module}", seen)
    return keys


def shared_mistakes() -> list[str]:
    grading = _grading()
    keys: set[str] = set()
    for name in SHARED_MODULES:
        if name != "mistakes":
            keys |= _module_keys(f"{grading.__name__}.{name}", set())
    return sorted(keys)


def mistakes_of(check: str) -> list[str]:
    """The mistakes ``labkit.<check>`` can name beyond the shared ones, sorted."""
    grading = _grading()
    fn = getattr(grading, check, None)
    if fn is None or not getattr(fn, "__module__", "").startswith(grading.__name__):
        return []
    return sorted(_module_keys(fn.__module__, set()) - set(shared_mistakes()))


def _mistake_line(key: str) -> str:
    text, hint = _grading().MISTAKES[key]
    return f"- `{key}`: {text}. *The learner is told:* {hint}"


def _text_outputs(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            plain = out.get("data", {}).get("text/plain")
            if plain and not plain.startswith("<Figure"):
                parts.append(plain if plain.endswith("\n") else plain + "\n")
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts).rstrip("\n")


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.strip().split("\n"))


def _answer_body(block: str, kind: str) -> str:
    if kind == "comment":
        body = markup.ANSWER_CLOSE.sub("", markup.ANSWER_OPEN.sub("", block))
    else:
        body = re.sub(r"\A<details\b[^>]*>\s*", "", block, flags=re.IGNORECASE)
        body = markup.SUMMARY.sub("", body, count=1)
        body = re.sub(r"</details\s*>\s*\Z", "", body, flags=re.IGNORECASE)
    return body.strip()


def _title(nb, path: Path) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.split("\n"):
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


def key_markdown(path: Path, root: Path = ROOT) -> str:
    """The teacher key of one solved notebook, as markdown."""
    nb = nbformat.read(path, as_version=4)
    info = labinfo.lab_info(nb)
    settings = scoring.lab_settings(scoring.load_labs(root), path.name[:2])
    points = scoring.lab_points(info, settings)
    p = settings["points"]
    rel = path.relative_to(root).as_posix()
    out = [f"# Teacher key: {_title(nb, path)}", "",
           f"> Generated by `make keys` (labkit/course/keys.py) from `{rel}`, "
           "`notebooks/labs.toml` and `labkit`. **For the teacher only: do not "
           "hand this out.** Regenerate it after the notebook changes.", "",
           "## Points", "",
           "| Part | Count | Points each | Points |", "|---|---|---|---|",
           f"| Exercises (stubs) | {len(info['exercises'])} | {p['exercise']:g} | "
           f"{points['exercises']:g} |",
           f"| Predictions | {len(info['predictions'])} | {p['prediction']:g} | "
           f"{points['predictions']:g} |",
           f"| Written answers | {len(info['written'])} | {p['written']:g} | "
           f"{points['written']:g} |",
           f"| **Total** | | | **{points['total']:g}** |", ""]
    minutes = settings["minutes"]
    out += [f"Estimated study time: about {minutes} minutes (an estimate, not a measurement)."
            if minutes else "Estimated study time: not estimated yet.", ""]

    out += ["## Exercises and their solutions", ""]
    if not info["exercises"]:
        out += ["This lab has no code to write.", ""]
    for e in info["exercises"]:
        cell = nb.cells[e["cell"]]
        found = regions.find_regions(cell.source)
        region = next(r for r in found if regions.region_owner(cell.source, r) == e["name"])
        out += [f"### {e['number']}. `{e['name']}` (section *{e['section']}*)", "",
                f"Stub message: \"{region.hint or markup.DEFAULT_HINT}\"", "",
                "Solution:", "",
                _fence(textwrap.dedent(regions.solution_code(cell.source, region)), "python"), ""]
        calls = [c["call"] for c in info["checks"] if e["name"].split(".")[0] in c["covers"]]
        out += (["Graded by " + ", ".join(f"`{c}`" for c in calls) + "."] if calls
                else ["No check grades this exercise automatically."]) + [""]

    checks = sorted({c["check"] for c in info["checks"]})
    if checks:
        out += ["## What each check can tell the learner", "",
                "Each check compares the learner's code with the verified reference and, when "
                "they differ, names the mistake below whose output matches. These are the "
                "likely mistakes to look for when marking by hand.", ""]
        for check in checks:
            calls = [c["call"] for c in info["checks"] if c["check"] == check]
            out += [f"### `{check}`", "", "Called as " + ", ".join(f"`{c}`" for c in calls)
                    + ".", ""]
            keys = mistakes_of(check)
            out += [_mistake_line(k) for k in keys] or ["- (no mistakes of its own)"]
            out += [""]
        out += ["Every check can also report: " + ", ".join(f"`{k}`" for k in shared_mistakes())
                + " (exceptions, shapes, missing weights and similar; "
                "docs/teaching.md describes them).", ""]

    out += ["## Predictions", ""]
    if not info["predictions"]:
        out += ["This lab has no graded prediction yet.", ""]
    for pr in info["predictions"]:
        label = pr["label"] or pr["name"]
        out += [f"### P{pr['number']}. {label} (section *{pr['section']}*)", ""]
        if pr["question"]:
            out += ["Question:", "", _quote(pr["question"]), ""]
        out += [f"Expected answer: `{pr['name']} = {pr['value']}`"
                + (f" (tolerance: {pr['tolerance']})" if pr["tolerance"] else " (exact)") + ".",
                ""]
        if pr["mistakes"]:
            out += ["Wrong answers the check names:", ""]
            out += [f"- `{wrong}`: {meaning}" for wrong, meaning in pr["mistakes"]] + [""]
        out += [f"Graded by `{pr['call']}`."]
        printed = _text_outputs(nb.cells[pr["check_cell"]])
        mine = [line for line in printed.split("\n") if label and f"{label}:" in line]
        printed = "\n".join(mine) if mine else printed  # one quiz row, not the whole quiz
        if printed:
            out += ["", "What it printed in the solved notebook:", "", _fence(printed, "text")]
        out += [""]

    written_cells = set()
    out += ["## Written answers", ""]
    if not info["written"]:
        out += ["This lab has no graded written question.", ""]
    if info.get("drill"):
        out += [f"Its {info['drill']} drill questions (each with an empty \"Your answer\" cell "
                "in the exercise copy) are **ungraded practice, worth 0 points**: the answers "
                "the copy leaves out are listed below for discussion, not for marking. The "
                "graded parts are the exercises (through their checks) and the predictions.",
                ""]
    if settings["graded_note"]:
        out += [settings["graded_note"], ""]
    for w in info["written"]:
        written_cells.add(w["cell"])
        answers = [_answer_body(nb.cells[w["cell"]].source[a:b], kind)
                   for a, b, kind in markup.answer_blocks(nb.cells[w["cell"]].source)]
        nxt = w["cell"] + 1
        if nxt < len(nb.cells) and nb.cells[nxt].cell_type == "markdown" \
                and not markup.strip_answers(nb.cells[nxt].source).strip():
            written_cells.add(nxt)
            answers += [_answer_body(nb.cells[nxt].source[a:b], kind)
                        for a, b, kind in markup.answer_blocks(nb.cells[nxt].source)]
        own = OWN_RUBRIC.search("\n".join(answers))  # "**Rubric (2 points).** ..." in the answer
        rubric = [] if own else [f"Rubric ({p['written']:g} points, notebooks/labs.toml): "
                                 f"{settings['rubric'] or 'none yet'}", ""]
        if own and float(own.group("points")) != float(p["written"]):
            rubric = [f"**Mismatch:** this rubric gives {own.group('points')} points, but "
                      f"notebooks/labs.toml counts {p['written']:g} per written answer (the "
                      "grade and the nbgrader export use labs.toml).", ""]
        out += [f"### W{w['number']} (section *{w['section']}*, {p['written']:g} points)", "",
                _quote(w["question"]), "", "Model answer and rubric:" if own else
                "Expected answer:", "", *(answers or ["(none written in the notebook)"]), "",
                *rubric]

    out += ["## Answers the exercise copies leave out", ""]
    sections = labinfo.cell_sections(nb)
    count = 0
    for index, cell in enumerate(nb.cells):
        if index in written_cells:
            continue
        where = labinfo.where(sections, index, False)
        if markup.is_teacher_only(cell):
            count += 1
            out += [f"### Teacher-only cell {index} (section *{where}*)", ""]
            if cell.cell_type == "code":
                out += [_fence(cell.source, "python"), ""]
                printed = _text_outputs(cell)
                if printed:
                    out += ["Output:", "", _fence(printed, "text"), ""]
            else:
                out += [cell.source.strip(), ""]
            continue
        if cell.cell_type != "markdown":
            continue
        blocks = markup.answer_blocks(cell.source)
        if not blocks:
            continue
        count += 1
        question = markup.strip_answers(cell.source).strip()
        out += [f"### Cell {index} (section *{where}*)", ""]
        if not question:  # an answer-only cell: the question is the markdown cell above
            above = next((nb.cells[j] for j in range(index - 1, -1, -1)
                          if nb.cells[j].cell_type == "markdown"), None)
            question = markup.strip_answers(above.source).strip() if above is not None else ""
        out += [_quote(question), ""] if question else []
        for a, b, kind in blocks:
            out += ["**Answer:**", "", _answer_body(cell.source[a:b], kind), ""]
    if not count:
        out += ["None.", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def write_keys(out_dir: Path, root: Path = ROOT) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in layout.solved_notebooks(root):
        target = out_dir / f"{path.stem}.md"
        try:
            text = key_markdown(path, root)
        except markup.RegionError as exc:
            raise markup.RegionError(f"{path.relative_to(root)}: {exc}") from None
        target.write_text(text, encoding="utf-8")
        written.append(target)
    index = ["# Teacher keys", "", "Generated by `make keys` from the solved notebooks. "
             "For the teacher only: never hand these out.", ""]
    index += [f"- [{p.stem}]({p.name})" for p in written]
    (out_dir / "README.md").write_text("\n".join(index) + "\n", encoding="utf-8")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help=f"folder for the keys (default: {KEYS_DIR.as_posix()}/)")
    parser.add_argument("--root", type=Path, default=ROOT, help="project root (default: here)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    out_dir = args.out or root / KEYS_DIR
    try:
        written = write_keys(out_dir, root)
    except markup.RegionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(written)} teacher key(s) in {out_dir} (for the teacher only: never hand out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
