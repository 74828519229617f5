"""keras_yoso.distribution.SequenceParallel on another Keras backend raises a ValueError saying that it
needs the JAX backend and naming the one running.

    KERAS_BACKEND=tensorflow python tests/programs/sequence_parallel_needs_jax.py
"""

import keras
import pytest

import keras_yoso

mesh = keras.distribution.DeviceMesh((1, 1), ["batch", "seq"], keras.distribution.list_devices()[:1])
with pytest.raises(ValueError, match="JAX backend.*KERAS_BACKEND=tensorflow"):
    keras_yoso.distribution.SequenceParallel(mesh)
print("ok")
