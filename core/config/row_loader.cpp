// JSON -> RowConfig with every problem collected, then semantic validation (validate_row).
#include "core/config/row_loader.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "core/plan/segment_plan.h"
#include "core/util/error.h"
#include "core/util/sha256.h"
#include "kcp/config.h"

namespace kcp {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer " + v.dump();
  if (v.is_number_float()) return "number " + v.dump();
  if (v.is_string()) return "string " + v.dump();
  if (v.is_array()) return "an array";
  return "an object";
}

// "must be in [lo, hi], got v" with v as written in the file; the widest bounds read as ">= lo" or
// "at most hi" (hi is then the type's limit: the value does not fit in 64 bits).
template <class Int>
std::string range_error(Int lo, Int hi, const json& v) {
  const bool below = v.is_number_integer() && !v.is_number_unsigned() && std::cmp_less(v.get<int64_t>(), lo);
  if (hi == std::numeric_limits<Int>::max() && lo != std::numeric_limits<Int>::min())
    return below ? fmt::format("must be >= {}, got {}", lo, v.dump())
                 : fmt::format("must be at most {}, got {}", hi, v.dump());
  return fmt::format("must be in [{}, {}], got {}", lo, hi, v.dump());
}

// Reads an integer JSON value into Int when it lies in [lo, hi]. nlohmann holds an integer as
// int64 (negative) or uint64; both are compared exactly, so nothing is truncated or wrapped.
template <class Int>
bool read_int(const json& v, Int lo, Int hi, Int& out, std::string& why) {
  if (!v.is_number_integer()) {
    why = "expected an integer, got " + type_name(v);
    return false;
  }
  const auto in = [&](auto x) { return std::cmp_greater_equal(x, lo) && std::cmp_less_equal(x, hi); };
  if (v.is_number_unsigned() ? !in(v.get<uint64_t>()) : !in(v.get<int64_t>())) {
    why = range_error(lo, hi, v);
    return false;
  }
  out = v.is_number_unsigned() ? static_cast<Int>(v.get<uint64_t>()) : static_cast<Int>(v.get<int64_t>());
  return true;
}

