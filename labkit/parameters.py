"""Check: notebook 01's parameter counter, a Transformer's counts per sub-module from its config.

:func:`check_parameter_counts` grades ``fn(config) -> dict`` that returns, for a
:class:`tx_helpers.ModelConfig`, the number of trainable parameters of ``tx.Transformer(config)``
in each group of :data:`GROUPS`, computed from the config's sizes (a tied table counted once,
under "embeddings"). The reference is measured on the built model (on the ``meta`` device, so
no memory), and its total equals ``tx.count_parameters``. On a mismatch the check compares the
learner's counts with those of the usual mistakes, alone and in pairs, on every probe config:
biases forgotten, a LayerNorm without its shift, the final norms or the decoder's cross-attention
left out, a tied table counted more than once, the positional table (a buffer) counted, d_ff
taken as 4 d_model. Building any ``nn.Module`` (a tx block, ``nn.Transformer``, an ``nn.Linear``)
or calling ``tx.count_parameters`` inside the function fails (``param_built_model``), and so does
calling the kit's own reference (``_formula``, ``_references``: ``delegated``). Besides three fixed
configs, one is drawn at random on every call, so answers stored for the fixed ones fail; and a
child process started or fed while the function runs (``subprocess``, ``os.fork``,
``multiprocessing``, a process pool) is refused (``param_child_process``): a model built there is
still a model built; so is undoing the locks through PyTorch's private hook dicts.
"""
from __future__ import annotations

import itertools
import numbers
import random
import sys
from dataclasses import replace

import torch

import tx_helpers
from tx_helpers import introspection, model
from tx_helpers.config import ModelConfig

from .delegation import watch_references
from .mistakes import MISTAKES
from .report import CheckResult, _call, _Failed, _Report, _run_check

GROUPS = ("embeddings", "attention", "feed-forward", "layer norms", "generator")

MISTAKES.update({
    "param_not_a_dict": ("the function does not return a dict of counts per group",
                         "return one int per group name: " + ", ".join(GROUPS)),
    "param_no_biases": ("the biases of the linear layers are not counted",
                        "every nn.Linear here has a bias as well as its weight matrix"),
    "param_layernorm_gain_only": ("each LayerNorm is counted with its gain only",
                                  "a LayerNorm learns two vectors of d_model numbers"),
    "param_no_final_norms": ("the final LayerNorm of each stack is missing",
                             "tx adds one LayerNorm after the last layer of the encoder and "
                             "one after the last layer of the decoder (print the model)"),
    "param_no_cross_attention": ("the decoder layers are counted with one attention block",
                                 "a decoder layer attends twice: to itself and to the memory"),
    "param_tied_counted_twice": ("with share_embeddings=True the shared table is counted more "
                                 "than once", "a tied matrix is one Parameter, whatever number "
                                 "of modules hold it"),
    "param_buffer_counted": ("the positional-encoding table is counted as parameters",
                             "the table is a buffer: saved with the model, never trained"),
    "param_d_ff_assumed": ("the feed-forward width is taken as 4 x d_model",
                           "read the hidden width from the config: it is its own field"),
    "param_group_wrong": ("some groups differ from the built model's counts",
                          "count each group's matrices and vectors from the shapes of "
                          "notebook 01's printed model, one sub-layer at a time"),
    "param_built_model": ("the counts come from a model or module built inside the function "
                          "(or from tx.count_parameters)",
                          "the exercise asks for the counts from the config's sizes alone: "
                          "multiply the shapes of each block, build nothing"),
    "param_child_process": ("the function starts or feeds another process (subprocess, fork, "
                            "multiprocessing), which could build the model for it",
                            "count in the function itself, from the config's sizes: no other "
                            "process, no model"),
})

# (label, config): sizes all different, a tied model, and d_ff != 4 d_model.
_CONFIGS = (
    ("ModelConfig()", ModelConfig()),
    ("untied, vocab 50/70, d_model 24, d_ff 40, 3 layers",
     ModelConfig(src_vocab_size=50, tgt_vocab_size=70, d_model=24, n_heads=4, d_ff=40,
                 n_layers=3, max_len=30)),
    ("tied, vocab 60, d_model 16, d_ff 48, 1 layer",
     ModelConfig(src_vocab_size=60, tgt_vocab_size=60, d_model=16, n_heads=2, d_ff=48,
                 n_layers=1, max_len=20, share_embeddings=True)),
)


