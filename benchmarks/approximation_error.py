"""How far YOSO-m is from YOSO-E: output angles (paper §4.4, Figure 8), attention matrices
(Figure 6) and the bias and variance of the two gradient estimators.

1. Output angle. N-YOSO-m and N-YOSO-E outputs (each row L2-normalized, as in
   `keras_yoso.YosoAttention`) are compared by their angle in degrees, averaged over
   queries, heads and `--trials` independent draws of the hash functions, for
   m = 8 ... 128 hashes and sequence lengths n = 64 ... 4096, in two settings:
   "trained" - per-head L2-normalized queries and keys and the values of one layer of
   a small YOSO-E encoder trained by this script (see below); "random" - random unit
   queries and keys, N(0, 1) values. A query that collides with no key in any hash gets
   the zero vector from N-YOSO-m (as in the layer); its angle is counted as 90 degrees
   (the angle its zero dot product gives) and the fraction of such queries is reported.
   Also reported per n, since they decide how the error moves with n: the share of a
   query's YOSO-E weight mass held by its 8 largest weights, and ||mean_j V_j|| / mean_j ||V_j||.
   When the weights are diffuse and the values share a direction, E V is a sum over many
   keys whose sampling noise averages out, and the angle can shrink as n grows.
2. Attention matrices of the first 64 tokens (one head of the trained model): softmax
   of the raw projections, softmax(Q K^T / sqrt(key_dim)) (what MultiHeadAttention
   would compute from the same projections), the YOSO-E weights
   `ops.yoso_expectation_weights`, and the YOSO-m collision frequency
   (1/m) sum_h [code_h(q_i) == code_h(k_j)] from `ops.hash_codes`.
3. Gradient estimators. For fixed Q, K, V and a fixed random output gradient G, `--grad-draws`
   draws of the hash functions give dQ and dK of sum(yoso_cumulation(...) * G) with
   backward="lower_bound" (eq. 4) and backward="collision" (*YOSO). Each is compared with
   the YOSO-E quantity it estimates: the collision estimator with the exact gradient
   (`yoso_expectation(backward="exact")`), the lower-bound estimator with the bound
   (`yoso_expectation(backward="lower_bound")`, appendix eq. 3) - a different quantity,
   whose distance to the exact gradient is reported too. Relative to ||target||^2:
   bias^2 = ||mean_r est_r - target||^2, variance = mean_r ||est_r - mean_r est_r||^2, and
   the Monte-Carlo floor variance / R that the measured bias^2 carries. Gaussian hashing
   (exact collision probabilities) makes the expectations computable: the lower bound is
   unbiased for its target, and the collision estimator's mean is
   sum_j (1 - (1 - E_ij)^m) w_ij K_j (pairs that never collide are dropped), whose bias is
   reported as "analytic". "MSE exact" is mean_r ||est_r - exact||^2 / ||exact||^2 for both
   estimators: the error against the gradient of YOSO-E that training would want.

The trained model: an embedding, sinusoidal positions and `--layers`
`keras_yoso.TransformerEncoderBlock`s with YOSO-E attention (exact gradient), trained as a
masked language model (15% of the tokens masked) on sequences of `--train-length` tokens:
by default a synthetic Markov chain (64 symbols, each with 3 successors), or the bytes of the
IMDB reviews in `--data-dir` (train.jsonl.gz, fields text and label; test.jsonl.gz is used
for evaluation and capture when present). Queries, keys and values of layer
`--capture-layer` (its query_dense/key_dense/value_dense on the block's input) are captured
on held-out sequences cut to each length and cached in approximation_error_qkv.npz in the
output directory; a later run with the same model settings reuses them (`--retrain` not).

Writes approximation_error.json, approximation_error.png (angle vs n),
approximation_error_attention.png (Figure 6) and approximation_error_gradients.png.

    python benchmarks/approximation_error.py                      # full run (~10-20 min on 2 CPU cores)
    python benchmarks/approximation_error.py --data-dir /path/to/imdb
    python benchmarks/approximation_error.py --quick              # tiny sizes, for the test suite
"""

