"""The project's Lab as `make lab` starts it, seen in headless Chromium (issue 22, items 7-8).

JupyterLab runs on a temporary copy of the project with `my-work/` filled by
``labkit/course/exercises.py --fill`` and the flags of `make lab`. A learner must land in
`my-work/`, an exercise copy must open unmodified, and no "Jupyter news" question may appear
when the override `make setup` installs is in place. Needs Debian's chromium and playwright.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

playwright = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[1]
from labkit.course import exercises as mx  # noqa: E402
from labkit.course import layout  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
OVERRIDES = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
PROJECT_OVERRIDES = ROOT / "tools" / "jupyterlab" / "overrides.json"
NAME = "05_masks.ipynb"

PANEL_DIRTY_JS = """
(path) => {
  for (const w of window.jupyterapp.shell.widgets('main')) {
    if (w.context && w.context.path === path) return w.context.model.dirty;
  }
  return null;
}
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip("no chromium")
    work = tmp_path_factory.mktemp("lab")
    project = work / "project"
    (project / "notebooks").mkdir(parents=True)
    for path in layout.solved_notebooks(ROOT):
        shutil.copy(path, project / "notebooks" / path.name)
    mx.fill_work(project / layout.WORK_DIR, ROOT)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(work / "config"),
               JUPYTER_RUNTIME_DIR=str(work / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"))
    env.pop("MPLBACKEND", None)
    port, token = _free_port(), secrets.token_hex(16)
    log = open(work / "lab.log", "w")
    proc = subprocess.Popen(  # the flags of `make lab`, plus what the test needs
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={project}", f"--LabApp.default_url=/lab/tree/{layout.WORK_DIR}",
         "--LabApp.expose_app_in_browser=True"]
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
def page(lab):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)
        yield page
        browser.close()


def test_lab_opens_in_the_learners_folder(lab, page):
    base, token = lab
    page.goto(f"{base}/?reset&token={token}")  # what `make lab`'s printed URL opens
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined")
    page.wait_for_selector(f".jp-DirListing-item[title*='{NAME}']")
    assert f"/lab/tree/{layout.WORK_DIR}" in page.url
    crumbs = page.locator(".jp-BreadCrumbs").first.inner_text()
    assert layout.WORK_DIR in crumbs, crumbs


def test_exercise_copy_opens_unmodified(lab, page):
    base, token = lab
    path = f"{layout.WORK_DIR}/{NAME}"
    page.goto(f"{base}/lab/tree/{path}?reset&token={token}")
    page.wait_for_function(f"() => ({PANEL_DIRTY_JS})({json.dumps(path)}) !== null")
    page.wait_for_function("""(path) => {
      for (const w of window.jupyterapp.shell.widgets('main')) {
        if (w.context && w.context.path === path)
          return w.sessionContext.session && w.sessionContext.session.kernel
                 && w.sessionContext.session.kernel.info !== undefined;
      }
      return false; }""", arg=path)
    time.sleep(5)  # JupyterLab marked the old copies modified about 2 s after the kernel came up
    assert page.evaluate(PANEL_DIRTY_JS, path) is False


def test_no_news_question(lab, page):
    if not OVERRIDES.exists() or json.loads(OVERRIDES.read_text()) != json.loads(
            PROJECT_OVERRIDES.read_text()):
        pytest.skip(f"{OVERRIDES} is not the project's override: run make setup")
    base, token = lab
    page.goto(f"{base}/lab/tree/{layout.WORK_DIR}?reset&token={token}")
    page.wait_for_selector(f".jp-DirListing-item[title*='{NAME}']")
    time.sleep(5)
    assert "Jupyter news" not in page.locator("body").inner_text()
