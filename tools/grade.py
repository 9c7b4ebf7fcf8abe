#!/usr/bin/env python3
"""Grade learners' exercise notebooks: execute each one, collect tx_helpers.grading results.

  python tools/grade.py submissions/*.ipynb --out grades.csv

Each notebook runs top to bottom in a fresh kernel (errors do not stop it: a learner's
unfinished cell is recorded, the rest still runs). Then one extra cell, never saved,
collects

- every check the notebook itself ran (source "notebook"), and
- with --auto (the default), the checks :func:`tx_helpers.grading.find_checks` pairs with
  the classes and functions defined in the notebook, run on their final definitions
  (source "auto").

The CSV has one row per check: notebook, source, check, passed, mistakes, diagnosis; plus
one row per notebook (check "cells") counting the cells that raised. Exit status 0.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

MARK = "@@TX_GRADES@@"
COLLECT = """\
import json as _json
import tx_helpers.grading as _grading
_records = [dict(r.as_dict(), source="notebook") for r in _grading.history()]
if {auto}:
    for _label, _run in _grading.find_checks(globals()):
        _records.append(dict(_run(verbose=False).as_dict(), source="auto", label=_label))
print({mark!r} + _json.dumps(_records))
"""
FIELDS = ["notebook", "source", "check", "passed", "mistakes", "diagnosis"]


def run_notebook(path: Path, timeout: int = 120, auto: bool = True) -> tuple[list[dict], int]:
    """Execute ``path`` (a copy in memory) and return (check records, cells that raised)."""
    nb = nbformat.read(path, as_version=4)
    n_cells = len(nb.cells)
    nb.cells.append(nbformat.v4.new_code_cell(COLLECT.format(auto=auto, mark=MARK)))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    client.execute()
    errors = sum(1 for cell in nb.cells[:n_cells] if cell.cell_type == "code"
                 and any(o.get("output_type") == "error" for o in cell.get("outputs", [])))
    for out in nb.cells[-1].outputs:
        text = out.get("text", "")
        if out.get("output_type") == "stream" and MARK in text:
            return json.loads(text.split(MARK, 1)[1]), errors
    return [], errors  # the collecting cell failed: tx_helpers missing in the kernel?


def rows_for(path: Path, records: list[dict], errors: int) -> list[dict]:
    rows = [{"notebook": path.name, "source": "notebook", "check": "cells",
             "passed": errors == 0, "mistakes": f"{errors} cell(s) raised" if errors else "",
             "diagnosis": ""}]
    for r in records:
        diagnosis = next((m[len("Diagnosis: "):] for m in r["messages"]
                          if m.startswith("Diagnosis: ")), "")
        rows.append({"notebook": path.name, "source": r["source"],
                     "check": r.get("label", r["name"]), "passed": r["passed"],
                     "mistakes": " ".join(r["mistakes"]), "diagnosis": diagnosis})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("grades.csv"))
    parser.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    parser.add_argument("--no-auto", dest="auto", action="store_false",
                        help="only report the checks the notebooks ran themselves")
    args = parser.parse_args(argv)
    rows = []
    for path in args.notebooks:
        records, errors = run_notebook(path, args.timeout, args.auto)
        rows += rows_for(path, records, errors)
        passed = sum(r["passed"] for r in records)
        print(f"{path.name}: {passed}/{len(records)} checks passed, {errors} cell(s) raised")
    with args.out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
