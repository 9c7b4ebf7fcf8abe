"""The JupyterLab start-up every browser test shares: a server on 127.0.0.1 over a folder,
and headless Chromium (Debian's chromium, driven by playwright; no `playwright install`)."""
from __future__ import annotations

import contextlib
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

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROME_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
START_S = 120  # a busy machine starts JupyterLab slowly


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _jupyterlab(work: Path, root_dir: Path, args=(), settings: dict | None = None):
    """A JupyterLab server over ``root_dir`` with its config, runtime, settings and workspaces
    in ``work``; yields (base URL, token) and stops the server afterwards.

    ``settings``: {"@jupyterlab/notebook-extension:tracker": {...}, ...}, written as the user
    settings of those plugins; ``args``: more command-line flags (``make lab``'s, for one).
    """
    for plugin, values in (settings or {}).items():
        package, _, name = plugin.partition(":")
        target = work / "settings" / package / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(work / "config"),
               JUPYTER_RUNTIME_DIR=str(work / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"))
    env.pop("MPLBACKEND", None)
    port, token = _free_port(), secrets.token_hex(16)
    log_path = work / "lab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root_dir}", "--LabApp.expose_app_in_browser=True", *args]
        + (["--allow-root"] if os.geteuid() == 0 else []),
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + START_S
    try:
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    log.flush()
                    pytest.fail("JupyterLab did not start:\n" + log_path.read_text()[-3000:])
                time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def start_lab():
    """``with start_lab(work, root_dir, args=..., settings=...) as (base, token): ...``"""
    return _jupyterlab


@pytest.fixture(scope="session")
def require_chromium():
    """Fails (not skips) without chromium: `make test-browser` exists to run these tests."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"chromium not found at {CHROMIUM}: apt-get install chromium")


@pytest.fixture(scope="module")
def browser(require_chromium):
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROME_ARGS)
        yield b
        b.close()
