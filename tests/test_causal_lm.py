"""Causal blocks and CausalLM: block decoding with a cache equals the full causal forward for every
attention, generate() equals greedy decoding of the full forward inside its compiled loop, and
examples/causal_lm.py trains, generates and writes its metrics, on every backend."""

import json
import os
import sys

import keras
import numpy as np
import pytest

from conftest import to_numpy, traced
from keras_yoso.layers import CachedMultiHeadAttention
from keras_yoso.layers import TransformerEncoderBlock
from keras_yoso.models import CausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import causal_lm  # noqa: E402

ATTENTIONS = {
    "yoso": {"num_hashes": 4, "hash_code_len": 4, "conv_window": 3},
    "linear_relative": {"horizon": 3},
    "softmax": {},
}


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_causal_block_decoding_with_a_cache_equals_the_full_causal_forward(attention):
    block = TransformerEncoderBlock(2, 32, attention=attention, attention_kwargs={**ATTENTIONS[attention], "seed": 4},
                                    causal=True, normalize_first=True, dropout=0.0)
    x = np.random.default_rng(0).normal(size=(2, 11, 16)).astype(np.float32)
    full = to_numpy(block(x))
    cache = block.init_cache(2, max_length=11)
    outputs, start = [], 0
    for size in (5, 1, 1, 3, 1):
        out, cache = block(x[:, start:start + size], cache=cache, cache_update_index=start)
        outputs.append(to_numpy(out))
        start += size
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-4)


def test_causal_block_outputs_ignore_later_positions():
    block = TransformerEncoderBlock(2, 32, attention_kwargs={**ATTENTIONS["yoso"], "seed": 4}, causal=True,
                                    dropout=0.0)
    x = np.random.default_rng(0).normal(size=(1, 10, 16)).astype(np.float32)
    changed = x.copy()
    changed[:, 6:] = 3.0
    np.testing.assert_allclose(to_numpy(block(changed))[:, :6], to_numpy(block(x))[:, :6], atol=1e-5)


def test_cache_on_a_bidirectional_block_raises():
    block = TransformerEncoderBlock(2, 32, attention_kwargs={"seed": 1})
    block(np.zeros((1, 4, 16), np.float32))
    with pytest.raises(ValueError, match="causal=True"):
        block.init_cache(1)


def test_softmax_block_cache_needs_max_length():
    block = TransformerEncoderBlock(2, 32, attention="softmax", causal=True)
    block(np.zeros((1, 4, 16), np.float32))
    assert isinstance(block.attention_layer, CachedMultiHeadAttention)
    with pytest.raises(ValueError, match="max_length"):
        block.init_cache(1)


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_generate_equals_greedy_decoding_of_the_full_forward(attention):
    model = CausalLM(256, 32, hidden_dim=16, num_layers=2, num_heads=2, intermediate_dim=32, attention=attention,
                     attention_kwargs=ATTENTIONS[attention])
    prompt = np.random.default_rng(1).integers(0, 256, (2, 7)).astype(np.int32)
    generated = to_numpy(model.generate(prompt, 5))
    sequence = prompt
    for _ in range(5):
        following = to_numpy(model(sequence))[:, -1].argmax(-1).astype(np.int32)
        sequence = np.concatenate([sequence, following[:, None]], axis=1)
    np.testing.assert_array_equal(generated, sequence[:, 7:])


def test_generate_compiles_its_loop_once_and_reads_the_weights_of_each_call(monkeypatch):
    from keras_yoso import _backend

    compiled = []
    original = _backend.compile_reading_variables
    monkeypatch.setattr(_backend, "compile_reading_variables",
                        lambda fn, variables: compiled.append(fn) or original(fn, variables))
    model = CausalLM(64, 16, hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=16,
                     attention_kwargs=ATTENTIONS["yoso"])
    prompt = np.random.default_rng(2).integers(0, 64, (2, 4)).astype(np.int32)
    first = to_numpy(model.generate(prompt, 3))
    np.testing.assert_array_equal(to_numpy(model.generate(prompt + 1, 3)), to_numpy(model.generate(prompt + 1, 3)))
    assert len(compiled) == 1  # one compiled loop for one (max_new_tokens, sampler), reused
    # New weights after compiling (e.g. after more training): the next call decodes with them.
    bias = model.logits_dense.bias
    favourite = (int(first[0, 0]) + 1) % 64
    bias.assign(np.where(np.arange(64) == favourite, 1e4, 0.0).astype(np.float32))
    np.testing.assert_array_equal(to_numpy(model.generate(prompt, 3)), np.full((2, 3), favourite))
    assert len(compiled) == 1


