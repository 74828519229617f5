"""Every Python code block of README.md runs as written, each in a fresh interpreter (as a user
pasting it into a new file would), on the backend it names or on every backend; and the README's
test command is the one CI reads from it.

A block whose first line is a comment starting with a backend's name (`# TensorFlow ...`,
`# JAX ...`, `# PyTorch ...`) runs on that backend only; a block whose first line starts with
`# Excerpt` is part of a larger program (it uses names it does not define) and is not run; every
other block runs on each backend of the suite (CI: TensorFlow, JAX, PyTorch). The blocks are
written with small sizes so that this takes seconds. tests/test_docs.py holds the pages of docs/
to the same rules.
"""

import os
import re

import pytest

from conftest import BACKEND, run_python

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPOSITORY, "README.md")
_BACKEND_NAMES = {"TensorFlow": "tensorflow", "JAX": "jax", "PyTorch": "torch"}
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_FENCE = re.compile(r"^ {0,3}```.*?^ {0,3}```", re.S | re.M)


def python_blocks(path):
    """[(id, code, backend or None)] for the ```python blocks of the Markdown file `path` that run
    (excerpts left out); id = the block's number and the heading of its section."""
    text = open(path, encoding="utf-8").read()
    blocks = []
    for number, match in enumerate(_BLOCK.finditer(text)):
        code = match.group(1)
        if code.startswith("# Excerpt"):
            continue
        prose = _FENCE.sub("", text[:match.start()])  # no code comments taken for headings
        headings = re.findall(r"^#+ (.+)$", prose, re.M)
        named = re.match(r"# (TensorFlow|JAX|PyTorch)\b", code)
        section = re.sub(r"\W+", "-", headings[-1] if headings else "top").strip("-").lower()
        backend = _BACKEND_NAMES[named.group(1)] if named else None
        blocks.append((f"{number}-{section}" + (f"-{backend}-only" if backend else ""), code, backend))
    return blocks


def run_block(code, backend, tmp_path):
    """Runs one block as tests/test_readme.py's rules say (skipped on the other backends)."""
    if backend is not None and backend != BACKEND:
        pytest.skip(f"this block is for KERAS_BACKEND={backend}")
    run_python(code, tmp_path, timeout=600)


_BLOCKS = python_blocks(README)
pytestmark = pytest.mark.all_cases  # every block on every backend, JAX included


def test_readme_has_python_blocks_that_run_on_every_backend():
    assert _BLOCKS, "README.md has no ```python block"
    assert all(backend is None for _, _, backend in _BLOCKS), "the landing page's example runs on every backend"


@pytest.mark.parametrize("code, backend", [(code, backend) for _, code, backend in _BLOCKS],
                         ids=[block_id for block_id, _, _ in _BLOCKS])
def test_readme_python_block_runs_as_written(code, backend, tmp_path):
    run_block(code, backend, tmp_path)


def test_readme_test_command_is_the_one_ci_reads():
    """.ci/run takes the first command line of the first ```bash block after the line that starts
    with "Run the test suite" (an awk program); it must be the suite's `pip install ... && pytest`."""
    lines = open(README, encoding="utf-8").read().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("Run the test suite"))
    fence = next(index for index in range(start, len(lines)) if lines[index].startswith("```bash"))
    command = next(line for line in lines[fence + 1:] if line.strip() and not line.startswith("#"))
    assert command == 'pip install ".[test]" && pytest', command
