"""Writes a copy of a Hugging Face BERT checkpoint small enough to carry to the GPU machine.

The device machine has no network and takes at most 64 MiB of carried files (the native library and
the wheels of tests/gpu/carry_wheels.sh included), and all-MiniLM-L6-v2's model.safetensors is 87 MiB
in float32. This copy keeps only the wordpieces the task's texts use (the word-embedding rows of the
others are dropped, every other tensor is kept whole) and rounds the float32 tensors to --dtype
(float16 by default; all-MiniLM-L6-v2 for the built-in task: 21 MiB). Every mode of
examples/convert_pretrained.py reads the copy as it reads the original, so a comparison run on it is
fair among its modes; the rounding changes each weight by at most 2^-11 of itself.

    python tests/gpu/carry_checkpoint.py --pretrained /tmp/all-MiniLM-L6-v2 --out .ckpt/minilm-tags
    python tests/gpu/carry_checkpoint.py --pretrained /tmp/all-MiniLM-L6-v2 --data-dir ../shared/data/imdb \
        --out .ckpt/minilm-imdb

Texts: the built-in task's words (examples/long_range_data.py: every document it can generate is made
of them), or with --data-dir every review of the IMDB train and test splits there. The copy's vocab.txt
lists the kept wordpieces in their original order, so [PAD] keeps id 0. Both checkpoints' tokenizers are
read as examples/convert_pretrained.py reads them (`load_wordpiece_tokenizer`), and before anything is
written the copy's must give every text the original's ids renumbered: a text the copy would tokenize
differently raises ValueError and nothing is written. --out gets config.json (vocab_size
updated), vocab.txt, tokenizer_config.json, special_tokens_map.json, model.safetensors and
carry_checkpoint.json (the source, its model.safetensors' SHA-256, the dtype, the texts, kept and
original vocabulary sizes). --out is created, or must be empty or a copy this script wrote before.

Ignored by git: the folder .ckpt/ is added to .git/info/exclude when --out is inside it. Needs what
examples/convert_pretrained.py needs (keras_yoso importable, `tokenizers`, `safetensors`): it imports that
script's tokenizer loader.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))  # the examples are scripts, not a package
MANIFEST = "carry_checkpoint.json"
WORD_EMBEDDINGS = "word_embeddings.weight"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
DTYPES = {"float16": np.float16, "float32": np.float32}


def task_texts(data_dir):
    """(description, texts): the built-in task's words, or every IMDB review under `data_dir`."""
    if data_dir is None:
        import long_range_data

        return "the built-in task's words (examples/long_range_data.py VOCABULARY)", [
            " ".join(long_range_data.VOCABULARY)]
    from imdb_data import load_imdb

    train, test = load_imdb(data_dir)
    return f"every review of the IMDB train and test splits in {data_dir}", list(train.texts) + list(test.texts)


def _encode(tokenizer, texts):
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return [np.asarray(encoding.ids, np.int64) for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]


def kept_ids(vocabulary, encoded):
    """Sorted ids of the special tokens and of every wordpiece in `encoded` (the texts' ids) in `vocabulary`
    ({token: id})."""
    missing = [token for token in SPECIAL_TOKENS if token not in vocabulary]
    if missing:
        raise ValueError(f"the checkpoint's vocabulary lacks the special tokens {missing} (expected BERT's "
                         f"{list(SPECIAL_TOKENS)})")
    used = {vocabulary[token] for token in SPECIAL_TOKENS}
    for ids in encoded:
        used.update(ids.tolist())
    return np.array(sorted(used), np.int64)


def shrink_tensors(tensors, keep, vocab_size, dtype):
    """{name: array}: the word-embedding rows `keep` (one tensor named *word_embeddings.weight of
    [vocab_size, hidden]), every tensor cast from float32 to `dtype`. Raises ValueError for another
    tensor with a vocab_size axis (an output head this copy would get wrong) or a value `dtype` cannot hold."""
    embedding_names = [name for name in tensors if name.endswith(WORD_EMBEDDINGS)]
    if len(embedding_names) != 1:
        raise ValueError(f"expected one tensor named *{WORD_EMBEDDINGS} in model.safetensors; found {embedding_names}")
    (embedding_name,) = embedding_names
    if tensors[embedding_name].shape[0] != vocab_size:
        raise ValueError(f"{embedding_name} has {tensors[embedding_name].shape[0]} rows; config.json's vocab_size "
                         f"is {vocab_size}")
    others = [f"{name} {tuple(array.shape)}" for name, array in tensors.items()
              if name != embedding_name and vocab_size in array.shape]
    if others:
        raise ValueError(f"tensors other than {embedding_name} have an axis of the vocabulary's size {vocab_size} "
                         f"(an output head?): {others}; this script prunes only the word embeddings")
    out = {}
    for name, array in tensors.items():
        if name == embedding_name:
            array = array[keep]
        if array.dtype == np.float32:
            with np.errstate(over="ignore"):  # a value too large is refused just below
                cast = array.astype(dtype)
            if not np.all(np.isfinite(cast)):
                raise ValueError(f"{name}: a value of magnitude {np.max(np.abs(array)):.4g} does not fit "
                                 f"{dtype.__name__}")
            array = cast
        out[name] = np.ascontiguousarray(array)
    return out


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _prepare_out(out):
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise ValueError(f"--out {out} exists and is not a folder")
        if os.listdir(out) and not os.path.exists(os.path.join(out, MANIFEST)):
            raise ValueError(f"--out {out} is a non-empty folder that this script did not write (no {MANIFEST}); "
                             f"give an empty or new folder")
    ckpt = os.path.join(ROOT, ".ckpt")
    if os.path.commonpath([os.path.abspath(out), ckpt]) == ckpt and os.path.isdir(os.path.join(ROOT, ".git")):
        exclude = os.path.join(ROOT, ".git", "info", "exclude")
        os.makedirs(os.path.dirname(exclude), exist_ok=True)
        lines = open(exclude).read().splitlines() if os.path.exists(exclude) else []
        if "/.ckpt/" not in lines:
            with open(exclude, "a") as f:
                f.write("/.ckpt/\n")


