"""The layers in TensorFlow graphs: tf.function checks, XLA, SavedModel export (custom-op and
portable), tf.distribute. TensorFlow backend only (collected only there, see conftest.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import CUSTOM_OPS_EXPECTED, run_python, to_numpy
from keras_yoso import LinearRelativeAttention
from keras_yoso import YosoAttention

LAYERS = {
    "YosoAttention": lambda **kw: YosoAttention(2, 4, num_hashes=4, hash_code_len=3, seed=1, **kw),
    "LinearRelativeAttention": lambda **kw: LinearRelativeAttention(2, 4, horizon=2, **kw),
}


@pytest.fixture(params=sorted(LAYERS))
def layer_name(request):
    return request.param


def _x(batch=2, length=6, dim=8, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, length, dim)).astype(np.float32)


def _small_model(layer):
    tokens = keras.Input((16,), dtype="int32")
    x = keras.layers.Embedding(32, 8, mask_zero=True)(tokens)
    x = layer(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(2)(x))


def _tokens(rng, batch=4, length=16):
    tokens = rng.integers(1, 32, size=(batch, length)).astype(np.int32)
    tokens[1, 10:] = 0
    return tokens


def test_non_padding_attention_mask_in_a_tf_function_raises_at_run_time(layer_name):
    layer = LAYERS[layer_name]()
    x = _x(1, 4)
    causal = np.tril(np.ones((1, 4, 4), bool))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a padding mask"):
        tf.function(lambda a, m: layer(a, a, attention_mask=m))(x, causal)


def test_mask_shape_unknown_while_tracing_is_checked_at_run_time(layer_name):
    layer = LAYERS[layer_name]()
    fn = tf.function(lambda a, m: layer(a, a, query_mask=m),
                     input_signature=[tf.TensorSpec([None, None, 8]), tf.TensorSpec([None, None], tf.bool)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"expects `query_mask` of shape \(batch, target_length\)"):
        fn(_x(), np.ones((2, 5), bool))


def test_mask_length_error_under_unknown_dims_gives_the_run_time_lengths(layer_name):
    # Traced with every length unknown, the message is made when the graph runs: the lengths, not None.
    layer = LAYERS[layer_name]()
    fn = tf.function(lambda a, m: layer(a, a, query_mask=m),
                     input_signature=[tf.TensorSpec([None, None, 8]), tf.TensorSpec([None, None], tf.bool)])
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        fn(_x(), np.ones((2, 5), bool))
    assert (f"{layer_name} expects `query_mask` of shape (batch, target_length) = (2, 6), with batch and "
            "target_length from `query` (2, 6, 8) and source_length from `value` (2, 6, 8). Received: `query_mask` "
            "of shape (2, 5)") in str(error.value)
    assert "None" not in str(error.value)


def test_attention_mask_under_xla_raises_at_trace_time(layer_name):
    # XLA compiles tf.debugging.Assert to nothing, so the padding check cannot run there: a causal
    # mask would silently act as "no mask". The layer refuses instead, and tells what to pass.
    layer = LAYERS[layer_name]()
    fn = tf.function(lambda x, m: layer(x, x, attention_mask=m), jit_compile=True)
    with pytest.raises(ValueError, match="cannot check under XLA.*Pass `query_mask`, `value_mask`"):
        fn(_x(), np.ones((2, 6, 6), bool))


def test_calling_a_layer_never_changes_its_supports_jit(layer_name):
    """supports_jit is fixed at construction (Keras reads it when it resolves jit_compile="auto");
    an attention_mask under XLA is refused at trace time instead (the test above)."""
    layer = LAYERS[layer_name]()
    before = layer.supports_jit
    layer(_x(), _x())
    layer(_x(), _x(), attention_mask=np.ones((2, 6, 6), bool))
    assert layer.supports_jit == before


def test_supports_jit_only_without_the_tensorflow_op_library():
    assert YosoAttention(2, 4, implementation="composite").supports_jit
    assert not YosoAttention(2, 4, implementation="custom_op").supports_jit
    assert YosoAttention(2, 4, implementation="auto").supports_jit == (not CUSTOM_OPS_EXPECTED)
    assert YosoAttention(2, 4, implementation="custom_op", use_expectation=True).supports_jit


@pytest.mark.parametrize("options", [dict(implementation="composite", conv_window=3), dict(causal=True)],
                         ids=["yoso_composite", "linear_relative_causal"])
def test_model_fits_under_jit_compile(options):
    layer = (YosoAttention(2, 4, num_hashes=4, hash_code_len=3, seed=1, **options) if "implementation" in options
             else LinearRelativeAttention(2, 4, horizon=3, **options))
    model = _small_model(layer)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    rng = np.random.default_rng(18)
    history = model.fit(_tokens(rng, 8), rng.integers(0, 2, 8), batch_size=4, epochs=2, verbose=0)
    assert model.jit_compile is True
    assert np.all(np.isfinite(history.history["loss"]))


def test_exported_yoso_model_serves_and_trains_in_a_fresh_process(tmp_path):
    model = _small_model(YosoAttention(2, 4, num_hashes=8, hash_code_len=4, conv_window=3, seed=7))
    tokens = _tokens(np.random.default_rng(16))
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "expected.npy", to_numpy(model(tokens)))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tokens) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    np.save(tmp_path / "grad_norms.npy", np.sort([np.linalg.norm(tf.convert_to_tensor(g)) for g in grads]))
    model.export(str(tmp_path / "exported"), verbose=False)
    run_python("""
        import numpy as np
        import tensorflow as tf
        import keras_yoso  # registers the custom ops used by the SavedModel
        loaded = tf.saved_model.load("exported")
        tokens = tf.constant(np.load("tokens.npy"))
        np.testing.assert_allclose(loaded.serve(tokens).numpy(), np.load("expected.npy"), rtol=1e-5, atol=1e-6)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loaded.serve(tokens) ** 2)
        grads = tape.gradient(loss, loaded.trainable_variables)
        assert all(g is not None for g in grads), grads
        grads = [tf.convert_to_tensor(g).numpy() for g in grads]
        assert all(np.all(np.isfinite(g)) for g in grads)
        # The saved custom gradients (YOSO's estimators) are the ones the original model used.
        np.testing.assert_allclose(np.sort([np.linalg.norm(g) for g in grads]), np.load("grad_norms.npy"),
                                   rtol=1e-4)
    """, tmp_path)


@pytest.mark.parametrize("layer_name", sorted(LAYERS))
def test_portable_export_loads_and_serves_any_length_without_keras_yoso(layer_name, tmp_path):
    kwargs = dict(implementation="composite") if layer_name == "YosoAttention" else {}
    tokens_in = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(32, 8, mask_zero=True)(tokens_in)
    x = LAYERS[layer_name](**kwargs)(x, x)
    model = keras.Model(tokens_in, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x)))
    rng = np.random.default_rng(14)
    for length in (16, 40):
        tokens = _tokens(rng, length=length)
        np.save(tmp_path / f"tokens{length}.npy", tokens)
        np.save(tmp_path / f"expected{length}.npy", to_numpy(model(tokens)))
    model.export(str(tmp_path / "exported"), verbose=False)
    run_python("""
        import sys
        import numpy as np
        import tensorflow as tf
        loaded = tf.saved_model.load("exported")
        for length in (16, 40):
            output = loaded.serve(tf.constant(np.load(f"tokens{length}.npy"))).numpy()
            np.testing.assert_allclose(output, np.load(f"expected{length}.npy"), rtol=1e-5, atol=1e-6)
        assert "keras_yoso" not in sys.modules
    """, tmp_path)


def test_mirrored_strategy_trains_with_replicas_in_sync(tmp_path):
    output = run_python("""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras
        import numpy as np
        from keras_yoso.layers import YosoAttention

        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        assert strategy.num_replicas_in_sync == 2
        with strategy.scope():
            tokens = keras.Input((16,), dtype="int32")
            x = keras.layers.Embedding(32, 8, mask_zero=True)(tokens)
            x = YosoAttention(2, 4, num_hashes=4, hash_code_len=4, conv_window=3, dropout=0.1)(x, x)
            x = keras.layers.GlobalAveragePooling1D()(x)
            model = keras.Model(tokens, keras.layers.Dense(1)(x))
            model.compile(optimizer="adam", loss="mse")
        rng = np.random.default_rng(0)
        data = rng.integers(1, 32, size=(32, 16)).astype("int32")
        data[::2, 9:] = 0
        history = model.fit(data, rng.normal(size=(32, 1)), batch_size=8, epochs=2, verbose=0)
        assert all(np.isfinite(history.history["loss"])), history.history
        for variable in model.trainable_variables:
            replicas = [np.asarray(v) for v in strategy.experimental_local_results(variable.value)]
            assert len(replicas) == 2
            np.testing.assert_array_equal(replicas[0], replicas[1])
        print("ok", history.history["loss"])
    """, tmp_path)
    assert output.startswith("ok")
