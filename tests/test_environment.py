"""requirements.txt and environment.yml pin the same packages at the same versions."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENT = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)\s*(==|>=|<=|~=|!=|>|<)?\s*([^\s#;]*)")


def _requirements():
    """{name: (operator, version)} from requirements.txt, comments and blanks skipped."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = REQUIREMENT.match(line)
        assert m, f"unparsable requirement line: {line!r}"
        pins[m.group(1).lower()] = (m.group(2), m.group(3))
    return pins


def _environment_pip():
    """{name: version} from the `- pip:` section of environment.yml (no yaml import needed)."""
    pins, in_pip, pip_indent = {}, False, 0
    for raw in (ROOT / "environment.yml").read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip())
        if re.match(r"^\s*-\s*pip:\s*$", raw):
            in_pip, pip_indent = True, indent
            continue
        if in_pip and indent <= pip_indent:
            in_pip = False
        if in_pip:
            m = re.match(r"^\s*-\s*([A-Za-z0-9_.\-\[\]]+)==(\S+)\s*$", raw)
            if m:
                pins[m.group(1).lower()] = m.group(2)
            else:
                assert re.match(r"^\s*-\s*-e\s+\.\s*$", raw), f"unpinned pip line: {raw!r}"
    return pins


def test_every_requirement_is_pinned_exactly():
    reqs = _requirements()
    assert reqs, "requirements.txt lists nothing"
    loose = {name: op for name, (op, _) in reqs.items() if op != "=="}
    assert not loose, f"not pinned with ==: {loose}"


def test_every_extra_requirements_file_is_pinned_exactly():
    """requirements-*.txt (browser tests, teachers) add tools outside the learner's install."""
    extras = sorted(ROOT.glob("requirements-*.txt"))
    assert extras, "no requirements-*.txt found"
    base = _requirements()
    for path in extras:
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith(("-r ", "-c ")):
                continue
            m = REQUIREMENT.match(line)
            assert m and m.group(2) == "==", f"{path.name}: not pinned with ==: {line!r}"
            assert m.group(1).lower() not in base or base[m.group(1).lower()][1] == m.group(3), \
                f"{path.name} pins {line!r} against requirements.txt's {base[m.group(1).lower()]}"


def test_torch_is_pinned_to_2_13_0():
    assert _requirements()["torch"] == ("==", "2.13.0")
    assert _environment_pip()["torch"] == "2.13.0"


def test_requirements_and_environment_pin_the_same_set():
    reqs = {name: version for name, (_, version) in _requirements().items()}
    env = _environment_pip()
    assert env, "no pinned packages found in the pip section of environment.yml"
    only_req = sorted(set(reqs) - set(env))
    only_env = sorted(set(env) - set(reqs))
    differ = {n: (reqs[n], env[n]) for n in set(reqs) & set(env) if reqs[n] != env[n]}
    assert not (only_req or only_env or differ), (
        f"pins drifted: only in requirements.txt {only_req}, only in environment.yml "
        f"{only_env}, different versions (requirements, environment) {differ}"
    )


def test_importing_nbformat_builds_no_grammar_parser():
    """jsonschema 4.24+ imports rfc3987-syntax, which builds a Lark parser at import (2.5 s in
    every test worker, nbgrader command and grading run); requirements.txt pins 4.23.0."""
    code = ("import sys, nbformat; "
            "print(sorted(m for m in ('lark', 'rfc3987_syntax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"importing nbformat loaded {out.stdout.strip()}"
