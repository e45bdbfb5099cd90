// Probe (tests/layering/CMakeLists.txt): with kcp_core's include roots this include must fail.
#include "kernels/cpu/cpu_backend.h"
