// Typed row configuration: what one validation/benchmark case asks for (docs/design.md sections 1, 9).
// Filled once from JSON by load_row_set() (row_loader.cpp); nothing after loading reads JSON.
// Defaults are member initialisers; every field maps to one JSON key of configs/rows.schema.json.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/config/result_tensors.h"
#include "vocab/vocabulary.h"

namespace kcp {

// Op, GateForm, DType, Package, SavedKind and their to_string(): vocab/vocabulary.h.
enum class KeyDist { Normal, Skewed };  // Skewed: 10 * randn - 50 (nearly parallel after L2 norm)
// How gates and gate parameters are drawn (docs/algorithm.md 6.4): today's logsigmoid(randn) /
// gate_strength, or as GDN and KDA layers start training (A ~ U(1, 16), dt ~ logU(1e-3, 1e-1)).
enum class GateRecipe { Logsigmoid, ModelInit };
// Which ranks may run a forced-P form: every rank must plan P = 1 (the seed's rule), or any row.
enum class ForcedRule { AllRanksPlanP1, Always };

const char* to_string(KeyDist v);
const char* to_string(ForcedRule v);
const char* to_string(GateRecipe v);

// The tensors a row is judged on. Which ones are present depends on the row's options.
inline const std::vector<std::string>& all_tensor_names() {
  static const std::vector<std::string> names(std::begin(kResultTensors), std::end(kResultTensors));
  return names;
}

// A tensor's budget (docs/design.md 6). The max-abs part is relative in rows calibrated over
// seeds: max_rel, the largest error allowed as a fraction of the judged run's own scale (max|ref|
// of the tensor; the largest cancellation-aware scale of dA_log / ddt_bias), so it means the
// same at every seed. Older rows give an absolute max_abs instead.
struct Budget {
  bool relative = false;
  double max_rel = 0.0;  // relative: max |err| / scale allowed
  double max_abs = 0.0;  // absolute: max |err| allowed
  double rel_rms = 0.0;  // RMS(err) / RMS(ref) allowed (for dA_log / ddt_bias: RMS(err) / RMS(scale))
  static Budget of_scale(double max_rel, double rel_rms) { return {true, max_rel, 0.0, rel_rms}; }
  static Budget absolute(double max_abs, double rel_rms) { return {false, 0.0, max_abs, rel_rms}; }
};

// Input recipe: distributions of the generated inputs (core/inputs).
struct InputRecipe {
  KeyDist keys = KeyDist::Normal;
  GateRecipe gate_recipe = GateRecipe::Logsigmoid;  // the three fields below belong to logsigmoid
  double gate_strength = 1.0;                       // direct gates: logsigmoid(randn) / gate_strength
  double gate_mask_p = 0.0;                         // probability that a direct gate is set to -1000 (extreme decay)
  double gate_zero_p = 0.0;                         // probability that a direct gate is set to 0 (no decay)
  double beta_scale = 1.0;                          // beta = beta_scale * sigmoid(randn), beta_scale in (0, 1]
  double h0_scale = 1.0;                            // h0 = h0_scale * randn (standard deviation of h0)
  double dht_scale = 1.0;                           // dht = dht_scale * randn (standard deviation of dht)
};

// Forms to run (docs/design.md 1: package x saved set x schedule).
struct FormSet {
  std::vector<Package> packages = {Package::Det, Package::Nondet};
  std::vector<SavedKind> saved = {SavedKind::Full, SavedKind::Light};
  std::vector<int> forced_P;  // forced segment counts, in addition to the planned schedule
  ForcedRule forced_rule = ForcedRule::AllRanksPlanP1;
};

struct RowConfig {
  // identity
  std::string name;  // e.g. "A4", "KC2"
  std::string description;
  std::string file;  // the row file it came from
  int index = 0;     // position in rows[]
  // operator and shape
  Op op = Op::Gdn;
  int H = 1, HV = 1, K = 64, V = 64;
  std::vector<int64_t> seqlens;      // global sequence lengths (zero allowed)
  int world = 1;                     // W
  std::vector<int64_t> rank_tokens;  // explicit per-rank token counts (uneven rows); empty = even split
  int chunk = 64;
  // options
  DType dtype = DType::BF16;
  double scale = 0.0;  // 0 = K^-1/2
  bool qk_l2norm = false;
  GateForm gate = GateForm::Direct;
  double lower_bound = -5.0;
  bool A_log = false;  // raw gates: A_log present (required for Softplus)
  bool dt_bias = false;
  bool initial_state = false;  // h0 given
  bool final_state = false;    // ht returned and judged
  bool dht = false;            // gradient of the final state in the loss
  // inputs
  uint64_t seed = 1;
  InputRecipe inputs;
  // planning: a device class to plan with regardless of the device (int1 uses it to get P > 1
  // on small shapes), empty = the device's own class.
  std::string plan_device;
  FormSet forms;
  // budgets per tensor, with provenance: `budgets` for the planned schedule (h_entry / dh_exit:
  // the worst over the row's schedules) and for a forced P without budgets of its own;
  // `forced_budgets[P]`, derived at P segments on every rank, for forms forced to P (docs/design.md 6).
  std::map<std::string, Budget> budgets;
  std::map<int, std::map<std::string, Budget>> forced_budgets;
  std::string budget_source;
  std::vector<uint64_t> budget_seeds;  // the seeds calibrate derived the budgets over (provenance)
  std::string budget_calibrated_on;    // the host, date and build calibrate ran on (provenance; optional)

  int64_t total_tokens() const;
  // The budgets that judge a form at schedule P (0: planned).
  const std::map<std::string, Budget>& budgets_at(int P) const;
  int sequences() const { return static_cast<int>(seqlens.size()); }
  bool has_tensor(const std::string& name) const;  // is this tensor produced for this row?
};

struct RowSet {
  std::string name;  // "int1"
  std::string file;
  std::string description;
  std::vector<RowConfig> rows;
  std::string digest;                    // SHA-256 of the canonical JSON of the whole set
  std::vector<std::string> row_digests;  // SHA-256 of the canonical JSON of each row
  std::vector<std::string> row_json;     // each row as loaded (defaults merged), compact JSON:
                                         // echoed into results so an entry can be replayed
};

}  // namespace kcp
