"""Where a converted model departs from the original (issue 42, item 1): per layer and head, the relative
error of each converted attention's output against the softmax layer's, given the same input.

    KERAS_BACKEND=jax python benchmarks/conversion_error.py --pretrained /tmp/all-MiniLM-L6-v2 \\
        --data-dir ../shared/data/imdb --record docs/data/conversion_error_2026-11-28.json
    python benchmarks/conversion_error.py --render docs/data/conversion_error_2026-11-28.json \\
        --figure docs/img/conversion_error.png   # the tables and the figure of the record
    python benchmarks/conversion_error.py --dry-run --out-dir /tmp/ce   # a tiny random BERT, no download

The reference is the checkpoint's softmax model with its position table extended to the longest length
as `keras_yoso.replace_attention(max_length=...)` extends it (the 512 trained rows copied in order, again
and again): the original layers and weights, run at 2,048 tokens over those positions (at 512 tokens it is
the checkpoint itself). Its hidden state entering each layer is the input of every variant of that layer,
so errors do not compound from layer to layer. For head h of a layer with input x:
q_i, k_j, v_j are the layer's trained projections, d the head size, and

    softmax           softmax_j(q_i.k_j / sqrt(d)) . v                     (the checkpoint; error 0)
    exp, unit q,k     softmax_j(beta_h cos_ij) . v, beta_h = mean_i |q_i| mean_j |k_j| / sqrt(d) on this
                      text: YOSO's L2 normalization of q and k, with the exp kernel and each head's mean
                      temperature kept (the per-token norms dropped)
    YOSO-E, /sum      sum_j w_ij v_j / sum_j w_ij, w_ij = (1 - arccos(cos_ij)/pi)^tau: YOSO-E's kernel
                      with softmax's output normalization (division by the weight sum)
    YOSO-E            sum_j w_ij v_j / |sum_j w_ij v_j| (the library's use_expectation=True layer)
    YOSO m, tau       the converted layer (m hashes of tau bits, its hash functions from the seed), as
                      examples/convert_pretrained.py converts (--num-hashes, --hash-code-len) and at the
                      library's defaults
    softmax, L2 out   softmax's output, L2-normalized per head as YOSO normalizes it

read top to bottom, each row changes one thing more than the row above, from softmax to sampled YOSO
(the last row changes only the output normalization of softmax). The angular kernel sees only angles, so
"YOSO-E without the L2 normalization of q and k" is YOSO-E itself: that normalization matters only
against the exp kernel (the second row). Per head: |o - o_soft| / |o_soft| of the head's output (before
the output projection), over the text's tokens; per layer: the same of the layer's output (the output
projection and its bias applied, what the residual receives). End to end: the cosine between the mean
of the converted model's token vectors and the reference's (sentence-transformers' pooling).

Prints the tables, writes conversion_error.json and conversion_error.png to --out-dir, and with --record
appends the record to that JSON file (a list of records). docs/results.md renders the tables with
--render from the committed record. The full run (all-MiniLM-L6-v2, 8 texts at 512 and at 2,048 tokens)
took 16 minutes on JAX on 2 busy CPUs, most of it at 2,048 tokens; one process.
"""

import argparse
import datetime
import gzip
import inspect
import json
import os
import platform
import sys
import time

import numpy as np

