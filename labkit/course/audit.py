#!/usr/bin/env python3
"""The bar of issue 29, counted per exercise copy: written questions, predictions whose
answer is visible before the learner's answer cell, hint tiers that are nearly the code, and
the labs (exercises) with the checks that mark them.

  python -m labkit.course.audit            # one row per notebook; exit 0 (a report)
  python -m labkit.course.audit --strict   # exit 1 when an answer is visible or a hint is code

A prediction's expected value is the value its ``### PREDICTION`` line holds in the solved
notebook. It counts as visible when a cell the learner sees before the answer cell shows it:
the cell's markdown (answers dropped, as in the copy), its code unless collapsed, or what it
printed in the solved notebook (the learner sees the same output on running it). Values too
common to mean anything (numbers under 100, one-word strings in prose, booleans) are only
looked for in printed output lines of the form ``label: value`` / ``label = value``.
A hint tier is nearly the code when the code tokens of its backticked or fenced code cover
more than ``HINT_COVER`` of the distinct tokens of its exercise's solution region.
"""
from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import nbformat

from labkit.course.labinfo import is_prediction_grader, lab_info
from labkit.course.layout import ROOT, solved_notebooks
from labkit.course.markup import DETAILS_TAG, is_teacher_only, strip_answers
from labkit.course.regions import find_regions, solution_code, strip_hidden_tests

HINT_COVER = 0.6
HINT_SUMMARY = re.compile(r"<summary\b[^>]*>\s*(?P<tier>Hint[^<]*)</summary\s*>(?P<body>.*?)"
                          r"</details\s*>", re.IGNORECASE | re.DOTALL)
CODE = re.compile(r"```[^\n]*\n(?P<fence>.*?)```|`(?P<inline>[^`\n]+)`", re.DOTALL)
PUNCTUATION = set("()[]{},:.;")


# ---------------------------------------------------------------- predictions


def _forms(value_source: str) -> tuple[list[str], bool]:
    """(texts that show the value, whether it is specific enough to look for anywhere)."""
    try:
        value = ast.literal_eval(value_source)
    except (ValueError, SyntaxError):
        return [value_source.strip()], len(value_source.strip()) >= 4
    if isinstance(value, bool) or value is None:
        return [], False
    if isinstance(value, (tuple, list)):
        inner = ",".join(str(v) for v in value)
        return [f"({inner})", f"[{inner}]"], len(value) >= 2
    if isinstance(value, (int, float)):
        text = f"{value:g}" if isinstance(value, float) else str(value)
        forms = [text] + ([f"{value:,}"] if isinstance(value, int) and abs(value) >= 1000 else [])
        return forms, abs(value) >= 100 or (isinstance(value, float) and value != int(value))
    text = str(value)
    return [text], False  # a word: the prose uses words; only a printed "label: word" counts


def _shows(text: str, forms: list[str], specific: bool) -> bool:
    squeezed = re.sub(r"\s+", "", text)
    for form in forms:
        if form.startswith(("(", "[")):
            if form.replace(" ", "") in squeezed:
                return True
            continue
        pattern = rf"(?<![\w.]){re.escape(form)}(?![\w]|\.\d)"
        if specific and re.search(pattern, text):
            return True
        if re.search(rf"^[^\n]*[:=]\s*['\"]?{re.escape(form)}['\"]?\s*$", text,
                     re.MULTILINE | re.IGNORECASE):
            return True
    return False


