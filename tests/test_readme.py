"""Every Python code block of README.md runs as written, as a user pasting it into a new file would run
it, on the backend it names or on every backend; and the README's test command is the one CI reads from it.

The blocks of a backend (README.md's and docs/'s) run in one interpreter, each with globals of its own as
`__main__`, in an empty folder of its own, the environment and Keras' global state put back after it
(tests/programs/code_blocks.py): one start of the backend instead of one per block (2026-12-02, PyTorch, on
one core of 2 busy ones: the 10 blocks in 42 s against 184 s in an interpreter each). A block that sets the
environment (`os.environ`, which a backend reads when it starts) runs in a fresh interpreter of its own.

A block whose first line is a comment starting with a backend's name (`# TensorFlow ...`,
`# JAX ...`, `# PyTorch ...`) runs on that backend only; a block whose first line starts with
`# Excerpt` is part of a larger program (it uses names it does not define) and is not run; every
other block runs on each backend of the suite (CI: TensorFlow, JAX, PyTorch). The blocks are
written with small sizes so that this takes seconds. tests/test_docs.py holds the pages of docs/
to the same rules.
"""

import glob
import os
import re

import pytest

from conftest import BACKEND, check_program_case, run_python
from programs.code_blocks import REPOSITORY, needs_fresh_interpreter, python_blocks, shared_cases

README = os.path.join(REPOSITORY, "README.md")


def run_block(page, block_id, code, backend, tmp_path):
    """Runs block `block_id` of `page` (relative to the repository) as this module's rules say, skipped on the
    other backends: with the other blocks of this backend in one interpreter, each as a file of its own would
    run (tests/programs/code_blocks.py), or alone in a fresh interpreter when it sets the environment."""
    if backend is not None and backend != BACKEND:
        pytest.skip(f"this block is for KERAS_BACKEND={backend}")
    if needs_fresh_interpreter(code):
        run_python(code, tmp_path, timeout=600)
    else:
        check_program_case(f"{page}:{block_id}", "code_blocks", cases=shared_cases(BACKEND), cwd=tmp_path,
                           timeout=1800)


_BLOCKS = python_blocks(README)
pytestmark = pytest.mark.all_cases  # every block on every backend, JAX included


def test_readme_has_python_blocks_that_run_on_every_backend():
    assert _BLOCKS, "README.md has no ```python block"
    assert all(backend is None for _, _, backend in _BLOCKS), "the landing page's example runs on every backend"


@pytest.mark.parametrize("block_id, code, backend", _BLOCKS, ids=[block_id for block_id, _, _ in _BLOCKS])
def test_readme_python_block_runs_as_written(block_id, code, backend, tmp_path):
    run_block("README.md", block_id, code, backend, tmp_path)


def test_readme_test_command_is_the_one_ci_reads():
    """.ci/run takes the first command line of the first ```bash block after the line that starts
    with "Run the test suite" (an awk program); it must be the suite's `pip install ... && pytest`."""
    lines = open(README, encoding="utf-8").read().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("Run the test suite"))
    fence = next(index for index in range(start, len(lines)) if lines[index].startswith("```bash"))
    command = next(line for line in lines[fence + 1:] if line.strip() and not line.startswith("#"))
    assert command == 'pip install ".[test]" && pytest', command


def test_every_module_with_tests_for_jax_or_pytorch_only_is_one_ci_runs_on_those_backends():
    """A test marked `runs_on("torch")` or `runs_on("jax")` (conftest) runs only where CI runs its module on that
    backend: .ci/run's BACKEND_TESTS. Outside that list it would skip everywhere, unseen."""
    ci = open(os.path.join(REPOSITORY, ".ci", "run"), encoding="utf-8").read()
    listed = set(re.search(r"^BACKEND_TESTS=\((.*?)\)", ci, re.S | re.M).group(1).split())
    modules = sorted(glob.glob(os.path.join(REPOSITORY, "tests", "test_*.py")))
    other_backend_only = {f"tests/{os.path.basename(path)}" for path in modules
                          if re.search(r"runs_on\([^)]*\"(?:torch|jax)\"", open(path, encoding="utf-8").read())}
    assert "tests/test_quality_protocol.py" in other_backend_only
    assert other_backend_only <= listed, sorted(other_backend_only - listed)
