"""Under keras.distribution.DataParallel on 8 virtual CPU devices the keras_yoso native calls are not
gathered: each device runs them on its batch block (B / 8 rows), and training equals one device.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \
        python tests/programs/keras_data_parallel_native_calls.py
"""

import jax
import jax.numpy as jnp
import keras
import numpy as np

from keras_yoso.layers import LinearRelativeAttention, YosoAttention
from mesh_comparison import TOL, max_diff, native_shapes

B, N = 16, 32


def build():
    keras.utils.set_random_seed(0)
    tokens = keras.Input((N,), dtype="int32")
    x = keras.layers.Embedding(32, 16)(tokens)
    x = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, seed=3, implementation="custom_op")(x, x)
    x = LinearRelativeAttention(2, 8, horizon=3)(x, x)
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(x)))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


rng = np.random.default_rng(0)
tokens = rng.integers(1, 32, size=(B, N)).astype("int32")
targets = rng.normal(size=(B, 1)).astype("float32")
reference = build()
want = reference.fit(tokens, targets, batch_size=B, epochs=3, shuffle=False, verbose=0).history["loss"]
dist = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
with dist.scope():
    model = build()
    got = model.fit(tokens, targets, batch_size=B, epochs=3, shuffle=False, verbose=0).history["loss"]
    state = [v.value for v in model.trainable_variables]
    fn = jax.jit(lambda s, x: model.stateless_call(s, [v.value for v in model.non_trainable_variables], x)[0])
    text = fn.lower(state, jnp.asarray(tokens)).compile().as_text()
assert max_diff([want], [got]) <= TOL, (want, got)
assert max_diff(reference.get_weights(), model.get_weights()) <= TOL
shapes = native_shapes(text)
rows = {s[0] for s in shapes if len(s) == 3}
assert rows == {B * 2 // 8}, (rows, shapes)  # batch x heads rows per device: 32 / 8
print("ok")
