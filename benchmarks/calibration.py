"""Calibration with no training (issue 42, item 2) and attention transfer (item 3): each converted layer's error
against the softmax layer, and the end-to-end embedding cosine, before and after `keras_yoso.calibrate` and
`keras_yoso.transfer_attention` (--transfer-steps), on text the calibration and the transfer never saw.

    KERAS_BACKEND=jax python benchmarks/calibration.py --pretrained /tmp/all-MiniLM-L6-v2 \\
        --data-dir ../shared/data/imdb --record docs/data/calibration_2026-11-28.json
    python benchmarks/calibration.py --render docs/data/calibration_2026-11-28.json   # the tables of its records
    python benchmarks/calibration.py --render docs/data/calibration_2026-11-29.json --summary   # README's table
    python benchmarks/calibration.py --dry-run --out-dir /tmp/cal   # a tiny random BERT, no download

The model is converted as examples/convert_pretrained.py converts it (m = 32, tau = 8, seed 0; positions
extended to the length when it exceeds 512) and calibrated with `keras_yoso.calibrate` on IMDB *train*
reviews (--cal-texts per length); the errors are measured on IMDB *test* reviews, the texts of
benchmarks/conversion_error.py's record (same seed, same selection), so the calibration text and the
reported text are disjoint; transfer_attention trains on the calibration texts too. Per layer: the relative error |y - y_softmax| / |y_softmax| of the layer's
attention output (after the output projection) given the softmax model's hidden state entering the layer
(conversion_error.py's measure), on the held-out texts and on the calibration texts; end to end: the cosine
of the mean-pooled embeddings of the converted model and the softmax reference on the held-out texts.

What no tau or scale can reach (--ceiling, at the shortest length, NumPy on the same texts, fitted on the
calibration texts, errors on the held-out ones): YOSO-E (the expectation sampled YOSO estimates) with the
best tau per layer and the fitted scale, as calibrate would fit it without sampling noise; YOSO-E with the
best tau per head (a per-head temperature, which a YOSO layer's one tau cannot express), and softmax's exp
kernel on YOSO's L2-normalized q and k with each head's best temperature beta_h, divided by its weight sum
(the normalization of q and k alone, at the best temperature), then with YOSO's L2 output normalization and
the fitted scale.

The full run (all-MiniLM-L6-v2, 8 calibration and 8 held-out texts at 512 and 2,048 tokens) is timed in its
record; one process.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

import conversion_error as ce  # beside this script, which Python puts on sys.path

CEILING_TAUS = tuple(range(1, 17))
CEILING_BETAS = (1, 2, 3, 4, 6, 8, 11, 16, 22, 32, 45)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrained", help="folder of a Hugging Face BERT checkpoint, e.g. all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data", "imdb"),
                        help="IMDB: train.jsonl.gz (calibration) and test.jsonl.gz (held out). Default: %(default)s")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048], help="Default: %(default)s")
    parser.add_argument("--select-lengths", type=int, nargs="+", default=[512, 2048],
                        help="the lengths whose texts are drawn together as conversion_error.py draws them (a run "
                             "of one length measures the same texts as a run of both). Default: %(default)s")
    parser.add_argument("--texts", type=int, default=8, help="held-out texts per length. Default: %(default)s")
    parser.add_argument("--cal-texts", type=int, default=8, help="calibration texts per length. Default: %(default)s")
    parser.add_argument("--num-hashes", type=int, default=32, help="m of the converted model. Default: %(default)s")
    parser.add_argument("--hash-code-len", type=int, default=8, help="tau of the converted model. Default: %(default)s")
    parser.add_argument("--hash-code-lens", type=int, nargs="+", default=None,
                        help="calibrate's candidate taus. Default: keras_yoso.calibration.DEFAULT_HASH_CODE_LENS")
    parser.add_argument("--batch-size", type=int, default=4, help="calibrate's batch size. Default: %(default)s")
    parser.add_argument("--expectation-lengths", type=int, nargs="*", default=[512],
                        help="lengths at which YOSO-E (use_expectation=True, O(T^2)) is also converted and calibrated "
                             "(candidates 2..16) and sampled models at the --sweep taus are measured end to end. "
                             "Default: %(default)s")
    parser.add_argument("--sweep", type=int, nargs="*", default=[4, 6, 10, 12],
                        help="taus of the uncalibrated sampled models measured end to end. Default: %(default)s")
    parser.add_argument("--transfer-steps", type=int, default=0,
                        help="also run keras_yoso.transfer_attention for this many steps per layer (0: not at all): "
                             "the converted model with its own sampled student, and at the --expectation-lengths "
                             "with a YOSO-E student and the YOSO-E model. Default: %(default)s")
    parser.add_argument("--local-window", type=int, default=None,
                        help="convert with YosoAttention(local_window=W): an exact softmax window beside YOSO whose "
                             "per-head scale starts at 0 (so converted and calibrated are as without it) and is "
                             "trained by the transfer. Default: none")
    parser.add_argument("--locality", type=int, nargs="*", default=[],
                        help="windows w: per layer and head, the share of the softmax model's attention within "
                             "|i - j| < w, on the calibration texts of each length (what a local window could "
                             "carry exactly). Default: none")
    parser.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                        help="skip keras_yoso.calibrate (no calibrated rows; the transfer starts from the converted "
                             "model either way)")
    parser.add_argument("--transfer-rate", type=float, default=2e-2,
                        help="transfer_attention's learning rate. Default: %(default)s")
    parser.add_argument("--machine-note", default="not stated",
                        help="what else ran on the machine, for the record (e.g. 'quiet'). Default: %(default)s")
    parser.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                        help="skip the NumPy analysis of what no tau or scale can reach")
    parser.add_argument("--seed", type=int, default=0, help="texts and hash functions. Default: %(default)s")
    parser.add_argument("--out-dir", default=os.path.join("runs", "calibration"), help="Default: %(default)s")
    parser.add_argument("--record", default=None, help="a JSON file to append the record to (docs/data/...)")
    parser.add_argument("--dry-run", action="store_true",
                        help="a tiny BERT with random weights and random tokens (lengths 16 and 32, 2 texts each)")
    parser.add_argument("--render", metavar="RECORD", nargs="+", default=None,
                        help="print the tables of the records in the RECORD files (JSON lists, read in order; runs "
                             "of different lengths merge) and exit")
    parser.add_argument("--summary", action="store_true",
                        help="with --render: the README's conversion summary (converted, calibrated, transferred)")
    parser.add_argument("--runs", metavar="LENGTH", type=int, default=None,
                        help="with --render: one row per run that measured LENGTH tokens (its seed, calibration "
                             "texts and transfer steps beside its held-out results), to compare budgets and seeds")
    args = parser.parse_args(argv)
    if not (args.dry_run or args.render or args.pretrained):
        parser.error("--pretrained is required (or --dry-run, or --render)")
    if (args.summary or args.runs is not None) and not args.render:
        parser.error("--summary and --runs format records: give them with --render RECORD [RECORD ...]")
    if args.summary and args.runs is not None:
        parser.error(f"--summary and --runs {args.runs} are two different tables: give one of them")
    if args.dry_run:
        args.lengths, args.texts, args.cal_texts, args.num_hashes = [16, 32], 2, 2, 4
        args.expectation_lengths, args.sweep = [16], [4]
        args.transfer_steps = min(args.transfer_steps, 4)
    return args


def load(args):
    """(backbone, {length: held-out ids}, {length: calibration ids}, description)."""
    import keras_hub

    if args.dry_run:
        import keras

        keras.utils.set_random_seed(args.seed)
        rng = np.random.default_rng(args.seed)
        draw = lambda n, count: rng.integers(1, 64, size=(count, n)).astype(np.int32)  # noqa: E731
        held = {n: draw(n, args.texts) for n in args.lengths}
        calibration = {n: draw(n, args.cal_texts) for n in args.lengths}
        return ce.tiny_backbone(), held, calibration, {"texts": "random token ids (dry run)"}
    backbone = keras_hub.models.BertBackbone.from_preset(args.pretrained)
    lengths = sorted(set(args.select_lengths) | set(args.lengths))
    held, held_used = ce.imdb_token_ids(args, lengths, "test")
    cal_args = argparse.Namespace(**{**vars(args), "texts": args.cal_texts})
    calibration, cal_used = ce.imdb_token_ids(cal_args, lengths, "train")
    description = {
        "texts": f"held out: IMDB test reviews ({args.data_dir}/test.jsonl.gz), conversion_error.py's selection "
                 "(at the shortest length one review each with at least that many wordpieces, cut; longer, "
                 "consecutive reviews joined by a space from a random one, cut); calibration: IMDB train reviews "
                 "(train.jsonl.gz), the same selection; [CLS] ... [SEP], no padding",
        "review_indices": {"held_out_test": {str(n): held_used[n] for n in args.lengths},
                           "calibration_train": {str(n): cal_used[n] for n in args.lengths}}}
    return backbone, held, calibration, description


def _inputs(ids):
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}


def layer_errors(reference, models, ids):
    """{name: [texts, layers] relative errors} of each model's attention layers given the reference's hidden
    states (conversion_error.py's per-layer measure)."""
    attention = lambda model, i: model.get_layer(f"transformer_layer_{i}")._self_attention_layer  # noqa: E731
    layers = len(reference.transformer_layers)
    errors = {name: np.zeros((len(ids), layers)) for name in models}
    for t, row in enumerate(ids):
        states, _ = ce.layer_inputs(reference, row)
        for i, state in enumerate(states):
            truth = ce._numpy(attention(reference, i)(state, state))[0]
            for name, model in models.items():
                errors[name][t, i] = ce.relative(ce._numpy(attention(model, i)(state, state))[0], truth)
    return errors


def cosines(reference, models, ids):
    """{name: [texts]} cosines of each model's mean-pooled embedding to the reference's."""
    out = {name: [] for name in models}
    for row in ids:
        target = ce.pooled(reference, row)
        for name, model in models.items():
            out[name].append(float(ce.pooled(model, row) @ target))
    return out


# ---------------------------------------------------------------------------------------------- the ceiling


def _per_text_heads(reference, weights, i, ids):
    """For layer i: per text, (softmax heads [H, N, d], the cosines [H, N, N], v [H, N, d])."""
    out = []
    for row in ids:
        states, _ = ce.layer_inputs(reference, row)
        x = states[i][0]
        q, k, v = (np.einsum("nD,Dhd->hnd", x, weights[f"{n}_kernel"]) + weights[f"{n}_bias"][:, None, :]
                   for n in ("query", "key", "value"))
        soft = ce._softmax_rows(np.einsum("hnd,hmd->hnm", q, k) / np.sqrt(q.shape[-1])) @ v
        cos = np.clip(ce._unit(q) @ ce._unit(k).transpose(0, 2, 1), -1.0, 1.0)
        out.append((soft, cos, v))
    return out


def _fit_scale(pairs, kernel):
    """The joint least-squares head scale s of `pairs` [(heads [H, N, d], softmax heads)], output kernel
    [H, d, D] (calibrate's normal equations, the bias cancelling)."""
    heads = kernel.shape[0]
    gram, cross = np.zeros((heads, heads)), np.zeros(heads)
    for out, soft in pairs:
        z = np.einsum("hnd,hdD->hnD", out, kernel)
        gram += np.einsum("hnD,knD->hk", z, z)
        cross += np.einsum("hnD,nD->h", z, np.einsum("hnd,hdD->nD", soft, kernel))
    return np.linalg.lstsq(gram, cross, rcond=None)[0]


def _layer_error(pairs, kernel, bias, scale):
    """The relative error of the layer outputs of `pairs` with head scale `scale` (bias in the norm only)."""
    num = den = 0.0
    for out, soft in pairs:
        target = np.einsum("hnd,hdD->nD", soft, kernel)
        num += float(((np.einsum("hnd,hdD->nD", out * scale[:, None, None], kernel) - target) ** 2).sum())
        den += float(((target + bias) ** 2).sum())
    return float(np.sqrt(num / den))


def _head_error(pairs):
    """[H] relative error per head, with each head's own least-squares scale fitted on the same pairs."""
    a = sum((out * soft).sum(axis=(1, 2)) for out, soft in pairs)
    b = sum((out * out).sum(axis=(1, 2)) for out, _ in pairs)
    scale = a / np.maximum(b, 1e-30)
    num = sum(((out * scale[:, None, None] - soft) ** 2).sum(axis=(1, 2)) for out, soft in pairs)
    return np.sqrt(num / sum((soft ** 2).sum(axis=(1, 2)) for _, soft in pairs)), scale


def ceiling(reference, held_ids, cal_ids):
    """Per layer: the held-out error of the best fits of the module docstring (fitted on the calibration
    texts): YOSO-E one tau per layer, YOSO-E one tau per head, exp(beta_h cos)/sum and + L2 out + scale."""
    rows = {key: [] for key in ("yoso_e_tau_per_layer", "yoso_e_tau_per_head", "exp_unit_qk_best_beta_sum",
                                "exp_unit_qk_best_beta_l2_out_scaled")}
    chosen = {"yoso_e_tau_per_layer": [], "yoso_e_tau_per_head": [], "beta_per_head": []}
    for i in range(len(reference.transformer_layers)):
        weights = ce._weights(reference.get_layer(f"transformer_layer_{i}")._self_attention_layer)
        kernel, bias = weights["attention_output_kernel"], weights["attention_output_bias"]
        cal, held = _per_text_heads(reference, weights, i, cal_ids), _per_text_heads(reference, weights, i, held_ids)

        def yoso_e(texts, tau):
            return [(ce._unit(((1.0 - np.arccos(cos) / np.pi) ** tau) @ v), soft) for soft, cos, v in texts]

        def exp_sum(texts, betas):
            return [(np.stack([ce._softmax_rows(b * cos[h]) @ v[h] for h, b in enumerate(betas)]), soft)
                    for soft, cos, v in texts]

        outputs = {tau: (yoso_e(cal, tau), yoso_e(held, tau)) for tau in CEILING_TAUS}
        fits = {}
        for tau, (pairs, _) in outputs.items():
            scale = _fit_scale(pairs, kernel)
            fits[tau] = (_layer_error(pairs, kernel, bias, scale), scale, _head_error(pairs)[0])
        best = min(fits, key=lambda tau: fits[tau][0])
        rows["yoso_e_tau_per_layer"].append(_layer_error(outputs[best][1], kernel, bias, fits[best][1]))
        chosen["yoso_e_tau_per_layer"].append(best)
        head_taus = [CEILING_TAUS[j] for j in np.argmin(np.stack([fits[t][2] for t in CEILING_TAUS]), axis=0)]

        def mixed(side):  # each head at its own tau
            return [(np.stack([outputs[tau][side][n][0][h] for h, tau in enumerate(head_taus)]),
                     outputs[head_taus[0]][side][n][1]) for n in range(len(outputs[head_taus[0]][side]))]

        scale = _fit_scale(mixed(0), kernel)
        rows["yoso_e_tau_per_head"].append(_layer_error(mixed(1), kernel, bias, scale))
        chosen["yoso_e_tau_per_head"].append(head_taus)
        per_beta = np.stack([_head_error(exp_sum(cal, [b] * len(kernel)))[0] for b in CEILING_BETAS])
        betas = [CEILING_BETAS[j] for j in np.argmin(per_beta, axis=0)]
        chosen["beta_per_head"].append(betas)
        rows["exp_unit_qk_best_beta_sum"].append(_layer_error(exp_sum(held, betas), kernel, bias,
                                                              np.ones(len(kernel))))
        unit = lambda texts: [(ce._unit(out), soft) for out, soft in exp_sum(texts, betas)]  # noqa: E731
        rows["exp_unit_qk_best_beta_l2_out_scaled"].append(
            _layer_error(unit(held), kernel, bias, _fit_scale(unit(cal), kernel)))
        print(f"  ceiling, layer {i}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in rows.items()), flush=True)
    return {"layer_error": rows, "chosen": chosen, "taus": list(CEILING_TAUS), "betas": list(CEILING_BETAS)}


def locality(reference, ids, windows):
    """{str(w): [layers][heads]} the mean over `ids`' texts and queries of the softmax attention mass on the keys
    less than w positions from the query (the band `local_window=w` attends exactly)."""
    layers = len(reference.transformer_layers)
    weights = [ce._weights(reference.get_layer(f"transformer_layer_{i}")._self_attention_layer) for i in range(layers)]
    totals = {w: [0.0] * layers for w in windows}
    for row in ids:
        states = ce.layer_inputs(reference, row)[0]
        distance = np.abs(np.arange(len(row))[:, None] - np.arange(len(row))[None, :])
        for i in range(layers):
            x = states[i][0]
            q, k = (np.einsum("nD,Dhd->hnd", x, weights[i][f"{n}_kernel"]) + weights[i][f"{n}_bias"][:, None, :]
                    for n in ("query", "key"))
            scores = np.einsum("hnd,hmd->hnm", q, k).astype(np.float32) / np.float32(np.sqrt(q.shape[-1]))
            p = ce._softmax_rows(scores)
            for w in windows:
                totals[w][i] = totals[w][i] + (p * (distance < w)).sum(axis=-1).mean(axis=-1) / len(ids)
    for i in range(layers):
        print(f"  locality, layer {i}: " + ", ".join(f"w {w}: {np.mean(totals[w][i]):.3f}" for w in windows),
              flush=True)
    return {str(w): [[float(m) for m in totals[w][i]] for i in range(layers)] for w in windows}


# ---------------------------------------------------------------------------------------------- the run


def measure(args):
    import keras_yoso
    from keras_yoso import calibration

    backbone, held, cal, description = load(args)
    taus = list(args.hash_code_lens or calibration.DEFAULT_HASH_CODE_LENS)
    rows, layers, start = [], [], time.perf_counter()
    record = {"settings": {"num_hashes": args.num_hashes, "hash_code_len": args.hash_code_len,
                           "candidate_hash_code_lens": taus, "seed": args.seed, "batch_size": args.batch_size,
                           "calibration_texts": args.cal_texts, "held_out_texts": args.texts,
                           "transfer_steps": args.transfer_steps, "transfer_rate": args.transfer_rate,
                           "local_window": args.local_window, "calibrated": args.calibrate}}
    for length in args.lengths:
        max_length = length if length > backbone.max_sequence_length else None
        reference = ce.softmax_reference(backbone, length)
        if args.locality:
            record.setdefault("locality", {})[str(length)] = locality(reference, cal[length], args.locality)
        window = {} if args.local_window is None else {"local_window": args.local_window}
        converted = keras_yoso.replace_attention(backbone, "yoso", max_length=max_length, seed=args.seed,
                                                 num_hashes=args.num_hashes, hash_code_len=args.hash_code_len,
                                                 **window)
        models = {"converted": converted}
        began = time.perf_counter()
        if args.calibrate:
            print(f"length {length}: calibrating on {len(cal[length])} train texts", flush=True)
            models["calibrated"] = keras_yoso.calibrate(converted, backbone, _inputs(cal[length]),
                                                        hash_code_lens=taus, batch_size=args.batch_size)
        calibrate_seconds = time.perf_counter() - began
        if length in args.expectation_lengths:
            exact = keras_yoso.replace_attention(backbone, "yoso", max_length=max_length, seed=args.seed,
                                                 use_expectation=True, hash_code_len=args.hash_code_len, **window)
            print(f"length {length}: calibrating YOSO-E", flush=True)
            models["YOSO-E converted"] = exact
            models["YOSO-E calibrated"] = keras_yoso.calibrate(exact, backbone, _inputs(cal[length]),
                                                               hash_code_lens=range(2, 17),
                                                               batch_size=args.batch_size)
        if args.transfer_steps:
            transfers = [("transferred", converted, None)]
            if length in args.expectation_lengths:
                transfers += [("transferred, YOSO-E student", converted, "expectation"),
                              ("YOSO-E transferred", exact, None)]
            for name, model, student in transfers:
                began = time.perf_counter()
                print(f"length {length}: {name}", flush=True)
                models[name] = keras_yoso.transfer_attention(
                    model, backbone, _inputs(cal[length]), steps=args.transfer_steps,
                    learning_rate=args.transfer_rate, batch_size=args.batch_size, student=student)
                record.setdefault("transfer_seconds", {}).setdefault(str(length), {})[name] = (
                    time.perf_counter() - began)
        for name, ids in (("held-out", held[length]), ("calibration", cal[length])):
            errors = layer_errors(reference, models, ids)
            cos = cosines(reference, models, ids) if name == "held-out" else {m: None for m in models}
            for model in models:
                rows.append({"length": length, "model": model, "text": name,
                             "layer_error": errors[model].mean(axis=0).tolist(),
                             "layer_error_per_text": errors[model].tolist(),
                             "end_to_end_cosine": None if cos[model] is None else float(np.mean(cos[model])),
                             "end_to_end_cosine_per_text": cos[model]})
            print(f"  length {length}, {name}: measured, {time.perf_counter() - start:.0f} s", flush=True)
        if length in args.expectation_lengths:
            sweep = {f"converted, tau {tau}": keras_yoso.replace_attention(
                backbone, "yoso", max_length=max_length, seed=args.seed, num_hashes=args.num_hashes,
                hash_code_len=tau) for tau in args.sweep}
            cos = cosines(reference, sweep, held[length])
            rows += [{"length": length, "model": model, "text": "held-out", "layer_error": None,
                      "end_to_end_cosine": float(np.mean(cos[model])), "end_to_end_cosine_per_text": cos[model]}
                     for model in sweep]
        for model in ("calibrated", "YOSO-E calibrated", "transferred", "transferred, YOSO-E student",
                      "YOSO-E transferred"):
            for i in range(len(backbone.transformer_layers) if model in models else 0):
                unit = models[model].get_layer(f"transformer_layer_{i}")
                kwargs = unit.attention_kwargs
                layers.append({"length": length, "model": model, "layer": i, "hash_code_len": kwargs["hash_code_len"],
                               "output_scale": kwargs["output_scale"]})
                if kwargs.get("local_window") is not None:
                    scale = unit._self_attention_layer.local_window_scale_weight()
                    layers[-1]["local_window_scale"] = [float(g) for g in ce._numpy(scale)]
        record.setdefault("calibrate_seconds", {})[str(length)] = calibrate_seconds
    if args.ceiling:
        shortest = min(args.lengths)
        record["ceiling"] = {"length": shortest,
                             **ceiling(ce.softmax_reference(backbone, shortest), held[shortest], cal[shortest])}
    record.update({"rows": rows, "layers": layers, "seconds": time.perf_counter() - start, **description})
    return record


# ---------------------------------------------------------------------------------------------- output

CEILING_LABELS = {
    "yoso_e_tau_per_layer": "YOSO-E, best tau per layer, fitted scale (calibration without sampling noise)",
    "yoso_e_tau_per_head": "YOSO-E, best tau per head, fitted scale (a per-head temperature)",
    "exp_unit_qk_best_beta_sum": "exp(beta_h cos) / sum, best beta per head (L2-normalized q, k alone)",
    "exp_unit_qk_best_beta_l2_out_scaled": "the same, L2-normalized output, fitted scale",
}


def render(records):
    """The markdown tables of a list of records (runs of different lengths merge; each length from the last
    run that measured it): per layer before and after, the chosen taus, and the ceiling."""
    record = {"rows": [], "layers": [], "settings": records[0]["settings"]}
    for run in records:
        measured = set(run["lengths"])
        record["rows"] = [r for r in record["rows"] if r["length"] not in measured] + run["rows"]
        record["layers"] = [r for r in record["layers"] if r["length"] not in measured] + run["layers"]
        if "ceiling" in run:
            record["ceiling"] = run["ceiling"]
    lengths = sorted({row["length"] for row in record["rows"]})
    layers = len(record["rows"][0]["layer_error"])
    cols = " | ".join(f"layer {i}" for i in range(layers))
    lines = [f"| tokens | model | texts | {cols} | mean | end-to-end cosine |",
             "| ---: | --- | --- | " + " | ".join("---:" for _ in range(layers)) + " | ---: | ---: |"]
    for length in lengths:
        for text in ("held-out", "calibration"):
            for row in (r for r in record["rows"] if r["length"] == length and r["text"] == text):
                cosine = "-" if row["end_to_end_cosine"] is None else f"{row['end_to_end_cosine']:.3f}"
                errors = row["layer_error"] or [None] * layers
                lines.append(f"| {length:,} | {row['model']} | {text} | "
                             + " | ".join("-" if e is None else f"{e:.3f}" for e in errors)
                             + f" | {'-' if row['layer_error'] is None else format(np.mean(errors), '.3f')} | "
                             f"{cosine} |")
    settings = record["settings"]
    lines += ["", f"| tokens | model | {cols} |", "| ---: | --- | " + " | ".join("---" for _ in range(layers)) + " |"]
    for length, model in sorted({(r["length"], r.get("model", "calibrated")) for r in record["layers"]}):
        chosen = sorted((r for r in record["layers"]
                         if r["length"] == length and r.get("model", "calibrated") == model), key=lambda r: r["layer"])
        lines.append(f"| {length:,} | {model} | " + " | ".join(
            f"tau {r['hash_code_len']}, scale {min(r['output_scale']):.2f}-{max(r['output_scale']):.2f}"
            + (f", window {min(r['local_window_scale']):.2f}-{max(r['local_window_scale']):.2f}"
               if "local_window_scale" in r else "") for r in chosen) + " |")
    lines.append("")
    transfer = (f"; transfer_attention: {settings['transfer_steps']} steps per layer at peak rate "
                f"{settings['transfer_rate']:g}, on the calibration texts" if settings.get("transfer_steps") else "")
    window = (f", an exact local window of {settings['local_window']} (its per-head scale, 0 when converted, trained "
              "by the transfer)" if settings.get("local_window") else "")
    lines.append(f"Converted: m = {settings['num_hashes']}, tau = {settings['hash_code_len']} in every layer"
                 f"{window}, seed "
                 f"{settings['seed']}; " + (f"calibrate's candidates tau = {settings['candidate_hash_code_lens']}, "
                                            if settings.get("calibrated", True) else "not calibrated, ")
                 + f"{settings['calibration_texts']} calibration texts and {settings['held_out_texts']} held-out "
                 f"texts per length{transfer}.")
    for length, mass in sorted(records[-1].get("locality", {}).items(), key=lambda item: int(item[0])):
        lines += ["", f"| at {int(length):,} tokens, calibration texts: softmax attention within the window | {cols} |",
                  "| --- | " + " | ".join("---:" for _ in range(layers)) + " |"]
        for window, per_layer in sorted(mass.items(), key=lambda item: int(item[0])):
            lines.append(f"| \\|i - j\\| < {window}: mean, [min, max] over heads | " + " | ".join(
                f"{np.mean(h):.3f} [{min(h):.2f}, {max(h):.2f}]" for h in per_layer) + " |")
    if "ceiling" in record:
        ceiling_record = record["ceiling"]
        lines += ["", f"| at {ceiling_record['length']:,} tokens, held-out texts | {cols} | mean |",
                  "| --- | " + " | ".join("---:" for _ in range(layers)) + " | ---: |"]
        for key, label in CEILING_LABELS.items():
            values = ceiling_record["layer_error"][key]
            lines.append(f"| {label} | " + " | ".join(f"{e:.3f}" for e in values) + f" | {np.mean(values):.3f} |")
        lines.append("")
        lines.append("Best YOSO-E tau per layer: " + ", ".join(
            str(t) for t in ceiling_record["chosen"]["yoso_e_tau_per_layer"]) + "; per head: "
            + "; ".join(f"layer {i}: " + ",".join(str(t) for t in taus)
                        for i, taus in enumerate(ceiling_record["chosen"]["yoso_e_tau_per_head"])) + ".")
    return "\n".join(lines)


SUMMARY_MODELS = ("converted", "calibrated", "transferred")


def summary(records):
    """The README's conversion summary from a list of records: per length, the held-out mean layer error and
    embedding cosine of the converted, calibrated and transferred models."""
    rows = {(r["length"], r["model"]): r for run in records for r in run["rows"] if r["text"] == "held-out"}
    lengths = sorted({length for length, _ in rows})
    cell = lambda length, value: " / ".join(value(rows[length, m]) for m in SUMMARY_MODELS)  # noqa: E731
    return "\n".join([
        "| " + " / ".join(SUMMARY_MODELS) + " | " + " | ".join(f"{n:,} tokens" for n in lengths) + " |",
        "| --- | " + " | ".join("---:" for _ in lengths) + " |",
        "| mean layer error against the softmax layer | " + " | ".join(
            cell(n, lambda r: f"{np.mean(r['layer_error']):.3f}") for n in lengths) + " |",
        "| sentence-embedding cosine to the original | " + " | ".join(
            cell(n, lambda r: f"{r['end_to_end_cosine']:.3f}") for n in lengths) + " |"])


def runs(records, length):
    """One row per run of `records` that measured `length` tokens: its seed (texts and hash functions), its
    calibration texts and transfer steps per layer, and the held-out mean layer error and embedding cosine of
    its converted, calibrated and transferred models ("-" for a model the run did not make)."""
    lines = ["| seed | calibration texts | transfer steps per layer | local window | mean layer error, "
             + " / ".join(SUMMARY_MODELS) + " | embedding cosine, " + " / ".join(SUMMARY_MODELS) + " | date |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for run in records:
        if length not in run["lengths"]:
            continue
        rows = {r["model"]: r for r in run["rows"] if r["length"] == length and r["text"] == "held-out"}
        value = lambda key, fmt: " / ".join(  # noqa: E731
            fmt(rows[m][key]) if m in rows else "-" for m in SUMMARY_MODELS)
        settings = run["settings"]
        lines.append(f"| {settings['seed']} | {settings['calibration_texts']} | "
                     f"{settings.get('transfer_steps') or '-'} | {settings.get('local_window') or '-'} | "
                     f"{value('layer_error', lambda e: format(np.mean(e), '.3f'))} | "
                     f"{value('end_to_end_cosine', lambda c: format(c, '.3f'))} | {run['date'][:10]} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render:
        records = []
        for name in args.render:
            with open(name, encoding="utf-8") as f:
                records += json.load(f)
        if args.runs is not None:
            print(runs(records, args.runs))
        else:
            print(summary(records) if args.summary else render(records))
        return

    load_before = os.getloadavg()
    record = measure(args)
    record.update(ce.run_fields(args, argv, load_before, args.machine_note))
    print(render([record]))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "calibration.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    if args.record:
        ce.append_record(args.record, record)
    print(f"wrote {args.out_dir}/calibration.json" + (f", appended to {args.record}" if args.record else ""))


if __name__ == "__main__":
    main()
