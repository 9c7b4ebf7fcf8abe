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
import ast
import builtins
import copy
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
SOLVED_GLOB = "[0-9][0-9]_*.ipynb"
EXERCISE_DIR = "exercises"
WORK_DIR = "my-work"  # the learner's own copies (git-ignored; filled once, never overwritten)
RESCUE_DIR = "rescued"  # my-work/rescued/: hand-edited copies found in notebooks/exercises/
LABS_TOML = Path("notebooks") / "labs.toml"
TEACHING = Path("docs") / "teaching.md"
TABLE_BEGIN = "<!-- BEGIN GENERATED LAB TABLE: labkit/course/exercises.py writes this part -->"
TABLE_END = "<!-- END GENERATED LAB TABLE -->"
DEFAULT_HINT = "write this part yourself, then run the check cell below"
NOTE_ID = "exercise-version-note"
WIDTH = 100  # stub lines stay within this many characters
META_KEY = "tx_exercise"  # cell metadata: which exercise a code cell holds (labkit/course/grade.py)
LAB_KEY = "tx_lab"  # notebook metadata: what the lab grades, and the copy's fingerprint
ANSWER_TAG = "answer"  # a cell with this tag is teacher-only: dropped from the copies
WRITE_MARK = "**Write.**"  # a markdown cell starting with this asks a written, graded answer
ANSWER_SPACE_TAG = "answer-space"  # a cell with this tag gets an empty, ungraded answer cell
YOUR_ANSWER = "**Your answer:** *(double-click this cell and write your answer here)*"
DEF = re.compile(r"^(?P<indent>[ \t]*)(?:async[ \t]+)?(?:def|class)[ \t]+(?P<name>\w+)")
HEADING = re.compile(r"^(?P<level>#{2,3})[ \t]+(?P<text>.+?)[ \t]*$")

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION[ \t]*$")
END = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")
HINT = re.compile(r"^[ \t]*### HINT:[ \t]*(?P<text>.*?)[ \t]*$")
BEGIN_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[ \t]*$")
END_HIDDEN = re.compile(r"^[ \t]*### END HIDDEN TESTS[ \t]*$")
PREDICTION_MARK = "### PREDICTION"
PREDICTION = re.compile(r"^(?P<indent>[ \t]*)(?P<name>[A-Za-z_]\w*)[ \t]*(?::[^=]*)?=(?!=)"
                        r"[ \t]*(?P<value>.*?)[ \t]*### PREDICTION[ \t]*$")
BLANK_PREDICTION = "{indent}{name} = ...  # your prediction"
PREDICTION_FLOW = ("# Run this cell, then the cells below it. The cell that grades your answer "
                   "has its code\n# collapsed on purpose (it names the answer and the usual "
                   "wrong ones): run it, do not open it first.")
ANSWER_OPEN = re.compile(r"<!--\s*answer\s*-->", re.IGNORECASE)
ANSWER_CLOSE = re.compile(r"<!--\s*/answer\s*-->", re.IGNORECASE)
DETAILS_TAG = re.compile(r"<details\b[^>]*>|</details\s*>", re.IGNORECASE)
SUMMARY = re.compile(r"\A\s*<summary\b[^>]*>(?P<text>.*?)</summary\s*>", re.IGNORECASE | re.DOTALL)
CHECK_CALL = re.compile(r"^check_\w+$")

NOTE_HEAD = """\
> **Exercise version of `{solved}`** (the solved notebook of the same name is the teacher's).
> Keep your work in a copy that nothing regenerates: in the project's repository, `make lab`
> copies every exercise notebook once into `my-work/` (git ignores it, and no command
> overwrites it) and opens JupyterLab there; in a handout, its `notebooks/` folder is yours.
> The repository's `notebooks/exercises/` is regenerated from the solved notebooks: do not
> work there."""

NOTE_RUN_ALL = """\
> **Run All stops at the first stub you have not filled in:** that cell raises
> `NotImplementedError` and the cells after it stay blank. Fill in the stub and run its cell,
> then continue with *Run > Run Selected Cell and All Below*; or run the cells one by one,
> skipping those that use an unfinished exercise."""


class RegionError(ValueError):
    """Unbalanced or nested markers, or a marker in the wrong form; the message names the line."""


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


# ----------------------------------------------------------------------------------------
# Solution regions


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