def test_generate_random_sampler_is_reproducible_from_its_seed_and_argument_errors_are_clear():
    model = CausalLM(256, 16, hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=16,
                     attention_kwargs=ATTENTIONS["yoso"])
    prompt = np.ones((1, 4), np.int32)
    first = to_numpy(model.generate(prompt, 6, sampler="random", seed=3))
    np.testing.assert_array_equal(to_numpy(model.generate(prompt, 6, sampler="random", seed=3)), first)
    with pytest.raises(ValueError, match="exceeds max_length"):
        model.generate(prompt, 13)
    with pytest.raises(ValueError, match="sampler"):
        model.generate(prompt, 2, sampler="beam")


def test_causal_lm_example_trains_generates_and_writes_metrics(tmp_path):
    metrics = causal_lm.main(["--sequence-length", "512", "--steps", "2", "--train-sequences", "8",
                              "--test-sequences", "2", "--batch-size", "2", "--hidden-dim", "16", "--num-layers", "1",
                              "--num-hashes", "4", "--output-dir", str(tmp_path)])
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["answer_accuracy"] == metrics["answer_accuracy"]
    assert 0.0 <= written["answer_digit_accuracy"] <= 1.0
    assert np.isfinite(written["test_bits_per_byte"]) and written["test_bits_per_byte"] > 0
    assert all(len(e["generated"]) == 5 for e in written["examples"])
    assert (tmp_path / "history.png").stat().st_size > 0


def test_passkey_sequences_state_the_key_early_and_ask_for_it_at_least_2048_bytes_later():
    rng = np.random.default_rng(0)
    filler = causal_lm.FillerSource()
    for _ in range(20):
        sequence, key, answer_start = causal_lm.passkey_sequence(rng, 2560, filler)
        text = bytes(sequence.astype(np.uint8))
        assert len(text) == 2561
        stated = text.index(b"The pass key is " + key)
        assert stated < 256
        assert text[answer_start:answer_start + 5] == key
        assert text[:answer_start].endswith(b"The pass key is ")
        assert answer_start - stated >= 2048


def test_data_dir_filler_comes_from_the_text_files(tmp_path):
    (tmp_path / "a.txt").write_text("lorem ipsum dolor sit amet " * 300)
    filler = causal_lm.FillerSource(str(tmp_path))
    assert b"lorem ipsum" in filler.take(np.random.default_rng(0), 200)
    assert keras.backend.backend() in ("tensorflow", "jax", "torch")


def test_causal_lm_keras_file_round_trip_keeps_logits_and_generation(tmp_path):
    model = CausalLM(256, 16, hidden_dim=16, num_layers=2, num_heads=2, intermediate_dim=16,
                     attention_kwargs=ATTENTIONS["yoso"])
    tokens = np.arange(12, dtype=np.int32).reshape(2, 6)
    before = to_numpy(model(tokens))
    model.save(tmp_path / "lm.keras")
    loaded = keras.models.load_model(tmp_path / "lm.keras")
    np.testing.assert_allclose(to_numpy(loaded(tokens)), before, atol=1e-5)
    np.testing.assert_array_equal(to_numpy(loaded.generate(tokens, 3)), to_numpy(model.generate(tokens, 3)))


