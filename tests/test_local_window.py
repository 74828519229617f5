"""YosoAttention(local_window=w): exact softmax attention inside a band of positions beside YOSO (issue 42,
item 3's option; LoLCATs' sliding window). `keras_yoso.ops.local_attention` equals the NumPy reference (masks,
causal, decoding offsets, windows longer than the sequence) and its gradients the reference's finite differences;
its written-out gradient equals autodiff of the same forward on every case, and a JAX training step keeps less
than two bands per layer where autodiff kept five; a layer whose window scale is zero is the layer without a
window; the window's term is its scale times the exact local softmax of the projected heads; decoding with the
kept keys reproduces the full causal forward; the window and its scale live in the config and the weights; bad
arguments raise naming them. Every backend."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import numpy_reference as ref
import pytest
from conftest import BACKEND, random_mask, to_numpy, trainable_gradients, vjp

from keras_yoso import ops
from keras_yoso.ops.composite import local as composite_local
from keras_yoso.layers import YosoAttention

# (T, S, window, causal, key_offset, query mask kind, key mask kind)
GRID = [
    (37, 37, 5, False, 0, "random", "random"),
    (37, 37, 5, True, 0, "none", "random"),
    (16, 16, 1, False, 0, "none", "none"),
    (16, 16, 40, False, 0, "random", "none"),   # the window longer than the sequence: plain softmax attention
    (3, 7, 5, True, 4, "none", "random"),       # decoding: 4 kept keys before 3 new queries
    (1, 5, 5, True, 4, "none", "none"),
    (70, 70, 8, True, 0, "random", "zeros"),    # no key at all: zeros
    (64, 64, 64, False, 0, "random", "random"),
    (20, 27, 5, True, 7, "none", "random"),     # a prefill of 20 queries after 7 kept keys: several chunks
    (12, 30, 4, False, 9, "random", "none"),    # queries at positions 9-20 of 30 keys, both sides of the band
]


@pytest.mark.parametrize("t,s,window,causal,offset,q_kind,k_kind", GRID)
def test_local_attention_equals_the_numpy_reference(t, s, window, causal, offset, q_kind, k_kind):
    rng = np.random.default_rng(t + s + window)
    q, k = rng.normal(size=(2, t, 4)).astype("float32"), rng.normal(size=(2, s, 4)).astype("float32")
    v = rng.normal(size=(2, s, 3)).astype("float32")
    qm, km = random_mask(rng, q_kind, 2, t), random_mask(rng, k_kind, 2, s)
    got = to_numpy(ops.local_attention(q, k, v, window, qm, km, causal=causal, key_offset=offset))
    np.testing.assert_allclose(got, ref.local_attention(q, k, v, window, qm, km, causal, offset), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_local_attention_gradients_equal_the_references_finite_differences(causal):
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(1, 9, 3)) for _ in range(3))
    key_mask = np.array([[1, 1, 0, 1, 1, 1, 1, 0, 1]], bool)
    cotangent = rng.normal(size=(1, 9, 3))
    fn = lambda a, b, c: ops.local_attention(a, b, c, 3, key_mask=key_mask, causal=causal)  # noqa: E731
    _, grads = vjp(fn, [x.astype("float32") for x in (q, k, v)], cotangent)
    for index, grad in enumerate(grads):
        expected = np.zeros_like(grad, dtype=np.float64)
        arrays = [q, k, v]
        for position in np.ndindex(arrays[index].shape):
            for sign in (1.0, -1.0):
                shifted = [a.copy() for a in arrays]
                shifted[index][position] += sign * 1e-5
                loss = (ref.local_attention(*shifted, 3, None, key_mask, causal) * cotangent).sum()
                expected[position] += sign * loss / 2e-5
        np.testing.assert_allclose(grad, expected, atol=2e-4, rtol=2e-3)


@pytest.mark.parametrize("t,s,window,causal,offset,q_kind,k_kind", GRID)
def test_local_attention_gradients_equal_autodiff_of_its_forward(t, s, window, causal, offset, q_kind, k_kind):
    rng = np.random.default_rng(t * s + window)
    q, k = rng.normal(size=(2, t, 4)).astype("float32"), rng.normal(size=(2, s, 4)).astype("float32")
    v = rng.normal(size=(2, s, 3)).astype("float32")
    qm, km = random_mask(rng, q_kind, 2, t), random_mask(rng, k_kind, 2, s)
    cotangent = rng.normal(size=(2, t, 3))
    full = lambda mask, n: keras.ops.convert_to_tensor(np.ones((2, n), bool) if mask is None else mask)  # noqa: E731
    written = lambda a, b, c: ops.local_attention(a, b, c, window, qm, km,  # noqa: E731
                                                  causal=causal, key_offset=offset)
    autodiff = lambda a, b, c: composite_local.local_attention(a, b, c, window, full(qm, t), full(km, s),  # noqa: E731
                                                               causal, offset)
    out, grads = vjp(written, [q, k, v], cotangent)
    expected_out, expected = vjp(autodiff, [q, k, v], cotangent)
    np.testing.assert_array_equal(out, expected_out)
    for name, got, want in zip("qkv", grads, expected):
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5, err_msg=f"d{name}")


_STEP_MEMORY = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    from keras_yoso import ops
    from keras_yoso.ops.composite import local

    band = ops.local_attention if sys.argv[1] == "op" else local.local_attention
    def loss(x, weights):
        mask = jnp.ones(x.shape[:2], bool)
        for w in weights:  # layers with residuals, as in a transformer
            h = x @ w
            x = x + band(h, h, h, 64, mask, mask, False, 0)
        return jnp.sum(x ** 2)
    for layers in (2, 6):
        x, weights = jnp.ones((8, 1024, 16)), [jnp.eye(16)] * layers
        step = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, weights).compile()
        print(step.memory_analysis().temp_size_in_bytes)
""")


