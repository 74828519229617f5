"""Repository rule exposing the installed TensorFlow's headers and framework library to Bazel.

Everything comes from `tf.sysconfig` of the Python named by PYTHON_BIN_PATH
(default python3), so the ABI and C++ standard flags are TensorFlow's own.
"""

def _tf_configure_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    script = "; ".join([
        "import tensorflow as tf",
        "print(tf.sysconfig.get_include())",
        "print(tf.sysconfig.get_lib())",
        "print(' '.join(f for f in tf.sysconfig.get_compile_flags() if not f.startswith('-I')))",
    ])
    result = ctx.execute([python, "-c", script], environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
    if result.return_code != 0:
        fail("could not import tensorflow with %s: %s" % (python, result.stderr))
    lines = [line for line in result.stdout.strip().split("\n") if line]
    include_dir, lib_dir, copts = lines[-3], lines[-2], lines[-1]
    ctx.symlink(include_dir, "include")
    ctx.symlink(lib_dir + "/libtensorflow_framework.so.2", "libtensorflow_framework.so.2")
    ctx.file("copts.bzl", "TF_COPTS = %s\n" % repr(copts.split(" ")))
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "tf_header_lib",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "libtensorflow_framework",
    srcs = ["libtensorflow_framework.so.2"],
)
""")

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
