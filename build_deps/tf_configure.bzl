"""Repository rule exposing the installed TensorFlow's headers and framework library to Bazel.

Everything comes from `tf.sysconfig` of the Python named by PYTHON_BIN_PATH
(default python3), exactly as setup.py uses it: the include directory, the compile
flags (ABI and C++ standard are TensorFlow's own, never hard-coded here) and the
link flags (`-L<dir> -l:libtensorflow_framework.so.2`). Nothing is downloaded.

The generated @local_config_tf repository has
  //:tf_header_lib            the headers (as -isystem <tf include dir>)
  //:libtensorflow_framework  the framework library named by the link flags
  //:copts.bzl                TF_COPTS (compile flags minus -I), TF_VERSION
"""

_SCRIPT = """
import tensorflow as tf
s = tf.sysconfig
print("version=" + tf.__version__)
print("include=" + s.get_include())
for f in s.get_compile_flags():
    print("copt=" + f)
for f in s.get_link_flags():
    print("linkopt=" + f)
"""

def _tf_configure_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    result = ctx.execute(
        [python, "-c", _SCRIPT],
        environment = {"TF_CPP_MIN_LOG_LEVEL": "3"},
        quiet = True,
    )
    if result.return_code != 0:
        fail("tf_configure: could not import tensorflow with PYTHON_BIN_PATH=%s (set PYTHON_BIN_PATH " % python +
             "to a Python that has TensorFlow):\n%s" % result.stderr)
    values = {"version": [], "include": [], "copt": [], "linkopt": []}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in values:
            values[key].append(value)
    if len(values["include"]) != 1 or len(values["version"]) != 1:
        fail("tf_configure: unexpected output of %s:\n%s" % (python, result.stdout))

    copts = [f for f in values["copt"] if not f.startswith("-I")]
    lib_dirs = [f[2:] for f in values["linkopt"] if f.startswith("-L")]
    lib_names = [f[3:] for f in values["linkopt"] if f.startswith("-l:")]
    lib_names += ["lib%s.so" % f[2:] for f in values["linkopt"] if f.startswith("-l") and not f.startswith("-l:")]
    if len(lib_dirs) != 1 or len(lib_names) != 1:
        fail("tf_configure: expected one -L and one -l in tf.sysconfig.get_link_flags(), got %s" % values["linkopt"])
    lib = ctx.path(lib_dirs[0] + "/" + lib_names[0])
    if not lib.exists:
        fail("tf_configure: %s does not exist" % lib)

    ctx.symlink(values["include"][0], "include")
    ctx.symlink(lib, lib_names[0])
    ctx.file("copts.bzl", "TF_VERSION = %r\nTF_COPTS = %r\n" % (values["version"][0], copts))
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

exports_files(["copts.bzl"])

cc_library(
    name = "tf_header_lib",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "libtensorflow_framework",
    srcs = [%r],
)
""" % lib_names[0])

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
