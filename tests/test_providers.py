"""The provider protocol: keras_yoso.ops reads what a provider declares, never which provider it is,
so a new provider needs no edit to the ops or the layers."""

import numpy as np
import pytest

import numpy_reference as ref
from conftest import BACKEND, CUSTOM_OPS_EXPECTED, DATA_ERROR, to_numpy, unit_rows, vjp
from keras_yoso import YosoAttention
from keras_yoso import ops
from keras_yoso.ops import _dispatch
from keras_yoso.ops import _spec
from keras_yoso.ops.providers import base
from keras_yoso.ops.providers import composite


class _Recording(base.Provider):
    """The composite's primitives under other declarations, recording the per-bucket table widths
    (weight width, value width) of the weighted cumulations and lower-bound backwards it runs, and
    the names of the primitives it runs."""

    name = "custom_op"
    supports_jit = True

    def __init__(self, **declarations):
        self.__dict__.update(declarations)
        self.weighted_widths = []
        self.ran = []

    def run(self, name, *arguments):
        self.ran.append(name)
        if name == "weighted_lsh_cumulation":
            query_weight, value = arguments[2], arguments[6]
            self.weighted_widths.append((int(query_weight.shape[2]), int(value.shape[2])))
        if name == "lower_bound_gradients":  # tables [W, d]: value width by query width
            query, value = arguments[2], arguments[6]
            self.weighted_widths.append((int(value.shape[2]), int(query.shape[2])))
        return composite.PROVIDER.run(name, *arguments)


@pytest.fixture
def install(monkeypatch):
    """install(provider): the running backend's native provider becomes `provider`."""
    def put(provider):
        monkeypatch.setattr(_dispatch, "native_provider", lambda: (provider, None))
        return provider
    return put


def test_a_provider_table_limit_splits_the_lower_bound_gradient_into_columns_that_fit(install):
    provider = install(_Recording(max_bucket_table_floats=64 * 16))
    rng = np.random.default_rng(0)
    q, k = unit_rows(rng, (1, 9, 40)), unit_rows(rng, (1, 11, 40))
    v = rng.standard_normal((1, 11, 64)).astype(np.float32)
    qc = rng.integers(0, 8, (1, 4, 9)).astype(np.int32)
    kc = rng.integers(0, 8, (1, 4, 11)).astype(np.int32)
    cotangent = rng.standard_normal((1, 9, 64)).astype(np.float32)
    _, (dq, dk, _) = vjp(lambda a, b, c: ops.yoso_cumulation(a, b, c, qc, kc, 3, implementation="custom_op"),
                         [q, k, v], cotangent)
    want_dq, want_dk, _ = ref.yoso_lower_bound_gradients(q, k, v, qc, kc, 3, cotangent)
    np.testing.assert_allclose(dq, want_dq, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dk, want_dk, rtol=1e-4, atol=1e-4)
    # Every per-bucket table fit the declared one (64 x 16 floats): the 40 key columns in 3 blocks.
    assert provider.weighted_widths and all(w * d <= 64 * 16 for w, d in provider.weighted_widths)


def test_codes_are_checked_only_for_providers_that_do_not_check_them(install):
    bad = np.array([[[0, 9, 1]]], np.int32)
    value = np.ones((1, 3, 2), np.float32)
    install(_Recording(checks_codes=False))
    with pytest.raises(DATA_ERROR, match="query_codes"):
        to_numpy(ops.lsh_cumulation(bad, bad, value, 4, implementation="custom_op"))
    # A provider that declares it checks codes is trusted with them (the composite drops them).
    install(_Recording(checks_codes=True))
    to_numpy(ops.lsh_cumulation(bad, bad, value, 4, implementation="custom_op"))


def test_a_provider_refusing_the_device_sends_auto_to_the_composite_and_custom_op_to_an_error(install):
    class _OnlyElsewhere(_Recording):
        def device_error(self, tensors, causal=0, primitives=()):
            return "the inputs are on a device these kernels do not serve" if tensors else None

    install(_OnlyElsewhere())
    codes, value = np.zeros((1, 2, 3), np.int32), np.ones((1, 3, 2), np.float32)
    assert ops.implementation_in_use() == "custom_op"  # no tensors: nothing to refuse
    assert _dispatch.provider("auto", (value,)) is composite.PROVIDER
    with pytest.raises(ValueError, match="cannot run here: the inputs are on a device"):
        ops.lsh_cumulation(codes, codes, value, 4, implementation="custom_op")


