"""The GPU entry of the native library's C ABI (`ky_run_device`, `ky_device_workspace_bytes`) on a
machine without a GPU: every check that needs no device (counts, dtypes, shapes, the primitive's
Check, the CUDA kernels' own limits, the workspace size) runs on the host and gives the same
messages as the CPU entry; a call that gets as far as the device fails with the CUDA runtime's
message, never a crash. The kernels themselves are checked on a GPU by tests/gpu/."""

import ctypes
import os

import numpy as np
import pytest

from conftest import BACKEND, CUSTOM_OPS_EXPECTED
from keras_yoso.ops import _spec
from keras_yoso.ops.providers import native_library

pytestmark = pytest.mark.skipif(not CUSTOM_OPS_EXPECTED, reason="no native library expected "
                                "(KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")
# CI builds with nvcc and sets this: then the library must hold the CUDA kernels.
CUDA_EXPECTED = os.environ.get("KERAS_YOSO_EXPECT_GPU_KERNELS") == "1"


def _library():
    assert native_library.load_error() is None, native_library.load_error()
    return native_library


def _views(arrays):
    return [native_library.tensor_view(a.ctypes.data, str(a.dtype), a.shape) for a in arrays]


def _lsh_call(num_queries=5, num_keys=6, width=3, num_hashes=2, num_buckets=4):
    rng = np.random.default_rng(0)
    inputs = [np.ones((1, num_queries), np.float32), rng.integers(0, num_buckets, (1, num_hashes, num_queries),
                                                                  dtype=np.int32),
              np.ones((1, num_keys), np.float32), rng.integers(0, num_buckets, (1, num_hashes, num_keys),
                                                               dtype=np.int32),
              rng.standard_normal((1, num_keys, width)).astype(np.float32)]
    return inputs, [num_buckets, 0], [np.empty((1, num_queries, width), np.float32)]


def _needs_cuda_kernels():
    if not _library().device_kernels():
        if CUDA_EXPECTED:
            pytest.fail("KERAS_YOSO_EXPECT_GPU_KERNELS=1 but the native library holds no CUDA kernels")
        pytest.skip("the native library was built without nvcc")


# The primitives whose only GPU kernels are the Triton ones, which a build embeds or not (KERAS_YOSO_TRITON_CUBINS).
TRITON_ONLY = ("lower_bound_gradients", "lsh_cumulation_step")


def test_the_library_says_which_primitives_have_a_cuda_kernel_as_the_table_and_its_build_do():
    library = _library()
    assert library.device_kernels() or not CUDA_EXPECTED
    for name, primitive in _spec.PRIMITIVES.items():
        built = name not in TRITON_ONLY or library.triton_cubins() > 0
        assert library.has_device_kernel(name) == (library.device_kernels() and "gpu" in primitive.devices
                                                    and built), name
        assert (name in library.gpu_kernel_names()) == library.has_device_kernel(name), name
    assert not library.has_device_kernel("no_such_primitive")


def test_the_workspace_size_is_known_on_the_host_and_grows_with_the_call():
    _needs_cuda_kernels()
    small_inputs, attributes, _ = _lsh_call(num_queries=5, num_keys=6)
    large_inputs, _, _ = _lsh_call(num_queries=5000, num_keys=6000, num_buckets=256)
    small = native_library.device_workspace_bytes("lsh_cumulation", _views(small_inputs), attributes)
    large = native_library.device_workspace_bytes("lsh_cumulation", _views(large_inputs), [256, 0])
    assert 0 < small < large


