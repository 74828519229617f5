"""Loads the compiled TensorFlow op library once, when keras_yoso is imported on the TF backend.

Loading eagerly (not lazily) registers the ops with TensorFlow as soon as `keras_yoso` is
imported, so SavedModels that contain them load afterwards. If the library is missing or fails
to load (e.g. an ABI mismatch after a TensorFlow upgrade), one warning says why, how to rebuild,
and what the composite fallback costs, and every op runs on the composite instead.
"""

from keras_yoso import _native

_REBUILD_HINT = (
    "Rebuild it against the installed TensorFlow with "
    "`pip install --force-reinstall --no-deps --no-build-isolation .` from the keras-yoso source tree. "
    "Until then keras_yoso runs every op on its keras.ops composite: the same numbers, but slower and "
    "bigger on long sequences: one YosoAttention layer (4 heads x 64, m = 32, tau = 8) forward+backward "
    "at 4096 tokens on a 2-core CPU took 2.2 s and 1.3 GiB on the composite against 0.39 s and 0.9 GiB "
    "with the custom op (docs/benchmarks.md, 'Composite vs custom op')."
)


def _open(path):
    import tensorflow as tf

    return tf.load_op_library(path)


# tf raises NotFoundError and others for undefined symbols: any exception means "not loadable".
_LIBRARY = _native.LazyLibrary("custom ops", "_yoso_ops*.so", "compiled library", _open, (Exception,), _REBUILD_HINT,
                               stacklevel=4)
library = _LIBRARY.library  # the loaded op library module, or None when only the composite runs
load_error = _LIBRARY.load_error  # why the library is not loaded (None when it is)
