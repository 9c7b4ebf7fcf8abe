"""A stub message states the contract, not the operations: what a region's code does, read
from its code, and which of those operations a message names (tested in tests/test_labs.py)."""
from __future__ import annotations

import ast
import builtins
import re

from labkit.course.regions import Region, enclosing_function, solution_code

# Calls that fetch a size or move data, not an operation a hint could give away.
# Reductions whose names are the contract's plain words ("the mean over non-pad positions",
# "until all rows are finished") count as generic too.
GENERIC_CALLS = frozenset({"size", "dim", "item", "to", "numel", "parameters",
                           "named_parameters", "__init__", "all", "any", "sum", "mean", "max",
                           "min", "abs"})
OPERATOR_SYMBOLS = {ast.MatMult: "@", ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^",
                    ast.Pow: "**", ast.Invert: "~", ast.Eq: "==", ast.NotEq: "!="}
ATTRIBUTE_OPS = frozenset({"T", "mT", "H", "mH"})  # transposes written without a call


def _region_tree(source: str, region: Region) -> tuple[ast.Module | None, str]:
    code = solution_code(source, region)
    lines = [line[len(region.indent):] if line.startswith(region.indent) else line.lstrip()
             for line in code.split("\n")]
    text = "\n".join(lines)
    try:
        return ast.parse(text), text
    except SyntaxError:
        return None, text


def key_operations(source: str, region: Region) -> dict[str, str]:
    """What a region's code does, read from its code: ``{token: kind}``.

    Tokens: the names of the functions and methods it calls (``softmax``, ``transpose``,
    ``masked_fill``, ``w_o``, ``split_heads``, ...), transposes written as attributes (``.T``),
    its operator symbols (``@``, ``|``, ``**``, ``==``, ...), stepped slices (``0::2``) and
    large constants (``10000``). Left out, as the contract's own words: Python's built-in
    functions called by name, size accessors (``GENERIC_CALLS``), calls of a parameter or a
    local variable (``criterion(...)``, ``layer(x)``), the enclosing function's parameter names
    and the words of its name (``my_train_step`` allows "train" and "step").
    """
    tree, text = _region_tree(source, region)
    fn = enclosing_function(source, region)
    allowed: set[str] = set()
    if fn is not None:
        a = fn.args
        allowed |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        allowed |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        allowed |= {fn.name, *[w for w in fn.name.split("_") if w]}
    found: dict[str, str] = {}
    if tree is None:  # not a whole block of statements: fall back to the tokens
        for m in re.finditer(r"(?:\.|\b)([A-Za-z_]\w*)\s*\(", text):
            if m.group(1) not in GENERIC_CALLS and m.group(1) not in dir(builtins):
                found.setdefault(m.group(1), "call")
        for sym in ("@", "**", "==", "!="):
            if sym in text:
                found.setdefault(sym, "operator")
        return {k: v for k, v in found.items() if k.lower() not in {a.lower() for a in allowed}}
    local = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                if f.id not in dir(builtins) and f.id not in local and f.id not in allowed:
                    found.setdefault(f.id, "call")
            elif isinstance(f, ast.Attribute) and f.attr not in GENERIC_CALLS:
                found.setdefault(f.attr, "call")
        elif isinstance(node, ast.Attribute) and node.attr in ATTRIBUTE_OPS:
            found.setdefault("." + node.attr, "attribute")
        elif isinstance(node, (ast.BinOp, ast.AugAssign, ast.UnaryOp)):
            sym = OPERATOR_SYMBOLS.get(type(node.op))
            if sym:
                found.setdefault(sym, "operator")
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) in OPERATOR_SYMBOLS:
                    found.setdefault(OPERATOR_SYMBOLS[type(op)], "operator")
        elif isinstance(node, ast.Slice) and node.step is not None:
            found.setdefault(re.sub(r"\s+", "", ast.get_source_segment(text, node) or ""),
                             "slice")
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool) and abs(node.value) >= 100:
            found.setdefault(repr(node.value), "constant")
    words = {a.lower() for a in allowed}  # messages are matched in any case, so are these
    return {k: v for k, v in found.items() if k and k.lower() not in words}


def _numbers(text: str) -> set[float]:
    out = set()
    for m in re.finditer(r"(?<![\w.])\d[\d_]*(?:\.\d*)?(?:[eE][-+]?\d+)?", text):
        try:
            out.add(float(m.group(0).replace("_", "")))
        except ValueError:
            pass
    return out


def leaked_operations(message: str, operations: dict[str, str]) -> list[str]:
    """The key operations that ``message`` names (identifiers as whole words, any case)."""
    leaks = []
    squeezed = re.sub(r"\s+", "", message)
    numbers = _numbers(message)
    for token, kind in operations.items():
        if kind == "call":
            hit = re.search(rf"(?<![A-Za-z0-9_]){re.escape(token)}(?![A-Za-z0-9_])", message,
                            re.IGNORECASE)
        elif kind == "attribute":
            hit = re.search(rf"{re.escape(token)}(?![A-Za-z0-9_])", message)
        elif kind == "slice":
            hit = token in squeezed
        elif kind == "constant":
            hit = float(token) in numbers
        else:  # operator symbols; "**" must not count as "*"
            hit = token in message
        if hit:
            leaks.append(token)
    return leaks
