#include "core/comm/communicator.h"

#include "core/util/error.h"

namespace kcp {

void Communicator::allgather_device(const float*, float*, size_t, void*) {
  KCP_THROW(InvariantError, "the {} communicator has no device all-gather", name());
}

}  // namespace kcp
