// Whole-program tests of `kcpbench run` and `kcpbench calibrate` on the CPU twin: the int1 row
// set passes in every form with a complete JSON report, injected faults are caught where they
// were put, cross-package saved sets and workspaces are refused, and int1's budgets are what
// calibrate derives.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "e2e_json.h"
#include "e2e_util.h"

using nlohmann::json;

TEST(Run, Int1PassesEveryRowInEveryFormWithACompleteReport) {
  const std::string out = tmp("int1.json");
  auto r = run_kcpbench("-q run --rows int1 --cache none --json " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(" passed, 0 failed, "), std::string::npos) << r.out;
  json j = read_json(out);
  const json& c = j["context"];
  for (const char* k : {"schema_version", "build", "date", "command_line", "world_size", "launch_mode", "comm",
                        "backend", "device_class", "devices", "row_set", "seeds", "backend_device"})
    EXPECT_TRUE(c.contains(k)) << "context." << k;
  for (const char* k : {"git_sha", "git_dirty", "build_type", "compiler", "cuda", "nccl", "mpi", "reference_simd"})
    EXPECT_TRUE(c["build"].contains(k)) << "context.build." << k;
  EXPECT_EQ(c["schema_version"], "kcpbench.results/1");
  EXPECT_EQ(c["row_set"]["digest"].get<std::string>().size(), 64u);
  int pass = 0, skip = 0, forced = 0, det_checks = 0;
  std::set<std::string> rows;
  for (const auto& e : j["entries"]) {
    rows.insert(e["row"].get<std::string>());
    for (const char* k : {"id", "row", "row_digest", "seed", "form", "plan", "planned_P", "status", "fault"})
      EXPECT_TRUE(e.contains(k)) << e["id"] << " lacks " << k;
    if (e["status"] == "skip") {
      ++skip;
      EXPECT_FALSE(e["reason"].get<std::string>().empty());
      continue;
    }
    ASSERT_EQ(e["status"], "pass") << e.dump(1);
    ++pass;
    forced += e["form"]["P"] != "planned";
    for (const char* t : {"o", "dq", "dk", "dv", "dg", "dbeta"}) {
      const json& m = e["tensors"][t];
      EXPECT_LE(m["ratio_max"].get<double>(), 1.0);
      EXPECT_LE(m["rms_ratio"].get<double>(), 1.0);
      EXPECT_GT(m["max_abs"].get<double>(), 0.0) << "a twin with no error at all would be suspicious";
      EXPECT_EQ(m["nonfinite"], 0);
      for (const char* k : {"rank", "token", "head", "segment", "boundary_distance"})
        EXPECT_TRUE(m["worst"].contains(k));
    }
    // The boundary states (docs/design.md 6): every entry has them; judged ones within budget.
    for (const char* t : {"h_entry", "dh_exit"}) {
      const json& m = e["tensors"][t];
      EXPECT_TRUE(m["pass"].get<bool>()) << e["id"] << " " << t;
      if (m["count"].get<int64_t>() > 0) {
        EXPECT_LE(m["ratio_max"].get<double>(), 1.0) << e["id"] << " " << t;
      }
    }
    EXPECT_EQ(e["memory_bytes_per_rank"].size(), e["plan"]["P"].size());
    EXPECT_GT(e["memory_bytes_per_rank"][0].get<int64_t>(), 0);
    for (const char* k : {"forward", "backward", "total", "wall_total"}) {
      EXPECT_GT(e["timings_ms"][k]["median"].get<double>(), 0.0);
      EXPECT_EQ(e["timings_ms"][k]["count"], 1);
    }
    if (e["form"]["package"] == "det") {
      ++det_checks;
      const json& d = e["determinism"];
      if (e["form"]["saved"] == "full")
        EXPECT_EQ(d["rerun_identical"], true);
      else
        EXPECT_EQ(d["full_vs_light_identical"], true);
    }
  }
  EXPECT_EQ(rows.size(), int1_row_count());
  EXPECT_GE(pass, 60);
  EXPECT_GE(forced, 8) << "forced-P forms ran";
  EXPECT_GE(skip, 4) << "C1's forced forms are skipped by the all_ranks_plan_p1 rule";
  EXPECT_GE(det_checks, 30);
  EXPECT_EQ(j["summary"]["passed"], pass);
  EXPECT_EQ(j["summary"]["complete"], true);
}

