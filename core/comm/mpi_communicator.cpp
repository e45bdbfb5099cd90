// MPI back-end. Reductions go through an allgather and a rank-ordered sum, not MPI_Allreduce,
// so the bits equal the local communicator's (MPI's reduction order is implementation-defined).
#include "core/comm/mpi_communicator.h"

#include <cstdlib>
#include <vector>

#include "core/util/error.h"
#include "kcp/config.h"

#if KCP_ENABLE_MPI
#include <mpi.h>
#define KCP_MPI_CHECK(expr)                                                                   \
  do {                                                                                        \
    int rc_ = (expr);                                                                         \
    if (rc_ != MPI_SUCCESS) {                                                                 \
      char buf_[MPI_MAX_ERROR_STRING];                                                        \
      int len_ = 0;                                                                           \
      MPI_Error_string(rc_, buf_, &len_);                                                     \
      ::kcp::raise_api_error("MPI", #expr, rc_, std::string(buf_, len_), __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)
#endif

namespace kcp {

bool mpi_available() { return KCP_ENABLE_MPI != 0; }

bool mpi_launched() {
  // Open MPI, MPICH/Hydra, PMIx and Slurm each export one of these to every rank they start.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_NUM_TASKS"})
    if (std::getenv(v)) return true;
  return false;
}

int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

#if KCP_ENABLE_MPI
namespace {
bool g_inited = false;

class MpiCommunicator final : public Communicator {
 public:
  int rank() const override { return mpi_world_rank(); }
  int size() const override { return mpi_world_size(); }
  std::string name() const override { return "mpi"; }
  void allgather(const float* s, float* r, size_t n) override {
    KCP_MPI_CHECK(MPI_Allgather(s, static_cast<int>(n), MPI_FLOAT, r, static_cast<int>(n), MPI_FLOAT, MPI_COMM_WORLD));
  }
  void allgather(const double* s, double* r, size_t n) override {
    KCP_MPI_CHECK(
        MPI_Allgather(s, static_cast<int>(n), MPI_DOUBLE, r, static_cast<int>(n), MPI_DOUBLE, MPI_COMM_WORLD));
  }
  void allreduce(double* b, size_t n, ReduceOp op) override { reduce(b, n, op, MPI_DOUBLE); }
  void allreduce(int64_t* b, size_t n, ReduceOp op) override { reduce(b, n, op, MPI_INT64_T); }
  void broadcast(void* buf, size_t bytes, int root) override {
    KCP_MPI_CHECK(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD));
  }
  void barrier() override { KCP_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

 private:
  template <class T>
  void reduce(T* b, size_t n, ReduceOp op, MPI_Datatype type) {
    const int W = size();
    std::vector<T> all(n * W);
    KCP_MPI_CHECK(MPI_Allgather(b, static_cast<int>(n), type, all.data(), static_cast<int>(n), type, MPI_COMM_WORLD));
    for (size_t i = 0; i < n; ++i) {
      T acc = all[i];
      for (int r = 1; r < W; ++r) {
        const T x = all[r * n + i];
        acc = op == ReduceOp::Sum ? acc + x : op == ReduceOp::Max ? std::max(acc, x) : std::min(acc, x);
      }
      b[i] = acc;
    }
  }
};
}  // namespace

void mpi_init(int* argc, char*** argv) {
  int provided = 0;
  KCP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  g_inited = true;
  set_thread_rank(mpi_world_rank(), mpi_world_size());
}
void mpi_finalize() {
  if (g_inited) MPI_Finalize();
  g_inited = false;
}
void mpi_abort(int code) {
  if (g_inited) MPI_Abort(MPI_COMM_WORLD, code);
}
int mpi_world_rank() {
  int r = 0;
  if (g_inited) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int mpi_world_size() {
  int s = 1;
  if (g_inited) MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
std::unique_ptr<Communicator> make_mpi_communicator() {
  KCP_CHECK(g_inited, "MPI is not initialised");
  return std::make_unique<MpiCommunicator>();
}
#else
void mpi_init(int*, char***) {}
void mpi_finalize() {}
void mpi_abort(int) {}
int mpi_world_rank() { return 0; }
int mpi_world_size() { return 1; }
std::unique_ptr<Communicator> make_mpi_communicator() {
  KCP_THROW(ConfigError, "--comm mpi: this kcpbench was built without MPI (KCP_ENABLE_MPI=OFF)");
}
#endif

}  // namespace kcp
