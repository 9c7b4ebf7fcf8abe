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
  python -m labkit.course.handout --labs 05 09 --graded   # make handout LABS="05 09" GRADED=1

``--labs`` keeps only the chosen labs' notebooks. ``--graded`` makes the notebooks nbgrader's
student version of those labs (the ``make nbgrader`` export with its solutions cleared, so
submissions autograde against the teacher's course folder): only Hint 1 (the idea) of each
hint, no Check-yourself proof cell, the prediction grading cells collapsed, and a manually
graded answer cell after each written question.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
import zipfile
from pathlib import Path

import nbformat

from labkit.course import exercise_copy, labinfo, layout, markup, nbgrader_export, regions

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

- `notebooks/`: the labs. Each starts with a note that lists the code you write (each
  `raise NotImplementedError(...)` line), the checks to run, and its predictions. This
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

- Run the cells from the top. Each notebook's top note says whether *Run All* stops at the
  first stub you have not filled in (when a cell runs it, it raises `NotImplementedError` and
  the cells after it stay blank: fill it in, run it, then use *Run > Run Selected Cell and
  All Below*) or runs to the end (the stub's check reports it as not written yet).
- **Predict.** cells: replace the `...` in `name = ...  # your prediction` with your answer and
  run it *before* the next cell, which grades your answer and shows the true value.
- After you fill in a stub, run the check cell below it, e.g.
  `labkit.check_masks(padding_mask, lookahead_mask, decoder_self_mask)`: it prints ✓/✗ per
  probe and names the likely mistake with a hint.
- **Write.** cells: write your answer in the cell below the question.
- Hand in the notebooks your teacher asks for (save them first: File > Save Notebook).
"""


GRADED_README = """
## This is a graded handout

The notebooks are your teacher's graded version (nbgrader's student version): each hint
shows only its first tier, the idea; the cells that prove the Check-yourself answers are
left out; a cell that grades a prediction is collapsed (run it, do not open it first) and
sealed: it records your prediction but shows neither right/wrong nor the true value, which
you see in your teacher's feedback after you hand in. Answer each prediction before you run
the cells below it, and leave it as you first wrote it. Write
your code where a cell says `# YOUR CODE HERE`, your prediction under `# Your prediction:`,
and your written answers where a cell says `YOUR ANSWER HERE`. Keep the other cells as
they are: your teacher's grader matches the cells by their hidden ids.
"""
GRADED_LINES = {  # README lines that differ in a graded handout
    "- `notebooks/`: the labs. Each starts with a note that lists the code you write (each\n"
    "  `raise NotImplementedError(...)` line), the checks to run, and its predictions. This\n"
    "  folder is yours: nothing regenerates it.":
    "- `notebooks/`: the labs your teacher chose, as graded work (below): no top note; your\n"
    "  answers go where a cell says so. This folder is yours: nothing regenerates it.",
    "run it *before* the next cell, which grades your answer and shows the true value.":
    "run it *before* the cells below it; the grading cell records it (sealed, see below).",
    "- Run the cells from the top. Each notebook's top note says whether *Run All* stops at the\n"
    "  first stub you have not filled in (when a cell runs it, it raises `NotImplementedError`"
    " and\n"
    "  the cells after it stay blank: fill it in, run it, then use *Run > Run Selected Cell and\n"
    "  All Below*) or runs to the end (the stub's check reports it as not written yet).":
    "- Run the cells from the top. *Run All* stops at the first cell that raises: a stub you have\n"
    "  not filled in or a prediction you have not answered. Fill it in, run it, then use *Run >\n"
    "  Run Selected Cell and All Below*.",
}


def readme(paths: list[Path], graded: bool) -> str:
    """The student README: which labs it holds, and the graded version's differences."""
    stems = sorted(p.name[:2] for p in paths)
    which = ("Labs 00-13" if len(stems) == 14 else
             "Lab" + ("s " + ", ".join(stems[:-1]) + " and " if len(stems) > 1 else " ")
             + stems[-1] + " (of the series 00-13)")
    text = README.replace("Labs 00-13 build", f"{which} build", 1)
    if graded:
        for old, new in GRADED_LINES.items():
            assert old in text, old
            text = text.replace(old, new)
        text += GRADED_README
    return text


HINT_NUMBER = re.compile(r"\AHint\s+(?P<n>\d+)", re.IGNORECASE)
STUB = ["# YOUR CODE HERE", "raise NotImplementedError()"]  # nbgrader's code stub


def first_hints_only(text: str) -> str:
    """Markdown without the hint tiers past the first (``<details>`` "Hint 2: ...", ...)."""
    for start, end, depth in reversed(markup.details_blocks(text)):
        m = HINT_NUMBER.match(markup.summary_text(text[start:end]) or "")
        if depth == 0 and m and int(m.group("n")) > 1:
            text = text[:start] + text[end:]
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def _cleared(source: str) -> str:
    """A solution cell as nbgrader's student version has it: each region is the stub."""
    lines = source.split("\n")
    for region in reversed(regions.find_regions(source)):
        lines[region.begin:region.end + 1] = [region.indent + s for s in STUB]
    return "\n".join(lines)


def graded_notebook(path: Path):
    """The graded student version of one lab (see the module's docstring)."""
    nb, _ = nbgrader_export.export_notebook(path)
    proofs = set(labinfo.proof_cells(nb))
    cells = []
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if index in proofs and not meta.get("grade") and not meta.get("solution"):
            continue  # its code proves a Check-yourself answer
        if cell.cell_type == "markdown":
            cell.source = first_hints_only(cell.source)
        elif meta.get("solution"):
            cell.source = _cleared(cell.source)
        elif meta.get("grade"):
            cell.source = regions.strip_hidden_tests(cell.source)
        cells.append(cell)
    nb.cells = cells
    return nb


def _lab_paths(root: Path, labs: list[str] | None) -> list[Path]:
    paths = layout.solved_notebooks(root)
    if labs is None:
        return paths
    chosen = [p for p in paths if p.name[:2] in labs]
    missing = sorted(set(labs) - {p.name[:2] for p in chosen})
    if missing:
        raise ValueError(f"labs: no notebook numbered {missing}; expected two-digit numbers "
                         f"of {[p.name[:2] for p in paths]}")
    return chosen


def build(out_root: Path, root: Path = ROOT, labs: list[str] | None = None,
          graded: bool = False) -> tuple[Path, Path]:
    """Write ``out_root/transformer-labs/`` and ``out_root/transformer-labs.zip``: the chosen
    labs (all by default), as exercise copies or, ``graded``, as the graded student version."""
    folder, archive = out_root / NAME, out_root / f"{NAME}.zip"
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "notebooks").mkdir(parents=True)
    chosen = _lab_paths(root, labs)
    if graded:
        for path in chosen:
            nbformat.write(graded_notebook(path), folder / "notebooks" / path.name)
    else:
        names = {p.name for p in chosen}
        for path, text in exercise_copy.expected_exercises(root).items():
            if path.name in names:
                (folder / "notebooks" / path.name).write_text(text, encoding="utf-8")
    shutil.copytree(root / "tx_helpers", folder / "tx_helpers", ignore=SKIP)
    shutil.copytree(root / "labkit", folder / "labkit",
                    ignore=shutil.ignore_patterns("course", *SKIP_PATTERNS))
    for rel in COPIED:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, folder / rel)
    shutil.copy2(root / OVERRIDES, folder / "jupyterlab-overrides.json")
    (folder / "README.md").write_text(readme(chosen, graded), encoding="utf-8")
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
    parser.add_argument("--labs", nargs="+", metavar="NN", default=None,
                        help="only these labs, by number (default: every lab)")
    parser.add_argument("--graded", action="store_true",
                        help="the graded version: nbgrader's student version, Hint 1 only, "
                             "no Check-yourself proofs")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    labs = [n.zfill(2) for n in " ".join(args.labs).split()] if args.labs else None
    try:
        folder, archive = build(args.out or root / DIST, root, labs, args.graded)
    except ValueError as exc:  # markup.RegionError, or a lab that does not exist
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
