"""keras_yoso.ops: the functional API of keras-yoso, on every Keras backend.

Every YOSO function takes `implementation="auto" | "custom_op" | "composite"`: the compiled
native kernels ("custom_op": TensorFlow's op library, loaded when keras_yoso is imported; the
native library's CPU kernels through XLA FFI on JAX and torch.library on PyTorch) or the
`keras.ops` composite (TensorFlow, JAX, torch). `implementation_in_use` says which one "auto"
picks; `supports_jit` whether it runs inside compiled functions.
"""

from keras_yoso.ops._dispatch import composite_only
from keras_yoso.ops._dispatch import custom_ops_available
from keras_yoso.ops._dispatch import native_provider as _native_provider
from keras_yoso.ops._dispatch import provider as _pick_provider
from keras_yoso.ops._dispatch import supports_jit
from keras_yoso.ops.hashing import hash_codes
from keras_yoso.ops.hashing import hash_parameters
from keras_yoso.ops.hashing import hash_parameters_shape
from keras_yoso.ops.linear_relative import linear_relative_attention
from keras_yoso.ops.linear_relative import linear_relative_attention_step
from keras_yoso.ops.linear_relative import linear_relative_decoding_state
from keras_yoso.ops.local import local_attention
from keras_yoso.ops.yoso import collision_cumulation
from keras_yoso.ops.yoso import lsh_cumulation
from keras_yoso.ops.yoso import lsh_cumulation_step
from keras_yoso.ops.yoso import weighted_lsh_cumulation
from keras_yoso.ops.yoso import yoso_cumulation
from keras_yoso.ops.yoso import yoso_decoding_state
from keras_yoso.ops.yoso import yoso_expectation
from keras_yoso.ops.yoso import yoso_expectation_weights


def implementation_in_use(implementation="auto"):
    """"custom_op" or "composite": what an op called now with `implementation` runs (on every
    backend)."""
    return _pick_provider(implementation).name


def custom_ops_load_error():
    """Why the native kernels are not available here (None when they are)."""
    return _native_provider()[1]


# Load the native kernels now: on TensorFlow so that SavedModels that use the ops load after
# `import keras_yoso`; on torch so that torch.compile traces calls without importing.
custom_ops_available()

__all__ = [
    "collision_cumulation",
    "composite_only",
    "custom_ops_available",
    "custom_ops_load_error",
    "hash_codes",
    "hash_parameters",
    "hash_parameters_shape",
    "implementation_in_use",
    "linear_relative_attention",
    "linear_relative_attention_step",
    "linear_relative_decoding_state",
    "local_attention",
    "lsh_cumulation",
    "lsh_cumulation_step",
    "supports_jit",
    "weighted_lsh_cumulation",
    "yoso_cumulation",
    "yoso_decoding_state",
    "yoso_expectation",
    "yoso_expectation_weights",
]
