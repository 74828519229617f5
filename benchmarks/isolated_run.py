"""Runs one benchmark configuration in a fresh Python process and reads back its JSON result
(`run_isolated`), and the timing helper the in-process benchmarks share (`median_seconds`).

A fresh process per configuration makes its peak RSS its own; a configuration that
runs out of memory or past the time limit is reported as such instead of crashing
the benchmark. The process starts in an empty directory, so it measures the installed
keras_yoso (or the one PYTHONPATH names), never the unbuilt ./keras_yoso of a checkout
that the script happens to be run from.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

def median_seconds(fn, repeats):
    """The median wall time of `repeats` calls of fn() after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


_PROBE = r"""
import json, os, sys
os.environ["KERAS_BACKEND"] = sys.argv[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras_yoso
print(json.dumps({"path": os.path.dirname(keras_yoso.__file__),
                  "custom_ops_error": keras_yoso.ops.custom_ops_load_error()}))
"""


def _child(child_code, argv, timeout, environment=None):
    """`python -c child_code *argv` in an empty directory, with `environment` added to this process's
    environment variables; the CompletedProcess."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(environment or {}))
    with tempfile.TemporaryDirectory() as empty:
        return subprocess.run([sys.executable, "-c", child_code, *map(str, argv)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=empty)


def run_isolated(child_code, argv, timeout, environment=None):
    """Runs `python -c child_code *argv` (with `environment`: {name: value} added to the environment
    variables); its last stdout line must be a JSON object.

    Returns that object with "status": "ok" and "wall_s", or {"status": "timeout ..." |
    "out of memory" | "failed ..."}.
    """
    start = time.perf_counter()
    try:
        proc = _child(child_code, argv, timeout, environment)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout (> {timeout:g} s)"}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else []
        oom = proc.returncode in (-9, 137) or any("OOM" in t or "MemoryError" in t for t in tail)
        return {"status": "out of memory" if oom else f"failed (exit {proc.returncode}): {tail[0][:120] if tail else ''}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["status"] = "ok"
    result["wall_s"] = time.perf_counter() - start
    return result


def package_banner(path, custom_ops_error=None, backend=None):
    """Which keras_yoso is measured and, when `custom_ops_error` says why the native kernels of
    `backend` (default: the running one) are not loaded, a loud line saying that the composite is
    measured instead."""
    lines = [f"measuring keras_yoso from {path}"]
    if custom_ops_error:
        on = f" on {backend}" if backend else ""
        lines.append(f"!! native kernels not loaded{on} ({custom_ops_error}): measuring the composite")
    return "\n".join(lines)


def announce_package(backends, expect_custom_ops):
    """Prints package_banner for the keras_yoso that run_isolated's processes import on each of
    `backends` (a probe process like them); the native-kernel line only when `expect_custom_ops`."""
    for backend in backends:
        proc = _child(_PROBE, [backend], timeout=300)
        if proc.returncode != 0:
            sys.exit(f"importing keras_yoso ({backend} backend) in a fresh process failed:\n{proc.stderr[-3000:]}")
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        error = found["custom_ops_error"] if expect_custom_ops else None
        print(package_banner(found["path"], error, backend), flush=True)
