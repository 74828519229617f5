"""`keras_yoso.replace_attention` rewrites existing models with their trained weights carried over.

Functional and Sequential models with `keras.layers.MultiHeadAttention`, keras-hub backbones built
from a config (random weights; keras-hub is a test extra), keras_yoso blocks. "softmax" (keras_yoso's
CachedMultiHeadAttention, a MultiHeadAttention subclass) as the replacement reproduces the original
model's outputs: that proves every weight reached its place. keras-hub is skipped where absent.
"""

import os

import keras
import numpy as np
import pytest

from conftest import run_python, runs_on, to_numpy
from keras_yoso import TransformerEncoderBlock
from keras_yoso import YosoAttention
from keras_yoso import replace_attention
from keras_yoso.layers import LinearRelativeAttention

WIDTH, LENGTH = 16, 12
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mha_model(**mha_kwargs):
    inputs = keras.Input((LENGTH, WIDTH))
    mask = keras.Input((LENGTH,), dtype="bool")
    x = keras.layers.Dense(WIDTH, name="embed")(inputs)
    x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha", **mha_kwargs)(
        x, x, attention_mask=mask[:, None, :])
    return keras.Model([inputs, mask], keras.layers.Dense(3, name="head")(x[:, 0]))


def _features(batch=2, length=LENGTH, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), bool)
    mask[1, length - 3:] = False
    return rng.normal(size=(batch, length, WIDTH)).astype("float32"), mask


def _weights_by_path(layer):
    return {v.path[len(layer.path) + 1:]: to_numpy(v) for v in layer.weights}


def test_replacing_mha_with_softmax_reproduces_the_functional_model():
    model = _mha_model(use_gate=True)
    converted = replace_attention(model, "softmax")
    x, mask = _features()
    np.testing.assert_allclose(to_numpy(converted([x, mask])), to_numpy(model([x, mask])), atol=1e-5)


def test_replaced_yoso_layer_has_the_mha_heads_sizes_and_projection_weights():
    model = _mha_model(use_gate=True)
    converted = replace_attention(model, "yoso", num_hashes=8, hash_code_len=4)
    old, new = model.get_layer("mha"), converted.get_layer("mha")
    assert isinstance(new, YosoAttention)
    assert (new.num_heads, new.key_dim, new.value_dim, new.num_hashes, new.hash_code_len) == (2, 8, 8, 8, 4)
    assert new.get_config()["use_gate"] is True
    old_weights, new_weights = _weights_by_path(old), _weights_by_path(new)
    assert set(new_weights) == set(old_weights) | {"hash_functions"}
    for path, value in old_weights.items():
        np.testing.assert_array_equal(new_weights[path], value, err_msg=path)
    for name in ("embed", "head"):
        for a, b in zip(model.get_layer(name).weights, converted.get_layer(name).weights):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    x, mask = _features()
    out = to_numpy(converted([x, mask]))
    assert out.shape == (2, 3) and np.isfinite(out).all()


def test_original_model_is_left_unchanged():
    model = _mha_model()
    before = [to_numpy(v).copy() for v in model.weights]
    converted = replace_attention(model, "linear_relative")
    assert type(model.get_layer("mha")) is keras.layers.MultiHeadAttention
    assert isinstance(converted.get_layer("mha"), LinearRelativeAttention)
    for old, value in zip(model.weights, before):
        np.testing.assert_array_equal(to_numpy(old), value)
    converted.get_layer("head").kernel.assign(np.zeros((WIDTH, 3), "float32"))
    assert np.abs(to_numpy(model.get_layer("head").kernel)).sum() > 0


def test_converted_model_trains_and_round_trips_through_a_keras_file(tmp_path):
    model = _mha_model()
    model.compile(optimizer="adam", loss="mse")
    converted = replace_attention(model, "yoso", num_hashes=4, seed=5)
    assert converted.compiled
    x, mask = _features(batch=4)
    converted.fit([x, mask], np.zeros((4, 3), "float32"), epochs=1, batch_size=2, verbose=0)
    path = str(tmp_path / "converted.keras")
    converted.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(loaded.predict([x, mask], verbose=0)),
                                  to_numpy(converted.predict([x, mask], verbose=0)))


def test_seed_argument_gives_each_replaced_layer_its_own_seed():
    inputs = keras.Input((LENGTH, WIDTH))
    x = keras.layers.MultiHeadAttention(2, 8, name="first")(inputs, inputs)
    x = keras.layers.MultiHeadAttention(2, 8, name="second")(x, x)
    converted = replace_attention(keras.Model(inputs, x), "yoso", seed=10)
    assert [converted.get_layer(n).seed for n in ("first", "second")] == [10, 11]


