"""Loss and accuracy of the classifier on a split's batches, on one device or a --mesh."""

import keras
import numpy as np


def evaluate(classifier, batches):
    """(loss, accuracy) of `classifier` on `batches`: `model.evaluate`; with padding rows (evaluation
    on a --mesh whose data axis is > 1), from `model.predict` on the examples' rows only, with the
    loss of keras.losses.sparse_categorical_crossentropy (probabilities clipped to [1e-7, 1 - 1e-7])."""
    callbacks = [_OneStepInFlight()] if keras.distribution.distribution() is not None else []
    if batches.row_multiple == 1:
        loss, accuracy = classifier.evaluate(batches.keras_input(), verbose=0, callbacks=callbacks)
        return float(loss), float(accuracy)
    probabilities = classifier.predict(batches.keras_input(), verbose=0, callbacks=callbacks)
    rows, labels, offset = [], [], 0
    for item in range(len(batches)):
        batch_labels, real = batches[item][1], batches.real_rows(item)
        rows.append(offset + np.arange(real))
        labels.append(batch_labels[:real])
        offset += len(batch_labels)
    rows, labels = np.concatenate(rows), np.concatenate(labels)
    probabilities = probabilities[rows].astype(np.float32)
    probabilities = np.clip(probabilities / probabilities.sum(axis=-1, keepdims=True), 1e-7, 1.0 - 1e-7)
    loss = -np.log(probabilities[np.arange(len(labels)), labels]).astype(np.float64).mean()
    accuracy = (probabilities.argmax(axis=-1) == labels).mean()
    return float(loss), float(accuracy)


class _OneStepInFlight(keras.callbacks.Callback):
    """Waits for each evaluation or prediction step before Keras dispatches the next (training
    steps are waited for already: the progress callbacks read their loss). On a device mesh of
    virtual CPU devices, XLA:CPU's collectives deadlock when several steps of a model this size are
    in flight (observed with JAX 0.10.2, 8 devices on 2 cores: "Termination timeout for all
    reduce ... only 3 of them arrived", the process aborts)."""

    def on_test_batch_end(self, batch, logs=None):
        _wait(logs)

    def on_predict_batch_end(self, batch, logs=None):
        _wait(logs)


def _wait(logs):
    import jax

    jax.block_until_ready(logs)
