"""Runs one benchmark configuration in a fresh Python process and reads back its JSON result
(`run_isolated`, `run_isolated_script`; `failure_status` says why a child failed), and the timing
helper the in-process benchmarks share (`median_seconds`).

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


def _child(python_args, timeout, environment=None):
    """`python *python_args` in an empty directory, with `environment` added to this process's
    environment variables; the CompletedProcess."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(environment or {}))
    with tempfile.TemporaryDirectory() as empty:
        return subprocess.run([sys.executable, *map(str, python_args)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=empty)


def failure_status(returncode, stderr):
    """The status of a child process that exited with `returncode` != 0: "out of memory" when it was
    killed (-9, 137) or its last lines say so, else "failed (exit N): " and its last stderr lines."""
    tail = stderr.strip().splitlines()[-3:]
    if returncode in (-9, 137) or any(word in line for line in tail
                                      for word in ("OOM", "MemoryError", "RESOURCE_EXHAUSTED")):
        return "out of memory"
    return f"failed (exit {returncode}): {' | '.join(tail)[:400]}"


def _run_json(python_args, timeout, environment):
    start = time.perf_counter()
    try:
        proc = _child(python_args, timeout, environment)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout (> {timeout:g} s)"}
    if proc.returncode != 0:
        return {"status": failure_status(proc.returncode, proc.stderr)}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["status"] = "ok"
    result["wall_s"] = time.perf_counter() - start
    return result


def run_isolated(child_code, argv, timeout, environment=None):
    """Runs `python -c child_code *argv` (with `environment`: {name: value} added to the environment
    variables); its last stdout line must be a JSON object.

    Returns that object with "status": "ok" and "wall_s", or {"status": "timeout ..." |
    "out of memory" | "failed ..."}.
    """
    return _run_json(["-c", child_code, *argv], timeout, environment)


def run_isolated_script(path, argv, timeout, environment=None):
    """run_isolated for a script file: `python path *argv`, in the same empty directory (so a relative
    path in argv names a file inside it)."""
    return _run_json([os.path.abspath(path), *argv], timeout, environment)


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
        proc = _child(["-c", _PROBE, backend], timeout=300)
        if proc.returncode != 0:
            sys.exit(f"importing keras_yoso ({backend} backend) in a fresh process failed:\n{proc.stderr[-3000:]}")
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        error = found["custom_ops_error"] if expect_custom_ops else None
        print(package_banner(found["path"], error, backend), flush=True)
