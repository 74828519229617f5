"""Runs one benchmark configuration in a fresh Python process and reads back its JSON result.

A fresh process per configuration makes its peak RSS its own; a configuration that
runs out of memory or past the time limit is reported as such instead of crashing
the benchmark.
"""

import json
import os
import subprocess
import sys
import time


def run_isolated(child_code, argv, timeout):
    """Runs `python -c child_code *argv`; its last stdout line must be a JSON object.

    Returns that object with "status": "ok" and "wall_s", or {"status": "timeout ..." |
    "out of memory" | "failed ..."}.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", child_code, *map(str, argv)], capture_output=True, text=True,
                              timeout=timeout, env=env)
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
