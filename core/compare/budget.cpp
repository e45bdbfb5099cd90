#include "core/compare/budget.h"

#include <cmath>

#include <fmt/format.h>

namespace kcp {

double unit_roundoff(DType dt) { return dt == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

double round_up_4(double x) {
  if (!(x > 0) || !std::isfinite(x)) return x;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(x)));
  return std::ceil(x * scale - 1e-9) / scale;
}

Budget derive_budget(double worst_max_rel, double worst_rel_rms, double k, DType dt) {
  const double u = unit_roundoff(dt);
  return Budget::of_scale(round_up_4(k * worst_max_rel + u), round_up_4(k * worst_rel_rms + u));
}

std::string budget_formula(double k, DType dt) {
  return fmt::format(
      "kcpbench calibrate: max_rel = {} x max over seeds of max|err| / scale (cpu twin vs FP64) + u, rel_rms = {} x "
      "max over seeds of rel-RMS (cpu twin vs FP64) + u, u = {} ({} unit roundoff); scale = max|ref|, for dA_log / "
      "ddt_bias the sum of absolute per-token contributions; det/full at the planned schedule",
      k, k, unit_roundoff(dt), to_string(dt));
}

}  // namespace kcp