def shrink(pretrained, out, data_dir=None, dtype="float16"):
    """Writes the copy (see the module docstring) and returns its manifest."""
    from convert_pretrained import load_wordpiece_tokenizer
    from safetensors.numpy import load_file, save_file

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}; got {dtype!r}")
    for name in ("config.json", "model.safetensors"):
        if not os.path.exists(os.path.join(pretrained, name)):
            raise ValueError(f"--pretrained {pretrained}: expected {name} there (a Hugging Face BERT checkpoint)")
    _prepare_out(out)
    with open(os.path.join(pretrained, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    description, texts = task_texts(data_dir)
    tokenizer = load_wordpiece_tokenizer(pretrained)
    encoded = _encode(tokenizer, texts)
    keep = kept_ids(tokenizer.get_vocab(), encoded)
    tensors = shrink_tensors(load_file(os.path.join(pretrained, "model.safetensors")), keep, config["vocab_size"],
                             DTYPES[dtype])

    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    staging = out.rstrip("/") + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    with open(os.path.join(staging, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(by_id[int(index)] + "\n" for index in keep))
    _copy_tokenizer_config(pretrained, staging)
    _check_same_tokens(encoded, load_wordpiece_tokenizer(staging), keep, texts)
    save_file(tensors, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(staging, "config.json"), "w", encoding="utf-8") as f:
        json.dump(dict(config, vocab_size=int(len(keep))), f, indent=2)
    with open(os.path.join(staging, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                   "mask_token": "[MASK]"}, f)
    manifest = {"source": os.path.abspath(pretrained),
                "source_safetensors_sha256": _sha256(os.path.join(pretrained, "model.safetensors")),
                "dtype": dtype, "texts": description, "text_count": len(texts),
                "vocab_size": int(len(keep)), "source_vocab_size": int(config["vocab_size"]),
                "bytes": sum(os.path.getsize(os.path.join(staging, name)) for name in os.listdir(staging))}
    with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging, out)
    return manifest


def _copy_tokenizer_config(pretrained, staging):
    """The source's tokenizer_config.json (its do_lower_case, which the copy's vocab.txt is read with), or one
    that lower-cases where the source has none (it read tokenizer.json; _check_same_tokens then decides)."""
    source = os.path.join(pretrained, "tokenizer_config.json")
    if os.path.exists(source):
        shutil.copyfile(source, os.path.join(staging, "tokenizer_config.json"))
    else:
        with open(os.path.join(staging, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)


def _check_same_tokens(encoded, copy, keep, texts):
    """The copy's tokenizer must give every text the original ids (`encoded`) renumbered."""
    renumber = np.full(int(keep[-1]) + 1, -1, np.int64)
    renumber[keep] = np.arange(len(keep))
    for index, (before, after) in enumerate(zip(encoded, _encode(copy, texts))):
        if not np.array_equal(renumber[before], after):
            raise ValueError(f"text {index} tokenizes differently in the copy ({len(after)} wordpieces against "
                             f"{len(before)}); the source tokenizer's normalisation is not BERT's, so this script "
                             f"cannot prune it")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", required=True, help="a Hugging Face BERT checkpoint folder")
    parser.add_argument("--out", required=True, help="the folder to write (new, empty, or written by this script)")
    parser.add_argument("--data-dir", help="IMDB reviews (examples/imdb_data.py's layouts); default: the built-in task")
    parser.add_argument("--dtype", default="float16", choices=sorted(DTYPES))
    args = parser.parse_args(argv)
    try:
        manifest = shrink(args.pretrained, args.out, args.data_dir, args.dtype)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {args.out}: {manifest['bytes'] / 2 ** 20:.1f} MiB, {manifest['vocab_size']:,} of "
          f"{manifest['source_vocab_size']:,} wordpieces, {manifest['dtype']} ({manifest['texts']})")


if __name__ == "__main__":
    main()
