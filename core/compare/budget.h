// Budget derivation (docs/design.md 6), used by `kcpbench calibrate`:
//   max-abs budget = k x max_abs(CPU twin vs FP64) + u x max|ref|
//   rel-RMS budget = k x rel_rms(CPU twin vs FP64) + u
// with u the unit roundoff of the input dtype (bf16 2^-8, fp16 2^-11) and k = 2 by default
// ("within 2x of the reference implementation"). Values are rounded up to 4 significant digits,
// so the stored number is never tighter than the formula.
//
// So that a wrong twin cannot widen its own budgets, the twin must meet fixed rel-RMS limits
// against FP64 first (the levels public test suites use): o, ht, h_entry 5e-3; dq, dk, dv, dh0,
// dh_exit 8e-3; dg, dbeta, dA_log, ddt_bias 2e-2.
#pragma once

#include <string>

#include "core/config/row_config.h"

namespace kcp {

double unit_roundoff(DType dt);
double twin_rel_rms_limit(const std::string& tensor);
double round_up_4(double x);
Budget derive_budget(double max_abs, double rel_rms, double ref_max_abs, double k, DType dt);
std::string budget_formula(double k, DType dt);  // the "source" text stored beside the numbers

}  // namespace kcp
