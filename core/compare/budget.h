// Budget derivation (docs/design.md 6), used by `kcpbench calibrate`. Over the calibration seeds
// s (8 by default), with the CPU twin's error against FP64 measured relative to each run's own
// scale (max|ref|; for dA_log / ddt_bias the largest cancellation-aware scale):
//   max_rel = k x max_s max_rel_s + u        (max |err| / scale allowed)
//   rel_rms = k x max_s rel_rms_s + u
// with u the unit roundoff of the input dtype (bf16 2^-8, fp16 2^-11) and k = 2 by default
// ("within 2x of the reference implementation"). Values are rounded up to 4 significant digits,
// so the stored number is never tighter than the formula. A budget so expressed means the same at
// every seed: the judged run's errors are divided by its own scale.
//
// So that a wrong twin cannot widen its own budgets, calibrate first holds the twin to limits:
//  * the exact-storage twin (the same algorithm with every 16-bit storage point kept in fp32,
//    kernels/cpu CpuStorage::Exact) against FP64: rel_rms and max_rel <= kExactTwinLimit per
//    tensor, at every seed. A bug of the algorithm (a wrong mask, gate, fold, inverse) gives
//    errors of order 1e-2 to 1 here; fp32 arithmetic stays below 2.4e-5 on the int1 rows, except
//    rows with -1000 gates (F1, KF1: up to 6.9e-4 over seeds 1-8, the fp32 chunk cumsum across
//    a -1000 step loses the small gates after it, on the GPU alike);
//  * the rounded twin (the one that sets the budgets): rel_rms <= kRoundedTwinUnits x u (int1 over
//    seeds 1-8: at most 1.55 u, bf16 and fp16, K = 64 and 128, long memory included), so a twin
//    that rounds where the GPU does not (a 16-bit state or chain) is refused too.
#pragma once

#include <string>
#include <vector>

#include "core/config/row_config.h"

namespace kcp {

inline constexpr double kExactTwinLimit = 2e-3;
inline constexpr double kRoundedTwinUnits = 4.0;

double unit_roundoff(DType dt);
double round_up_4(double x);
// The relative budget from the worst max_rel and rel_rms over the calibration seeds.
Budget derive_budget(double worst_max_rel, double worst_rel_rms, double k, DType dt);
std::string budget_formula(double k, DType dt);  // the "source" text stored beside the numbers

}  // namespace kcp