@pytest.mark.skipif(BACKEND != "jax", reason="reads XLA's compiled buffer sizes (JAX)")
def test_a_jax_training_step_keeps_no_band_of_the_window_per_layer():
    # XLA's temp bytes for 2 and for 6 layers of 8 x 1,024 tokens, window 64: autodiff of the forward keeps about
    # five [8, 16 chunks, 64, 190] float32 bands (6.2 MB each) per layer until the backward pass; the written-out
    # gradient needs only the scores (XLA keeps the forward's: 1.4-1.6 bands a layer with the gathered keys and
    # values; 1.4 with XLA's concurrency-optimized CPU scheduling off, which benchmarks/training_memory.py also
    # compares on a converted model).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), JAX_PLATFORMS="cpu")
    per_layer = {}
    for gradient in ("op", "autodiff"):
        proc = subprocess.run([sys.executable, "-c", _STEP_MEMORY, gradient], capture_output=True, text=True, env=env,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        two, six = map(int, proc.stdout.split())
        per_layer[gradient] = (six - two) / 4
    band = 8 * 16 * 64 * 190 * 4
    assert per_layer["autodiff"] > 4 * band, per_layer          # what the test would catch coming back
    assert per_layer["op"] < 2 * band, per_layer


@pytest.mark.parametrize("arguments, match", [
    ({"window": 0}, "window must be an integer >= 1, got 0"),
    ({"window": 2.5}, "window must be an integer >= 1, got 2.5"),
    ({"key_offset": -1}, "key_offset must be an integer >= 0, got -1"),
    ({"causal": "yes"}, r"causal must be a bool \(or 0 / 1\), got 'yes'"),
    ({"value": np.zeros((2, 5, 3), "float32")}, "key lengths"),
])
def test_local_attention_rejects_bad_arguments_naming_them(arguments, match):
    inputs = {"query": np.zeros((2, 6, 4), "float32"), "key": np.zeros((2, 6, 4), "float32"),
              "value": np.zeros((2, 6, 3), "float32"), "window": 2, **arguments}
    with pytest.raises(ValueError, match=match):
        ops.local_attention(**inputs)


def _pair(x, window, seed=3, **kwargs):
    """A YosoAttention with `local_window=window` and its twin without one, built on `x`, same weights."""
    with_window = YosoAttention(2, 8, seed=seed, local_window=window, **kwargs)
    plain = YosoAttention(2, 8, seed=seed, **kwargs)
    with_window(x, x), plain(x, x)
    for source, target in zip([w for w in with_window.weights if "local_window" not in w.path], plain.weights):
        target.assign(source)
    return with_window, plain


def test_a_layer_whose_window_scale_is_zero_is_the_layer_without_a_window():
    x = np.random.default_rng(0).normal(size=(2, 21, 16)).astype("float32")
    with_window, plain = _pair(x, 4)
    np.testing.assert_array_equal(to_numpy(with_window.local_window_scale_weight()), np.zeros(2))
    for causal in (False, True):
        np.testing.assert_array_equal(to_numpy(with_window(x, x, use_causal_mask=causal)),
                                      to_numpy(plain(x, x, use_causal_mask=causal)))


@pytest.mark.parametrize("causal", [False, True])
def test_the_window_adds_its_scale_times_exact_local_softmax_of_the_projected_heads(causal):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 19, 16)).astype("float32")
    mask = np.ones((2, 19), bool)
    mask[1, 15:] = False
    with_window, plain = _pair(x, 3)
    scale = np.array([0.7, -1.3], "float32")
    with_window.local_window_scale_weight().assign(scale)
    added = to_numpy(with_window(x, x, query_mask=mask, value_mask=mask, use_causal_mask=causal)) - to_numpy(
        plain(x, x, query_mask=mask, value_mask=mask, use_causal_mask=causal))
    heads = {name: np.einsum("btf,fhd->bhtd", x, to_numpy(dense.kernel)) + to_numpy(dense.bias)[None, :, None]
             for name, dense in (("q", with_window.query_dense), ("k", with_window.key_dense),
                                 ("v", with_window.value_dense))}
    local = np.stack([ref.local_attention(heads["q"][:, h], heads["k"][:, h], heads["v"][:, h], 3, mask, mask, causal)
                      for h in range(2)], axis=2)                      # [B, T, heads, value_dim]
    expected = np.einsum("bthd,hdf->btf", local * scale[None, None, :, None], to_numpy(with_window.output_dense.kernel))
    np.testing.assert_allclose(added, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("window, conv_window", [(4, None), (1, None), (6, 3)])
def test_decoding_with_a_window_reproduces_the_full_causal_forward(window, conv_window):
    x = np.random.default_rng(2).normal(size=(2, 23, 16)).astype("float32")
    layer = YosoAttention(2, 8, seed=5, local_window=window, conv_window=conv_window)
    layer(x, x)
    layer.local_window_scale_weight().assign(np.array([0.9, 1.7], "float32"))
    full = to_numpy(layer(x, x, use_causal_mask=True))
    cache, outputs = layer.init_cache(2), []
    if window > 1:
        assert tuple(cache["window_keys"].shape) == (2, window - 1, 2, 8)
    for start, stop in [(0, 2), (2, 3), (3, 11), (11, 12), (12, 23)]:
        out, cache = layer(x[:, start:stop], x[:, start:stop], cache=cache, cache_update_index=start)
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=2e-5, rtol=1e-4)


