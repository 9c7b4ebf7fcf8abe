#!/usr/bin/env python3
"""Write the learners' exercise notebooks and the teaching table from the solved notebooks.

For every solved notebook notebooks/NN_*.ipynb, writes notebooks/exercises/NN_*.ipynb where

- each region between a line ``### BEGIN SOLUTION`` and a line ``### END SOLUTION``
  becomes ``raise NotImplementedError("<hint>")`` at the region's indentation; the
  hint is the text of a ``### HINT: ...`` line right after BEGIN, else a default;
- each line ``name = value  ### PREDICTION`` becomes ``name = ...  # your prediction``, and
  the code of each cell that calls ``check_prediction`` (it names the answer and the usual
  wrong answers) is collapsed (cell metadata ``jupyter.source_hidden``): the learner runs it
  without reading it first; the prediction cell and the top note say so;
- answers are dropped: ``<details>`` blocks whose summary starts with "Answer", text between
  ``<!-- answer -->`` and ``<!-- /answer -->``, and every cell tagged ``answer`` (the teacher
  key, labkit/course/keys.py, keeps all of them);
- after each written question (a markdown cell starting with ``**Write.**``) an empty answer
  cell is added for the learner; so it is after a cell tagged ``answer-space`` (an ungraded
  question, e.g. notebook 11's headings: the learner answers before the proof cells below it);
- ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` blocks are removed (a code
  cell left empty by that is dropped);
- outputs, execution counts and cell execution metadata are cleared; the notebook keeps the
  solved notebook's kernelspec and full language_info, so JupyterLab opens it unmodified;
- a note at the top lists the notebook's own sections, exercises, predictions and the check
  calls that grade them, and says what Run All does with an unfilled stub;
- the notebook metadata ``tx_lab`` holds what the lab grades (exercises, checks, predictions,
  written questions) and a fingerprint of the generated cells.

It also writes the lab table of docs/teaching.md (between its marker comments) from that
metadata and notebooks/labs.toml (points, rubric, study-time estimates).

The solved notebooks are only read. Output is deterministic (nbformat's JSON layout). A copy
in notebooks/exercises/ that someone edited by hand (its cells no longer match its
fingerprint) is moved to my-work/rescued/ before it is replaced: nothing a learner typed is
lost. Learners work in my-work/ (``--fill``), which this tool never overwrites.

  python -m labkit.course.exercises             # write notebooks/exercises/ and the table
  python -m labkit.course.exercises --check     # exit 1 if either is stale, missing or extra
  python -m labkit.course.exercises --fill my-work   # copy missing exercise notebooks there
"""
from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from labkit.course.exercise_copy import existing_exercises, expected_exercises, is_hand_edited
from labkit.course.layout import EXERCISE_DIR, RESCUE_DIR, ROOT, TEACHING, WORK_DIR
from labkit.course.markup import RegionError
from labkit.course.teaching_table import teaching_text


def _committed_text(path: Path, root: Path) -> str | None:
    """The file as git's HEAD has it (None: not in git, or no git)."""
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
        done = subprocess.run(["git", "-C", str(root), "show", f"HEAD:{rel}"],
                              capture_output=True, timeout=30)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8") if done.returncode == 0 else None


def _hand_edited_text(text: str, path: Path | None = None, root: Path = ROOT) -> bool:
    """Someone's work: edited after generation, and not the version git has committed."""
    try:
        edited = is_hand_edited(nbformat.reads(text, as_version=4))
    except Exception:  # noqa: BLE001 - unreadable: treat it as someone's work
        edited = True
    if edited and path is not None and _committed_text(path, root) == text:
        return False  # exactly what the repository holds (an older generator's copy)
    return edited


def differences(root: Path = ROOT) -> list[str]:
    """What --check reports: one line per stale, missing or extra file."""
    want, have = expected_exercises(root), existing_exercises(root)
    lines = []
    for path in sorted(set(want) | set(have)):
        rel = path.relative_to(root)
        edited = (path in have and want.get(path) != have[path]
                  and _hand_edited_text(have[path], path, root))
        if path not in have:
            lines.append(f"missing: {rel}")
        elif path not in want:
            lines.append(f"extra (its solved notebook is gone): {rel}")
        elif want[path] != have[path]:
            lines.append(f"{'edited by hand' if edited else 'stale'}: {rel}")
    teaching = teaching_text(root, want)
    if teaching is not None and teaching != (root / TEACHING).read_text(encoding="utf-8"):
        lines.append(f"stale: {TEACHING.as_posix()} (its generated lab table)")
    return lines


