"""The import graph of keras_yoso follows the roles of docs/architecture.md: every module imports only
modules of its own role or of the roles below it, and no import runs in a circle. Read from the source
with `ast`, so this needs no backend."""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "keras_yoso")

# Roles from the top down (docs/architecture.md): a module's role is the first prefix that matches it.
ROLES = [
    ("package", ["keras_yoso"]),
    ("conversion", ["keras_yoso.conversion", "keras_yoso.hub"]),
    ("models", ["keras_yoso.models"]),
    ("layers", ["keras_yoso.layers"]),
    ("public ops", ["keras_yoso.ops", "keras_yoso.ops.yoso", "keras_yoso.ops.hashing",
                    "keras_yoso.ops.linear_relative"]),
    ("dispatch", ["keras_yoso.ops._dispatch"]),
    ("providers and mesh", ["keras_yoso.ops.providers", "keras_yoso.ops.parallel"]),
    ("composite", ["keras_yoso.ops.composite"]),
    ("primitive table", ["keras_yoso.ops._spec"]),
    ("foundation", ["keras_yoso._validation", "keras_yoso._backend", "keras_yoso.distribution",
                    "keras_yoso._portable_optimizers"]),
]


def _module_trees():
    """(module name, its `ast` tree) of every module of keras_yoso."""
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            parts = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].split(os.sep)
            with open(path, encoding="utf-8") as f:
                yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), ast.parse(f.read())


def _modules():
    """module name -> set of keras_yoso modules it imports."""
    graph = {}
    for module, tree in _module_trees():
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("keras_yoso"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    imported.add(full if _is_module(full) else node.module)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names if a.name.startswith("keras_yoso"))
        graph[module] = imported - {module}
    return graph


def _imported_names(package):
    """module name -> the names of `package` it imports ("keras_hub.layers", "keras_hub.src.x.y")."""
    names = {}
    for module, tree in _module_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
                names.setdefault(module, set()).update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.setdefault(module, set()).update(a.name for a in node.names if a.name.split(".")[0] == package)
    return names


def _is_module(name):
    path = os.path.join(os.path.dirname(PACKAGE), *name.split("."))
    return os.path.exists(path + ".py") or os.path.isdir(path)


def _role(module):
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(ROLES) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} has no role in ROLES (docs/architecture.md)"
    return max(matches)[1]


def test_every_import_goes_to_the_same_role_or_below():
    upward = [f"{a} ({ROLES[_role(a)][0]}) imports {b} ({ROLES[_role(b)][0]})"
              for a, imported in _modules().items() for b in imported if _role(b) < _role(a)]
    assert not upward, upward


def test_no_import_circle():
    graph = _modules()
    state = {}

    def visit(module, path):
        if state.get(module) == "done":
            return
        if state.get(module) == "open":
            pytest.fail("import circle: " + " -> ".join(path + [module]))
        state[module] = "open"
        for child in sorted(graph.get(module, ())):
            visit(child, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])


def test_the_layers_import_only_the_public_ops_and_the_argument_checks():
    allowed = ("keras_yoso.ops", "keras_yoso._validation")
    wrong = {module: sorted(b for b in imported if b not in allowed and not b.startswith("keras_yoso.layers"))
             for module, imported in _modules().items() if module.startswith("keras_yoso.layers")}
    assert not any(wrong.values()), wrong


def test_keras_hub_is_reached_through_its_public_api_only():
    private = [f"{module} imports {name}" for module, names in _imported_names("keras_hub").items() for name in names
               if any(part.startswith("_") or part == "src" for part in name.split(".")[1:])]
    assert not private, private
