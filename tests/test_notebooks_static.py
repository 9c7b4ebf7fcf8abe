"""Static checks on the solved notebooks: what a learner opening the file meets.

nbval (in ``make test``) re-executes the notebooks; these checks cover the
conventions that execution alone cannot see.
"""
from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
HYGIENE = ROOT.parent / "shared" / "tools" / "nbhygiene.py"
MAX_PNG_WIDTH = 1400  # pixels; about 100 dpi figures stay well below this


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def _src(cell):
    return "".join(cell.get("source", ""))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_structure(path):
    nb = _load(path)
    cells = nb["cells"]
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    first = _src(cells[0])
    assert cells[0]["cell_type"] == "markdown" and first.startswith("# "), "title cell first"
    assert "what you will learn" in first.lower(), "objectives in the first cell"
    text = "\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
    assert "## Check yourself" in text, "a Check yourself section"
    assert "<details>" in text, "answers hidden in <details>"
    assert "tx.setup(" in "".join(_src(c) for c in cells if c["cell_type"] == "code"), \
        "the shared preamble tx.setup() is called"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_pitfalls_print_their_errors(path):
    """Pitfall cells use ``with tx.expect_error(...)``, never a stored traceback.

    A stored error output leaks local paths and stops JupyterLab's Run All.
    """
    for i, cell in enumerate(_load(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert "NBVAL_RAISES_EXCEPTION" not in _src(cell), f"cell {i}: use tx.expect_error"
        errors = [o for o in cell.get("outputs", []) if o["output_type"] == "error"]
        assert not errors, f"cell {i}: stored error output {errors[0]['ename']}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_outputs_are_clean_and_small(path):
    for i, cell in enumerate(_load(path)["cells"]):
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                assert out["name"] == "stdout" or "NBVAL_IGNORE_OUTPUT" in _src(cell), \
                    f"cell {i}: stderr output (a warning?) would fail nbval on another machine"
            png = out.get("data", {}).get("image/png")
            if png:
                raw = base64.b64decode(png)
                width = struct.unpack(">I", raw[16:20])[0]
                assert width <= MAX_PNG_WIDTH, f"cell {i}: figure {width}px wide; keep ~100 dpi"


def test_readme_lists_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in NOTEBOOKS if f"(notebooks/{p.name})" not in readme]
    assert not missing, f"README notebook table lacks {missing}"


@pytest.mark.skipif(not HYGIENE.exists(), reason="shared/tools/nbhygiene.py not beside the clone")
def test_nbhygiene_clean():
    res = subprocess.run([sys.executable, str(HYGIENE)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
