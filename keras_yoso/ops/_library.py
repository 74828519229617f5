"""Loads the compiled op library once, at import time.

Loading eagerly (not lazily) registers the ops with TensorFlow as soon as
`keras_yoso` is imported, so SavedModels that contain them load afterwards.
If the library is missing or fails to load (e.g. an ABI mismatch after a
TensorFlow upgrade), a single warning says why and how to rebuild, and every
op runs on its pure-TensorFlow composite instead.
"""

import glob
import os
import warnings

import tensorflow as tf

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REBUILD_HINT = (
    "Rebuild it against the installed TensorFlow with "
    "`pip install --force-reinstall --no-deps --no-build-isolation .` from the keras-yoso source tree. "
    "Until then keras_yoso runs every op on its pure-TensorFlow composite (same numbers, slower)."
)

_library = None
_load_error = None


def _load():
    global _library, _load_error
    candidates = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_yoso_ops*.so")))
    if os.environ.get("KERAS_YOSO_DISABLE_CUSTOM_OPS", "0") == "1":
        _load_error = "disabled by KERAS_YOSO_DISABLE_CUSTOM_OPS=1"
    elif not candidates:
        _load_error = f"no compiled library (_yoso_ops*.so) in {_PACKAGE_DIR}"
    else:
        try:
            _library = tf.load_op_library(candidates[0])
        except Exception as err:  # tf raises NotFoundError / others for undefined symbols
            _load_error = f"loading {candidates[0]} failed: {err}"
    if _library is None:
        warnings.warn(f"keras_yoso custom ops are not available ({_load_error}). {_REBUILD_HINT}",
                      RuntimeWarning, stacklevel=3)


def library():
    """The loaded op library module, or None when only the composite path is available."""
    return _library


def load_error():
    """Why the library is not loaded (None when it is)."""
    return _load_error


def custom_ops_available():
    """True when the compiled custom ops are loaded."""
    return _library is not None


_load()
