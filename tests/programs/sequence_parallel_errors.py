"""keras_yoso.distribution.SequenceParallel on a 2x4 mesh of 8 virtual CPU devices: its layouts, the
errors naming the numbers (a length the sequence axis does not divide, a horizon over a device's
block, bad axis names), the layers outside it, and a layout_map that shards what it names.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \
        python tests/programs/sequence_parallel_errors.py
"""

import keras
import numpy as np
import pytest

import keras_yoso
from keras_yoso.layers import LinearRelativeAttention, YosoAttention
from mesh_comparison import mesh_of

mesh = mesh_of("2x4")
dist = keras_yoso.distribution.SequenceParallel(mesh)
assert dist.sequence_dim_name == "seq" and dist.batch_dim_name == "batch"
assert dist.get_data_layout((8, 64)).axes == ("batch", "seq")
assert dist.get_data_layout((8, 2)).axes == ("batch", None)        # [B, classes] labels stay whole
assert dist.get_data_layout((8,)).axes == ("batch",)
assert isinstance(dist, keras.distribution.ModelParallel)
layer = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, seed=1)
x = np.zeros((2, 66, 16), "float32")
with dist.scope():
    with pytest.raises(ValueError, match=r"66.*4|4.*66"):
        layer(x, x)
    linear = LinearRelativeAttention(2, 8, horizon=5)
    with pytest.raises(ValueError, match="horizon=5"):
        linear(np.zeros((2, 16, 16), "float32"), np.zeros((2, 16, 16), "float32"))   # 4 per device < 5
with pytest.raises(ValueError, match="sequence_dim_name='sequence'"):
    keras_yoso.distribution.SequenceParallel(mesh, sequence_dim_name="sequence")
with pytest.raises(ValueError, match="two different"):
    keras_yoso.distribution.SequenceParallel(mesh, batch_dim_name="seq")
# Outside the distribution the same layer runs as always (any length).
assert layer(x, x).shape == (2, 66, 16)

# layout_map: a variable it names is sharded as it says, the others stay replicated.
layout_map = keras.distribution.LayoutMap(mesh)
layout_map[".*ffn.*kernel"] = (None, "seq")
with keras_yoso.distribution.SequenceParallel(mesh, layout_map=layout_map).scope():
    tokens = keras.Input((32,), dtype="int32")
    h = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, seed=3)(*[keras.layers.Embedding(32, 16)(tokens)] * 2)
    h = keras.layers.Dense(32, name="ffn")(h)
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile(optimizer="sgd", loss="mse")
    loss = model.fit(np.ones((8, 32), "int32"), np.zeros((8, 1)), batch_size=8, verbose=0).history["loss"]
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
assert np.isfinite(loss).all(), loss
assert specs["ffn/kernel"] == (None, "seq"), specs
assert all(not any(spec) for path, spec in specs.items() if path != "ffn/kernel"), specs
print("ok")
