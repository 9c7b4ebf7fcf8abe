"""The course path: what a learner sees on opening each notebook, its recap card, the cheat sheet.

A learner finishes a notebook's core path in one sitting, so at most 2,000 words of prose are
visible on opening. JupyterLab 4 folds the cells under a heading whose cell metadata has
``jp-MarkdownHeadingCollapsed: true`` (up to the next heading of the same or a higher level),
and ``<details>`` blocks show only their summary; neither counts.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_cheatsheet  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem[:2] for p in NOTEBOOKS]
MAX_VISIBLE_WORDS = 2000
HEADING = re.compile(r"\s*(#{1,6})\s")
DETAILS = re.compile(r"<details>.*?</details>", re.S)
SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.S)


def visible_words(cells: list[dict]) -> int:
    """Words of markdown shown on opening: folded sections and <details> bodies left out."""
    words, fold = 0, None  # fold: the level of the collapsed heading we are under
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        src = "".join(cell["source"])
        m = HEADING.match(src)
        if m:
            level = len(m.group(1))
            if fold is not None and level <= fold:
                fold = None
            if fold is None and cell.get("metadata", {}).get("jp-MarkdownHeadingCollapsed"):
                words += len(src.splitlines()[0].split())  # the heading stays in sight
                fold = level
                continue
        if fold is None:
            shown = DETAILS.sub(lambda d: " ".join(SUMMARY.findall(d.group(0))), src)
            words += len(shown.split())
    return words


def _md(text: str, **metadata) -> dict:
    return {"cell_type": "markdown", "metadata": metadata, "source": text}


def test_the_counter_folds_what_jupyterlab_folds():
    cells = [_md("# Title\nfive words of visible prose"),
             _md("## Deep dive: folded", **{"jp-MarkdownHeadingCollapsed": True}),
             _md("ten hidden words " * 5), _md("### a lower heading inside, still hidden"),
             _md("## Back on the path"),
             _md("one <details><summary>Answer here</summary>hidden words</details> two")]
    # title line 2 + 5, the deep dive's heading 4, "## Back on the path" 5, "one Answer here two" 4
    assert visible_words(cells) == 2 + 5 + 4 + 5 + 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_core_path_fits_one_sitting(path):
    words = visible_words(json.loads(path.read_text(encoding="utf-8"))["cells"])
    assert words <= MAX_VISIBLE_WORDS, (
        f"{path.name} shows {words} words of prose on opening (at most {MAX_VISIBLE_WORDS}): "
        "fold proven material into a '## Deep dive: ...' section (heading metadata "
        "jp-MarkdownHeadingCollapsed: true) or a <details> aside")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_deep_dives_open_folded(path):
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and re.match(r"#{2,4}\s+Deep dive\b", src):
            assert cell.get("metadata", {}).get("jp-MarkdownHeadingCollapsed") is True, \
                f"{path.name} cell {i}: a deep dive's heading must open collapsed"


def test_recap_card_is_read_from_its_own_cell():
    cells = [_md("# 99 · A title"), _md("## Recap card\n**Formulas.** softmax(QK^T / sqrt(d_k)) V"),
             _md("Talk about a ## Recap card inside prose is not a card")]
    assert make_cheatsheet.recap_card(cells) == "**Formulas.** softmax(QK^T / sqrt(d_k)) V"
    two = [_md("## Recap card\n**Formulas.** a\n**The classic mistake.** b")]
    assert make_cheatsheet.recap_card(two) == "**Formulas.** a\n\n**The classic mistake.** b"
    assert make_cheatsheet.recap_card(cells[2:]) is None


def test_cheatsheet_is_up_to_date():
    text = (ROOT / make_cheatsheet.OUT).read_text(encoding="utf-8")
    assert text == make_cheatsheet.cheatsheet(ROOT), \
        "docs/cheatsheet.md is stale: run python tools/make_cheatsheet.py and commit it"


def test_cheatsheet_index_covers_every_question_of_11():
    cells = json.loads((ROOT / "notebooks" / "11_interview_walkthrough.ipynb").read_text())["cells"]
    questions = [m.group(1) for c in cells if c["cell_type"] == "markdown"
                 for m in [make_cheatsheet.QUESTION.match("".join(c["source"]).strip())] if m]
    text = make_cheatsheet.cheatsheet(ROOT)
    assert len(questions) >= 30
    for q in questions:
        assert f"| {q} |" in text, f"{q} of notebook 11 is missing from the cheat sheet's index"


SECTION_REF = re.compile(r"[Nn]otebook (\d\d)(?:'s)?,? \(?(?:its )?sections? (\d+[a-z]?)"
                         r"(?:\s*(?:-|–|and|,)\s*(\d+[a-z]?))?")


def _section_numbers(path: Path) -> set[str]:
    """The numbers and names that start the notebook's headings ("3", "8c", "Deep", ...)."""
    found = set()
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                m = re.match(r"#{1,4}\s+(\S+)", line)
                if m:
                    found.add(m.group(1).rstrip(".:"))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_references_to_other_notebooks_name_sections_that_exist(path):
    """Sections move into deep dives and get renumbered: 'notebook 10, section 9' must exist."""
    sections = {p.stem[:2]: _section_numbers(p) for p in NOTEBOOKS}
    stale = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for m in SECTION_REF.finditer("".join(cell["source"])):
            for number in filter(None, m.groups()[1:]):
                if m.group(1) in sections and number not in sections[m.group(1)]:
                    stale.append(f"cell {i}: {m.group(0)!r} (no section {number} there)")
    assert not stale, f"{path.name} points to sections that do not exist:\n  " + "\n  ".join(stale)
