"""The package's top-level names: the version in one place, the environment report, and the
portable export's backend contract."""

import re

import keras
import pytest

import keras_yoso
from keras_yoso import _version


def test_the_version_is_defined_once_and_setup_reads_it():
    assert keras_yoso.__version__ == _version.__version__
    with open(__file__.rsplit("/tests/", 1)[0] + "/setup.py", encoding="utf-8") as setup:
        text = setup.read()
    assert "version=_version()" in text and not re.search(r'version="\d', text)


def test_show_config_is_public():
    assert "show_config" in keras_yoso.__all__ and callable(keras_yoso.show_config)


@pytest.mark.skipif(keras.backend.backend() == "tensorflow", reason="exports on TensorFlow (test_tf_layer_graphs_and_export)")
def test_export_portable_off_tensorflow_says_it_needs_the_tensorflow_backend(tmp_path):
    model = keras.Sequential([keras.Input((8, 4)), keras_yoso.TransformerEncoderBlock(2, 4, attention="yoso")])
    with pytest.raises(ValueError, match=f"needs the TensorFlow backend .*the backend is {keras.backend.backend()}"):
        keras_yoso.export_portable(model, str(tmp_path / "exported"))
