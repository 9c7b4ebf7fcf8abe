"""One preamble for every notebook: seeds, figure settings, print options, device."""
from __future__ import annotations

import random
from contextlib import contextmanager

import numpy as np
import torch

FIG_DPI = 100


def get_device() -> torch.device:
    """``cuda`` when available, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def seed_everything(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup(seed: int = 0) -> torch.device:
    """Seed everything, make figures small and byte-stable, return the device."""
    import matplotlib as mpl

    seed_everything(seed)
    torch.set_printoptions(precision=4, sci_mode=False)
    np.set_printoptions(precision=4, suppress=True)
    mpl.rcParams.update({
        "figure.dpi": FIG_DPI,
        "savefig.dpi": FIG_DPI,
        "figure.figsize": (6.0, 3.5),
        "font.size": 9,
        "axes.titlesize": 10,
    })
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except ImportError:
        ip = None
    if ip is not None:
        ip.run_line_magic("matplotlib", "inline")
        ip.run_line_magic(
            "config",
            "InlineBackend.print_figure_kwargs = "
            "{'bbox_inches': 'tight', 'metadata': {'Software': None}}",
        )
    return get_device()


@contextmanager
def expect_error(*types: type[BaseException]):
    """Run a block that must fail, and print the error as a learner would see it.

    Pitfall cells use it to reproduce a real error: the message is printed (so
    nbval checks it and GitHub shows it), "Run all" carries on, and if the
    block stops failing one day, an AssertionError says so.
    """
    types = types or (Exception,)
    try:
        yield
    except types as err:
        print(f"{type(err).__name__}: {err}")
    else:
        names = " or ".join(t.__name__ for t in types)
        raise AssertionError(f"expected {names}, but the block ran without error")