def _parseable(source: str) -> str:
    """The cell source with IPython magics and shell lines blanked (line numbers kept)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.split("\n"))


def parse_cell(source: str) -> ast.Module | None:
    try:
        return ast.parse(_parseable(source))
    except SyntaxError:
        return None


def enclosing_function(source: str, region: Region) -> ast.FunctionDef | None:
    """The innermost def around ``region`` (its signature is the exercise's contract)."""
    tree = parse_cell(source)
    if tree is None:
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno - 1 < region.begin < node.end_lineno:
            if best is None or node.lineno > best.lineno:
                best = node
    return best


# ----------------------------------------------------------------------------------------
# A stub message must state the contract, not the operations (tested in tests/test_labs.py)

# Calls that fetch a size or move data, not an operation a hint could give away.
# Reductions whose names are the contract's plain words ("the mean over non-pad positions",
# "until all rows are finished") count as generic too.
GENERIC_CALLS = frozenset({"size", "dim", "item", "to", "numel", "parameters",
                           "named_parameters", "__init__", "all", "any", "sum", "mean", "max",
                           "min", "abs"})
OPERATOR_SYMBOLS = {ast.MatMult: "@", ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^",
                    ast.Pow: "**", ast.Invert: "~", ast.Eq: "==", ast.NotEq: "!="}
ATTRIBUTE_OPS = frozenset({"T", "mT", "H", "mH"})  # transposes written without a call


def _region_tree(source: str, region: Region) -> tuple[ast.Module | None, str]:
    code = solution_code(source, region)
    lines = [line[len(region.indent):] if line.startswith(region.indent) else line.lstrip()
             for line in code.split("\n")]
    text = "\n".join(lines)
    try:
        return ast.parse(text), text
    except SyntaxError:
        return None, text


def key_operations(source: str, region: Region) -> dict[str, str]:
    """What a region's code does, read from its code: ``{token: kind}``.

    Tokens: the names of the functions and methods it calls (``softmax``, ``transpose``,
    ``masked_fill``, ``w_o``, ``split_heads``, ...), transposes written as attributes (``.T``),
    its operator symbols (``@``, ``|``, ``**``, ``==``, ...), stepped slices (``0::2``) and
    large constants (``10000``). Left out, as the contract's own words: Python's built-in
    functions called by name, size accessors (``GENERIC_CALLS``), calls of a parameter or a
    local variable (``criterion(...)``, ``layer(x)``), the enclosing function's parameter names
    and the words of its name (``my_train_step`` allows "train" and "step").
    """
    tree, text = _region_tree(source, region)
    fn = enclosing_function(source, region)
    allowed: set[str] = set()
    if fn is not None:
        a = fn.args
        allowed |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        allowed |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        allowed |= {fn.name, *[w for w in fn.name.split("_") if w]}
    found: dict[str, str] = {}
    if tree is None:  # not a whole block of statements: fall back to the tokens
        for m in re.finditer(r"(?:\.|\b)([A-Za-z_]\w*)\s*\(", text):
            if m.group(1) not in GENERIC_CALLS and m.group(1) not in dir(builtins):
                found.setdefault(m.group(1), "call")
        for sym in ("@", "**", "==", "!="):
            if sym in text:
                found.setdefault(sym, "operator")
        return {k: v for k, v in found.items() if k.lower() not in {a.lower() for a in allowed}}
    local = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                if f.id not in dir(builtins) and f.id not in local and f.id not in allowed:
                    found.setdefault(f.id, "call")
            elif isinstance(f, ast.Attribute) and f.attr not in GENERIC_CALLS:
                found.setdefault(f.attr, "call")
        elif isinstance(node, ast.Attribute) and node.attr in ATTRIBUTE_OPS:
            found.setdefault("." + node.attr, "attribute")
        elif isinstance(node, (ast.BinOp, ast.AugAssign, ast.UnaryOp)):
            sym = OPERATOR_SYMBOLS.get(type(node.op))
            if sym:
                found.setdefault(sym, "operator")
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) in OPERATOR_SYMBOLS:
                    found.setdefault(OPERATOR_SYMBOLS[type(op)], "operator")
        elif isinstance(node, ast.Slice) and node.step is not None:
            found.setdefault(re.sub(r"\s+", "", ast.get_source_segment(text, node) or ""),
                             "slice")
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool) and abs(node.value) >= 100:
            found.setdefault(repr(node.value), "constant")
    words = {a.lower() for a in allowed}  # messages are matched in any case, so are these
    return {k: v for k, v in found.items() if k and k.lower() not in words}