import argparse
import gzip
import json
import math
import os
import platform
import time

import numpy as np
import tensorflow as tf
import keras

import keras_yoso
from keras_yoso import ops
from keras_yoso._validation import COLLISION_EPSILON

from isolated_run import package_banner

FIG6_TOKENS = 64
TOP_KEYS = 8
MASK_RATE = 0.15
MARKOV_SYMBOLS = 64
MARKOV_SUCCESSOR_PROBS = (0.6, 0.25, 0.15)
SETTINGS = ("trained", "random")
ESTIMATOR_TARGETS = {"lower_bound": "lower_bound", "collision": "exact"}


# ----------------------------------------------------------------------------
# The trained model.

class _SinusoidalPositions(keras.layers.Layer):
    """x * sqrt(width) + the sinusoidal position encoding of Vaswani et al. (any length)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x):
        length, width = tf.shape(x)[1], x.shape[-1]
        position = tf.cast(tf.range(length), tf.float32)[:, None]
        frequency = tf.pow(10000.0, -2.0 * tf.range(width // 2, dtype=tf.float32) / width)[None, :]
        angle = position * frequency
        encoding = tf.concat([tf.sin(angle), tf.cos(angle)], axis=-1)
        return x * math.sqrt(width) + encoding[None]


class _MarkovText:
    """Sequences of a random sparse Markov chain: each symbol has 3 successors."""

    def __init__(self, rng):
        self.vocab = MARKOV_SYMBOLS
        self._successors = np.stack([rng.choice(self.vocab, len(MARKOV_SUCCESSOR_PROBS), replace=False)
                                     for _ in range(self.vocab)])
        self._rng = rng

    def sample(self, count, length, held_out=False):
        """[count, length] token ids in [1, vocab]; every chain sample is fresh, so held_out changes nothing."""
        x = np.zeros((count, length), np.int64)
        x[:, 0] = self._rng.integers(0, self.vocab, count)
        pick = self._rng.choice(len(MARKOV_SUCCESSOR_PROBS), size=(count, length), p=MARKOV_SUCCESSOR_PROBS)
        for t in range(1, length):
            x[:, t] = self._successors[x[:, t - 1], pick[:, t]]
        return (x + 1).astype(np.int32)  # 0 is padding


class _ByteText:
    """Windows of the UTF-8 bytes of the reviews in data_dir, reviews joined by newlines."""

    def __init__(self, data_dir, rng):
        self.vocab = 256
        self._train = self._read(os.path.join(data_dir, "train.jsonl.gz"))
        test = os.path.join(data_dir, "test.jsonl.gz")
        self._test = self._read(test) if os.path.exists(test) else self._train
        self._rng = rng

    @staticmethod
    def _read(path):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = "\n".join(json.loads(line)["text"] for line in f)
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + 1  # 0 is padding

    def sample(self, count, length, held_out=False):
        data = self._test if held_out else self._train
        starts = self._rng.integers(0, len(data) - length, count)
        return np.stack([data[s:s + length] for s in starts])


def _masked_lm_batch(corpus, rng, count, length, held_out=False):
    """(inputs with 15% of the tokens replaced by the mask id, targets, weights 1 at masked tokens)."""
    targets = corpus.sample(count, length, held_out)
    masked = rng.random(targets.shape) < MASK_RATE
    return np.where(masked, corpus.vocab + 1, targets), targets, masked.astype(np.float32)


def _build_model(args, vocab):
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocab + 2, args.heads * args.key_dim, mask_zero=True)(tokens)
    x = _SinusoidalPositions()(x)
    blocks, block_inputs = [], []
    for i in range(args.layers):
        block = keras_yoso.TransformerEncoderBlock(
            args.heads, 2 * args.heads * args.key_dim, attention="yoso", dropout=0.0,
            attention_kwargs=dict(key_dim=args.key_dim, use_expectation=True, hash_code_len=args.hash_code_len,
                                  backward="collision", seed=args.seed + i + 1))
        block_inputs.append(x)
        x = block(x)
        blocks.append(block)
    logits = keras.layers.Dense(vocab + 2)(x)
    return keras.Model(tokens, logits), blocks, block_inputs


def _train_and_capture(args, capture_lengths):
    """Trains the masked LM; returns ({n: (q, k, v)}, (raw q, raw k) of the first 64 tokens, info)."""
    rng = np.random.default_rng(args.seed)
    keras.utils.set_random_seed(args.seed)
    corpus = _ByteText(args.data_dir, rng) if args.data_dir else _MarkovText(rng)
    model, blocks, block_inputs = _build_model(args, corpus.vocab)
    model.compile(keras.optimizers.Adam(args.learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])
    inputs, targets, weights = _masked_lm_batch(corpus, rng, args.train_steps * args.batch_size,
                                                args.train_length)
    start = time.perf_counter()
    model.fit(inputs, targets, sample_weight=weights, batch_size=args.batch_size, epochs=1, verbose=0)
    train_seconds = time.perf_counter() - start
    inputs, targets, weights = _masked_lm_batch(corpus, rng, 256, args.train_length, held_out=True)
    logits = model.predict(inputs, batch_size=64, verbose=0)
    kept = weights > 0
    accuracy = float(np.mean(np.argmax(logits, -1)[kept] == targets[kept]))
    counts = np.bincount(targets[kept], minlength=corpus.vocab + 2)
    info = {"data": args.data_dir or "markov", "vocab": corpus.vocab, "train_steps": args.train_steps,
            "train_seconds": train_seconds, "masked_token_accuracy": accuracy,
            "most_frequent_token_accuracy": float(counts.max() / counts.sum())}
    print(f"trained the masked LM ({info['data']}) in {train_seconds:.0f} s: held-out masked-token accuracy "
          f"{accuracy:.3f} (most frequent token: {info['most_frequent_token_accuracy']:.3f})", flush=True)

    layer = blocks[args.capture_layer].attention_layer
    probe = keras.Model(model.input, block_inputs[args.capture_layer])
    sequences = corpus.sample(args.capture_batch, max(capture_lengths), held_out=True)

    def heads(dense, hidden):  # [B, n, heads, dim] -> [B * heads, n, dim], row b * heads + h as in the layer
        x = dense(hidden)
        return tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [-1, x.shape[1], x.shape[3]]).numpy()

    captured, raw = {}, None
    for n in capture_lengths:
        parts = []
        for sequence in sequences:  # one at a time: YOSO-E in the earlier blocks is O(n^2)
            hidden = tf.identity(probe(sequence[None, :n]))  # drops the (all-true) Keras mask
            parts.append([heads(layer.query_dense, hidden), heads(layer.key_dense, hidden),
                          heads(layer.value_dense, hidden)])
        q, k, v = (np.concatenate(p) for p in zip(*parts))
        if n == FIG6_TOKENS:
            raw = (q, k)
        captured[n] = (_unit(q), _unit(k), v)
    return captured, raw, info


def _unit(x):
    return tf.math.l2_normalize(tf.convert_to_tensor(x, tf.float32), axis=-1).numpy()


def _model_key(args, capture_lengths):
    keys = ("data_dir", "seed", "heads", "key_dim", "layers", "hash_code_len", "train_steps", "train_length",
            "batch_size", "learning_rate", "capture_layer", "capture_batch")
    return json.dumps({**{k: getattr(args, k) for k in keys}, "lengths": sorted(capture_lengths)}, sort_keys=True)


def _trained_qkv(args, capture_lengths):
    """The trained model's Q, K, V, from the cache in out_dir when its settings match."""
    path = os.path.join(args.out_dir, "approximation_error_qkv.npz")
    key = _model_key(args, capture_lengths)
    if os.path.exists(path) and not args.retrain:
        cached = np.load(path)
        if str(cached["key"]) == key:
            print(f"using the cached Q, K, V of {path}", flush=True)
            captured = {n: (cached[f"q{n}"], cached[f"k{n}"], cached[f"v{n}"]) for n in capture_lengths}
            return captured, (cached["fig6_q_raw"], cached["fig6_k_raw"]), json.loads(str(cached["info"]))
    captured, raw, info = _train_and_capture(args, capture_lengths)
    arrays = {f"{name}{n}": a for n, qkv in captured.items() for name, a in zip("qkv", qkv)}
    np.savez_compressed(path, key=key, info=json.dumps(info), fig6_q_raw=raw[0], fig6_k_raw=raw[1], **arrays)
    return captured, raw, info


