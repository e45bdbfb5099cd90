#include "gpu_harness.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

namespace kcp::test {

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

namespace {
// The regions of present tensors (a saved kind without W, U, ... has null ones).
std::vector<Region16> present(std::vector<Region16> r) {
  std::vector<Region16> out;
  for (const Region16& x : r)
    if (x.t) out.push_back(x);
  return out;
}
}  // namespace

std::vector<Region16> cuda_16bit_tensors(const kk::WorkspaceTensors& w, const kk::Problem& p, const kk::LayoutView& L) {
  const int64_t T = L.T, NT = L.n_chunks, HV = p.HV, K = p.K, V = p.V;
  return present({{"W", w.W, T * HV * K},
                  {"U", w.U, T * HV * V},
                  {"kg", w.kg, T * HV * K},
                  {"h", w.h, NT * HV * K * V},
                  {"v_new", w.v_new, T * HV * V},
                  {"dh", w.dh, NT * HV * K * V},
                  {"dv2", w.dv2, T * HV * V},
                  {"dv_local", w.dv_local, T * HV * V}});
}
std::vector<Region16> cuda_16bit_tensors(const kk::SavedTensors& s, const kk::Problem& p, const kk::LayoutView& L) {
  const int64_t T = L.T, HV = p.HV, K = p.K, V = p.V;
  return present({{"q", s.q, T * p.H * K},
                  {"k", s.k, T * p.H * K},
                  {"Phi", s.Phi, T * HV * p.chunk},
                  {"W", s.W, T * HV * K},
                  {"U", s.U, T * HV * V},
                  {"kg", s.kg, T * HV * K}});
}

Diff diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) throw std::runtime_error("diff: size mismatch");
  Diff d;
  double se = 0.0, sb = 0.0, me = 0.0, mb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) && std::isfinite(b[i])) {
      ++d.bad;
      continue;
    }
    if (!std::isfinite(b[i])) continue;
    const double e = double(a[i]) - double(b[i]);
    se += e * e;
    sb += double(b[i]) * b[i];
    me = std::max(me, std::fabs(e));
    mb = std::max(mb, std::fabs(double(b[i])));
  }
  if (d.bad > 0) {
    d.rel_rms = d.rel_max = std::numeric_limits<double>::infinity();
    return d;
  }
  d.rel_rms = sb > 0 ? std::sqrt(se / sb) : std::sqrt(se);
  d.rel_max = mb > 0 ? me / mb : me;
  return d;
}

int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
  return -1;
}

double unit_roundoff(const Case& c) { return c.dtype == kk::DType::BF16 ? 1.0 / 256.0 : 1.0 / 2048.0; }

}  // namespace kcp::test
