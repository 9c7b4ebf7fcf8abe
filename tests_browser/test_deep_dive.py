"""A deep dive opens folded in JupyterLab 4 (docs/CONVENTIONS.md, "The course path").

The heading cell of a deep dive carries ``"jp-MarkdownHeadingCollapsed": true``: JupyterLab
must open the notebook with every cell after it hidden, up to the next heading of the same or
a higher level, behind a "cells hidden" button; the cells still run under Run All. The
notebook is a small fixture written here, so the test does not depend on the course's
notebooks. Needs Debian's chromium and playwright (`make test-browser`).
"""
from __future__ import annotations

import json

import nbformat
import pytest

pytest.importorskip("playwright.sync_api")

NAME = "deep_dive_fixture.ipynb"
# (cell type, source, folded heading?, hidden on opening?)
CELLS = [
    ("markdown", "# A notebook with a deep dive", False, False),
    ("code", "core = 1", False, False),
    ("markdown", "## Deep dive: what is folded", True, False),
    ("markdown", "Text of the deep dive.", False, True),
    ("code", "inside = 2", False, True),
    ("markdown", "### A heading one level lower, inside the deep dive", False, True),
    ("code", "also_inside = 3", False, True),
    ("markdown", "## The next section", False, False),
    ("code", "after = core + inside + also_inside", False, False),
]

CELLS_JS = """
([path, count]) => {
  if (!window.jupyterapp) return null;  // JupyterLab has not started yet: poll again
  for (const w of window.jupyterapp.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.context.isReady
        && w.content.widgets.length === count)
      return w.content.widgets.map(c => ({hidden: c.isHidden, type: c.model.type,
                                          count: c.model.type === 'code'
                                            ? c.model.executionCount : null}));
  }
  return null;
}
"""

ARG = json.dumps([NAME, len(CELLS)])

RUN_ALL_JS = """
async (path) => {
  const app = window.jupyterapp;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path) {
      app.shell.activateById(w.id);
      await w.sessionContext.ready;
      await app.commands.execute('notebook:run-all-cells');
      return true;
    }
  }
  return false;
}
"""


def _fixture_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    for kind, source, folded, _ in CELLS:
        cell = (nbformat.v4.new_markdown_cell(source) if kind == "markdown"
                else nbformat.v4.new_code_cell(source))
        if folded:
            cell.metadata["jp-MarkdownHeadingCollapsed"] = True
        nb.cells.append(cell)
    return nb


@pytest.fixture(scope="module")
def lab(tmp_path_factory, start_lab, require_chromium):
    work = tmp_path_factory.mktemp("deep-dive")
    folder = work / "notebooks"
    folder.mkdir()
    nbformat.write(_fixture_notebook(), folder / NAME)
    # every cell rendered (no windowing), so the hidden-cells button is in the DOM
    tracker = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}
    with start_lab(work, folder, settings=tracker) as server:
        yield server


def test_a_deep_dive_opens_folded_and_still_runs(lab, browser):
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)
    try:
        page.goto(f"{base}/lab/tree/{NAME}?reset&token={token}")
        page.wait_for_function(f"() => ({CELLS_JS})({ARG}) !== null")
        page.wait_for_selector(".jp-showHiddenCellsButton")  # the fold is drawn
        cells = page.evaluate(CELLS_JS, [NAME, len(CELLS)])
        assert [c["type"] for c in cells] == [kind for kind, *_ in CELLS]
        hidden = [c["hidden"] for c in cells]
        assert hidden == [h for *_, h in CELLS], (
            "hidden on opening, per cell: " + ", ".join(
                f"{i}: {h} (want {want})" for i, (h, (*_, want)) in
                enumerate(zip(hidden, CELLS, strict=True))))
        button = page.locator(".jp-showHiddenCellsButton")
        assert button.count() == 1, "no 'cells hidden' button under the folded heading"
        assert "4 cells hidden" in button.first.inner_text()

        assert page.evaluate(RUN_ALL_JS, NAME)
        page.wait_for_function(
            f"() => ({CELLS_JS})({ARG}).every(c => c.type !== 'code' || c.count)")
        after = page.evaluate(CELLS_JS, [NAME, len(CELLS)])
        counts = [c["count"] for c in after if c["type"] == "code"]
        assert counts == [1, 2, 3, 4], counts  # the folded cells ran, in order
        assert [c["hidden"] for c in after] == hidden  # Run All does not unfold the section

        button.first.click()
        page.wait_for_function(
            f"() => ({CELLS_JS})({ARG}).every(c => !c.hidden)")
    finally:
        page.close()
