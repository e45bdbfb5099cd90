// The typed results document (core/report/results.h): every committed results file reads into the
// types and writes back to the same JSON, and a corrupt document is refused with the JSON path of
// the bad field.
#include "core/report/results.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/report/report.h"
#include "core/util/error.h"

using nlohmann::json;

namespace {

namespace fs = std::filesystem;

json read(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

// Every committed kcpbench results file: the JSON files under results/ whose
// context.schema_version is kcpbench.results/1 (others, e.g. scripts/fla_bench.py's timings of
// FLA, have their own schema; tests/scripts/schema_test.py uses the same rule).
std::vector<fs::path> committed_results() {
  std::vector<fs::path> out;
  for (const auto& f : fs::recursive_directory_iterator(fs::path(KCP_TEST_SOURCE_DIR) / "results")) {
    if (!f.is_regular_file() || f.path().extension() != ".json") continue;
    const json doc = read(f.path());
    if (doc.value("context", json::object()).value("schema_version", "") == "kcpbench.results/1")
      out.push_back(f.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The message of the ConfigError that results_from_json throws on `doc` ("" when none).
std::string refusal(const json& doc) {
  try {
    (void)kcp::results_from_json(doc);
  } catch (const kcp::ConfigError& e) {
    return e.what();
  }
  return "";
}

// The first entry of the CPU baseline that ran, and its index.
size_t first_run_entry(const json& doc) {
  for (size_t i = 0; i < doc["entries"].size(); ++i)
    if (doc["entries"][i]["status"] == "pass") return i;
  ADD_FAILURE() << "no passing entry";
  return 0;
}

TEST(Results, EveryCommittedFileRoundTrips) {
  const auto files = committed_results();
  ASSERT_GE(files.size(), 2u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const json doc = read(f);
    const kcp::Results r = kcp::results_from_json(doc);
    EXPECT_EQ(r.entries.size(), doc["entries"].size());
    const json back = kcp::to_json(r);
    EXPECT_EQ(back, doc);
    if (back != doc)  // name the first entry that differs
      for (size_t i = 0; i < doc["entries"].size(); ++i)
        if (back["entries"][i] != doc["entries"][i]) {
          ADD_FAILURE() << "entries[" << i << "] differs: " << json::diff(doc["entries"][i], back["entries"][i]).dump();
          break;
        }
    EXPECT_EQ(back.dump(2), doc.dump(2));
  }
}

TEST(Results, TypedFieldsOfTheBaseline) {
  const json doc = read(fs::path(KCP_TEST_SOURCE_DIR) / "results/cpu/baseline/int1.json");
  const kcp::Results r = kcp::results_from_json(doc);
  EXPECT_EQ(r.context.schema_version, "kcpbench.results/1");
  ASSERT_TRUE(r.summary);
  const size_t i = first_run_entry(doc);
  const kcp::Entry& e = r.entries[i];
  ASSERT_TRUE(e.tensors && e.form);
  EXPECT_TRUE(e.ran());
  EXPECT_EQ(e.id, doc["entries"][i]["id"].get<std::string>());
  const auto& o = e.tensors->at("o");
  EXPECT_EQ(o.name, "o");
  EXPECT_EQ(o.ratio_max, doc["entries"][i]["tensors"]["o"]["ratio_max"].get<double>());
  EXPECT_EQ(o.worst.token, doc["entries"][i]["tensors"]["o"]["worst"]["token"].get<int64_t>());
  ASSERT_TRUE(e.timings_ms.total);
  EXPECT_GE(e.timings_ms.total->count, 1);
}

TEST(Results, DeletedTensorsAreRefusedWithTheirPath) {
  json doc = read(fs::path(KCP_TEST_SOURCE_DIR) / "results/cpu/baseline/int1.json");
  const size_t i = first_run_entry(doc);
  doc["entries"][i].erase("tensors");
  const std::string msg = refusal(doc);
  EXPECT_NE(msg.find("entries[" + std::to_string(i) + "].tensors: missing"), std::string::npos) << msg;
}

TEST(Results, AStringRatioIsRefusedWithItsPath) {
  json doc = read(fs::path(KCP_TEST_SOURCE_DIR) / "results/cpu/baseline/int1.json");
  const size_t i = first_run_entry(doc);
  doc["entries"][i]["tensors"]["dq"]["ratio_max"] = "abc";
  const std::string msg = refusal(doc);
  EXPECT_NE(msg.find("entries[" + std::to_string(i) + "].tensors.dq.ratio_max: expected a number or null, got \"abc\""),
            std::string::npos)
      << msg;
}

TEST(Results, OtherCorruptionsNameTheirPath) {
  const json base = read(fs::path(KCP_TEST_SOURCE_DIR) / "results/cpu/baseline/int1.json");
  const size_t i = first_run_entry(base);
  const std::string e = "entries[" + std::to_string(i) + "]";
  struct Case {
    std::function<void(json&)> corrupt;
    std::string path;
  };
  const std::vector<Case> cases = {
      {[&](json& d) { d["entries"][i]["status"] = 3; }, e + ".status: expected a string, got 3"},
      {[&](json& d) { d["entries"][i]["form"]["P"] = "sometimes"; },
       e + ".form.P: expected \"planned\" or a segment count"},
      {[&](json& d) { d["entries"][i]["timings_ms"]["total"]["count"] = 1.5; },
       e + ".timings_ms.total.count: expected an integer"},
      {[&](json& d) { d["entries"][i]["tensors"]["o"]["worst"]["token"] = "x"; },
       e + ".tensors.o.worst.token: expected an integer"},
      {[&](json& d) { d["entries"][i]["memory_bytes_per_rank"][0] = true; },
       e + ".memory_bytes_per_rank[0]: expected an integer"},
      {[&](json& d) { d["entries"][i]["determinism"] = "yes"; }, e + ".determinism: expected an object"},
      {[&](json& d) { d["context"]["world_size"] = "2"; }, "context.world_size: expected an integer"},
      {[&](json& d) { d["summary"]["passed"] = nullptr; }, "summary.passed: expected an integer"},
      {[&](json& d) { d["entries"] = json::object(); }, "entries: expected an array"},
      {[&](json& d) { d["entries"][i] = 7; }, e + ": expected an object"},
  };
  for (const auto& c : cases) {
    json doc = base;
    c.corrupt(doc);
    const std::string msg = refusal(doc);
    EXPECT_NE(msg.find(c.path), std::string::npos) << "want \"" << c.path << "\", got \"" << msg << "\"";
  }
}

TEST(Results, NonFiniteNumbersAreWrittenAsNullAndReadAsNaN) {
  kcp::TensorMetrics m;
  m.name = "dk";
  m.max_abs = std::numeric_limits<double>::infinity();
  m.rel_rms = std::nan("");
  m.has_budget = true;
  m.budget = kcp::Budget::absolute(1e-3, 1e-3);
  m.ratio_max = std::numeric_limits<double>::infinity();
  const json j = kcp::to_json(m);
  EXPECT_TRUE(j["max_abs"].is_null());
  EXPECT_TRUE(j["rel_rms"].is_null());
  EXPECT_TRUE(j["ratio_max"].is_null());
  EXPECT_EQ(j["rms_ratio"], 0.0);
  const kcp::TensorMetrics back = kcp::tensor_metrics_from_json(j, "t", "dk");
  EXPECT_TRUE(std::isnan(back.max_abs));
  EXPECT_TRUE(std::isnan(back.ratio_max));
  EXPECT_TRUE(back.has_budget);
  EXPECT_EQ(kcp::to_json(back), j);

  m.has_budget = false;  // without a budget the ratios are not written
  const json nb = kcp::to_json(m);
  EXPECT_TRUE(nb["budget"].is_null());
  EXPECT_FALSE(nb.contains("ratio_max"));
  EXPECT_FALSE(kcp::tensor_metrics_from_json(nb, "t", "dk").has_budget);
}

}  // namespace

// A write that fails (here: the target is a folder, so the rename fails) leaves no stray .tmp.
TEST(Results, AFailedWriteLeavesNoTempFile) {
  const fs::path dir = fs::path(::testing::TempDir()) / "write_atomic_dir";
  fs::create_directories(dir);
  EXPECT_THROW(kcp::write_json_atomic(dir.string(), json{{"a", 1}}), kcp::Error);
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
}
