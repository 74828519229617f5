"""The JAX provider (the native library's XLA FFI handlers, keras_yoso/ops/providers/jax.py): what
only it has, the gradients and results inside jax.jit and under jax.vmap, half precision, errors
inside jit, thread safety, the YosoAttention layer under jit (the contract every native provider
keeps is tests/test_native_provider_contract.py).

Runs on the JAX backend where the native kernels are expected (tests/conftest.py): there a library
that failed to load makes these tests fail, never skip.
"""

import concurrent.futures

import keras
import numpy as np
import pytest

from conftest import CUSTOM_OPS_EXPECTED

if keras.backend.backend() != "jax" or not CUSTOM_OPS_EXPECTED:
    pytest.skip("JAX backend with the native kernels expected only", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import numpy_reference as ref  # noqa: E402
from conftest import cast, random_mask, rounded, run_tests_with_a_failed_native_library  # noqa: E402
from conftest import to_numpy, unit_rows  # noqa: E402
from keras_yoso import ops  # noqa: E402
from keras_yoso.ops.providers import jax as jax_provider  # noqa: E402
from keras_yoso import _validation  # noqa: E402
from keras_yoso.layers import YosoAttention  # noqa: E402

EPSILON = _validation.COLLISION_EPSILON
B, NQ, NK, DIM, DV, M, TAU = 2, 13, 11, 8, 5, 6, 3


def _close(actual, expected, tol=1e-5):
    actual, expected = to_numpy(actual), np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, atol=tol * scale, rtol=tol)


def _inputs(seed=0, batch=B, masks=True):
    rng = np.random.default_rng(seed)
    return dict(
        q=unit_rows(rng, (batch, NQ, DIM)), k=unit_rows(rng, (batch, NK, DIM)),
        v=rng.normal(size=(batch, NK, DV)).astype(np.float32),
        dy=rng.normal(size=(batch, NQ, DV)).astype(np.float32),
        qc=rng.integers(0, 2 ** TAU, size=(batch, M, NQ)).astype(np.int32),
        kc=rng.integers(0, 2 ** TAU, size=(batch, M, NK)).astype(np.int32),
        qm=random_mask(rng, "random" if masks else "none", batch, NQ),
        km=random_mask(rng, "random" if masks else "none", batch, NK))


def test_the_native_kernels_are_loaded():
    assert jax_provider.PROVIDER.load_error() is None, jax_provider.PROVIDER.load_error()


def test_a_native_library_that_failed_to_load_fails_this_module_instead_of_skipping_it():
    result = run_tests_with_a_failed_native_library(
        "test_jax_native.py", "test_a_native_library_that_failed_to_load_fails_this_module_instead_of_skipping_it")
    assert result.returncode == 1 and " failed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAILED tests/test_jax_native.py::test_the_native_kernels_are_loaded" in result.stdout, result.stdout


def test_native_kernels_are_what_auto_runs_on_jax_cpu():
    assert ops.implementation_in_use() == "custom_op"
    assert ops.implementation_in_use("custom_op") == "custom_op"
    assert ops.supports_jit("custom_op")
    assert jax_provider.PROVIDER.device_error((jnp.ones((1, 2, 3)),)) is None


def _yoso_vjp(t, backward, implementation, jit):
    def forward(q, k, v):
        return ops.yoso_cumulation(q, k, v, t["qc"], t["kc"], TAU, t["qm"], t["km"], backward=backward,
                                   implementation=implementation)

    def run(q, k, v, dy):
        out, pullback = jax.vjp(forward, q, k, v)
        return (out,) + pullback(dy)

    return [to_numpy(a) for a in (jax.jit(run) if jit else run)(t["q"], t["k"], t["v"], t["dy"])]


@pytest.mark.parametrize("backward", ["lower_bound", "collision"])
def test_yoso_cumulation_and_its_gradients_match_reference_and_composite(backward):
    t = _inputs(3)
    out, dq, dk, dv = _yoso_vjp(t, backward, "custom_op", jit=False)
    _close(out, ref.lsh_cumulation(t["qc"], t["kc"], t["v"], t["qm"], t["km"]))
    if backward == "lower_bound":
        expected = ref.yoso_lower_bound_gradients(t["q"], t["k"], t["v"], t["qc"], t["kc"], TAU, t["dy"],
                                                  t["qm"], t["km"])
    else:
        expected = ref.yoso_collision_gradients(t["q"], t["k"], t["v"], t["qc"], t["kc"], TAU, t["dy"], EPSILON,
                                                t["qm"], t["km"])
    for actual, want in zip((dq, dk, dv), expected):
        _close(actual, want, 1e-4)
    for actual, composite in zip((out, dq, dk, dv), _yoso_vjp(t, backward, "composite", jit=True)):
        _close(actual, composite, 1e-4)


