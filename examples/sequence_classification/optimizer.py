"""The optimizer of the examples: Adam with dense gradients on every backend, and the learning rate
schedule of Table 4 (linear warmup, then linear decay to 0)."""

import keras


@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class DenseGradientAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` that takes every gradient as a dense tensor, so it does the same math
    on every backend.

    On TensorFlow, the gradient of an `Embedding` reaches the optimizer as `tf.IndexedSlices`
    holding one row per token occurrence. Keras' Adam updates its moments row by row from those
    slices, so the second moment of a token seen c times in a batch sums c squared gradients
    instead of squaring their sum: frequent tokens step up to sqrt(c) times further than Adam's
    learning rate allows (measured on the built-in task: about 5x). JAX and PyTorch hand Adam the
    dense sum. Densifying the slices first gives every backend the textbook Adam update.
    """

    def apply(self, grads, trainable_variables=None):
        return super().apply([_dense(g) for g in grads], trainable_variables)


def _dense(gradient):
    """A TensorFlow `IndexedSlices` as the dense tensor it sums to (repeated rows added); any other
    gradient unchanged."""
    if gradient is not None and hasattr(gradient, "indices") and hasattr(gradient, "dense_shape"):
        import tensorflow as tf

        return tf.convert_to_tensor(gradient)
    return gradient


@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class LinearWarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Rises linearly to `peak` over `warmup_steps`, then falls linearly to 0 at `total_steps` (Table 4)."""

    def __init__(self, peak, warmup_steps, total_steps):
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        warmup = keras.ops.minimum(1.0, (step + 1.0) / max(self.warmup_steps, 1))
        decay = keras.ops.clip((self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
        return self.peak * keras.ops.minimum(warmup, decay)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}

