"""The PyTorch provider (keras_yoso/ops/providers/torch.py): the native library's CPU kernels as
`torch.library` ops of the `keras_yoso::` namespace, traced by torch.compile through their fake
kernels, with gradients from keras_yoso.ops (torch autograd): what only it has (opcheck, fakes,
devices, threads, libgomp, torch.compile); the contract every native provider keeps is
tests/test_native_provider_contract.py."""

import importlib
import os
import threading

import numpy as np
import pytest

from conftest import BACKEND, CUSTOM_OPS_EXPECTED, random_mask, run_python, run_tests_with_a_failed_native_library
from conftest import to_numpy, trainable_gradients, unit_rows
from keras_yoso import YosoAttention
from keras_yoso import _validation
from keras_yoso import ops
from keras_yoso.ops import _dispatch
from keras_yoso.ops.providers import composite

# Skips only off PyTorch or where the native kernels are not expected (tests/conftest.py): where they
# are expected, a library that failed to load makes these tests fail.
pytestmark = pytest.mark.skipif(BACKEND != "torch" or not CUSTOM_OPS_EXPECTED,
                                reason="PyTorch backend with the native kernels expected only")

if BACKEND == "torch":
    import torch

    from keras_yoso.ops.providers import native_library
    from keras_yoso.ops.providers import torch as torch_provider

# Tolerance of each dtype, relative to max(1, |expected|), for outputs computed from inputs of that dtype.
DTYPES = [("float32", 1e-5), ("float16", 2e-2), ("bfloat16", 8e-2)]
EPSILON = _validation.COLLISION_EPSILON


def _assert_close(actual, expected, tol):
    expected = np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(to_numpy(actual), expected, atol=tol * scale, rtol=tol)


def _codes(rng, batch, m, n, tau):
    return rng.integers(0, 2 ** tau, size=(batch, m, n)).astype(np.int32)


def _op_samples(dtype):
    """(op name, arguments) of every keras_yoso:: op, with masks that drop positions."""
    rng = np.random.default_rng(0)

    def t(array, to=dtype):
        return torch.tensor(np.asarray(array, np.float32)).to(getattr(torch, to))

    def codes(m, n, tau):
        return torch.tensor(_codes(rng, 2, m, n, tau))

    def mask(n):
        return t(random_mask(rng, "random", 2, n), "float32")

    x = t(rng.normal(size=(2, 5, 6)))
    qm, qc, km, kc = mask(5), codes(3, 5, 4), mask(7), codes(3, 7, 4)
    q, k = t(unit_rows(rng, (2, 5, 6))), t(unit_rows(rng, (2, 7, 6)))
    qw, kw, v = t(rng.normal(size=(2, 5, 3))), t(rng.normal(size=(2, 7, 3))), t(rng.normal(size=(2, 7, 4)))
    return [
        ("gaussian_hash_codes", (x, t(rng.normal(size=(6, 12)), "float32"), 3, 4)),
        ("hadamard_hash_codes", (x, t(2 * rng.integers(0, 2, size=(2, 3, 8)) - 1, "float32"), 3, 4)),
        ("lsh_cumulation", (qm, qc, km, kc, v, 16)),
        ("weighted_lsh_cumulation", (qm, qc, qw, km, kc, kw, v, 16)),
        ("collision_cumulation", (qm, qc, q, qw, km, kc, k, kw, 4, EPSILON)),
    ]


def test_the_native_kernels_are_loaded():
    assert torch_provider.PROVIDER.load_error() is None, torch_provider.PROVIDER.load_error()


def test_a_native_library_that_failed_to_load_fails_this_module_instead_of_skipping_it():
    result = run_tests_with_a_failed_native_library(
        "test_torch_native.py", "test_a_native_library_that_failed_to_load_fails_this_module_instead_of_skipping_it")
    assert result.returncode == 1 and " failed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAILED tests/test_torch_native.py::test_the_native_kernels_are_loaded" in result.stdout, result.stdout


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_op_passes_torch_library_opcheck(dtype):
    # No input requires grad: the ops have no autograd formula of their own (keras_yoso.ops brings
    # the gradients), so opcheck checks the schema, the fake kernels and AOT dispatch.
    for name, args in _op_samples(dtype):
        torch.library.opcheck(getattr(torch.ops.keras_yoso, name).default, args)


