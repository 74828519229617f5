"""keras_yoso.transfer_attention (issue 42, item 3): the trained map folds into the projections exactly, the
transferred layers err less than the converted ones on the transfer inputs and never more than their start, the
result lives in the config and weights (a `.keras` file keeps it), the converted model is left unchanged, and bad
arguments raise. Tiny models (two attention layers of 2 heads of 4)."""

import keras
import numpy as np
import pytest
from test_calibration import _inputs
from test_calibration import _layer_errors
from test_calibration import _original

import keras_yoso
from keras_yoso.calibration import _copy_weights
from keras_yoso.transfer import _Student
from keras_yoso.transfer import _assign


@pytest.fixture(scope="module")
def transferred():
    original, states = _original()
    converted = keras_yoso.replace_attention(original, "yoso", num_hashes=8, hash_code_len=4, seed=1)
    inputs = _inputs(8, seed=1)
    model = keras_yoso.transfer_attention(converted, original, inputs, steps=40, learning_rate=2e-2, verbose=False)
    return original, states, converted, model, inputs


@pytest.mark.parametrize("local_window", [None, 2])
def test_the_trained_map_and_scale_fold_into_a_plain_yoso_layer_exactly(local_window):
    """A student with random maps, offsets and scales (and window scale) gives the output of a YosoAttention whose
    query and key projections are the folded ones, whose output_scale is the student's scale and whose window
    scale is the student's (YOSO-E: no sampling; the window reads the mapped heads)."""
    x = _inputs(2, seed=5)
    layer = keras_yoso.YosoAttention(2, 4, use_expectation=True, seed=3, local_window=local_window)
    layer(x, x)
    student = _Student.from_config(layer.get_config())
    student(x, x)
    _copy_weights(layer, student)
    rng = np.random.default_rng(0)
    trained = [student.query_map, student.key_map, student.query_offset, student.key_offset, student.head_scale]
    if local_window is not None:
        trained.append(student.local_window_scale_weight())
    for variable in trained:
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    weights, scale = student.folded()
    plain = keras_yoso.YosoAttention.from_config({**layer.get_config(), "output_scale": scale})
    plain(x, x)
    plain.set_weights(layer.get_weights())
    _assign(plain, weights)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(plain(x, x)), keras.ops.convert_to_numpy(student(x, x)),
                               rtol=1e-4, atol=1e-5)


def test_transferred_layers_err_less_than_the_converted_ones_on_the_transfer_inputs(transferred):
    original, states, converted, model, inputs = transferred
    before = _layer_errors(original, states, converted, inputs)
    after = _layer_errors(original, states, model, inputs)
    assert np.all(after < 0.9 * before), (before, after)
    for i in range(2):
        layer, start = model.get_layer(f"attention_{i}"), converted.get_layer(f"attention_{i}")
        assert len(layer.output_scale) == 2 and start.output_scale is None  # the converted model is unchanged
        assert layer.hash_code_len == start.hash_code_len and layer.num_hashes == start.num_hashes
        assert not np.allclose(keras.ops.convert_to_numpy(layer.query_dense.kernel),
                               keras.ops.convert_to_numpy(start.query_dense.kernel))
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.value_dense.kernel),
                                      keras.ops.convert_to_numpy(start.value_dense.kernel))


def test_a_transfer_that_does_not_help_keeps_the_start():
    """At an absurd learning rate the trained map is worse than none: each layer keeps its start, the
    least-squares scale with the converted projections (so its error is calibrate's at the layer's tau)."""
    original, states = _original()
    converted = keras_yoso.replace_attention(original, "yoso", use_expectation=True, hash_code_len=4, seed=1)
    inputs = _inputs(4, seed=1)
    model = keras_yoso.transfer_attention(converted, original, inputs, steps=3, learning_rate=50.0, verbose=False)
    calibrated = keras_yoso.calibrate(converted, original, inputs, hash_code_lens=[4], verbose=False)
    np.testing.assert_allclose(_layer_errors(original, states, model, inputs),
                               _layer_errors(original, states, calibrated, inputs), rtol=1e-4)


def test_a_transfer_trains_the_local_window_scale_from_zero():
    """A model converted with local_window=2: the transfer trains each layer's window scale from zero, and the
    transferred layers err less than the converted ones."""
    original, states = _original()
    converted = keras_yoso.replace_attention(original, "yoso", num_hashes=8, hash_code_len=4, seed=1, local_window=2)
    inputs = _inputs(8, seed=1)
    model = keras_yoso.transfer_attention(converted, original, inputs, steps=40, learning_rate=2e-2, verbose=False)
    assert np.all(_layer_errors(original, states, model, inputs) < _layer_errors(original, states, converted, inputs))
    for i in range(2):
        start = keras.ops.convert_to_numpy(converted.get_layer(f"attention_{i}").local_window_scale_weight())
        trained = keras.ops.convert_to_numpy(model.get_layer(f"attention_{i}").local_window_scale_weight())
        np.testing.assert_array_equal(start, np.zeros(2))
        assert np.abs(trained).max() > 0.05, trained



def test_the_transfer_is_kept_through_a_keras_file(transferred, tmp_path):
    _, _, _, model, inputs = transferred
    path = str(tmp_path / "transferred.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(inputs)), keras.ops.convert_to_numpy(model(inputs)),
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("arguments, match", [
    ({"steps": 0}, "steps"), ({"learning_rate": -1.0}, "learning_rate"),
    ({"student": "exact"}, r"`student` in \(None, 'expectation'\).*'exact'"),
])
def test_bad_transfer_arguments_raise_naming_them(transferred, arguments, match):
    """transfer_attention's own arguments (tests/test_calibration.py checks those it shares with calibrate)."""
    original, _, converted, _, inputs = transferred
    with pytest.raises(ValueError, match=match):
        keras_yoso.transfer_attention(converted, original, inputs, verbose=False, **arguments)


def test_a_causal_conversion_is_refused_naming_the_layer(transferred):
    original, _, _, _, inputs = transferred
    causal = keras_yoso.replace_attention(original, "yoso", causal=True, seed=1)
    with pytest.raises(ValueError, match="no causal form.*'attention_0' is causal"):
        keras_yoso.transfer_attention(causal, original, inputs, verbose=False)
