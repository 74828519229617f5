"""keras-yoso: linear-cost attention for long sequences in Keras 3 (TensorFlow, JAX, PyTorch).

On the TensorFlow backend, importing the package loads the compiled custom ops (so SavedModels
that use them load afterwards) and falls back to the `keras.ops` composite with a warning if they
cannot be loaded. On JAX and PyTorch the ops run the same native library's CPU kernels (XLA FFI,
torch.library) where it is built, else the composite; TensorFlow need not be installed.
`keras_yoso.distribution.SequenceParallel` splits long sequences over devices (JAX).
`keras_yoso.replace_attention` gives an existing model (Functional, Sequential, keras-hub) keras_yoso
attention with its trained weights; `keras_yoso.calibrate` fits its YOSO layers' tau and per-head
output scale to the softmax layers they replaced, with no training, and `keras_yoso.transfer_attention`
trains a small per-head map of their queries and keys to reproduce those layers.
"""

import keras

from keras_yoso import _portable_optimizers  # noqa: F401  (compiled models saved on PyTorch load on every backend)
from keras_yoso import distribution
from keras_yoso import layers
from keras_yoso import models
from keras_yoso import ops
from keras_yoso.calibration import calibrate
from keras_yoso.transfer import transfer_attention
from keras_yoso.conversion import replace_attention
from keras_yoso.layers import LinearRelativeAttention
from keras_yoso.layers import TransformerEncoderBlock
from keras_yoso.layers import YosoAttention
from keras_yoso._environment import show_config
from keras_yoso._version import __version__
from keras_yoso.models import check_token_ids


def export_portable(model, filepath, **kwargs):
    """`model.export(filepath, **kwargs)` with every keras_yoso op on its `keras.ops` composite
    (`keras_yoso.ops.composite_only`): the SavedModel holds no custom op, so it loads and serves in
    a process that never imports keras_yoso (TF Serving, a plain TensorFlow app). TensorFlow backend:
    elsewhere a ValueError says so (train on any backend, save a `.keras` file, export from
    TensorFlow)."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ValueError("keras_yoso.export_portable writes a TensorFlow SavedModel and needs the TensorFlow backend "
                         f"(KERAS_BACKEND=tensorflow); the backend is {backend}. Save the model with "
                         "model.save('model.keras'), load it under TensorFlow and export it there.")
    with ops.composite_only():
        return model.export(filepath, **kwargs)


__all__ = ["LinearRelativeAttention", "TransformerEncoderBlock", "YosoAttention", "calibrate", "check_token_ids",
           "distribution",
           "export_portable", "layers", "models", "ops",
           "replace_attention", "show_config", "transfer_attention"]