def group_of(name: str) -> str:
    """The group of a parameter name such as ``decoder.layers.0.cross_attn.w_q.weight``."""
    if ".embedding." in name:
        return "embeddings"
    if "_attn." in name:
        return "attention"
    if ".feed_forward." in name:
        return "feed-forward"
    if "norm" in name:
        return "layer norms"
    if name.startswith("generator."):
        return "generator"
    raise ValueError(f"no group for parameter {name!r}")


def measured_counts(config: ModelConfig) -> dict[str, int]:
    """Counts per group of ``tx.Transformer(config)``, built on the meta device."""
    with torch.device("meta"):
        built = model.Transformer(config)
    counts = dict.fromkeys(GROUPS, 0)
    for name, p in built.named_parameters():  # a tied Parameter is listed once
        if p.requires_grad:
            counts[group_of(name)] += p.numel()
    if sum(counts.values()) != introspection.count_parameters(built):
        raise AssertionError("the groups do not add up to tx.count_parameters")
    return counts


_REFS: list = []


def _references() -> list:
    """(label, config, measured counts) for the probe configs, measured once per session."""
    if not _REFS:
        _REFS.extend((label, c, measured_counts(c)) for label, c in _CONFIGS)
    return _REFS


_DRAWN = "a config drawn at random for this call"


def _drawn_config() -> ModelConfig:
    """A config with sizes drawn afresh (from the OS's randomness, not the seeded generators)."""
    pick = random.SystemRandom()
    n_heads = pick.choice((1, 2, 4, 8))
    d_model = n_heads * pick.randint(2, 12)
    d_ff = pick.choice([f for f in range(8, 200, 4) if f != 4 * d_model])
    tied = pick.random() < 0.5
    src = pick.randint(10, 300)
    tgt = src if tied else pick.choice([v for v in range(10, 300) if v != src])
    return ModelConfig(src_vocab_size=src, tgt_vocab_size=tgt, d_model=d_model, n_heads=n_heads,
                       d_ff=d_ff, n_layers=pick.randint(1, 4), max_len=pick.randint(8, 100),
                       pad_idx=pick.randint(0, 5), share_embeddings=tied)


def _formula(c: ModelConfig, *, biases=True, ln_vectors=2, final_norms=True, cross=True,
             tied_tables=1, tied_generator=False, pe_tables=0, d_ff=None) -> dict[str, int]:
    """Counts from the sizes, with switches for the usual mistakes."""
    d, n, f = c.d_model, c.n_layers, d_ff or c.d_ff
    b = 1 if biases else 0
    attn = 4 * (d * d + b * d)
    ffn = d * f + b * f + f * d + b * d
    dec_attn = 2 if cross else 1
    norms = (2 * n + 3 * n + (2 if final_norms else 0)) * ln_vectors * d
    if c.share_embeddings:
        tables = tied_tables * c.src_vocab_size * d
        generator = b * c.tgt_vocab_size + (c.tgt_vocab_size * d if tied_generator else 0)
    else:
        tables = (c.src_vocab_size + c.tgt_vocab_size) * d
        generator = c.tgt_vocab_size * d + b * c.tgt_vocab_size
    return {"embeddings": tables + pe_tables * c.max_len * d,
            "attention": n * attn + n * dec_attn * attn,
            "feed-forward": 2 * n * ffn, "layer norms": norms, "generator": generator}


_VARIANTS = {  # mistake key -> list of formula switches (any one of them names it)
    "param_no_biases": [{"biases": False}],
    "param_layernorm_gain_only": [{"ln_vectors": 1}],
    "param_no_final_norms": [{"final_norms": False}],
    "param_no_cross_attention": [{"cross": False}],
    "param_tied_counted_twice": [{"tied_generator": True}, {"tied_tables": 2},
                                 {"tied_tables": 2, "tied_generator": True}, {"tied_tables": 3}],
    "param_buffer_counted": [{"pe_tables": 1}, {"pe_tables": 2}],
    "param_d_ff_assumed": [{"d_ff": -1}],
}


def _variant(c: ModelConfig, switches: dict) -> dict[str, int]:
    kw = dict(switches)
    if kw.get("d_ff") == -1:
        kw["d_ff"] = 4 * c.d_model
    return _formula(c, **kw)