// Overflow-checked 64-bit arithmetic: false when the result does not fit.
bool add_ok(int64_t a, int64_t b, int64_t& out) { return !__builtin_add_overflow(a, b, &out); }
bool mul_ok(int64_t a, int64_t b, int64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// Finds duplicate keys while nlohmann parses (it would keep the last one silently), naming each
// by its JSON path: "rows[1].H: duplicate key \"H\" ...".
class DuplicateKeyFinder {
 public:
  explicit DuplicateKeyFinder(std::vector<std::string>& errors) : errors_(errors) {}
  bool operator()(int /*depth*/, json::parse_event_t ev, json& parsed) {
    using E = json::parse_event_t;
    switch (ev) {
      case E::object_start:
      case E::array_start: {
        std::string path = child_path();
        stack_.push_back({ev == E::array_start, 0, std::move(path), {}, {}});
        break;
      }
      case E::object_end:
      case E::array_end:
        stack_.pop_back();
        break;
      case E::key: {
        Frame& f = stack_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second)
          errors_.push_back(fmt::format("{}: duplicate key \"{}\" (a JSON parser keeps only the last one; remove one)",
                                        child_path(), f.key));
        break;
      }
      case E::value:
        if (!stack_.empty() && stack_.back().array) ++stack_.back().next;
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool array = false;
    size_t next = 0;  // arrays: index of the next element
    std::string path;
    std::set<std::string> keys;
    std::string key;  // objects: the last key read
  };
  // The path of the value about to be read (an object's member or an array's element).
  std::string child_path() {
    if (stack_.empty()) return "";
    Frame& f = stack_.back();
    if (f.array) return fmt::format("{}[{}]", f.path, f.next++);
    return f.path.empty() ? f.key : f.path + "." + f.key;
  }
  std::vector<std::string>& errors_;
  std::vector<Frame> stack_;
};

// The keys each kind of object accepts: one list per kind, used by the ObjectReader that parses
// it (to reject unknown keys and to name the known ones) and by accepted_keys().
const std::vector<std::string> kRowSetKeys = {"schema", "name", "description", "defaults", "rows"};
const std::vector<std::string> kRowKeys = {
    "name",          "description", "op",    "H",     "HV",        "K",           "V",           "seqlens", "world",
    "rank_tokens",   "chunk",       "dtype", "scale", "qk_l2norm", "gate",        "lower_bound", "A_log",   "dt_bias",
    "initial_state", "final_state", "dht",   "seed",  "inputs",    "plan_device", "forms",       "budgets"};
const std::vector<std::string> kInputsKeys = {"keys",        "gate_recipe", "gate_strength", "gate_mask_p",
                                              "gate_zero_p", "beta_scale",  "h0_scale",      "dht_scale"};
const std::vector<std::string> kFormsKeys = {"packages", "saved", "forced_P", "forced_rule"};
const std::vector<std::string> kBudgetsKeys = {"source", "seeds", "calibrated_on", "tensors", "forced"};
const std::vector<std::string> kTensorBudgetKeys = {"max_rel", "max_abs", "rel_rms"};

// Reads the fields of one JSON object whose accepted keys are `keys`, reporting the others as
// unknown, and collecting every problem instead of stopping at the first. Reading a key that is
// not in `keys`, or finishing (report_unknown) without having read every key of `keys`, is a
// loader bug (InvariantError): the list and the reads cannot drift apart.
//
// Every key whose value could not be read (wrong type, out of range, missing) is added to
// `unread` as its full path ("rows[0].H"), so that validate_row skips the checks that would judge
// the default the field kept instead: one type error never hides the row's other errors, and
// never invents new ones.
class ObjectReader {
 public:
  ObjectReader(const json& obj, std::string path, std::vector<std::string>& errors,
               const std::vector<std::string>& keys, std::set<std::string>* unread = nullptr)
      : obj_(obj), path_(std::move(path)), errors_(errors), keys_(keys), unread_(unread) {}

  std::string at(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  void mark_unread(const std::string& key) {
    if (unread_) unread_->insert(at(key));
  }
  void error(const std::string& key, const std::string& msg) {
    mark_unread(key);
    errors_.push_back(at(key) + ": " + msg);
  }
  const json* find(const std::string& key) {
    KCP_CHECK(std::find(keys_.begin(), keys_.end(), key) != keys_.end(),
              "the loader reads key \"{}\" at \"{}\", which its key list does not hold", key, path_);
    used_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }

  void get_string(const std::string& key, std::string& out, bool required = false) {
    const json* v = find(key);
    if (!v) {
      if (required) error(key, "required string is missing");
      return;
    }
    if (!v->is_string()) return error(key, "expected a string, got " + type_name(*v));
    out = v->get<std::string>();
  }
  // An integer in [lo, hi], read as 64-bit and checked before it is narrowed to Int.
  template <class Int>
  void get_int(const std::string& key, Int& out, Int lo, Int hi, bool required = false) {
    const json* v = find(key);
    if (!v) {
      if (required) error(key, "required integer is missing");
      return;
    }
    std::string why;
    if (!read_int(*v, lo, hi, out, why)) error(key, why);
  }
  void get_double(const std::string& key, double& out) {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_number()) return error(key, "expected a number, got " + type_name(*v));
    out = v->get<double>();
  }
  void get_bool(const std::string& key, bool& out) {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_boolean()) return error(key, "expected true or false, got " + type_name(*v));
    out = v->get<bool>();
  }
  // An array of integers, each in [lo, hi] (checked before narrowing to Int).
  template <class Int>
  void get_int_array(const std::string& key, std::vector<Int>& out, Int lo, Int hi, bool required = false) {
    const json* v = find(key);
    if (!v) {
      if (required) error(key, "required array of integers is missing");
      return;
    }
    if (!v->is_array()) return error(key, "expected an array of integers, got " + type_name(*v));
    out.clear();
    for (size_t i = 0; i < v->size(); ++i) {
      Int x{};
      std::string why;
      if (!read_int((*v)[i], lo, hi, x, why)) {
        mark_unread(key);
        errors_.push_back(fmt::format("{}[{}]: {}", at(key), i, why));
        continue;
      }
      out.push_back(x);
    }
  }
  template <class E>
  void get_enum(const std::string& key, E& out, const std::vector<std::pair<const char*, E>>& table) {
    const json* v = find(key);
    if (!v) return;
    std::string names;
    for (auto& [n, e] : table) names += (names.empty() ? "" : ", ") + std::string(n);
    if (!v->is_string()) return error(key, "expected one of " + names + ", got " + type_name(*v));
    for (auto& [n, e] : table)
      if (v->get<std::string>() == n) {
        out = e;
        return;
      }
    error(key, "expected one of " + names + ", got " + v->dump());
  }
  template <class E>
  void get_enum_list(const std::string& key, std::vector<E>& out, const std::vector<std::pair<const char*, E>>& table) {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_array()) return error(key, "expected an array of strings, got " + type_name(*v));
    out.clear();
    for (size_t i = 0; i < v->size(); ++i) {
      json one = json::object({{"x", (*v)[i]}});
      static const std::vector<std::string> kOne = {"x"};
      ObjectReader r(one, fmt::format("{}[{}]", at(key), i), errors_, kOne);
      E e{};
      size_t before = errors_.size();
      r.get_enum("x", e, table);
      if (errors_.size() != before) {  // rewrite "....x: msg" to name the element itself
        mark_unread(key);
        std::string& m = errors_.back();
        auto pos = m.find(".x: ");
        if (pos != std::string::npos) m.erase(pos, 2);
        continue;
      }
      out.push_back(e);
    }
  }
  // Returns the sub-object at key (or nullptr), reporting a wrong type.
  const json* object(const std::string& key) {
    const json* v = find(key);
    if (v && !v->is_object()) {
      error(key, "expected an object, got " + type_name(*v));
      return nullptr;
    }
    return v;
  }
  void report_unknown() {
    for (const auto& k : keys_)
      KCP_CHECK(used_.count(k), "the loader's key list at \"{}\" holds \"{}\", which it never reads", path_, k);
    std::string hint;
    for (const auto& k : keys_) hint += (hint.empty() ? "" : ", ") + k;
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (std::find(keys_.begin(), keys_.end(), it.key()) == keys_.end())
        errors_.push_back(at(it.key()) + ": unknown key (known keys: " + hint + ")");
  }

 private:
  const json& obj_;
  std::string path_;
  std::vector<std::string>& errors_;
  const std::vector<std::string>& keys_;  // one of the k*Keys lists (static lifetime)
  std::set<std::string>* unread_;         // may be null: nobody asks which keys were unread
  std::set<std::string> used_;
};

