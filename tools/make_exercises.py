#!/usr/bin/env python3
"""Write the learners' exercise notebooks from the solved ones.

For every solved notebook notebooks/NN_*.ipynb with at least one solution region,
writes notebooks/exercises/NN_*.ipynb where

- each region between a line ``### BEGIN SOLUTION`` and a line ``### END SOLUTION``
  becomes ``raise NotImplementedError("<hint>")`` at the region's indentation; the
  hint is the text of a ``### HINT: ...`` line right after BEGIN, else a default;
- ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` blocks are removed (a code
  cell left empty by that is dropped);
- outputs, execution counts and execution metadata (cell timings, widget state,
  language_info details) are cleared;
- a markdown note at the top says this is the exercise version and how to check work.

The solved notebooks are only read. Output is deterministic (nbformat's JSON layout).

  python tools/make_exercises.py           # write notebooks/exercises/
  python tools/make_exercises.py --check   # exit 1 if they are stale, missing or extra
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLVED_GLOB = "[0-9][0-9]_*.ipynb"
EXERCISE_DIR = "exercises"
DEFAULT_HINT = "write this part yourself, then run the check cell below"
NOTE_ID = "exercise-version-note"
WIDTH = 100  # stub lines stay within this many characters
META_KEY = "tx_exercise"  # cell metadata: which exercise a code cell holds (tools/grade.py)
DEF = re.compile(r"^(?P<indent>[ \t]*)(?:async[ \t]+)?(?:def|class)[ \t]+(?P<name>\w+)")
HEADING = re.compile(r"^(?P<level>#{2,3})[ \t]+(?P<text>.+?)[ \t]*$")

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION[ \t]*$")
END = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")
HINT = re.compile(r"^[ \t]*### HINT:[ \t]*(?P<text>.*?)[ \t]*$")
BEGIN_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[ \t]*$")
END_HIDDEN = re.compile(r"^[ \t]*### END HIDDEN TESTS[ \t]*$")

NOTE = """\
> **Exercise version.** This is the learner's copy of `{solved}`: the parts marked \
`raise NotImplementedError(...)` are yours to write (the message is a hint). \
Each stub sits inside a function or class whose signature and docstring are kept.
>
{exercises}
> **Checking your work:** run the cells from the top. After you fill in a stub, run the \
cell that calls a check from `tx_helpers.grading`, for example \
`tx.grading.check_multi_head_attention(MultiHeadAttention)`; if there is none, add one. \
The check prints ✓/✗ per probe and, when something is wrong, names the likely mistake \
with a hint. Later cells that use your code fail until the stubs are filled in.
"""


class RegionError(ValueError):
    """Unbalanced or nested markers; the message names the line."""


@dataclass
class Region:
    begin: int  # line index of ### BEGIN SOLUTION
    end: int  # line index of ### END SOLUTION
    indent: str
    hint: str | None

    def stub(self) -> str:
        """``raise NotImplementedError("<hint>")``, wrapped within WIDTH characters."""
        one = f"{self.indent}raise NotImplementedError({json.dumps(self.hint or DEFAULT_HINT)})"
        if len(one) <= WIDTH:
            return one
        inner = self.indent + "    "
        room = WIDTH - len(inner) - 3  # the quotes and a closing parenthesis
        pieces = textwrap.wrap(self.hint or DEFAULT_HINT, room, drop_whitespace=False,
                               break_long_words=False, break_on_hyphens=False)
        body = [f"{inner}{json.dumps(p)}" for p in pieces]
        body[-1] += ")"
        return "\n".join([f"{self.indent}raise NotImplementedError("] + body)


def find_regions(source: str) -> list[Region]:
    """Solution regions of one cell's source, in order."""
    regions, open_at = [], None
    lines = source.split("\n")
    for i, line in enumerate(lines):
        if BEGIN.match(line):
            if open_at is not None:
                raise RegionError(f"line {i + 1}: BEGIN SOLUTION inside another region")
            open_at = i
        elif END.match(line):
            if open_at is None:
                raise RegionError(f"line {i + 1}: END SOLUTION without BEGIN SOLUTION")
            hint = None
            if open_at + 1 < i:
                m = HINT.match(lines[open_at + 1])
                hint = m.group("text") if m else None
            regions.append(Region(open_at, i, BEGIN.match(lines[open_at]).group("indent"), hint))
            open_at = None
    if open_at is not None:
        raise RegionError(f"line {open_at + 1}: BEGIN SOLUTION without END SOLUTION")
    return regions


def solution_code(source: str, region: Region) -> str:
    """The lines a learner has to write for ``region`` (without markers and hint)."""
    lines = source.split("\n")[region.begin + 1 : region.end]
    if lines and HINT.match(lines[0]):
        lines = lines[1:]
    return "\n".join(lines)


def strip_hidden_tests(source: str) -> str:
    out, hidden_at = [], None
    for i, line in enumerate(source.split("\n")):
        if BEGIN_HIDDEN.match(line):
            if hidden_at is not None:
                raise RegionError(f"line {i + 1}: nested BEGIN HIDDEN TESTS")
            hidden_at = i
        elif END_HIDDEN.match(line):
            if hidden_at is None:
                raise RegionError(f"line {i + 1}: END HIDDEN TESTS without BEGIN")
            hidden_at = None
        elif hidden_at is None:
            out.append(line)
    if hidden_at is not None:
        raise RegionError(f"line {hidden_at + 1}: BEGIN HIDDEN TESTS without END")
    return "\n".join(out)