TEST(Run, InjectedFaultsFailTheirRowAtTheBoundary) {
  struct Case {
    const char* fault;
    bool state_fault;  // the worst element must sit at distance 0 from the dropped boundary
  };
  for (const Case& c :
       {Case{"drop-segment-entry", true}, Case{"drop-rank-incoming", true}, Case{"skip-output-tile", false}}) {
    const std::string out = tmp(std::string(c.fault) + ".json");
    auto r = run_kcpbench(std::string("-q run --rows int1 --row A1 --package det --saved full --cache none --inject ") +
                          c.fault + " --json " + out);
    EXPECT_EQ(r.code, 1) << c.fault << "\n" << r.out;
    json e = read_json(out)["entries"][0];
    EXPECT_EQ(e["status"], "fail") << c.fault;
    const json& w = e["tensors"]["o"]["worst"];
    EXPECT_EQ(w["rank"], e["fault_at"]["rank"]) << c.fault << " " << e.dump(1);
    if (c.state_fault) {
      EXPECT_EQ(w["boundary_distance"], 0) << c.fault;
      EXPECT_EQ(w["token"], e["fault_at"]["token"]) << c.fault;
    } else {
      EXPECT_GT(e["tensors"]["o"]["nonfinite"].get<int>(), 0);
      EXPECT_EQ(w["token"], e["fault_at"]["token"]);
    }
  }
}

// A package mismatch is the backend's to refuse: each form is an entry of status "refused" with the
// backend's message (exit 1, like any form that did not pass), never a run-ending exit 2.
TEST(Run, CrossPackageSavedSetsAndWorkspacesAreRefusedEntriesNamingBothSides) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--row A1 --package det --saved full --inject saved-to-other-package",
       "saved set from the det package (deterministic=true) passed to the nondet backward; run it through the det "
       "backward"},
      {"--row A1 --package nondet --saved light --inject saved-to-other-package",
       "saved set from the nondet package (deterministic=false) passed to the det backward"},
      {"--row KA1 --package det --saved full --inject workspace-of-other-package",
       "workspace of the nondet package passed to the det package"}};
  for (const Case& c : cases) {
    const std::string out = tmp("refused.json");
    auto r = run_kcpbench("-q run --rows int1 --cache none " + c.args + " --json " + out);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find("REFUSED"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("1 refused"), std::string::npos) << r.out;
    const json doc = read_json(out);
    ASSERT_EQ(doc["entries"].size(), 1u) << doc.dump(1);
    const json& e = doc["entries"][0];
    EXPECT_EQ(e["status"], "refused");
    EXPECT_NE(e["reason"].get<std::string>().find(c.message), std::string::npos) << e.dump(1);
    EXPECT_FALSE(e.contains("tensors"));
    EXPECT_EQ(doc["summary"]["refused"], 1);
    EXPECT_EQ(doc["summary"]["failed"], 0);
  }
}