// The shared words' name tables (vocab/vocabulary.h) as the readers take them.
template <class E, size_t N>
std::vector<std::pair<const char*, E>> table_of(const NameTable<E> (&names)[N]) {
  return {std::begin(names), std::end(names)};
}
const auto kOps = table_of(kOpNames);
const auto kGates = table_of(kGateFormNames);
const auto kDtypes = table_of(kDTypeNames);
const auto kPackages = table_of(kPackageNames);
const auto kSaved = table_of(kSavedKindNames);
const std::vector<std::pair<const char*, KeyDist>> kKeys = {{"normal", KeyDist::Normal}, {"skewed", KeyDist::Skewed}};
const std::vector<std::pair<const char*, GateRecipe>> kGateRecipes = {{"logsigmoid", GateRecipe::Logsigmoid},
                                                                      {"model_init", GateRecipe::ModelInit}};
const std::vector<std::pair<const char*, ForcedRule>> kRules = {{"all_ranks_plan_p1", ForcedRule::AllRanksPlanP1},
                                                                {"always", ForcedRule::Always}};

template <class E>
const char* name_of(const std::vector<std::pair<const char*, E>>& table, E e) {
  for (auto& [n, v] : table)
    if (v == e) return n;
  return "?";
}

// One tensor's budget: rel_rms and exactly one of max_rel (relative) and max_abs (absolute), all >= 0.
std::optional<Budget> read_tensor_budget(const json& obj, const std::string& tpath, std::vector<std::string>& errors) {
  ObjectReader rt(obj, tpath, errors, kTensorBudgetKeys);
  Budget b;
  b.max_rel = b.max_abs = b.rel_rms = -1;
  rt.get_double("max_rel", b.max_rel);
  rt.get_double("max_abs", b.max_abs);
  rt.get_double("rel_rms", b.rel_rms);
  rt.report_unknown();
  b.relative = obj.contains("max_rel");
  if (obj.contains("max_rel") == obj.contains("max_abs")) {
    errors.push_back(tpath + ": needs exactly one of max_rel (relative to the run's scale) and max_abs (absolute)");
    return std::nullopt;
  }
  if ((b.relative ? b.max_rel : b.max_abs) < 0 || b.rel_rms < 0) {
    errors.push_back(tpath + ": needs " + (b.relative ? "max_rel" : "max_abs") + " and rel_rms, both >= 0");
    return std::nullopt;
  }
  if (!b.relative) b.max_rel = 0;
  if (b.relative) b.max_abs = 0;
  return b;
}

// A row's tensor budgets: {tensor: {max_rel or max_abs, rel_rms}} at `path`.
std::map<std::string, Budget> read_tensor_budgets(const json& te, const std::string& path,
                                                  std::vector<std::string>& errors) {
  std::map<std::string, Budget> out;
  for (auto it = te.begin(); it != te.end(); ++it) {
    const std::string tpath = path + "." + it.key();
    if (std::find(all_tensor_names().begin(), all_tensor_names().end(), it.key()) == all_tensor_names().end()) {
      errors.push_back(tpath + ": unknown tensor (known: " + fmt::format("{}", fmt::join(all_tensor_names(), ", ")) +
                       ")");
      continue;
    }
    if (!it->is_object()) {
      errors.push_back(tpath + ": expected an object {max_rel or max_abs, rel_rms}, got " + type_name(*it));
      continue;
    }
    if (auto b = read_tensor_budget(*it, tpath, errors)) out[it.key()] = *b;
  }
  return out;
}

// The P of a key of budgets.forced: a decimal integer in [1, kMaxP]; 0 (and an error) otherwise.
int forced_budget_P(const std::string& key, const std::string& path, std::vector<std::string>& errors) {
  int P = 0;
  const bool digits =
      !key.empty() && key.size() <= 4 && key.find_first_not_of("0123456789") == std::string::npos && key[0] != '0';
  if (digits) P = std::stoi(key);
  if (!digits || P < 1 || P > kMaxP) {
    errors.push_back(
        fmt::format("{}: a forced segment count in [1, {}] written as a decimal key, got \"{}\"", path, kMaxP, key));
    return 0;
  }
  return P;
}