def stub_source(source: str) -> str:
    """The cell source with every solution region replaced by its stub line."""
    lines = source.split("\n")
    for region in reversed(find_regions(source)):
        lines[region.begin : region.end + 1] = [region.stub()]
    return "\n".join(lines)


def region_owner(source: str, region: Region) -> str:
    """The function or method a region sits in, as ``Class.method`` (or the cell's top)."""
    lines = source.split("\n")
    names, limit = [], len(region.indent.expandtabs())
    for line in reversed(lines[: region.begin]):
        m = DEF.match(line)
        if m and len(m.group("indent").expandtabs()) < limit:
            names.append(m.group("name"))
            limit = len(m.group("indent").expandtabs())
            if limit == 0:
                break
    return ".".join(reversed(names)) or "top-level code"


def exercise_list(nb) -> list[dict]:
    """One entry per solution region: number, cell index, the code it lives in, the section."""
    found, section, sub = [], "", ""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for line in cell.source.split("\n"):
                m = HEADING.match(line)
                if m and m.group("level") == "##":
                    section, sub = m.group("text"), ""
                elif m:
                    sub = m.group("text")
            continue
        if cell.cell_type != "code":
            continue
        for region in find_regions(cell.source):
            where = " / ".join(t for t in (section, sub) if t) or "the introduction"
            found.append({"number": len(found) + 1, "cell": index,
                          "name": region_owner(cell.source, region), "section": where})
    return found


def has_regions(nb) -> bool:
    return any(c.cell_type == "code" and find_regions(c.source) for c in nb.cells)


def make_exercise(nb, solved_name: str):
    """A new notebook node: the exercise version of the solved notebook ``nb``."""
    ex = nbformat.from_dict(json.loads(json.dumps(nb)))  # deep copy; the input stays as it is
    exercises = exercise_list(ex)
    by_cell: dict[int, list[dict]] = {}
    for item in exercises:
        by_cell.setdefault(item["cell"], []).append(item)
    cells = []
    for index, cell in enumerate(ex.cells):
        if index in by_cell:
            cell.metadata[META_KEY] = [{k: v for k, v in item.items() if k != "cell"}
                                       for item in by_cell[index]]
        if cell.cell_type == "code":
            original = cell.source
            source = stub_source(strip_hidden_tests(original))
            if original.strip() and not source.strip():
                continue  # the cell held only hidden tests
            cell.source = source
            cell.outputs = []
            cell.execution_count = None
            for key in ("execution", "ExecuteTime", "collapsed", "scrolled"):
                cell.metadata.pop(key, None)
        cells.append(cell)
    listing = [f"> **{len(exercises)} exercise{'s' if len(exercises) != 1 else ''} in this "
               "notebook:**", ">"]
    listing += [f"> {e['number']}. `{e['name']}`, in section *{e['section']}*"
                for e in exercises]
    note = nbformat.v4.new_markdown_cell(NOTE.format(solved=solved_name,
                                                     exercises="\n".join(listing) + "\n>"))
    if ex.nbformat_minor >= 5:
        note.id = NOTE_ID
    else:
        note.pop("id", None)
    ex.cells = [note] + cells
    ex.metadata.pop("widgets", None)
    if "language_info" in ex.metadata:  # execution adds version details: keep only the name
        ex.metadata["language_info"] = {"name": ex.metadata["language_info"].get("name",
                                                                                 "python")}
    return ex


def expected_exercises(root: Path = ROOT) -> dict[Path, str]:
    """Exercise path -> its exact file text, for every solved notebook with regions."""
    out = {}
    for path in sorted((root / "notebooks").glob(SOLVED_GLOB)):
        nb = nbformat.read(path, as_version=4)
        try:
            if not has_regions(nb):
                continue
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


def differences(root: Path = ROOT) -> list[str]:
    """What --check reports: one line per stale, missing or extra exercise notebook."""
    want, have = expected_exercises(root), existing_exercises(root)
    lines = []
    for path in sorted(set(want) | set(have)):
        rel = path.relative_to(root)
        if path not in have:
            lines.append(f"missing: {rel}")
        elif path not in want:
            lines.append(f"extra (its solved notebook has no regions or is gone): {rel}")
        elif want[path] != have[path]:
            lines.append(f"stale: {rel}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if notebooks/exercises is stale, missing or extra files")
    parser.add_argument("--root", type=Path, default=ROOT, help="project root (default: here)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.check:
            diffs = differences(root)
            for line in diffs:
                print(line)
            if diffs:
                print("exercise notebooks are out of date: run `make exercises` "
                      "(python tools/make_exercises.py) and commit notebooks/exercises/")
                return 1
            print(f"exercise notebooks up to date ({len(expected_exercises(root))})")
            return 0
        want, have = expected_exercises(root), existing_exercises(root)
    except RegionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path, text in want.items():
        if have.get(path) != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(root)}")
    for path in set(have) - set(want):
        path.unlink()
        print(f"removed {path.relative_to(root)}")
    print(f"{len(want)} exercise notebook(s) in notebooks/{EXERCISE_DIR}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