def test_layers_take_supports_jit_from_the_provider(install):
    install(_Recording(supports_jit=False))
    assert not YosoAttention(2, 4, implementation="custom_op").supports_jit
    assert YosoAttention(2, 4, implementation="composite").supports_jit
    install(_Recording(supports_jit=True))
    assert YosoAttention(2, 4, implementation="custom_op").supports_jit


@pytest.mark.skipif(not CUSTOM_OPS_EXPECTED, reason="native kernels disabled")
def test_the_native_provider_of_each_backend_declares_what_it_does():
    native, error = _dispatch.native_provider()
    assert native is not None, error
    assert ops.implementation_in_use() == "custom_op"
    # TensorFlow's op library has no XLA kernels; the JAX (XLA FFI) and PyTorch (torch.library)
    # providers run inside jax.jit and torch.compile.
    assert ops.supports_jit("custom_op") == (BACKEND != "tensorflow")
    assert ops.supports_jit("composite")
    assert native.checks_codes and not native.needs_static_num_hashes
    assert native.max_bucket_table_floats == 2 ** 28


def test_weighted_cumulation_is_held_to_the_table_limit_the_provider_declares(install):
    install(_Recording(max_bucket_table_floats=4 * 4))
    codes = np.zeros((1, 1, 3), np.int32)
    weight, value = np.ones((1, 3, 4), np.float32), np.ones((1, 3, 5), np.float32)
    with pytest.raises(ValueError, match=r"weight_dim \* value_dim = 4 \* 5 floats .* limit of 16 floats"):
        ops.weighted_lsh_cumulation(codes, weight, codes, weight, value, 2, implementation="custom_op")
    to_numpy(ops.weighted_lsh_cumulation(codes, weight, codes, weight, value[:, :, :4], 2, implementation="custom_op"))


class _OnGpu(_Recording):
    """A native provider whose calls all run on "gpu", where it serves the primitives `_spec` lists there that
    its build holds (`triton_on_gpu`: whether the build embeds the Triton kernels, the only GPU kernels of
    lower_bound_gradients and lsh_cumulation_step)."""

    triton_on_gpu = True

    def device_of(self, tensors):
        return "gpu"

    def devices(self):
        return ("cpu", "gpu")

    def builds_gpu_kernel(self, name, causal=0):
        # Without the Triton kernels: no GPU eq. 4, no GPU decoding step, no causal call on the GPU.
        return self.triton_on_gpu or (name not in ("lower_bound_gradients", "lsh_cumulation_step") and not causal)


@pytest.mark.parametrize("triton_on_gpu", [False, True])
def test_the_eq4_backward_runs_fused_on_a_gpu_only_where_the_build_holds_that_kernel(install, triton_on_gpu):
    provider = install(_OnGpu(triton_on_gpu=triton_on_gpu))
    rng = np.random.default_rng(1)
    q, k = unit_rows(rng, (1, 6, 8)), unit_rows(rng, (1, 7, 8))
    v = rng.standard_normal((1, 7, 5)).astype(np.float32)
    qc, kc = rng.integers(0, 4, (1, 3, 6)).astype(np.int32), rng.integers(0, 4, (1, 3, 7)).astype(np.int32)
    cotangent = rng.standard_normal((1, 6, 5)).astype(np.float32)
    _, (dq, dk, _) = vjp(lambda a, b, c: ops.yoso_cumulation(a, b, c, qc, kc, 2, implementation="custom_op"),
                         [q, k, v], cotangent)
    assert ("lower_bound_gradients" in provider.ran) == triton_on_gpu
    assert provider.ran.count("weighted_lsh_cumulation") == (0 if triton_on_gpu else 2)
    want_dq, want_dk, _ = ref.yoso_lower_bound_gradients(q, k, v, qc, kc, 2, cotangent)
    np.testing.assert_allclose(dq, want_dq, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dk, want_dk, rtol=1e-4, atol=1e-4)


