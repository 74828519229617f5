"""LinearRelativeAttention: MHA-compatible layer over the Scaleformer op; math, masks, saving, export, training."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import numpy_reference as ref
from keras_yoso.layers import LinearRelativeAttention


def _inputs(rng, batch, length, dim, scale=1.0):
    return (scale * rng.normal(size=(batch, length, dim))).astype(np.float32)


def _lengths_mask(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


def _run_python(code, tmp_path):
    """Runs `code` in a fresh interpreter (so it imports only what it names); returns stdout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
    return result.stdout


def _project(layer, dense, x):
    """`[B, T, dim]` through one of the layer's EinsumDense projections, in NumPy: `[B, T, heads, size]`."""
    out = np.einsum("btd,dnh->btnh", x, dense.kernel.numpy())
    return out + dense.bias.numpy() if layer.use_bias else out


def _dense_layer_reference(layer, query, value, key, query_mask, key_mask, causal):
    """The layer's output from its weights and the dense NumPy oracle of eq. 9-11, head by head."""
    q, k, v = (_project(layer, dense, x) for dense, x in
               ((layer.query_dense, query), (layer.key_dense, key), (layer.value_dense, value)))
    rel = None if layer.relative_embeddings is None else layer.relative_embeddings.numpy()
    heads = []
    for h in range(layer.num_heads):
        rel_h = None if rel is None else (rel if layer.share_relative_embeddings else rel[h])
        heads.append(ref.linear_relative_attention(
            q[:, :, h], k[:, :, h], v[:, :, h], rel_h, layer.horizon, causal=causal, query_mask=query_mask,
            key_mask=key_mask, epsilon=layer.epsilon))
    out = np.stack(heads, axis=2)
    dense = layer.output_dense
    return np.einsum("btnh,nho->bto", out, dense.kernel.numpy()) + (dense.bias.numpy() if layer.use_bias else 0)


# ----------------------------------------------------------------------------
# Shapes, math and the MultiHeadAttention call convention.

def test_self_and_cross_attention_output_shapes():
    rng = np.random.default_rng(0)
    query, value, key = _inputs(rng, 2, 7, 16), _inputs(rng, 2, 11, 12), _inputs(rng, 2, 11, 6)
    assert LinearRelativeAttention(2, 8)(query, query).shape == (2, 7, 16)
    assert LinearRelativeAttention(2, 8, value_dim=5, causal=True)(query, value).shape == (2, 7, 16)
    assert LinearRelativeAttention(2, 8, horizon=None)(query, value, key=key).shape == (2, 7, 16)
    assert LinearRelativeAttention(3, 4, output_shape=9)(query, value).shape == (2, 7, 9)
    assert LinearRelativeAttention(3, 4, output_shape=(2, 5))(query, value).shape == (2, 7, 2, 5)


def test_functional_model_output_shape_matches_layer():
    query, value = keras.Input((7, 16)), keras.Input((11, 12))
    output = LinearRelativeAttention(2, 8, output_shape=10)(query, value)
    assert output.shape == (None, 7, 10)
    model = keras.Model([query, value], output)
    rng = np.random.default_rng(1)
    assert model([_inputs(rng, 3, 7, 16), _inputs(rng, 3, 11, 12)]).shape == (3, 7, 10)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("options", [{}, {"share_relative_embeddings": True}, {"horizon": None},
                                     {"horizon": 1, "value_dim": 3}],
                         ids=["per_head", "shared", "no_relative", "horizon_one"])
def test_layer_matches_dense_oracle_per_head(options, causal):
    rng = np.random.default_rng(2)
    query, value, key = _inputs(rng, 2, 9, 6), _inputs(rng, 2, 13, 5), _inputs(rng, 2, 13, 4)
    query_mask, key_mask = _lengths_mask([9, 4], 9), _lengths_mask([13, 6], 13)
    layer = LinearRelativeAttention(3, 4, bias_initializer="random_normal", chunk_size=4, **options)
    out = layer(query, value, key=key, query_mask=query_mask, value_mask=key_mask, use_causal_mask=causal)
    expected = _dense_layer_reference(layer, query, value, key, query_mask, key_mask, causal)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("lengths, padding", [((9, 5), "left"), ((5, 9), "right"), ((4, 12), "left")],
                         ids=["longer_queries_left_padded", "shorter_queries_right_padded", "keys_beyond_horizon"])
