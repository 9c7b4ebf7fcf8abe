"""A check's ``Hint:`` line names the idea, never the fix (issue 29, item 5).

What counts as code in a hint (:func:`code_tokens`):

- a call (a name followed by ``(``: ``triu(``, ``self.w_o(``) or an attribute (``x.shape``,
  ``torch.bool``; the concept names ``nn.Linear``, ``nn.LayerNorm``, ``nn.Dropout``,
  ``nn.Embedding`` and ``nn.Module`` are allowed);
- an assignment or an operator: ``=``, ``==``, ``|``, ``&``, ``~``, ``@``, ``^``, ``*``, ``->``,
  ``::`` (a stepped slice), ``+ - / < >`` between spaces (formulas), or ``a/b``;
- brackets (indexing, slices, lists) and backticks (code spans);
- a snake_case identifier that is not a name of an exercise's contract (``pad_idx``, ``d_k``,
  ``w_o``, ``tgt_mask``, ... see :data:`CONTRACT_NAMES`) or a check's name (``check_*``):
  ``masked_fill``, ``clip_grad_norm_``, ``log_softmax``, ``zero_grad`` are API, not ideas;
- a torch function that names no concept (:data:`API_WORDS`: ``triu``, ``unsqueeze``,
  ``arange``, ``finfo``, ...) or a float literal in exponent form (``1e9``).

Shape tuples such as ``(N, 1, L_k)`` or ``(N * L_tgt, V)`` describe the contract and are
allowed (a tuple: parentheses after a space, holding a comma).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import labkit

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_NAMES = {
    "pad_idx", "bos_idx", "eos_idx", "max_len", "d_model", "d_k", "d_v", "d_ff", "n_heads",
    "n_layers", "w_q", "w_k", "w_v", "w_o", "self_attn", "cross_attn", "feed_forward",
    "tgt_mask", "memory_mask", "src_mask", "tgt_in", "tgt_out", "clip_norm", "world_size",
    "global_tokens", "norm_first", "share_embeddings", "L_q", "L_k", "L_src", "L_tgt",
    "src_vocab_size", "tgt_vocab_size", "alive_scores", "finished_tokens", "finished_scores",
    "grad_norm", "pos_encoding", "P_drop", "tx_helpers",
}
API_WORDS = {"triu", "tril", "unsqueeze", "squeeze", "arange", "linspace", "einsum", "finfo",
             "deepcopy", "ModuleList", "ModuleDict", "xlogy", "logsumexp", "bmm", "matmul",
             "numel", "contiguous_", "repeat_interleave", "masked_fill", "register_buffer"}
CONCEPT_ATTRIBUTES = {"nn.Linear", "nn.LayerNorm", "nn.Dropout", "nn.Embedding", "nn.Module"}
SHAPE = re.compile(r"(?<=[\s(])\((?:[\w\s*+-]*,)+[\w\s*+-]*\)")
PATTERNS = {
    "a call": re.compile(r"[\w\]]\("),
    "an attribute": re.compile(r"[A-Za-z_]\w*\.[A-Za-z_]\w*"),
    "an operator": re.compile(r"==|!=|->|::|[=|&~@^*`\[\]]|\s[-+/<>]\s|\w/\w|\d+e-?\d+"),
}


def code_tokens(hint: str) -> list[str]:
    """The code-like tokens of ``hint`` (empty for a hint that names the idea)."""
    found = [f"{what}: {m.group(0)!r}" for what, pattern in PATTERNS.items()
             for m in pattern.finditer(SHAPE.sub("(shape)", hint)) if what != "an attribute"
             or m.group(0) not in CONCEPT_ATTRIBUTES]
    for word in re.findall(r"[A-Za-z_][\w]*", SHAPE.sub(" ", hint)):
        if ("_" in word.strip("_") or word.endswith("_")) and word not in CONTRACT_NAMES \
                and not word.startswith("check_"):
            found.append(f"an API name: {word!r}")
        elif word in API_WORDS:
            found.append(f"a torch function: {word!r}")
    return found


@pytest.mark.parametrize("hint, expected", [
    ("torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)", True),
    ("call .contiguous() after transpose", True),
    ("return weights @ v", True),
    ("pe[:, 0::2] = sin(...)", True),
    ("keep = target != pad_idx", True),
    ("divide by math.sqrt(d_k)", True),
    ("combine both: pad | causal", True),
    ("use masked_fill before the softmax", True),
    ("angle = pos / 10000^(2i/d_model)", True),
    ("fill with -1e9", True),
    ("hide keys j > i", True),
    ("use triu", True),
    ("q (1 - eps) plus eps over V", True),
    ("a token may attend to itself: only the keys strictly after the query are hidden", False),
    ("the mask (N, 1, L_k) broadcasts over the queries; pad_idx is an argument", False),
    ("flatten to (N * L_tgt, V) for the criterion", False),
    ("every nn.Linear here has a bias; Post-LN normalises after the add", False),
    ("run check_multi_head_attention first", False),
])
def test_the_rule_tells_code_from_ideas(hint, expected):
    assert bool(code_tokens(hint)) is expected, code_tokens(hint)


@pytest.mark.parametrize("key", sorted(labkit.MISTAKES))
def test_catalogue_hint_names_the_idea(key):
    hint = labkit.MISTAKES[key][1]
    assert not code_tokens(hint), f"{key}: {hint!r} holds {code_tokens(hint)}"


def _inline_hints():
    """Hints the checks pass themselves: ``report.mistake(key, detail, hint)`` and the shape
    hints ``shape_hint=`` of ``_call`` (constants, names of module constants, f-strings)."""
    for path in sorted((ROOT / "labkit").glob("*.py")):
        tree = ast.parse(path.read_text())
        constants = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            args = [node.args[2]] if name == "mistake" and len(node.args) > 2 else []
            args += [k.value for k in node.keywords if k.arg in ("hint", "shape_hint")]
            for arg in args:
                arg = constants.get(arg.id, arg) if isinstance(arg, ast.Name) else arg
                text = _text(arg)
                if text:
                    yield f"{path.name}:{node.lineno}", text


def _text(node) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
    if isinstance(node, ast.BinOp):
        return _text(node.left) + _text(node.right)
    return ""


INLINE = list(_inline_hints())


def test_inline_hints_are_found():
    assert len(INLINE) >= 8, INLINE  # the shape hints of the checks, at least


OWNED_ELSEWHERE = ("beam.py",)  # its owner rewrites its shape hint (reported to the lead)


@pytest.mark.parametrize("where, hint", INLINE, ids=[w for w, _ in INLINE])
def test_inline_hint_names_the_idea(where, hint):
    if where.startswith(OWNED_ELSEWHERE) and code_tokens(hint):
        pytest.xfail(f"{where}: the shape hint still shows code; its owner fixes it")
    assert not code_tokens(hint), f"{where}: {hint!r} holds {code_tokens(hint)}"