// A row's "inputs". The logsigmoid recipe's options (gate_strength, gate_mask_p, gate_zero_p) are
// refused under model_init, which draws its gates otherwise and could not honour them.
void parse_inputs(const json& obj, ObjectReader& r, RowConfig& row) {
  r.get_enum("keys", row.inputs.keys, kKeys);
  r.get_enum("gate_recipe", row.inputs.gate_recipe, kGateRecipes);
  r.get_double("gate_strength", row.inputs.gate_strength);
  r.get_double("gate_mask_p", row.inputs.gate_mask_p);
  r.get_double("gate_zero_p", row.inputs.gate_zero_p);
  r.get_double("beta_scale", row.inputs.beta_scale);
  r.get_double("h0_scale", row.inputs.h0_scale);
  r.get_double("dht_scale", row.inputs.dht_scale);
  r.report_unknown();
  if (row.inputs.gate_recipe != GateRecipe::ModelInit) return;
  for (const char* key : {"gate_strength", "gate_mask_p", "gate_zero_p"})
    if (obj.contains(key))
      r.error(key, fmt::format("row {}: gate_recipe \"model_init\" cannot honour {} (it belongs to gate_recipe "
                               "\"logsigmoid\"), got {}; remove it or use gate_recipe \"logsigmoid\"",
                               row.name, key, obj[key].dump()));
}

RowConfig parse_row(const json& obj, const std::string& path, std::vector<std::string>& errors,
                    std::set<std::string>& unread) {
  RowConfig row;
  ObjectReader r(obj, path, errors, kRowKeys, &unread);
  r.get_string("name", row.name, true);
  r.get_string("description", row.description);
  r.get_enum("op", row.op, kOps);
  if (!obj.contains("op")) r.error("op", "required (gdn or kda) is missing");
  r.get_int("H", row.H, 1, kMaxHeads, true);
  r.get_int("HV", row.HV, 1, kMaxHeads, true);
  r.get_int("K", row.K, 1, kMaxHeadDim, true);
  r.get_int("V", row.V, 1, kMaxHeadDim, true);
  r.get_int_array("seqlens", row.seqlens, int64_t{0}, INT64_MAX, true);
  r.get_int("world", row.world, 1, kMaxWorld);
  r.get_int_array("rank_tokens", row.rank_tokens, int64_t{1}, INT64_MAX);
  r.get_int("chunk", row.chunk, 1, kMaxChunk);
  r.get_enum("dtype", row.dtype, kDtypes);
  r.get_double("scale", row.scale);
  r.get_bool("qk_l2norm", row.qk_l2norm);
  r.get_enum("gate", row.gate, kGates);
  r.get_double("lower_bound", row.lower_bound);
  r.get_bool("A_log", row.A_log);
  r.get_bool("dt_bias", row.dt_bias);
  r.get_bool("initial_state", row.initial_state);
  r.get_bool("final_state", row.final_state);
  r.get_bool("dht", row.dht);
  r.get_int("seed", row.seed, uint64_t{0}, UINT64_MAX);
  r.get_string("plan_device", row.plan_device);
  if (const json* in = r.object("inputs")) {
    ObjectReader ri(*in, r.at("inputs"), errors, kInputsKeys, &unread);
    parse_inputs(*in, ri, row);
  }
  if (const json* fo = r.object("forms")) {
    ObjectReader rf(*fo, r.at("forms"), errors, kFormsKeys, &unread);
    rf.get_enum_list("packages", row.forms.packages, kPackages);
    rf.get_enum_list("saved", row.forms.saved, kSaved);
    rf.get_int_array("forced_P", row.forms.forced_P, 1, kMaxP);
    rf.get_enum("forced_rule", row.forms.forced_rule, kRules);
    rf.report_unknown();
  }
  if (const json* bu = r.object("budgets")) {
    ObjectReader rb(*bu, r.at("budgets"), errors, kBudgetsKeys, &unread);
    rb.get_string("source", row.budget_source);
    rb.get_string("calibrated_on", row.budget_calibrated_on);
    rb.get_int_array("seeds", row.budget_seeds, uint64_t{0}, UINT64_MAX);
    if (const json* te = rb.object("tensors")) row.budgets = read_tensor_budgets(*te, rb.at("tensors"), errors);
    if (const json* fo = rb.object("forced"))
      for (auto it = fo->begin(); it != fo->end(); ++it) {
        const std::string fpath = rb.at("forced") + "." + it.key();
        const int P = forced_budget_P(it.key(), fpath, errors);
        if (P == 0) continue;
        if (!it->is_object()) {
          errors.push_back(fpath + ": expected an object of tensor budgets, got " + type_name(*it));
          continue;
        }
        row.forced_budgets[P] = read_tensor_budgets(*it, fpath, errors);
      }
    rb.report_unknown();
  }
  r.report_unknown();
  return row;
}

