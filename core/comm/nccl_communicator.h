// `nccl` communicator: one GPU per rank (docs/design.md 7). The unique id goes from rank 0 to the
// others over the host communicator (MPI under mpirun; a one-rank world needs none), the KCP
// summaries are all-gathered in device memory by NCCL, and the small host collectives (metrics,
// verdicts, barriers) stay on the host communicator. NVLink multicast (NVLS) stays off: the
// launcher sets NCCL_NVLS_ENABLE=0 unless the user set it.
#pragma once

#include <memory>

#include "core/comm/communicator.h"

namespace kcp {

bool nccl_available();  // built with NCCL
// `host` carries the host collectives and decides rank and size; `device` is this rank's GPU.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int device);

}  // namespace kcp