// A det package that is not reproducible breaks the API contract: the det rerun differs, the
// entry is contract_broken naming the tensor, the run exits 4 (only main picks the code). The
// fault makes o differ by one ulp on every second run; on two ranks only the last rank takes it.
TEST(Run, ADetRerunThatDiffersIsAContractBrokenEntryAndExitsFour) {
  const std::string out = tmp("nondet_rerun.json");
  auto r = run_kcpbench(
      "-q run --rows int1 --cache none --row A1 --package det --saved full --inject "
      "nondeterministic-rerun --json " +
      out);
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("CONTRACT BROKEN: det package: a rerun differs in o"), std::string::npos) << r.out;
  const json doc = read_json(out);
  ASSERT_EQ(doc["entries"].size(), 1u) << doc.dump(1);
  const json& e = doc["entries"][0];
  EXPECT_EQ(e["status"], "contract_broken");
  EXPECT_EQ(e["reason"], "det package: a rerun differs in o");
  EXPECT_EQ(e["determinism"]["rerun_identical"], false);
  EXPECT_EQ(e["determinism"]["differing"], json::array({"o"}));
  EXPECT_EQ(doc["summary"]["contract_broken"], 1);
  // Without the fault the same form passes its det checks (the fault, not the form, broke it).
  auto clean = run_kcpbench("-q run --rows int1 --cache none --row A1 --package det --saved full");
  EXPECT_EQ(clean.code, 0) << clean.out;
}

TEST(Run, BadOptionsExitTwo) {
  EXPECT_EQ(run_kcpbench("run --rows int1 --package fast").code, 2);
  EXPECT_EQ(run_kcpbench("run --rows int1 --P 0").code, 2);
  EXPECT_EQ(run_kcpbench("run --rows int1 --inject bogus").code, 2);
  EXPECT_EQ(run_kcpbench("run --rows int1 --device a100").code, 2);
}

TEST(Calibrate, Int1BudgetsAreReproduced) {
  auto r = run_kcpbench("-q calibrate --rows int1 --cache none --check");
  EXPECT_EQ(r.code, 0) << r.out;
  const std::string want = std::to_string(int1_row_count()) + " rows, 0 differences";
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
}

// The twin limits (docs/design.md 6) on both sides: the long-memory bf16 K = 128 row, whose
// rounding broke the old fixed limit of 5e-3, calibrates; a twin with a broken fold is refused,
// by the exact-storage twin's limit.
TEST(Calibrate, TwinLimitsPassRoundingAndRefuseABrokenTwin) {
  auto ok = run_kcpbench("calibrate --rows int1 --row L1 --seeds 1:2");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("L1    o="), std::string::npos) << ok.out;
  for (const char* fault : {"drop-rank-incoming", "drop-segment-entry"}) {
    auto bad = run_kcpbench(std::string("calibrate --rows int1 --row W1 --seeds 1 --inject ") + fault);
    EXPECT_EQ(bad.code, 1) << fault << "\n" << bad.out;
    EXPECT_NE(bad.out.find("the twin's algorithm is wrong"), std::string::npos) << bad.out;
    EXPECT_NE(bad.out.find("refusing to derive budgets"), std::string::npos) << bad.out;
  }
}

// --seeds runs every row at other seeds; entries record the seed, ids say it where it is not the
// row's own, and the row's own seed given explicitly changes nothing.
TEST(Run, SeedsRunRowsAtOtherSeedsAndEntriesRecordThem) {
  const std::string out = tmp("seeds.json"), own = tmp("seed1.json"), plain = tmp("seed_plain.json");
  const std::string common = "-q run --rows int1 --row A1 --package det --saved full --P planned ";
  auto r = run_kcpbench(common + "--seeds 2:3 --json " + out);
  EXPECT_EQ(r.code, 0) << r.out;
  const json doc = read_json(out);
  ASSERT_EQ(doc["entries"].size(), 2u);
  EXPECT_EQ(doc["entries"][0]["seed"], 2);
  EXPECT_EQ(doc["entries"][0]["id"], "A1/det/full/planned/seed2");
  EXPECT_EQ(doc["entries"][1]["seed"], 3);
  EXPECT_NE(doc["entries"][0]["tensors"]["o"]["ref_max_abs"], doc["entries"][1]["tensors"]["o"]["ref_max_abs"]);
  ASSERT_EQ(run_kcpbench(common + "--seed 1 --json " + own).code, 0);
  ASSERT_EQ(run_kcpbench(common + "--json " + plain).code, 0);
  const json a = read_json(own)["entries"][0], b = read_json(plain)["entries"][0];
  EXPECT_EQ(a["id"], b["id"]);
  EXPECT_EQ(a["tensors"], b["tensors"]);
  EXPECT_EQ(run_kcpbench(common + "--seeds 3:2").code, 2);
  EXPECT_EQ(run_kcpbench(common + "--seeds x").code, 2);
}

