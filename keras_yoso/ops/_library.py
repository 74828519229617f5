"""Loads the compiled TensorFlow op library once, when keras_yoso is imported on the TF backend.

Loading eagerly (not lazily) registers the ops with TensorFlow as soon as `keras_yoso` is
imported, so SavedModels that contain them load afterwards. If the library is missing or fails
to load (e.g. an ABI mismatch after a TensorFlow upgrade), one warning says why, how to rebuild,
and what the composite fallback costs, and every op runs on the composite instead.
"""

import glob
import os
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REBUILD_HINT = (
    "Rebuild it against the installed TensorFlow with "
    "`pip install --force-reinstall --no-deps --no-build-isolation .` from the keras-yoso source tree. "
    "Until then keras_yoso runs every op on its keras.ops composite: the same numbers, but slower and "
    "bigger on long sequences: one YosoAttention layer (4 heads x 64, m = 32, tau = 8) forward+backward "
    "at 4096 tokens on a 2-core CPU took 2.2 s and 1.3 GiB on the composite against 0.39 s and 0.9 GiB "
    "with the custom op (docs/benchmarks.md, 'Composite vs custom op')."
)

_library = None
_load_error = None
_loaded = False


def _load():
    global _library, _load_error, _loaded
    _loaded = True
    candidates = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_yoso_ops*.so")))
    if os.environ.get("KERAS_YOSO_DISABLE_CUSTOM_OPS", "0") == "1":
        _load_error = "disabled by KERAS_YOSO_DISABLE_CUSTOM_OPS=1"
    elif not candidates:
        _load_error = f"no compiled library (_yoso_ops*.so) in {_PACKAGE_DIR}"
    else:
        import tensorflow as tf

        try:
            _library = tf.load_op_library(candidates[0])
        except Exception as err:  # tf raises NotFoundError / others for undefined symbols
            _load_error = f"loading {candidates[0]} failed: {err}"
    if _library is None:
        warnings.warn(f"keras_yoso custom ops are not available ({_load_error}). {_REBUILD_HINT}",
                      RuntimeWarning, stacklevel=4)


def library():
    """The loaded op library module, or None when only the composite path is available."""
    if not _loaded:
        _load()
    return _library


def load_error():
    """Why the library is not loaded (None when it is)."""
    if not _loaded:
        _load()
    return _load_error
