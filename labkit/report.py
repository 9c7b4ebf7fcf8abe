"""The report a check prints and the CheckResult it returns; running learner code safely."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import textwrap
import traceback
from dataclasses import dataclass, field

import torch

import tx_helpers

from .mistakes import MISTAKES


@dataclass
class CheckResult:
    """What a check found: ``passed``, the report lines and the diagnosed mistake keys."""

    name: str
    passed: bool
    messages: list[str] = field(default_factory=list)
    mistakes: list[str] = field(default_factory=list)
    subject: str = ""  # the name of the checked class or function, when it has one

    def __repr__(self) -> str:
        status = "passed" if self.passed else "FAILED"
        found = f"; mistakes: {', '.join(self.mistakes)}" if self.mistakes else ""
        return f"<{self.name}: {status}{found}>"

    def _repr_pretty_(self, p, cycle) -> None:  # IPython display: one line
        p.text(repr(self))

    @property
    def report(self) -> str:
        """The printed report: the messages wrapped at word boundaries within WIDTH columns."""
        return "\n".join(_wrap(line) for line in self.messages)

    def as_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "mistakes": list(self.mistakes),
                "messages": list(self.messages), "subject": self.subject}


_HISTORY: list[CheckResult] = []


def history() -> list[CheckResult]:
    """Every result returned by a check in this Python process, oldest first."""
    return list(_HISTORY)


def clear_history() -> None:
    _HISTORY.clear()


# ----------------------------------------------------------------------------------------
# reporting


WIDTH = 100  # report lines wrap here, at word boundaries


def _wrap(line: str) -> str:
    if len(line) <= WIDTH:
        return line
    head = line[: len(line) - len(line.lstrip())]
    if line.lstrip().startswith(("✓ ", "✗ ")):
        head += "  "
    elif ": " in line[:12]:  # "Diagnosis: ", "Hint: ", "Note: "
        head = "    "
    return textwrap.fill(line, WIDTH, subsequent_indent=head, break_long_words=False,
                         break_on_hyphens=False)


class _Failed(Exception):
    """Stops a check early; the report already says why."""


class _Report:
    def __init__(self, name: str, verbose: bool = True, subject: str = ""):
        self.name = name
        self.subject = subject
        self.verbose = verbose
        self.probes: list[tuple[bool, str]] = []
        self.found: dict[str, tuple[str, str]] = {}
        self.notes: list[str] = []

    def probe(self, ok: bool, text: str) -> bool:
        self.probes.append((bool(ok), text))
        return bool(ok)

    def mistake(self, key: str, detail: str | None = None, hint: str | None = None) -> None:
        if key in self.found:
            return
        text, default_hint = MISTAKES[key]
        self.found[key] = (f"{text}{': ' + detail if detail else ''}", hint or default_hint)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def only_mismatch(self) -> bool:
        """The numbers differ and no probe has said why yet: time for the localising probes."""
        return set(self.found) == {"mismatch"}

    def finish(self) -> CheckResult:
        if len(self.found) > 1:  # a named mistake explains the mismatch
            self.found.pop("mismatch", None)
        passed = bool(self.probes) and all(ok for ok, _ in self.probes) and not self.found
        n_ok = sum(ok for ok, _ in self.probes)
        head = (f"{self.name}: passed ({n_ok}/{len(self.probes)} probes)" if passed else
                f"{self.name}: FAILED ({n_ok}/{len(self.probes)} probes passed)")
        lines = [head] + [f"  {'✓' if ok else '✗'} {text}" for ok, text in self.probes]
        for text, hint in self.found.values():
            lines += [f"Diagnosis: {text}", f"Hint: {hint}"]
        lines += [f"Note: {text}" for text in self.notes]
        lines = list(dict.fromkeys(lines))  # each message once
        result = CheckResult(self.name, passed, lines, list(self.found), self.subject)
        _HISTORY.append(result)
        if self.verbose:
            report = result.report
            try:
                print(report)
            except UnicodeEncodeError:  # a terminal without UTF-8
                print(report.replace("✓", "ok").replace("✗", "XX"))
        return result


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
# Frames in the lab kit, in the blocks it compares with, and in torch are not the learner's.
_NOT_LEARNER = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
                os.path.dirname(os.path.abspath(tx_helpers.__file__)) + os.sep, _TORCH_DIR)


def _learner_frame(exc: BaseException) -> str:
    """Where in the learner's code the exception came from (not torch, not this package)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if path.startswith(_NOT_LEARNER):
            continue
        line = (frame.line or "").strip()
        if not line or line.startswith("raise NotImplementedError"):  # the stub: said already
            return f" (line {frame.lineno} in {frame.name})"
        return f" (line {frame.lineno} in {frame.name}: {line})"
    return ""


def _from_learner(exc: BaseException) -> bool:
    """Whether any frame of the traceback lies outside torch, tx_helpers and the lab kit."""
    for frame in traceback.extract_tb(exc.__traceback__):
        if not os.path.abspath(frame.filename).startswith(_NOT_LEARNER):
            return True
    return False


# "'float' object has no attribute 'item'": a value of the wrong type, not a missing layer
_BUILTIN_ATTR = re.compile(r"'(float|int|bool|str|list|tuple|dict|NoneType)' object has no attr")