TEST(Run, DumpWritesNpyFilesAndAManifest) {
  // A folder of this process: --dump refuses a folder holding files no earlier dump of its own
  // lists, and TempDir is shared by every checkout's tests.
  const std::string dir = tmp("dump-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto r = run_kcpbench("-q run --rows int1 --row D1 --package nondet --saved light --cache none --dump " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  json m = read_json(dir + "/manifest.json");
  EXPECT_EQ(m["schema"], "kcpbench.dump/1");
  std::set<std::string> kinds;
  for (const auto& f : m["files"]) {
    kinds.insert(f["kind"].get<std::string>() + ":" + f["tensor"].get<std::string>());
    std::ifstream in(dir + "/" + f["file"].get<std::string>(), std::ios::binary);
    char magic[6] = {};
    in.read(magic, 6);
    EXPECT_EQ(std::string(magic + 1, 5), "NUMPY") << f["file"];
    in.seekg(0, std::ios::end);
    int64_t n = 1;
    for (auto d : f["shape"]) n *= d.get<int64_t>();
    const int64_t bytes = n * (f["dtype"] == "float64" ? 8 : 4);
    EXPECT_EQ(int64_t(in.tellg()) % 64, bytes % 64) << "header padded to 64 bytes";
    EXPECT_GT(int64_t(in.tellg()), bytes);
  }
  for (const char* k : {"input:q", "input:dO", "input:h0", "input:dht", "reference:o", "reference:dh0", "backend:o",
                        "backend:dq", "backend:ht"})
    EXPECT_TRUE(kinds.count(k)) << k;
  std::filesystem::remove_all(dir);
}

TEST(Run, DeadlineTurnsAHangIntoExitFiveNamingRankRowAndPhase) {
  auto r = run_kcpbench(
      "-q run --rows int1 --row B1 --package det --saved full --cache none --inject hang --inject-rank 2 "
      "--deadline 2");
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_NE(r.out.find("[r2] deadline of 2 s passed: row B1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("in phase 'det/full/planned injected hang'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("in phase 'det/full/planned forward exchange'"), std::string::npos) << r.out;
}

// The JSON is rewritten after every row, so a run the deadline cuts short keeps the rows it
// finished (A2 has one rank, so the hang on rank 2 cannot be placed there; B1 then hangs).
TEST(Run, ACutShortRunKeepsItsFinishedRowsInTheJson) {
  const std::string out = tmp("cut_short.json");
  std::remove(out.c_str());
  auto r = run_kcpbench(
      "-q run --rows int1 --row A2 --row B1 --package det --saved full --cache none --inject hang "
      "--inject-rank 2 --deadline 2 --json " +
      out);
  EXPECT_EQ(r.code, 5) << r.out;
  const json j = read_json(out);
  EXPECT_EQ(j["summary"]["complete"], false);
  ASSERT_FALSE(j["entries"].empty());
  for (const json& e : j["entries"]) EXPECT_EQ(e["row"], "A2") << e.dump();
}

// A deadline abort used to overwrite a complete results file with an incomplete one, silently:
// the rows of a run go beside it (X.partial) until the run completes, and the abort says where.
TEST(Run, ADeadlineAbortKeepsACompleteFileAndWritesThePartialBeside) {
  const std::string out = tmp("keep_complete.json"), partial = out + ".partial";
  std::remove(partial.c_str());
  auto first =
      run_kcpbench("-q run --rows int1 --row A2 --package det --saved full --P planned --cache none --json " + out);
  ASSERT_EQ(first.code, 0) << first.out;
  const json before = read_json(out);
  ASSERT_EQ(before["summary"]["complete"], true);
  auto r = run_kcpbench(
      "-q run --rows int1 --row A2 --row B1 --package det --saved full --cache none --inject hang "
      "--inject-rank 2 --deadline 2 --json " +
      out);
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_EQ(read_json(out), before) << "the complete file must be left as it was";
  const json cut = read_json(partial);
  EXPECT_EQ(cut["summary"]["complete"], false);
  EXPECT_NE(r.out.find("the rows finished before the deadline are in " + partial), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(out + " was left as it was"), std::string::npos) << r.out;
  // compare flags the incomplete side
  auto c = run_kcpbench("compare " + out + " " + partial);
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_NE(c.out.find("NEW is incomplete"), std::string::npos) << c.out;
  // a run that completes replaces the file and removes the partial
  auto again =
      run_kcpbench("-q run --rows int1 --row A2 --package det --saved full --P planned --cache none --json " + out);
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_FALSE(std::filesystem::exists(partial));
}

TEST(Run, AFaultThePlanCannotTakeIsASkipNotAnError) {
  const std::string out = tmp("fault_skip.json");
  auto r = run_kcpbench(
      "-q run --rows int1 --row A2 --package det --saved full --P 1,2 --inject drop-segment-entry "
      "--cache none --json " +
      out);
  EXPECT_EQ(r.code, 1) << r.out;  // P = 2 takes the fault and fails
  json j = read_json(out);
  ASSERT_EQ(j["entries"].size(), 2u);
  EXPECT_EQ(j["entries"][0]["status"], "skip");
  EXPECT_NE(j["entries"][0]["reason"].get<std::string>().find("needs a rank that cuts a piece"), std::string::npos);
  EXPECT_EQ(j["entries"][1]["status"], "fail");
}

// -q used to drop the whole table, so a failing run printed only the counts: it keeps the FAIL
// lines (and CONTRACT BROKEN, and skips for an error) and drops only PASS lines and plain skips.
TEST(Run, QuietKeepsTheFailLinesAndDropsOnlyThePassLines) {
  auto r = run_kcpbench(
      "-q run --rows int1 --row A2 --package det --saved full --P 1,2 --inject drop-segment-entry --cache none");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("A2   det/full/P=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("skipped:"), std::string::npos) << "a planned skip is no error:\n" << r.out;
  EXPECT_NE(r.out.find("0 passed, 1 failed, 1 skipped"), std::string::npos) << r.out;
  auto p = run_kcpbench("-q run --rows int1 --row A2 --package det --saved full --P planned --cache none");
  EXPECT_EQ(p.code, 0) << p.out;
  EXPECT_EQ(p.out.find("PASS"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("1 passed, 0 failed, 0 skipped"), std::string::npos) << p.out;
}

namespace {
// Row A2 of int1 (one rank, 768 tokens) with `budgets` (JSON text, "" for none).
std::string a2_rows(const std::string& name, const std::string& budgets) {
  const std::string path = tmp(name);
  std::ofstream(path) << R"({"schema": "kcpbench.rows/1", "name": "t", "defaults": {"plan_device": "cpu", "dtype": )"
                      << R"("bf16", "seed": 1, "inputs": {"gate_strength": 16}}, "rows": [{"name": "A2", "op": "gdn", )"
                      << R"("H": 2, "HV": 2, "K": 64, "V": 64, "seqlens": [768], "world": 1)"
                      << (budgets.empty() ? "" : R"(, "budgets": )" + budgets) << "}]}";
  return path;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}
}  // namespace

// The table: a header line; a FAIL line is short (the worst tensor and its ratio and where its
// worst element sits; every reason stays in the JSON) where it used to list every tensor (past 300
// characters); ratios past 1e6 print in scientific notation (they printed hundreds of digits); a
// row without budgets prints what it measured and "no budget" (it printed ratio_max 0.0000).
TEST(Run, TheTableHasAHeaderShortFailLinesAndReadableRatios) {
  std::string tiny = R"({"source": "test: budgets 1e-30", "tensors": {)";
  for (const char* t : {"o", "dq", "dk", "dv", "dg", "dbeta", "h_entry", "dh_exit"})
    tiny += std::string(t == std::string("o") ? "" : ", ") + "\"" + t + R"(": {"max_abs": 1e-30, "rel_rms": 1e-30})";
  tiny += "}}";
  const std::string out = tmp("tiny_budgets.json");
  auto r = run_kcpbench("run --rows " + a2_rows("tiny_budgets_rows.json", tiny) +
                        " --package det --saved full --P planned --cache none --json " + out);
  EXPECT_EQ(r.code, 1) << r.out;
  const auto lines = lines_of(r.out);
  size_t header = lines.size(), fail = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find("ratio_max") != std::string::npos && lines[i].find("verdict") != std::string::npos) header = i;
    if (lines[i].find("FAIL") != std::string::npos) fail = i;
  }
  ASSERT_LT(header, lines.size()) << "no header line:\n" << r.out;
  ASSERT_LT(fail, lines.size()) << r.out;
  EXPECT_LT(header, fail);
  const std::string& f = lines[fail];
  EXPECT_LT(f.size(), 200u) << f;
  EXPECT_NE(f.find("e+"), std::string::npos) << "a ratio near 1e28 in scientific notation: " << f;
  EXPECT_NE(f.find("(+7 more tensors)"), std::string::npos) << f;
  EXPECT_NE(f.find("at rank 0, token "), std::string::npos) << f;
  EXPECT_NE(f.find(", segment "), std::string::npos) << f;
  const json e = read_json(out)["entries"][0];
  EXPECT_NE(e["reason"].get<std::string>().find("dbeta: ratio_max"), std::string::npos)
      << "the JSON keeps every reason";

  auto nb = run_kcpbench("run --rows " + a2_rows("no_budgets_rows.json", "") +
                         " --package det --saved full --P planned --cache none");
  EXPECT_EQ(nb.code, 1) << nb.out;
  EXPECT_EQ(nb.out.find("0.0000"), std::string::npos) << nb.out;
  EXPECT_NE(nb.out.find("max-abs "), std::string::npos) << nb.out;
  EXPECT_NE(nb.out.find("rel-RMS "), std::string::npos) << nb.out;
  EXPECT_NE(nb.out.find("FAIL: no budget (run kcpbench calibrate)"), std::string::npos) << nb.out;
}

// calibrate used to print "FAIL: no budget" lines for the rows it calibrates: it prints what it
// measures.
TEST(Run, CalibratePrintsWhatItMeasuresNotFailLines) {
  const std::string rows = a2_rows("calibrate_rows.json", "");
  auto r = run_kcpbench("calibrate --rows " + rows + " --cache none");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no budget"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max-abs "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("measured"), std::string::npos) << r.out;
}

