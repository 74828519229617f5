"""Fuzzing the raw custom ops in subprocesses, so that a crash is a test failure, not a dead suite.

tests/programs/fuzz_raw_ops.py draws each case (op, attributes, shapes, codes, NaN/Inf, masks, eager
or graph mode) and checks the contract: the op returns a valid output or raises
InvalidArgumentError (ValueError while a graph is built). The default run fuzzes 300 cases; the
slow suite (`pytest -m slow`) fuzzes 10,000 more from another seed.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import PROGRAMS, requires_custom_ops

DRIVER = os.path.join(PROGRAMS, "fuzz_raw_ops.py")

pytestmark = requires_custom_ops


def _fuzz(seed, first, count, timeout):
    """Runs cases [first, first + count) of `seed` in one subprocess; fails on anything but a clean exit."""
    command = [sys.executable, DRIVER, "--seed", str(seed), "--first", str(first), "--count", str(count)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        started = re.findall(r"^case (\d+)", err.stdout or "", re.M)
        pytest.fail(f"fuzz driver hung (no exit in {timeout} s) at case {started[-1] if started else first}")
    if result.returncode != 0:
        started = re.findall(r"^case (\d+) .*$", result.stdout, re.M)
        last = started[-1] if started else str(first)
        how = (f"crashed (signal {-result.returncode})" if result.returncode < 0
               else f"exited with status {result.returncode}")
        failure = result.stdout[result.stdout.find("FAIL"):] if "FAIL" in result.stdout else result.stderr[-3000:]
        pytest.fail(f"fuzz driver {how} at case {last}; reproduce with\n  python tests/programs/fuzz_raw_ops.py "
                    f"--seed {seed} --first {last} --count 1 --verbose\n{failure}")
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("done"), result.stdout[-2000:]
    counts = dict(item.split("=") for item in summary.split()[1:])
    assert sum(int(v) for v in counts.values()) == count
    return counts


def test_fuzz_300_random_raw_op_calls_never_crash():
    counts = _fuzz(seed=0, first=0, count=300, timeout=300)
    # The mix exercises both sides of the contract.
    assert int(counts.get("ok", 0)) > 50 and int(counts.get("invalid", 0)) > 50, counts


@pytest.mark.slow
@pytest.mark.parametrize("first", range(0, 10_000, 2_500))
def test_fuzz_10000_random_raw_op_calls_never_crash(first):
    _fuzz(seed=1, first=first, count=2_500, timeout=900)
