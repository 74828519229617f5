"""A pytest plugin that makes the native library fail to load while the custom ops stay expected:
what a broken build looks like to the suite. `-p failed_native_library` with tests/programs on
PYTHONPATH; pytest imports it before tests/conftest.py, which then reads the custom ops as expected
(KERAS_YOSO_DISABLE_CUSTOM_OPS unset). Used by the tests that prove the native provider modules
fail, instead of skipping, on such a build."""

import os

os.environ["KERAS_YOSO_DISABLE_CUSTOM_OPS"] = "1"
from keras_yoso.ops.providers import native_library  # noqa: E402  (importing keras_yoso loads the library)

assert native_library.load_error() is not None  # the load failed, and the result is kept for the process
del os.environ["KERAS_YOSO_DISABLE_CUSTOM_OPS"]