def test_layer_gradients_match_dense_oracle_per_head(lengths, padding, causal):
    """d loss / d (query, value, relative embeddings) through the projections, vs the NumPy eq. 9-11 gradients."""
    rng = np.random.default_rng(21)
    (q_len, k_len), batch, heads = lengths, 2, 3
    query, value = _inputs(rng, batch, q_len, 6), _inputs(rng, batch, k_len, 5)
    q_keep, k_keep = np.array([q_len, q_len - 2]), np.array([k_len - 1, 3])
    if padding == "left":
        query_mask = np.arange(q_len)[None, :] >= (q_len - q_keep)[:, None]
        key_mask = np.arange(k_len)[None, :] >= (k_len - k_keep)[:, None]
    else:
        query_mask, key_mask = _lengths_mask(q_keep, q_len), _lengths_mask(k_keep, k_len)
    layer = LinearRelativeAttention(heads, 4, horizon=2, causal=causal, chunk_size=3, bias_initializer="random_normal")
    out_grad = rng.normal(size=(batch, q_len, 6)).astype(np.float32)
    tensors = [tf.constant(query), tf.constant(value)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        loss = tf.reduce_sum(layer(*tensors, query_mask=query_mask, value_mask=key_mask) * out_grad)
    d_query, d_value, d_rel = tape.gradient(loss, tensors + [layer.relative_embeddings])

    w = {name: dense.kernel.numpy() for name, dense in (("q", layer.query_dense), ("k", layer.key_dense),
                                                        ("v", layer.value_dense), ("o", layer.output_dense))}
    q, k, v = (_project(layer, dense, x) for dense, x in
               ((layer.query_dense, query), (layer.key_dense, value), (layer.value_dense, value)))
    head_grad = np.einsum("bto,nho->btnh", out_grad, w["o"])
    rel = layer.relative_embeddings.numpy()
    want_query, want_value, want_rel = np.zeros(query.shape), np.zeros(value.shape), np.zeros(rel.shape)
    for h in range(heads):
        dq, dk, dv, dr = ref.linear_relative_attention_gradients(
            q[:, :, h], k[:, :, h], v[:, :, h], head_grad[:, :, h], rel[h], 2, causal=causal,
            query_mask=query_mask, key_mask=key_mask, epsilon=layer.epsilon)
        want_query += np.einsum("bth,dh->btd", dq, w["q"][:, h])
        want_value += np.einsum("bth,dh->btd", dk, w["k"][:, h]) + np.einsum("bth,dh->btd", dv, w["v"][:, h])
        want_rel[h] = dr
    for name, got, want in (("query", d_query, want_query), ("value", d_value, want_value),
                            ("relative_embeddings", d_rel, want_rel)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(want).max()),
                                   err_msg=f"gradient of {name}")


def test_use_causal_mask_overrides_the_constructor_default():
    rng = np.random.default_rng(3)
    x = _inputs(rng, 2, 10, 8)
    layer = LinearRelativeAttention(2, 4, horizon=2, causal=True)
    causal = layer(x, x).numpy()
    np.testing.assert_array_equal(layer(x, x, use_causal_mask=True).numpy(), causal)
    bidirectional = layer(x, x, use_causal_mask=False).numpy()
    assert not np.allclose(bidirectional, causal)
    x_future = x.copy()
    x_future[:, 5:] = rng.normal(size=x_future[:, 5:].shape)
    np.testing.assert_allclose(layer(x_future, x_future).numpy()[:, :5], causal[:, :5], rtol=1e-6, atol=1e-6)


def test_key_none_is_key_equal_to_value():
    rng = np.random.default_rng(4)
    query, value = _inputs(rng, 2, 5, 8), _inputs(rng, 2, 6, 8)
    layer = LinearRelativeAttention(2, 4)
    np.testing.assert_array_equal(layer(query, value).numpy(), layer(query, value, key=value).numpy())


# ----------------------------------------------------------------------------
# Masks.

