"""Delegation: an exercise whose code hands its work to the ``tx_helpers`` reference.

Three tests, from the cheapest to the one no binding escapes:

- **identity** (:func:`identity_delegation`): the object marked *is* the reference, or wraps it
  without code of its own (``lookahead_mask = M.lookahead_mask``, ``functools.partial``,
  ``functools.wraps``, a copy of the reference's code object, ``MHA = tx.MultiHeadAttention``);
- **the source** (:func:`labkit.delegation_source.find_delegation`): a name or attribute in the
  learner's code that resolves to the reference, a ``tx`` base class, PyTorch's
  ``label_smoothing=``;
- **the run** (:class:`watch_references`): while the check runs, every call of the reference's
  code objects (functions, and the methods of reference classes other than ``__init__``) is
  looked at. It is delegation when the nearest caller outside torch, ``tx_helpers`` and the
  standard library is not the lab kit (the learner's code called it, however it was bound:
  aliases, modules, ``getattr``, ``importlib``, wrappers, lambdas, composition), or when a
  reference method runs on an instance of a class that is not ``tx_helpers``' own (a subclass,
  a borrowed ``forward``). The lab kit's own calls (the expected values) never count.

Parts are allowed: only the references of the exercise being marked are watched (see
:data:`REFERENCES`; for ``check_masks``, only the mask being marked, :data:`MASK_REFERENCES`),
so a decoder mask may call ``tx.padding_mask`` and a decoder layer may hold
``tx.MultiHeadAttention``. An exercise that includes a part other labs mark on their own says
so through its check's option: notebook 11's timed exercise writes multi-head attention with its
attention core (``check_multi_head_attention(..., core_included=True)`` watches
``scaled_dot_product_attention`` too, :data:`CORE_REFERENCES`), while 03's lab marks the core
at its own exercise, so there ``MultiHeadAttention`` may call an attention function as a part.
A watch inside another (a check's own, inside :func:`labkit.mark_exercise`'s) passes every
call on to the outer one and reports what it found to it.
"""
from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
import threading
import types

import torch

import tx_helpers

# the tx_helpers objects that ARE the answer to each check's exercise (names are looked up in
# every tx_helpers module; a check added for a new lab adds its line here)
REFERENCES: dict[str, tuple[str, ...]] = {
    "check_positional_encoding": ("sinusoidal_table", "PositionalEncoding"),
    "check_attention": ("scaled_dot_product_attention",),
    "check_multi_head_attention": ("MultiHeadAttention",),
    "check_masks": ("padding_mask", "lookahead_mask", "decoder_self_mask", "cross_mask",
                    "cross_attention_mask"),
    "check_feed_forward": ("FeedForward",),
    "check_encoder_layer": ("EncoderLayer",),
    "check_decoder_layer": ("DecoderLayer",),
    "check_decoder": ("Decoder",),
    "check_transformer": ("Transformer",),
    "check_train_step": ("train_step",),
    "check_amp_step": ("train_step",),
    "check_label_smoothing": ("label_smoothing_loss", "LabelSmoothingLoss"),
    "check_greedy_decode": ("greedy_decode", "beam_search"),  # beam 1 is greedy
    "check_beam_search": ("beam_search",),
    "check_phone_error_rate": ("phone_error_rate",),
    "check_g2p_batches": ("g2p_batches",),
    "check_g2p_training": ("train_from_recipe", "live_run", "average_weights"),
}
# the parts a check's option adds to its exercise (the check watches them itself)
CORE_REFERENCES: tuple[str, ...] = ("scaled_dot_product_attention",)
# check_masks marks one mask function at a time: only that mask's own reference is
# delegation (decoder_self_mask may use tx.padding_mask as a part)
MASK_REFERENCES: dict[str, tuple[str, ...]] = {
    "padding_fn": ("padding_mask",), "lookahead_fn": ("lookahead_mask",),
    "decoder_fn": ("decoder_self_mask",), "cross_fn": ("cross_mask", "cross_attention_mask"),
}

