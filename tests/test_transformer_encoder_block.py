"""TransformerEncoderBlock: shapes, masks, config/saving, and a long-sequence task that needs attention."""

import re

import keras
import numpy as np
import pytest

from conftest import requires_tensorflow, run_program, to_numpy

from keras_yoso.layers import LinearRelativeAttention
from keras_yoso.layers import TransformerEncoderBlock
from keras_yoso.layers import YosoAttention

YOSO_KWARGS = dict(num_hashes=8, hash_code_len=4)
SEEDS = (0, 1)  # the matching-markers task's seeds


def _lengths_mask(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


ATTENTION_CLASSES = {"yoso": YosoAttention, "softmax": keras.layers.MultiHeadAttention,
                     "linear_relative": LinearRelativeAttention}


@pytest.mark.parametrize("attention", list(ATTENTION_CLASSES))
@pytest.mark.parametrize("normalize_first", [False, True], ids=["post_ln", "pre_ln"])
def test_output_shape_and_attention_layer(attention, normalize_first):
    x = np.random.default_rng(0).normal(size=(2, 9, 16)).astype(np.float32)
    block = TransformerEncoderBlock(4, 32, attention=attention, normalize_first=normalize_first,
                                    attention_kwargs=YOSO_KWARGS if attention == "yoso" else None)
    assert block(x).shape == (2, 9, 16)
    assert isinstance(block.attention_layer, ATTENTION_CLASSES[attention])
    assert block.attention_layer.key_dim == 4


def test_attention_kwargs_override_key_dim():
    block = TransformerEncoderBlock(2, 32, attention_kwargs=dict(key_dim=3, conv_window=5, **YOSO_KWARGS))
    block(np.zeros((1, 6, 16), np.float32))
    assert block.attention_layer.key_dim == 3
    assert block.attention_layer.conv_window == 5


def test_linear_relative_block_passes_its_attention_kwargs():
    block = TransformerEncoderBlock(2, 32, attention="linear_relative",
                                    attention_kwargs=dict(horizon=3, causal=True, share_relative_embeddings=True))
    x = np.random.default_rng(3).normal(size=(1, 12, 16)).astype(np.float32)
    out = to_numpy(block(x))
    layer = block.attention_layer
    assert (layer.horizon, layer.causal, layer.share_relative_embeddings) == (3, True, True)
    assert tuple(layer.relative_embeddings.shape) == (7, 8)
    x_future = x.copy()
    x_future[:, 6:] += 1.0
    # Causal attention, then position-wise layers: outputs before position 6 ignore later inputs.
    np.testing.assert_allclose(to_numpy(block(x_future))[:, :6], out[:, :6], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arguments, match", [
    (dict(num_heads=0, intermediate_dim=8), "num_heads.*positive integer"),
    (dict(num_heads=2, intermediate_dim=0), "intermediate_dim.*positive integer"),
    (dict(num_heads=2, intermediate_dim=8, attention="performer"), "attention.*yoso.*'performer'"),
    (dict(num_heads=2, intermediate_dim=8, dropout=1.5), "dropout"),
    (dict(num_heads=2, intermediate_dim=8, attention_kwargs=[1]), "attention_kwargs"),
    (dict(num_heads=2, intermediate_dim=8, attention_kwargs=dict(seed="x")),
     r"argument `attention_kwargs\['seed'\]`: expected an integer or None"),
])
def test_invalid_arguments_raise(arguments, match):
    with pytest.raises(ValueError, match=match):
        TransformerEncoderBlock(**arguments)


@pytest.mark.parametrize("attention", list(ATTENTION_CLASSES))
def test_padded_content_does_not_change_unpadded_outputs(attention):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 10, 16)).astype(np.float32)
    mask = _lengths_mask([10, 6, 2], 10)
    noisy = np.where(mask[:, :, None], x, 100 * rng.normal(size=x.shape)).astype(np.float32)
    kwargs = dict(YOSO_KWARGS, conv_window=3) if attention == "yoso" else None
    block = TransformerEncoderBlock(2, 32, attention=attention, attention_kwargs=kwargs)
    np.testing.assert_allclose(to_numpy(block(noisy, padding_mask=mask))[mask],
                               to_numpy(block(x, padding_mask=mask))[mask], rtol=1e-4, atol=1e-4)


def test_keras_masks_are_used_and_propagated():
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, 16, mask_zero=True)(tokens)
    x = TransformerEncoderBlock(2, 32, attention_kwargs=YOSO_KWARGS)(x)
    x = TransformerEncoderBlock(2, 32, attention_kwargs=YOSO_KWARGS, normalize_first=True)(x)
    model = keras.Model(tokens, x)
    short = np.array([[4, 5, 6, 0], [7, 0, 0, 0]])
    long = np.concatenate([short, np.zeros((2, 7), short.dtype)], axis=1)
    np.testing.assert_allclose(to_numpy(model(long))[:, :4][short != 0], to_numpy(model(short))[short != 0],
                               rtol=1e-4, atol=1e-5)
    output = model.layers[-1](model.layers[-2](model.layers[1](keras.ops.convert_to_tensor(short))))
    from keras.src.backend import get_keras_mask
    np.testing.assert_array_equal(to_numpy(get_keras_mask(output)), short != 0)