// The row's problem digest covers everything that changes the numbers, not its budgets or text.
// Naming a default input recipe value (gate_recipe "logsigmoid", beta_scale / h0_scale / dht_scale
// 1) leaves it as the row without the key: the digest seeds every input, so such a row keeps its
// inputs and baselines.
json canonical_problem(json row) {
  row.erase("budgets");
  row.erase("description");
  auto in = row.find("inputs");
  if (in != row.end() && in->is_object()) {
    if (in->value("gate_recipe", json()) == "logsigmoid") in->erase("gate_recipe");
    for (const char* key : {"beta_scale", "h0_scale", "dht_scale"}) {
      auto v = in->find(key);
      if (v != in->end() && v->is_number() && v->get<double>() == 1.0) in->erase(key);
    }
    if (in->empty()) row.erase("inputs");
  }
  return row;
}

// What gate_recipe model_init needs of a row (docs/algorithm.md 6.4): the raw forms take dt_bias
// from it, and lower_bound must reach its strongest decay -1.6. Pairs of (field, message).
std::vector<std::pair<std::string, std::string>> model_init_problems(const RowConfig& row, bool fields_read) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!fields_read || row.inputs.gate_recipe != GateRecipe::ModelInit) return out;
  if (row.gate != GateForm::Direct && !row.dt_bias)
    out.push_back({"dt_bias", fmt::format("row {}: gate_recipe \"model_init\" on the {} form draws dt_bias and needs "
                                          "dt_bias: true, got false",
                                          row.name, to_string(row.gate))});
  if (row.gate == GateForm::LowerBound && !(row.lower_bound <= -1.6))
    out.push_back({"lower_bound", fmt::format("row {}: gate_recipe \"model_init\" needs lower_bound <= -1.6 (its "
                                              "strongest decay), got {}",
                                              row.name, row.lower_bound)});
  return out;
}

}  // namespace

std::map<std::string, std::vector<std::string>> accepted_keys() {
  return {{"row_set", kRowSetKeys},
          {"row", kRowKeys},
          {"inputs", kInputsKeys},
          {"forms", kFormsKeys},
          {"budgets", kBudgetsKeys},
          {"budgets.tensors", all_tensor_names()},
          {"tensor_budget", kTensorBudgetKeys}};
}

const char* to_string(KeyDist v) { return name_of(kKeys, v); }
const char* to_string(ForcedRule v) { return name_of(kRules, v); }
const char* to_string(GateRecipe v) { return name_of(kGateRecipes, v); }

namespace {

// The checks of one row (validate_row), each on the fields it needs; `e` collects the problems,
// each naming the field's path.
struct RowChecks {
  const RowConfig& row;
  const std::string& p;
  const std::set<std::string>& unread;
  std::vector<std::string> e;

  void bad(const std::string& field, const std::string& msg) { e.push_back(p + "." + field + ": " + msg); }
  // Were these fields read? A check that needs an unread field would judge its default instead.
  bool read(std::initializer_list<const char*> fields) const {
    for (const char* f : fields)
      if (unread.count(p + "." + f)) return false;
    return true;
  }

  void name() {
    if (!row.name.empty()) {
      bool ok = !row.name.empty() && std::isupper(static_cast<unsigned char>(row.name[0]));
      size_t i = 0;
      while (i < row.name.size() && std::isupper(static_cast<unsigned char>(row.name[i]))) ++i;
      ok = ok && i <= 3 && i < row.name.size();
      for (size_t j = i; j < row.name.size(); ++j) ok = ok && std::isdigit(static_cast<unsigned char>(row.name[j]));
      if (!ok)
        bad("name", "expected a family letter (up to 3 capitals) and a number like \"A4\" or \"KC2\", got \"" +
                        row.name + "\"");
    }
  }

  void shape() {
    if (read({"H"}) && row.H <= 0) bad("H", fmt::format("must be positive, got {}", row.H));
    if (read({"HV"}) && row.HV <= 0) bad("HV", fmt::format("must be positive, got {}", row.HV));
    if (read({"H", "HV"}) && row.H > 0 && row.HV > 0 && row.HV % row.H != 0)
      bad("HV", fmt::format("must be a multiple of H ({}), got {}", row.H, row.HV));
    for (auto [field, val] : {std::pair{"K", row.K}, std::pair{"V", row.V}})
      if (read({field}) && val != 64 && val != 128)
        bad(field, fmt::format("unsupported head dim (supported: 64, 128), got {}", val));
    if (read({"chunk"}) && row.chunk != 64)
      bad("chunk", fmt::format("only chunk size 64 is supported, got {}", row.chunk));
  }

