"""A batch that the 'batch' axis of a 4x2 mesh (8 virtual CPU devices) does not divide raises a
ValueError naming the batch and the axis, from get_data_layout and from predict and fit (not JAX's
raw IndivisibleError); a batch that divides runs.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \
        python tests/programs/sequence_parallel_batch_errors.py
"""

import keras
import numpy as np
import pytest

import keras_yoso
from keras_yoso.layers import YosoAttention
from mesh_comparison import mesh_of

dist = keras_yoso.distribution.SequenceParallel(mesh_of("4x2"))
message = r"batch of 6 rows .*over the 'batch' axis of the device mesh \(4 devices\).*multiple of 4, received 6"
with pytest.raises(ValueError, match=message):
    dist.get_data_layout((6, 16, 8))
with pytest.raises(ValueError, match=message.replace("6 rows", "6 rows \\(an input of shape \\(6,\\)\\)")):
    dist.get_data_layout((6,))                                    # labels too
assert dist.get_data_layout((None, 16)).axes == ("batch", "seq")  # unknown batch: laid out as always
with dist.scope():
    tokens = keras.Input((16,), dtype="int32")
    h = keras.layers.Embedding(32, 8)(tokens)
    h = YosoAttention(2, 4, num_hashes=2, hash_code_len=3, seed=1)(h, h)
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((12, 16), "int32"), np.zeros((12, 1), "float32")
    assert model.predict(x, batch_size=4, verbose=0).shape == (12, 1)
    with pytest.raises(ValueError, match=message):
        model.predict(x, batch_size=6, verbose=0)
    with pytest.raises(ValueError, match=message):
        model.fit(x, y, batch_size=6, verbose=0)                  # not JAX's raw IndivisibleError
print("ok")
