"""make grade's default route (see :mod:`labkit.course.grade`): each submission in a child
forked from one process that has imported torch, tx_helpers and labkit, run in a fresh IPython
shell of that child. No kernel starts and no import is repeated; whatever a submission changes
(modules, the lab kit's record of checks) dies with its child."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat

from labkit.course.submission import exercises_of, prepare, records_from, written_answers


class CellTimeout(Exception):
    """A cell ran longer than ``--timeout`` seconds."""


def run_here(path: Path, timeout: int = 120, prediction_points: float = 0.5
             ) -> tuple[list[dict], int, dict]:
    """Execute ``path`` in a fresh IPython shell of this process, as a kernel would, but
    without starting one: (check records, cells that raised, exercises), as
    :func:`labkit.course.grade.run_notebook` returns. Meant for a forked child (it changes
    the working folder and the process's output streams)."""
    import contextlib
    import io
    import signal

    from IPython.core.interactiveshell import InteractiveShell

    from labkit import predict, report

    nb, n_cells, exercises = prepare(path, prediction_points)
    report.clear_history()  # what the forking process checked is not this learner's work
    predict._SEALED = False  # as in a fresh kernel, until the notebook seals its predictions
    os.chdir(path.parent.resolve())
    sys.path.insert(0, "")  # a kernel imports from its working folder
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # output written below Python (C extensions) is noise here
    os.dup2(devnull, 2)

    class Shell(InteractiveShell):
        def enable_gui(self, gui=None):  # %matplotlib inline asks; there is no event loop
            pass

    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"  # In[] kept as a kernel keeps it, in memory
    shell = Shell.instance(config=config, colors="NoColor")
    shell.display_formatter.active_types = ["text/plain"]  # figures are never drawn

    def expire(signum, frame):
        raise CellTimeout(f"the cell ran longer than {timeout} s")

    signal.signal(signal.SIGALRM, expire)
    errors, text = 0, ""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        out = io.StringIO()
        signal.alarm(timeout)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            # with history, as a kernel runs it: check_prediction reads In[] to catch a
            # prediction computed from the notebook's own variables
            result = shell.run_cell(cell.source, store_history=True)
        signal.alarm(0)
        errors += index < n_cells and not result.success
        text = out.getvalue()
    return records_from(text), errors, exercises


def _unfinished(path: Path, prediction_points: float):
    """A submission whose grading process died (it exited, ran out of memory, was killed
    past its time): each declared exercise and prediction scores 0, still in the maximum."""
    nb = nbformat.read(path, as_version=4)
    exercises = exercises_of(nb)
    why = "Diagnosis: the notebook stopped the grader before its checks ran (a cell exited " \
          "the process, ran out of memory or never ended)"
    records = [dict(name=name, subject=name, passed=False, mistakes=["not_graded"],
                    messages=[why], label=f"unfinished({name})",
                    mark=dict(score=0, points=max(1, len(items)), delegated=""))
               for name, items in exercises.items()]
    records += [dict(name="check_prediction", subject=p["label"], passed=False,
                     mistakes=["not_graded"], messages=[why], label="prediction",
                     mark=dict(exercise="prediction: " + p["label"], score=0,
                               points=prediction_points, delegated=""))
                for p in nb.metadata.get("tx_lab", {}).get("predictions", [])]
    return records, 0, exercises, written_answers(nb)


def _preload() -> None:
    """Import what every submission imports, once, before the children are forked."""
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    from IPython.core.interactiveshell import InteractiveShell  # noqa: F401
    from matplotlib_inline import backend_inline  # noqa: F401

    import labkit  # noqa: F401
    import tx_helpers  # noqa: F401


def grade_forked(paths: list[Path], timeout: int, prediction_points: float, jobs: int):
    """Yield each submission's (records, cells that raised, exercises, written answers), in
    order, grading ``jobs`` at once, each in its own child forked from this process after
    :func:`_preload` (no kernel to start, no import to repeat; a child's changes to modules
    die with it)."""
    import pickle
    import select
    import time

    import torch

    _preload()
    # the cores shared out, never more threads than this process was given (OMP_NUM_THREADS=1)
    threads = max(1, min((os.cpu_count() or 1) // jobs, torch.get_num_threads()))
    results: dict[int, object] = {}
    running: dict[int, tuple] = {}  # read end -> (index, pid, deadline, data)
    todo = list(enumerate(paths))
    done = 0
    while done < len(paths):
        while todo and len(running) < jobs:
            index, path = todo.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: grade, send the result, leave without clean-up
                os.close(read)
                try:
                    import torch
                    torch.set_num_threads(threads)
                    records, errors, exercises = run_here(path, timeout, prediction_points)
                    result = (records, errors, exercises,
                              written_answers(nbformat.read(path, as_version=4)))
                except BaseException as err:  # noqa: BLE001 - reported as a failed grade
                    result = err
                with os.fdopen(write, "wb") as fh:
                    pickle.dump(result, fh)
                os._exit(0)
            os.close(write)
            cells = sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)
            running[read] = (index, pid, time.monotonic() + timeout * (cells + 1), [])
        ready, _, _ = select.select(list(running), [], [], 1.0)
        for read in list(running):
            index, pid, deadline, data = running[read]
            chunk = os.read(read, 1 << 20) if read in ready else b""
            if chunk:
                data.append(chunk)
                continue
            if read not in ready:
                if time.monotonic() < deadline:
                    continue
                os.kill(pid, 9)  # stuck where the cell timeout cannot reach (C code)
            os.close(read)
            os.waitpid(pid, 0)
            del running[read]
            try:
                results[index] = pickle.loads(b"".join(data))
            except Exception:  # noqa: BLE001 - the child died (memory, a signal, killed)
                results[index] = None
        while done in results:
            result = results.pop(done)
            if not isinstance(result, tuple):
                result = _unfinished(paths[done], prediction_points)
            yield result
            done += 1