def test_padded_key_content_does_not_change_unpadded_outputs():
    rng = np.random.default_rng(5)
    x = _inputs(rng, 3, 10, 8)
    mask = _lengths_mask([10, 6, 1], 10)
    noisy = np.where(mask[:, :, None], x, 1e4 * rng.normal(size=x.shape)).astype(np.float32)
    for causal in (False, True):
        layer = LinearRelativeAttention(2, 4, horizon=3, causal=causal)
        clean = layer(x, x, query_mask=mask, value_mask=mask).numpy()
        np.testing.assert_array_equal(layer(noisy, noisy, query_mask=mask, value_mask=mask).numpy()[mask],
                                      clean[mask])


def test_padded_queries_output_only_the_projection_bias():
    rng = np.random.default_rng(6)
    x = _inputs(rng, 2, 8, 8)
    mask = _lengths_mask([8, 3], 8)
    layer = LinearRelativeAttention(2, 4, bias_initializer="random_normal")
    out = layer(x, x, query_mask=mask, value_mask=mask).numpy()
    np.testing.assert_allclose(out[1, 3:], np.broadcast_to(layer.output_dense.bias.numpy(), (5, 8)), atol=1e-6)


def test_implicit_embedding_masks_ignore_extra_padding():
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    model = keras.Model(tokens, LinearRelativeAttention(2, 4, horizon=2)(x, x))
    short = np.array([[4, 5, 6, 0], [7, 0, 0, 0]])
    long = np.concatenate([short, np.zeros((2, 9), short.dtype)], axis=1)
    np.testing.assert_allclose(model(long).numpy()[:, :4][short != 0], model(short).numpy()[short != 0],
                               rtol=1e-5, atol=1e-6)


def test_padding_attention_mask_equals_query_and_value_masks():
    rng = np.random.default_rng(7)
    x = _inputs(rng, 2, 7, 8)
    query_mask, key_mask = _lengths_mask([7, 5], 7), _lengths_mask([6, 3], 7)
    layer = LinearRelativeAttention(2, 4)
    expected = layer(x, x, query_mask=query_mask, value_mask=key_mask).numpy()
    attention_mask = query_mask[:, :, None] & key_mask[:, None, :]
    np.testing.assert_array_equal(layer(x, x, attention_mask=attention_mask).numpy(), expected)


def test_non_padding_attention_mask_raises():
    x = np.zeros((1, 4, 8), np.float32)
    layer = LinearRelativeAttention(2, 4)
    with pytest.raises(ValueError, match="not a padding mask.*use_causal_mask=True"):
        layer(x, x, attention_mask=np.tril(np.ones((1, 4, 4), bool)))
    fn = tf.function(lambda x, m: layer(x, x, attention_mask=m))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a padding mask"):
        fn(x, np.tril(np.ones((1, 4, 4), bool)))


def test_fully_padded_sequence_gives_finite_outputs_and_gradients():
    x = tf.constant(_inputs(np.random.default_rng(8), 2, 6, 8))
    mask = _lengths_mask([6, 0], 6)
    layer = LinearRelativeAttention(2, 4)
    with tf.GradientTape() as tape:
        out = layer(x, x, query_mask=mask, value_mask=mask)
        loss = tf.reduce_sum(out ** 2)
    assert np.all(np.isfinite(out.numpy()))
    assert all(np.all(np.isfinite(g.numpy())) for g in tape.gradient(loss, layer.trainable_variables))


# ----------------------------------------------------------------------------
# Positions: relative only, so lengths extrapolate.

def test_model_built_at_512_runs_at_4096_without_new_weights():
    layer = LinearRelativeAttention(2, 8, horizon=16, causal=True)
    layer.build((None, 512, 16), (None, 512, 16))
    weights_before = [w.path for w in layer.weights]
    rng = np.random.default_rng(9)
    short, long = _inputs(rng, 1, 512, 16), _inputs(rng, 1, 4096, 16)
    long[:, :512] = short
    out_short, out_long = layer(short, short).numpy(), layer(long, long).numpy()
    assert [w.path for w in layer.weights] == weights_before
    # Causal and relative: the first 512 outputs of the long input are those of the short one.
    np.testing.assert_allclose(out_long[:, :512], out_short, rtol=1e-4, atol=1e-5)
    assert np.all(np.isfinite(out_long))


