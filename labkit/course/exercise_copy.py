"""The exercise copy of one solved notebook: stubs, blank predictions, no answers, a note."""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import nbformat

from labkit.course.labinfo import cell_sections, is_prediction_grader, lab_info
from labkit.course.layout import EXERCISE_DIR, ROOT, SOLVED_GLOB, solved_notebooks
from labkit.course.markup import (
    ANSWER_SPACE_TAG,
    LAB_KEY,
    META_KEY,
    PREDICTION_FLOW,
    WRITE_MARK,
    YOUR_ANSWER,
    RegionError,
    blank_predictions,
    cell_text,
    hide_source,
    is_teacher_only,
    is_written_question,
    md_escape,
    prediction_lines,
    strip_answers,
)
from labkit.course.regions import strip_hidden_tests, stub_source

NOTE_ID = "exercise-version-note"


NOTE_HEAD = """\
> **Exercise version of `{solved}`** (the solved notebook of the same name is the teacher's).
> Keep your work in a copy that nothing regenerates: in the project's repository, `make lab`
> copies every exercise notebook once into `my-work/` (git ignores it, and no command
> overwrites it) and opens JupyterLab there; in a handout, its `notebooks/` folder is yours.
> The repository's `notebooks/exercises/` is regenerated from the solved notebooks: do not
> work there."""


NOTE_RUN_ALL = """\
> **Run All stops at the first cell that runs a stub you have not filled in** ({where}): that
> cell raises `NotImplementedError` and the cells after it stay blank (a check cell does not
> stop it: it reports the stub as not written yet). Fill in the stub and run its cell, then
> continue with *Run > Run Selected Cell and All Below*; or run the cells one by one, skipping
> those that use an unfinished exercise."""


NOTE_RUN_TO_END = """\
> **Run All runs to the end with the stubs unfilled:** a stub raises `NotImplementedError`
> only when its check calls it, and the check reports it as not written yet. Fill in a stub,
> run its cell, then the check cell below it."""
NOTE_PROOFS = """\
> **Check yourself:** answer each question before you run the cells under it; their code is
> collapsed because it proves the answers."""
NOTE_NO_PROOFS = """\
> **Check yourself** (at the end) has no answers in this copy: answer each question in your own
> words. Your teacher's key has the answers; working alone, the solved `{solved}` has them,
> with the cells that prove them."""


def fingerprint(nb) -> str:
    """A hash of the cells' types and sources: changes when anyone edits a cell."""
    data = [[c.cell_type, cell_text(c)] for c in nb.cells]
    return hashlib.sha256(json.dumps(data, ensure_ascii=False).encode()).hexdigest()[:16]


def is_hand_edited(nb) -> bool:
    """True for a generated copy whose cells were edited after generation (or no copy)."""
    stored = nb.metadata.get(LAB_KEY, {}).get("fingerprint")
    return stored is None or stored != fingerprint(nb)


def note_text(solved_name: str, info: dict, nb) -> str:
    """The copy's opening note, read from the solved notebook ``nb``."""
    parts = [NOTE_HEAD.format(solved=solved_name)]
    exercises = info["exercises"]
    if exercises:
        n = len(exercises)
        lines = [f"> **{n} exercise{'s' if n != 1 else ''} to write** (each "
                 "`raise NotImplementedError(...)` line is yours to replace; its message "
                 "states what the code must take and return):", ">"]
        for e in exercises:
            by = ", ".join(f"`{c}`" for c in e["checks"]) or "no automatic check"
            lines.append(f"> {e['number']}. `{e['name']}`, in section "
                         f"*{md_escape(e['section'])}*; checked by {by}")
        parts.append("\n".join(lines))
    if info["checks"]:
        lines = ["> **Checking your work:** after you fill in a stub, run the check cell "
                 "that follows it:", ">"]
        lines += [f"> - `{c['call']}` (section *{md_escape(c['section'])}*)"
                  for c in info["checks"]]
        lines += [">", "> A check prints ✓/✗ per probe and, when something is wrong, names "
                  "the likely mistake with a hint."]
        parts.append("\n".join(lines))
    if info["predictions"]:
        n = len(info["predictions"])
        parts.append(f"> **{n} prediction{'s' if n != 1 else ''}:** a question marked "
                     "**Predict.** comes before the cell that reveals the answer. Replace the "
                     "`...` in the line `name = ...  # your prediction` with your answer, run "
                     "that cell, then the cells below it: the grading cell (most often the next "
                     "one) grades your answer and shows the true value. That grading cell's "
                     "code is **collapsed on purpose** (it names "
                     "the answer and the usual wrong ones): run it as it is, and do not open "
                     "it before you have answered.")
    if info["written"]:
        n = len(info["written"])
        parts.append(f"> **{n} written question{'s' if n != 1 else ''}** (marked "
                     f"{WRITE_MARK}): write your answer in the cell below each one; your "
                     "teacher marks it.")
    if info.get("drill"):
        n = info["drill"]
        parts.append(f"> **{n} drill question{'s' if n != 1 else ''}, ungraded:** each has an "
                     "empty \"Your answer\" cell under it for your own practice; nobody marks "
                     "it. What is graded here: "
                     + ("the exercises (through their checks), " if exercises else "")
                     + ("the predictions and the written questions." if info["written"]
                        else "the predictions."))
    if exercises:
        stop = info.get("run_all_stop")
        if stop:
            section = cell_sections(nb)[stop["cell"]][1]
            where = (f"the first calls `{stop['name']}`" if stop["name"] != "top-level code"
                     else "the first has a stub in its own code")
            parts.append(NOTE_RUN_ALL.format(where=f"{where}, in section *{md_escape(section)}*"
                                             if section else where))
        else:
            parts.append(NOTE_RUN_TO_END)
    if info.get("proof_cells"):
        kept = any(not is_teacher_only(nb.cells[i]) for i in info["proof_cells"])
        parts.append(NOTE_PROOFS if kept else NOTE_NO_PROOFS.format(solved=solved_name))
    return "\n>\n".join(parts)


