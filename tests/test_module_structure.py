"""tx_helpers: no import cycle (module-level or in functions), no module over 400 lines."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tx_helpers"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Every tx_helpers module that ``name`` imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # "from . import g2p" imports the submodule g2p; "from .x import y" imports x
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # "tx_helpers.g2p.x" -> "tx_helpers.g2p"
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle():
    """One import cycle as a list of module names, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            # a submodule importing its own package (or a parent) is only a cycle when it
            # does so at module level; the parent importing its children is how packages work
            if node.startswith(nxt + "."):
                continue
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for start in sorted(GRAPH):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_graph_sees_known_imports():
    assert "tx_helpers.g2p_data" in GRAPH["tx_helpers.pretrained"]
    assert "tx_helpers.pretrained" in GRAPH["tx_helpers.g2p"]
    assert "tx_helpers.recipes" in GRAPH["tx_helpers.pretrained"]
    assert GRAPH["tx_helpers.recipes"] == set()  # the registry imports nothing of ours


def test_no_import_cycle_among_tx_helpers_modules():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle(monkeypatch):
    monkeypatch.setitem(GRAPH, "tx_helpers.g2p_data",
                        GRAPH["tx_helpers.g2p_data"] | {"tx_helpers.g2p"})
    assert _cycle() is not None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_400_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines; split it (at most {MAX_LINES})"


def test_every_module_imports_first_in_a_fresh_interpreter():
    """Each module imported on its own, first thing in a new process (an import-order cycle
    shows up as an ImportError or AttributeError on a partly initialised module)."""
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    for m in [k for k in sys.modules if k.startswith('tx_helpers')]:\n"
              "        del sys.modules[m]\n"
              "    importlib.import_module(name)\n")
    names = sorted(n for n in MODULES if n != "tx_helpers")
    run = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True,
                         cwd=PACKAGE.parent, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
