"""Token id checks of the language models: `keras_yoso.models.check_token_ids`, also
`keras_yoso.check_token_ids`."""

import numpy as np
from keras import ops

from keras_yoso import _backend


def check_token_ids(token_ids, vocabulary_size, name="token_ids"):
    """Checks 0 <= token_ids < vocabulary_size (the rows of an `Embedding(vocabulary_size, ...)`)
    when the ids have values (eager tensors, NumPy arrays, lists): ValueError in Keras' wording
    naming `name`, the range and the smallest and largest id received, on every backend. One
    min/max reduction, read back once. `CausalLM` and the examples' embedding layer call it first
    thing in `call`; call it on your own data before a compiled `fit`.

    Where the ids have no value yet (a traced `jax.jit` or `tf.function`: `fit`, `predict`,
    `evaluate` on JAX and TensorFlow; symbolic Keras tensors) nothing is checked and nothing is
    added to the graph; what an embedding lookup then does with an id out of range is in
    docs/errors.md."""
    if isinstance(token_ids, (np.ndarray, list, tuple)):
        # Read on the host, before a conversion (JAX without x64 wraps int64 to int32).
        ids = np.asarray(token_ids)
        low, high = (ids.min(), ids.max()) if ids.size else (0, 0)
    elif not _backend.has_values(token_ids) or not _backend.can_check(token_ids):
        return
    elif 0 in _backend.static_shape(token_ids):
        return
    else:
        with _backend.eagerly():  # ids closed over by a traced function are read, not traced
            low, high = ops.convert_to_numpy(ops.stack([ops.min(token_ids), ops.max(token_ids)]))
    if low < 0 or high >= vocabulary_size:
        raise ValueError(f"Received an invalid value for argument `{name}`: expected token ids in "
                         f"[0, vocabulary_size) = [0, {vocabulary_size}). Received: {name} with "
                         f"min {low} and max {high}")
