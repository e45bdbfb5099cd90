#include "core/config/row_loader.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/util/error.h"

using namespace kcp;
using nlohmann::json;

namespace {
json valid_set() {
  return json::parse(R"({
    "schema": "kcpbench.rows/1", "name": "t", "description": "test set",
    "defaults": {"plan_device": "cpu"},
    "rows": [
      {"name": "A1", "op": "gdn", "H": 2, "HV": 4, "K": 64, "V": 64, "seqlens": [512], "world": 2},
      {"name": "KB1", "op": "kda", "H": 1, "HV": 1, "K": 128, "V": 64, "seqlens": [100, 0, 156], "world": 4,
       "gate": "lower_bound", "A_log": true, "final_state": true, "dht": true,
       "forms": {"packages": ["det"], "saved": ["full", "light"], "forced_P": [], "forced_rule": "always"},
       "budgets": {"source": "test", "tensors": {"o": {"max_abs": 0.1, "rel_rms": 0.01}}}}
    ]})");
}

std::string load_error(const json& doc) {
  try {
    load_row_set_text(doc.dump(), "bad.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

struct BrokenCase {
  const char* what;
  std::function<void(json&)> mutate;
  const char* expect;  // must appear in the message (file, JSON path, expected, found)
};
}  // namespace

TEST(RowLoader, ValidSetLoads) {
  RowSet set = load_row_set_text(valid_set().dump(), "ok.json");
  ASSERT_EQ(set.rows.size(), 2u);
  EXPECT_EQ(set.rows[0].plan_device, "cpu") << "defaults apply";
  EXPECT_EQ(set.rows[1].gate, GateForm::LowerBound);
  EXPECT_EQ(set.rows[1].forms.packages, std::vector<Package>{Package::Det});
  EXPECT_DOUBLE_EQ(set.rows[1].budgets.at("o").rel_rms, 0.01);
  EXPECT_EQ(set.digest.size(), 64u);
  // A row's digest ignores budgets and description, and changes with anything numeric.
  json d = valid_set();
  d["rows"][1]["budgets"]["tensors"]["o"]["max_abs"] = 0.5;
  d["rows"][1]["description"] = "changed";
  EXPECT_EQ(load_row_set_text(d.dump(), "x").row_digests[1], set.row_digests[1]);
  d["rows"][1]["seed"] = 2;
  EXPECT_NE(load_row_set_text(d.dump(), "x").row_digests[1], set.row_digests[1]);
}

// Rows that name no gate recipe keep their digest (it seeds every input) and echo no recipe;
// naming the default changes nothing, model_init gives other inputs.
TEST(RowLoader, TheDefaultGateRecipeKeepsTheRowDigest) {
  const RowSet set = load_row_set_text(valid_set().dump(), "ok.json");
  EXPECT_EQ(set.rows[0].inputs.gate_recipe, GateRecipe::Logsigmoid);
  EXPECT_EQ(set.row_json[0].find("gate_recipe"), std::string::npos);
  json d = valid_set();
  d["rows"][0]["inputs"] = {{"gate_recipe", "logsigmoid"}};
  d["rows"][1]["inputs"] = {{"gate_recipe", "logsigmoid"}, {"gate_strength", 4}};
  const RowSet named = load_row_set_text(d.dump(), "x");
  EXPECT_EQ(named.row_digests[0], set.row_digests[0]);
  d["rows"][1]["inputs"].erase("gate_recipe");
  EXPECT_EQ(named.row_digests[1], load_row_set_text(d.dump(), "x").row_digests[1]);
  d["rows"][0]["inputs"] = {{"gate_recipe", "model_init"}};
  const RowSet model = load_row_set_text(d.dump(), "x");
  EXPECT_EQ(model.rows[0].inputs.gate_recipe, GateRecipe::ModelInit);
  EXPECT_NE(model.row_digests[0], set.row_digests[0]);
}

// The input scales (beta_scale, h0_scale, dht_scale) default to 1: rows without them keep their
// digests, naming 1 changes nothing, any other value gives another row (other inputs).
TEST(RowLoader, DefaultInputScalesKeepTheRowDigest) {
  const RowSet set = load_row_set_text(valid_set().dump(), "ok.json");
  EXPECT_EQ(set.rows[1].inputs.beta_scale, 1.0);
  EXPECT_EQ(set.rows[1].inputs.h0_scale, 1.0);
  EXPECT_EQ(set.rows[1].inputs.dht_scale, 1.0);
  json d = valid_set();
  d["rows"][0]["inputs"] = {{"beta_scale", 1}};
  d["rows"][1]["inputs"] = {{"beta_scale", 1.0}, {"dht_scale", 1}, {"gate_strength", 4}};
  const RowSet named = load_row_set_text(d.dump(), "x");
  EXPECT_EQ(named.row_digests[0], set.row_digests[0]);
  d["rows"][1]["inputs"] = {{"gate_strength", 4}};
  EXPECT_EQ(named.row_digests[1], load_row_set_text(d.dump(), "x").row_digests[1]);
  d["rows"][1]["initial_state"] = true;
  const std::string with_h0 = load_row_set_text(d.dump(), "x").row_digests[1];
  d["rows"][1]["inputs"]["h0_scale"] = 1;
  EXPECT_EQ(load_row_set_text(d.dump(), "x").row_digests[1], with_h0);
  for (const char* key : {"beta_scale", "h0_scale", "dht_scale"}) {
    json e = d;
    e["rows"][1]["inputs"][key] = 0.5;
    const RowSet scaled = load_row_set_text(e.dump(), "x");
    EXPECT_NE(scaled.row_digests[1], with_h0) << key;
    EXPECT_EQ(scaled.row_digests[0], set.row_digests[0]) << key;
  }
  d["rows"][1]["inputs"] = {{"beta_scale", 0.01}, {"h0_scale", 16}, {"dht_scale", 8}};
  const RowSet scaled = load_row_set_text(d.dump(), "x");
  EXPECT_EQ(scaled.rows[1].inputs.beta_scale, 0.01);
  EXPECT_EQ(scaled.rows[1].inputs.h0_scale, 16.0);
  EXPECT_EQ(scaled.rows[1].inputs.dht_scale, 8.0);
}

TEST(RowLoader, EveryMistakeIsNamedWithFilePathExpectedAndFound) {
  const std::vector<BrokenCase> cases = {
      {"unknown key", [](json& d) { d["rows"][0]["headz"] = 3; }, "bad.json: rows[0].headz: unknown key"},
      {"wrong type", [](json& d) { d["rows"][0]["H"] = "two"; }, "rows[0].H: expected an integer, got string \"two\""},
      {"HV not a multiple of H", [](json& d) { d["rows"][0]["HV"] = 3; },
       "rows[0].HV: must be a multiple of H (2), got 3"},
      {"unsupported K", [](json& d) { d["rows"][0]["K"] = 96; },
       "rows[0].K: unsupported head dim (supported: 64, 128), got 96"},
      {"negative length", [](json& d) { d["rows"][1]["seqlens"][0] = -5; }, "rows[1].seqlens[0]: must be >= 0, got -5"},
      {"W too large",
       [](json& d) {
         d["rows"][0]["seqlens"] = {3};
         d["rows"][0]["world"] = 4;
       },
       "rows[0].world: W = 4 is larger than the 3 tokens allow"},
      {"not divisible", [](json& d) { d["rows"][0]["seqlens"] = {513}; },
       "total tokens 513 must be divisible by W = 2"},
      {"forced P too large",
       [](json& d) {
         d["rows"][0]["forms"] = {{"forced_P", {9}}};
       },
       "rows[0].forms.forced_P[0]: the plan cannot take P = 9"},
      {"bad enum", [](json& d) { d["rows"][0]["op"] = "gla"; }, "rows[0].op: expected one of gdn, kda, got \"gla\""},
      {"bad package",
       [](json& d) {
         d["rows"][1]["forms"]["packages"] = {"det", "fast"};
       },
       "rows[1].forms.packages[1]: expected one of det, nondet, got \"fast\""},
      {"lower bound on gdn",
       [](json& d) {
         d["rows"][0]["gate"] = "lower_bound";
         d["rows"][0]["A_log"] = true;
       },
       "rows[0].gate: the lower_bound form exists for kda only"},
      {"softplus without A_log", [](json& d) { d["rows"][0]["gate"] = "softplus"; },
       "rows[0].A_log: the softplus gate form needs A_log: true, got false"},
      {"dht without final state", [](json& d) { d["rows"][0]["dht"] = true; },
       "rows[0].dht: dht needs final_state: true"},
      {"rank_tokens do not add up",
       [](json& d) {
         d["rows"][0]["rank_tokens"] = {100, 300};
       },
       "rows[0].rank_tokens: must add up to the total tokens 512, got 400"},
      {"budget for an absent tensor",
       [](json& d) {
         d["rows"][1]["budgets"]["tensors"]["dh0"] = {{"max_abs", 1}, {"rel_rms", 1}};
       },
       "rows[1].budgets.tensors.dh0: this row does not produce dh0"},
      {"unknown device class", [](json& d) { d["rows"][0]["plan_device"] = "a100"; },
       "rows[0].plan_device: unknown device class (known: h100, h200, b200, gb300, cpu), got \"a100\""},
      {"duplicate name", [](json& d) { d["rows"][1]["name"] = "A1"; }, "rows[1].name: duplicate row name \"A1\""},
      {"bad row name", [](json& d) { d["rows"][0]["name"] = "gdn_big"; }, "rows[0].name: expected a family letter"},
      {"missing field", [](json& d) { d["rows"][0].erase("seqlens"); },
       "rows[0].seqlens: required array of integers is missing"},
      {"wrong schema", [](json& d) { d["schema"] = "rows/0"; }, "schema: expected \"kcpbench.rows/1\", got \"rows/0\""},
      {"unknown gate recipe",
       [](json& d) {
         d["rows"][0]["inputs"] = {{"gate_recipe", "mamba"}};
       },
       "rows[0].inputs.gate_recipe: expected one of logsigmoid, model_init, got \"mamba\""},
      {"model_init with gate_strength",
       [](json& d) {
         d["rows"][0]["inputs"] = {{"gate_recipe", "model_init"}, {"gate_strength", 16}};
       },
       "rows[0].inputs.gate_strength: row A1: gate_recipe \"model_init\" cannot honour gate_strength (it belongs to "
       "gate_recipe \"logsigmoid\"), got 16"},
      {"model_init with gate_mask_p",
       [](json& d) {
         d["rows"][1]["inputs"] = {{"gate_recipe", "model_init"}, {"gate_mask_p", 0.25}};
       },
       "rows[1].inputs.gate_mask_p: row KB1: gate_recipe \"model_init\" cannot honour gate_mask_p"},
      {"model_init on softplus without dt_bias",
       [](json& d) {
         d["rows"][0]["gate"] = "softplus";
         d["rows"][0]["A_log"] = true;
         d["rows"][0]["inputs"] = {{"gate_recipe", "model_init"}};
       },
       "rows[0].dt_bias: row A1: gate_recipe \"model_init\" on the softplus form draws dt_bias and needs dt_bias: "
       "true, got false"},
      {"forced budget key not a P",
       [](json& d) {
         d["rows"][1]["budgets"]["forced"] = {{"two", json::object()}};
       },
       "rows[1].budgets.forced.two: a forced segment count in [1, 64] written as a decimal key, got \"two\""},
      {"forced budget key 0",
       [](json& d) {
         d["rows"][1]["budgets"]["forced"] = {{"0", json::object()}};
       },
       "rows[1].budgets.forced.0: a forced segment count in [1, 64]"},
      {"forced budget of an unknown tensor",
       [](json& d) {
         d["rows"][1]["budgets"]["forced"] = {{"2", {{"oo", {{"max_rel", 0.1}, {"rel_rms", 0.1}}}}}};
       },
       "rows[1].budgets.forced.2.oo: unknown tensor"},
      {"forced budget of a tensor the row lacks",
       [](json& d) {
         d["rows"][0]["budgets"]["forced"] = {{"2", {{"ht", {{"max_rel", 0.1}, {"rel_rms", 0.1}}}}}};
       },
       "rows[0].budgets.forced.2.ht: this row does not produce ht"},
      {"model_init with a weak lower bound",
       [](json& d) {
         d["rows"][1]["dt_bias"] = true;
         d["rows"][1]["lower_bound"] = -1.0;
         d["rows"][1]["inputs"] = {{"gate_recipe", "model_init"}};
       },
       "rows[1].lower_bound: row KB1: gate_recipe \"model_init\" needs lower_bound <= -1.6 (its strongest decay), "
       "got -1"},
      {"beta_scale zero",
       [](json& d) {
         d["rows"][0]["inputs"] = {{"beta_scale", 0}};
       },
       "rows[0].inputs.beta_scale: row A1: must be in (0, 1] (beta = beta_scale * sigmoid(randn)), got 0"},
      {"beta_scale above 1",
       [](json& d) {
         d["rows"][1]["inputs"] = {{"beta_scale", 1.5}};
       },
       "rows[1].inputs.beta_scale: row KB1: must be in (0, 1] (beta = beta_scale * sigmoid(randn)), got 1.5"},
      {"negative h0_scale",
       [](json& d) {
         d["rows"][1]["initial_state"] = true;
         d["rows"][1]["inputs"] = {{"h0_scale", -2}};
       },
       "rows[1].inputs.h0_scale: row KB1: must be a positive finite standard deviation, got -2"},
      {"h0_scale without initial_state",
       [](json& d) {
         d["rows"][0]["inputs"] = {{"h0_scale", 16}};
       },
       "rows[0].inputs.h0_scale: row A1: scales an input the row does not have; it needs initial_state: true, got "
       "inputs.h0_scale = 16"},
      {"zero dht_scale",
       [](json& d) {
         d["rows"][1]["inputs"] = {{"dht_scale", 0}};
       },
       "rows[1].inputs.dht_scale: row KB1: must be a positive finite standard deviation, got 0"},
      {"dht_scale without dht",
       [](json& d) {
         d["rows"][0]["inputs"] = {{"dht_scale", 4}};
       },
       "rows[0].inputs.dht_scale: row A1: scales an input the row does not have; it needs dht: true, got "
       "inputs.dht_scale = 4"},
      {"dht_scale not a number",
       [](json& d) {
         d["rows"][1]["inputs"] = {{"dht_scale", "big"}};
       },
       "rows[1].inputs.dht_scale: expected a number, got string \"big\""},
  };
  for (const auto& c : cases) {
    json d = valid_set();
    c.mutate(d);
    const std::string msg = load_error(d);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": got\n" << msg;
    EXPECT_NE(msg.find("bad.json: "), std::string::npos) << c.what << ": the file must be named";
  }
}

TEST(RowLoader, AllProblemsAreReportedAtOnce) {
  json d = valid_set();
  d["rows"][0]["HV"] = 3;
  d["rows"][0]["K"] = 32;
  d["rows"][1]["op"] = "x";
  d["rows"][1]["bogus"] = 1;
  const std::string msg = load_error(d);
  EXPECT_NE(msg.find("4 problems"), std::string::npos) << msg;
  for (const char* part : {"rows[0].HV", "rows[0].K", "rows[1].op", "rows[1].bogus"})
    EXPECT_NE(msg.find(part), std::string::npos) << part;
}

TEST(RowLoader, NotJsonNamesTheFile) {
  try {
    load_row_set_text("{\"rows\": [1,}", "broken.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.json: not valid JSON"), std::string::npos);
  }
}

// The validation tiers int1 / int3 / int4 cover both operators; ext1 (rows for judging external
// GDN kernels, docs/external.md 11) is GDN only.
TEST(RowLoader, ShippedRowSetsLoadAndCoverBothOperators) {
  const std::string dir = std::string(KCP_TEST_SOURCE_DIR) + "/configs";
  const auto sets = known_row_sets(dir);
  EXPECT_EQ(sets, (std::vector<std::string>{"ext1", "int1", "int3", "int4"}));
  for (const auto& name : {"int1", "int3", "int4"}) {
    RowSet set = load_row_set(resolve_row_file(name, dir));
    bool gdn = false, kda = false;
    for (const auto& r : set.rows) {
      gdn = gdn || r.op == Op::Gdn;
      kda = kda || r.op == Op::Kda;
    }
    EXPECT_TRUE(gdn && kda) << name;
  }
}

TEST(RowLoader, SelectRows) {
  RowSet set = load_row_set_text(valid_set().dump(), "ok.json");
  EXPECT_EQ(select_rows(set, {}).size(), 2u);
  EXPECT_EQ(select_rows(set, {"K*"}).size(), 1u);
  EXPECT_THROW(select_rows(set, {"Z9"}), ConfigError);
}

// Integers are read as 64-bit and range-checked before narrowing: a value past 32 bits is named
// as written, never truncated (H = 4294967298 used to load as H = 2).
TEST(RowLoader, IntegersAreRangeCheckedAsWrittenBeforeNarrowing) {
  const std::vector<BrokenCase> cases = {
      {"H past 32 bits",
       [](json& d) {
         d["rows"][0]["H"] = 4294967298LL;
         d["rows"][0]["HV"] = 4294967298LL;
       },
       "bad.json: rows[0].H: must be in [1, 1024], got 4294967298"},
      {"HV past 32 bits",
       [](json& d) {
         d["rows"][0]["H"] = 4294967298LL;
         d["rows"][0]["HV"] = 4294967298LL;
       },
       "bad.json: rows[0].HV: must be in [1, 1024], got 4294967298"},
      {"world past 32 bits", [](json& d) { d["rows"][0]["world"] = 4294967298LL; },
       "rows[0].world: must be in [1, 4096], got 4294967298"},
      {"world 2^40", [](json& d) { d["rows"][0]["world"] = int64_t(1) << 40; },
       "rows[0].world: must be in [1, 4096], got 1099511627776"},
      {"K past 32 bits", [](json& d) { d["rows"][0]["K"] = 4294967360LL; },
       "rows[0].K: must be in [1, 1024], got 4294967360"},
      {"chunk past 32 bits", [](json& d) { d["rows"][0]["chunk"] = 4294967360LL; },
       "rows[0].chunk: must be in [1, 1024], got 4294967360"},
      {"forced P past 32 bits",
       [](json& d) {
         d["rows"][0]["forms"] = {{"forced_P", {4294967298LL}}};
       },
       "rows[0].forms.forced_P[0]: must be in [1, 64], got 4294967298"},
      {"negative seed", [](json& d) { d["rows"][0]["seed"] = -1; },
       "rows[0].seed: must be in [0, 18446744073709551615], got -1"},
      {"length past int64", [](json& d) { d["rows"][0]["seqlens"] = {18446744073709551615ULL}; },
       "rows[0].seqlens[0]: must be at most 9223372036854775807, got 18446744073709551615"},
      {"lengths summing past 2^64",
       [](json& d) {
         d["rows"][0]["seqlens"] = {9223372036854775807LL, 9223372036854775807LL, 2};
       },
       "rows[0].seqlens: the lengths add up past 9223372036854775807 (64-bit overflow)"},
      {"rank tokens summing past 2^63",
       [](json& d) {
         d["rows"][0]["rank_tokens"] = {9223372036854775807LL, 512};
       },
       "rows[0].rank_tokens: the counts add up past 9223372036854775807 (64-bit overflow)"},
      {"sizes past 64 bits",
       [](json& d) {
         auto& r = d["rows"][0];
         r["H"] = 1024;
         r["HV"] = 1024;
         r["K"] = 128;
         r["V"] = 128;
         r["world"] = 1;
         r["seqlens"] = {int64_t(1) << 44};
       },
       "rows[0] (A1): T x HV x K x V = 17592186044416 x 1024 x 128 x 128 overflows 64-bit sizes"},
  };
  for (const auto& c : cases) {
    json d = valid_set();
    c.mutate(d);
    const std::string msg = load_error(d);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": got\n" << msg;
  }
  // Nothing of the wrapped values survives: no "total length 0", no "got 0", no "got 2".
  json d = valid_set();
  d["rows"][0]["seqlens"] = {9223372036854775807LL, 9223372036854775807LL, 2};
  EXPECT_EQ(load_error(d).find("total length 0"), std::string::npos) << load_error(d);
  d = valid_set();
  d["rows"][0]["world"] = int64_t(1) << 40;
  EXPECT_EQ(load_error(d).find("got 0"), std::string::npos) << load_error(d);
}

// A type error in one field does not stop the checks of the row's other fields, and does not
// produce follow-on errors from the default the unreadable field kept.
TEST(RowLoader, ATypeErrorDoesNotHideTheRowsOtherErrors) {
  json d = valid_set();
  d["rows"][0]["H"] = "two";  // would otherwise stay 1
  d["rows"][0]["K"] = 96;
  d["rows"][0]["dht"] = true;  // needs final_state
  std::string msg = load_error(d);
  EXPECT_NE(msg.find("3 problems"), std::string::npos) << msg;
  for (const char* part : {"rows[0].H: expected an integer, got string \"two\"", "rows[0].K: unsupported head dim",
                           "rows[0].dht: dht needs final_state: true"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << "\n" << msg;
  d = valid_set();
  d["rows"][0]["HV"] = "four";      // the default HV = 1 must not be called "not a multiple of H (2)"
  d["rows"][0]["seqlens"] = {"x"};  // nor the unread lengths "an empty array"
  d["rows"][0]["world"] = 0;
  d["rows"][1]["op"] = 7;  // nor the default gdn "lower_bound exists for kda only"
  msg = load_error(d);
  EXPECT_NE(msg.find("4 problems"), std::string::npos) << msg;
  for (const char* part : {"rows[0].HV: expected an integer", "rows[0].seqlens[0]: expected an integer",
                           "rows[0].world: must be in [1, 4096], got 0", "rows[1].op: expected one of gdn, kda"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << "\n" << msg;
}

// nlohmann::json keeps the last of duplicate keys; the loader refuses them, naming key and path.
TEST(RowLoader, DuplicateKeysAreRefusedNamingKeyAndPath) {
  const std::string text = R"({"schema": "kcpbench.rows/1", "name": "t", "name": "u", "rows": [
      {"name": "A1", "op": "gdn", "H": 2, "HV": 4, "K": 64, "V": 64, "seqlens": [512], "world": 2},
      {"name": "A2", "op": "gdn", "H": 2, "H": 4, "HV": 4, "K": 64, "V": 64, "seqlens": [512],
       "inputs": {"keys": "normal", "keys": "skewed"}, "forms": {"forced_P": [], "saved": ["full"]}}]})";
  try {
    load_row_set_text(text, "dup.json");
    FAIL() << "duplicate keys must be refused";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("3 problems"), std::string::npos) << msg;
    for (const char* part : {"dup.json: name: duplicate key \"name\"", "dup.json: rows[1].H: duplicate key \"H\"",
                             "dup.json: rows[1].inputs.keys: duplicate key \"keys\""})
      EXPECT_NE(msg.find(part), std::string::npos) << part << "\n" << msg;
  }
  // The same key in sibling objects is no duplicate.
  EXPECT_NO_THROW(load_row_set_text(valid_set().dump(), "ok.json"));
}

TEST(RowLoader, ARowSetWithoutRowsIsRefused) {
  json d = valid_set();
  d["rows"] = json::array();
  EXPECT_NE(load_error(d).find("bad.json: rows: the row set holds no rows"), std::string::npos) << load_error(d);
}

TEST(RowLoader, ADirectoryIsNotARowFile) {
  const std::string dir = std::string(KCP_TEST_SOURCE_DIR) + "/configs/rows";
  try {
    load_row_set(dir);
    FAIL() << "a directory must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + ": is a directory, not a row file"), std::string::npos) << e.what();
  }
}

// budgets.forced.P judges the forms forced to P; a forced P without its own budgets, and the
// planned schedule, are judged by budgets.tensors (docs/design.md 6).
TEST(RowLoader, ForcedScheduleBudgetsJudgeTheirOwnSchedule) {
  json d = valid_set();
  d["rows"][1]["budgets"]["forced"] = {{"2", {{"o", {{"max_rel", 0.02}, {"rel_rms", 0.03}}}}}};
  const RowSet set = load_row_set_text(d.dump(), "ok.json");
  const RowConfig& row = set.rows[1];
  ASSERT_EQ(row.forced_budgets.size(), 1u);
  EXPECT_TRUE(row.budgets_at(2).at("o").relative);
  EXPECT_DOUBLE_EQ(row.budgets_at(2).at("o").max_rel, 0.02);
  EXPECT_FALSE(row.budgets_at(0).at("o").relative) << "planned: budgets.tensors (max_abs 0.1)";
  EXPECT_DOUBLE_EQ(row.budgets_at(3).at("o").max_abs, 0.1) << "P = 3 has no budgets of its own";
  EXPECT_EQ(set.row_digests[1], load_row_set_text(valid_set().dump(), "ok.json").row_digests[1])
      << "budgets are not part of the row's digest";
}