def _as_counts(report: _Report, got, label: str) -> dict[str, int]:
    if not isinstance(got, dict) or not set(GROUPS) <= set(got):
        keys = sorted(map(str, got)) if isinstance(got, dict) else type(got).__name__
        report.probe(False, f"fn({label}) returns a dict with the keys {list(GROUPS)} "
                     f"(got {keys})")
        report.mistake("param_not_a_dict")
        raise _Failed
    extra = sorted(map(str, set(got) - set(GROUPS)))
    if extra:
        report.note(f"the keys {extra} are not groups of the exercise and are not checked")
    out = {}
    for key in GROUPS:
        value = got[key]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        whole = isinstance(value, numbers.Integral) or (
            isinstance(value, numbers.Real) and float(value).is_integer())
        if isinstance(value, bool) or not whole:
            report.probe(False, f"fn({label})[{key!r}] is a whole number (got {value!r})")
            report.mistake("param_not_a_dict")
            raise _Failed
        out[key] = int(value)
    return out


class _Built(BaseException):
    """Raised when a module is built (or tx.count_parameters called) while fn runs."""


_HOOK_DICTS = tuple(f"_global_{k}_registration_hooks" for k in ("parameter", "buffer", "module"))


def _unlocks(fn) -> bool:
    """Whether fn's code (its nested functions and helpers too) names PyTorch's hook dicts."""
    stack, seen, env = [getattr(fn, "__code__", None)], set(), getattr(fn, "__globals__", {})
    while stack:
        code = stack.pop()
        if code is None or code in seen:
            continue
        if any("registration_hooks" in name for name in code.co_names):
            return True
        seen.add(code)
        stack += [c for c in code.co_consts if hasattr(c, "co_names")]  # nested functions
        stack += [getattr(env.get(n), "__code__", None) for n in code.co_names]  # its helpers
    return False


def _forbid_models():
    """Refuse building any ``nn.Module`` (and ``tx.count_parameters``) until ``restore()``
    runs; returns ``(restore, refused)``, true once anything was refused. Two locks:
    ``nn.Module.__init__`` raises, and so do PyTorch's global hooks for a parameter, buffer or
    sub-module registered on any module; a constructor restored by the learner's code
    (``cls.__init__ = saved``) still registers its parameters, so it is still caught. A refusal
    the learner's code swallows is remembered, and so is a lock the learner's code undid."""
    from torch.nn.modules import module as torch_module

    class _Refused(list):
        def __bool__(self) -> bool:  # also true once the learner's code undid a lock
            cleared = any(h.id not in (h.hooks_dict_ref() or {}) for h in handles)
            swapped = any(getattr(torch_module, k) is not d for k, d in hook_dicts.items())
            return len(self) > 0 or cleared or swapped or torch.nn.Module.__init__ is not refuse
    refused = _Refused()

    def refuse(*args, **kwargs):
        refused.append(True)
        raise _Built

    hook_dicts = {name: getattr(torch_module, name) for name in _HOOK_DICTS}
    init = torch.nn.Module.__init__
    counters = [(mod, mod.count_parameters) for mod in (tx_helpers, introspection)]
    torch.nn.Module.__init__ = refuse
    for mod, _ in counters:
        mod.count_parameters = refuse
    handles = [register(refuse) for register in (
        torch_module.register_module_parameter_registration_hook,
        torch_module.register_module_buffer_registration_hook,
        torch_module.register_module_module_registration_hook)]

    def restore() -> None:
        torch.nn.Module.__init__ = init
        for mod, fn in counters:
            mod.count_parameters = fn
        for handle in handles:
            handle.remove()
    return restore, refused


_CHILD_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn",
                           "os.spawn", "os.exec", "os.system", "pty.spawn"})
_CHILD_REFUSALS: list = []  # while fn runs: [the list its refusals go to]


def _child_hook(event: str, args) -> None:
    """The audit hook (installed once, never removable) that refuses a new process."""
    if _CHILD_REFUSALS and event in _CHILD_EVENTS:
        _CHILD_REFUSALS[0].append(event)
        raise _Built


