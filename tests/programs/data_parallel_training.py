"""What the data-parallel programs share (data_parallel_mirrored.py on TensorFlow, data_parallel_ddp.py
on PyTorch): the tiny models, their data and training schedule, and the comparison of a data-parallel
run with the one-device run. A model: an embedding with padding (mask_zero=True, trailing zeros),
self-attention (YosoAttention of an implementation, or LinearRelativeAttention), masked average
pooling, a dense head. tests/test_data_parallel.py explains the tolerances.
"""

import numpy as np

LENGTH, GLOBAL_BATCH, STEPS, LEARNING_RATE, MOMENTUM = 16, 8, 3, 0.1, 0.9
ATOL, RTOL = 1e-5, 1e-4
KINDS = ("yoso", "linear_relative")


def case_of(name):
    """(kind, implementation) of a case named on the command line: "yoso/<implementation>" (YosoAttention
    of that implementation: custom_op or composite) or "linear_relative"."""
    kind, _, implementation = name.partition("/")
    assert kind in KINDS and bool(implementation) == (kind == "yoso"), (
        f"expected a case yoso/<implementation> or linear_relative, got {name!r}")
    return kind, implementation or None


def build_model(kind, implementation, probe=None):
    """probe: an optional pass-through layer before the pooling (the TensorFlow program counts rows with it)."""
    import keras
    from keras_yoso.layers import LinearRelativeAttention, YosoAttention

    keras.utils.set_random_seed(0)  # the same initial weights on every run (then copied to the other run)
    tokens = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(32, 16, mask_zero=True)(tokens)
    if kind == "yoso":
        attention = YosoAttention(2, 8, num_hashes=4, hash_code_len=4, seed=1, implementation=implementation)
    else:
        attention = LinearRelativeAttention(2, 8, horizon=3)
    x = attention(x, x)
    if probe is not None:
        x = probe(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(1)(x))


def batches():
    """STEPS distinct global batches; every other row ends in padding (token 0), of varied lengths."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 32, size=(STEPS, GLOBAL_BATCH, LENGTH)).astype("int32")
    for step in range(STEPS):
        for row in range(0, GLOBAL_BATCH, 2):
            tokens[step, row, 5 + (step + row) % 9:] = 0
    targets = rng.normal(size=(STEPS, GLOBAL_BATCH, 1)).astype("float32")
    return tokens, targets


def seed_states(model):
    """The SeedGenerator state of each YosoAttention layer: [seed, number of training calls]."""
    return [np.asarray(layer._training_seeds.state.value) for layer in model.layers
            if hasattr(layer, "_training_seeds")]


def assert_same_training(name, initial, expected, got, expected_losses, got_losses, trainable):
    """got: the weights after data-parallel training; expected: after the one-device run; trainable: whether
    each weight trains (YosoAttention's inference hash functions do not: they must stay as they were)."""
    assert np.all(np.isfinite(got_losses)), (name, got_losses)
    np.testing.assert_allclose(got_losses, expected_losses, atol=ATOL, rtol=RTOL, err_msg=f"{name} losses")
    assert len(initial) == len(expected) == len(got), name
    for index, (start, want, have) in enumerate(zip(initial, expected, got)):
        message = f"{name} weight {index} {start.shape}"
        update = want - start
        # Training moved every weight, but never the embedding of the padding token (masked out).
        if not trainable[index]:
            np.testing.assert_array_equal(want, start, err_msg=message)
            np.testing.assert_array_equal(have, start, err_msg=message)
            continue
        if index == 0:
            np.testing.assert_array_equal(have[0], start[0], err_msg=message)
            update, start, want, have = update[1:], start[1:], want[1:], have[1:]
        assert np.any(update != 0), message
        np.testing.assert_allclose(have, want, atol=ATOL, rtol=RTOL, err_msg=message)
        np.testing.assert_allclose(have - start, update, rtol=0, atol=1e-6 + 1e-3 * np.abs(update).max(),
                                   err_msg=f"{message} update")
