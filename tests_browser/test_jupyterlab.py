"""Every solved notebook, run for real in JupyterLab in headless Chromium.

Starts JupyterLab on 127.0.0.1 over a temporary copy of the notebooks, opens each
one, runs all cells through JupyterLab's own command, and fails on any error
output outside cells tagged ``raises-exception`` (the pitfall cells). Then it
moves an ipywidgets slider and checks that the figure below it changes.
Run with ``make test-browser``; needs Debian's chromium and Python playwright.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

playwright = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
# Limits follow progress, not the clock: Run All fails only when no cell has finished for
# CELL_TIMEOUT_MS (a busy machine makes every cell slower, not stuck), or when the kernel sits
# idle for STALL_MS with cells still queued (a lost message). TOTAL_MS only stops a run that
# never ends.
CELL_TIMEOUT_MS = int(os.environ.get("TX_BROWSER_CELL_TIMEOUT_MS", "300000"))
TOTAL_MS = int(os.environ.get("TX_BROWSER_TOTAL_MS", "2400000"))
STALL_MS = 20_000
RUN_TIMEOUT_MS = CELL_TIMEOUT_MS  # playwright's own waits (page loads, widgets)

# The notebook panel open on `path`. Not simply shell.currentWidget: a page may also restore
# notebooks opened by an earlier page, and Run All must run the one under test.
FIND_PANEL_JS = """
(path) => {
  const app = window.jupyterapp;
  if (!app) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.sessionContext) return w;
  }
  return null;
}
"""

RUN_ALL_JS = """
async ([path, cellTimeoutMs, totalMs, stallMs, restart]) => {
  const app = window.jupyterapp;
  const panel = (""" + FIND_PANEL_JS + """)(path);
  app.shell.activateById(panel.id);  // Run All acts on the current notebook
  if (app.shell.currentWidget !== panel) throw new Error('could not focus ' + path);
  const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
  await panel.context.ready;
  await panel.sessionContext.ready;
  if (restart) await panel.sessionContext.session.kernel.restart();
  const kernel = panel.sessionContext.session.kernel;
  await kernel.info;  // the kernel has answered kernel_info: it is really up
  for (const t0 = Date.now(); kernel.status !== 'idle' && Date.now() - t0 < 60000;) {
    await sleep(200);
  }
  // Never hang: give up when no cell has finished for cellTimeoutMs, when the kernel sits idle
  // while cells are still queued (an execution reply lost between the kernel and the page), or
  // after totalMs in all.
  const cells = panel.content.model.cells;
  const finishedCells = () => {
    let n = 0;
    for (let i = 0; i < cells.length; i++) {
      const cell = cells.get(i);
      if (cell.type === 'code' && cell.executionCount !== null) n++;
    }
    return n;
  };
  let done = false;
  const began = Date.now();
  app.commands.execute('notebook:run-all-cells').then(() => { done = true; });
  let outcome = 'timeout', idleSince = null, lastCount = -1, lastProgress = Date.now();
  while (Date.now() - began < totalMs) {
    await sleep(250);
    if (done) { outcome = 'finished'; break; }
    const count = finishedCells();
    if (count !== lastCount) { lastCount = count; lastProgress = Date.now(); }
    if (Date.now() - lastProgress > cellTimeoutMs) { outcome = 'no progress'; break; }
    if (kernel.status !== 'idle') { idleSince = null; continue; }
    idleSince = idleSince ?? Date.now();
    if (Date.now() - idleSince > stallMs) { outcome = 'stalled'; break; }
  }
  const out = [];
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') continue;
    const outputs = cell.outputs.toJSON();
    out.push({
      index: i,
      tags: cell.getMetadata('tags') || [],
      count: cell.executionCount,
      errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
    });
  }
  return {outcome: outcome, kernel: kernel.status, seconds: (Date.now() - began) / 1000,
          cells: out};
}
"""

SHUTDOWN_JS = """
async (path) => { await (""" + FIND_PANEL_JS + """)(path).sessionContext.shutdown(); }
"""

LAST_IMAGE_JS = """
(cell) => {
  const imgs = cell.querySelectorAll('.jp-OutputArea-output img');
  return imgs.length ? imgs[imgs.length - 1].getAttribute('src') : null;
}
"""

WIDGETS_READY_JS = """
() => document.querySelectorAll('.widget-slider .noUi-handle').length > 0
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory, start_lab, require_chromium):
    """A JupyterLab server on 127.0.0.1 over a copy of the notebooks."""
    work = tmp_path_factory.mktemp("lab")
    nb_dir = work / "notebooks"
    nb_dir.mkdir()
    for nb in NOTEBOOKS:
        shutil.copy(nb, nb_dir / nb.name)
    # Render every cell (no windowing), so off-screen widgets exist in the DOM.
    tracker = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}
    with start_lab(work, nb_dir, settings=tracker,
                   args=["--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
                   ) as server:
        yield server


def _open(browser, lab, name):
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(RUN_TIMEOUT_MS)
    page.goto(f"{base}/lab/tree/{name}?reset&token={token}")  # reset: a fresh workspace
    page.wait_for_function(f"() => ({FIND_PANEL_JS})({json.dumps(name)}) !== null")
    return page


def _run_all(page, name):
    """Run All; after a stall or a timeout, restart the kernel and run once more."""
    run = page.evaluate(RUN_ALL_JS, [name, CELL_TIMEOUT_MS, TOTAL_MS, STALL_MS, False])
    if os.environ.get("TX_BROWSER_DEBUG"):
        print(name, run["outcome"], run["kernel"], run["seconds"],
              [(c["index"], c["count"]) for c in run["cells"]])
    if run["outcome"] != "finished":
        first = run["outcome"]
        run = page.evaluate(RUN_ALL_JS, [name, CELL_TIMEOUT_MS, TOTAL_MS, STALL_MS, True])
        if run["outcome"] == "finished":
            warnings.warn(f"{name}: Run All {first} once, then finished after a kernel restart",
                          stacklevel=1)
    cells = run["cells"]
    assert cells, f"{name}: no code cells found"
    if run["outcome"] != "finished":
        pending = [c["index"] for c in cells if c["count"] is None]
        pytest.fail(f"{name}: Run All {run['outcome']} twice (no cell finished for "
                    f"{CELL_TIMEOUT_MS} ms, or idle {STALL_MS} ms, or {TOTAL_MS} ms in all; "
                    f"{run['seconds']:.0f} s); kernel {run['kernel']}; cells without an "
                    f"execution count: {pending}")
    return cells


def _close(page, name):
    try:
        page.evaluate(SHUTDOWN_JS, name)  # one kernel at a time: earlier kernels do not linger
    finally:
        page.close()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab(browser, lab, notebook):
    page = _open(browser, lab, notebook.name)
    try:
        cells = _run_all(page, notebook.name)
    finally:
        _close(page, notebook.name)
    # Run All on a fresh kernel numbers the code cells 1, 2, 3, ... in order; a count kept from
    # the saved file, or a gap, means a cell did not run here.
    # An error stops Run All, so it is reported first: the counts after it only say "not run".
    errors = [(c["index"], c["errors"]) for c in cells
              if c["errors"] and "raises-exception" not in c["tags"]]
    assert not errors, f"{notebook.name}: error outputs in the browser: {errors}"
    counts = [c["count"] for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{notebook.name}: execution counts are not 1..{len(cells)} in order: "
        f"{[(c['index'], c['count']) for c in cells]}")


def test_widget_slider_redraws_figure(browser, lab):
    with_widgets = [nb for nb in NOTEBOOKS if "interact(" in nb.read_text()]
    if not with_widgets:
        pytest.skip("no notebook has an ipywidgets interact yet")
    page = _open(browser, lab, with_widgets[0].name)
    try:
        _run_all(page, with_widgets[0].name)
        page.wait_for_function(WIDGETS_READY_JS)
        slider = page.locator(".widget-slider").first
        cell = slider.locator("xpath=ancestor::div[contains(@class, 'jp-CodeCell')]").first
        cell_el = cell.element_handle()
        before = page.evaluate(LAST_IMAGE_JS, cell_el)
        assert before, "the widget cell shows no figure before the slider moves"
        handle = slider.locator(".noUi-handle").first
        handle.scroll_into_view_if_needed()
        handle.focus()
        for _ in range(3):
            handle.press("ArrowRight")
        page.wait_for_function(
            f"([cell, src]) => {{ const now = ({LAST_IMAGE_JS})(cell);"
            " return now && now !== src; }",
            arg=[cell_el, before])
    finally:
        _close(page, with_widgets[0].name)
