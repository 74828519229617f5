"""Weights-only checkpoints reproduce inference bit for bit, for every layer and model of the package.

A model is built from code twice with `seed=None` (so each draws its own seed). The second one loads
the weights of the first (`save_weights`/`load_weights`, `ModelCheckpoint(save_weights_only=True)`).
It must then predict exactly what the first predicts: YosoAttention keeps its inference hash
functions as a non-trainable weight. Files written before that change (tests/data/legacy_yoso_weights,
written by commit c3da81e on JAX with make_legacy.py's model: YosoAttention(seed=1234) then a
TransformerEncoderBlock with attention seed 99) still load, and the layers keep the hash functions
of their config seed.
"""

import os

import keras
import numpy as np
import pytest

from keras_yoso.layers import CachedMultiHeadAttention
from keras_yoso.layers import LinearRelativeAttention
from keras_yoso.layers import TransformerEncoderBlock
from keras_yoso.layers import YosoAttention
from keras_yoso.models import CausalLM

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "legacy_yoso_weights")
LENGTH, WIDTH = 12, 16


def _attention_model(make_layer):
    inputs = keras.Input((LENGTH, WIDTH))
    return keras.Model(inputs, make_layer()(inputs, inputs))


def _block_model(attention, **attention_kwargs):
    inputs = keras.Input((LENGTH, WIDTH))
    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=32, attention=attention,
                                    attention_kwargs=attention_kwargs)
    return keras.Model(inputs, block(inputs))


# name -> a function building the model from code, with no seed given anywhere.
MODELS = {
    "yoso": lambda: _attention_model(lambda: YosoAttention(num_heads=2, key_dim=8, num_hashes=4)),
    "yoso_gaussian_hash": lambda: _attention_model(
        lambda: YosoAttention(num_heads=2, key_dim=8, num_hashes=4, hash_method="gaussian")),
    "yoso_hadamard_hash": lambda: _attention_model(
        lambda: YosoAttention(num_heads=2, key_dim=8, num_hashes=4, hash_method="hadamard")),
    "yoso_conv": lambda: _attention_model(lambda: YosoAttention(num_heads=2, key_dim=8, num_hashes=4,
                                                                conv_window=3)),
    "yoso_expectation": lambda: _attention_model(lambda: YosoAttention(num_heads=2, key_dim=8,
                                                                       use_expectation=True)),
    "linear_relative": lambda: _attention_model(lambda: LinearRelativeAttention(num_heads=2, key_dim=8)),
    "cached_softmax": lambda: _attention_model(lambda: CachedMultiHeadAttention(num_heads=2, key_dim=8)),
    "block_yoso": lambda: _block_model("yoso", num_hashes=4),
    "block_linear_relative": lambda: _block_model("linear_relative"),
}


def _inputs():
    return np.random.default_rng(3).normal(size=(2, LENGTH, WIDTH)).astype("float32")


def _predict(model, x):
    return np.asarray(model.predict(x, verbose=0))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_load_weights_into_a_model_built_from_code_reproduces_inference_bit_for_bit(name, tmp_path):
    x = _inputs()
    saved = MODELS[name]()
    expected = _predict(saved, x)
    path = str(tmp_path / "model.weights.h5")
    saved.save_weights(path)
    fresh = MODELS[name]()
    _predict(fresh, x)  # a compiled predict function from before the load must read the loaded weights
    fresh.load_weights(path)
    np.testing.assert_array_equal(_predict(fresh, x), expected)


def test_a_fresh_yoso_layer_hashes_differently_until_it_loads_the_weights(tmp_path):
    """The property the test above relies on: two layers built with seed=None have different hash functions."""
    x = _inputs()
    first, second = MODELS["yoso"](), MODELS["yoso"]()
    for source, target in zip(first.weights, second.weights):
        if "hash_functions" not in target.path:
            target.assign(keras.ops.convert_to_numpy(source))
    assert not np.array_equal(_predict(first, x), _predict(second, x))
    functions = keras.ops.convert_to_numpy(first.get_layer(index=1)._hash_functions)
    second.get_layer(index=1)._hash_functions.assign(functions)
    np.testing.assert_array_equal(_predict(second, x), _predict(first, x))


