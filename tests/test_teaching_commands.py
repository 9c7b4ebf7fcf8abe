"""Every shell command that docs/teaching.md and docs/nbgrader.md show runs (issue 23, item 5).

A teacher copies these lines into a fresh shell, where the project's virtual environment is
not active, so they run here with the venv's bin folder taken off PATH: a bare ``python
labkit/course/grade.py`` that only works inside the venv fails this test (it did: "No module named
'nbformat'"). Fenced blocks marked ``sh``, ``bash``, ``console`` or unmarked are run as bash
scripts from the repository root, with placeholders pointed at a temporary folder
(``submissions/`` gets one small learner notebook; ``grades.csv`` and ``course`` go to the
temporary folder). Targets that open a server or take minutes (``make lab``, ``make test``,
``make notebooks``, ...) are only checked with ``make -n``. The nbgrader round trip (the block
with ``nbgrader autograde``) runs in tests/test_nbgrader.py, with three submissions to grade.
"""
import os
import subprocess
from pathlib import Path

import doc_shell
import nbformat
import pytest
from doc_shell import DOCS, ROOT, shell_blocks

if os.environ.get("TX_TEACHER_TESTS") != "1":
    pytest.skip("run by `make test-teacher` (TX_TEACHER_TESTS=1): it runs make targets and "
                "the grader, minutes of work that make test need not repeat",
                allow_module_level=True)

CASES = [(doc.name, block) for doc in DOCS if doc.exists() for block in shell_blocks(doc)
         if "nbgrader autograde" not in block]  # tests/test_nbgrader.py runs that round trip


def _learner_notebook(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    code = ("import torch\nimport tx_helpers as tx\n\n"
            "def lookahead_mask(size):\n"
            "    return torch.triu(torch.ones(size, size, dtype=torch.bool), diagonal=0)\n")
    cell = nbformat.v4.new_code_cell(code)
    cell.metadata["tx_exercise"] = [{"number": 1, "name": "lookahead_mask",
                                     "section": "Masks"}]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, folder / "alice_05.ipynb")


@pytest.mark.parametrize("doc, block", CASES, ids=[f"{d}:{b.split(chr(10))[0][:40]}"
                                                   for d, b in CASES])
def test_documented_command_runs_in_a_fresh_shell(doc, block, tmp_path):
    if "nbgrader" in block:
        pytest.importorskip("nbgrader", reason="nbgrader is not installed: `make "
                            "test-teacher` installs requirements-teacher.txt")
    _learner_notebook(tmp_path / "submissions")
    script = doc_shell.script(block, tmp_path)
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, env=doc_shell.fresh_shell_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (f"{doc} shows a command that fails in a fresh shell:\n"
                                  f"{script}\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n"
                                  f"{proc.stderr[-2000:]}")


def test_the_docs_show_commands():
    assert any(d == "nbgrader.md" for d, _ in CASES)
    assert any("make grade" in b for _, b in CASES)
    assert any("nbgrader autograde" in b for b in shell_blocks(DOCS[1]))