  // The total length, checked for overflow; -1 when unknown (unread, negative or too large).
  int64_t lengths() {
    int64_t total = read({"seqlens"}) ? 0 : -1;
    if (total == 0 && row.seqlens.empty()) bad("seqlens", "must hold at least one sequence length, got an empty array");
    for (size_t i = 0; i < row.seqlens.size() && total >= 0; ++i) {
      if (row.seqlens[i] < 0) {
        e.push_back(fmt::format("{}.seqlens[{}]: must be >= 0, got {}", p, i, row.seqlens[i]));
        total = -1;
      } else if (!add_ok(total, row.seqlens[i], total)) {
        bad("seqlens", fmt::format("the lengths add up past {} (64-bit overflow)", INT64_MAX));
        total = -1;
      }
    }
    if (!row.seqlens.empty() && total == 0) bad("seqlens", "the sequences hold no tokens (total length 0)");
    return total;
  }

  void world(int64_t total) {
    if (read({"world"}) && row.world < 1) bad("world", fmt::format("must be >= 1, got {}", row.world));
    if (read({"world", "rank_tokens"}) && row.world >= 1 && total > 0) {
      if (row.rank_tokens.empty()) {
        if (total < row.world)
          bad("world",
              fmt::format("W = {} is larger than the {} tokens allow (every rank needs a token)", row.world, total));
        else if (total % row.world != 0)
          bad("world",
              fmt::format("total tokens {} must be divisible by W = {} for an even split (or give rank_tokens)", total,
                          row.world));
      } else {
        if (static_cast<int64_t>(row.rank_tokens.size()) != row.world)
          bad("rank_tokens", fmt::format("must have W = {} entries, got {}", row.world, row.rank_tokens.size()));
        int64_t sum = 0;
        for (size_t i = 0; i < row.rank_tokens.size() && sum >= 0; ++i) {
          if (row.rank_tokens[i] <= 0) {
            e.push_back(fmt::format("{}.rank_tokens[{}]: must be positive, got {}", p, i, row.rank_tokens[i]));
            sum = -1;
          } else if (!add_ok(sum, row.rank_tokens[i], sum)) {
            bad("rank_tokens", fmt::format("the counts add up past {} (64-bit overflow)", INT64_MAX));
            sum = -1;
          }
        }
        if (sum >= 0 && sum != total)
          bad("rank_tokens", fmt::format("must add up to the total tokens {}, got {}", total, sum));
      }
    }
  }

  void sizes(int64_t total) {
    // Every array the run allocates is at most T x HV x K x V elements (docs/design.md 3), so its
    // size in bytes fits in 64 bits when this product does with room for the element size.
    if (read({"HV", "K", "V"}) && total > 0 && row.HV > 0 && row.K > 0 && row.V > 0) {
      int64_t n = total;
      if (!(mul_ok(n, row.HV, n) && mul_ok(n, row.K, n) && mul_ok(n, row.V, n) && mul_ok(n, 8, n)))
        e.push_back(
            fmt::format("{} ({}): T x HV x K x V = {} x {} x {} x {} overflows 64-bit sizes (at 8 bytes an element "
                        "it must stay below 2^63); use fewer tokens or heads",
                        p, row.name, total, row.HV, row.K, row.V));
    }
  }

  void gates_and_inputs() {
    if (read({"scale"}) && row.scale < 0) bad("scale", fmt::format("must be >= 0 (0 means K^-1/2), got {}", row.scale));
    if (read({"gate", "op"}) && row.gate == GateForm::LowerBound && row.op != Op::Kda)
      bad("gate", "the lower_bound form exists for kda only, got it on a gdn row");
    if (read({"gate", "lower_bound"}) && row.gate == GateForm::LowerBound &&
        !(row.lower_bound >= -5.0 && row.lower_bound < 0.0))
      bad("lower_bound", fmt::format("must be in [-5, 0), got {}", row.lower_bound));
    if (read({"gate", "A_log"}) && row.gate == GateForm::Softplus && !row.A_log)
      bad("A_log", "the softplus gate form needs A_log: true, got false");
    if (read({"gate", "A_log", "dt_bias"}) && row.gate == GateForm::Direct && (row.A_log || row.dt_bias))
      bad("gate", "A_log / dt_bias need a raw gate form (softplus or lower_bound), got direct");
    if (read({"dht", "final_state"}) && row.dht && !row.final_state)
      bad("dht", "dht needs final_state: true (the loss uses ht)");
    if (read({"inputs", "inputs.gate_strength"}) && row.inputs.gate_strength <= 0)
      bad("inputs.gate_strength", fmt::format("must be positive, got {}", row.inputs.gate_strength));
    for (auto [field, val] : {std::pair{"inputs.gate_mask_p", row.inputs.gate_mask_p},
                              std::pair{"inputs.gate_zero_p", row.inputs.gate_zero_p}})
      if (read({"inputs", field}) && !(val >= 0 && val <= 1))
        bad(field, fmt::format("must be a probability in [0, 1], got {}", val));
    if (read({"inputs", "inputs.beta_scale"}) && !(row.inputs.beta_scale > 0 && row.inputs.beta_scale <= 1))
      bad("inputs.beta_scale", fmt::format("row {}: must be in (0, 1] (beta = beta_scale * sigmoid(randn)), got {}",
                                           row.name, row.inputs.beta_scale));
    for (auto [field, val, needs, has] :
         {std::tuple{"inputs.h0_scale", row.inputs.h0_scale, "initial_state", row.initial_state},
          std::tuple{"inputs.dht_scale", row.inputs.dht_scale, "dht", row.dht}}) {
      if (!read({"inputs", field, needs})) continue;
      if (!(val > 0 && std::isfinite(val)))
        bad(field, fmt::format("row {}: must be a positive finite standard deviation, got {}", row.name, val));
      else if (val != 1.0 && !has)
        bad(field, fmt::format("row {}: scales an input the row does not have; it needs {}: true, got {} = {}",
                               row.name, needs, field, val));
    }
    for (const auto& m :
         model_init_problems(row, read({"inputs", "inputs.gate_recipe", "gate", "dt_bias", "lower_bound"})))
      bad(m.first, m.second);
  }