def test_jit_gives_the_eager_results():
    t = _inputs(4)
    eager = _yoso_vjp(t, "lower_bound", "custom_op", jit=False)
    for actual, want in zip(_yoso_vjp(t, "lower_bound", "custom_op", jit=True), eager):
        np.testing.assert_array_equal(actual, want)

    @jax.jit
    def codes_and_collision(q, k, dy, v):
        qc = ops.hash_codes(q, M, TAU, seed=5, implementation="custom_op")
        kc = ops.hash_codes(k, M, TAU, seed=5, implementation="custom_op")
        return qc, ops.collision_cumulation(qc, q, dy, kc, k, v, TAU, implementation="custom_op")

    qc, collision = codes_and_collision(t["q"], t["k"], t["dy"], t["v"])
    np.testing.assert_array_equal(qc, ops.hash_codes(t["q"], M, TAU, seed=5, implementation="custom_op"))
    kc = ops.hash_codes(t["k"], M, TAU, seed=5, implementation="custom_op")
    np.testing.assert_array_equal(collision, ops.collision_cumulation(qc, t["q"], t["dy"], kc, t["k"], t["v"], TAU,
                                                                      implementation="custom_op"))


def test_vmap_over_a_leading_axis_equals_a_python_loop():
    stacked = [_inputs(10 + i) for i in range(3)]
    t = {name: np.stack([s[name] for s in stacked]) for name in stacked[0]}

    def per_item(q, k, v, dy, qc, kc, qm, km):
        lsh = ops.lsh_cumulation(qc, kc, v, 2 ** TAU, qm, km, implementation="custom_op")
        weighted = ops.weighted_lsh_cumulation(qc, dy, kc, v, k, 2 ** TAU, qm, km, implementation="custom_op")
        collision = ops.collision_cumulation(qc, q, dy, kc, k, v, TAU, qm, km, implementation="custom_op")
        codes = ops.hash_codes(q, M, TAU, seed=1, method="hadamard", implementation="custom_op")
        grads = jax.grad(lambda a, b, c: jnp.sum(ops.yoso_cumulation(
            a, b, c, qc, kc, TAU, qm, km, implementation="custom_op") * dy), argnums=(0, 1, 2))(q, k, v)
        return (lsh, weighted, collision, codes) + grads

    names = ("q", "k", "v", "dy", "qc", "kc", "qm", "km")
    batched = jax.jit(jax.vmap(per_item))(*[t[n] for n in names])
    for i in range(3):
        for actual, want in zip(batched, per_item(*[stacked[i][n] for n in names])):
            np.testing.assert_allclose(to_numpy(actual[i]), to_numpy(want), rtol=1e-6, atol=1e-6)
    # Only the values mapped, the codes and masks shared: the handler gets them broadcast.
    values = jax.vmap(lambda v: ops.lsh_cumulation(t["qc"][0], t["kc"][0], v, 2 ** TAU, t["qm"][0], t["km"][0],
                                                   implementation="custom_op"))(t["v"])
    for i in range(3):
        _close(values[i], ref.lsh_cumulation(t["qc"][0], t["kc"][0], t["v"][i], t["qm"][0], t["km"][0]))


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-2), ("bfloat16", 8e-2)])
def test_half_precision_inputs_keep_their_dtype_and_accumulate_in_float32(dtype, tol):
    t = _inputs(5)
    out = ops.lsh_cumulation(t["qc"], t["kc"], cast(t["v"], dtype), 2 ** TAU, t["qm"], t["km"],
                             implementation="custom_op")
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    _close(out, ref.lsh_cumulation(t["qc"], t["kc"], rounded(t["v"], dtype), t["qm"], t["km"]), tol)
    out = ops.weighted_lsh_cumulation(t["qc"], cast(t["dy"], dtype), t["kc"], cast(t["v"], dtype),
                                      cast(t["k"], dtype), 2 ** TAU, t["qm"], t["km"], implementation="custom_op")
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    expected = ref.weighted_lsh_cumulation(t["qc"], rounded(t["dy"], dtype), t["kc"], rounded(t["v"], dtype),
                                           rounded(t["k"], dtype), t["qm"], t["km"])
    _close(out, expected, tol)
    out = ops.collision_cumulation(t["qc"], cast(t["q"], dtype), cast(t["dy"], dtype), t["kc"], cast(t["k"], dtype),
                                   cast(t["v"], dtype), TAU, t["qm"], t["km"], implementation="custom_op")
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    expected = ref.collision_cumulation(t["qc"], rounded(t["q"], dtype), rounded(t["dy"], dtype), t["kc"],
                                        rounded(t["k"], dtype), rounded(t["v"], dtype), TAU, EPSILON, t["qm"], t["km"])
    _close(out, expected, 2 * tol)
    codes = ops.hash_codes(cast(t["q"], dtype), M, TAU, seed=2, implementation="custom_op")
    assert (to_numpy(codes) == to_numpy(ops.hash_codes(cast(t["q"], dtype), M, TAU, seed=2,
                                                       implementation="composite"))).mean() >= 0.95


