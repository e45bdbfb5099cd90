// configs/rows.schema.json and the row loader accept the same keys, object by object: the key
// sets of the schema's objects against accepted_keys(), the lists the loader rejects unknown
// keys with. Each schema object must also close its key set (additionalProperties: false).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/config/row_loader.h"
#include "core/util/error.h"

using namespace kcp;
using nlohmann::json;

namespace {

json load_schema() {
  const std::string path = std::string(KCP_TEST_SOURCE_DIR) + "/configs/rows.schema.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return json::parse(in);
}

// A schema node with its local "$ref"s ("#/$defs/NAME") followed, until one has "properties".
const json& resolve(const json& schema, const json& node, const std::string& where) {
  const json* n = &node;
  for (int hops = 0; hops < 8; ++hops) {
    if (n->contains("properties")) return *n;
    if (!n->contains("$ref")) break;
    const std::string ref = (*n)["$ref"].get<std::string>();
    const std::string prefix = "#/$defs/";
    if (ref.rfind(prefix, 0) != 0) throw std::runtime_error(where + ": unexpected $ref " + ref);
    n = &schema.at("$defs").at(ref.substr(prefix.size()));
  }
  throw std::runtime_error(where + ": no \"properties\" (directly or through a local $ref)");
}

std::set<std::string> keys_of(const json& resolved) {
  std::set<std::string> out;
  for (auto it = resolved["properties"].begin(); it != resolved["properties"].end(); ++it) out.insert(it.key());
  return out;
}

std::set<std::string> as_set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

// The schema node of each kind of object the loader parses, found by walking the schema the way
// a document nests (not by $defs names, which the schema may rename).
struct SchemaObjects {
  std::map<std::string, const json*> of_kind;
  std::vector<std::pair<std::string, const json*>> all;  // every node checked, with where it is
};

SchemaObjects walk(const json& schema) {
  SchemaObjects s;
  auto add = [&](const std::string& kind, const std::string& where, const json& node) {
    const json& r = resolve(schema, node, where);
    if (!s.of_kind.count(kind)) s.of_kind[kind] = &r;
    s.all.push_back({kind + " at " + where, &r});
    return &r;
  };
  const json* top = add("row_set", "(top)", schema);
  const json* row = add("row", "rows.items", top->at("properties").at("rows").at("items"));
  add("row", "defaults", top->at("properties").at("defaults"));
  add("inputs", "rows.items.inputs", row->at("properties").at("inputs"));
  add("forms", "rows.items.forms", row->at("properties").at("forms"));
  const json* budgets = add("budgets", "rows.items.budgets", row->at("properties").at("budgets"));
  const json* tensors = add("budgets.tensors", "rows.items.budgets.tensors", budgets->at("properties").at("tensors"));
  for (auto it = tensors->at("properties").begin(); it != tensors->at("properties").end(); ++it)
    add("tensor_budget", "rows.items.budgets.tensors." + it.key(), *it);
  return s;
}

std::string listed(const std::set<std::string>& s) {
  std::string out;
  for (const auto& k : s) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "(none)" : out;
}

}  // namespace

TEST(RowSchemaKeys, SchemaCoversEveryKindTheLoaderParses) {
  const auto loader = accepted_keys();
  const json schema = load_schema();
  const SchemaObjects s = walk(schema);  // points into schema
  std::set<std::string> loader_kinds, schema_kinds;
  for (const auto& [k, v] : loader) loader_kinds.insert(k);
  for (const auto& [k, v] : s.of_kind) schema_kinds.insert(k);
  EXPECT_EQ(loader_kinds, schema_kinds) << "a kind of object only one side knows: loader " << listed(loader_kinds)
                                        << "; schema walk " << listed(schema_kinds);
}

