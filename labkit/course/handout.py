#!/usr/bin/env python3
"""Pack what a student needs for the labs, and nothing a teacher keeps.

Writes dist/transformer-labs/ and dist/transformer-labs.zip with

- notebooks/NN_*.ipynb: the exercise copy of every notebook 00-13, generated now from the
  solved notebooks (stubs, blank predictions, no answers);
- tx_helpers/: the blocks and their trained models (the notebooks need it; its source still
  shows reference implementations, see docs/teaching.md);
- labkit/: the checks that name a mistake (without labkit/course/, the teacher's builders);
- pyproject.toml and requirements.txt (the pinned versions the notebooks were run with);
- docs/defects.md (the notebooks link to it);
- benchmarks/ddp_demo.txt and tools/train_ddp.py, the only tool: notebook 12 prints the recorded
  DDP run and quotes the DDP script (which, like the package, shows how a distributed step is
  written);
- jupyterlab-overrides.json (switches off JupyterLab's news pop-up) and a student README.md.

No solved notebook, no teacher key, no tests, and no other tool (no grader, no key or exercise
generator). The folder is rebuilt from scratch on
every run.

  python -m labkit.course.handout               # dist/transformer-labs/ and its .zip
  python -m labkit.course.handout --out DIR     # DIR/transformer-labs/ and DIR/transformer-labs.zip
"""
from __future__ import annotations

import argparse
import shutil
import sys
import zipfile
from pathlib import Path

from labkit.course import exercise_copy, layout, markup  # noqa: E402

ROOT = layout.ROOT
NAME = "transformer-labs"
DIST = Path("dist")
OVERRIDES = Path("tools") / "jupyterlab" / "overrides.json"
# Files the notebooks read besides the package: 12 prints the recorded DDP run and quotes the
# DDP script (which, like the package, shows how the distributed step is done).
COPIED = ["pyproject.toml", "requirements.txt", "docs/defects.md", "benchmarks/ddp_demo.txt",
          "tools/train_ddp.py"]
SKIP_PATTERNS = ("__pycache__", "*.pyc", "*.egg-info", ".ipynb_checkpoints")
SKIP = shutil.ignore_patterns(*SKIP_PATTERNS)
FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # zip entries get one timestamp: the same files, the same zip

README = """\
# Transformer labs: the student handout

Labs 00-13 build the 2017 encoder-decoder Transformer from scratch in PyTorch, one block per
notebook, on a small helper package, `tx_helpers` (imported as `tx`).

- `notebooks/`: the labs. Each starts with a note that lists its sections, the code you write
  (each `raise NotImplementedError(...)` line), the checks to run, and its predictions. This
  folder is yours: nothing regenerates it. Keep a copy of your work elsewhere too.
- `tx_helpers/`: the helper package, the verified blocks (imported as `tx`).
- `labkit/`: the checks that tell you in words what is wrong with your code.
- `docs/defects.md`: the source article's defects, which the notebooks cite.

## Set-up (Python 3.11, about 1.5 GB, a few minutes)

```bash
python3.11 -m venv .venv
.venv/bin/python -m pip install -r requirements.txt && .venv/bin/python -m pip install -e .
mkdir -p .venv/share/jupyter/lab/settings
cp jupyterlab-overrides.json .venv/share/jupyter/lab/settings/overrides.json
.venv/bin/jupyter lab notebooks
```

Lines 3 and 4 are optional: they stop JupyterLab from asking about Jupyter news. On Windows,
use WSL 2 with Ubuntu and the same commands. Nothing needs a GPU.

## Working through a lab

- Run the cells from the top. *Run All* stops at the first stub you have not filled in (that
  cell raises `NotImplementedError` and the cells after it stay blank): fill it in, run it,
  then use *Run > Run Selected Cell and All Below*.
- **Predict.** cells: replace the `...` in `name = ...  # your prediction` with your answer and
  run it *before* the next cell, which grades your answer and shows the true value.
- After you fill in a stub, run the check cell below it, e.g.
  `labkit.check_masks(padding_mask, lookahead_mask, decoder_self_mask)`: it prints ✓/✗ per
  probe and names the likely mistake with a hint.
- **Write.** cells: write your answer in the cell below the question.
- Hand in the notebooks your teacher asks for (save them first: File > Save Notebook).
"""


def build(out_root: Path, root: Path = ROOT) -> tuple[Path, Path]:
    """Write ``out_root/transformer-labs/`` and ``out_root/transformer-labs.zip``."""
    folder, archive = out_root / NAME, out_root / f"{NAME}.zip"
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "notebooks").mkdir(parents=True)
    for path, text in exercise_copy.expected_exercises(root).items():
        (folder / "notebooks" / path.name).write_text(text, encoding="utf-8")
    shutil.copytree(root / "tx_helpers", folder / "tx_helpers", ignore=SKIP)
    shutil.copytree(root / "labkit", folder / "labkit",
                    ignore=shutil.ignore_patterns("course", *SKIP_PATTERNS))
    for rel in COPIED:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, folder / rel)
    shutil.copy2(root / OVERRIDES, folder / "jupyterlab-overrides.json")
    (folder / "README.md").write_text(README, encoding="utf-8")
    if archive.exists():
        archive.unlink()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(f"{NAME}/{path.relative_to(folder).as_posix()}", FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, path.read_bytes())
    return folder, archive


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: dist/)")
    parser.add_argument("--root", type=Path, default=ROOT, help="project root (default: here)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        folder, archive = build(args.out or root / DIST, root)
    except markup.RegionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    n = len(list((folder / "notebooks").glob("*.ipynb")))
    size = archive.stat().st_size / 1e6
    print(f"handout: {folder} ({n} exercise notebooks, the package, requirements, a README)")
    print(f"         {archive} ({size:.1f} MB). No solved notebook and no teacher key inside;")
    print("         the package's source still shows reference implementations "
          "(docs/teaching.md). Teacher keys: make keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
