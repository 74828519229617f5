"""YosoAttention's own behaviour, on every backend: hash seeds, N-YOSO-E math against NumPy, YOSO-C,
its constructor arguments. (The MultiHeadAttention contract shared with LinearRelativeAttention is
in test_attention_layer_contract.py; graphs, XLA and SavedModels in test_tf_layer_graphs_and_export.py.)"""

import keras
import numpy as np
import pytest

from conftest import lengths_mask, to_numpy, trainable_gradients
from keras_yoso import ops
from keras_yoso.layers import YosoAttention
from keras_yoso.layers.multi_head_attention_base import l2_normalize

SMALL = dict(num_hashes=8, hash_code_len=4)


def _inputs(rng, batch, length, dim):
    return rng.normal(size=(batch, length, dim)).astype(np.float32)


def test_causal_mask_with_expectation_raises():
    x = np.zeros((1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="use_causal_mask=True is not implemented with use_expectation=True"):
        YosoAttention(2, 4, use_expectation=True, **SMALL)(x, x, use_causal_mask=True)
    with pytest.raises(ValueError, match="use_causal_mask=True is not implemented with use_expectation=True"):
        YosoAttention(2, 4, use_expectation=True, **SMALL)(keras.Input((4, 8)), keras.Input((4, 8)),
                                                           use_causal_mask=True)


def test_causal_constructor_argument_is_the_default_of_use_causal_mask():
    rng = np.random.default_rng(4)
    x = _inputs(rng, 2, 10, 8)
    causal = YosoAttention(2, 4, causal=True, seed=7, **SMALL)
    plain = YosoAttention.from_config({**causal.get_config(), "causal": False})
    result = to_numpy(causal(x, x))
    plain.build(x.shape, x.shape)
    plain.set_weights(causal.get_weights())
    np.testing.assert_array_equal(result, to_numpy(plain(x, x, use_causal_mask=True)))
    np.testing.assert_array_equal(to_numpy(causal(x, x, use_causal_mask=False)), to_numpy(plain(x, x)))
    assert YosoAttention.from_config(causal.get_config()).get_config()["causal"] is True
    with pytest.raises(ValueError, match="causal=True is not implemented with use_expectation=True"):
        YosoAttention(2, 4, causal=True, use_expectation=True)
    with pytest.raises(ValueError, match="causal"):
        YosoAttention(2, 4, causal="yes")


def test_sampled_yoso_returns_the_expected_weights_as_scores_zero_on_future_keys_when_causal():
    """return_attention_scores=True without YOSO-E: the expected weights E of eq. 2 (what YOSO-E returns),
    as MultiHeadAttention code asks for them; causal: no weight on a key j > i."""
    x = np.random.default_rng(2).normal(size=(2, 5, 8)).astype(np.float32)
    sampled = YosoAttention(2, 4, **SMALL)
    expected = YosoAttention(2, 4, use_expectation=True, **SMALL)
    sampled(x, x)
    expected(x, x)
    _copy_projections(sampled, expected)
    _, scores = sampled(x, x, return_attention_scores=True)
    _, reference = expected(x, x, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(reference), rtol=1e-6, atol=1e-6)
    assert tuple(scores.shape) == (2, 2, 5, 5) and np.all(to_numpy(scores) >= 0)
    _, causal = sampled(x, x, use_causal_mask=True, return_attention_scores=True)
    future = np.triu(np.ones((5, 5), bool), k=1)
    assert np.all(to_numpy(causal)[..., future] == 0)
    np.testing.assert_allclose(to_numpy(causal)[..., ~future], to_numpy(reference)[..., ~future], rtol=1e-6)


def test_causal_mask_builds_symbolic_models():
    inputs = keras.Input((6, 8))
    outputs = YosoAttention(2, 4, **SMALL)(inputs, inputs, use_causal_mask=True)
    assert tuple(outputs.shape) == (None, 6, 8)


# ----------------------------------------------------------------------------
# Hash seeds.

def test_inference_is_deterministic_and_training_rehashes_every_step():
    rng = np.random.default_rng(8)
    x = _inputs(rng, 2, 32, 16)
    layer = YosoAttention(2, 8, num_hashes=2, hash_code_len=6, dropout=0.0)
    first, second = to_numpy(layer(x, x)), to_numpy(layer(x, x, training=False))
    np.testing.assert_array_equal(first, second)
    train_a, train_b = to_numpy(layer(x, x, training=True)), to_numpy(layer(x, x, training=True))
    assert np.abs(train_a - train_b).max() > 1e-3
    np.testing.assert_array_equal(to_numpy(layer(x, x)), first)
    assert isinstance(layer.get_config()["seed"], int)


def test_training_estimate_is_unbiased_towards_expectation():
    rng = np.random.default_rng(9)
    x = _inputs(rng, 1, 16, 8)
    sampled = YosoAttention(1, 8, num_hashes=1, hash_code_len=2, seed=4, use_bias=False)
    sampled.build(x.shape, x.shape)
    # Compare the raw (unnormalized) cumulation: the N-YOSO normalization is not linear.
    q = l2_normalize(sampled.query_dense(x)[:, :, 0])
    k = l2_normalize(sampled.key_dense(x)[:, :, 0])
    v = sampled.value_dense(x)[:, :, 0]
    estimates = []
    for _ in range(1000):  # "gaussian" hyperplanes collide with exactly the YOSO-E probability
        seed = sampled._training_seeds.next()
        qc = ops.hash_codes(q, 1, 2, seed, method="gaussian")
        kc = ops.hash_codes(k, 1, 2, seed, method="gaussian")
        estimates.append(to_numpy(ops.yoso_cumulation(q, k, v, qc, kc, 2)))
    expectation = to_numpy(ops.yoso_expectation(q, k, v, 2))
    standard_error = np.std(estimates, axis=0) / np.sqrt(len(estimates))
    assert np.all(np.abs(np.mean(estimates, axis=0) - expectation) <= 5 * standard_error + 1e-4)


# ----------------------------------------------------------------------------
# N-YOSO-E against a dense NumPy computation.

def _numpy_yoso_e(layer, query, value, query_mask, key_mask):
    weights = {name: to_numpy(w) for name, w in (
        ("wq", layer.query_dense.kernel), ("bq", layer.query_dense.bias),
        ("wk", layer.key_dense.kernel), ("bk", layer.key_dense.bias),
        ("wv", layer.value_dense.kernel), ("bv", layer.value_dense.bias),
        ("wo", layer.output_dense.kernel), ("bo", layer.output_dense.bias))}
    q = np.einsum("btd,dnh->bnth", query, weights["wq"]) + weights["bq"][None, :, None, :]
    k = np.einsum("bsd,dnh->bnsh", value, weights["wk"]) + weights["bk"][None, :, None, :]
    v = np.einsum("bsd,dnh->bnsh", value, weights["wv"]) + weights["bv"][None, :, None, :]
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    cosine = np.clip(np.einsum("bnth,bnsh->bnts", q, k), -1.0, 1.0)
    scores = (1.0 - np.arccos(cosine) / np.pi) ** layer.hash_code_len
    scores *= (query_mask[:, None, :, None] & key_mask[:, None, None, :])
    heads = np.einsum("bnts,bnsh->bnth", scores, v)
    norms = np.linalg.norm(heads, axis=-1, keepdims=True)
    heads = np.where(norms > 0, heads / np.maximum(norms, 1e-30), 0.0)
    output = np.einsum("bnth,nhe->bte", heads, weights["wo"]) + weights["bo"]
    return output, scores


def test_expectation_matches_dense_numpy_n_yoso_e():
    rng = np.random.default_rng(10)
    query, value = _inputs(rng, 2, 5, 6), _inputs(rng, 2, 4, 6)
    query_mask, key_mask = lengths_mask([5, 2], 5), lengths_mask([4, 3], 4)
    layer = YosoAttention(2, 3, hash_code_len=3, use_expectation=True, bias_initializer="random_normal")
    output, scores = layer(query, value, query_mask=query_mask, value_mask=key_mask,
                           return_attention_scores=True)
    expected_output, expected_scores = _numpy_yoso_e(layer, query, value, query_mask, key_mask)
    assert scores.shape == (2, 2, 5, 4)
    np.testing.assert_allclose(to_numpy(scores), expected_scores, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(to_numpy(output), expected_output, rtol=1e-4, atol=1e-5)


def _copy_projections(source, target):
    """The four projections' weights of `source` into `target` (their hash functions differ in shape or kind)."""
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        getattr(target, name).set_weights(getattr(source, name).get_weights())


def test_many_hashes_approach_the_expectation():
    # Over 12 weight initializations the mean error was 0.029-0.044 and its 95th percentile
    # 0.07-0.12; the maximum (0.12-0.32) is a tail statistic of the normalized heads, not asserted.
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(11)
    x = _inputs(rng, 1, 24, 8)
    sampled = YosoAttention(2, 8, num_hashes=512, hash_code_len=2, hash_method="gaussian", seed=1)
    expected = YosoAttention.from_config({**sampled.get_config(), "use_expectation": True})
    sampled_out = to_numpy(sampled(x, x))
    expected.build(x.shape, x.shape)
    _copy_projections(sampled, expected)
    error = np.abs(sampled_out - to_numpy(expected(x, x)))
    assert error.mean() < 0.06 and np.percentile(error, 95) < 0.2, (error.mean(), np.percentile(error, 95))
    few = YosoAttention.from_config({**sampled.get_config(), "num_hashes": 4})
    few.build(x.shape, x.shape)
    _copy_projections(sampled, few)
    assert np.abs(to_numpy(few(x, x)) - to_numpy(expected(x, x))).mean() > 2 * error.mean()


# ----------------------------------------------------------------------------
# YOSO-C.

def test_conv_window_changes_output_and_keeps_padding_out():
    rng = np.random.default_rng(12)
    x = _inputs(rng, 2, 9, 8)
    mask = lengths_mask([9, 5], 9)
    plain = YosoAttention(2, 4, seed=3, **SMALL)
    conv = YosoAttention(2, 4, seed=3, conv_window=5, **SMALL)
    conv.build(x.shape, x.shape)
    plain.build(x.shape, x.shape)
    plain.set_weights([w for w in conv.get_weights() if w.shape != (5, 2)])
    assert [tuple(w.shape) for w in conv.weights if "conv" in w.path] == [(5, 2)]
    assert np.abs(to_numpy(conv(x, x)) - to_numpy(plain(x, x))).max() > 1e-3
    # Padded values next to unpadded positions must not reach them through the convolution.
    noisy = np.where(mask[:, :, None], x, 50.0).astype(np.float32)
    np.testing.assert_allclose(to_numpy(conv(noisy, noisy, query_mask=mask, value_mask=mask))[mask],
                               to_numpy(conv(x, x, query_mask=mask, value_mask=mask))[mask], rtol=1e-5, atol=1e-5)


def test_conv_window_needs_equal_query_and_value_lengths():
    with pytest.raises(ValueError, match="conv_window"):
        YosoAttention(2, 4, conv_window=3)(np.zeros((1, 4, 8), np.float32), np.zeros((1, 6, 8), np.float32))


# ----------------------------------------------------------------------------
# Gradients.

def test_collision_backward_gives_finite_gradients_to_every_weight():
    x = _inputs(np.random.default_rng(13), 2, 10, 8)
    layer = YosoAttention(2, 4, conv_window=3, backward="collision", seed=6, **SMALL)
    layer(x, x)
    _, grads = trainable_gradients(layer, lambda: keras.ops.sum(layer(x, x, training=True) ** 2))
    assert all(g is not None and np.all(np.isfinite(g)) for g in grads.values())
    assert np.abs(grads[layer.query_dense.kernel.path]).max() > 0


# ----------------------------------------------------------------------------
# Argument errors.

@pytest.mark.parametrize("arguments, match", [
    (dict(num_heads=2, key_dim=4, hash_code_len=0), r"hash_code_len.*\[1, 20\].*hash_code_len=0"),
    (dict(num_heads=2, key_dim=4, hash_code_len=21), r"hash_code_len.*\[1, 20\].*hash_code_len=21"),
    (dict(num_heads=2, key_dim=4, num_hashes=0), "num_hashes.*num_hashes=0"),
    (dict(num_heads=2, key_dim=4, backward="exact"), "backward.*lower_bound.*collision.*'exact'"),
    (dict(num_heads=2, key_dim=4, hash_method="simhash"), "hash_method.*gaussian.*hadamard.*'simhash'"),
    (dict(num_heads=2, key_dim=4, implementation="cuda"), "implementation.*composite.*'cuda'"),
    (dict(num_heads=2, key_dim=4, conv_window=0), "conv_window.*positive integer.*conv_window=0"),
    (dict(num_heads=2, key_dim=4, conv_window=2.5), "conv_window"),
    (dict(num_heads=2, key_dim=4, use_expectation="yes"), "use_expectation.*bool"),
])
def test_invalid_constructor_arguments_raise(arguments, match):
    with pytest.raises(ValueError, match=match):
        YosoAttention(**arguments)


def test_key_and_value_of_different_lengths_raise_at_build():
    with pytest.raises(ValueError, match="`value` and `key`"):
        YosoAttention(2, 4).build((1, 5, 8), (1, 6, 8), (1, 7, 8))
    with pytest.raises(ValueError, match="`query` and `value` of the same rank"):
        YosoAttention(2, 4).build((1, 5, 2, 8), (1, 6, 8))
    with pytest.raises(ValueError, match=r"shape \(batch, length, features\)"):
        YosoAttention(2, 4).build((1, 8), (1, 8))


def test_default_hash_gives_the_paper_kernel_and_is_stored_in_the_config():
    layer = YosoAttention(2, 8)
    assert layer.get_config()["hash_method"] == "hadamard_interleaved"


def test_layers_saved_with_the_legacy_hash_reload_and_hash_with_it(tmp_path):
    """A .keras file written before the default changed stores hash_method="hadamard" in its config, so
    it reloads with the hash it was trained with; only new layers take the new default."""
    x = np.random.default_rng(0).normal(size=(2, 24, 16)).astype(np.float32)
    inputs = keras.Input((24, 16))
    legacy = keras.Model(inputs, YosoAttention(2, 8, hash_method="hadamard", seed=3)(inputs, inputs))
    path = str(tmp_path / "legacy.keras")
    legacy.save(path)
    reloaded = keras.saving.load_model(path)
    assert reloaded.layers[-1].get_config()["hash_method"] == "hadamard"
    np.testing.assert_allclose(to_numpy(reloaded(x)), to_numpy(legacy(x)), rtol=1e-5, atol=1e-6)
    config = legacy.layers[-1].get_config()
    config.pop("hash_method")
    default = YosoAttention.from_config(config)  # same weights' shapes and seed, the default hash
    default(x, x)
    default.set_weights(legacy.layers[-1].get_weights())
    assert not np.allclose(to_numpy(default(x, x)), to_numpy(legacy(x)), atol=1e-4)


@pytest.mark.parametrize("arguments", [
    dict(conv_window=3, backward="collision", hash_method="gaussian", implementation="composite"),
    dict(use_expectation=True, hash_method="hadamard"),
    dict(causal=True),
])
def test_every_yoso_setting_is_a_read_only_property_equal_to_its_config_entry(arguments):
    layer = YosoAttention(2, 4, **SMALL, **arguments)
    config = layer.get_config()
    for name in ("num_hashes", "hash_code_len", "use_expectation", "conv_window", "backward", "hash_method",
                 "implementation", "causal"):
        assert getattr(layer, name) == config[name], name
        with pytest.raises(AttributeError):
            setattr(layer, name, "changed")
