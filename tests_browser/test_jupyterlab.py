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
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

playwright = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROME_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_TIMEOUT_MS = 300_000

RUN_ALL_JS = """
async (timeoutMs) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  await panel.context.ready;
  await panel.sessionContext.ready;
  // Never hang the test run: give up after the timeout and report what ran.
  const ran = app.commands.execute('notebook:run-all-cells').then(() => true);
  const timer = new Promise(resolve => setTimeout(() => resolve(false), timeoutMs));
  const finished = await Promise.race([ran, timer]);
  const cells = panel.content.model.cells;
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
      finished: finished,
    });
  }
  return out;
}
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 over a copy of the notebooks."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"chromium not found at {CHROMIUM}: apt-get install chromium")
    work = tmp_path_factory.mktemp("lab")
    nb_dir = work / "notebooks"
    nb_dir.mkdir()
    for nb in NOTEBOOKS:
        shutil.copy(nb, nb_dir / nb.name)
    # Render every cell (no windowing), so off-screen widgets exist in the DOM.
    settings = work / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(work / "config"),
               JUPYTER_RUNTIME_DIR=str(work / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"))
    env.pop("MPLBACKEND", None)
    port, token = _free_port(), secrets.token_hex(16)
    log = open(work / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={nb_dir}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--allow-root"] if os.geteuid() == 0 else []),
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                log.close()
                pytest.fail("JupyterLab did not start:\n" + (work / "lab.log").read_text()[-3000:])
            time.sleep(0.5)
    yield base, token
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROME_ARGS)
        yield b
        b.close()


def _open(browser, lab, name):
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(RUN_TIMEOUT_MS)
    page.goto(f"{base}/lab/tree/{name}?token={token}")
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext")
    return page


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab(browser, lab, notebook):
    page = _open(browser, lab, notebook.name)
    try:
        cells = page.evaluate(RUN_ALL_JS, RUN_TIMEOUT_MS)
    finally:
        page.close()
    assert cells, f"{notebook.name}: no code cells found"
    assert cells[0]["finished"], f"{notebook.name}: Run All did not finish in {RUN_TIMEOUT_MS} ms"
    not_run = [c["index"] for c in cells if c["count"] is None]
    assert not not_run, f"{notebook.name}: cells never ran: {not_run}"
    errors = [(c["index"], c["errors"]) for c in cells
              if c["errors"] and "raises-exception" not in c["tags"]]
    assert not errors, f"{notebook.name}: error outputs in the browser: {errors}"


def test_widget_slider_redraws_figure(browser, lab):
    with_widgets = [nb for nb in NOTEBOOKS if "interact(" in nb.read_text()]
    if not with_widgets:
        pytest.skip("no notebook has an ipywidgets interact yet")
    page = _open(browser, lab, with_widgets[0].name)
    try:
        page.evaluate(RUN_ALL_JS, RUN_TIMEOUT_MS)
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
        page.close()