  void forms_budgets_and_device() {
    if (read({"forms", "forms.packages"}) && row.forms.packages.empty())
      bad("forms.packages", "must name at least one package (det, nondet)");
    if (read({"forms", "forms.saved"}) && row.forms.saved.empty())
      bad("forms.saved", "must name at least one saved set (full, light)");
    for (size_t i = 0; i < row.forms.forced_P.size(); ++i) {
      int P = row.forms.forced_P[i];
      if (P < 1 || P > kMaxP)
        e.push_back(fmt::format("{}.forms.forced_P[{}]: must be in [1, {}], got {}", p, i, kMaxP, P));
    }
    if (read({"final_state", "A_log", "dt_bias", "initial_state"})) {
      for (const auto& [t, b] : row.budgets)
        if (!row.has_tensor(t))
          e.push_back(fmt::format("{}.budgets.tensors.{}: this row does not produce {} (check its options)", p, t, t));
      for (const auto& [P, tensors] : row.forced_budgets)
        for (const auto& [t, b] : tensors)
          if (!row.has_tensor(t))
            e.push_back(
                fmt::format("{}.budgets.forced.{}.{}: this row does not produce {} (check its options)", p, P, t, t));
    }
    if (!row.plan_device.empty()) {
      bool known = false;
      std::string names;
      for (const auto& d : device_classes()) {
        known = known || d.name == row.plan_device;
        names += (names.empty() ? "" : ", ") + d.name;
      }
      if (!known)
        bad("plan_device", fmt::format("unknown device class (known: {}), got \"{}\"", names, row.plan_device));
    }
  }

  void forced_plans() {
    // Forced P values must be takeable by every rank (checked on a plan when the whole row is sound).
    if (e.empty() && unread.empty()) {
      for (size_t i = 0; i < row.forms.forced_P.size(); ++i) {
        try {
          PlanRequest req;
          req.device = row.plan_device.empty() ? "h200" : row.plan_device;
          req.forced_P = row.forms.forced_P[i];
          make_plan(row, req);
        } catch (const ConfigError& err) {
          e.push_back(fmt::format("{}.forms.forced_P[{}]: the plan cannot take P = {}: {}", p, i, row.forms.forced_P[i],
                                  err.what()));
        }
      }
    }
  }
};

}  // namespace

std::vector<std::string> validate_row(const RowConfig& row, const std::string& p, const std::set<std::string>& unread) {
  RowChecks c{row, p, unread, {}};
  c.name();
  c.shape();
  const int64_t total = c.lengths();
  c.world(total);
  c.sizes(total);
  c.gates_and_inputs();
  c.forms_budgets_and_device();
  c.forced_plans();
  return c.e;
}

const std::map<std::string, Budget>& RowConfig::budgets_at(int P) const {
  const auto it = forced_budgets.find(P);
  return P > 0 && it != forced_budgets.end() ? it->second : budgets;
}

int64_t RowConfig::total_tokens() const {
  int64_t t = 0;
  for (auto s : seqlens)
    KCP_REQUIRE(add_ok(t, s, t), "row {}: the sequence lengths add up past {} (64-bit overflow)", name, INT64_MAX);
  return t;
}

bool RowConfig::has_tensor(const std::string& n) const {
  if (n == "ht") return final_state;
  if (n == "dA_log") return A_log;
  if (n == "ddt_bias") return dt_bias;
  if (n == "dh0") return initial_state;
  return std::find(all_tensor_names().begin(), all_tensor_names().end(), n) != all_tensor_names().end();
}

