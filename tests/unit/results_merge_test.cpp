// `kcpbench merge` logic (core/report/results_merge.h) on synthetic results: what merges, how the
// sources are recorded and indexed (also when a merged file merges again), how the summary is
// counted, launch skips of rows another file ran, and every refusal (another build, device or row
// set, a dirty tree, an id twice, no summary, a corrupt source index).
#include "core/report/results_merge.h"

#include <gtest/gtest.h>

#include "core/util/error.h"

using kcp::Entry;
using kcp::merge_results;
using kcp::MergeInput;
using kcp::Results;

namespace {

Results run_file(const std::vector<std::string>& ids, uint64_t seed, int world, const std::string& cmd) {
  Results r;
  auto& c = r.context;
  c.schema_version = "kcpbench.results/1";
  c.build.git_sha = "abc";
  c.build.version = "0.1.0";
  c.date = "2026-12-0" + std::to_string(seed) + "T00:00:00Z";
  c.command_line = {"kcpbench", "run", cmd};
  c.world_size = world;
  c.devices.assign(world, "cuda");
  c.launch_mode = "threads";
  c.comm = "local";
  c.backend = "cuda";
  c.backend_device = "NVIDIA H200 (132 SMs, sm_90)";
  c.device_class = "h200";
  c.seeds = {seed};
  c.row_set = {"int3", "configs/rows/int3.json", std::string(64, 'a')};
  for (const std::string& id : ids) {
    Entry e;
    e.id = id;
    e.row = id.substr(0, id.find('/'));
    e.row_digest = "digest-" + e.row;
    e.seed = seed;
    e.fault = "none";
    e.form = kcp::EntryForm{"det", "full", 0};
    e.status = "pass";
    e.tensors.emplace();
    r.entries.push_back(e);
  }
  r.summary = kcp::Summary{int(ids.size()), 0, 0, 0, 0, true};
  return r;
}

// A row an mpirun of another world size could not run: one skip entry without a form.
Entry launch_skip(const std::string& row, uint64_t seed) {
  Entry e;
  e.id = row;
  e.row = row;
  e.row_digest = "digest-" + row;
  e.seed = seed;
  e.status = "skip";
  e.reason = "row " + row + " needs W = 8 ranks, this launch has 4";
  return e;
}

const std::vector<std::string> kCmd = {"kcpbench", "merge", "a", "b"};

}  // namespace