def _forbid_children():
    """Refuse starting or feeding another process until ``restore()``; returns
    ``(restore, refused)``, a list of what was refused (kept if the learner swallows it).

    The audit hook sees ``subprocess``, ``os.fork``/``posix_spawn``/``system``/``exec``; the
    routes it does not see are locked by hand: a multiprocessing ``Process.start`` (spawn and
    forkserver start no audited fork), ``_posixsubprocess.fork_exec``, and handing work to a
    process pool, queue or pipe that was started before the call."""
    import _posixsubprocess
    import concurrent.futures
    import multiprocessing.connection
    import multiprocessing.pool
    import multiprocessing.process
    import multiprocessing.queues

    if _child_hook not in _HOOKED:
        sys.addaudithook(_child_hook)
        _HOOKED.append(_child_hook)
    refused: list[str] = []

    def lock(name):
        def refuse(*args, **kwargs):
            refused.append(name)
            raise _Built
        return refuse

    routes = [(_posixsubprocess, "fork_exec"),
              (multiprocessing.process.BaseProcess, "start"),
              (concurrent.futures.ProcessPoolExecutor, "submit"),
              (multiprocessing.queues.Queue, "put"),
              (multiprocessing.queues.SimpleQueue, "put"),
              (multiprocessing.connection._ConnectionBase, "send"),
              (multiprocessing.connection._ConnectionBase, "send_bytes")]
    routes += [(multiprocessing.pool.Pool, name) for name in (
        "apply_async", "_map_async", "imap", "imap_unordered")]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in routes]
    for owner, name, _ in saved:
        setattr(owner, name, lock(f"{getattr(owner, '__name__', owner)}.{name}"))
    _CHILD_REFUSALS[:] = [refused]

    def restore() -> None:
        _CHILD_REFUSALS.clear()
        for owner, name, original in saved:
            setattr(owner, name, original)
    return restore, refused


_HOOKED: list = []


def check_parameter_counts(fn, verbose: bool = True) -> CheckResult:
    """Check ``fn(config) -> {group: count}`` against the built ``tx.Transformer(config)``.

    The groups are :data:`GROUPS`; a tied table is counted once, under "embeddings" (so the
    generator of a tied model holds only its bias). Probes a default, an untied and a tied
    config whose sizes all differ; a mismatch is compared with the usual mistakes (alone and
    in pairs) on every config.
    """
    def body(report: _Report):
        drawn = _drawn_config()
        cached = list(_references())
        refs = [*cached, (_DRAWN, drawn, measured_counts(drawn))]
        got_all = []
        _REFS.clear()  # the cached answers are out of reach while fn runs
        restore, refused = _forbid_models()
        if _unlocks(fn):
            refused.append(True)
        restore_children, children = _forbid_children()
        watch = watch_references(set())  # the kit's own _formula and _references
        try:
            with watch:
                for label, c, _ in refs:
                    try:
                        got = _call(report, f"fn({label})", fn, replace(c))
                    except (_Built, _Failed):
                        if not (refused or children):
                            raise
                    if children or not (_CHILD_REFUSALS and _CHILD_REFUSALS[0] is children):
                        report.probe(False, f"fn({label}) counts in its own process")
                        report.mistake("param_child_process", children[0] if children else None)
                        raise _Failed
                    if refused:
                        report.probe(False, f"fn({label}) counts from the config's sizes")
                        report.mistake("param_built_model")
                        raise _Failed
                    got_all.append(_as_counts(report, got, label))
        finally:
            restore_children()
            restore()
            _REFS[:] = cached
            if watch.found:
                report.mistake("delegated", "; ".join(watch.found))
        if watch.found:
            report.probe(False, "fn counts without the lab kit's own reference")
            raise _Failed
        for (label, _, ref), got in zip(refs, got_all, strict=True):
            total = ("" if label == _DRAWN
                     else f" (total {sum(ref.values()):,} = tx.count_parameters)")
            report.probe(got == ref, f"counts for {label} match tx.Transformer{total}")
        if all(got == ref for (_, _, ref), got in zip(refs, got_all, strict=True)):
            return
        _name_mistakes(report, refs, got_all)

    return _run_check("check_parameter_counts", body, verbose, fn)


def _name_mistakes(report: _Report, refs, got_all) -> None:
    """Find the mistake (or pair) whose counts equal the learner's on every config."""
    singles = [(key, sw) for key, options in _VARIANTS.items() for sw in options]
    for size in (1, 2):
        for combo in itertools.combinations(singles, size):
            keys = [k for k, _ in combo]
            if len(set(keys)) < size:
                continue
            switches = {k: v for _, sw in combo for k, v in sw.items()}
            if all(_variant(c, switches) == got
                   for (_, c, _), got in zip(refs, got_all, strict=True)):
                for key in keys:
                    report.mistake(key)
                return
    for (label, _, ref), got in zip(refs, got_all, strict=True):
        wrong = [f"{g} {got[g]:,} (built model {ref[g]:,})" for g in GROUPS if got[g] != ref[g]]
        if wrong:
            report.mistake("param_group_wrong", f"for {label}: " + "; ".join(wrong))
            return
