"""Where the course lives: the project root, the solved notebooks and the generated folders."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOLVED_GLOB = "[0-9][0-9]_*.ipynb"
EXERCISE_DIR = "exercises"
WORK_DIR = "my-work"  # the learner's own copies (git-ignored; filled once, never overwritten)
RESCUE_DIR = "rescued"  # my-work/rescued/: hand-edited copies found in notebooks/exercises/
LABS_TOML = Path("notebooks") / "labs.toml"
TEACHING = Path("docs") / "teaching.md"


def lab_number(path: Path) -> str:
    return path.name[:2]


def solved_notebooks(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob(SOLVED_GLOB))
