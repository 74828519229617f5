"""What a training run reports about itself: the mean loss and accuracy of each interval, a progress
line every few steps, CPU time and peak memory, and history.png."""

import resource
import sys
import time

import keras


def progress_every(args):
    """Steps between progress lines: about 5 lines per evaluation interval, at least every 10 steps."""
    return max(1, min(10, args.eval_every // 5))


class IntervalMetrics(keras.callbacks.Callback):
    """Mean training loss and accuracy over one `fit` call, from the per-batch values (Keras logs
    running means; each batch's value is recovered from two consecutive means)."""

    def __init__(self):
        super().__init__()
        self.sums, self.count, self._previous = {}, 0, {}

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1
        for name in ("loss", "accuracy"):
            mean = float(logs[name])
            value = mean * self.count - self._previous.get(name, 0.0) * (self.count - 1)
            self.sums[name] = self.sums.get(name, 0.0) + value
            self._previous[name] = mean

    def means(self):
        return {name: total / max(self.count, 1) for name, total in self.sums.items()}


class ProgressLines(keras.callbacks.Callback):
    """One line per `every` training steps when stdout is not a terminal (Keras' progress bar needs
    one, and its verbose=2 prints only at the end of a `fit`): global step, seconds per step, and the
    running loss and accuracy of this interval; and a line after the first step of each `fit`, which
    compiles the training function (tens of seconds on 2 cores, silent otherwise)."""

    def __init__(self, first_step, total_steps, every):
        super().__init__()
        self.step, self.total_steps, self.every = first_step, total_steps, every
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if batch == 0:  # the first step of a fit compiles the training function: say so before `every` steps
            print(f"  step {self.step}/{self.total_steps}: first step of this interval took "
                  f"{time.perf_counter() - self._start:.1f} s (it includes compiling the training step)", flush=True)
        elif self.step % self.every == 0:
            seconds = (time.perf_counter() - self._start) / (batch + 1)
            print(f"  step {self.step}/{self.total_steps}: {seconds:.2f} s/step, loss {float(logs['loss']):.4f}, "
                  f"accuracy {float(logs['accuracy']):.4f}", flush=True)


def process_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib():
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def plot_history(history, path, title):
    """Loss and accuracy vs training step: training means per evaluation interval and validation values.
    Returns the path, or None after a warning when matplotlib is missing or the plot cannot be written
    (a finished training run is never lost to its plot)."""
    try:
        _plot_history(history, path, title)
    except Exception as error:  # noqa: BLE001 -- any plotting failure: the metrics and model are already saved
        print(f"warning: no {path}: {type(error).__name__}: {error} (pip install matplotlib for the plot; "
              "metrics.json holds the same history)", file=sys.stderr, flush=True)
        return None
    return path


def _plot_history(history, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for axis, metric in zip(axes, ("loss", "accuracy")):
        axis.plot(history["step"], history[f"train_{metric}"], "o-", label="train (mean since the last evaluation)")
        axis.plot(history["step"], history[f"val_{metric}"], "s-", label="validation")
        axis.set_xlabel("training step")
        axis.set_ylabel(metric)
        axis.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=2, frameon=False)  # below the plots, not on a curve
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)