RECAP_HEAD = "## Recap card"
RECAP_LEFT_OUT = ("This notebook's recap card states what the exercises compute and the values "
                  "the predictions ask for, so this copy leaves it out. Read it after the lab: "
                  "in the solved `{solved}` and in `docs/cheatsheet.md`.")


def recap_pointer(source: str, solved_name: str) -> str:
    """The recap card left out: below the stubs it states their formulas and the predictions'
    numbers (a fold did not stop a learner who opened it first)."""
    head, _, body = source.partition("\n")
    if head.strip() != RECAP_HEAD or not body.strip():
        return source
    return f"{RECAP_HEAD}\n\n{RECAP_LEFT_OUT.format(solved=solved_name)}"


def _clean_code_cell(cell) -> None:
    cell.outputs = []
    cell.execution_count = None
    for key in ("execution", "ExecuteTime", "collapsed", "scrolled"):
        cell.metadata.pop(key, None)


def make_exercise(nb, solved_name: str):
    """A new notebook node: the exercise version of the solved notebook ``nb``."""
    info = lab_info(nb)
    ex = nbformat.from_dict(copy.deepcopy(dict(nb)))  # the input stays as it is
    by_cell: dict[int, list[dict]] = {}
    for item in info["exercises"]:
        by_cell.setdefault(item["cell"], []).append(item)
    cells = []
    for index, cell in enumerate(ex.cells):
        if is_teacher_only(cell):
            continue
        if index in by_cell:
            cell.metadata[META_KEY] = [{k: item[k] for k in ("number", "name", "section")}
                                       for item in by_cell[index]]
        if cell.cell_type == "code":
            original = cell.source
            source = blank_predictions(stub_source(strip_hidden_tests(original)))
            if original.strip() and not source.strip():
                continue  # the cell held only hidden tests
            if prediction_lines(original):
                source = source.rstrip("\n") + "\n" + PREDICTION_FLOW
            cell.source = source
            _clean_code_cell(cell)
            if is_prediction_grader(original) or index in info["proof_cells"]:
                hide_source(cell)  # its code names the answer: run it, read it afterwards
        elif cell.cell_type == "markdown":
            source = strip_answers(cell.source)
            if not source.strip():
                continue  # the cell held only an answer
            cell.source = recap_pointer(source, solved_name)
        cells.append(cell)
        tags = cell.metadata.get("tags", [])
        if is_written_question(nb.cells[index]) or ANSWER_SPACE_TAG in tags:
            answer = nbformat.v4.new_markdown_cell(YOUR_ANSWER)
            answer.id = f"{cell.get('id', f'cell-{index}')}-your-answer"[:64]
            cells.append(answer)
    note = nbformat.v4.new_markdown_cell(note_text(solved_name, info, nb))
    note.id = NOTE_ID
    ex.cells = [note] + cells
    if ex.nbformat_minor < 5:
        for cell in ex.cells:
            cell.pop("id", None)
    ex.metadata.pop("widgets", None)
    public = {"solved": solved_name,
              "exercises": [{k: e[k] for k in ("number", "name", "section", "checks")}
                            for e in info["exercises"]],
              "checks": [{k: c[k] for k in ("check", "call", "subjects", "covers", "section")}
                         for c in info["checks"]],
              "predictions": [{k: p[k] for k in ("number", "name", "label", "section")}
                              for p in info["predictions"]],
              "written": [{k: w[k] for k in ("number", "section")} for w in info["written"]],
              "drill": info["drill"]}
    ex.metadata[LAB_KEY] = public
    ex.metadata[LAB_KEY]["fingerprint"] = fingerprint(ex)
    return ex


def expected_exercises(root: Path = ROOT) -> dict[Path, str]:
    """Exercise path -> its exact file text, for every solved notebook."""
    out = {}
    for path in solved_notebooks(root):
        nb = nbformat.read(path, as_version=4)
        try:
            ex = make_exercise(nb, path.name)
        except RegionError as exc:
            raise RegionError(f"{path.relative_to(root)}: {exc}") from None
        text = nbformat.writes(ex)
        if not text.endswith("\n"):
            text += "\n"  # as nbformat.write does
        out[root / "notebooks" / EXERCISE_DIR / path.name] = text
    return out


def existing_exercises(root: Path = ROOT) -> dict[Path, str]:
    folder = root / "notebooks" / EXERCISE_DIR
    return {p: p.read_text(encoding="utf-8") for p in sorted(folder.glob(SOLVED_GLOB))}