def test_config_round_trip_and_keras_save_load(tmp_path):
    block = TransformerEncoderBlock(2, 24, attention_kwargs=dict(YOSO_KWARGS, conv_window=3), dropout=0.2,
                                    normalize_first=True, activation="relu", layer_norm_epsilon=1e-6)
    config = block.get_config()
    for argument in ("num_heads", "intermediate_dim", "attention", "attention_kwargs", "dropout", "normalize_first",
                     "activation", "layer_norm_epsilon"):
        assert argument in config
    assert TransformerEncoderBlock.from_config(config).get_config() == config

    tokens = keras.Input((12,), dtype="int32")
    x = keras.layers.Embedding(20, 16, mask_zero=True)(tokens)
    x = TransformerEncoderBlock(2, 24, attention_kwargs=dict(YOSO_KWARGS, conv_window=3))(x)
    x = TransformerEncoderBlock(2, 24, attention="softmax")(x)
    model = keras.Model(tokens, keras.layers.GlobalAveragePooling1D()(x))
    data = np.random.default_rng(2).integers(1, 20, size=(3, 12))
    data[1, 5:] = 0
    expected = to_numpy(model(data))
    model.save(tmp_path / "encoder.keras")
    np.testing.assert_array_equal(to_numpy(keras.saving.load_model(tmp_path / "encoder.keras")(data)), expected)


def test_normalize_first_is_keras_hubs_name_and_configs_saved_with_norm_first_still_load():
    x = np.random.default_rng(5).normal(size=(2, 6, 16)).astype(np.float32)
    block = TransformerEncoderBlock(2, 24, attention_kwargs=YOSO_KWARGS, normalize_first=True)
    expected = to_numpy(block(x))
    config = block.get_config()
    assert block.normalize_first is True and config["normalize_first"] is True and "norm_first" not in config
    saved_before = {**{k: v for k, v in config.items() if k != "normalize_first"}, "norm_first": True}
    reloaded = TransformerEncoderBlock.from_config(saved_before)
    reloaded(x)
    reloaded.set_weights(block.get_weights())
    assert reloaded.normalize_first is True and reloaded.get_config() == config
    np.testing.assert_array_equal(to_numpy(reloaded(x)), expected)
    assert TransformerEncoderBlock(2, 24, norm_first=False).normalize_first is False
    with pytest.raises(ValueError, match="both `normalize_first` and its former name `norm_first`"):
        TransformerEncoderBlock(2, 24, normalize_first=True, norm_first=False)


# ----------------------------------------------------------------------------
# A long-sequence task that attention must solve (tests/programs/matching_markers.py).

@requires_tensorflow  # the learning itself; the composite's gradients are checked on every backend
def test_yoso_encoder_at_the_default_settings_learns_a_long_range_matching_task_on_every_seed(tmp_path):
    # Every seed, scored once at the end (issue 43, item 8). Measured 2026-11-28 on TensorFlow at 512 tokens:
    # 800 steps, seeds 0-5 all 1.0 (one thread, and seeds 0-2 again in pytest's process); 500 steps, seed 4
    # stayed at 0.76 (at 1e-3, seed 0 at 0.51); 600 steps (2026-12-01), seed 0 stayed at 0.45 and seeds 1-5
    # reached 1.0, so 800 it is. At 256 tokens seeds 0-5 reached 1.0 on one thread but seed 1 stayed at
    # 0.51 in pytest's process (other threads, another summation order), so the length stays 512.
    # The old recipe (tau = 4, a constant rate) needed the best of 5 checkpoints and let one seed of three
    # fail. A model whose attention does not work stays near 0.5. Two seeds, as the MQAR test, in a fresh
    # interpreter (docs/build.md, "Threads").
    output = run_program("matching_markers", 512, 800, *SEEDS, cwd=tmp_path, timeout=1800)
    accuracies = {int(seed): float(accuracy) for seed, accuracy in re.findall(r"^seed (\d+) accuracy (\S+)$", output, re.M)}
    assert sorted(accuracies) == list(SEEDS), output
    assert min(accuracies.values()) >= 0.9, accuracies


@pytest.mark.parametrize("arguments, inputs, match", [
    (dict(num_heads=2, intermediate_dim=8), (2, 6, None), r"last dimension of the inputs must be known"),
    (dict(num_heads=4, intermediate_dim=8), (2, 6, 2),
     r"argument `num_heads`: expected a divisor of the input width 2 .*Received: num_heads=4"),
    (dict(num_heads=2, intermediate_dim=8, attention_kwargs=dict(num_hashes=0)), (2, 6, 8),
     "num_hashes.*num_hashes=0"),
    (dict(num_heads=2, intermediate_dim=8, attention="linear_relative", attention_kwargs=dict(horizon=0)),
     (2, 6, 8), "horizon.*horizon=0"),
])
def test_build_errors_name_the_argument(arguments, inputs, match):
    with pytest.raises(ValueError, match=match):
        TransformerEncoderBlock(**arguments).build(inputs)


@pytest.mark.parametrize("attention", list(ATTENTION_CLASSES))
def test_num_heads_that_do_not_divide_the_width_raise_unless_key_dim_is_given(attention):
    kwargs = YOSO_KWARGS if attention == "yoso" else {}
    with pytest.raises(ValueError, match=r"argument `num_heads`: expected a divisor of the input width 32 "
                                         r".*attention_kwargs=\{'key_dim': \.\.\.\}\. Received: num_heads=3"):
        TransformerEncoderBlock(3, 16, attention=attention, attention_kwargs=kwargs).build((2, 6, 32))
    block = TransformerEncoderBlock(3, 16, attention=attention, attention_kwargs=dict(kwargs, key_dim=10))
    assert block(np.zeros((2, 6, 32), np.float32)).shape == (2, 6, 32)
    assert block.attention_layer.key_dim == 10


def test_string_padding_masks_are_rejected_naming_the_argument():
    with pytest.raises(ValueError, match=r"argument `padding_mask`: expected a bool or numeric mask\. "
                                         r"Received: padding_mask of dtype string"):
        TransformerEncoderBlock(2, 16, attention_kwargs=YOSO_KWARGS)(np.zeros((2, 6, 8), np.float32),
                                                                       padding_mask=np.full((2, 6), "yes"))
