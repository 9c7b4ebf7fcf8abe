"""Every shell command that docs/teaching.md and docs/nbgrader.md show runs (issue 23, item 5).

A teacher copies these lines into a fresh shell, where the project's virtual environment is
not active, so they run here with the venv's bin folder taken off PATH: a bare ``python
labkit/course/grade.py`` that only works inside the venv fails this test (it did: "No module named
'nbformat'"). Fenced blocks marked ``sh``, ``bash``, ``console`` or unmarked are run as bash
scripts from the repository root, with placeholders pointed at a temporary folder
(``submissions/`` gets one small learner notebook; ``grades.csv`` and ``course`` go to the
temporary folder). Targets that open a server or take minutes (``make lab``, ``make test``,
``make notebooks``, ...) are only checked with ``make -n``.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

if os.environ.get("TX_TEACHER_TESTS") != "1":
    pytest.skip("run by `make test-teacher` (TX_TEACHER_TESTS=1): it runs make targets and "
                "the grader, minutes of work that make test need not repeat",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "docs" / "teaching.md", ROOT / "docs" / "nbgrader.md"]
COMMANDS = ("make", "python", "python3", ".venv/", "../.venv/", "cd ", "nbgrader", "jupyter",
            "source ")
DRY_RUN = ("lab", "test", "test-browser", "test-portability", "test-teacher", "notebooks",
           "exercises", "models", "bench", "ddp-demo", "setup", "clean")


def shell_blocks(path: Path) -> list[str]:
    blocks = re.findall(r"```(\w*)\n(.*?)```", path.read_text(), flags=re.S)
    out = []
    for lang, body in blocks:
        if lang not in ("", "sh", "bash", "console", "shell"):
            continue
        lines = [ln.strip().removeprefix("$ ") for ln in body.strip().split("\n")]
        lines = [ln for ln in lines if ln.startswith(COMMANDS)]
        if lines and len(lines) == len([ln for ln in body.strip().split("\n") if ln.strip()]):
            out.append("\n".join(lines))
    return out


CASES = [(doc.name, block) for doc in DOCS if doc.exists() for block in shell_blocks(doc)]


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


def _script(block: str, tmp: Path) -> str:
    """The block as one bash script from the repository root (``cd`` and ``source`` carry)."""
    lines = []
    for line in block.split("\n"):
        line = re.sub(r"\s\[[^\]]*\]", "", line)  # optional arguments shown as [--strict]
        m = re.match(r"make ([\w-]+)", line)
        if m and m.group(1) in DRY_RUN:
            line = line.replace("make ", "make -n ", 1)
        line = line.replace("submissions/", f"{tmp}/submissions/")
        line = re.sub(r"(?<![\w/])grades(\.csv|_summary\.txt|_feedback)", rf"{tmp}/grades\1",
                      line)
        line = line.replace("COURSE=course", f"COURSE={tmp}/course")
        line = re.sub(r"^cd course\b", f"cd {tmp}/course", line)
        m = re.match(r"nbgrader autograde (\w+)", line)
        if m:  # the collecting step the document describes in prose: one untouched copy
            name = m.group(1)
            lines += [f"mkdir -p submitted/alice/{name}",
                      f"cp release/{name}/*.ipynb submitted/alice/{name}/",
                      "nbgrader db student add alice"]
        lines.append(line)
    return "set -e\n" + f"cd {ROOT}\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("doc, block", CASES, ids=[f"{d}:{b.split(chr(10))[0][:40]}"
                                                   for d, b in CASES])
def test_documented_command_runs_in_a_fresh_shell(doc, block, tmp_path):
    if "nbgrader" in block:
        pytest.importorskip("nbgrader", reason="nbgrader is not installed: `make "
                            "test-teacher` installs requirements-teacher.txt")
    _learner_notebook(tmp_path / "submissions")
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != Path(venv_bin).resolve())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = path
    script = _script(block, tmp_path)
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (f"{doc} shows a command that fails in a fresh shell:\n"
                                  f"{script}\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n"
                                  f"{proc.stderr[-2000:]}")


def test_the_docs_show_commands():
    assert any(d == "nbgrader.md" for d, _ in CASES)
    assert any("make grade" in b for _, b in CASES)