def _explain(report: _Report, what: str, exc: BaseException, shape_hint: str = "") -> None:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = _learner_frame(exc)
    report.probe(False, f"{what}: raised {type(exc).__name__}: {msg}{where}")
    low = msg.lower()
    if isinstance(exc, NotImplementedError):
        report.mistake("not_implemented")  # the probe line above already shows the hint
    elif "view" in low and ("stride" in low or "contiguous" in low):
        report.mistake("missing_contiguous")
    elif "device" in low and ("expected" in low or "same" in low):
        report.mistake("device_mismatch", msg)
    elif isinstance(exc, AttributeError) and not _BUILTIN_ATTR.match(msg):
        report.mistake("attribute_error", msg)  # a layer missing; a number's .item() is not that
    elif isinstance(exc, TypeError) and ("argument" in low or "positional" in low):
        report.mistake("signature", msg)
    elif any(s in low for s in ("size of tensor", "shape", "size mismatch", "cannot be multiplied",
                                "invalid for input of size", "dimension", "broadcast")):
        report.mistake("shape_error", msg, shape_hint or None)
    else:
        report.mistake("exception", f"{type(exc).__name__}: {msg}")


def _call(report: _Report, what: str, fn, *args, shape_hint: str = "", **kwargs):
    """Run learner code; on an exception, explain it and raise _Failed."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any learner bug is reported, never raised
        _explain(report, what, exc, shape_hint)
        raise _Failed from None


def _subject(obj) -> str:
    if isinstance(obj, str):
        return obj
    return getattr(obj, "__name__", "") or getattr(getattr(obj, "func", None), "__name__", "")


def _checker_failed(report: _Report, exc: BaseException) -> None:
    """The check's own code crashed: say so, and do not blame the learner."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    report.probe(False, f"the check itself ran to the end (it stopped with "
                 f"{type(exc).__name__}: {msg})")
    report.mistake("checker_failed")


def _watch(name: str, subject, report: _Report):
    """The watch a check runs under when the learner calls it in their notebook: the same
    delegation test the grade applies (:class:`labkit.delegation.watch_references`), so a
    check never says "passed" without a word to work the grade will not credit. None when a
    grade's own watch is already running (it knows the lab's given methods), for the masks
    (marked one slot at a time by the grade), and for the reference itself shown to the check
    (a note)."""
    from .delegation import _is_tx, reference_names, watch_references

    names = reference_names(name)
    outer = getattr(sys.getprofile(), "__self__", None)
    if (not names or name == "check_masks" or not callable(subject)
            or isinstance(outer, watch_references)):
        return None
    if _is_tx(subject):
        report.note(f"this is tx_helpers' own {_subject(subject)}: the check shown on the "
                    "reference (a grade gives it no credit as your answer)")
        return None
    init = vars(subject).get("__init__") if isinstance(subject, type) else None
    given = [init.__code__] if hasattr(init, "__code__") else []  # layers the lab builds
    return watch_references(names, given)


def _delegation(report: _Report, found: list[str]) -> None:
    """Handing the work to tx_helpers' reference fails the check; PyTorch's own version of the
    exercise is correct code (public implementations use it), so it passes with a note that the
    grade gives it no credit."""
    pytorch = [text for text in found if text.startswith("it calls PyTorch's")]
    for text in pytorch:
        if "label_smoothing" in text or "cross_entropy_loss" in text:
            _fail_probe(report, "the smoothed target is built here")  # the check's own probe
            report.mistake("ls_builtin_smoothing", text)  # missed a renamed F.cross_entropy
        else:
            report.note(f"{text}: right, but a grade gives it no credit (the exercise is to "
                        "build it)")
    if len(pytorch) < len(found):
        report.probe(False, "the work is your code's own, not the reference's")
        report.mistake("delegated", "; ".join(t for t in found if t not in pytorch))


def _fail_probe(report: _Report, start: str) -> None:
    """Turn the probe whose text begins with ``start`` into a failure (add it if missing)."""
    for i, (_, text) in enumerate(report.probes):
        if text.startswith(start):
            report.probes[i] = (False, text)
            return
    report.probe(False, start)


@contextlib.contextmanager
def slot_watch(report: _Report, slot: str, fn):
    """The in-notebook watch for one of check_masks' functions (``slot``: ``"padding_fn"``,
    ...): only that mask's own reference is delegation (a decoder mask may use
    ``tx.padding_mask`` as a part). Nothing when a grade's watch is running."""
    from .delegation import reference_names, watch_references

    outer = getattr(sys.getprofile(), "__self__", None)
    if isinstance(outer, watch_references) or not callable(fn):
        yield
        return
    watch = watch_references(reference_names("check_masks", slot))
    try:
        with watch:
            yield
    finally:  # a probe that stops the check still reports the route
        if watch.found:
            _delegation(report, watch.found)


def _run_check(name: str, body, verbose: bool, subject=None) -> CheckResult:
    report = _Report(name, verbose, _subject(subject) if subject is not None else "")
    watch = _watch(name, subject, report)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra threads only add contention
    try:
        with torch.random.fork_rng(devices=[]), watch or contextlib.nullcontext():
            torch.manual_seed(0)
            try:
                with torch.no_grad():
                    body(report)
            except _Failed:
                pass
            except Exception as exc:  # noqa: BLE001 - never crash on learner code
                if _from_learner(exc):
                    _explain(report, "your code, called by the check", exc)
                else:
                    _checker_failed(report, exc)
    finally:
        torch.set_num_threads(threads)
    if watch is not None and watch.found:
        _delegation(report, watch.found)
    return report.finish()


