"""`make test-portability`: strict nbval on every notebook under other machines' settings.

A learner's machine differs from the one that stored the outputs in its thread count and its
CPU kernels. Each setting below runs every notebook from a fresh kernel, under strict nbval:

- torch at 1, 2 and 4 threads (set by an IPython startup file in a temporary IPYTHONDIR, the
  one way to get more threads than cores);
- ATEN_CPU_CAPABILITY=default: PyTorch's generic kernels instead of the AVX2/AVX-512 ones
  (elementwise maths, softmax, LayerNorm), a stand-in for another CPU;
- MKL_CBWR=COMPATIBLE: MKL's conditional numerical reproducibility mode, which runs another
  code path in the BLAS (float64 and float32 matrix products): the float64 round-off that
  failed notebook 02 on an AMD EPYC changes with it (8.5e-14 by default there, 8.9e-14 with it);
- ONEDNN_MAX_CPU_ISA=SSE41: caps oneDNN's instruction set, which serves bfloat16 matrix
  products under autocast (notebook 12) and convolutions.

MKL_ENABLE_INSTRUCTIONS and the thread count changed none of those results here, so they are
not separate settings. `--prove-knobs` shows, on your CPU, which computations each knob
changes (a fingerprint per computation, against the default):

    python tools/portability.py                  # all settings
    python tools/portability.py threads=4        # one of them
    python tools/portability.py --prove-knobs    # what each knob changes, in a few seconds
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "threads=1": {"threads": 1, "env": {}},
    "threads=2": {"threads": 2, "env": {}},
    "threads=4": {"threads": 4, "env": {}},
    "cpu-kernels=default": {"threads": 2, "env": {"ATEN_CPU_CAPABILITY": "default"}},
    "blas=compatible": {"threads": 2, "env": {"MKL_CBWR": "COMPATIBLE"}},
    "onednn-isa=sse41": {"threads": 2, "env": {"ONEDNN_MAX_CPU_ISA": "SSE41"}},
}

# One small computation per library path; --prove-knobs prints which of them a knob changes.
FINGERPRINTS = """
import hashlib, json, math, torch
torch.set_num_threads(1)
torch.manual_seed(0)
def h(t):
    return hashlib.sha256(t.detach().float().contiguous().numpy().tobytes()).hexdigest()[:12]
pos = torch.arange(512, dtype=torch.float64).unsqueeze(1)
omega = torch.exp(torch.arange(0, 128, 2, dtype=torch.float64) * (-math.log(10000.0) / 128))
pe = torch.cat([torch.sin(pos * omega), torch.cos(pos * omega)], 1)
k = torch.arange(1, 256)
a = torch.randn(257, 129, dtype=torch.float64)
b = torch.randn(129, 131, dtype=torch.float64)
x = a.float()
out = {
    "float64 round-off of notebook 02": repr((pe[256 + k] @ pe[256] - pe[256 - k] @ pe[256])
                                             .abs().max().item()),
    "float64 matmul (BLAS)": h(a @ b),
    "float32 matmul (BLAS)": h(x @ b.float()),
    "float32 nn.Linear": h(torch.nn.Linear(129, 64)(x)),
    "float32 softmax + LayerNorm (ATen)": h(torch.softmax(x, -1)
                                            + torch.nn.functional.layer_norm(x, (129,))),
    "bfloat16 matmul (oneDNN)": h(x.bfloat16() @ x.bfloat16().T),
}
print(json.dumps(out))
"""


def prove_knobs() -> int:
    """Run FINGERPRINTS under each setting's environment; print what differs from the default."""
    import json

    def fingerprints(env: dict) -> dict:
        full = {**os.environ, **env}
        res = subprocess.run([sys.executable, "-c", FINGERPRINTS], env=full, cwd=ROOT,
                             capture_output=True, text=True, check=True)
        return json.loads(res.stdout)

    base = fingerprints({})
    print(f"default: float64 round-off of notebook 02 = {base['float64 round-off of notebook 02']}")
    for name, setting in SETTINGS.items():
        if not setting["env"]:
            continue
        got = fingerprints(setting["env"])
        changed = [key for key in base if got[key] != base[key]]
        print(f"{name:20} changes: {', '.join(changed) or 'nothing on this CPU'}")
    return 0


def run(name: str, threads: int, env: dict) -> tuple[bool, float]:
    with tempfile.TemporaryDirectory() as ipython_dir:
        startup = Path(ipython_dir) / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-threads.py").write_text(f"import torch\ntorch.set_num_threads({threads})\n")
        full_env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",
                                                                     "MKL_NUM_THREADS")}
        full_env.update(env, IPYTHONDIR=ipython_dir)
        # One notebook at a time when a kernel wants more threads than the machine has cores.
        jobs = ["-n", "auto", "--dist", "loadscope"] if threads * 2 <= (os.cpu_count() or 1) \
            else []
        cmd = [sys.executable, "-m", "pytest", "-q", *jobs, "--nbval", "--nbval-current-env",
               "--nbval-cell-timeout=900", "--ignore=notebooks/exercises", "notebooks"]
        print(f"== {name}: {' '.join(f'{k}={v}' for k, v in env.items()) or 'default kernels'}, "
              f"torch threads {threads}", flush=True)
        start = time.perf_counter()
        ok = subprocess.run(cmd, cwd=ROOT, env=full_env).returncode == 0
        return ok, time.perf_counter() - start


def main(names: list[str]) -> int:
    if names == ["--prove-knobs"]:
        return prove_knobs()
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        print(f"unknown setting(s) {unknown}; expected some of {list(SETTINGS)}")
        return 2
    results = {name: run(name, **SETTINGS[name]) for name in names or SETTINGS}
    print("\nportability summary")
    for name, (ok, seconds) in results.items():
        print(f"  {name:22} {'passed' if ok else 'FAILED':7} {seconds:6.0f} s")
    return 0 if all(ok for ok, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
