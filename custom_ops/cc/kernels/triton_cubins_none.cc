// The cubin table of a native library built without the Triton kernels (setup.py compiles this
// file unless KERAS_YOSO_TRITON_CUBINS names an AOT build, whose table custom_ops/triton/embed.py
// writes instead). The launch plans still build (ky_device_launch_plan); RunTritonPlan is never
// reached, since TritonCubinsEmbedded() is false.
#include "triton_launch.h"

namespace keras_yoso {

const TritonCubin kTritonCubins[1] = {{"", 0, "", nullptr, 0, 0}};
const int kTritonCubinCount = 0;

}  // namespace keras_yoso