VARIANTS = ("softmax", "exp, unit q,k", "YOSO-E, /sum", "YOSO-E", "YOSO converted", "YOSO library default",
            "softmax, L2 out")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrained", help="folder of a Hugging Face BERT checkpoint (config.json, "
                        "model.safetensors, tokenizer.json), e.g. all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data", "imdb"),
                        help="IMDB: test.jsonl.gz (the texts are test reviews). Default: %(default)s")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048], help="Default: %(default)s")
    parser.add_argument("--texts", type=int, default=8, help="texts per length. Default: %(default)s")
    parser.add_argument("--num-hashes", type=int, default=32,
                        help="m of the converted model (examples/convert_pretrained.py's). Default: %(default)s")
    parser.add_argument("--hash-code-len", type=int, default=8,
                        help="tau of the converted model and of YOSO-E (examples/convert_pretrained.py's). "
                             "Default: %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="texts and hash functions. Default: %(default)s")
    parser.add_argument("--out-dir", default=os.path.join("runs", "conversion_error"), help="Default: %(default)s")
    parser.add_argument("--record", default=None, help="a JSON file to append the record to (docs/data/...)")
    parser.add_argument("--dry-run", action="store_true",
                        help="a tiny BERT with random weights and random tokens (lengths 16 and 32, 1 text): "
                             "checks the script end to end without the checkpoint")
    parser.add_argument("--render", metavar="RECORD", default=None,
                        help="print the tables of the last record of RECORD (a JSON file) and exit")
    parser.add_argument("--figure", default=None, help="with --render: also draw the record's figure to this PNG")
    args = parser.parse_args(argv)
    if not (args.dry_run or args.render or args.pretrained):
        parser.error("--pretrained is required (or --dry-run, or --render)")
    if args.dry_run:
        args.lengths, args.texts, args.num_hashes = [16, 32], 1, 4
    return args


# ---------------------------------------------------------------------------------------------- texts


def imdb_token_ids(args, lengths, split="test"):
    """{length: [texts, length] int32}: IMDB reviews of `split` ("test": test.jsonl.gz, "train") as [CLS]
    wordpieces [SEP]. A text of the shortest length is one review with at least that many wordpieces (cut);
    a longer one joins consecutive reviews (by a space) from a random one until it has them (cut). Also the
    review indices used."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(args.pretrained, "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    with gzip.open(os.path.join(args.data_dir, f"{split}.jsonl.gz"), "rt", encoding="utf-8") as f:
        reviews = [json.loads(line)["text"] for line in f]
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    order = np.random.default_rng(args.seed).permutation(len(reviews))
    pieces = lambda i: tokenizer.encode(reviews[i], add_special_tokens=False).ids  # noqa: E731
    ids, used, cursor = {}, {}, 0
    for n, length in enumerate(sorted(lengths)):
        rows, sources = [], []
        while len(rows) < args.texts:
            start = int(order[cursor])
            cursor += 1
            tokens, members = list(pieces(start)), [start]
            if n == 0 and len(tokens) < length - 2:
                continue  # the shortest length: single reviews long enough
            while len(tokens) < length - 2:
                members.append((members[-1] + 1) % len(reviews))
                tokens += pieces(members[-1])
            rows.append([cls] + tokens[:length - 2] + [sep])
            sources.append(members)
        ids[length], used[length] = np.asarray(rows, np.int32), sources
    return ids, used


# ---------------------------------------------------------------------------------------------- models


def _numpy(tensor):
    """A float32 NumPy copy of a tensor of any backend (a PyTorch one detached)."""
    import keras

    return np.asarray(keras.ops.convert_to_numpy(keras.ops.stop_gradient(tensor)), np.float32)


def softmax_reference(backbone, length):
    """The same BertBackbone with its position table extended to `length` rows as replace_attention extends
    it (trained rows copied in order, again and again): the original layers and weights (the backbone
    itself when it has the positions)."""
    import keras_hub

    if length <= backbone.max_sequence_length:
        return backbone
    config = {**backbone.get_config(), "max_sequence_length": length}
    reference = keras_hub.models.BertBackbone.from_config(config)
    for target, source in zip(reference.weights, backbone.weights):
        value = _numpy(source.value)
        if tuple(value.shape) != tuple(target.shape):
            value = np.concatenate([value] * -(-target.shape[0] // value.shape[0]), axis=0)[:target.shape[0]]
        target.assign(value)
    return reference


def layer_inputs(reference, ids):
    """The hidden states `[1, N, D]` entering each transformer layer of the reference, and its sequence
    output, for one text (no padding)."""
    import keras

    inputs = {"token_ids": ids[None], "segment_ids": np.zeros_like(ids[None]), "padding_mask": np.ones_like(ids[None])}
    embed = keras.Model(reference.inputs, reference.get_layer("embeddings_layer_norm").output)
    x = embed(inputs)
    states = []
    for layer in reference.transformer_layers:
        states.append(_numpy(x))
        x = layer(x)
    return states, _numpy(x)[0]


def pooled(model, ids):
    inputs = {"token_ids": ids[None], "segment_ids": np.zeros_like(ids[None]), "padding_mask": np.ones_like(ids[None])}
    out = _numpy(model(inputs)["sequence_output"])[0].mean(axis=0)
    return out / np.linalg.norm(out)


# ---------------------------------------------------------------------------------------------- one layer


def _weights(attention):
    """{name: numpy} of a MultiHeadAttention (or its keras_yoso replacement): query/key/value kernels
    `[D, heads, d]` and biases `[heads, d]`, the output kernel `[heads, d, D]` and bias `[D]`."""
    out = {}
    for variable in attention.weights:
        parts = variable.path.split("/")
        if parts[-1] in ("kernel", "bias") and parts[-2] in ("query", "key", "value", "attention_output"):
            out[f"{parts[-2]}_{parts[-1]}"] = _numpy(variable.value)
        elif parts[-1] == "hash_functions":
            out["hash_functions"] = variable.value
    return out


def _unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)


def _softmax_rows(logits):
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def head_outputs(x, weights, tau, converted):
    """{variant: `[heads, N, d]`} for one layer's input `x` `[N, D]` (see the module docstring); `converted`:
    {variant: the converted YosoAttention} for the sampled rows."""
    from keras_yoso import ops as yoso_ops

    q, k, v = (np.einsum("nD,Dhd->hnd", x, weights[f"{n}_kernel"]) + weights[f"{n}_bias"][:, None, :]
               for n in ("query", "key", "value"))
    head_size = q.shape[-1]
    q_norm, k_norm = np.linalg.norm(q, axis=-1), np.linalg.norm(k, axis=-1)
    q_unit, k_unit = _unit(q), _unit(k)
    cos = np.clip(q_unit @ k_unit.transpose(0, 2, 1), -1.0, 1.0)  # [heads, N, N]
    out = {"softmax": _softmax_rows(np.einsum("hnd,hmd->hnm", q, k) / np.sqrt(head_size)) @ v}
    beta = q_norm.mean(axis=1) * k_norm.mean(axis=1) / np.sqrt(head_size)  # each head's mean temperature
    out["exp, unit q,k"] = _softmax_rows(beta[:, None, None] * cos) @ v
    kernel = (1.0 - np.arccos(cos) / np.pi) ** tau
    summed = kernel @ v
    del cos
    out["YOSO-E, /sum"] = summed / kernel.sum(axis=-1, keepdims=True)
    del kernel
    out["YOSO-E"] = _unit(summed)
    out["softmax, L2 out"] = _unit(out["softmax"])
    for name, layer in converted.items():
        own = _weights(layer)
        codes = [yoso_ops.hash_codes(t, layer.num_hashes, layer.hash_code_len, method=layer.hash_method,
                                     parameters=own["hash_functions"]) for t in (q_unit, k_unit)]
        sampled = yoso_ops.yoso_cumulation(q_unit, k_unit, v, *codes, layer.hash_code_len)
        out[name] = _unit(_numpy(sampled))
    return out


def project(heads, weights):
    """The layer output `[N, D]` of head outputs `[heads, N, d]`: the output projection and its bias."""
    return np.einsum("hnd,hdD->nD", heads, weights["attention_output_kernel"]) + weights["attention_output_bias"]


def relative(a, b, axis=None):
    return np.linalg.norm(a - b, axis=axis) / np.linalg.norm(b, axis=axis)


# ---------------------------------------------------------------------------------------------- the run


def tiny_backbone():
    """A 2-layer BertBackbone with random weights and 16 positions (the dry run)."""
    import keras_hub

    return keras_hub.models.BertBackbone(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16,
                                         intermediate_dim=32, max_sequence_length=16)


def load(args):
    """(backbone, {length: token ids [texts, length]}, texts description)."""
    import keras_hub

    if args.dry_run:
        import keras

        keras.utils.set_random_seed(args.seed)
        rng = np.random.default_rng(args.seed)
        ids = {n: rng.integers(1, 64, size=(args.texts, n)).astype(np.int32) for n in args.lengths}
        return tiny_backbone(), ids, {"texts": "random token ids (dry run)"}
    backbone = keras_hub.models.BertBackbone.from_preset(args.pretrained)
    ids, used = imdb_token_ids(args, args.lengths)
    description = {"texts": f"IMDB test reviews ({args.data_dir}/test.jsonl.gz): at {min(args.lengths)} tokens one "
                            "review each with at least that many wordpieces, cut; longer, consecutive reviews "
                            "joined by a space from a random one, cut; [CLS] ... [SEP], no padding",
                   "review_indices": {str(n): used[n] for n in used}}
    return backbone, ids, description


def measure(args):
    import keras_yoso

    backbone, ids, description = load(args)
    longest = max(args.lengths)
    max_length = longest if longest > backbone.max_sequence_length else None
    reference = softmax_reference(backbone, longest)
    defaults = {name: parameter.default for name, parameter in
                inspect.signature(keras_yoso.YosoAttention.__init__).parameters.items()}
    settings = {"YOSO converted": {"num_hashes": args.num_hashes, "hash_code_len": args.hash_code_len},
                "YOSO library default": {"num_hashes": defaults["num_hashes"],
                                         "hash_code_len": defaults["hash_code_len"]},
                "YOSO-E": {"use_expectation": True, "hash_code_len": args.hash_code_len}}
    models = {name: keras_yoso.replace_attention(backbone, "yoso", max_length=max_length, seed=args.seed, **kwargs)
              for name, kwargs in settings.items()}
    num_layers = len(reference.transformer_layers)
    attention = lambda model, i: model.get_layer(f"transformer_layer_{i}")._self_attention_layer  # noqa: E731
    rows, checks = [], {"softmax re-implemented vs the keras layer": 0.0,
                        "YOSO-E re-implemented vs the library layer": 0.0,
                        "sampled YOSO via keras_yoso.ops vs the converted layer": 0.0}
    start = time.perf_counter()
    for length in args.lengths:
        per_layer = {v: np.zeros((len(ids[length]), num_layers)) for v in VARIANTS}
        per_head = {v: np.zeros((len(ids[length]), num_layers, reference.num_heads)) for v in VARIANTS}
        cosines = {name: [] for name in models}
        for t, row in enumerate(ids[length]):
            states, _ = layer_inputs(reference, row)
            for i, state in enumerate(states):
                weights = _weights(attention(reference, i))
                converted = {name: attention(models[name], i) for name in ("YOSO converted", "YOSO library default")}
                heads = head_outputs(state[0], weights, args.hash_code_len, converted)
                truth = _numpy(attention(reference, i)(state, state))[0]
                for variant in VARIANTS:
                    per_layer[variant][t, i] = relative(project(heads[variant], weights), truth)
                    per_head[variant][t, i] = relative(heads[variant], heads["softmax"], axis=(1, 2))
                if t == 0:  # the re-implementations against the layers themselves
                    library = {"YOSO-E": _numpy(attention(models["YOSO-E"], i)(state, state))[0]}
                    for name, layer in converted.items():
                        library[name] = _numpy(layer(state, state))[0]
                    checks["softmax re-implemented vs the keras layer"] = max(
                        checks["softmax re-implemented vs the keras layer"], per_layer["softmax"][t, i])
                    checks["YOSO-E re-implemented vs the library layer"] = max(
                        checks["YOSO-E re-implemented vs the library layer"],
                        relative(project(heads["YOSO-E"], weights), library["YOSO-E"]))
                    for name in converted:
                        checks["sampled YOSO via keras_yoso.ops vs the converted layer"] = max(
                            checks["sampled YOSO via keras_yoso.ops vs the converted layer"],
                            relative(project(heads[name], weights), library[name]))
            target = pooled(reference, row)
            for name, model in models.items():
                cosines[name].append(float(pooled(model, row) @ target))
            print(f"  length {length}, text {t + 1}/{len(ids[length])}: {time.perf_counter() - start:.0f} s",
                  flush=True)
        for variant in VARIANTS:
            rows.append({"length": length, "variant": variant,
                         "layer_error": per_layer[variant].mean(axis=0).tolist(),
                         "layer_error_per_text": per_layer[variant].tolist(),
                         "head_error": per_head[variant].mean(axis=0).tolist(),
                         "end_to_end_cosine": float(np.mean(cosines[variant])) if variant in cosines else None})
    return {"rows": rows, "checks": {k: float(v) for k, v in checks.items()}, "settings": settings,
            "seconds": time.perf_counter() - start, **description}


# ---------------------------------------------------------------------------------------------- output


def render(record):
    """The markdown tables of a record: per layer (mean over texts), and per head (median and max)."""
    lengths = sorted({row["length"] for row in record["rows"]})
    num_layers = len(record["rows"][0]["layer_error"])
    lines = ["| variant | tokens | " + " | ".join(f"layer {i}" for i in range(num_layers))
             + " | mean | end-to-end cosine |",
             "| --- | ---: | " + " | ".join("---:" for _ in range(num_layers)) + " | ---: | ---: |"]
    for variant in VARIANTS:
        for length in lengths:
            row = next(r for r in record["rows"] if r["variant"] == variant and r["length"] == length)
            cosine = "-" if row["end_to_end_cosine"] is None else f"{row['end_to_end_cosine']:.3f}"
            lines.append(f"| {label(variant, record)} | {length:,} | "
                         + " | ".join(f"{e:.3f}" for e in row["layer_error"])
                         + f" | {np.mean(row['layer_error']):.3f} | {cosine} |")
    lines += ["", "| variant | tokens | per-head error: median | worst head (layer.head) |",
              "| --- | ---: | ---: | ---: |"]
    for variant in VARIANTS[1:]:
        for length in lengths:
            row = next(r for r in record["rows"] if r["variant"] == variant and r["length"] == length)
            heads = np.asarray(row["head_error"])
            worst = np.unravel_index(np.argmax(heads), heads.shape)
            lines.append(f"| {label(variant, record)} | {length:,} | {np.median(heads):.3f} | "
                         f"{heads.max():.3f} ({worst[0]}.{worst[1]}) |")
    checks = "; ".join(f"{name} {value:.1e}" for name, value in record["checks"].items())
    lines += ["", f"Checks (largest relative error on the first text of each length): {checks}."]
    return "\n".join(lines)


def label(variant, record):
    settings = record["settings"]
    if variant in ("YOSO converted", "YOSO library default"):
        s = settings[variant]
        return f"{variant} (m={s['num_hashes']}, tau={s['hash_code_len']})"
    if variant.startswith("YOSO-E"):
        return f"{variant} (tau={settings['YOSO-E']['hash_code_len']})"
    return variant


def plot(record, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({row["length"] for row in record["rows"]})
    figure, axes = plt.subplots(1, len(lengths), figsize=(6 * len(lengths), 4.5), sharey=True, squeeze=False)
    for axis, length in zip(axes[0], lengths):
        for n, variant in enumerate(VARIANTS):
            row = next(r for r in record["rows"] if r["variant"] == variant and r["length"] == length)
            axis.plot(range(len(row["layer_error"])), row["layer_error"], marker="o", color=f"C{n}",
                      label=label(variant, record))
        axis.set_title(f"{length:,} tokens, mean over {len(row['layer_error_per_text'])} text(s)")
        axis.set_xlabel("layer")
        axis.set_xticks(range(len(row["layer_error"])))
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("relative error of the layer's attention output vs softmax's")
    axes[0][-1].legend(fontsize=8)
    figure.suptitle(f"{record['model']}: each converted attention given the softmax model's hidden states")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def append_record(path, record):
    """Appends `record` to the JSON list in `path` (created when missing). benchmarks/calibration.py's and
    benchmarks/native_ab.py's records are appended the same way."""
    records = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(records + [record], f, indent=1)


def add_record_arguments(parser, out_dir):
    """--out-dir (default `out_dir`), --record, --machine-note and --render RECORDS, as benchmarks/native_ab.py
    and benchmarks/training_memory.py take them: a run appends one record to --record's JSON list; --render
    measures nothing and prints (and draws) every record of RECORDS."""
    parser.add_argument("--out-dir", default=out_dir, help="Default: %(default)s")
    parser.add_argument("--record", default=None, help="a JSON list to append the record to (docs/data/...)")
    parser.add_argument("--machine-note", default="not stated",
                        help="what else ran on the machine ('quiet', or 'quiet: ...', if nothing)")
    parser.add_argument("--render", metavar="RECORDS", default=None,
                        help="measure nothing: print the heading and table of each record in RECORDS and "
                             "draw its figure")


def show_records(path, render, draw, out_dir):
    """What --render does for native_ab.py and training_memory.py: prints `render(records)` of the JSON list in
    `path`, then draws them with `draw(records, out_dir)` and names each figure written."""
    with open(path, encoding="utf-8") as f:
        records = json.load(f)
    print(render(records))
    for figure in draw(records, out_dir):
        print(f"wrote {figure}")


def run_fields(args, argv, load_before, machine_note):
    """What a record says of its run: the model, the command, the backend, the date, the machine (with
    the load average before and after, and `machine_note` on how quiet it was), the lengths and seed.
    benchmarks/calibration.py's records say the same."""
    import keras

    return {
        "model": "tiny random BERT (dry run)" if args.dry_run else os.path.basename(os.path.normpath(args.pretrained)),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]) if argv is None else " ".join(argv),
        "backend": keras.backend.backend(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"uname": " ".join(platform.uname()), "cpus": os.cpu_count(),
                    "load_average_before_after": [list(load_before), list(os.getloadavg())],
                    "quiet": False, "note": machine_note},
        "lengths": args.lengths, "seed": args.seed}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            record = json.load(f)[-1]
        print(render(record))
        if args.figure:
            plot(record, args.figure)
        return

    load_before = os.getloadavg()
    record = measure(args)
    record.update(run_fields(args, argv, load_before, "not quiet: other jobs ran on this machine at the same time"))
    print(render(record))
    print("checks (max relative error, the first text of each length):",
          json.dumps(record["checks"], indent=1))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "conversion_error.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    plot(record, os.path.join(args.out_dir, "conversion_error.png"))
    if args.record:
        append_record(args.record, record)
    print(f"wrote {args.out_dir}/conversion_error.json and .png"
          + (f", appended to {args.record}" if args.record else ""))


if __name__ == "__main__":
    main()