def test_a_primitive_without_a_kernel_on_the_device_sends_auto_to_the_composite_and_custom_op_to_an_error(install):
    install(_OnGpu(triton_on_gpu=False))  # a build without the Triton cubins: no GPU decoding step
    codes = np.zeros((1, 2, 3), np.int32)
    value, tables = np.ones((1, 3, 2), np.float32), np.zeros((1, 2, 4, 2), np.float32)
    assert _dispatch.provider("auto", (value,), 0, ("lsh_cumulation",)).name == "custom_op"
    assert _dispatch.provider("auto", (value,), 0, ("lsh_cumulation_step",)) is composite.PROVIDER
    with pytest.raises(ValueError, match="lsh_cumulation_step has no gpu kernel"):
        ops.lsh_cumulation_step(codes, codes, value, tables, implementation="custom_op")
    # The CUDA kernels take causal = 0 only.
    assert _dispatch.provider("auto", (value,), 1, ("lsh_cumulation",)) is composite.PROVIDER
    with pytest.raises(ValueError, match="lsh_cumulation has no gpu kernel with causal != 0"):
        ops.lsh_cumulation(codes, codes, value, 4, implementation="custom_op", causal=True)
    to_numpy(ops.lsh_cumulation(codes, codes, value, 4, implementation="auto", causal=True))


def test_with_the_triton_kernels_causal_yoso_and_the_decoding_step_run_native_on_a_gpu(install):
    """Where the build embeds the Triton kernels, "auto" takes them on a GPU for the causal scan, the causal eq. 4
    and the decoding step (checked against float64 on an H200, 2026-11-29); the weighted and collision cumulations
    keep causal = 0 only there."""
    provider = install(_OnGpu(triton_on_gpu=True))
    rng = np.random.default_rng(2)
    value = np.ones((1, 3, 2), np.float32)
    for causal in (1, -1):
        assert _dispatch.provider("auto", (value,), causal, ("lsh_cumulation",)).name == "custom_op"
        assert _dispatch.provider("auto", (value,), causal, ("lower_bound_gradients",)).name == "custom_op"
        assert _dispatch.provider("auto", (value,), causal, ("weighted_lsh_cumulation",)) is composite.PROVIDER
    q, k = unit_rows(rng, (1, 6, 8)), unit_rows(rng, (1, 6, 8))
    v = rng.standard_normal((1, 6, 5)).astype(np.float32)
    qc, kc = rng.integers(0, 4, (1, 3, 6)).astype(np.int32), rng.integers(0, 4, (1, 3, 6)).astype(np.int32)
    cotangent = rng.standard_normal((1, 6, 5)).astype(np.float32)
    out, (dq, dk, dv) = vjp(lambda a, b, c: ops.yoso_cumulation(a, b, c, qc, kc, 2, causal=True), [q, k, v],
                            cotangent)
    assert provider.ran.count("lower_bound_gradients") == 1 and "weighted_lsh_cumulation" not in provider.ran
    want = ref.yoso_lower_bound_gradients(q, k, v, qc, kc, 2, cotangent, causal=1)
    np.testing.assert_allclose(dq, want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dk, want[1], rtol=1e-4, atol=1e-4)
    provider.ran.clear()
    codes, tables = np.zeros((1, 2, 3), np.int32), np.zeros((1, 2, 4, 2), np.float32)
    to_numpy(ops.lsh_cumulation_step(codes, codes, value, tables, implementation="custom_op")[0])
    assert provider.ran == ["lsh_cumulation_step"]
    assert _dispatch.provider("auto", (value, tables), 0, ("lsh_cumulation_step",)).name == "custom_op"


def test_a_device_the_native_kernels_do_not_serve_is_named(install):
    class _OnTpu(_OnGpu):
        def device_of(self, tensors):
            return "tpu"

    install(_OnTpu())
    codes, value = np.zeros((1, 2, 3), np.int32), np.ones((1, 3, 2), np.float32)
    with pytest.raises(ValueError, match="run on cpu and gpu; this call runs on tpu"):
        ops.lsh_cumulation(codes, codes, value, 4, implementation="custom_op")


def test_the_kernels_table_names_the_provider_of_each_primitive_on_each_device(install):
    install(_OnGpu())
    table = _dispatch.kernels_table()
    assert set(table) == set(_spec.PRIMITIVES)
    for name, row in table.items():
        assert row == {device: "custom_op" if device in _spec.PRIMITIVES[name].devices else "composite"
                       for device in _spec.DEVICES}, name
