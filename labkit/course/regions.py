"""Solution regions (``### BEGIN SOLUTION`` ... ``### END SOLUTION``) and their stubs."""
from __future__ import annotations

import ast
import json
import textwrap
from dataclasses import dataclass

from labkit.course.markup import (
    BEGIN,
    BEGIN_HIDDEN,
    DEF,
    DEFAULT_HINT,
    END,
    END_HIDDEN,
    HINT,
    WIDTH,
    RegionError,
)


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


def parseable(source: str) -> str:
    """The cell source with IPython magics and shell lines blanked (line numbers kept)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.split("\n"))


def parse_cell(source: str) -> ast.Module | None:
    try:
        return ast.parse(parseable(source))
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
