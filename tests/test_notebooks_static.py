"""Static checks on the solved notebooks: what a learner opening the file meets.

nbval (in ``make test``) re-executes the notebooks; these checks cover the
conventions that execution alone cannot see.
"""
from __future__ import annotations

import base64
import json
import re
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
                assert out["name"] == "stdout" or \
                    "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []), \
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


DEFECTS = ROOT / "docs" / "defects.md"
DOCUMENTS = [*NOTEBOOKS, *sorted((ROOT / "notebooks" / "exercises").glob("*.ipynb")),
             ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join(_src(c) for c in _load(path)["cells"])
    return path.read_text(encoding="utf-8")


def _cited_defects(text: str) -> set[int]:
    """Every number in 'defect 5', 'defects 1-4', 'defects 5, 7 and 8', 'Defect 10'."""
    cited = set()
    for m in re.finditer(r"\b[Dd]efects? (\d+(?:(?:-|–|, | and )\d+)*)", text):
        for part in re.split(r", | and ", m.group(1)):
            low, _, high = part.replace("–", "-").partition("-")
            cited.update(range(int(low), int(high or low) + 1))
    return cited


def test_defect_table_is_numbered_one_to_n():
    numbers = [int(n) for n in re.findall(r'<a id="defect-(\d+)"></a>', DEFECTS.read_text())]
    assert numbers == list(range(1, len(numbers) + 1)) and numbers, numbers


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.name for p in DOCUMENTS])
def test_every_cited_defect_exists(path):
    known = {int(n) for n in re.findall(r'id="defect-(\d+)"', DEFECTS.read_text())}
    missing = _cited_defects(_prose(path)) - known
    assert not missing, f"{path.name} cites defect(s) {sorted(missing)}, not in docs/defects.md"


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.name for p in DOCUMENTS])
def test_nothing_points_outside_the_repository(path):
    found = re.search(r"\.\./shared|syllabus|/work/|/tmp/", _prose(path), re.I)
    assert not found, f"{path.name} points outside the repository: {found.group(0)!r}"


def test_the_citation_parser_reads_ranges_and_lists():
    assert _cited_defects("defects 1-4, then defects 5, 7 and 8; Defect 10") == \
        {1, 2, 3, 4, 5, 7, 8, 10}