def _random_qkv(rows, length, key_dim, seed):
    rng = np.random.default_rng([seed, length])
    q = _unit(rng.standard_normal((rows, length, key_dim)))
    k = _unit(rng.standard_normal((rows, length, key_dim)))
    return q, k, rng.standard_normal((rows, length, key_dim)).astype(np.float32)


# ----------------------------------------------------------------------------
# 1. Output angles.

def _normalized_expectation(q, k, v, tau):
    """N-YOSO-E rows and what shapes the error: the mean share of a query's YOSO-E weight mass held by
    its TOP_KEYS largest weights, and ||mean_j V_j|| / mean_j ||V_j|| (computed a few heads at a time)."""
    rows = max(1, 2 ** 25 // (q.shape[1] * k.shape[1]))
    out, shares = [], []
    for s in range(0, q.shape[0], rows):
        out.append(ops.yoso_expectation(q[s:s + rows], k[s:s + rows], v[s:s + rows], tau).numpy())
        weights = ops.yoso_expectation_weights(q[s:s + rows], k[s:s + rows], tau)
        top = tf.math.top_k(weights, min(TOP_KEYS, k.shape[1])).values
        shares.append((tf.reduce_sum(top, -1) / tf.reduce_sum(weights, -1)).numpy())
    value_mean = np.mean(np.linalg.norm(v.mean(1), axis=-1) / np.linalg.norm(v, axis=-1).mean(1))
    return _unit(np.concatenate(out)), {"top_keys_mass_share": float(np.mean(np.concatenate(shares))),
                                        "value_mean_ratio": float(value_mean)}


def _normalized_sample(q, k, v, num_hashes, tau, seed, method):
    qc = ops.hash_codes(q, num_hashes, tau, seed, method=method)
    kc = ops.hash_codes(k, num_hashes, tau, seed, method=method)
    return _unit(ops.lsh_cumulation(qc, kc, v, 2 ** tau))


def _angles(args, qkv_by_length, setting, seeds):
    results, inputs = [], []
    for n, (q, k, v) in sorted(qkv_by_length.items()):
        reference, statistics = _normalized_expectation(q, k, v, args.hash_code_len)
        inputs.append({"setting": setting, "length": n, **statistics})
        for method in args.hash_methods:
            for m in args.num_hashes:
                trial_means, nonempty, empty = [], [], []
                for _ in range(args.trials):
                    out = _normalized_sample(q, k, v, m, args.hash_code_len, next(seeds), method)
                    angle = np.degrees(np.arccos(np.clip(np.sum(out * reference, -1), -1.0, 1.0)))
                    is_empty = ~np.any(out != 0, axis=-1)
                    trial_means.append(angle.mean())
                    nonempty.append(angle[~is_empty])
                    empty.append(is_empty.mean())
                nonempty = np.concatenate(nonempty)
                results.append({
                    "setting": setting, "hash_method": method, "num_hashes": m, "length": n,
                    "mean_angle_deg": float(np.mean(trial_means)),
                    "trial_std_deg": float(np.std(trial_means)),
                    "mean_angle_nonempty_deg": float(nonempty.mean()) if nonempty.size else None,
                    "empty_fraction": float(np.mean(empty)),
                })
        print(f"  {setting}: n = {n} done", flush=True)
    return results, inputs


def _print_angles(args, rows, inputs):
    for setting in SETTINGS:
        for method in args.hash_methods:
            print(f"\nmean angle (degrees) between N-YOSO-m and N-YOSO-E, {setting} Q/K/V, {method} hashing, "
                  f"tau = {args.hash_code_len} (in brackets: % of queries with no collision, counted as 90)")
            print(f"{'n':>6} " + " ".join(f"{'m=' + str(m):>14}" for m in args.num_hashes))
            for n in sorted({r["length"] for r in rows}):
                cells = []
                for m in args.num_hashes:
                    r = next(r for r in rows if (r["setting"], r["hash_method"], r["num_hashes"], r["length"])
                             == (setting, method, m, n))
                    cells.append(f"{r['mean_angle_deg']:7.2f} ({100 * r['empty_fraction']:3.0f}%)")
                print(f"{n:>6} " + " ".join(f"{c:>14}" for c in cells))
    for setting in SETTINGS:
        mine = [r for r in inputs if r["setting"] == setting]
        print(f"{setting}: share of a query's YOSO-E mass in its {TOP_KEYS} largest weights: "
              + ", ".join(f"{r['top_keys_mass_share']:.3f} (n={r['length']})" for r in mine)
              + f"; ||mean V|| / mean ||V||: {np.mean([r['value_mean_ratio'] for r in mine]):.2f}")


# ----------------------------------------------------------------------------
# 2. Attention matrices (Figure 6).

def _attention_matrices(args, raw, head):
    q_raw, k_raw = (np.asarray(a[head:head + 1, :FIG6_TOKENS], np.float32) for a in raw)
    q, k = _unit(q_raw), _unit(k_raw)
    panels = [("softmax(QK^T/sqrt(d)), raw projections",
               tf.nn.softmax(tf.einsum("bid,bjd->bij", q_raw, k_raw) / math.sqrt(q.shape[-1]), -1).numpy()[0])]
    expectation = ops.yoso_expectation_weights(q, k, args.hash_code_len).numpy()[0]
    panels.append((f"YOSO-E, tau = {args.hash_code_len}", expectation))
    differences = {}
    for m in args.fig6_num_hashes:
        qc = ops.hash_codes(q, m, args.hash_code_len, args.seed, method=args.fig6_hash_method).numpy()[0]
        kc = ops.hash_codes(k, m, args.hash_code_len, args.seed, method=args.fig6_hash_method).numpy()[0]
        frequency = np.mean(qc[:, :, None] == kc[:, None, :], axis=0)
        panels.append((f"YOSO-{m} collision frequency ({args.fig6_hash_method})", frequency))
        differences[m] = float(np.mean(np.abs(frequency - expectation)))
    return panels, differences


# ----------------------------------------------------------------------------
# 3. Gradient estimators.

def _query_key_gradients(fn, q, k, output_grad):
    with tf.GradientTape() as tape:
        tape.watch([q, k])
        loss = tf.reduce_sum(fn(q, k) * output_grad)
    return [g.numpy().astype(np.float64) for g in tape.gradient(loss, [q, k])]


def _expected_collision_gradients(q, k, v, output_grad, tau, num_hashes):
    """E over Gaussian hashes of the collision estimator: pair weights times P(collide in >= 1 of m hashes)."""
    q, k, v, g = (np.asarray(a, np.float64) for a in (q, k, v, output_grad))
    x = np.clip(np.einsum("bid,bjd->bij", q, k), -1.0, 1.0)
    p = 1.0 - np.arccos(x) / np.pi
    derivative = tau * p ** (tau - 1) / (np.pi * np.sqrt(1.0 - x * x + COLLISION_EPSILON))
    w = np.einsum("bid,bjd->bij", g, v) * derivative * (1.0 - (1.0 - p ** tau) ** num_hashes)
    return np.einsum("bij,bjd->bid", w, k), np.einsum("bij,bid->bjd", w, q)


def _relative(a, target):
    return float(np.sum((a - target) ** 2) / np.sum(target ** 2))


def _gradient_study(args, q, k, v, setting, seeds):
    tau = args.hash_code_len
    output_grad = tf.constant(np.random.default_rng([args.seed, 7]).standard_normal(v.shape), tf.float32)
    q, k, v = (tf.constant(a) for a in (q, k, v))
    targets = {name: _query_key_gradients(
        lambda q_, k_, b=name: ops.yoso_expectation(q_, k_, v, tau, backward=b), q, k, output_grad)
        for name in ("exact", "lower_bound")}
    bound_vs_exact = {}
    for i, wrt in enumerate(("dQ", "dK")):
        a, b = targets["lower_bound"][i].ravel(), targets["exact"][i].ravel()
        bound_vs_exact[wrt] = {"relative_squared_difference": _relative(a, b),
                               "cosine": float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))}
    rows = []
    for m in args.grad_num_hashes:
        draws = {b: [] for b in ESTIMATOR_TARGETS}
        for _ in range(args.grad_draws):
            seed = next(seeds)
            qc = ops.hash_codes(q, m, tau, seed, method=args.grad_hash_method)
            kc = ops.hash_codes(k, m, tau, seed, method=args.grad_hash_method)
            for backward in ESTIMATOR_TARGETS:
                draws[backward].append(_query_key_gradients(
                    lambda q_, k_, b=backward: ops.yoso_cumulation(q_, k_, v, qc, kc, tau, backward=b),
                    q, k, output_grad))
        expected_collision = _expected_collision_gradients(q, k, v, output_grad, tau, m)
        for backward, target_name in ESTIMATOR_TARGETS.items():
            for i, wrt in enumerate(("dQ", "dK")):
                estimates = np.stack([d[i] for d in draws[backward]])
                target = targets[target_name][i]
                mean = estimates.mean(0)
                scale = np.sum(target ** 2)
                variance = float(np.mean(np.sum((estimates - mean) ** 2, axis=tuple(range(1, estimates.ndim)))) / scale)
                analytic = 0.0 if backward == "lower_bound" else _relative(expected_collision[i], target)
                rows.append({
                    "setting": setting, "num_hashes": m, "estimator": backward, "wrt": wrt, "target": target_name,
                    "relative_bias2": _relative(mean, target), "relative_variance": variance,
                    "monte_carlo_floor": variance / args.grad_draws,
                    "relative_mse": float(np.mean([_relative(e, target) for e in estimates])),
                    "relative_mse_vs_exact": float(np.mean([_relative(e, targets["exact"][i]) for e in estimates])),
                    "analytic_relative_bias2": analytic,
                })
    return rows, bound_vs_exact


