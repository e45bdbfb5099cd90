// `mpi` communicator: one process per rank over MPI_COMM_WORLD, host buffers. Built only when
// KCP_ENABLE_MPI; mpi_launched() tells whether this process was started by mpirun with more
// than one rank (then the app uses MPI, otherwise the threaded local world).
#pragma once

#include <memory>

#include "core/comm/communicator.h"

namespace kcp {

bool mpi_available();                    // built with MPI
bool mpi_launched();                     // started under mpirun/srun (environment says so)
void mpi_init(int* argc, char*** argv);  // no-op without MPI
void mpi_finalize();
void mpi_abort(int code);  // MPI_Abort on COMM_WORLD so no rank hangs (main only)
int mpi_world_rank();
int local_rank();  // rank on this host from the launcher's environment (0 without one)
int mpi_world_size();
std::unique_ptr<Communicator> make_mpi_communicator();  // throws ConfigError without MPI

}  // namespace kcp
