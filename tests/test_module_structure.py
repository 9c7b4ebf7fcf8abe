"""The three wings: tx_helpers (the blocks), labkit (the lab kit) and tools/ (command lines).

No import cycle among their modules (module-level or in functions), no module over 400 lines,
tx_helpers at most 3,500 lines and importing nothing from labkit (issue 31).
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tx_helpers"
WINGS = ("tx_helpers", "labkit", "tools")
MAX_LINES = 400
MAX_BLOCK_LINES = 3500  # the whole of tx_helpers: a package a learner reads in an evening


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for wing in WINGS for p in sorted((ROOT / wing).rglob("*.py"))}


def _imported(name: str, path: Path) -> list[str]:
    """Every module name ``name`` imports, at any depth of its code, relative ones resolved
    ("from . import g2p" names the submodule g2p; "from .x import y" names x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                      for a in node.names]
    return found


def _imports(name: str, path: Path) -> set[str]:
    """Every module of the three wings that ``name`` imports."""
    found = set()
    for target in _imported(name, path):
        if name.startswith("tools.") and f"tools.{target}" in MODULES:
            target = f"tools.{target}"  # a tool imports its neighbours by their bare names
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
    assert "labkit.course.regions" in GRAPH["labkit.course.exercise_copy"]
    assert "labkit.course.exercises" in MODULES and "labkit.marks" in MODULES
    assert "tools.bench_timing" in GRAPH["tools.bench_cases"]


def test_no_import_cycle_among_the_modules():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle(monkeypatch):
    monkeypatch.setitem(GRAPH, "tx_helpers.g2p_data",
                        GRAPH["tx_helpers.g2p_data"] | {"tx_helpers.g2p"})
    assert _cycle() is not None
    monkeypatch.setitem(GRAPH, "tx_helpers.g2p_data", GRAPH["tx_helpers.g2p_data"] - {
        "tx_helpers.g2p"})
    monkeypatch.setitem(GRAPH, "labkit.course.regions",
                        GRAPH["labkit.course.regions"] | {"labkit.course.exercise_copy"})
    assert _cycle() is not None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_400_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines; split it (at most {MAX_LINES})"


def test_tx_helpers_is_at_most_3500_lines():
    lines = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()
             if n.split(".")[0] == "tx_helpers"}
    total = sum(lines.values())
    assert total <= MAX_BLOCK_LINES, (
        f"tx_helpers has {total} lines (at most {MAX_BLOCK_LINES}); the largest: "
        + ", ".join(f"{n} {k}" for n, k in sorted(lines.items(), key=lambda t: -t[1])[:5]))


def _kit_imports(name: str) -> list[str]:
    return [t for t in _imported(name, MODULES[name]) if t.split(".")[0] == "labkit"]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.split(".")[0] == "tx_helpers"))
def test_tx_helpers_imports_nothing_from_labkit(name):
    """The blocks never depend on the kit that grades them (the arrow runs one way)."""
    assert _kit_imports(name) == [], f"{MODULES[name]} imports {_kit_imports(name)}"


def test_the_direction_check_sees_a_planted_import(tmp_path, monkeypatch):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from labkit.marks import check_options\n"
                       "import labkit\n")
    monkeypatch.setitem(MODULES, "tx_helpers.planted", planted)
    assert sorted(_kit_imports("tx_helpers.planted")) == ["labkit", "labkit.marks"]


@pytest.mark.slow  # 19 fresh interpreters; the import-graph tests stay fast
def test_every_module_imports_first_in_a_fresh_interpreter():
    """Each package module imported on its own, first thing in a new process (an import-order
    cycle shows up as an ImportError or AttributeError on a partly initialised module).
    Importing ``a.b`` runs ``a``'s ``__init__`` to the end first, so a module that ``a``'s own
    import loads is imported first exactly when ``a`` is: one import of ``a`` covers them all."""
    script = ("import importlib, sys\n"
              "covered = set()\n"
              "for name in sys.argv[1:]:\n"
              "    if name in covered:\n"
              "        continue\n"
              "    for m in [k for k in sys.modules if k.startswith(('tx_helpers', 'labkit'))]:\n"
              "        del sys.modules[m]\n"
              "    importlib.import_module(name.split('.')[0])\n"
              "    covered.update(sys.modules)\n"
              "    importlib.import_module(name)\n"
              "    covered.add(name)\n"
              "print(len(covered & set(sys.argv[1:])))\n")
    names = sorted(n for n in MODULES if n.split(".")[0] in ("tx_helpers", "labkit")
                   and n not in ("tx_helpers", "labkit"))
    run = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [str(len(names))], run.stdout  # every module was covered


# ---------------------------------------------------------------- the README's package section
READING_ORDER = ["config", "positional", "attention", "masks", "layers", "model", "training",
                 "decoding"]


def _readme_tables() -> tuple[list[str], str, str]:
    """(tx_helpers table rows' first cells, the labkit table, the structure picture)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## The package\n", 1)[1].split("\n## ", 1)[0]
    picture = section.split("```mermaid\n", 1)[1].split("```", 1)[0]
    tables = [block for block in section.split("\n\n") if block.lstrip().startswith("| Module")]
    assert len(tables) == 2, "the package section has a tx_helpers table and a labkit table"
    first = [row.split("|")[1].strip() for row in tables[0].strip().split("\n")[2:]]
    return first, tables[1], picture


def test_readme_lists_every_tx_helpers_module_once_in_reading_order():
    rows, _, _ = _readme_tables()
    names = [cell.strip("`").removesuffix(".py").rstrip("/") for cell in rows]
    modules = sorted(n.split(".", 1)[1] for n in MODULES if n.startswith("tx_helpers."))
    assert sorted(n for n in names if n != "models") == modules, "one row per module"
    assert names[: len(READING_ORDER)] == READING_ORDER


def test_readme_labkit_table_names_every_labkit_module():
    _, table, _ = _readme_tables()
    listed = {n for n, p in MODULES.items() if n.split(".")[0] == "labkit"
              and f"`{p.relative_to(ROOT / 'labkit').as_posix()}`" in table}
    missing = [n for n in MODULES if n.split(".")[0] == "labkit"
               and n != "labkit.course" and n not in listed]
    assert not missing, f"the README's labkit table lacks {missing}"


def test_the_structure_picture_has_three_wings_and_no_arrow_from_the_blocks_to_the_kit():
    _, _, picture = _readme_tables()
    wings = {w: picture.count(f"subgraph {w}[") for w in ("blocks", "kit", "tools")}
    assert wings == {"blocks": 1, "kit": 1, "tools": 1}, wings
    arrows = [line.split("-->") for line in picture.split("\n") if "-->" in line]
    assert ["kit", "blocks"] in [[a.strip(), b.strip()] for a, b in arrows]
    assert not [a for a in arrows if a[0].strip() == "blocks"], "blocks import nothing"