// --write stores the budgets with their provenance (formula, seeds, the host, date and build) in
// a file that loads again, judges a run and passes --check.
TEST(Calibrate, WriteStoresBudgetsWithProvenanceThatLoadAgain) {
  const std::string rows = a2_rows("write_rows.json", "");
  auto w = run_kcpbench("-q calibrate --rows " + rows + " --seeds 1:2 --cache none --write");
  ASSERT_EQ(w.code, 0) << w.out;
  const json b = read_json(rows)["rows"][0]["budgets"];
  EXPECT_EQ(b["seeds"], json::array({1, 2}));
  EXPECT_NE(b["source"].get<std::string>().find("max_rel = 2 x"), std::string::npos) << b;
  const std::string on = b["calibrated_on"].get<std::string>();
  EXPECT_NE(on.find(" cores and "), std::string::npos) << on;
  EXPECT_NE(on.find("kcpbench "), std::string::npos) << on;
  EXPECT_GT(b["tensors"]["o"]["max_rel"].get<double>(), 0.0) << b;
  EXPECT_EQ(run_kcpbench("-q calibrate --rows " + rows + " --seeds 1:2 --cache none --check").code, 0);
  auto r = run_kcpbench("-q run --rows " + rows + " --package det --saved full --P planned --cache none");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(Run, ReferenceDiskCacheGivesTheSameMetrics) {
  const std::string cache = tmp("refcache"), a = tmp("cache_a.json"), b = tmp("cache_b.json");
  std::filesystem::remove_all(cache);
  ASSERT_EQ(
      run_kcpbench("-q run --rows int1 --row D1 --package det --saved full --cache " + cache + " --json " + a).code, 0);
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(cache)) files += f.path().extension() == ".bin";
  EXPECT_EQ(files, 2) << "one file per sequence";
  ASSERT_EQ(
      run_kcpbench("-q run --rows int1 --row D1 --package det --saved full --cache " + cache + " --json " + b).code, 0);
  EXPECT_EQ(read_json(a)["entries"][0]["tensors"], read_json(b)["entries"][0]["tensors"]);
}