def test_transformer_encoder_block_takes_the_new_attention_by_name():
    inputs = keras.Input((LENGTH, WIDTH))
    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=32, attention="softmax", name="block")
    model = keras.Model(inputs, block(inputs))
    converted = replace_attention(model, "yoso", num_hashes=4)
    new_block = converted.get_layer("block")
    assert new_block.attention == "yoso" and isinstance(new_block.attention_layer, YosoAttention)
    old_weights, new_weights = _weights_by_path(block), _weights_by_path(new_block)
    for path, value in old_weights.items():
        np.testing.assert_array_equal(new_weights[path], value, err_msg=path)
    x, _ = _features()
    np.testing.assert_allclose(to_numpy(replace_attention(model, "softmax")(x)), to_numpy(model(x)), atol=1e-5)


def test_position_embedding_named_position_is_extended_and_inputs_lengthened():
    tokens = keras.Input((LENGTH,), dtype="int32")
    positions = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(20, WIDTH, name="tokens")(tokens) + keras.layers.Embedding(
        LENGTH, WIDTH, name="position_table")(positions)
    x = keras.layers.MultiHeadAttention(2, 8, name="mha")(x, x)
    model = keras.Model([tokens, positions], x)
    converted = replace_attention(model, "yoso", max_length=30, num_hashes=4)
    assert [tuple(t.shape) for t in converted.inputs] == [(None, 30), (None, 30)]
    old = to_numpy(model.get_layer("position_table").embeddings)
    new = to_numpy(converted.get_layer("position_table").embeddings)
    assert new.shape == (30, WIDTH)
    np.testing.assert_array_equal(new, np.concatenate([old, old, old])[:30])
    ids = np.arange(60).reshape(2, 30) % 20
    assert to_numpy(converted([ids, np.tile(np.arange(30), (2, 1))])).shape == (2, 30, WIDTH)


def test_a_max_length_below_the_learned_positions_raises_instead_of_dropping_trained_rows():
    tokens = keras.Input((LENGTH,), dtype="int32")
    positions = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(20, WIDTH, name="tokens")(tokens) + keras.layers.Embedding(
        LENGTH, WIDTH, name="position_table")(positions)
    model = keras.Model([tokens, positions], keras.layers.MultiHeadAttention(2, 8, name="mha")(x, x))
    with pytest.raises(ValueError, match=rf"max_length=8\) extends .* has {LENGTH} trained positions: a shorter "
                                         rf"table would drop rows 8..{LENGTH - 1}.*Leave max_length out"):
        replace_attention(model, "yoso", max_length=8, num_hashes=4)
    same = replace_attention(model, "yoso", max_length=LENGTH, num_hashes=4)
    np.testing.assert_array_equal(to_numpy(same.get_layer("position_table").embeddings),
                                  to_numpy(model.get_layer("position_table").embeddings))


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.attention = keras.layers.MultiHeadAttention(2, 8)

    def call(self, x):
        return self.attention(x, x)


class _HoldsAttention(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(2, 8)

    def call(self, x):
        return self.attention(x, x)


def test_models_it_cannot_rewrite_raise_naming_what_and_why():
    with pytest.raises(ValueError, match="subclassed model, _Subclassed"):
        replace_attention(_Subclassed())
    inputs = keras.Input((LENGTH, WIDTH))
    model = keras.Model(inputs, _HoldsAttention(name="custom_block")(inputs))
    with pytest.raises(ValueError, match="layer 'custom_block' \\(_HoldsAttention\\).*in its own code"):
        replace_attention(model)
    plain = keras.Model(inputs, keras.layers.Dense(4)(inputs))
    with pytest.raises(ValueError, match="found no MultiHeadAttention"):
        replace_attention(plain)
    with pytest.raises(ValueError, match="max_length=64.*has none"):
        replace_attention(_mha_model(), max_length=64)
    with pytest.raises(ValueError, match="attention_kwargs.*'num_heads'.*replaced MultiHeadAttention"):
        replace_attention(_mha_model(), num_heads=4)
    with pytest.raises(ValueError, match="attention"):
        replace_attention(_mha_model(), attention="flash")
    with pytest.raises(ValueError, match="num_hashes"):
        replace_attention(_mha_model(), num_hashes=0)
    with pytest.raises(ValueError, match="max_length"):
        replace_attention(_mha_model(), max_length=0)
    with pytest.raises(ValueError, match="sliding_window"):
        replace_attention(_mha_model(sliding_window=3))
    with pytest.raises(ValueError, match="keras.Model"):
        replace_attention(keras.layers.MultiHeadAttention(2, 8))


def test_key_mask_of_shape_b1s_compiles_and_equals_the_key_mask_call():
    """keras-hub passes padding as a [B, 1, S] attention mask: a key mask by its shape, taken under XLA."""
    layer = YosoAttention(num_heads=2, key_dim=8, num_hashes=4, seed=3)
    x, mask = _features()
    expected = to_numpy(layer(x, x, value_mask=mask))
    np.testing.assert_allclose(to_numpy(layer(x, x, attention_mask=mask[:, None, :])), expected, atol=1e-6)
    inputs, mask_input = keras.Input((LENGTH, WIDTH)), keras.Input((1, LENGTH), dtype="bool")
    model = keras.Model([inputs, mask_input], layer(inputs, inputs, attention_mask=mask_input))
    model.compile(jit_compile=keras.backend.backend() == "jax")  # torch.compile of it: 100 s on 2 cores
    np.testing.assert_allclose(to_numpy(model.predict([x, mask[:, None, :]], verbose=0)), expected, atol=1e-5)


# ---------------------------------------------------------------- keras-hub

def _bert(**kwargs):
    keras_hub = pytest.importorskip("keras_hub")
    return keras_hub.models.BertBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=WIDTH,
                                         intermediate_dim=32, max_sequence_length=LENGTH, **kwargs)


