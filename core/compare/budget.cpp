#include "core/compare/budget.h"

#include <cmath>

#include <fmt/format.h>

namespace kcp {

double unit_roundoff(DType dt) { return dt == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

double twin_rel_rms_limit(const std::string& t) {
  if (t == "o" || t == "ht" || t == "h_entry") return 5e-3;
  if (t == "dq" || t == "dk" || t == "dv" || t == "dh0" || t == "dh_exit") return 8e-3;
  return 2e-2;  // dg, dbeta, dA_log, ddt_bias
}

double round_up_4(double x) {
  if (!(x > 0) || !std::isfinite(x)) return x;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(x)));
  return std::ceil(x * scale - 1e-9) / scale;
}

Budget derive_budget(double max_abs, double rel_rms, double ref_max_abs, double k, DType dt) {
  const double u = unit_roundoff(dt);
  return {round_up_4(k * max_abs + u * ref_max_abs), round_up_4(k * rel_rms + u)};
}

std::string budget_formula(double k, DType dt) {
  return fmt::format(
      "kcpbench calibrate: max_abs = {} x err(cpu twin vs FP64) + u x max|ref|, rel_rms = {} x "
      "rel(cpu twin vs FP64) + u, u = {} ({} unit roundoff); det/full at the planned schedule",
      k, k, unit_roundoff(dt), to_string(dt));
}

}  // namespace kcp
