"""Store widget cells without their output, so a learner never sees raw widget text.

Without a live kernel, JupyterLab shows a stored ipywidgets output as its text repr
(`interactive(children=(IntSlider(...`). `make notebooks` runs this after executing: every code
cell that calls `interact(` keeps its execution count but loses its outputs, and the notebook's
saved widget state is dropped. The markdown above each such cell says what running it gives.

    python tools/clear_widget_outputs.py notebooks/02_positional_encoding.ipynb ...
"""
import sys

import nbformat


def clear(path: str) -> bool:
    nb = nbformat.read(path, as_version=4)
    changed = nb.metadata.pop("widgets", None) is not None
    for cell in nb.cells:
        if cell.cell_type == "code" and "interact(" in cell.source and cell.outputs:
            cell.outputs = []
            changed = True
    if changed:
        nbformat.write(nb, path)
    return changed


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if clear(arg):
            print(f"cleared widget outputs in {arg}")