def _bert_inputs(length, seed=0):
    ids = np.random.default_rng(seed).integers(1, 50, size=(2, length))
    mask = np.ones((2, length), bool)
    mask[1, length - 5:] = False
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def test_bert_backbone_with_softmax_replacement_reproduces_its_outputs():
    backbone = _bert()
    converted = replace_attention(backbone, "softmax")
    inputs = _bert_inputs(LENGTH)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(to_numpy(converted(inputs)[key]), to_numpy(backbone(inputs)[key]), atol=1e-5)


def test_bert_backbone_to_yoso_with_extended_positions(tmp_path):
    from keras_yoso import hub

    backbone = _bert()
    converted = replace_attention(backbone, "yoso", max_length=40, num_hashes=8, hash_code_len=4)
    for i in range(2):
        layer = converted.get_layer(f"transformer_layer_{i}")
        assert isinstance(layer, hub.TransformerEncoder)
        assert isinstance(layer._self_attention_layer, YosoAttention)
        old = _weights_by_path(backbone.get_layer(f"transformer_layer_{i}"))
        new = _weights_by_path(layer)
        assert set(new) == set(old) | {"self_attention_layer/hash_functions"}
        for path, value in old.items():
            np.testing.assert_array_equal(new[path], value, err_msg=path)
    old_rows = to_numpy(backbone.get_layer("position_embedding").position_embeddings)
    new_rows = to_numpy(converted.get_layer("position_embedding").position_embeddings)
    np.testing.assert_array_equal(new_rows, np.concatenate([old_rows] * 4)[:40])
    inputs = _bert_inputs(40)
    out = to_numpy(converted(inputs)["sequence_output"])
    assert out.shape == (2, 40, WIDTH) and np.isfinite(out).all()
    changed = {**inputs, "token_ids": inputs["token_ids"].copy()}
    changed["token_ids"][1, 35:] = 7  # padded positions: the unpadded outputs must not move
    np.testing.assert_allclose(to_numpy(converted(changed)["sequence_output"])[1, :35], out[1, :35], atol=1e-5)
    path = str(tmp_path / "bert_yoso.keras")
    converted.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(loaded(inputs)["sequence_output"]), out)


# Loads a converted keras-hub model saved as .keras in a fresh interpreter after `imports`, then checks
# that keras_hub is imported only by the loading, and saves the outputs.
_LOAD_AFTER_IMPORTS = """
import sys
{imports}
hub_before_loading = "keras_hub" in sys.modules
import keras, numpy as np
inputs = dict(np.load({inputs!r}))
model = keras.saving.load_model({model!r})
np.save({output!r}, keras.ops.convert_to_numpy(model(inputs)["sequence_output"]))
print("keras_hub imported before loading:", hub_before_loading)
"""


# Each case loads in a fresh interpreter (17-20 s on JAX and PyTorch); the import order is the same Python on
# every backend, so its other two cases run on TensorFlow only.
@pytest.mark.parametrize("imports", ["import keras_yoso",
                                     pytest.param("import keras_yoso\nimport keras_hub", marks=runs_on("tensorflow")),
                                     pytest.param("import keras_hub\nimport keras_yoso", marks=runs_on("tensorflow"))])
