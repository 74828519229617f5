"""The version of keras-yoso, in one place: setup.py reads it, `keras_yoso.__version__` is it."""

__version__ = "0.3.0"
