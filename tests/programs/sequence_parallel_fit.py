"""model.predict, two epochs of model.fit (fresh hash functions per step) and model.evaluate under
keras_yoso.distribution.SequenceParallel on 8 virtual CPU devices give the one-device numbers within
mesh_comparison.TOL, padding included.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \
        python tests/programs/sequence_parallel_fit.py MESH KIND [KIND ...]

MESH is "DxS"; each KIND (a model of KINDS) runs and reports on its own (program_cases.run_cases).
"""

import contextlib
import sys

import keras
import numpy as np

import keras_yoso
from keras_yoso.layers import LinearRelativeAttention, YosoAttention
from mesh_comparison import TOL, max_diff, mesh_of
from program_cases import run_cases

N = 64
KINDS = ("yoso", "yoso_causal", "linear_relative")


def build(kind):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((N,), dtype="int32")
    x = keras.layers.Embedding(32, 16, mask_zero=True)(tokens)
    if kind == "yoso":
        x = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, conv_window=3, seed=3)(x, x)
    elif kind == "yoso_causal":
        x = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, seed=3)(x, x, use_causal_mask=True)
    else:
        x = LinearRelativeAttention(2, 8, horizon=3)(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(tokens, keras.layers.Dense(1)(x))
    model.compile(optimizer=keras.optimizers.SGD(0.02), loss="mse")  # a stable step: losses stay O(1)
    return model


def check(kind, dist):
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 32, size=(16, N)).astype("int32")
    tokens[::2, N - 10:] = 0       # padding at the end of the last shard
    targets = rng.normal(size=(16, 1)).astype("float32")
    results = []
    for distribution in (None, dist):
        with contextlib.nullcontext() if distribution is None else distribution.scope():
            model = build(kind)
            before = model.predict(tokens, batch_size=8, verbose=0)   # batches divide over the 8x1 mesh too
            loss = model.fit(tokens, targets, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
            evaluated = model.evaluate(tokens, targets, batch_size=8, verbose=0)
            results.append((before, np.array(loss), model.get_weights(), evaluated))
    (p1, l1, w1, e1), (p2, l2, w2, e2) = results
    assert max_diff([p1], [p2]) <= TOL, ("predict", max_diff([p1], [p2]))
    assert max_diff([l1], [l2]) <= TOL, ("loss", l1, l2)
    assert max_diff(w1, w2) <= TOL, ("weights", max_diff(w1, w2))
    assert abs(e1 - e2) <= TOL, ("evaluate", e1, e2)
    print(" ", kind, "losses", l1, l2)


if __name__ == "__main__":
    run_cases({kind: lambda dist, kind=kind: check(kind, dist) for kind in KINDS}, sys.argv[2:],
              keras_yoso.distribution.SequenceParallel(mesh_of(sys.argv[1])))