def test_a_converted_keras_hub_model_loads_whatever_the_import_order(imports, tmp_path):
    converted = replace_attention(_bert(), "yoso", num_hashes=4, hash_code_len=4, seed=2)
    inputs = _bert_inputs(LENGTH)
    np.savez(tmp_path / "inputs.npz", **inputs)
    converted.save(tmp_path / "converted.keras")
    code = _LOAD_AFTER_IMPORTS.format(imports=imports, inputs=str(tmp_path / "inputs.npz"),
                                      model=str(tmp_path / "converted.keras"), output=str(tmp_path / "output.npy"))
    printed = run_python(code, cwd=ROOT)
    assert f"keras_hub imported before loading: {imports != 'import keras_yoso'}" in printed  # not by keras_yoso
    np.testing.assert_array_equal(np.load(tmp_path / "output.npy"), to_numpy(converted(inputs)["sequence_output"]))


def test_converted_bert_classifier_fits_compiled():
    backbone = replace_attention(_bert(), "yoso", num_hashes=4, hash_code_len=4)
    inputs = {name: keras.Input((None,), dtype="bool" if name == "padding_mask" else "int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask")}
    outputs = keras.layers.Dense(2)(backbone(inputs)["pooled_output"])
    classifier = keras.Model(inputs, outputs)
    classifier.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                       jit_compile=keras.backend.backend() == "jax")
    data = _bert_inputs(LENGTH)
    history = classifier.fit(data, np.array([0, 1]), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_keras_hub_decoder_becomes_causal_yoso_and_refuses_caches():
    keras_hub = pytest.importorskip("keras_hub")
    inputs = keras.Input((None, WIDTH))
    decoder = keras_hub.layers.TransformerDecoder(intermediate_dim=32, num_heads=2, name="decoder")
    model = keras.Model(inputs, decoder(inputs))
    np.testing.assert_allclose(to_numpy(replace_attention(model, "softmax")(_features()[0])),
                               to_numpy(model(_features()[0])), atol=1e-5)
    converted = replace_attention(model, "yoso", num_hashes=8)
    attention = converted.get_layer("decoder")._self_attention_layer
    assert isinstance(attention, YosoAttention) and attention.get_config()["causal"] is True
    x = _features()[0]
    later = x.copy()
    later[:, 7:] += 3.0
    np.testing.assert_allclose(to_numpy(converted(later))[:, :7], to_numpy(converted(x))[:, :7], atol=1e-5)
    layer = converted.get_layer("decoder")
    with pytest.raises(ValueError, match="use_causal_mask"):
        layer(x, use_causal_mask=False)
    cache = np.zeros((2, 2, LENGTH, 2, 8), "float32")
    with pytest.raises(ValueError, match="key/value caches"):
        layer(x[:, :1], self_attention_cache=cache, self_attention_cache_update_index=0)


def test_keras_hub_encoder_decoder_with_cross_attention_and_token_position_embedding():
    keras_hub = pytest.importorskip("keras_hub")
    encoder_ids, decoder_ids = keras.Input((LENGTH,), dtype="int32"), keras.Input((LENGTH,), dtype="int32")
    embed = keras_hub.layers.TokenAndPositionEmbedding(50, LENGTH, WIDTH, name="embed")
    encoded = keras_hub.layers.TransformerEncoder(32, 2, name="encoder")(embed(encoder_ids))
    decoded = keras_hub.layers.TransformerDecoder(32, 2, name="decoder")(embed(decoder_ids), encoded)
    model = keras.Model([encoder_ids, decoder_ids], decoded)
    ids = [np.random.default_rng(s).integers(1, 50, (2, LENGTH)) for s in (1, 2)]
    np.testing.assert_allclose(to_numpy(replace_attention(model, "softmax")(ids)), to_numpy(model(ids)), atol=1e-5)
    converted = replace_attention(model, "linear_relative", max_length=20)
    assert isinstance(converted.get_layer("decoder")._cross_attention_layer, LinearRelativeAttention)
    assert converted.get_layer("embed").get_config()["sequence_length"] == 20
    long_ids = [np.random.default_rng(s).integers(1, 50, (2, 20)) for s in (1, 2)]
    assert to_numpy(converted(long_ids)).shape == (2, 20, WIDTH)


def test_a_yoso_model_converts_again_with_other_hash_settings_keeping_its_projections():
    inputs = keras.Input((LENGTH, WIDTH))
    model = keras.Model(inputs, YosoAttention(2, 8, num_hashes=4, name="attention")(inputs, inputs))
    model(_features()[0])
    converted = replace_attention(model, "yoso", num_hashes=8)
    old, new = _weights_by_path(model.get_layer("attention")), _weights_by_path(converted.get_layer("attention"))
    assert converted.get_layer("attention").num_hashes == 8
    assert not np.array_equal(new["hash_functions"], old["hash_functions"])  # drawn from the new layer's seed
    for path in ("query/kernel", "key/kernel", "value/kernel", "attention_output/kernel"):
        np.testing.assert_array_equal(new[path], old[path])
