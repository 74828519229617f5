"""setup.py's compile cache (custom_ops/compile_cache.py, KERAS_YOSO_COMPILE_CACHE): an object is reused
only for the same command on files of the same contents, wherever the checkout lies."""

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "custom_ops"))
import compile_cache  # noqa: E402

CXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs g++")


def _checkout(root, header_value):
    """A source tree in `root`: src/kernel.cc including include/value.h."""
    os.makedirs(os.path.join(root, "src"))
    os.makedirs(os.path.join(root, "include"))
    with open(os.path.join(root, "include", "value.h"), "w") as header:
        header.write(f"constexpr int kValue = {header_value};\n")
    with open(os.path.join(root, "src", "kernel.cc"), "w") as source:
        source.write('#include "value.h"\nextern "C" int value() { return kValue; }\n')
    return root


def _build(root, cache, compiled):
    """Compiles src/kernel.cc of `root` through the cache; returns the object's bytes."""
    obj = os.path.join(root, "kernel.o")
    cmd = [CXX, "-c", "src/kernel.cc", "-o", obj, "-O2", "-fPIC", "-I" + os.path.join(root, "include")]

    def run(command):
        compiled.append(command)
        subprocess.check_call(command, cwd=root)
        return 1.0

    compile_cache.compile_object(cmd, root, cache, run, say=lambda message: None)
    with open(obj, "rb") as handle:
        return handle.read()


def test_a_second_checkout_elsewhere_reuses_the_object_and_a_changed_header_compiles_again(tmp_path):
    cache, compiled = str(tmp_path / "cache"), []
    first = _build(_checkout(str(tmp_path / "a"), 7), cache, compiled)
    assert len(compiled) == 1 and len(os.listdir(cache)) == 1
    # Another folder (absolute paths differ), the same contents: taken from the cache.
    assert _build(_checkout(str(tmp_path / "b"), 7), cache, compiled) == first
    assert len(compiled) == 1
    # A header the source includes changed: a new key, compiled, and both objects kept.
    changed = _build(_checkout(str(tmp_path / "c"), 8), cache, compiled)
    assert len(compiled) == 2 and changed != first and len(os.listdir(cache)) == 2


def test_a_different_flag_is_a_different_key(tmp_path):
    root = _checkout(str(tmp_path / "a"), 7)
    cmd = [CXX, "-c", "src/kernel.cc", "-o", "kernel.o", "-O2", "-I" + os.path.join(root, "include")]
    assert compile_cache.object_key(cmd, root) == compile_cache.object_key(cmd[:4] + ["other.o"] + cmd[5:], root)
    assert compile_cache.object_key(cmd, root) != compile_cache.object_key(cmd[:5] + ["-O3"] + cmd[6:], root)


def test_a_compiler_that_cannot_list_its_inputs_compiles_without_the_cache(tmp_path):
    root = _checkout(str(tmp_path / "a"), 7)
    calls, said = [], []
    cmd = ["no-such-compiler", "-c", "src/kernel.cc", "-o", "kernel.o"]
    result = compile_cache.compile_object(cmd, root, str(tmp_path / "cache"), lambda c: calls.append(c) or 2.0,
                                          say=said.append)
    assert calls == [cmd] and result == 2.0 and not os.path.exists(tmp_path / "cache")
    assert "cannot list the files no-such-compiler reads" in said[0]