def _numbers(text: str) -> set[float]:
    out = set()
    for m in re.finditer(r"(?<![\w.])\d[\d_]*(?:\.\d*)?(?:[eE][-+]?\d+)?", text):
        try:
            out.add(float(m.group(0).replace("_", "")))
        except ValueError:
            pass
    return out


def leaked_operations(message: str, operations: dict[str, str]) -> list[str]:
    """The key operations that ``message`` names (identifiers as whole words, any case)."""
    leaks = []
    squeezed = re.sub(r"\s+", "", message)
    numbers = _numbers(message)
    for token, kind in operations.items():
        if kind == "call":
            hit = re.search(rf"(?<![A-Za-z0-9_]){re.escape(token)}(?![A-Za-z0-9_])", message,
                            re.IGNORECASE)
        elif kind == "attribute":
            hit = re.search(rf"{re.escape(token)}(?![A-Za-z0-9_])", message)
        elif kind == "slice":
            hit = token in squeezed
        elif kind == "constant":
            hit = float(token) in numbers
        else:  # operator symbols; "**" must not count as "*"
            hit = token in message
        if hit:
            leaks.append(token)
    return leaks


# ----------------------------------------------------------------------------------------
# Predictions, answers, written questions


def prediction_lines(source: str) -> list[tuple[int, str, str]]:
    """(line index, variable, value source) for each ``### PREDICTION`` line of a cell."""
    found = []
    for i, line in enumerate(source.split("\n")):
        if PREDICTION_MARK not in line:
            continue
        m = PREDICTION.match(line)
        if not m or not m.group("value"):
            raise RegionError(f"line {i + 1}: a {PREDICTION_MARK} line must read "
                              f"`name = value  {PREDICTION_MARK}`, got {line.strip()!r}")
        found.append((i, m.group("name"), m.group("value")))
    return found


def blank_predictions(source: str) -> str:
    """Every ``name = value  ### PREDICTION`` line becomes ``name = ...  # your prediction``."""
    lines = source.split("\n")
    for i, _, _ in prediction_lines(source):
        m = PREDICTION.match(lines[i])
        lines[i] = BLANK_PREDICTION.format(indent=m.group("indent"), name=m.group("name"))
    return "\n".join(lines)


def is_prediction_grader(source: str) -> bool:
    """True for a code cell that calls ``check_prediction`` (its code names the answer)."""
    return any(check == "check_prediction" for check, _, _ in check_calls(source))


def hide_source(cell) -> None:
    """Collapse a code cell's source in JupyterLab (the cell still runs; a click opens it)."""
    cell.metadata.setdefault("jupyter", {})["source_hidden"] = True


def is_prediction_cell(source: str) -> bool:
    """Only prediction lines, comments and blank lines (and at least one prediction)."""
    lines = [line.strip() for line in source.split("\n")]
    preds = [line for line in lines if PREDICTION_MARK in line]
    rest = [line for line in lines if line and PREDICTION_MARK not in line
            and not line.startswith("#")]
    return bool(preds) and not rest


def _summary_text(block: str) -> str | None:
    """The plain text of the ``<summary>`` a ``<details ...>`` block opens with."""
    inner = re.sub(r"\A<details\b[^>]*>", "", block, flags=re.IGNORECASE)
    m = SUMMARY.match(inner)
    if not m:
        return None
    text = re.sub(r"<[^>]+>", "", m.group("text"))
    return re.sub(r"[*_`]", "", text).strip()


def is_answer_summary(text: str | None) -> bool:
    return bool(text) and text.lower().startswith("answer")


def details_blocks(text: str) -> list[tuple[int, int, int]]:
    """(start, end, depth) of every ``<details>...</details>`` block, nesting respected."""
    stack, blocks = [], []
    for m in DETAILS_TAG.finditer(text):
        if m.group(0).lower().startswith("</"):
            if not stack:
                raise RegionError(f"a </details> without <details> at character {m.start()}")
            start = stack.pop()
            blocks.append((start, m.end(), len(stack)))
        else:
            stack.append(m.start())
    if stack:
        raise RegionError(f"a <details> without </details> at character {stack[-1]}")
    return sorted(blocks)


