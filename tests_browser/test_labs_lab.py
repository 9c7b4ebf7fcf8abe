"""The project's Lab as `make lab` starts it, seen in headless Chromium (issue 22, items 7-8).

JupyterLab runs on a temporary copy of the project with `my-work/` filled by
``labkit/course/exercises.py --fill`` and the flags of `make lab`. A learner must land in
`my-work/`, an exercise copy must open unmodified, and no "Jupyter news" question may appear
when the override `make setup` installs is in place. Needs Debian's chromium and playwright.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

playwright = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[1]
from labkit.course import exercises as mx  # noqa: E402
from labkit.course import layout  # noqa: E402

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


@pytest.fixture(scope="module")
def lab(tmp_path_factory, start_lab, require_chromium):
    work = tmp_path_factory.mktemp("lab")
    project = work / "project"
    (project / "notebooks").mkdir(parents=True)
    for path in layout.solved_notebooks(ROOT):
        shutil.copy(path, project / "notebooks" / path.name)
    mx.fill_work(project / layout.WORK_DIR, ROOT)
    # the flags of `make lab`, plus what the test needs
    with start_lab(work, project, args=[f"--LabApp.default_url=/lab/tree/{layout.WORK_DIR}"]
                   ) as server:
        yield server


@pytest.fixture(scope="module")
def page(lab, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)
    yield page
    page.close()


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