# PyTorch's own implementations that are a whole exercise in one call, by the reference they
# stand in for: Python functions and methods (watched by code object), and words in the names of
# C functions and ATen operators (torch.ops.aten...) that are the same computation.
TORCH_ROUTES: dict[str, tuple[tuple, tuple[str, ...]]] = {
    "scaled_dot_product_attention": ((torch.nn.functional.multi_head_attention_forward,
                                      torch.nn.MultiheadAttention.forward),
                                     ("scaled_dot_product", "flash_attention",
                                      "efficient_attention", "cudnn_attention",
                                      "multi_head_attention")),
    "MultiHeadAttention": ((torch.nn.functional.multi_head_attention_forward,
                            torch.nn.MultiheadAttention.forward), ("multi_head_attention",)),
    "EncoderLayer": ((torch.nn.TransformerEncoderLayer.forward,), ("transformer_encoder_layer",)),
    "DecoderLayer": ((torch.nn.TransformerDecoderLayer.forward,), ()),
    "Decoder": ((torch.nn.TransformerDecoder.forward,), ()),
    "Transformer": ((torch.nn.Transformer.forward,), ()),
    "lookahead_mask": ((torch.nn.Transformer.generate_square_subsequent_mask,
                        torch.nn.modules.transformer._generate_square_subsequent_mask,
                        "torch.nn.attention.bias:causal_lower_right",
                        "torch.nn.attention.bias:causal_upper_left",
                        "torch.nn.attention.bias:CausalBias._materialize"), ()),
}


def _loaded(route):
    """A route's function; ``"module:name.attr"`` only if that module is already imported
    (importing torch.nn.attention.bias pulls in torch._dynamo, a second per process: code that
    uses it has imported it)."""
    if not isinstance(route, str):
        return route
    module_name, _, path = route.partition(":")
    obj = sys.modules.get(module_name)
    for attr in path.split("."):
        obj = getattr(obj, attr, None)
    return obj
# the C entry of PyTorch's cross-entropy, called straight from the learner's code: its smoothing
# argument cannot be seen from a profile hook, and plain cross-entropy goes through F.cross_entropy
_CE_ENTRY = "cross_entropy_loss"
_OP_CALLS = {torch._ops.OpOverloadPacket.__call__.__code__, torch._ops.OpOverload.__call__.__code__}

_TX_DIR = os.path.dirname(os.path.abspath(tx_helpers.__file__)) + os.sep
_KIT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_PASS_THROUGH = (_TX_DIR, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
                 os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep)


# the lab kit's own answers, by name: its reference implementations, variants with switches,
# a float64 table, a colleague's attention core. Not every private function: the kit installs
# some into the learner's model while a check runs (a recording dropout), and those are not answers.
_KIT_REFERENCE = ("_reference", "_variant", "_amp_step", "_smoothed_ce", "_greedy", "_formula",
                  "_table_float64", "_colleague")


def _kit_references() -> dict[types.CodeType, str]:
    """The lab kit's own reference code (a right beam step, a greedy decoder with switches,
    ...), which a learner's code must not call: code object -> "module.function"."""
    found = {}
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("labkit.") or mod_name.startswith("labkit.course"):
            continue
        for attr, obj in vars(mod).items():
            if (isinstance(obj, types.FunctionType) and obj.__module__ == mod_name
                    and attr.startswith("_") and any(k in attr for k in _KIT_REFERENCE)):
                found[obj.__code__] = f"{mod_name}.{attr}"
    return found


def reference_names(check_name: str, slot: str | None = None) -> set[str]:
    """The reference names of ``check_name``'s exercise (of one mask ``slot`` for masks)."""
    return set(MASK_REFERENCES.get(slot or "", ()) or REFERENCES.get(check_name, ()))


def _is_tx(obj) -> bool:
    name = getattr(obj, "__name__", "") if isinstance(obj, types.ModuleType) else getattr(
        obj, "__module__", "") or ""
    return name == "tx_helpers" or name.startswith("tx_helpers.")


def reference_objects(names: set[str]) -> dict[object, str]:
    """Every tx_helpers function or class with one of ``names`` -> its name."""
    found = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "tx_helpers"
                                  or module_name.startswith("tx_helpers.")):
            continue
        for name in names:
            obj = vars(module).get(name)
            if (isinstance(obj, (types.FunctionType, type)) and _is_tx(obj)
                    and not isinstance(obj, types.ModuleType)):
                found[obj] = name
    return found


def _codes(obj) -> list[types.CodeType]:
    """The code objects that run the reference ``obj`` (a class: its methods but __init__)."""
    if isinstance(obj, type):
        members = [v for k, v in vars(obj).items() if k != "__init__"]
        members = [getattr(v, "__func__", v) for v in members]  # static/class methods
        return [c for v in members if isinstance(v, types.FunctionType) for c in _codes(v)]
    codes = []
    while obj is not None:
        if isinstance(getattr(obj, "__code__", None), types.CodeType):
            codes.append(obj.__code__)
        obj = getattr(obj, "__wrapped__", None)
    return codes