def test_a_call_the_cuda_kernels_cannot_take_is_refused_before_the_device_with_the_reason():
    _needs_cuda_kernels()
    inputs, _, outputs = _lsh_call(num_queries=6, num_keys=6)
    if _library().triton_cubins() == 0:  # the CUDA kernel of lsh_cumulation takes causal = 0 only
        with pytest.raises(ValueError, match="lsh_cumulation has no GPU kernel for causal = 1"):
            native_library.device_workspace_bytes("lsh_cumulation", _views(inputs), [4, 1])
        with pytest.raises(ValueError, match="lsh_cumulation has no GPU kernel for causal = -1"):
            native_library.call_device("lsh_cumulation", _views(inputs), [4, -1], _views(outputs), 0, 0, 0)
    else:  # the Triton causal scan takes both directions up to 12 bits; past its sort nothing does
        for causal in (1, -1):
            assert native_library.device_workspace_bytes("lsh_cumulation", _views(inputs), [4, causal]) > 0
        with pytest.raises(ValueError, match=r"the Triton kernels sort codes of 1 to 12 bits \(num_buckets 2 to "
                                             r"4096\), got num_buckets = 8192"):
            native_library.call_device("lsh_cumulation", _views(inputs), [2 ** 13, 1], _views(outputs), 0, 0, 0)
    # Without the Triton cubins the decoding step and eq. 4 have no GPU kernel, and say how to build one.
    step_inputs = inputs[:5] + [np.zeros((1, 2, 4, 3), np.float32)]
    step_inputs[2] = np.ones((1, 6), np.float32)
    if _library().triton_cubins() == 0:
        with pytest.raises(ValueError, match="lsh_cumulation_step runs on the GPU through the Triton kernels, and "
                                             "this native library embeds none .*KERAS_YOSO_TRITON_CUBINS"):
            native_library.device_workspace_bytes("lsh_cumulation_step", _views(step_inputs), [])
    else:
        assert native_library.device_workspace_bytes("lsh_cumulation_step", _views(step_inputs), []) >= 0


def _lower_bound_call(dtype, dim, width, num_queries=7, num_keys=40, num_hashes=2, num_buckets=64):
    import ml_dtypes  # a dependency of JAX, which CI installs on every backend

    rows = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(0)
    mask = lambda n: np.ones((1, n), np.float32)  # noqa: E731
    codes = lambda n: rng.integers(0, num_buckets, (1, num_hashes, n), dtype=np.int32)  # noqa: E731
    block = lambda n, f: rng.standard_normal((1, n, f)).astype(rows)  # noqa: E731
    inputs = [mask(num_queries), codes(num_queries), block(num_queries, dim), mask(num_keys), codes(num_keys),
              block(num_keys, dim), block(num_keys, width), block(num_queries, width)]
    return _views(inputs), [num_buckets, 0]


def test_the_deterministic_eq_4_refuses_only_exact_float32_rows_wider_than_64_not_16_bit_ones(monkeypatch):
    """The check before the device plans with the call's dtype: the deterministic eq. 4 variants stop at rows 64
    wide for exact fp32 products only (found on an H200, 2026-11-29: bf16 and fp16 calls with rows 100 wide were
    refused with the fp32 message, because the check planned every call as float32)."""
    _needs_cuda_kernels()
    if _library().triton_cubins() == 0:
        pytest.skip("eq. 4 has GPU kernels only where the library embeds the Triton cubins")
    monkeypatch.setenv("KERAS_YOSO_GPU_DETERMINISTIC", "1")
    monkeypatch.delenv("KERAS_YOSO_GPU_TF32", raising=False)
    for dtype in ("bfloat16", "float16"):
        for dim, width in ((100, 1), (64, 100)):
            assert native_library.device_workspace_bytes("lower_bound_gradients",
                                                         *_lower_bound_call(dtype, dim, width)) > 0, (dtype, dim)
    assert native_library.device_workspace_bytes("lower_bound_gradients", *_lower_bound_call("float32", 64, 64)) > 0
    with pytest.raises(ValueError, match=r"exact float32 products takes rows up to 64 wide \(d = 100, D = 1;"):
        native_library.device_workspace_bytes("lower_bound_gradients", *_lower_bound_call("float32", 100, 1))
    monkeypatch.setenv("KERAS_YOSO_GPU_TF32", "1")  # TF32 products: every width up to 128
    assert native_library.device_workspace_bytes("lower_bound_gradients", *_lower_bound_call("float32", 100, 1)) > 0


