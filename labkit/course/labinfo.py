"""What a lab holds: its sections, exercises, graded checks, predictions and written questions."""
from __future__ import annotations

import ast
import io
import tokenize

from labkit.course.markup import (
    ANSWER_SPACE_TAG,
    CHECK_CALL,
    HEADING,
    WRITE_MARK,
    is_written_question,
    prediction_lines,
    strip_answers,
)
from labkit.course.regions import find_regions, parse_cell, parseable, region_owner


def cell_sections(nb) -> list[tuple[int, str, str]]:
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


def where(sections, index: int, with_sub: bool = True) -> str:
    _, section, sub = sections[index]
    parts = (section, sub) if with_sub else (section,)
    return " / ".join(t for t in parts if t) or "the introduction"


def exercise_list(nb) -> list[dict]:
    """One entry per solution region: number, cell index, the code it lives in, the section."""
    found, sections = [], cell_sections(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for region in find_regions(cell.source):
            found.append({"number": len(found) + 1, "cell": index,
                          "name": region_owner(cell.source, region),
                          "section": where(sections, index)})
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


def _without_comments(segment: str) -> str:
    """A call's source with its ``# ...`` comments dropped (joined on one line, a comment
    would swallow the arguments after it)."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(segment).readline)
                  if t.type != tokenize.COMMENT]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, SyntaxError):
        return segment


def check_calls(source: str) -> list[tuple[str, ast.Call, str]]:
    """(check name, call node, call source) for every grading check called in a cell."""
    tree = parse_cell(source)
    text = parseable(source)
    found = []
    for node in ast.walk(tree) if tree else []:
        if isinstance(node, ast.Call) and (name := _check_name(node)):
            segment = _without_comments(ast.get_source_segment(text, node) or name)
            found.append((name, node, " ".join(segment.split())))
    return sorted(found, key=lambda t: (t[1].lineno, t[1].col_offset))


def is_prediction_grader(source: str) -> bool:
    """True for a code cell that calls ``check_prediction`` (its code names the answer)."""
    return any(check == "check_prediction" for check, _, _ in check_calls(source))


def _names_in(node: ast.Call) -> set[str]:
    return {n.id for arg in [*node.args, *[k.value for k in node.keywords]]
            for n in ast.walk(arg) if isinstance(n, ast.Name)}


def lab_info(nb) -> dict:
    """What the lab in solved notebook ``nb`` grades (JSON-ready; the cells are indices)."""
    sections = cell_sections(nb)
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
                            "section": where(sections, index, False)})
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
                             "section": where(sections, index, False)}
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
                               "section": where(sections, index, False)})
    for item in exercises:
        top = item["name"].split(".")[0]
        item["checks"] = sorted({c["check"] for c in checks if top in c["covers"]})
    predictions.sort(key=lambda p: (p["cell"], p["line"]))
    for number, item in enumerate(predictions, 1):
        item["number"] = number
    return {"sections": section_titles(nb), "exercises": exercises, "checks": checks,
            "predictions": predictions, "ungraded_predictions": sorted(pending),
            "written": written, "drill": drill, "run_all_stop": run_all_stop(nb, exercises),
            "proof_cells": proof_cells(nb)}


def _catches_stub(handler: ast.ExceptHandler) -> bool:
    """An ``except`` that catches a stub's NotImplementedError (bare, or naming it or a base)."""
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(k is None or (isinstance(k, ast.Name) and k.id in (
        "NotImplementedError", "RuntimeError", "Exception", "BaseException")) for k in kinds)


def _top_level_calls(tree) -> list[str]:
    """Names called in a cell's top-level code (not inside a def, class or lambda), in the
    order the calls run: by where each call ends (``f(g(x))`` calls g first)."""
    found: list[tuple[int, int, str]] = []
    stack = list(tree.body) if tree else []
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Try) and any(_catches_stub(h) for h in node.handlers):
            stack.extend(node.handlers + node.orelse + node.finalbody)  # its body may raise
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            found.append((node.end_lineno, node.end_col_offset, node.func.id))
        stack.extend(ast.iter_child_nodes(node))
    return [name for _, _, name in sorted(found)]


def run_all_stop(nb, exercises: list[dict]) -> dict | None:
    """Where Run All on the exercise copy first raises ``NotImplementedError``, read from the
    code: a stub in a cell's top-level code, or the first top-level call of an exercise's
    function or class (a check given the function itself catches the stub and reports it).
    ``{"cell": index, "name": exercise}``, or None: Run All runs to the end."""
    tops = {e["name"].split(".")[0]: e for e in exercises}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        here = [e for e in exercises if e["cell"] == index]
        if any(e["name"] == "top-level code" for e in here):
            return {"cell": index, "name": "top-level code"}
        for name in _top_level_calls(parse_cell(cell.source)):
            if name in tops and tops[name]["cell"] <= index:
                return {"cell": index, "name": name}
    return None


def proof_cells(nb) -> list[int]:
    """Code cells that prove an answer the copies drop: those under a "Check yourself" heading,
    and those under an ungraded drill question (a heading tagged answer-space, notebook 11)."""
    drill, in_drill = set(), False
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"):
            in_drill = ANSWER_SPACE_TAG in cell.metadata.get("tags", [])
        elif cell.cell_type == "code" and in_drill and "### PREDICTION" not in cell.source:
            drill.add(index)  # a prediction's answer cell stays open: the learner types in it
    return [index for index, section, _ in cell_sections(nb)
            if nb.cells[index].cell_type == "code"
            and (section.lower().startswith("check yourself") or index in drill)]


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
