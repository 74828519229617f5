"""PEP 517 build backend of keras-yoso: setuptools, plus the build requirements of its libraries.

- jaxlib, pinned to the oldest release keras-yoso supports, for its header-only XLA FFI API: the
  native library's XLA FFI handlers are compiled against it. XLA loads handlers built against an
  older FFI API version than its own, never a newer one, so the oldest supported jaxlib's headers
  serve every newer jax. Nothing links to jaxlib: the library loads without it.
- TensorFlow, to compile the TensorFlow op library (`setup.py`'s build_ext reads its headers and
  flags from tf.sysconfig; the library must run on the minor release it was built against).

`KERAS_YOSO_BUILD_TF_OPS=0` leaves TensorFlow out (a faster JAX or PyTorch install: no
TensorFlow download, no op library); `KERAS_YOSO_BUILD_CUSTOM_OPS=0` builds the pure-Python
package, with neither requirement.
"""

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the hooks this module does not override)

# The one home of the TensorFlow requirement: the build's, and that of setup.py's extras (the op
# library must run on the minor release it was built against).
TENSORFLOW_REQUIREMENT = "tensorflow>=2.21,<2.22"
# The oldest jaxlib whose XLA FFI headers the handlers are built with, per Python version (the
# oldest with wheels for it); setup.py's `.[jax]` extra asks for at least the matching jax.
XLA_FFI_HEADERS_REQUIREMENTS = ['jaxlib==0.5.0; python_version < "3.14"',
                                'jaxlib==0.8.0; python_version >= "3.14"']
OLDEST_JAX = "jax>=0.5.0"


def _requirements():
    if os.environ.get("KERAS_YOSO_BUILD_CUSTOM_OPS", "1") == "0":
        return []
    tensorflow = [] if os.environ.get("KERAS_YOSO_BUILD_TF_OPS", "1") == "0" else [TENSORFLOW_REQUIREMENT]
    return XLA_FFI_HEADERS_REQUIREMENTS + tensorflow


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + _requirements()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + _requirements()