def _fingerprint(code: types.CodeType):
    """What a copy of a function's source keeps when compiled again, with other compiler flags
    too: its names, variables and constants, the docstring included. None for a function with
    no docstring that is not long: a learner may well type a two-line helper the same way
    (``n, length, _ = x.shape; return x.view(...).transpose(1, 2)``)."""
    documented = bool(code.co_consts) and isinstance(code.co_consts[0], str)
    if len(code.co_code) < (60 if documented else 400):
        return None
    return (code.co_names, code.co_varnames,  # not co_name: a renamed copy is still a copy
            tuple(repr(inspect.cleandoc(c) if isinstance(c, str) else c)  # re-indented source
                  for c in code.co_consts if not isinstance(c, types.CodeType)))


def _unwrap(obj):
    """What ``obj`` hands its calls to without code of its own (partial, wraps, methods)."""
    seen = []
    while obj is not None and all(obj is not s for s in seen):
        seen.append(obj)
        obj = (getattr(obj, "func", None) if isinstance(obj, functools.partial) else
               getattr(obj, "__wrapped__", None) or getattr(obj, "__func__", None))
    return seen


def identity_delegation(obj, names: set[str]) -> str | None:
    """``obj`` is a reference itself, wraps one, or runs a reference's code object."""
    refs = reference_objects(names)
    codes = {c: name for ref, name in refs.items() for c in _codes(ref)}
    copies = _copies(codes)
    for inner in _unwrap(obj):
        if any(inner is ref for ref in refs):
            return f"it is tx_helpers' {refs[inner]} itself, bound to another name"
        code = getattr(inner, "__code__", None)
        if code in (kit := _kit_references()):  # from labkit.amp import _amp_step as amp_step
            return f"it is the lab kit's own answer, {kit[code]}, bound to another name"
        if code in codes:
            return f"it runs the code of tx_helpers' {codes[code]}"
        if isinstance(code, types.CodeType) and _fingerprint(code) in copies:
            return f"it is a copy of tx_helpers' {copies[_fingerprint(code)]}, compiled again"
    return None


def _copies(codes: dict) -> dict:
    """Fingerprint -> reference name, for the reference code objects long enough to tell."""
    return {fp: name for code, name in codes.items() if (fp := _fingerprint(code)) is not None}