TEST(Merge, EntriesInOrderWithTheirSourcesAndTheSummaryCounted) {
  Results a = run_file({"A4/det/full/planned", "A4/det/light/planned"}, 2, 8, "--row A4");
  Results b = run_file({"B4/det/full/planned"}, 1, 4, "--row B4");
  b.summary->complete = false;
  const Results m = merge_results({{"a.json", a}, {"b.json", b}}, kCmd, "2026-12-07T00:00:00Z").results;
  ASSERT_EQ(m.entries.size(), 3u);
  EXPECT_EQ(m.entries[0].id, "A4/det/full/planned");
  EXPECT_EQ(m.entries[2].id, "B4/det/full/planned");
  EXPECT_EQ(m.entries[0].source, 0);
  EXPECT_EQ(m.entries[1].source, 0);
  EXPECT_EQ(m.entries[2].source, 1);
  ASSERT_TRUE(m.context.merged_from);
  ASSERT_EQ(m.context.merged_from->size(), 2u);
  EXPECT_EQ((*m.context.merged_from)[1].file, "b.json");
  EXPECT_EQ((*m.context.merged_from)[1].command_line, b.context.command_line);
  EXPECT_EQ((*m.context.merged_from)[0].date, a.context.date);
  EXPECT_EQ(m.context.command_line, kCmd);
  EXPECT_EQ(m.context.date, "2026-12-07T00:00:00Z");
  EXPECT_EQ(m.context.seeds, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(m.context.world_size, 8);
  EXPECT_EQ(m.context.devices.size(), 8u);
  EXPECT_EQ(m.summary->passed, 3) << "counted from the entries, as run counts";
  EXPECT_EQ(m.summary->failed, 0);
  EXPECT_EQ(m.summary->skipped, 0);
  EXPECT_EQ(m.summary->complete, false) << "b was cut short";

  // Through JSON and back: the sources and indices survive, and a merged file merges again
  // with its sources listed flat (indices moved past the earlier files').
  const Results back = kcp::results_from_json(kcp::to_json(m));
  EXPECT_EQ(back.entries[2].source, 1);
  Results c = run_file({"C8/det/full/planned"}, 3, 8, "--row C8");
  const Results mm = merge_results({{"c.json", c}, {"m.json", back}}, kCmd, "2026-12-07T00:00:01Z").results;
  ASSERT_EQ(mm.context.merged_from->size(), 3u);
  EXPECT_EQ((*mm.context.merged_from)[0].file, "c.json");
  EXPECT_EQ((*mm.context.merged_from)[2].file, "b.json");
  EXPECT_EQ(mm.entries[0].source, 0);
  EXPECT_EQ(mm.entries[1].source, 1);
  EXPECT_EQ(mm.entries[3].source, 2);
  EXPECT_EQ(mm.context.seeds, (std::vector<uint64_t>{1, 2, 3}));
}

TEST(Merge, TheSameFormAtAnotherSeedIsAnotherEntry) {
  Results a = run_file({"A4/det/full/planned"}, 1, 8, "--seed 1");
  Results b = run_file({"A4/det/full/planned"}, 2, 8, "--seed 2");
  EXPECT_EQ(merge_results({{"a", a}, {"b", b}}, kCmd, "d").results.entries.size(), 2u);
}

TEST(Merge, ALaunchSkipGoesWhenAnotherFileRanTheRowAndStaysOnceOtherwise) {
  Results a = run_file({"A4/det/full/planned"}, 1, 8, "-np 8");
  Results b = run_file({}, 1, 4, "-np 4"), c = run_file({}, 1, 2, "-np 2");
  b.entries = {launch_skip("A4", 1), launch_skip("Z9", 1)};
  c.entries = {launch_skip("A4", 1), launch_skip("Z9", 1)};
  const kcp::MergeResult m = merge_results({{"a", a}, {"b", b}, {"c", c}}, kCmd, "d");
  ASSERT_EQ(m.results.entries.size(), 2u);
  EXPECT_EQ(m.results.entries[0].id, "A4/det/full/planned");
  EXPECT_EQ(m.results.entries[1].id, "Z9");
  EXPECT_EQ(m.results.entries[1].source, 1) << "the first file's skip is kept";
  EXPECT_EQ(m.superseded_skips, 3);
  EXPECT_EQ(m.results.summary->passed, 1);
  EXPECT_EQ(m.results.summary->skipped, 1);
}

TEST(Merge, FilesOfATreeWithUncommittedChangesMergeOnlyWhenAllowed) {
  Results a = run_file({"A4/det/full/planned"}, 1, 8, "x"), b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  a.context.build.git_dirty = b.context.build.git_dirty = true;
  try {
    merge_results({{"a.json", a}, {"b.json", b}}, kCmd, "d");
    ADD_FAILURE() << "merged dirty files";
  } catch (const kcp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("a.json was built from a tree with uncommitted changes"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(merge_results({{"a.json", a}, {"b.json", b}}, kCmd, "d", true).results.entries.size(), 2u);
}

TEST(Merge, RefusesWhatIsNotOneBuildDeviceAndRowSetOrHoldsAnEntryTwice) {
  const Results a = run_file({"A4/det/full/planned"}, 1, 8, "x");
  auto refused = [&](const Results& b, const std::string& words) {
    try {
      merge_results({{"a.json", a}, {"b.json", b}}, kCmd, "d");
      ADD_FAILURE() << "merged: " << words;
    } catch (const kcp::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(words), std::string::npos) << what;
      EXPECT_NE(what.find("b.json"), std::string::npos) << what;
    }
  };
  Results b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  b.context.build.git_sha = "def";
  refused(b, "context.build differs");
  b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  b.context.build.git_dirty = true;
  refused(b, "context.build differs");
  b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  b.context.backend_device = "NVIDIA H100 80GB HBM3 (132 SMs, sm_90)";
  refused(b, "context.backend_device differs");
  b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  b.context.device_class = "h100";
  refused(b, "context.device_class differs");
  b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  b.context.row_set.digest = std::string(64, 'b');
  refused(b, "context.row_set.digest differs");
  b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  b.context.comm = "nccl";
  refused(b, "context.comm differs");
  b = run_file({"B4/det/full/planned", "A4/det/full/planned"}, 1, 8, "y");
  refused(b, "A4/det/full/planned (seed 1) is in a.json and in b.json");
  b = run_file({"A4/det/full/planned"}, 1, 8, "y");
  b.entries[0].fault = "drop-segment-entry";
  refused(b, "A4/det/full/planned (seed 1) is in a.json and in b.json");  // one id: replay could not tell them
  b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  b.summary.reset();
  refused(b, "has no summary");
  EXPECT_THROW(merge_results({{"a.json", a}}, kCmd, "d"), kcp::ConfigError) << "one file is not a merge";
}

TEST(Merge, AnEntrySourceOutsideMergedFromIsACorruptFile) {
  Results a = run_file({"A4/det/full/planned"}, 1, 8, "x"), b = run_file({"B4/det/full/planned"}, 1, 8, "y");
  const nlohmann::json good = kcp::to_json(merge_results({{"a", a}, {"b", b}}, kCmd, "d").results);
  EXPECT_NO_THROW(kcp::results_from_json(good));
  nlohmann::json j = good;
  j["entries"][1]["source"] = 2;
  EXPECT_THROW(kcp::results_from_json(j), kcp::ConfigError);
  j = good;
  j["entries"][1].erase("source");
  EXPECT_THROW(kcp::results_from_json(j), kcp::ConfigError) << "an entry of a merged file without a source";
  j = good;
  j["context"]["merged_from"].erase(1);
  j["entries"][1]["source"] = 0;
  EXPECT_THROW(kcp::results_from_json(j), kcp::ConfigError) << "merged_from of one file";
  j = good;
  j["entries"][1]["source"] = 1;
  j["context"].erase("merged_from");
  EXPECT_THROW(kcp::results_from_json(j), kcp::ConfigError) << "a source without merged_from";
}
