// Control probe (tests/layering/CMakeLists.txt): core may include the kernel API and its own headers.
#include "core/kcp/rank_driver.h"
#include "kernels/api/backend.h"
