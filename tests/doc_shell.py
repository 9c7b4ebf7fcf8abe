"""The shell blocks that docs/teaching.md and docs/nbgrader.md show, as scripts for a fresh shell.

Used by tests/test_teaching_commands.py (every block) and tests/test_nbgrader.py (the nbgrader
round trip, with its three submissions collected where the document says so).
"""
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "docs" / "teaching.md", ROOT / "docs" / "nbgrader.md"]
COMMANDS = ("make", "python", "python3", ".venv/", "../.venv/", "cd ", "nbgrader", "jupyter",
            "source ")
DRY_RUN = ("lab", "test", "test-browser", "test-portability", "test-teacher", "notebooks",
           "exercises", "models", "bench", "ddp-demo", "setup", "clean")


def shell_blocks(path: Path) -> list[str]:
    """The fenced blocks of ``path`` that hold only shell commands, ``$ `` prompts removed."""
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


def script(block: str, tmp: Path) -> str:
    """The block as one bash script from the repository root (``cd`` and ``source`` carry),
    with its placeholders (submissions/, grades.csv, course) pointed into ``tmp``."""
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
        lines.append(line)
    return "set -e\n" + f"cd {ROOT}\n" + "\n".join(lines) + "\n"


def fresh_shell_env() -> dict:
    """os.environ as a new terminal has it: the venv not active, its bin folder off PATH (a
    bare ``python labkit/course/grade.py`` that only works inside the venv must fail)."""
    venv_bin = Path(sys.executable).parent.resolve()
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != venv_bin)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = path
    return env