def answer_blocks(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of the answers in a markdown text, outermost only, in order.

    kind: "details" (a ``<details>`` whose summary starts with "Answer") or "comment" (between
    ``<!-- answer -->`` and ``<!-- /answer -->``).
    """
    spans = []
    for start, end, _ in details_blocks(text):
        if is_answer_summary(_summary_text(text[start:end])):
            spans.append((start, end, "details"))
    pos = 0
    while True:
        m = ANSWER_OPEN.search(text, pos)
        close = ANSWER_CLOSE.search(text, pos)
        if not m:
            if close:
                raise RegionError("<!-- /answer --> without <!-- answer -->")
            break
        c = ANSWER_CLOSE.search(text, m.end())
        nxt = ANSWER_OPEN.search(text, m.end())
        if not c or (nxt and nxt.start() < c.start()):
            raise RegionError("<!-- answer --> without its <!-- /answer -->")
        spans.append((m.start(), c.end(), "comment"))
        pos = c.end()
    outer = []
    for span in sorted(spans):
        if outer and span[0] < outer[-1][1]:
            continue  # inside an answer already taken out
        outer.append(span)
    return outer


def strip_answers(text: str) -> str:
    """A markdown text without its answers (see :func:`answer_blocks`); tidy blank lines."""
    for start, end, _ in reversed(answer_blocks(text)):
        text = text[:start] + text[end:]
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def is_teacher_only(cell) -> bool:
    return ANSWER_TAG in (cell.get("metadata", {}).get("tags") or [])


def is_written_question(cell) -> bool:
    return cell.cell_type == "markdown" and cell.source.lstrip().startswith(WRITE_MARK)


# ----------------------------------------------------------------------------------------
# What a lab holds: sections, exercises, graded checks, predictions, written questions


def _sections(nb) -> list[tuple[int, str, str]]:
    """(cell index, section, subsection) for every cell: the headings above it."""
    out, section, sub = [], "", ""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":  # a heading counts for its own cell and those after
            for line in cell.source.split("\n"):
                m = HEADING.match(line)
                if m and m.group("level") == "##":
                    section, sub = m.group("text"), ""
                elif m:
                    sub = m.group("text")
        out.append((index, section, sub))
    return out


def section_titles(nb) -> list[str]:
    titles = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            titles += [m.group("text") for line in cell.source.split("\n")
                       if (m := HEADING.match(line)) and m.group("level") == "##"]
    return titles


def _where(sections, index: int, with_sub: bool = True) -> str:
    _, section, sub = sections[index]
    parts = (section, sub) if with_sub else (section,)
    return " / ".join(t for t in parts if t) or "the introduction"


def exercise_list(nb) -> list[dict]:
    """One entry per solution region: number, cell index, the code it lives in, the section."""
    found, sections = [], _sections(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for region in find_regions(cell.source):
            found.append({"number": len(found) + 1, "cell": index,
                          "name": region_owner(cell.source, region),
                          "section": _where(sections, index)})
    return found


def has_regions(nb) -> bool:
    return any(c.cell_type == "code" and find_regions(c.source) for c in nb.cells)


def _defined_in(source: str, only_regions: bool = False) -> set[str]:
    """Top-level names a cell defines (only_regions: those whose code holds a region)."""
    tree = parse_cell(source)
    names: set[str] = set()
    lines = [r.begin + 1 for r in find_regions(source)] if only_regions else []
    for node in tree.body if tree else []:
        if only_regions and not any(node.lineno <= n <= node.end_lineno for n in lines):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _uses(source: str) -> dict[str, set[str]]:
    """Top-level names a cell defines -> the names their bodies use (bases not counted: a
    demonstration that subclasses the learner's class is not the learner's code)."""
    tree = parse_cell(source)
    out: dict[str, set[str]] = {}
    for node in tree.body if tree else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            parts, names = node.body, [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            parts = [node.value]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        else:
            continue
        nodes = [n for part in parts for n in ast.walk(part)]
        bound = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx,
                                                                                   ast.Load)}
        bound |= {a.arg for n in nodes if isinstance(n, ast.arguments)
                  for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg] if a}
        used = {n.id for n in nodes if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)} - bound
        for name in names:
            out[name] = used - {name}
    return out


def _check_name(call: ast.Call) -> str | None:
    """``check_x`` for ``labkit.check_x(...)`` or ``check_x(...)``."""
    f = call.func
    if isinstance(f, ast.Attribute) and CHECK_CALL.match(f.attr):
        if isinstance(f.value, ast.Name) and f.value.id == "labkit":
            return f.attr
    if isinstance(f, ast.Name) and CHECK_CALL.match(f.id):
        return f.id
    return None


def check_calls(source: str) -> list[tuple[str, ast.Call, str]]:
    """(check name, call node, call source) for every grading check called in a cell."""
    tree = parse_cell(source)
    text = _parseable(source)
    found = []
    for node in ast.walk(tree) if tree else []:
        if isinstance(node, ast.Call) and (name := _check_name(node)):
            segment = ast.get_source_segment(text, node) or name
            found.append((name, node, " ".join(segment.split())))
    return sorted(found, key=lambda t: (t[1].lineno, t[1].col_offset))


def _names_in(node: ast.Call) -> set[str]:
    return {n.id for arg in [*node.args, *[k.value for k in node.keywords]]
            for n in ast.walk(arg) if isinstance(n, ast.Name)}


def _cell_text(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


def lab_info(nb) -> dict:
    """What the lab in solved notebook ``nb`` grades (JSON-ready; the cells are indices)."""
    sections = _sections(nb)
    exercises = exercise_list(nb)
    region_cells = {e["cell"] for e in exercises}
    defined: dict[str, set[str]] = {}  # a name the learner's code defines -> its exercises
    for index in sorted(region_cells):
        for name in _defined_in(nb.cells[index].source, only_regions=True):
            defined[name] = {name}
    checks, predictions, pending = [], [], {}
    written, drill = [], 0
    for index, cell in enumerate(nb.cells):
        if ANSWER_SPACE_TAG in (cell.get("metadata", {}).get("tags") or []):
            drill += 1  # an ungraded question (notebook 11's drill): an answer cell, no points
        if is_written_question(cell):
            question = strip_answers(cell.source)[len(WRITE_MARK):].strip()
            written.append({"number": len(written) + 1, "cell": index, "question": question,
                            "section": _where(sections, index, False)})
        if cell.cell_type != "code":
            continue
        if index not in region_cells:  # built from the learner's code: MyTransformer in 06
            for name, used in _uses(cell.source).items():
                uses = set().union(*(defined[u] for u in used if u in defined))
                if uses:
                    defined[name] = uses
        for line, name, value in prediction_lines(cell.source):
            asked = next((j for j in range(index - 1, -1, -1)
                          if nb.cells[j].cell_type == "markdown"), None)
            question = strip_answers(nb.cells[asked].source) if asked is not None else ""
            pending[name] = {"name": name, "value": value, "cell": index, "line": line,
                             "question": question, "question_cell": asked,
                             "section": _where(sections, index, False)}
        calls = check_calls(cell.source)
        graders = [(node, call) for check, node, call in calls if check == "check_prediction"]
        if graders and pending:
            tree = parse_cell(cell.source)
            for name in sorted(_loaded_names(tree) & set(pending)):
                item = pending.pop(name)
                node, call = next(((n, c) for n, c in graders if name in _names_in(n)),
                                  graders[0])
                direct = name in _names_in(node)
                item.update(check_cell=index, call=call,
                            label=_label(node) if direct else _tuple_label(tree, name),
                            mistakes=(_prediction_mistakes(node, cell.source) if direct
                                      else _tuple_mistakes(tree, name)),
                            tolerance=_tolerance(node))
                predictions.append(item)
        for check, node, call in calls:
            subjects = _names_in(node)
            if check == "check_prediction":
                continue
            graded = sorted(subjects & set(defined))
            if graded:
                covers = sorted(set().union(*(defined[g] for g in graded)))
                checks.append({"check": check, "call": call, "cell": index,
                               "subjects": graded, "covers": covers,
                               "section": _where(sections, index, False)})
    for item in exercises:
        top = item["name"].split(".")[0]
        item["checks"] = sorted({c["check"] for c in checks if top in c["covers"]})
    predictions.sort(key=lambda p: (p["cell"], p["line"]))
    for number, item in enumerate(predictions, 1):
        item["number"] = number
    return {"sections": section_titles(nb), "exercises": exercises, "checks": checks,
            "predictions": predictions, "ungraded_predictions": sorted(pending),
            "written": written, "drill": drill}


def _loaded_names(tree) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)} if tree else set()


def _holding_tuple(tree, name: str):
    """The tuple or list literal that holds ``name`` (a quiz row: label, prediction, ...)."""
    for node in ast.walk(tree) if tree else []:
        if isinstance(node, (ast.Tuple, ast.List)) and any(
                isinstance(e, ast.Name) and e.id == name for e in node.elts):
            return node
    return None


def _tuple_label(tree, name: str) -> str:
    row = _holding_tuple(tree, name)
    for e in row.elts if row is not None else []:
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            return e.value
    return ""


def _tuple_mistakes(tree, name: str) -> list[list[str]]:
    row = _holding_tuple(tree, name)
    for e in row.elts if row is not None else []:
        if isinstance(e, ast.Dict):
            return [[ast.unparse(k), v.value if isinstance(v, ast.Constant)
                     and isinstance(v.value, str) else ast.unparse(v)]
                    for k, v in zip(e.keys, e.values, strict=True) if k is not None]
    return []


def _label(call: ast.Call) -> str:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value,
                                                                             str):
        return call.args[0].value
    return ""


def _tolerance(call: ast.Call) -> str:
    parts = [f"{k.arg}={ast.unparse(k.value)}" for k in call.keywords if k.arg in ("tol", "rel")]
    return ", ".join(parts)


def _prediction_mistakes(call: ast.Call, source: str) -> list[list[str]]:
    """[[wrong answer (source), what it means (source or text)], ...] from ``mistakes=``."""
    for k in call.keywords:
        if k.arg == "mistakes" and isinstance(k.value, ast.Dict):
            out = []
            for key, value in zip(k.value.keys, k.value.values, strict=True):
                if key is None:
                    continue
                meaning = (value.value if isinstance(value, ast.Constant)
                           and isinstance(value.value, str) else ast.unparse(value))
                out.append([ast.unparse(key), meaning])
            return out
        if k.arg == "mistakes":
            return [["(computed in the cell)", ast.unparse(k.value)]]
    return []


# ----------------------------------------------------------------------------------------
# Points, rubric and study time: notebooks/labs.toml


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


# ----------------------------------------------------------------------------------------
# The exercise copy


def fingerprint(nb) -> str:
    """A hash of the cells' types and sources: changes when anyone edits a cell."""
    data = [[c.cell_type, _cell_text(c)] for c in nb.cells]
    return hashlib.sha256(json.dumps(data, ensure_ascii=False).encode()).hexdigest()[:16]


def is_hand_edited(nb) -> bool:
    """True for a generated copy whose cells were edited after generation (or no copy)."""
    stored = nb.metadata.get(LAB_KEY, {}).get("fingerprint")
    return stored is None or stored != fingerprint(nb)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def note_text(solved_name: str, info: dict) -> str:
    parts = [NOTE_HEAD.format(solved=solved_name)]
    if info["sections"]:
        parts.append("> **Sections of this notebook:** "
                     + "; ".join(f"*{_md(t)}*" for t in info["sections"]) + ".")
    exercises = info["exercises"]
    if exercises:
        n = len(exercises)
        lines = [f"> **{n} exercise{'s' if n != 1 else ''} to write** (each "
                 "`raise NotImplementedError(...)` line is yours to replace; its message "
                 "states what the code must take and return):", ">"]
        for e in exercises:
            by = ", ".join(f"`{c}`" for c in e["checks"]) or "no automatic check"
            lines.append(f"> {e['number']}. `{e['name']}`, in section *{_md(e['section'])}*;"
                         f" checked by {by}")
        parts.append("\n".join(lines))
    if info["checks"]:
        lines = ["> **Checking your work:** after you fill in a stub, run the check cell "
                 "that follows it:", ">"]
        lines += [f"> - `{c['call']}` (section *{_md(c['section'])}*)" for c in info["checks"]]
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
                     + ("the exercises (through their checks) and " if exercises else "")
                     + "the predictions.")
    if exercises:
        parts.append(NOTE_RUN_ALL)
    return "\n>\n".join(parts)


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
            if is_prediction_grader(original):
                hide_source(cell)
        elif cell.cell_type == "markdown":
            source = strip_answers(cell.source)
            if not source.strip():
                continue  # the cell held only an answer
            cell.source = source
        cells.append(cell)
        tags = cell.metadata.get("tags", [])
        if is_written_question(nb.cells[index]) or ANSWER_SPACE_TAG in tags:
            answer = nbformat.v4.new_markdown_cell(YOUR_ANSWER)
            answer.id = f"{cell.get('id', f'cell-{index}')}-your-answer"[:64]
            cells.append(answer)
    note = nbformat.v4.new_markdown_cell(note_text(solved_name, info))
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