class watch_references:
    """Context manager: record calls of the references' code made by the learner's code.

    ``found`` holds one sentence per route seen (empty when nothing delegated). A profile
    hook sees every Python call, whatever name the caller reached the reference by.
    """

    def __init__(self, names: set[str], given=()):
        self.found: list[str] = []
        self._given = set(given)  # code the lab hands out (a class's given methods): not the
        # learner's, so what it calls is not delegation
        self._codes = {c: name for ref, name in reference_objects(names).items()
                       for c in _codes(ref)}
        self._copies = _copies(self._codes)
        self._seen: dict[types.CodeType, str | None] = {}  # learner code -> copied reference
        self._kit_refs = _kit_references()  # watched for every check, with or without tx refs
        self._smoothing = "label_smoothing_loss" in names  # PyTorch's own smoothed loss
        self._ce = torch.nn.functional.cross_entropy.__code__
        routes = [TORCH_ROUTES[n] for n in sorted(names) if n in TORCH_ROUTES]
        self._torch_codes = {f.__code__: f.__qualname__ for fns, _ in routes
                             for f in map(_loaded, fns) if f is not None}
        self._torch_words = tuple(w for _, words in routes for w in words)
        self._previous = None

    def __enter__(self):
        self._previous = sys.getprofile()
        self._previous_threads = threading.getprofile()
        self._active = bool(self._codes or self._kit_refs or self._smoothing
                            or self._torch_codes or self._torch_words)
        if self._active:
            sys.setprofile(self._hook)
            threading.setprofile(self._hook)  # a thread the learner's code starts is watched too
        return self

    def __exit__(self, *exc):
        if self._active and sys.getprofile() != self._hook:  # the learner's code unhooked it
            self._add("it switches off the grader's watch (sys.setprofile), so what it calls "
                      "cannot be seen")
        sys.setprofile(self._previous)
        threading.setprofile(self._previous_threads)
        outer = getattr(self._previous, "__self__", None)
        if isinstance(outer, watch_references):  # a check's own watch inside mark_exercise's
            for text in self.found:
                outer._add(text)
        return False

    def _hook(self, frame, event, arg):
        if self._previous is not None:  # an outer watch sees every call too
            self._previous(frame, event, arg)
        if event == "c_call":
            self._c_call(frame, getattr(arg, "__name__", ""))
            return
        if event != "call":
            return
        code = frame.f_code
        if code in _OP_CALLS and self._smoothing and self._aten_smoothing(frame):
            return
        if code in self._torch_codes or (code in _OP_CALLS and self._torch_words):
            name = self._torch_codes.get(code) or str(frame.f_locals.get("self"))
            if ((code in self._torch_codes or any(w in name for w in self._torch_words))
                    and self._learner_caller(frame)):
                self._add_torch(name)
            return
        if code is self._ce and self._smoothing:
            if frame.f_locals.get("label_smoothing") and self._learner_caller(frame):
                self._add("it calls PyTorch's cross-entropy with label_smoothing=..., the "
                          "built-in smoothed loss: the exercise asks you to build that loss "
                          "yourself")
            return
        name = self._codes.get(code)
        if name is None:
            kit = self._kit_refs.get(code)
            if kit is not None:  # the checks' own reference code, reached from the learner's
                caller = self._learner_caller(frame)
                if caller is not None:
                    self._add(f"{caller} calls the lab kit's {kit}, the reference the checks "
                              "compare with")
                return
            if code not in self._seen:  # a copy of the reference's source, under any name
                path = os.path.abspath(code.co_filename)
                self._seen[code] = (None if path.startswith((_KIT_DIR,) + _PASS_THROUGH)
                                    or code in self._given
                                    else self._copies.get(_fingerprint(code)))
            copied = self._seen[code]
            if copied:
                self._add(f"it runs a copy of tx_helpers' {copied} ({code.co_name}, "
                          "compiled again from the reference's source)")
            return
        caller = self._learner_caller(frame)
        if caller is not None:
            self._add(f"{caller} calls tx_helpers' {name}, the reference this exercise "
                      "rebuilds")
            return
        if code.co_argcount and code.co_varnames[0] == "self":
            owner = type(frame.f_locals.get("self"))
            if not _is_tx(owner):
                self._add(f"{owner.__name__} runs tx_helpers' {name}.{code.co_name} (it "
                          f"subclasses or borrows from {name})")

    def _aten_smoothing(self, frame) -> bool:
        """An ATen cross-entropy (``torch.ops.aten.cross_entropy_loss``) called by the learner
        with a smoothing argument above 0: PyTorch's smoothed loss by another door."""
        op, local = str(frame.f_locals.get("self")), frame.f_locals
        if "cross_entropy_loss" not in op:
            return False
        args, kwargs = local.get("args", ()), local.get("kwargs", {})
        eps = kwargs.get("label_smoothing", args[5] if len(args) > 5 else 0.0)
        try:
            smooths = float(eps) > 0
        except (TypeError, ValueError):
            smooths = True
        if smooths and self._learner_caller(frame):
            self._add(f"it calls PyTorch's {op} with label_smoothing=..., the built-in smoothed "
                      "loss: the exercise asks you to build that loss yourself")
        return True

    def _c_call(self, frame, name: str) -> None:
        """A C function called: PyTorch's fused version of the exercise (from the learner's
        code, through any torch wrapper), or its cross-entropy entry called straight."""
        if self._torch_words and any(w in name for w in self._torch_words):
            if self._learner_caller(frame, start=frame):
                self._add_torch(name)
        elif (self._smoothing and name == _CE_ENTRY and self._learner_caller(frame, start=frame)
              and not os.path.abspath(frame.f_code.co_filename).startswith(_PASS_THROUGH)):
            self._add("it calls PyTorch's cross-entropy entry (torch._C._nn.cross_entropy_loss) "
                      "directly, which smooths inside PyTorch: the exercise asks you to build "
                      "the smoothed loss yourself")

    def _learner_caller(self, frame, start=None) -> str | None:
        """The learner's function nearest to ``frame`` on the stack (from ``start``, the
        caller by default), or None if the lab kit called it (torch, tx_helpers and the
        standard library are passed through)."""
        caller = frame.f_back if start is None else start
        while caller is not None:
            path = os.path.abspath(caller.f_code.co_filename)
            if path.startswith(_KIT_DIR) or caller.f_code in self._given:
                return None
            if not path.startswith(_PASS_THROUGH):
                return f"your {caller.f_code.co_name}"
            caller = caller.f_back
        return None

    def _add_torch(self, name: str) -> None:
        """One sentence for PyTorch's route (an ATen operator also runs as a C function)."""
        if not any(text.startswith("it calls PyTorch's") for text in self.found):
            self._add(f"it calls PyTorch's {name}, the whole of this exercise in one call")

    def _add(self, text: str) -> None:
        if text not in self.found:
            self.found.append(text)
