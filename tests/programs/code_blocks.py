"""The ```python blocks of README.md and docs/*.md, and a run of some of them in this one interpreter, each
as a new file holding it would run: its own globals as `__main__`, its own empty folder, and after it the
environment, the working folder and Keras' global state (session, dtype policy) as they were. One start of
the backend for all the blocks (a start costs 10-15 s of imports on CI's 2 cores, the blocks themselves
1-8 s); tests/test_readme.py and tests/test_docs.py check each block's report (conftest.check_program_case).
A block that sets the environment (`os.environ`, read when the backend starts) runs in a fresh interpreter
of its own instead (`needs_fresh_interpreter`).

    KERAS_BACKEND=torch python tests/programs/code_blocks.py README.md:0-ten-lines docs/ops.md:0-forward

A case is `<page>:<block id>`, the page relative to the repository, the id as `python_blocks` names it.
"""

import os
import re
import sys
import tempfile

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def needs_fresh_interpreter(code):
    """Whether a block sets the environment, which the backend reads when it starts (e.g. XLA_FLAGS)."""
    return "os.environ" in code


def page_paths():
    """README.md and the pages of docs/, relative to the repository."""
    docs = sorted(name for name in os.listdir(os.path.join(REPOSITORY, "docs")) if name.endswith(".md"))
    return ["README.md"] + [f"docs/{name}" for name in docs]


def shared_cases(backend):
    """The cases that run together on `backend`: every block for it or for every backend, unless it needs a
    fresh interpreter. The same tuple for both test modules, so that one run serves them."""
    return tuple(f"{page}:{block_id}" for page in page_paths()
                 for block_id, code, block_backend in python_blocks(os.path.join(REPOSITORY, page))
                 if block_backend in (None, backend) and not needs_fresh_interpreter(code))


def _runner(page, code, root):
    def run():
        import keras

        folder = tempfile.mkdtemp(prefix=re.sub(r"\W+", "-", page) + "-", dir=root)
        environment, working_folder = dict(os.environ), os.getcwd()
        os.chdir(folder)
        try:
            exec(compile(code, os.path.join(REPOSITORY, page), "exec"), {"__name__": "__main__"})
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise RuntimeError(f"the block exited with status {exit_.code!r}") from None
        finally:
            print(flush=True)  # the report's line starts a line of its own, whatever the block printed
            os.chdir(working_folder)
            os.environ.clear()
            os.environ.update(environment)
            keras.backend.clear_session()
            keras.config.set_dtype_policy("float32")
    return run


def main(names):
    from program_cases import run_cases

    blocks = {f"{page}:{block_id}": (page, code) for page in page_paths()
              for block_id, code, _ in python_blocks(os.path.join(REPOSITORY, page))}
    root = os.path.abspath("blocks")
    os.makedirs(root, exist_ok=True)
    run_cases({name: _runner(*blocks[name], root) for name in names if name in blocks}, names)


if __name__ == "__main__":
    main(sys.argv[1:])