def _print_gradients(args, rows, bound_vs_exact):
    print(f"\ngradient estimators vs their YOSO-E targets (n = {args.grad_length}, R = {args.grad_draws} draws, "
          f"{args.grad_hash_method} hashing); all relative to ||target||^2")
    print(f"{'setting':<8} {'m':>4} {'estimator':<12} {'wrt':<3} {'target':<12} {'bias^2':>10} {'MC floor':>10} "
          f"{'analytic':>10} {'variance':>10} {'MSE':>10} {'MSE exact':>10}")
    for r in rows:
        print(f"{r['setting']:<8} {r['num_hashes']:>4} {r['estimator']:<12} {r['wrt']:<3} {r['target']:<12} "
              f"{r['relative_bias2']:>10.3e} {r['monte_carlo_floor']:>10.3e} {r['analytic_relative_bias2']:>10.3e} "
              f"{r['relative_variance']:>10.3e} {r['relative_mse']:>10.3e} {r['relative_mse_vs_exact']:>10.3e}")
    for setting, by_wrt in bound_vs_exact.items():
        for wrt, d in by_wrt.items():
            print(f"{setting}: lower-bound target vs exact gradient, {wrt}: relative squared difference "
                  f"{d['relative_squared_difference']:.3e}, cosine {d['cosine']:.4f}")


