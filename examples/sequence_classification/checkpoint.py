"""--checkpoint-dir: the training state saved at every evaluation, and loaded by a rerun of the same
command (refused when the run was trained with other options or data)."""

import hashlib
import json
import os
import sys

import keras
import numpy as np


# The training options a checkpoint must agree with to be continued.
RESUME_KEYS = ("attention", "num_hashes", "hash_code_len", "conv_window", "backward", "num_layers", "hidden_dim",
               "embedding_scale", "ffn_dim", "num_heads", "dropout", "max_length", "steps", "batch_size", "learning_rate",
               "warmup_steps", "validation_fraction", "seed", "eval_every", "mesh")


def run_fingerprint(args, task, digest):
    """What a checkpoint must agree with to be continued: the task, the data's digest, the RESUME_KEYS options."""
    return {"task": task, "data": digest, **{key: getattr(args, key, None) for key in RESUME_KEYS}}


def data_digest(*splits):
    """16 hex digits of SHA-256 over each split's size, labels and first 64 texts."""
    digest = hashlib.sha256()
    for split in splits:
        digest.update(str(len(split)).encode())
        digest.update(split.labels.tobytes())
        for text in split.texts[:64]:
            digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:16]


class Checkpoint:
    """The training state in --checkpoint-dir: model.keras (weights, optimizer), rng_states.npz (the
    SeedGenerator states) and state.json (steps done, history, timings, and the options it was
    trained with)."""

    def __init__(self, directory, fingerprint):
        self.directory, self.fingerprint = directory, fingerprint

    @property
    def _state_path(self):
        return os.path.join(self.directory, "state.json")

    def load(self):
        """(model, state) of a saved run, or (None, None); SystemExit when it was trained otherwise."""
        if self.directory is None or not os.path.exists(self._state_path):
            return None, None
        with open(self._state_path, encoding="utf-8") as f:
            state = json.load(f)
        differences = [f"{key}: checkpoint {state['fingerprint'].get(key)!r}, now {value!r}"
                       for key, value in self.fingerprint.items() if state["fingerprint"].get(key) != value]
        if differences:
            sys.exit(f"error: --checkpoint-dir {self.directory} holds a run trained with other options "
                     f"({'; '.join(differences)}). Use another --checkpoint-dir, or the same options.")
        model = keras.saving.load_model(os.path.join(self.directory, "model.keras"))
        variables = self._rng_variables(model)
        with np.load(os.path.join(self.directory, "rng_states.npz")) as saved:
            states = [saved[f"state_{i}"] for i in range(len(saved.files))]
        if [s.shape for s in states] != [tuple(v.shape) for v in variables]:
            sys.exit(f"error: {self.directory}/rng_states.npz does not match the model's {len(variables)} "
                     "SeedGenerator states")
        for variable, value in zip(variables, states):  # in model order (their paths are global counters)
            variable.assign(value)
        return model, state

    @staticmethod
    def _rng_variables(model):
        """The states of the model's SeedGenerators (dropout masks, YOSO's training hash functions):
        `.keras` files do not restore them, so they are saved next to it."""
        return [variable for variable in model.variables if "seed_generator" in variable.path]

    def save(self, model, state):
        if self.directory is None:
            return
        os.makedirs(self.directory, exist_ok=True)
        model.save(os.path.join(self.directory, "model.keras.tmp.keras"))
        os.replace(os.path.join(self.directory, "model.keras.tmp.keras"), os.path.join(self.directory, "model.keras"))
        rng = {f"state_{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(self._rng_variables(model))}
        np.savez(os.path.join(self.directory, "rng_states.tmp.npz"), **rng)
        os.replace(os.path.join(self.directory, "rng_states.tmp.npz"), os.path.join(self.directory, "rng_states.npz"))
        with open(self._state_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({**state, "fingerprint": self.fingerprint}, f, indent=1)
        os.replace(self._state_path + ".tmp", self._state_path)