def _lab_number(path: Path) -> str:
    return path.name[:2]


def solved_notebooks(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob(SOLVED_GLOB))


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


# ----------------------------------------------------------------------------------------
# The lab table of docs/teaching.md


def lab_table(root: Path = ROOT, copies: dict[Path, str] | None = None) -> str:
    """The generated part of docs/teaching.md, from the exercise copies' metadata."""
    copies = copies if copies is not None else expected_exercises(root)
    labs = load_labs(root)
    rows = ["| Lab | Code to write: points, and the check that marks it | Predictions | "
            "Written answers | Points | Study time (estimate) |", "|---|---|---|---|---|---|"]
    rubrics, total_minutes = [], 0
    for path in sorted(copies):
        nb = nbformat.reads(copies[path], as_version=4)
        meta = nb.metadata[LAB_KEY]
        settings = lab_settings(labs, _lab_number(path))
        points = lab_points(meta, settings)
        p = settings["points"]
        link = (f"[{path.stem.replace('_', ' ')}](../notebooks/{path.name}) "
                f"([exercise](../notebooks/{EXERCISE_DIR}/{path.name}))")
        code = []
        for top, methods, checks in graded_objects(meta["exercises"]):
            n = max(1, len(methods))
            what = f"`{top}`" + (f" ({', '.join(f'`{m}`' for m in methods)})" if methods else "")
            by = ", ".join(f"`{c}`" for c in checks) or "no check: mark by hand"
            code.append(f"{what}: {n * p['exercise']:g} pt, {by}")
        code_text = "<br>".join(code) or "none"
        preds = meta["predictions"]
        pred_text = (f"{len(preds)} × {p['prediction']:g} pt: "
                     + "; ".join(_md(x["label"] or x["name"]) for x in preds)) if preds else "none"
        written = meta["written"]
        written_text = (f"{len(written)} × {p['written']:g} pt (rubric below)" if written
                        else "none")
        if meta.get("drill"):
            written_text += (f"; {meta['drill']} drill questions with an answer cell, "
                             "**ungraded** (0 pt)")
        if settings["graded_note"]:
            written_text += f". {_md(settings['graded_note'])}"
        minutes = settings["minutes"]
        total_minutes += minutes or 0
        time_text = f"about {minutes} min" if minutes else "not estimated"
        rows.append(f"| {link} | {code_text} | {pred_text} | {written_text} | "
                    f"{points['total']:g} | {time_text} |")
        if written:
            rubrics.append(f"- **{path.stem}**: {settings['rubric'] or 'no rubric yet'}")
    out = [TABLE_BEGIN, "", *rows, "",
           f"Study times are the authors' estimates (reading, predicting, writing and "
           f"running, for a learner new to the topic), not measurements: about "
           f"{total_minutes / 60:.0f} hours for the series. Each exercise (one stub to fill "
           f"in) is worth {labs['points']['exercise']:g} pt, each graded prediction "
           f"{labs['points']['prediction']:g} pt and each written answer "
           f"{labs['points']['written']:g} pt unless a lab says otherwise; a class with several "
           f"stubs earns them through the one check that marks it (`labkit/course/grade.py` gives "
           f"partial credit by probes passed). The points, the rubric and the estimates live in "
           f"`{LABS_TOML.as_posix()}`; the rest of this table is read from the notebooks. "
           f"`make exercises` rewrites it, and a test fails when it is stale."]
    if rubrics:
        out += ["", "Rubric for the written answers:", "", *rubrics]
    out += ["", TABLE_END]
    return "\n".join(out)


def teaching_text(root: Path = ROOT, copies: dict[Path, str] | None = None) -> str | None:
    """docs/teaching.md with its generated table replaced (None: no teaching.md)."""
    path = root / TEACHING
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise RegionError(f"{TEACHING.as_posix()}: the marker comments {TABLE_BEGIN!r} and "
                          f"{TABLE_END!r} are missing")
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    return head + lab_table(root, copies) + tail


# ----------------------------------------------------------------------------------------
# Checking, writing, filling the learner's folder


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