def test_a_malformed_call_gets_the_cpu_entrys_message_from_the_device_entry():
    _needs_cuda_kernels()
    inputs, attributes, outputs = _lsh_call()
    inputs[4] = inputs[4][0]  # value of rank 2
    with pytest.raises(ValueError) as on_cpu:
        native_library.call("lsh_cumulation", _views(inputs), attributes, _views(outputs))
    with pytest.raises(ValueError) as on_device:
        native_library.call_device("lsh_cumulation", _views(inputs), attributes, _views(outputs), 0, 0, 0)
    assert "value" in str(on_cpu.value) and str(on_device.value) == str(on_cpu.value)
    with pytest.raises(ValueError, match="lsh_cumulation takes 5 inputs, got 4"):
        native_library.device_workspace_bytes("lsh_cumulation", _views(inputs[:4]), attributes)
    error = ctypes.create_string_buffer(256)
    assert native_library.library().ky_run_device(b"no_such_primitive", None, 0, None, 0, None, 0, None, 0, None,
                                                  error, 256) == 1
    assert error.value == b'no keras_yoso primitive named "no_such_primitive"'


def test_a_workspace_smaller_than_the_call_needs_is_refused_naming_both_sizes():
    _needs_cuda_kernels()
    inputs, attributes, outputs = _lsh_call()
    needed = native_library.device_workspace_bytes("lsh_cumulation", _views(inputs), attributes)
    scratch = np.empty(needed, np.uint8)
    with pytest.raises(ValueError, match=f"needs a device workspace of {needed} bytes .* got {needed - 1} bytes"):
        native_library.call_device("lsh_cumulation", _views(inputs), attributes, _views(outputs), scratch.ctypes.data,
                                   needed - 1, 0)
    with pytest.raises(ValueError, match="got 0 bytes at a null pointer"):
        native_library.call_device("lsh_cumulation", _views(inputs), attributes, _views(outputs), 0, 0, 0)


@pytest.mark.skipif(BACKEND == "torch", reason="the torch backend may hold a CUDA context of its own")
def test_a_valid_call_without_a_usable_gpu_fails_with_the_cuda_runtimes_message():
    _needs_cuda_kernels()
    inputs, attributes, outputs = _lsh_call()
    needed = native_library.device_workspace_bytes("lsh_cumulation", _views(inputs), attributes)
    scratch = np.empty(needed, np.uint8)
    # Host pointers: with no GPU (this machine) the runtime reports no device or no driver; on a GPU
    # machine it reports an illegal address or an invalid argument. Either way an error, not a crash.
    with pytest.raises(RuntimeError, match="lsh_cumulation on the GPU: .* failed: cuda"):
        native_library.call_device("lsh_cumulation", _views(inputs), attributes, _views(outputs), scratch.ctypes.data,
                                   needed, 0)


@pytest.mark.skipif(BACKEND != "torch", reason="the torch.library ops")
def test_the_torch_ops_have_a_cuda_kernel_exactly_where_the_library_has_one():
    import torch

    _needs_cuda_kernels()
    for name, primitive in _spec.PRIMITIVES.items():
        registered = torch._C._dispatch_has_kernel_for_dispatch_key(f"keras_yoso::{name}", "CUDA")
        assert registered == _library().has_device_kernel(name), name
        assert registered == ("gpu" in primitive.devices and (name not in TRITON_ONLY or _library().triton_cubins() > 0)), name


def test_causal_gpu_calls_have_kernels_only_where_the_library_embeds_the_triton_cubins():
    """gpu_kernel_names(causal), asked once per direction (the providers read it while torch.compile and jax.jit
    trace, where a ctypes call would break the graph): on a GPU only the Triton kernels take causal != 0."""
    library = _library()
    both = library.gpu_kernel_names(_spec.BIDIRECTIONAL)
    directed = library.gpu_kernel_names(_spec.CAUSAL)
    assert directed == (both if library.triton_cubins() > 0 else frozenset())
    assert library.gpu_kernel_names(_spec.ANTICAUSAL) is directed