def test_relative_positions_make_the_layer_shift_equivariant():
    # Without absolute positions, shifting a sequence inside a longer all-padding frame shifts the output.
    rng = np.random.default_rng(10)
    x = _inputs(rng, 1, 12, 8)
    layer = LinearRelativeAttention(2, 4, horizon=3)
    base = layer(x, x).numpy()
    framed = np.concatenate([np.zeros((1, 5, 8), np.float32), x, np.zeros((1, 4, 8), np.float32)], axis=1)
    mask = np.zeros((1, 21), bool)
    mask[:, 5:17] = True
    np.testing.assert_allclose(layer(framed, framed, query_mask=mask, value_mask=mask).numpy()[:, 5:17], base,
                               rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------
# Gradients, config, saving, export.

def test_gradients_reach_every_weight_including_relative_embeddings():
    x = tf.constant(_inputs(np.random.default_rng(11), 2, 9, 8))
    layer = LinearRelativeAttention(2, 4, horizon=2)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x, x) ** 2)
    grads = tape.gradient(loss, layer.trainable_variables)
    names = [v.path for v in layer.trainable_variables]
    assert any("relative_embeddings" in n for n in names), names
    for name, grad in zip(names, grads):
        assert grad is not None and np.all(np.isfinite(grad.numpy())), name
        assert np.any(grad.numpy() != 0), name