def test_fake_kernels_give_the_shape_and_dtype_of_the_cpu_kernels():
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name, args in _op_samples("float16"):
        op = getattr(torch.ops.keras_yoso, name).default
        real = op(*args)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        assert (fake.shape, fake.dtype) == (real.shape, real.dtype), name


def test_auto_runs_the_torch_library_ops():
    assert ops.implementation_in_use() == "custom_op"
    assert ops.implementation_in_use("custom_op") == "custom_op"
    assert ops.supports_jit("custom_op")


def test_reimporting_the_provider_keeps_the_registered_ops():
    importlib.reload(torch_provider)
    qc = np.zeros((1, 2, 3), np.int32)
    out = ops.lsh_cumulation(qc, qc, np.ones((1, 3, 2), np.float32), 4, implementation="custom_op")
    np.testing.assert_allclose(to_numpy(out), 3.0)


def test_tensors_off_the_cpu_are_refused_naming_their_device():
    meta = torch.empty((1, 3, 2), device="meta")
    assert torch_provider.PROVIDER.device_error([torch.ones(1), 3]) is None
    with pytest.raises(ValueError, match="native kernels of this process run on cpu.*; this call runs on meta"):
        _dispatch.provider("custom_op", (torch.ones(1), meta))
    assert _dispatch.provider("auto", (meta,)) is composite.PROVIDER


def _cumulation_inputs(n=300):
    rng = np.random.default_rng(5)
    q, k = unit_rows(rng, (3, n, 16)), unit_rows(rng, (3, n, 16))
    return (torch.tensor(q), torch.tensor(k), torch.tensor(rng.normal(size=(3, n, 16)).astype(np.float32)),
            torch.tensor(_codes(rng, 3, 8, n, 6)), torch.tensor(_codes(rng, 3, 8, n, 6)))


def _yoso_forward_backward(q, k, v, qc, kc):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = ops.yoso_cumulation(q, k, v, qc, kc, 6, implementation="custom_op")
    out.square().sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def test_kernels_run_on_torch_num_threads_with_identical_results(monkeypatch):
    threads_used = []
    call = native_library.call

    def recording_call(*args, num_threads):
        threads_used.append(num_threads)
        return call(*args, num_threads=num_threads)

    monkeypatch.setattr(native_library, "call", recording_call)
    inputs = _cumulation_inputs()
    previous = torch.get_num_threads()
    results = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            threads_used.clear()
            results[threads] = _yoso_forward_backward(*inputs)
            assert threads_used and set(threads_used) == {threads}
    finally:
        torch.set_num_threads(previous)
    for one, two in zip(results[1], results[2]):
        assert torch.equal(one, two)


def test_concurrent_python_threads_give_identical_results():
    inputs = _cumulation_inputs()
    expected = _yoso_forward_backward(*inputs)
    results, errors = [None] * 6, []

    def work(index):
        try:
            results[index] = _yoso_forward_backward(*inputs)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(results))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors
    for result in results:
        assert all(torch.equal(a, b) for a, b in zip(result, expected))


# CPU seconds a process spends over 100 short PyTorch ops on 2 threads, each followed by 10 ms of
# idleness, in which libgomp's worker spins (milliseconds by default) or sleeps (throttled).
_IDLE_SPIN_PROBE = """
import os, time
import torch
from keras_yoso.ops.providers import torch as torch_provider
assert torch_provider.PROVIDER.load_error() is None
torch.set_num_threads(2)
x = torch.ones(1 << 18)
for _ in range(5):
    x.add_(1)
time.sleep(0.2)
start = time.process_time()
for _ in range(100):
    x.add_(1)
    time.sleep(0.01)
print("cpu", time.process_time() - start, "throttled", torch_provider._THROTTLED)
"""


def _idle_cpu_seconds(tmp_path, spinning):
    output = run_python(_IDLE_SPIN_PROBE, tmp_path, env={"KERAS_YOSO_TORCH_OPENMP_SPINNING": spinning})
    return float(output.split()[-3])


