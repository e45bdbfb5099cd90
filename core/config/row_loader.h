// Loading row sets from JSON (docs/design.md 3 step 1). All problems in a file are collected and
// reported at once, each naming the file, the JSON path, what was expected and what was found:
//   configs/rows/int1.json: rows[3].HV: must be a multiple of H (2), got 3
// The loader throws ConfigError (exit code 2) carrying every message, one per line.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/config/row_config.h"

namespace kcp {

// `spec` is a set name ("int1" -> <configs dir>/rows/int1.json) or a path to a row file.
std::string resolve_row_file(const std::string& spec, const std::string& configs_dir);
// The configs directory: $KCP_CONFIGS_DIR if set at start-up by main, else the source tree's.
std::string default_configs_dir();
// The row-set names known in <configs dir>/rows (file stems), sorted.
std::vector<std::string> known_row_sets(const std::string& configs_dir);

// The ranges the loader accepts for integer fields (read as 64-bit and checked before they are
// narrowed); the command line uses the same bounds (plan --world, --P).
inline constexpr int kMaxHeads = 1024;    // H, HV
inline constexpr int kMaxHeadDim = 1024;  // K, V (then held to 64 or 128)
inline constexpr int kMaxChunk = 1024;    // chunk (then held to 64)
inline constexpr int kMaxWorld = 4096;    // world
inline constexpr int kMaxP = 64;          // forced segment counts

RowSet load_row_set(const std::string& file);
RowSet load_row_set_text(const std::string& text, const std::string& file);  // for tests

// The keys the loader accepts, per kind of object it parses; the same lists it rejects unknown
// keys with (any other key is an "unknown key" error). Kinds: "row_set" (the file's top level),
// "row" (a row, and the set's "defaults", which is merged into every row), "inputs", "forms",
// "budgets", "budgets.tensors" (the tensor names), "tensor_budget" (one tensor's budget).
// tests/unit/row_schema_keys_test.cpp holds configs/rows.schema.json to the same sets.
std::map<std::string, std::vector<std::string>> accepted_keys();

// Semantic checks of one parsed row; returns every violation ("rows[i].field: ..." without file).
// `unread` holds the full paths ("rows[0].H") of fields the parser could not read; checks that need
// one of them are skipped (the field holds its default, not the file's value).
std::vector<std::string> validate_row(const RowConfig& row, const std::string& path,
                                      const std::set<std::string>& unread = {});

// Selects rows by name (exact, or a glob with * and ?); an empty pattern list selects all.
// Throws ConfigError naming the set and the available rows when a pattern matches nothing.
std::vector<const RowConfig*> select_rows(const RowSet& set, const std::vector<std::string>& patterns);

}  // namespace kcp
