"""The environment report (`keras_yoso.show_config()`, `python -m keras_yoso`): what a bug report
needs, on every backend."""

import io
import os
import subprocess
import sys

import keras

from conftest import CUSTOM_OPS_EXPECTED
from keras_yoso import _environment
from keras_yoso import _version
from keras_yoso.ops import _dispatch
from keras_yoso.ops import _spec
from keras_yoso.ops.providers import native_library


def _fields():
    return {section: dict(fields) for section, fields in _environment.config()}


def test_the_report_names_the_version_backend_and_what_runs_each_primitive_on_each_device():
    report = _fields()
    assert report["keras-yoso"]["version"] == _version.__version__
    assert report["keras-yoso"]["backend"] == keras.backend.backend()
    runs = report["what 'auto' runs, per primitive and device"]
    for name in _spec.PRIMITIVES:
        assert runs[name].startswith("cpu: ") and ", gpu: " in runs[name], runs[name]
        if CUSTOM_OPS_EXPECTED:
            assert runs[name].startswith("cpu: custom_op"), runs[name]
    # On a GPU only the Triton kernels take causal != 0: a build that serves the GPU and embeds their cubins
    # runs causal calls there, any other runs them on the composite.
    native, _ = _dispatch.native_provider()
    triton_on_gpu = native is not None and "gpu" in native.devices() and native_library.triton_cubins() > 0
    assert runs["lsh_cumulation (causal)"].endswith("gpu: custom_op" if triton_on_gpu else "gpu: composite")


def test_the_report_says_which_native_library_was_found_and_how_it_was_built():
    libraries = _fields()["libraries"]
    if CUSTOM_OPS_EXPECTED:
        assert os.path.exists(libraries["native library"]), libraries["native library"]
        assert libraries["C ABI version"] == str(native_library.ABI_VERSION)
        assert libraries["built with"].startswith("compiler ")
        cuda = libraries["CUDA kernels"] == "yes"
        assert ("CUDA runtime" in libraries["built with"]) == cuda
        assert libraries["Triton cubins"].split()[0] == str(native_library.triton_cubins())
    else:
        assert libraries["native library"].startswith("not loaded: disabled by KERAS_YOSO_DISABLE_CUSTOM_OPS=1")


def test_show_config_prints_every_section_and_python_m_keras_yoso_prints_the_same():
    printed = io.StringIO()
    _environment.show_config(printed)
    text = printed.getvalue()
    for section, _ in _environment.config():
        assert f"{section}:\n" in text
    assert "CPU features" in text and "usable CPUs" in text
    run = subprocess.run([sys.executable, "-m", "keras_yoso"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "KERAS_BACKEND": keras.backend.backend()})
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"  backend " in run.stdout and keras.backend.backend() in run.stdout
    assert "lower_bound_gradients" in run.stdout