def staleness(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(problems, learner edits): what the test suite fails on, and what it leaves alone.

    A copy in notebooks/exercises/ edited by hand while the repository's committed copy is up
    to date (or when there is no git to ask) is someone's local work: ``make test`` must not
    fail on it, and ``make exercises`` keeps it in my-work/rescued/ before regenerating.
    """
    want = expected_exercises(root)
    problems, edits = [], []
    for line in differences(root):
        kind, _, rel = line.partition(": ")
        path = root / rel
        committed = _committed_text(path, root) if kind == "edited by hand" else None
        if kind == "edited by hand" and (committed is None or committed == want.get(path)):
            edits.append(line)
        else:
            problems.append(line)
    return problems, edits


def _rescue(path: Path, root: Path) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = root / WORK_DIR / RESCUE_DIR / f"{path.stem}-{stamp}{path.suffix}"
    target.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while target.exists():
        n += 1
        target = target.with_name(f"{path.stem}-{stamp}-{n}{path.suffix}")
    shutil.copy2(path, target)
    return target


def write_all(root: Path = ROOT) -> int:
    want, have = expected_exercises(root), existing_exercises(root)
    for path, text in want.items():
        if have.get(path) == text:
            continue
        if path in have and _hand_edited_text(have[path], path, root):
            kept = _rescue(path, root)
            print(f"note: {path.relative_to(root)} was edited by hand; that version is kept "
                  f"at {kept.relative_to(root)} (work in {WORK_DIR}/, which nothing overwrites)")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(root)}")
    for path in sorted(set(have) - set(want)):
        if _hand_edited_text(have[path], path, root):
            kept = _rescue(path, root)
            print(f"note: {path.relative_to(root)} is not a generated copy; moved to "
                  f"{kept.relative_to(root)}")
        path.unlink()
        print(f"removed {path.relative_to(root)}")
    teaching = teaching_text(root, want)
    if teaching is not None and teaching != (root / TEACHING).read_text(encoding="utf-8"):
        (root / TEACHING).write_text(teaching, encoding="utf-8")
        print(f"wrote {TEACHING.as_posix()} (the lab table)")
    print(f"{len(want)} exercise notebook(s) in notebooks/{EXERCISE_DIR}/")
    return 0


WORK_README = """\
# Your work

This folder is yours. `make lab` copied each exercise notebook here once, and no command
of the project writes here again: `make exercises`, `make test` and `make lab` leave your
files alone (git ignores the folder too). To start a notebook afresh, delete or rename your
copy here; the next `make lab` copies a new one.

`rescued/` holds any notebook found edited in `notebooks/exercises/` (the generated copies)
before it was regenerated.
"""


def fill_work(folder: Path, root: Path = ROOT, source: dict[Path, str] | None = None) -> int:
    """Copy every exercise notebook that ``folder`` does not have yet; never overwrite."""
    folder.mkdir(parents=True, exist_ok=True)
    copies = source if source is not None else expected_exercises(root)
    added = []
    for path, text in sorted(copies.items()):
        target = folder / path.name
        if not target.exists():
            target.write_text(text, encoding="utf-8")
            added.append(target.name)
    readme = folder / "README.md"
    if not readme.exists():
        readme.write_text(WORK_README, encoding="utf-8")
    kept = len(copies) - len(added)
    print(f"{folder}: {len(added)} exercise notebook(s) copied"
          + (f" ({', '.join(added)})" if added else "")
          + (f"; {kept} already there, left as they are" if kept else ""))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if notebooks/exercises or the teaching table is stale")
    parser.add_argument("--fill", type=Path, metavar="FOLDER",
                        help="copy the exercise notebooks FOLDER lacks into it (never "
                             "overwrites); the project's learners use my-work")
    parser.add_argument("--root", type=Path, default=ROOT, help="project root (default: here)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.fill:
            folder = args.fill if args.fill.is_absolute() else root / args.fill
            return fill_work(folder, root)
        if args.check:
            diffs = differences(root)
            for line in diffs:
                print(line)
            if diffs:
                print("exercise notebooks or the teaching table are out of date: run "
                      "`make exercises` (python -m labkit.course.exercises); it keeps any copy "
                      f"edited by hand in {WORK_DIR}/{RESCUE_DIR}/")
                return 1
            print(f"exercise notebooks and the lab table up to date "
                  f"({len(expected_exercises(root))})")
            return 0
        return write_all(root)
    except RegionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
