"""`make test-portability`: strict nbval on every notebook under other machines' settings.

A learner's machine differs from the one that stored the outputs in its thread count and its
CPU kernels. Each setting below runs every notebook from a fresh kernel, under strict nbval:

- torch at 1, 2 and 4 threads (set by an IPython startup file in a temporary IPYTHONDIR, the
  one way to get more threads than cores);
- ATEN_CPU_CAPABILITY=default: PyTorch's generic kernels instead of the AVX2/AVX-512 ones,
  a stand-in for another CPU.

    python tools/portability.py                  # all settings
    python tools/portability.py threads=4        # one of them
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
}


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
