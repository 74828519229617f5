"""The documentation site (docs/, mkdocs.yml) holds what it says: its Python blocks run, its API
pages render every public name, its links lead somewhere, and `mkdocs build --strict` passes.

The Python blocks of every page of docs/ run by tests/test_readme.py's rules, each as a new file holding
it would run, in an empty folder (with the README's, in one interpreter: tests/programs/code_blocks.py): a
first line `# TensorFlow ...` / `# JAX ...` / `# PyTorch ...` runs a block on that backend only, a first
line `# Excerpt ...` marks a part of a larger program, which is not run, and every other block runs on
every backend.
"""

import glob
import importlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from programs.code_blocks import page_paths
from test_readme import README, REPOSITORY, python_blocks, run_block

DOCS = os.path.join(REPOSITORY, "docs")
PAGES = [os.path.join(REPOSITORY, path) for path in page_paths() if path.startswith("docs/")]
API_PAGES = sorted(glob.glob(os.path.join(DOCS, "api", "*.md")))
# The modules whose public names (their __all__) the API pages render, each once.
PUBLIC_MODULES = ["keras_yoso", "keras_yoso.ops", "keras_yoso.layers", "keras_yoso.models", "keras_yoso.distribution"]

_BLOCKS = [(f"{os.path.basename(page)[:-3]}-{block_id}", f"docs/{os.path.basename(page)}", block_id, code, backend)
           for page in PAGES for block_id, code, backend in python_blocks(page)]
pytestmark = pytest.mark.all_cases  # every block on every backend, JAX included


def test_the_pages_have_python_blocks_for_every_backend():
    assert len(_BLOCKS) >= 10, [test_id for test_id, *_ in _BLOCKS]
    assert {"tensorflow", "jax", "torch", None} <= {block[-1] for block in _BLOCKS}


@pytest.mark.parametrize("page, block_id, code, backend", [block[1:] for block in _BLOCKS],
                         ids=[block[0] for block in _BLOCKS])
def test_docs_python_block_runs_as_written(page, block_id, code, backend, tmp_path):
    run_block(page, block_id, code, backend, tmp_path)


def _rendered_paths():
    """The dotted paths that the API pages render (`::: keras_yoso.ops.hash_codes`)."""
    paths = []
    for page in API_PAGES:
        paths += re.findall(r"^::: (\S+)$", open(page, encoding="utf-8").read(), re.M)
    return paths


def _resolve(path):
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            target = getattr(target, name)
        return target
    raise ImportError(path)


def test_api_pages_render_every_public_name():
    rendered = [path for path in _rendered_paths() if path.split(".")[:2] != ["keras_yoso", "hub"]]
    objects = [_resolve(path) for path in rendered]
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if not any(value is getattr(module, name) for value in objects):
                missing.append(f"{module_name}.{name}")
    assert not missing, f"public names without an API entry (add `::: <path>` to a page of docs/api/): {missing}"


def test_api_pages_render_keras_hub_layers():
    pytest.importorskip("keras_hub")
    hub = importlib.import_module("keras_yoso.hub")
    rendered = [path for path in _rendered_paths() if path.startswith("keras_yoso.hub.")]
    public = {name for name, value in vars(hub).items()
              if isinstance(value, type) and value.__module__ == hub.__name__ and not name.startswith("_")}
    assert {path.rsplit(".", 1)[1] for path in rendered} == public


def _slug(heading):
    """GitHub's anchor of a heading (mkdocs.yml makes the site's the same)."""
    text = re.sub(r"`|\*\*|\[([^]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path):
    text = re.sub(r"^```.*?^```", "", open(path, encoding="utf-8").read(), flags=re.S | re.M)
    return {_slug(heading) for heading in re.findall(r"^#+ (.+?)\s*$", text, re.M)}


@pytest.mark.parametrize("page", [README] + PAGES, ids=lambda page: os.path.relpath(page, REPOSITORY))
def test_relative_links_lead_to_a_file_and_a_section(page):
    """What mkdocs checks on the site, for readers of the Markdown files (GitHub) too, README
    included: a relative link names a file that exists and, with an anchor, a heading there."""
    text = re.sub(r"^```.*?^```", "", open(page, encoding="utf-8").read(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = os.path.normpath(os.path.join(os.path.dirname(page), file)) if file else page
        if not os.path.exists(path):
            broken.append(target)
        elif anchor and path.endswith(".md") and anchor not in _anchors(path) and not anchor.startswith("keras_yoso"):
            broken.append(target)
    assert not broken, f"{os.path.relpath(page, REPOSITORY)}: {broken}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install the site's requirements: docs/build.md)")
def test_mkdocs_build_strict_passes(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPOSITORY, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stderr[-6000:]
    assert os.path.isfile(tmp_path / "site" / "api" / "ops" / "index.html")
