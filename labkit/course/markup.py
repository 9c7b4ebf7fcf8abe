"""The notebook markup the course builders read: solution and hidden-test markers,
``### PREDICTION`` lines, answer blocks, written questions and the cell tags and metadata keys.

The format is described in docs/CONVENTIONS.md ("Notebook conventions").
"""
from __future__ import annotations

import re

DEFAULT_HINT = "write this part yourself, then run the check cell below"
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


class RegionError(ValueError):
    """Unbalanced or nested markers, or a marker in the wrong form; the message names the line."""


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


def summary_text(block: str) -> str | None:
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
        if is_answer_summary(summary_text(text[start:end])):
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


def cell_text(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


def md_escape(text: str) -> str:
    return text.replace("|", "\\|")
