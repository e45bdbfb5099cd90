// Shared test helpers: named cases, a cache of FP64 reference results, and the threshold check.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>

#include "twin_harness.h"

namespace kcp::test {

// Memoized reference run per case name (the reference is the slowest part of the suite).
inline const RefResults& reference_for(const Case& c, const Data& d) {
  static std::map<std::string, RefResults> cache;
  auto it = cache.find(c.name);
  if (it == cache.end()) it = cache.emplace(c.name, run_reference(c, d)).first;
  return it->second;
}

inline const Data& data_for(const Case& c) {
  static std::map<std::string, Data> cache;
  auto it = cache.find(c.name);
  if (it == cache.end()) it = cache.emplace(c.name, make_data(c)).first;
  return it->second;
}

// Checks every tensor of `twin` against the reference at the public thresholds; prints one line
// "label: o=1.2e-3 ht=..." so the suite's log doubles as the error table.
inline void expect_within_thresholds(const std::string& label, const RefResults& ref, const TwinResults& twin,
                                     const std::string& unchecked = "") {
  std::string line = label + ":";
  for (const auto& [name, r] : ref.t) {
    auto it = twin.t.find(name);
    ASSERT_NE(it, twin.t.end()) << label << ": twin lacks " << name;
    ASSERT_EQ(it->second.size(), r.size()) << label << ": size of " << name;
    EXPECT_EQ(non_finite(it->second), 0) << label << ": non-finite values in " << name;
    const double e = rel_rms(r, it->second);
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s=%.2e", name.c_str(), e);
    line += buf;
    if (name == unchecked) {
      line += "(unchecked)";
      continue;
    }
    EXPECT_LE(e, threshold(name)) << label << ": rel-RMS of " << name << " = " << e << " > " << threshold(name);
  }
  std::printf("[ rel-RMS  ] %s\n", line.c_str());
}

// Largest rel-RMS difference between two twin runs over all tensors (printed).
inline double max_rel_diff(const std::string& label, const TwinResults& base, const TwinResults& other) {
  double worst = 0.0;
  std::string line = label + ":";
  for (const auto& [name, b] : base.t) {
    const double e = rel_rms(b, other.t.at(name));
    worst = std::max(worst, e);
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s=%.1e", name.c_str(), e);
    line += buf;
  }
  std::printf("[ vs base  ] %s\n", line.c_str());
  return worst;
}

// The case list of the reference tests (a).
inline Case gdn_varlen() {
  Case c;
  c.name = "gdn_varlen";
  c.op = kernels::Op::Gdn;
  c.H = 2;
  c.HV = 2;
  c.lens = {100, 37, 300};
  c.seed = 11;
  return c;
}
inline Case gdn_gva_state() {
  Case c = gdn_varlen();
  c.name = "gdn_gva_h0_dht";
  c.H = 2;
  c.HV = 4;
  c.h0 = c.dht = true;
  c.lens = {100, 0, 37, 300};
  c.gate_div = 8.0;  // long memory: the state crosses many chunks
  c.seed = 12;
  return c;
}
inline Case gdn_raw_l2() {
  Case c = gdn_varlen();
  c.name = "gdn_l2norm_softplus";
  c.H = 2;
  c.HV = 4;
  c.l2norm = true;
  c.gate = kernels::GateForm::Softplus;
  c.A_log = c.dt_bias = true;
  c.h0 = c.dht = true;
  c.seed = 13;
  return c;
}
inline Case gdn_k128() {
  Case c;
  c.name = "gdn_K128";
  c.op = kernels::Op::Gdn;
  c.H = 1;
  c.HV = 2;
  c.K = 128;
  c.V = 128;
  c.lens = {200, 77};
  c.h0 = c.dht = true;
  c.seed = 14;
  return c;
}
inline Case kda_varlen() {
  Case c = gdn_varlen();
  c.name = "kda_varlen";
  c.op = kernels::Op::Kda;
  c.seed = 21;
  return c;
}
inline Case kda_gva_state() {
  Case c = gdn_gva_state();
  c.name = "kda_gva_h0_dht";
  c.op = kernels::Op::Kda;
  c.seed = 22;
  return c;
}
inline Case kda_raw_l2() {
  Case c = gdn_raw_l2();
  c.name = "kda_l2norm_softplus";
  c.op = kernels::Op::Kda;
  c.seed = 23;
  return c;
}
inline Case kda_lower_bound() {
  Case c = gdn_raw_l2();
  c.name = "kda_l2norm_lower_bound";
  c.op = kernels::Op::Kda;
  c.gate = kernels::GateForm::LowerBound;
  c.lower_bound = -5.0f;
  c.seed = 24;
  return c;
}
inline Case kda_k128() {
  Case c = gdn_k128();
  c.name = "kda_K128";
  c.op = kernels::Op::Kda;
  c.seed = 25;
  return c;
}
// One long sequence for the segment and rank splits.
inline Case single_sequence(kernels::Op op) {
  Case c;
  c.name = op == kernels::Op::Gdn ? "gdn_single600" : "kda_single600";
  c.op = op;
  c.H = 2;
  c.HV = 4;
  c.lens = {600};
  c.h0 = c.dht = true;
  c.gate_div = 16.0;  // ~e^-3 per chunk: segment entry states matter
  c.seed = op == kernels::Op::Gdn ? 31 : 32;
  return c;
}

}  // namespace kcp::test