def test_config_round_trip_reproduces_the_layer():
    rng = np.random.default_rng(12)
    x = _inputs(rng, 2, 8, 6)
    layer = LinearRelativeAttention(2, 4, value_dim=3, horizon=5, causal=True, share_relative_embeddings=True,
                                    epsilon=1e-4, chunk_size=3, dropout=0.1, output_shape=(5,),
                                    kernel_regularizer="l2", bias_constraint="non_neg", seed=4, name="scaleformer")
    out = layer(x, x).numpy()
    config = layer.get_config()
    for argument in ("num_heads", "key_dim", "value_dim", "horizon", "causal", "share_relative_embeddings",
                     "epsilon", "chunk_size", "dropout", "use_bias", "output_shape", "kernel_initializer",
                     "bias_initializer", "kernel_regularizer", "bias_regularizer", "activity_regularizer",
                     "kernel_constraint", "bias_constraint", "seed"):
        assert argument in config
    clone = LinearRelativeAttention.from_config(config)
    assert clone.get_config() == config
    clone.build(x.shape, x.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(clone(x, x).numpy(), out)


def _small_model(**options):
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(32, 8, mask_zero=True)(tokens)
    x = LinearRelativeAttention(2, 4, horizon=3, **options)(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(2)(x))


def _tokens(rng, batch=4, length=16):
    tokens = rng.integers(1, 32, size=(batch, length)).astype(np.int32)
    tokens[1, 10:] = 0
    return tokens


def test_keras_save_and_load_give_identical_outputs(tmp_path):
    model = _small_model(causal=True)
    tokens = _tokens(np.random.default_rng(13))
    expected = model(tokens).numpy()
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(restored(tokens).numpy(), expected)


def test_exported_model_serves_any_length_without_keras_yoso(tmp_path):
    model = _small_model()
    rng = np.random.default_rng(14)
    for length in (16, 40):
        tokens = _tokens(rng, length=length)
        np.save(tmp_path / f"tokens{length}.npy", tokens)
        np.save(tmp_path / f"expected{length}.npy", model(tokens).numpy())
    model.export(str(tmp_path / "exported"), verbose=False)
    _run_python("""
        import sys
        import numpy as np
        import tensorflow as tf
        loaded = tf.saved_model.load("exported")
        for length in (16, 40):
            output = loaded.serve(tf.constant(np.load(f"tokens{length}.npy"))).numpy()
            np.testing.assert_allclose(output, np.load(f"expected{length}.npy"), rtol=1e-5, atol=1e-6)
        assert "keras_yoso" not in sys.modules
    """, tmp_path)


def test_model_fits_under_jit_compile():
    model = _small_model(causal=True)
    assert model.layers[2].supports_jit
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    rng = np.random.default_rng(15)
    history = model.fit(_tokens(rng, 8), rng.integers(0, 2, 8), batch_size=4, epochs=2, verbose=0)
    assert model.jit_compile is True
    assert np.all(np.isfinite(history.history["loss"]))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_outputs_are_finite_in_compute_dtype(policy):
    try:
        keras.mixed_precision.set_global_policy(policy)
        rng = np.random.default_rng(16)
        x = tf.constant(_inputs(rng, 2, 40, 8, scale=20.0))
        mask = _lengths_mask([40, 17], 40)
        for causal in (False, True):
            layer = LinearRelativeAttention(2, 4, horizon=4, causal=causal, chunk_size=16)
            with tf.GradientTape() as tape:
                output = layer(x, x, query_mask=mask, value_mask=mask, training=True)
                loss = tf.reduce_sum(tf.cast(output, tf.float32) ** 2)
            assert output.dtype == layer.compute_dtype == policy.split("_")[1]
            assert np.all(np.isfinite(tf.cast(output, tf.float32).numpy()))
            grads = tape.gradient(loss, layer.trainable_variables)
            assert all(np.all(np.isfinite(tf.cast(g, tf.float32).numpy())) for g in grads)
    finally:
        keras.mixed_precision.set_global_policy("float32")


# ----------------------------------------------------------------------------
# Argument errors.

@pytest.mark.parametrize("arguments, match", [
    (dict(num_heads=0, key_dim=4), "num_heads.*positive integer.*num_heads=0"),
    (dict(num_heads=2, key_dim=0), "key_dim"),
    (dict(num_heads=2, key_dim=4, value_dim=0), "value_dim"),
    (dict(num_heads=2, key_dim=4, horizon=0), "horizon.*positive integer or None.*horizon=0"),
    (dict(num_heads=2, key_dim=4, horizon=2.5), "horizon"),
    (dict(num_heads=2, key_dim=4, causal="yes"), "causal.*bool"),
    (dict(num_heads=2, key_dim=4, share_relative_embeddings=1), "share_relative_embeddings.*bool"),
    (dict(num_heads=2, key_dim=4, epsilon=0.0), "epsilon.*> 0.*epsilon=0.0"),
    (dict(num_heads=2, key_dim=4, epsilon=float("nan")), "epsilon"),
    (dict(num_heads=2, key_dim=4, chunk_size=0), "chunk_size"),
    (dict(num_heads=2, key_dim=4, dropout=1.0), "dropout"),
    (dict(num_heads=2, key_dim=4, seed="x"), "seed"),
    (dict(num_heads=2, key_dim=4, output_shape=(0,)), "output_shape"),
])
def test_invalid_constructor_arguments_raise(arguments, match):
    with pytest.raises(ValueError, match=match):
        LinearRelativeAttention(**arguments)


def test_invalid_call_options_raise():
    x = np.zeros((1, 4, 8), np.float32)
    layer = LinearRelativeAttention(2, 4)
    with pytest.raises(ValueError, match="does not return attention scores"):
        layer(x, x, return_attention_scores=True)
    with pytest.raises(ValueError, match="use_causal_mask.*None or a Python bool"):
        layer(x, x, use_causal_mask="yes")
    with pytest.raises(ValueError, match="`value` and `key`"):
        LinearRelativeAttention(2, 4).build((1, 5, 8), (1, 6, 8), (1, 7, 8))


# ----------------------------------------------------------------------------
# Learning: relative positions carry information that plain linear attention lacks.

def _fit_copy_from_two_back(horizon):
    """Causal per-token task: predict the token two positions back. Needs relative positions."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    vocab, length, offset = 8, 64, 2

    def data(count):
        tokens = rng.integers(1, vocab + 1, size=(count, length)).astype(np.int32)
        targets = np.zeros_like(tokens)
        targets[:, offset:] = tokens[:, :-offset]
        weights = np.zeros(tokens.shape, np.float32)
        weights[:, offset:] = 1.0
        return tokens, targets, weights

    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocab + 1, 32)(tokens)
    x = LinearRelativeAttention(2, 16, horizon=horizon, causal=True)(x, x)
    model = keras.Model(tokens, keras.layers.Dense(vocab + 1)(x))
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])
    train = data(4096)
    model.fit(train[0], train[1], sample_weight=train[2], batch_size=32, epochs=2, verbose=0)
    test = data(256)
    return model.evaluate(test[0], test[1], sample_weight=test[2], verbose=0)[1]


def test_relative_positions_learn_a_task_plain_linear_attention_cannot():
    assert _fit_copy_from_two_back(horizon=4) >= 0.9
    assert _fit_copy_from_two_back(horizon=None) < 0.5