def test_provider_throttles_the_spinning_of_torch_libgomp_workers(tmp_path):
    if torch_provider.torch_openmp_parallel_region() is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a PyTorch on libgomp and 2 CPUs")
    throttled = _idle_cpu_seconds(tmp_path, "throttled")
    default = _idle_cpu_seconds(tmp_path, "default")
    assert throttled < 0.5 * default, (throttled, default)


@pytest.mark.parametrize("missing", ["libgomp", "openmp_backend"])
def test_provider_leaves_torch_alone_without_libgomp(monkeypatch, missing):
    if missing == "libgomp":  # e.g. a PyTorch on Intel's or LLVM's OpenMP, or no /proc/self/maps
        monkeypatch.setattr(torch_provider, "_loaded_libgomp_paths", lambda: [])
    else:  # PyTorch built with its native thread pool or TBB
        monkeypatch.setattr(torch.__config__, "parallel_info", lambda: "ATen parallel backend: native thread pool")
    assert torch_provider.torch_openmp_parallel_region() is None
    calls = []
    monkeypatch.setattr(native_library, "throttle_openmp_spinning", lambda *args: calls.append(args))
    monkeypatch.setattr(torch_provider, "_THROTTLED", False)
    assert torch_provider.PROVIDER.load_error() is None
    assert calls == []


def _attention_layer(implementation, seed=3, **options):
    return YosoAttention(num_heads=2, key_dim=8, num_hashes=4, hash_code_len=4, seed=seed,
                         implementation=implementation, **options)


def test_yoso_attention_forward_and_backward_match_the_composite():
    rng = np.random.default_rng(6)
    query = torch.tensor(rng.normal(size=(2, 9, 16)).astype(np.float32))
    value = torch.tensor(rng.normal(size=(2, 7, 16)).astype(np.float32))
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    layers = {name: _attention_layer(name) for name in ("custom_op", "composite")}
    layers["custom_op"](query, value, value_mask=mask)
    layers["composite"](query, value, value_mask=mask)
    layers["composite"].set_weights(layers["custom_op"].get_weights())
    results = {name: trainable_gradients(layer, lambda layer=layer: layer(query, value, value_mask=mask).square().sum())
               for name, layer in layers.items()}
    (custom_loss, custom_grads), (composite_loss, composite_grads) = results["custom_op"], results["composite"]
    np.testing.assert_allclose(custom_loss, composite_loss, rtol=1e-4)
    assert len(custom_grads) == len(composite_grads) == 8  # the same variables, in the same order
    for (path, grad), composite_grad in zip(custom_grads.items(), composite_grads.values()):
        np.testing.assert_allclose(grad, composite_grad, rtol=1e-4, atol=1e-4, err_msg=path)


def test_torch_compile_traces_yoso_attention_without_graph_breaks():
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    rng = np.random.default_rng(7)
    first, second = _attention_layer("custom_op"), _attention_layer("custom_op", hash_method="gaussian",
                                                                      backward="collision", seed=4)
    query = torch.tensor(rng.normal(size=(2, 6, 16)).astype(np.float32))
    value = torch.tensor(rng.normal(size=(2, 5, 16)).astype(np.float32))
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])

    def model(query, value, mask):
        hidden = first(query, value, value_mask=mask)
        return second(hidden, hidden)

    def loss_and_gradient(fn):
        q = query.clone().requires_grad_()
        out = fn(q, value, mask)
        (gradient,) = torch.autograd.grad(out.square().sum(), q)
        return out.detach(), gradient

    eager = loss_and_gradient(model)
    backend = AotEagerAndRecordGraphs()
    torch._dynamo.reset()
    compiled = loss_and_gradient(torch.compile(model, fullgraph=True, backend=backend))  # raises on a graph break
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    targets = {str(node.target) for graphs in (backend.fw_graphs, backend.bw_graphs) for graph in graphs
               for node in graph.graph.nodes}
    assert {"keras_yoso.hadamard_interleaved_hash_codes.default", "keras_yoso.gaussian_hash_codes.default",
            "keras_yoso.lsh_cumulation.default", "keras_yoso.lower_bound_gradients.default",
            "keras_yoso.collision_cumulation.default"} <= targets