TEST(Run, BenchTimesEveryPhaseEachRankRanInTheJsonAndTheTable) {
  // Four ranks (threads) of row A3, planned P: every rank folds, so both sections hold every phase
  // the driver calls; each is timed on its own runs (--repeats of them). The forward's output is
  // formed in its fwd_states call (chunk_fwd.h: FwdStateArgs::output) and the backward's finalize in
  // its bwd_grads call (chunk_bwd.h: BwdGradArgs::finalize), so neither fwd_output nor bwd_finalize
  // is timed; the full saved set keeps W and U, so the backward does not run wy.
  const std::string out = tmp("bench_phases.json");
  auto r = run_kcpbench(
      "run --rows int1 --row A3 --package nondet --saved full --P planned --bench --warmup 1 "
      "--repeats 5 --cache none --json " +
      out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("forward  phases, median ms:  prep "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("backward phases, median ms:  fold "), std::string::npos) << r.out;
  const json j = read_json(out);
  ASSERT_EQ(j["entries"].size(), 1u);
  const json& t = j["entries"][0]["timings_ms"];
  EXPECT_EQ(t["total"]["count"], 5);
  const std::set<std::string> want = {
      "forward.prep",           "forward.wy",          "forward.fwd_summaries", "forward.fold",
      "forward.fwd_states",     "backward.fold",       "backward.fwd_states",   "backward.bwd_local_dv",
      "backward.bwd_summaries", "backward.bwd_states", "backward.bwd_grads"};
  std::set<std::string> got;
  double sum[2] = {0.0, 0.0};
  for (const auto& [name, st] : t["phases"].items()) {
    got.insert(name);
    EXPECT_EQ(st["count"], 5) << name;
    EXPECT_GT(st["min"].get<double>(), 0.0) << name;
    EXPECT_LE(st["min"].get<double>(), st["median"].get<double>()) << name;
    EXPECT_LE(st["median"].get<double>(), st["max"].get<double>()) << name;
    sum[name.rfind("backward.", 0) == 0] += st["median"].get<double>();
  }
  for (const std::string& name : want) EXPECT_TRUE(got.count(name)) << "no timing for " << name << ": " << t.dump(1);
  EXPECT_FALSE(got.count("forward.fwd_output")) << t.dump(1);
  EXPECT_FALSE(got.count("backward.bwd_finalize")) << t.dump(1);
  EXPECT_FALSE(got.count("backward.wy")) << t.dump(1);
  // The phases make up the section: their medians add to about its total (slowest rank per phase
  // vs per run, and the timers' gaps, keep it from being exact).
  const char* sections[2] = {"forward", "backward"};
  for (int s = 0; s < 2; ++s) {
    const double total = t[sections[s]]["median"].get<double>();
    EXPECT_GT(sum[s], 0.5 * total) << sections[s];
    EXPECT_LT(sum[s], 2.0 * total) << sections[s];
  }
}

// A long row (steps announced) rewrites the JSON after each of its forms, not only at its end:
// an int4 row takes minutes a form, and a run cut short keeps the forms it finished. The first
// file the run writes is copied as soon as it appears: it holds the first form only.
TEST(Run, ALongRowWritesEachFinishedFormToTheJson) {
  const std::string rows = tmp("long_row_forms.json"), out = tmp("long_row_forms_out.json"), first = out + ".first";
  std::remove(out.c_str());
  std::remove(first.c_str());
  std::ofstream(rows) << R"({"schema": "kcpbench.rows/1", "name": "large", "rows": [
    {"name": "L1", "op": "gdn", "H": 3, "HV": 9, "K": 128, "V": 128, "seqlens": [8192], "world": 1,
     "plan_device": "cpu", "forms": {"packages": ["nondet"], "saved": ["full", "light"]}}]})";
  const CmdResult r =
      run_command("( " + std::string(KCPBENCH_EXE) + " -q run --rows " + rows + " --cache none --json " + out +
                  " & pid=$!; while kill -0 $pid 2>/dev/null; do [ -f " + out + " ] && [ ! -f " + first + " ] && cp " +
                  out + " " + first + "; sleep 0.1; done; wait $pid )");
  EXPECT_EQ(r.code, 1) << r.out;  // no budgets: both entries fail "no budget"
  const json early = read_json(first), end = read_json(out);
  EXPECT_EQ(early["summary"]["complete"], false);
  ASSERT_EQ(early["entries"].size(), 1u) << early.dump().substr(0, 400);
  EXPECT_EQ(early["entries"][0]["id"], "L1/nondet/full/planned");
  EXPECT_EQ(end["summary"]["complete"], true);
  ASSERT_EQ(end["entries"].size(), 2u);
  EXPECT_EQ(end["entries"][0], early["entries"][0]);
}

