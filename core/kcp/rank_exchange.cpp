// Rank-level folds over the gathered summaries (see rank_exchange.h).
#include "core/kcp/rank_exchange.h"

#include <stdexcept>
#include <string>

namespace kcp {

namespace {

// X <- A_q X + b_q over n blocks starting at rank `first`, stepping by `step` ranks (+1 forward,
// -1 backward). The backward blocks already hold M^T, so neither direction transposes.
void fold_chain(const kernels::Backend& be, const kernels::Exec& exec, const kernels::Problem& p, const float* gathered,
                int first, int n, int step, const float* x0, float* x_final) {
  if (n < 1) throw std::invalid_argument("kcp: rank fold over " + std::to_string(n) + " ranks (needs >= 1)");
  const SummaryBlock blk = summary_block(p);
  kernels::FoldArgs fa;
  fa.exec = exec;
  fa.HV = p.HV;
  fa.K = p.K;
  fa.V = p.V;
  fa.n = n;
  const float* block = gathered + first * blk.floats();
  fa.A = block;
  fa.A_stride = step * blk.floats();
  fa.b = block + blk.A;
  fa.b_stride = step * blk.floats();
  fa.x0 = x0;
  fa.x_final = x_final;
  be.fold(fa);
}

}  // namespace

SummaryBlock summary_block(const kernels::Problem& p) { return {int64_t(p.HV) * p.K * p.K, int64_t(p.HV) * p.K * p.V}; }

void fold_earlier_ranks(const kernels::Backend& be, const kernels::Exec& exec, const kernels::Problem& p,
                        const float* gathered, int r, int pre_ranks, const float* x0, float* incoming) {
  fold_chain(be, exec, p, gathered, r - pre_ranks, pre_ranks, +1, x0, incoming);
}

void fold_later_ranks(const kernels::Backend& be, const kernels::Exec& exec, const kernels::Problem& p,
                      const float* gathered, int r, int post_ranks, const float* y0, float* exit_grad) {
  fold_chain(be, exec, p, gathered, r + post_ranks, post_ranks, -1, y0, exit_grad);
}

}  // namespace kcp