def test_the_window_and_its_scale_are_kept_through_the_config_and_a_keras_file(tmp_path):
    x = np.random.default_rng(3).normal(size=(2, 12, 16)).astype("float32")
    inputs = keras.Input((12, 16))
    model = keras.Model(inputs, YosoAttention(2, 8, seed=1, local_window=3)(inputs, inputs))
    layer = model.layers[-1]
    assert layer.local_window == 3 and layer.get_config()["local_window"] == 3
    layer.local_window_scale_weight().assign(np.array([0.5, 2.0], "float32"))
    model.save(str(tmp_path / "window.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "window.keras"))
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
    np.testing.assert_array_equal(to_numpy(loaded.layers[-1].local_window_scale_weight()), [0.5, 2.0])


def test_the_window_scale_and_the_projections_learn_through_the_window():
    """With YOSO's output scaled to zero, the loss depends on the queries and keys through the window alone."""
    x = np.random.default_rng(4).normal(size=(2, 10, 16)).astype("float32")
    layer = YosoAttention(2, 8, seed=2, local_window=3, output_scale=[0.0, 0.0])
    layer(x, x)
    layer.local_window_scale_weight().assign(np.array([1.0, 1.0], "float32"))
    _, grads = trainable_gradients(layer, lambda: keras.ops.sum(layer(x, x) ** 2))
    for name in ("local_window_scale", "query/kernel", "key/kernel"):
        grad = next(g for path, g in grads.items() if path.endswith(name))
        assert grad is not None and np.abs(grad).max() > 0, name


@pytest.mark.parametrize("window, match", [
    (0, "local_window.*positive integer or None.*Received: local_window=0"),
    ("4", "local_window.*positive integer or None.*Received: local_window='4'"),
])
def test_a_bad_local_window_raises_naming_it(window, match):
    with pytest.raises(ValueError, match=match):
        YosoAttention(2, 8, local_window=window)


def test_a_window_refuses_cross_attention_lengths_naming_both_shapes():
    x = np.zeros((2, 9, 16), "float32")
    with pytest.raises(ValueError, match=r"local_window=3.*same length.*\(2, 9, 16\).*\(2, 5, 16\)"):
        YosoAttention(2, 8, local_window=3)(x, x[:, :5])
