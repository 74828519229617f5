"""Classify texts with a SavedModel exported by long_text_classifier.py or listops.py.

Loads the export in this fresh process (TensorFlow and tensorflow-text; keras_yoso only for an
export made with --export custom_op, whose graph holds the YOSO custom ops: it is then imported
to register them) and prints, for each text, the most probable label and its probability:

    python examples/predict.py runs/imdb-bytes-yoso-tensorflow/saved_model "A wonderful film." "Dull and long."
    python examples/predict.py --json runs/listops-yoso-tensorflow/saved_model "[MAX 2 9 [MIN 4 7 ] 0 ]"

With --json, one JSON object per text: label, probability and all class probabilities.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402,F401  (registers the tokenizer ops the export uses)


def load(saved_model_dir):
    """The SavedModel; a custom-op export (ops named Yoso*) gets keras_yoso imported first."""
    try:
        return tf.saved_model.load(saved_model_dir)
    except tf.errors.NotFoundError as error:
        if "Op type not registered 'Yoso" not in str(error):
            raise
        import keras_yoso  # noqa: F401  (registers the YOSO custom ops of a --export custom_op model)

        return tf.saved_model.load(saved_model_dir)


def read_labels(saved_model_dir, num_classes):
    """Class names written next to the graph (assets.extra/labels.txt), else the class indices."""
    path = os.path.join(saved_model_dir, "assets.extra", "labels.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            names = f.read().splitlines()
        if len(names) == num_classes:
            return names
    return [str(i) for i in range(num_classes)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("saved_model", help="the saved_model/ folder of a training run")
    parser.add_argument("texts", nargs="+", help="texts to classify")
    parser.add_argument("--json", action="store_true", help="print JSON lines with all probabilities")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.saved_model, "saved_model.pb")):
        parser.error(f"{args.saved_model} is not a SavedModel folder (no saved_model.pb)")

    model = load(args.saved_model)
    probabilities = model.serve(tf.constant(args.texts, tf.string)).numpy()
    labels = read_labels(args.saved_model, probabilities.shape[1])
    for text, row in zip(args.texts, probabilities):
        best = int(row.argmax())
        if args.json:
            print(json.dumps({"text": text, "label": labels[best], "probability": float(row[best]),
                              "probabilities": [float(p) for p in row]}))
        else:
            shown = text if len(text) <= 60 else text[:57] + "..."
            print(f"{labels[best]}\t{row[best]:.4f}\t{shown}")


if __name__ == "__main__":
    main()
