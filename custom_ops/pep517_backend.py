"""PEP 517 build backend of keras-yoso: setuptools, plus TensorFlow as a build requirement.

TensorFlow is needed at build time only to compile the custom ops (`setup.py`'s build_ext reads
its headers and flags from tf.sysconfig). `KERAS_YOSO_BUILD_CUSTOM_OPS=0` builds the pure-Python
package instead, with no TensorFlow in the build environment: the install for JAX or PyTorch.
"""

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the hooks this module does not override)

# The one home of the TensorFlow requirement: the build's, and that of setup.py's extras (the op
# library must run on the minor release it was built against).
TENSORFLOW_REQUIREMENT = "tensorflow>=2.21,<2.22"


def _custom_ops():
    return [] if os.environ.get("KERAS_YOSO_BUILD_CUSTOM_OPS", "1") == "0" else [TENSORFLOW_REQUIREMENT]


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + _custom_ops()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + _custom_ops()