TEST(RowSchemaKeys, SameKeysObjectByObject) {
  const auto loader = accepted_keys();
  const json schema = load_schema();
  const SchemaObjects s = walk(schema);  // points into schema
  for (const auto& [where, node] : s.all) {
    const std::string kind = where.substr(0, where.find(" at "));
    auto it = loader.find(kind);
    ASSERT_NE(it, loader.end()) << where << ": the loader has no key list for this kind";
    const std::set<std::string> schema_keys = keys_of(*node), loader_keys = as_set(it->second);
    std::set<std::string> only_schema, only_loader;
    for (const auto& k : schema_keys)
      if (!loader_keys.count(k)) only_schema.insert(k);
    for (const auto& k : loader_keys)
      if (!schema_keys.count(k)) only_loader.insert(k);
    EXPECT_TRUE(only_schema.empty()) << where
                                     << ": the schema accepts keys the loader rejects: " << listed(only_schema);
    EXPECT_TRUE(only_loader.empty()) << where
                                     << ": the loader accepts keys the schema rejects: " << listed(only_loader);
    EXPECT_EQ(node->value("additionalProperties", json(true)), json(false))
        << where << ": the schema must reject unknown keys (additionalProperties: false), as the loader does";
    EXPECT_EQ(it->second.size(), loader_keys.size()) << kind << ": the loader's key list repeats a key";
  }
}

// The lists are what the loader enforces: each accepted key of a row passes the unknown-key
// check, and a key outside the lists fails it, at every level.
TEST(RowSchemaKeys, LoaderRejectsExactlyTheKeysOutsideItsLists) {
  const json base = json::parse(R"({"schema": "kcpbench.rows/1", "name": "t", "rows": [
      {"name": "A1", "op": "gdn", "H": 2, "HV": 2, "K": 64, "V": 64, "seqlens": [512], "world": 1,
       "inputs": {}, "forms": {"packages": ["det"], "saved": ["full"]},
       "budgets": {"tensors": {"o": {"max_abs": 0.1, "rel_rms": 0.1}}}}]})");
  auto unknown_key_error = [](const json& doc, const std::string& path) {
    try {
      load_row_set_text(doc.dump(), "t.json");
    } catch (const ConfigError& e) {
      return std::string(e.what()).find("t.json: " + path + ": unknown") != std::string::npos;
    }
    return false;
  };
  ASSERT_NO_THROW(load_row_set_text(base.dump(), "t.json"));
  const std::map<std::string, json::json_pointer> at = {
      {"row_set", json::json_pointer("")},
      {"row", json::json_pointer("/rows/0")},
      {"inputs", json::json_pointer("/rows/0/inputs")},
      {"forms", json::json_pointer("/rows/0/forms")},
      {"budgets", json::json_pointer("/rows/0/budgets")},
      {"budgets.tensors", json::json_pointer("/rows/0/budgets/tensors")},
      {"tensor_budget", json::json_pointer("/rows/0/budgets/tensors/o")}};
  const std::map<std::string, std::string> path = {{"row_set", ""},
                                                   {"row", "rows[0]."},
                                                   {"inputs", "rows[0].inputs."},
                                                   {"forms", "rows[0].forms."},
                                                   {"budgets", "rows[0].budgets."},
                                                   {"budgets.tensors", "rows[0].budgets.tensors."},
                                                   {"tensor_budget", "rows[0].budgets.tensors.o."}};
  for (const auto& [kind, keys] : accepted_keys()) {
    ASSERT_TRUE(at.count(kind)) << "no test document place for kind " << kind;
    json doc = base;
    doc[at.at(kind)]["zz_not_a_key"] = 1;
    EXPECT_TRUE(unknown_key_error(doc, path.at(kind) + "zz_not_a_key")) << kind << ": an unlisted key passed";
    for (const auto& k : keys) {
      json one = base;
      json& obj = one[at.at(kind)];
      if (obj.contains(k)) continue;  // already there and accepted
      obj[k] = nullptr;               // a wrong value: a type error, never an unknown-key error
      EXPECT_FALSE(unknown_key_error(one, path.at(kind) + k))
          << kind << "." << k << ": a listed key was called unknown";
    }
  }
}