# ----------------------------------------------------------------------------
# Figures.

def _plot(args, angles, panels, gradients):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"gaussian": "o-", "hadamard": "s--", "hadamard_interleaved": "^-."}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(args.num_hashes)))
    for ax, setting in zip(axes, SETTINGS):
        for method in args.hash_methods:
            for m, color in zip(args.num_hashes, colors):
                pts = sorted((r["length"], r["mean_angle_deg"]) for r in angles
                             if (r["setting"], r["hash_method"], r["num_hashes"]) == (setting, method, m))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(method, "o-"), color=color,
                        label=f"m={m}, {method}", markersize=4)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="sequence length n", ylabel="mean angle N-YOSO-m vs N-YOSO-E (degrees)",
               title=f"{setting} Q, K, V")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"YOSO-m approximation error (paper Figure 8), tau = {args.hash_code_len}")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "approximation_error.png"), dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.8))
    for ax, (title, matrix) in zip(axes, panels):
        image = ax.imshow(matrix, cmap="viridis")
        ax.set_title(title, fontsize=8)
        ax.set(xlabel="key", ylabel="query")
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(f"attention of the first {FIG6_TOKENS} tokens, trained model, head {args.fig6_head} "
                 "(paper Figure 6)")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "approximation_error_attention.png"), dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), squeeze=False)
    bars = [(e, what) for e in ESTIMATOR_TARGETS for what in ("relative_bias2", "relative_variance")]
    width = 0.8 / len(bars)
    for row, setting in enumerate(SETTINGS):
        for col, wrt in enumerate(("dQ", "dK")):
            ax = axes[row][col]
            for b, (estimator, what) in enumerate(bars):
                values = [next(r[what] for r in gradients if (r["setting"], r["num_hashes"], r["estimator"], r["wrt"])
                               == (setting, m, estimator, wrt)) for m in args.grad_num_hashes]
                x = np.arange(len(values)) + (b - (len(bars) - 1) / 2) * width
                ax.bar(x, values, width, label=f"{estimator}: {what.replace('relative_', '')}")
                if what == "relative_bias2":  # what R draws leave of the variance in the measured bias^2
                    floor = [next(r["monte_carlo_floor"] for r in gradients
                                  if (r["setting"], r["num_hashes"], r["estimator"], r["wrt"])
                                  == (setting, m, estimator, wrt)) for m in args.grad_num_hashes]
                    ax.plot(x, floor, "k_", markersize=14, label="Monte-Carlo floor of bias^2" if b == 0 else None)
            ax.set_yscale("log")
            ax.set_xticks(range(len(args.grad_num_hashes)), [f"m={m}" for m in args.grad_num_hashes])
            ax.set(title=f"{setting} Q, K, V: {wrt}", ylabel="relative to ||target||^2")
            ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"gradient estimators, n = {args.grad_length}, {args.grad_draws} hash draws "
                 "(lower_bound vs eq. 3 bound, collision vs exact)")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "approximation_error_gradients.png"), dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--num-hashes", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--hash-code-len", type=int, default=8, help="tau, for training and every estimate")
    parser.add_argument("--hash-methods", nargs="+", default=["gaussian", "hadamard_interleaved"],
                        choices=["gaussian", "hadamard", "hadamard_interleaved"])
    parser.add_argument("--trials", type=int, default=4, help="hash draws averaged per (m, n)")
    parser.add_argument("--data-dir", default=None, help="directory with train.jsonl.gz (IMDB); default: "
                                                         "a synthetic Markov chain")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--key-dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--train-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--capture-layer", type=int, default=-1, help="block whose Q, K, V are captured")
    parser.add_argument("--capture-batch", type=int, default=2, help="held-out sequences captured")
    parser.add_argument("--retrain", action="store_true", help="ignore the cached Q, K, V")
    parser.add_argument("--fig6-head", type=int, default=0, help="row b * heads + h of the captured heads")
    parser.add_argument("--fig6-num-hashes", type=int, nargs="+", default=[32])
    parser.add_argument("--fig6-hash-method", default="hadamard", choices=["gaussian", "hadamard", "hadamard_interleaved"])
    parser.add_argument("--grad-length", type=int, default=1024)
    parser.add_argument("--grad-num-hashes", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--grad-draws", type=int, default=32)
    parser.add_argument("--grad-hash-method", default="gaussian",
                        choices=["gaussian", "hadamard", "hadamard_interleaved"],
                        help="gaussian makes the analytic expectations exact")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--quick", action="store_true", help="tiny run that checks the script works")
    args = parser.parse_args()
    print(package_banner(os.path.dirname(keras_yoso.__file__), ops.custom_ops_load_error()), flush=True)
    if args.quick:
        args.lengths, args.num_hashes, args.hash_methods, args.trials = [64, 128, 256], [8, 32], ["hadamard_interleaved"], 1
        args.train_steps, args.train_length, args.batch_size, args.capture_batch = 10, 32, 8, 1
        args.grad_length, args.grad_num_hashes, args.grad_draws = 128, [8], 4
    if not -args.layers <= args.capture_layer < args.layers:
        parser.error(f"--capture-layer must be in [{-args.layers}, {args.layers}), got {args.capture_layer}")
    if args.data_dir and not os.path.exists(os.path.join(args.data_dir, "train.jsonl.gz")):
        parser.error(f"--data-dir must hold train.jsonl.gz, got {args.data_dir!r}")
    if not 0 <= args.fig6_head < args.capture_batch * args.heads:
        parser.error(f"--fig6-head must be in [0, {args.capture_batch * args.heads}), got {args.fig6_head}")
    args.capture_layer %= args.layers
    os.makedirs(args.out_dir, exist_ok=True)
    start = time.perf_counter()
    seeds = iter(range(args.seed * 1_000_000 + 1, (args.seed + 1) * 1_000_000))

    capture_lengths = sorted(set(args.lengths) | {FIG6_TOKENS, args.grad_length})
    trained, raw, model_info = _trained_qkv(args, capture_lengths)
    num_rows = args.capture_batch * args.heads
    qkv = {"trained": trained,
           "random": {n: _random_qkv(num_rows, n, args.key_dim, args.seed) for n in capture_lengths}}

    print("output angles:", flush=True)
    angles, inputs = [], []
    for setting in SETTINGS:
        rows, statistics = _angles(args, {n: qkv[setting][n] for n in args.lengths}, setting, seeds)
        angles += rows
        inputs += statistics
    _print_angles(args, angles, inputs)

    panels, differences = _attention_matrices(args, raw, args.fig6_head)
    print(f"\nattention of the first {FIG6_TOKENS} tokens (head {args.fig6_head}): mean |YOSO-m collision frequency "
          "- YOSO-E| = " + ", ".join(f"{d:.4f} (m={m})" for m, d in differences.items()))

    gradients, bound_vs_exact = [], {}
    for setting in SETTINGS:
        rows, bound_vs_exact[setting] = _gradient_study(args, *qkv[setting][args.grad_length], setting, seeds)
        gradients += rows
    _print_gradients(args, gradients, bound_vs_exact)

    seconds = time.perf_counter() - start
    with open(os.path.join(args.out_dir, "approximation_error.json"), "w") as f:
        json.dump({"config": vars(args), "machine": platform.platform(), "cpus": os.cpu_count(),
                   "custom_ops": ops.custom_ops_available(), "model": model_info, "angles": angles,
                   "inputs": inputs,
                   "attention_matrices": {"head": args.fig6_head, "hash_method": args.fig6_hash_method,
                                          "mean_abs_difference_from_yoso_e": differences},
                   "gradients": gradients, "lower_bound_target_vs_exact": bound_vs_exact,
                   "seconds": seconds}, f, indent=2)
    _plot(args, angles, panels, gradients)
    print(f"\nwrote approximation_error.json and 3 PNGs to {args.out_dir} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
