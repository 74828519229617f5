"""A compile cache for setup.py (KERAS_YOSO_COMPILE_CACHE=DIR): an object file that the same compile
command already made from the same files is copied from DIR instead of compiled again.

CI builds the libraries twice from one checkout (the README's `pip install ".[test]"`, then the
wheel, from a copy in another folder and in another isolated build environment); with one DIR for
both, the second build compiles nothing. A developer's rebuilds after editing one file recompile
only the sources that read it.

The key of a command (`COMPILER ... -c SRC -o OBJ ...`, g++ or nvcc) is a SHA-256 of
- its arguments, without `-o OBJ` and nvcc's `--threads N`, with every absolute path written as
  `<path>` (the checkout and pip's build environment live in a different folder each build);
- the compiler: its resolved path and what `COMPILER --version` prints;
- the environment variables that change what g++ or nvcc read or emit (CPATH, NVCC_APPEND_FLAGS, ...);
- the contents, in order, of every file the compiler reads: the list `COMPILER ... -M` prints
  (system headers included, so a new TensorFlow, jaxlib or CUDA is a new key).
Where the list cannot be had (the `-M` run fails), the command compiles as if there were no cache.
"""

import hashlib
import os
import re
import shutil
import subprocess

# Environment variables that g++ or nvcc read: a different value may make a different object.
COMPILER_ENVIRONMENT = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH",
                        "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
# An argument that is an absolute path, or an include or library folder given by one.
_ABSOLUTE_PATH = re.compile(r"^(-I|-isystem|-L|)/.*$")
_versions = {}
_digests = {}


def _file_digest(path):
    if path not in _digests:
        with open(path, "rb") as handle:
            _digests[path] = hashlib.sha256(handle.read()).hexdigest()
    return _digests[path]


def _compiler_identity(program):
    if program not in _versions:
        resolved = shutil.which(program) or program
        version = subprocess.run([resolved, "--version"], capture_output=True, text=True, check=True).stdout
        _versions[program] = f"{os.path.realpath(resolved)}\n{version}"
    return _versions[program]


def _without(args, flag, values):
    """`args` without each `flag` and the `values` arguments that follow it."""
    kept, skip = [], 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg == flag:
            skip = values
        else:
            kept.append(arg)
    return kept


def _dependencies(args, cwd):
    """The files the compile `args` reads, in the order of the compiler's `-M` list."""
    listing = subprocess.run(_without(args, "-c", 0) + ["-M"], cwd=cwd, capture_output=True, text=True, check=True)
    _, _, files = listing.stdout.replace("\\\n", " ").partition(":")
    return [os.path.join(cwd, path) for path in files.split()]


def object_key(cmd, cwd):
    """The cache key (hex SHA-256) of the compile command `cmd` run in `cwd`; raises
    subprocess.CalledProcessError or OSError when the compiler cannot list what it reads."""
    args = _without(_without(cmd, "-o", 1), "--threads", 1)
    digest = hashlib.sha256()
    for part in ([_ABSOLUTE_PATH.sub(r"\1<path>", arg) for arg in args] + [_compiler_identity(args[0])]
                 + [f"{name}={os.environ.get(name)}" for name in COMPILER_ENVIRONMENT]
                 + [_file_digest(path) for path in _dependencies(args, cwd)]):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def compile_object(cmd, cwd, cache_dir, run, say):
    """Makes the object file of the compile command `cmd` (its `-o` argument): copied from `cache_dir`
    when the cache holds it under the command's key, otherwise `run(cmd)` compiles it and the cache
    keeps a copy. Returns what `run` returned, or 0.0 for an object taken from the cache."""
    obj = os.path.join(cwd, cmd[cmd.index("-o") + 1])
    try:
        cached = os.path.join(cache_dir, object_key(cmd, cwd) + ".o")
    except (OSError, subprocess.CalledProcessError) as error:
        say(f"compile cache: cannot list the files {cmd[0]} reads ({error}); compiling {obj}")
        return run(cmd)
    if os.path.isfile(cached):
        shutil.copyfile(cached, obj)
        say(f"compile cache: {os.path.basename(obj)} taken from {cached}")
        return 0.0
    seconds = run(cmd)
    os.makedirs(cache_dir, exist_ok=True)
    partial = f"{cached}.{os.getpid()}.partial"
    shutil.copyfile(obj, partial)
    os.replace(partial, cached)  # another build reading the cache sees the whole object or none
    return seconds