TEST(Run, LargeRowsAnnounceTheirReferenceAndFormsOnStderrSmallOnesDoNot) {
  // 8192 tokens x 9 value heads x 128 x 128 state elements: just above the 2^30 threshold. No
  // budgets (the entry fails "no budget"); this test is about the progress lines only. Two ranks:
  // the reference split line reads the row's cache, which the other rank must not release first
  // (it once did: a use after free).
  const std::string rows = tmp("large_row.json");
  std::ofstream(rows) << R"({"schema": "kcpbench.rows/1", "name": "large", "rows": [
    {"name": "L1", "op": "gdn", "H": 3, "HV": 9, "K": 128, "V": 128, "seqlens": [8192], "world": 2,
     "plan_device": "cpu", "forms": {"packages": ["nondet"], "saved": ["full"]}}]})";
  const CmdResult big = run_kcpbench("run --rows " + rows + " --cache none");
  EXPECT_EQ(big.code, 1) << big.out;  // judged (no budget), not a crash
  EXPECT_NE(big.out.find("[1/1] L1: FP64 reference of 8192 tokens, 9 value heads ..."), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("[1/1] L1: FP64 reference ready ("), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("[1/1] L1: FP64 reference split: recurrence "), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("[1/1] L1 nondet/full/planned: running ..."), std::string::npos) << big.out;
  // Where the form's host time went: one line after the form, before its table line.
  const size_t host = big.out.find("[1/1] L1 nondet/full/planned: rank 0 host time: inputs ");
  EXPECT_NE(host, std::string::npos) << big.out;
  EXPECT_NE(big.out.find(" s, run ", host), std::string::npos) << big.out;
  EXPECT_NE(big.out.find(" s, judge ", host), std::string::npos) << big.out;
  const CmdResult quiet = run_kcpbench("-q run --rows " + rows + " --cache none");
  EXPECT_EQ(quiet.out.find("FP64 reference of"), std::string::npos) << quiet.out;
  const CmdResult small = run_kcpbench("run --rows int1 --row A1 --package nondet --saved full --cache none");
  EXPECT_EQ(small.code, 0) << small.out;
  EXPECT_EQ(small.out.find("FP64 reference"), std::string::npos) << small.out;
  EXPECT_EQ(small.out.find(": running"), std::string::npos) << small.out;
  EXPECT_EQ(small.out.find("host time"), std::string::npos) << small.out;
}