def test_out_of_range_codes_inside_jit_raise_when_the_function_runs():
    t = _inputs(6)
    qc = t["qc"].copy()
    qc[1, 2, 3] = -1
    run = jax.jit(lambda qc: ops.lsh_cumulation(qc, t["kc"], t["v"], 2 ** TAU, implementation="custom_op"))
    with pytest.raises(Exception, match="query_codes has 1 codes outside"):  # whatever JAX raises for it
        jax.block_until_ready(run(qc))


def test_handler_rejects_inputs_without_the_output_leading_dims():
    t = _inputs(8)
    call = jax.ffi.ffi_call("keras_yoso_lsh_cumulation", jax.ShapeDtypeStruct((3, B, NQ, DV), jnp.float32),
                            vmap_method="broadcast_all")
    ones = lambda n: np.ones((B, n), np.float32)  # noqa: E731
    with pytest.raises(Exception, match="query_mask has shape .*leading batch dims"):
        jax.block_until_ready(call(ones(NQ), t["qc"], ones(NK), t["kc"], t["v"], num_buckets=np.int64(2 ** TAU),
                                   num_threads=np.int64(0)))


def test_concurrent_calls_from_threads_give_identical_results():
    t = _inputs(9)
    eager = lambda: to_numpy(ops.weighted_lsh_cumulation(  # noqa: E731
        t["qc"], t["dy"], t["kc"], t["v"], t["k"], 2 ** TAU, t["qm"], t["km"], implementation="custom_op"))
    jitted = jax.jit(lambda q, k, v: ops.yoso_cumulation(q, k, v, t["qc"], t["kc"], TAU, t["qm"], t["km"],
                                                         implementation="custom_op"))
    expected_eager, expected_jit = eager(), to_numpy(jitted(t["q"], t["k"], t["v"]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(eager) for _ in range(8)]
        futures += [pool.submit(lambda: to_numpy(jitted(t["q"], t["k"], t["v"]))) for _ in range(8)]
        results = [f.result() for f in futures]
    for result in results[:8]:
        np.testing.assert_array_equal(result, expected_eager)
    for result in results[8:]:
        np.testing.assert_array_equal(result, expected_jit)


def test_yoso_attention_layer_under_jit_matches_the_composite():
    rng = np.random.default_rng(11)
    query = rng.normal(size=(2, 24, 16)).astype(np.float32)
    value = rng.normal(size=(2, 20, 16)).astype(np.float32)
    query_mask = rng.random((2, 24)) > 0.2
    value_mask = rng.random((2, 20)) > 0.2
    layers = {implementation: YosoAttention(num_heads=2, key_dim=8, num_hashes=8, hash_code_len=4, seed=3,
                                            implementation=implementation)
              for implementation in ("custom_op", "composite")}
    for layer in layers.values():
        layer(query, value, query_mask=query_mask, value_mask=value_mask)
    layers["composite"].set_weights(layers["custom_op"].get_weights())
    results = {}
    for implementation, layer in layers.items():
        def loss(trainable, others, layer=layer):
            out, _ = layer.stateless_call(trainable, others, query, value, query_mask=query_mask,
                                          value_mask=value_mask)
            return jnp.sum(out * out), out

        trainable = [v.value for v in layer.trainable_variables]
        others = [v.value for v in layer.non_trainable_variables]
        (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(trainable, others)
        results[implementation] = [to_numpy(out)] + [to_numpy(g) for g in grads]
    assert np.abs(results["custom_op"][1]).max() > 0  # the query kernel's gradient flows through the attention
    for actual, want in zip(results["custom_op"], results["composite"]):
        np.testing.assert_allclose(actual, want, rtol=1e-4, atol=1e-4)