def _printed(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append("".join(o.get("text", "")))
        elif o.get("output_type") in ("execute_result", "display_data"):
            out.append("".join(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def visible_answers(solved) -> list[dict]:
    """Predictions whose expected value a cell of the exercise copy shows before the
    learner's answer cell. ``solved`` is the solved notebook: its outputs are what running a
    cell prints; the copy keeps what is not teacher-only and collapses the prediction grading
    and Check-yourself proof cells, as :func:`make_exercise` does. Folded ``<details>`` blocks
    count too (a learner opens them): before the answer cell when they show the value, and
    between the answer cell and its grading cell whatever they hold (the learner is told to
    run the grading cell next, so a fold there is read as the answer)."""
    info = lab_info(solved)
    found = []
    for p in info["predictions"]:
        forms, specific = _forms(p["value"])
        hit_at = None
        for index in range(p["cell"] if forms else 0):
            cell = solved.cells[index]
            if is_teacher_only(cell):
                continue  # not in the copy
            if cell.cell_type == "markdown":
                text = strip_answers(cell.source)
                hit = specific and _shows(text, forms, True)
                where = "text" if hit and _shows(_without_details(text), forms, True) \
                    else "folded block"
            else:
                where = "output"
                hit = _shows(_printed(cell), forms, specific)
                folded = is_prediction_grader(cell.source) or index in info["proof_cells"]
                if not hit and not folded and specific:
                    where = "code"
                    hit = _shows(strip_hidden_tests(cell.source), forms, True)
            if hit:
                hit_at = (index, where)
                break
        if hit_at is None:
            hit_at = _before_grading(solved, p, forms, specific)
        if hit_at is not None:
            found.append({"prediction": p["name"], "value": p["value"], "cell": hit_at[0],
                          "where": hit_at[1]})
    return found


def _before_grading(solved, p, forms, specific):
    """(cell, where) of the first markdown between a prediction's answer cell and its grading
    cell that shows the value or holds a folded block other than a hint tier, else None."""
    for index in range(p["cell"] + 1, p.get("check_cell", p["cell"] + 1)):
        cell = solved.cells[index]
        if cell.cell_type != "markdown" or is_teacher_only(cell):
            continue
        text = strip_answers(cell.source)
        if forms and specific and _shows(text, forms, True):
            return index, "text before the grading cell"
        summaries = re.findall(r"<summary\b[^>]*>\s*([^<]*)", text, re.IGNORECASE)
        if any(not s.startswith("Hint") for s in summaries):
            return index, "folded block before the grading cell"
    return None


def _without_details(text: str) -> str:
    """Markdown as it opens: folded ``<details>`` blocks (hints, asides) do not show."""
    depth, out, pos = 0, [], 0
    for m in DETAILS_TAG.finditer(text):
        if depth == 0:
            out.append(text[pos:m.start()])
        depth += -1 if m.group(0).startswith("</") else 1
        pos = m.end()
    out.append(text[pos:] if depth == 0 else "")
    return "".join(out)


# ---------------------------------------------------------------- hints


def code_tokens(text: str) -> set[str]:
    """Names, numbers, strings and operators of a piece of code (no brackets or commas)."""
    out: set[str] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.OP) \
                    and tok.string not in PUNCTUATION:
                out.add(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        out |= set(re.findall(r"[A-Za-z_]\w*|\d+(?:\.\d+)?|[-+*/@=<>!&|~]+", text))
    return out


def hint_tiers(markdown: str) -> list[tuple[str, set[str]]]:
    """(tier summary, code tokens of its backticked and fenced code) for each hint tier."""
    tiers = []
    for m in HINT_SUMMARY.finditer(markdown):
        code = [c.group("fence") or c.group("inline") for c in CODE.finditer(m.group("body"))]
        tiers.append((m.group("tier").strip(), set().union(*map(code_tokens, code))))
    return tiers


def copying_hints(solved) -> list[dict]:
    """Hint tiers whose code covers more than HINT_COVER of their region's tokens."""
    found = []
    for index, cell in enumerate(solved.cells):
        if cell.cell_type != "code" or not find_regions(cell.source):
            continue
        region_tokens = set().union(*(code_tokens(solution_code(cell.source, r))
                                      for r in find_regions(cell.source)))
        hints = next((c for c in solved.cells[index + 1:] if c.cell_type == "markdown"), None)
        if hints is None or not region_tokens:
            continue
        for tier, tokens in hint_tiers(hints.source):
            cover = len(tokens & region_tokens) / len(region_tokens)
            if cover > HINT_COVER:
                found.append({"cell": index, "tier": tier, "cover": round(cover, 2)})
    return found


# ---------------------------------------------------------------- the table


def audit(solved, name: str) -> dict:
    info = lab_info(solved)
    checks = sorted({c["check"] for c in info["checks"]})
    return {"notebook": name, "written": len(info["written"]),
            "visible": visible_answers(solved), "hints": copying_hints(solved),
            "exercises": [e["name"] for e in info["exercises"]], "checks": checks}


def table(rows: list[dict]) -> str:
    lines = ["| Copy | Written | Visible answers | Hints nearly the code | Exercises | Checks |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        visible = "; ".join(f"{v['prediction']} ({v['where']}, cell {v['cell']})"
                            for v in r["visible"])
        hints = "; ".join(f"cell {h['cell']} {h['tier']} ({h['cover']:.0%})" for h in r["hints"])
        lines.append(f"| {r['notebook']} | {r['written']} | {len(r['visible'])}"
                     f"{': ' + visible if visible else ''} | {len(r['hints'])}"
                     f"{': ' + hints if hints else ''} | {len(r['exercises'])} | "
                     f"{', '.join(r['checks']) or 'none'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a copy shows an answer or a hint is nearly the code")
    args = parser.parse_args(argv)
    rows = [audit(nbformat.read(p, as_version=4), p.name) for p in solved_notebooks(args.root)]
    print(table(rows))
    bad = sum(len(r["visible"]) + len(r["hints"]) for r in rows)
    return 1 if args.strict and bad else 0


if __name__ == "__main__":
    sys.exit(main())
