"""The smoke test of an installed keras-yoso wheel, on the backend of KERAS_BACKEND (.ci/wheel_check.sh
runs it in a fresh venv per backend, with no compiler on PATH): the native kernels load and run
what the composite computes, a YosoAttention layer trains one step, the environment report prints."""

import io

import keras
import numpy as np

import keras_yoso
from keras_yoso import ops

backend = keras.backend.backend()
assert ops.implementation_in_use() == "custom_op", f"{backend}: native kernels not loaded: {ops.custom_ops_load_error()}"
rng = np.random.default_rng(0)
codes = rng.integers(0, 16, (2, 4, 33)).astype(np.int32)
value = rng.standard_normal((2, 33, 8)).astype(np.float32)
native = keras.ops.convert_to_numpy(ops.lsh_cumulation(codes, codes, value, 16, implementation="custom_op"))
composite = keras.ops.convert_to_numpy(ops.lsh_cumulation(codes, codes, value, 16, implementation="composite"))
np.testing.assert_allclose(native, composite, rtol=1e-5, atol=1e-5)

model = keras.Sequential([keras.Input((64, 16)), keras_yoso.TransformerEncoderBlock(2, 32, attention="yoso"),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
loss = model.train_on_batch(rng.standard_normal((4, 64, 16)).astype(np.float32), np.array([0, 1, 0, 1]))
assert np.isfinite(loss), loss

report = io.StringIO()
keras_yoso.show_config(report)
assert "cpu: custom_op" in report.getvalue(), report.getvalue()
print(f"{backend}: keras_yoso {keras_yoso.__version__} from the wheel, native kernels ok, one training step ok")