@pytest.mark.parametrize("bad_id, received", [(70, "min 1 and max 70"), (-3, "min -3 and max 1")])
def test_token_ids_out_of_the_vocabulary_raise_value_error_naming_the_range_in_call_and_generate(bad_id, received):
    """JAX's Embedding would give NaN logits, TensorFlow and PyTorch wrap negative ids around."""
    model = CausalLM(50, 16, hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=16,
                     attention_kwargs=ATTENTIONS["yoso"])
    tokens = np.ones((2, 6), np.int32)
    tokens[0, 2] = bad_id
    expected = r"argument `{}`: expected token ids in \[0, vocabulary_size\) = \[0, 50\)\. Received: {} with " + received
    with pytest.raises(ValueError, match=expected.format("token_ids", "token_ids")):
        model(tokens)
    with pytest.raises(ValueError, match=expected.format("token_ids", "token_ids")):
        model(keras.ops.convert_to_tensor(tokens))
    with pytest.raises(ValueError, match=expected.format("prompt", "prompt")):
        model.generate(tokens, 2)
    assert np.isfinite(to_numpy(model(np.clip(tokens, 0, 49)))).all()


def test_check_token_ids_is_defined_in_a_public_module_and_exported_by_the_package_and_models():
    import keras_yoso

    assert keras_yoso.check_token_ids is keras_yoso.models.check_token_ids
    module = keras_yoso.check_token_ids.__module__
    assert not any(part.startswith("_") for part in module.split(".")), module
    with pytest.raises(ValueError, match=r"argument `ids`: expected token ids in \[0, vocabulary_size\) = \[0, 5\)"):
        keras_yoso.check_token_ids(np.array([[0, 5]]), 5, "ids")


def test_check_token_ids_reads_an_eager_tensor_closed_over_by_a_compiled_function():
    import keras

    import keras_yoso

    ids = keras.ops.convert_to_tensor(np.array([[0, 5]], np.int32))
    compiled = traced(lambda: keras_yoso.check_token_ids(ids, 5, "ids"))
    with pytest.raises(ValueError, match=r"argument `ids`: expected token ids in \[0, vocabulary_size\) = \[0, 5\)\. "
                                         r"Received: ids with min 0 and max 5"):
        compiled()


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_causal_lm_init_cache_takes_max_length_as_the_attentions_and_the_block_do(attention):
    model = CausalLM(50, 16, hidden_dim=16, num_layers=2, num_heads=2, intermediate_dim=16, attention=attention,
                     attention_kwargs=ATTENTIONS[attention])
    tokens = np.random.default_rng(3).integers(0, 50, (2, 10)).astype(np.int32)
    logits, _ = model.call_with_cache(tokens, model.init_cache(2, max_length=10), 0)
    np.testing.assert_allclose(to_numpy(logits), to_numpy(model(tokens)), atol=1e-4)
    if attention == "softmax":  # the key/value caches are sized by max_length, the model's by default
        assert [tuple(cache["key"].shape) for cache in model.init_cache(2, 10)] == [(2, 10, 2, 8)] * 2
        assert [tuple(cache["key"].shape) for cache in model.init_cache(2)] == [(2, 16, 2, 8)] * 2
    with pytest.raises(ValueError, match=r"max_length must be None or an integer in \[1, 16\], got 17"):
        model.init_cache(2, 17)  # beyond the position table


def test_generate_refuses_a_prompt_that_is_not_of_an_integer_dtype_naming_the_dtype_expected_and_received():
    model = CausalLM(50, 16, hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=16,
                     attention_kwargs=ATTENTIONS["yoso"])
    for prompt, dtype in [(np.ones((2, 4), np.float32), "float32"), (keras.ops.ones((2, 4)), "float32"),
                          ([[1.0, 2.5]], "float64"), (np.ones((2, 4), bool), "bool")]:
        with pytest.raises(ValueError, match=r"argument `prompt`: expected token ids of an integer dtype \(e\.g\. "
                                             rf"int32\)\. Received: prompt of dtype {dtype}$"):
            model.generate(prompt, 2)
    assert tuple(model.generate(np.ones((2, 4), np.int64), 2).shape) == (2, 2)