def test_model_checkpoint_with_save_weights_only_reproduces_inference(tmp_path):
    x, y = _inputs(), np.random.default_rng(4).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    model = MODELS["block_yoso"]()
    model.compile(optimizer="adam", loss="mse")
    path = str(tmp_path / "checkpoint.weights.h5")
    model.fit(x, y, epochs=2, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    expected = _predict(model, x)
    fresh = MODELS["block_yoso"]()
    fresh.load_weights(path)
    np.testing.assert_array_equal(_predict(fresh, x), expected)


def test_causal_lm_weights_reproduce_logits_and_generation(tmp_path):
    def lm():
        return CausalLM(vocabulary_size=32, max_length=16, hidden_dim=16, num_layers=1, num_heads=2,
                        intermediate_dim=32, attention_kwargs={"num_hashes": 4})

    tokens = np.random.default_rng(5).integers(0, 32, size=(2, 8)).astype("int32")
    saved = lm()
    expected = keras.ops.convert_to_numpy(saved(tokens))
    generated = keras.ops.convert_to_numpy(saved.generate(tokens[:, :4], max_new_tokens=4))
    path = str(tmp_path / "lm.weights.h5")
    saved.save_weights(path)
    fresh = lm()
    fresh(tokens)
    fresh.load_weights(path)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(fresh(tokens)), expected)
    regenerated = keras.ops.convert_to_numpy(fresh.generate(tokens[:, :4], max_new_tokens=4))
    np.testing.assert_array_equal(regenerated, generated)


def _legacy_model():
    """make_legacy.py's model, built from code with the seeds it was saved with."""
    inputs = keras.Input((LENGTH, WIDTH))
    x = YosoAttention(num_heads=2, key_dim=8, num_hashes=4, hash_code_len=4, conv_window=3, seed=1234,
                      name="yoso")(inputs, inputs)
    x = TransformerEncoderBlock(num_heads=2, intermediate_dim=32, name="block",
                                attention_kwargs={"num_hashes": 4, "hash_code_len": 4, "seed": 99})(x)
    return keras.Model(inputs, x)


def test_files_written_before_the_hash_functions_were_weights_load_with_their_config_seed():
    x = np.load(os.path.join(LEGACY, "input.npy"))
    expected = np.load(os.path.join(LEGACY, "output.npy"))  # computed on JAX by the older code
    from_keras_file = keras.models.load_model(os.path.join(LEGACY, "model.keras"))
    outputs = _predict(from_keras_file, x)
    np.testing.assert_allclose(outputs, expected, rtol=1e-5, atol=1e-5)
    from_weights = _legacy_model()
    from_weights.load_weights(os.path.join(LEGACY, "model.weights.h5"))
    np.testing.assert_array_equal(_predict(from_weights, x), outputs)


def test_hash_codes_takes_exactly_one_of_seed_and_parameters():
    from keras_yoso import ops

    x = keras.ops.ones((1, 3, 8))
    with pytest.raises(ValueError, match="exactly one of `seed`"):
        ops.hash_codes(x, 4, 4)
    params = ops.hash_parameters(8, 4, 4, 0)
    with pytest.raises(ValueError, match="exactly one of `seed`"):
        ops.hash_codes(x, 4, 4, 0, parameters=params)
    with pytest.raises(ValueError, match=r"must have shape \(4, 3, 8\).*got shape \(4, 3, 16\)"):
        ops.hash_codes(x, 4, 4, parameters=keras.ops.ones((4, 3, 16)))
    np.testing.assert_array_equal(np.asarray(ops.hash_codes(x, 4, 4, parameters=params)),
                                  np.asarray(ops.hash_codes(x, 4, 4, 0)))
