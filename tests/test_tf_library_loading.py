"""The op library loads at import; without it keras_yoso warns once and runs the composites."""

import os
import subprocess
import sys
import textwrap

import pytest
from tensorflow.python.framework import kernels

from conftest import CUSTOM_OPS_EXPECTED
from keras_yoso import ops
from keras_yoso.ops import _spec


def _devices(op_name):
    return {k.device_type for k in kernels.get_registered_kernels_for_op(op_name).kernel}


def test_custom_ops_load_whenever_they_are_expected():
    """A broken build fails here, not as skipped tests: with TensorFlow installed and
    KERAS_YOSO_DISABLE_CUSTOM_OPS unset, the library must load."""
    if not CUSTOM_OPS_EXPECTED:
        pytest.skip("KERAS_YOSO_DISABLE_CUSTOM_OPS=1: the custom ops are disabled on purpose")
    assert ops.custom_ops_available(), ops.custom_ops_load_error()


def test_import_registers_cpu_kernels_for_every_op():
    if not CUSTOM_OPS_EXPECTED:
        pytest.skip("KERAS_YOSO_DISABLE_CUSTOM_OPS=1: the custom ops are disabled on purpose")
    for name in _spec.raw_ops():
        assert "CPU" in _devices(name), name


@pytest.mark.skipif(os.environ.get("KERAS_YOSO_EXPECT_GPU_KERNELS") != "1",
                    reason="set KERAS_YOSO_EXPECT_GPU_KERNELS=1 when the build had nvcc (CI does)")
def test_gpu_kernels_are_registered_when_built_with_nvcc():
    for name in _spec.raw_ops("gpu"):
        assert "GPU" in _devices(name), name
    for name in _spec.raw_ops("cpu", only=True):  # CPU only: TensorFlow places them on the CPU itself
        assert "GPU" not in _devices(name), name


def test_missing_library_warns_once_and_falls_back_to_composite():
    code = textwrap.dedent("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import keras_yoso
            from keras_yoso import ops
            import numpy as np
            qc = np.zeros((1, 2, 3), np.int32)
            out = ops.lsh_cumulation(qc, qc, np.ones((1, 3, 2), np.float32), 4)
        assert not ops.custom_ops_available()
        messages = [str(w.message) for w in caught if "keras_yoso custom ops" in str(w.message)]
        assert len(messages) == 1, messages
        assert "KERAS_YOSO_DISABLE_CUSTOM_OPS" in messages[0] and "pip install" in messages[0]
        assert float(out.numpy().max()) == 3.0
        try:
            ops.lsh_cumulation(qc, qc, np.ones((1, 3, 2), np.float32), 4, implementation="custom_op")
        except RuntimeError as err:
            assert "not loaded" in str(err)
        else:
            raise AssertionError("custom_op without a library must raise")
        print("ok")
    """)
    env = dict(os.environ, KERAS_YOSO_DISABLE_CUSTOM_OPS="1", TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
