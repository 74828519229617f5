"""Every Python code block of README.md runs as written, each in a fresh interpreter (as a user
pasting it into a new file would), on the backend it names or on every backend.

A block whose first line is a comment starting with a backend's name (`# TensorFlow ...`,
`# JAX ...`, `# PyTorch ...`) runs on that backend only; every other block runs on each backend
of the suite (CI: TensorFlow, JAX, PyTorch). The blocks are written with small sizes so that
this takes seconds.
"""

import os
import re

import pytest

from conftest import BACKEND, run_python

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
_BACKEND_NAMES = {"TensorFlow": "tensorflow", "JAX": "jax", "PyTorch": "torch"}
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _python_blocks():
    """[(id, code, backend or None)] for the README's ```python blocks, id = the section's heading."""
    text = open(README, encoding="utf-8").read()
    blocks = []
    for match in _BLOCK.finditer(text):
        prose = re.sub(r"^```.*?^```", "", text[:match.start()], flags=re.S | re.M)  # no code comments
        headings = re.findall(r"^#+ (.+)$", prose, re.M)
        code = match.group(1)
        named = re.match(r"# (TensorFlow|JAX|PyTorch)\b", code)
        section = re.sub(r"\W+", "-", headings[-1] if headings else "top").strip("-").lower()
        backend = _BACKEND_NAMES[named.group(1)] if named else None
        blocks.append((f"{len(blocks)}-{section}" + (f"-{backend}-only" if backend else ""), code, backend))
    return blocks


_BLOCKS = _python_blocks()
pytestmark = pytest.mark.all_cases  # every block on every backend, JAX included


def test_readme_has_python_blocks_for_every_backend():
    assert len(_BLOCKS) >= 6, [block_id for block_id, _, _ in _BLOCKS]
    assert {"tensorflow", "jax", "torch"} <= {backend for _, _, backend in _BLOCKS}


@pytest.mark.parametrize("code, backend", [(code, backend) for _, code, backend in _BLOCKS],
                         ids=[block_id for block_id, _, _ in _BLOCKS])
def test_readme_python_block_runs_as_written(code, backend, tmp_path):
    if backend is not None and backend != BACKEND:
        pytest.skip(f"this README block is for KERAS_BACKEND={backend}")
    run_python(code, tmp_path, timeout=600)