RowSet load_row_set_text(const std::string& text, const std::string& file) {
  std::vector<std::string> errors;
  json doc;
  try {
    doc = json::parse(text, DuplicateKeyFinder(errors));
  } catch (const json::parse_error& ex) {
    KCP_THROW(ConfigError, "{}: not valid JSON (byte {}): {}", file, ex.byte, ex.what());
  }
  RowSet set;
  set.file = file;
  if (!doc.is_object())
    KCP_THROW(ConfigError, "{}: expected a JSON object at the top level, got {}", file, type_name(doc));
  ObjectReader top(doc, "", errors, kRowSetKeys);
  std::string schema;
  top.get_string("schema", schema, true);
  if (!schema.empty() && schema != "kcpbench.rows/1")
    errors.push_back("schema: expected \"kcpbench.rows/1\", got \"" + schema + "\"");
  top.get_string("name", set.name, true);
  top.get_string("description", set.description);
  const json* defaults = top.object("defaults");
  const json* rows = top.find("rows");
  if (!rows)
    errors.push_back("rows: required array of rows is missing");
  else if (!rows->is_array())
    errors.push_back("rows: expected an array of rows, got " + type_name(*rows));
  else if (rows->empty())
    errors.push_back("rows: the row set holds no rows (a row set needs at least one row)");
  top.report_unknown();
  std::set<std::string> names;
  if (rows && rows->is_array()) {
    for (size_t i = 0; i < rows->size(); ++i) {
      const std::string path = fmt::format("rows[{}]", i);
      const json& raw = (*rows)[i];
      if (!raw.is_object()) {
        errors.push_back(path + ": expected a row object, got " + type_name(raw));
        continue;
      }
      json merged = defaults ? *defaults : json::object();
      for (auto it = raw.begin(); it != raw.end(); ++it) merged[it.key()] = *it;
      std::set<std::string> unread;
      RowConfig row = parse_row(merged, path, errors, unread);
      row.file = file;
      row.index = static_cast<int>(i);
      auto v = validate_row(row, path, unread);
      errors.insert(errors.end(), v.begin(), v.end());
      if (!row.name.empty() && !names.insert(row.name).second)
        errors.push_back(fmt::format("{}.name: duplicate row name \"{}\"", path, row.name));
      set.row_digests.push_back(sha256_hex(canonical_problem(merged).dump()));
      set.row_json.push_back(merged.dump());
      set.rows.push_back(std::move(row));
    }
  }
  if (!errors.empty()) {
    std::string msg =
        fmt::format("{}: {} problem{} in the row file:", file, errors.size(), errors.size() == 1 ? "" : "s");
    for (const auto& e : errors) msg += "\n  " + file + ": " + e;
    throw ConfigError(msg);
  }
  set.digest = sha256_hex(doc.dump());
  return set;
}

RowSet load_row_set(const std::string& file) {
  std::error_code ec;
  if (fs::is_directory(file, ec))
    KCP_THROW(ConfigError, "{}: is a directory, not a row file (give a row file such as {}/int1.json, or a set name)",
              file, file);
  std::ifstream in(file);
  if (!in) KCP_THROW(ConfigError, "{}: cannot open the row file ({})", file, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return load_row_set_text(ss.str(), file);
}

std::string default_configs_dir() {
  if (const char* env = std::getenv("KCP_CONFIGS_DIR")) return env;
  return std::string(KCP_SOURCE_DIR) + "/configs";
}

std::vector<std::string> known_row_sets(const std::string& configs_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& ent : fs::directory_iterator(fs::path(configs_dir) / "rows", ec))
    if (ent.path().extension() == ".json" && ent.path().filename().string().find("schema") == std::string::npos)
      names.push_back(ent.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string resolve_row_file(const std::string& spec, const std::string& configs_dir) {
  if (spec.find('/') != std::string::npos || spec.ends_with(".json")) {
    if (!fs::exists(spec)) KCP_THROW(ConfigError, "--rows: no such row file \"{}\"", spec);
    return spec;
  }
  fs::path f = fs::path(configs_dir) / "rows" / (spec + ".json");
  if (!fs::exists(f)) {
    std::string names;
    for (const auto& n : known_row_sets(configs_dir)) names += (names.empty() ? "" : ", ") + n;
    KCP_THROW(ConfigError, "--rows: unknown row set \"{}\" (known in {}/rows: {}; or give a path to a row file)", spec,
              configs_dir, names.empty() ? "none" : names);
  }
  return f.string();
}

namespace {
bool glob_match(const char* pat, const char* s) {
  if (*pat == 0) return *s == 0;
  if (*pat == '*') return glob_match(pat + 1, s) || (*s && glob_match(pat, s + 1));
  if (*s && (*pat == '?' || *pat == *s)) return glob_match(pat + 1, s + 1);
  return false;
}
}  // namespace

std::vector<const RowConfig*> select_rows(const RowSet& set, const std::vector<std::string>& patterns) {
  std::vector<const RowConfig*> out;
  for (const auto& pat : patterns) {
    bool any = false;
    for (const auto& r : set.rows) any = any || glob_match(pat.c_str(), r.name.c_str());
    if (!any) {
      std::string names;
      for (const auto& r : set.rows) names += (names.empty() ? "" : ", ") + r.name;
      KCP_THROW(ConfigError, "--row {}: no row of {} matches (rows: {})", pat, set.file, names);
    }
  }
  for (const auto& r : set.rows) {
    bool take = patterns.empty();
    for (const auto& pat : patterns) take = take || glob_match(pat.c_str(), r.name.c_str());
    if (take) out.push_back(&r);
  }
  return out;
}

}  // namespace kcp
