#include "core/report/plan_json.h"

namespace kcp {

nlohmann::json row_summary_json(const RowConfig& row, const std::string& digest) {
  nlohmann::json j;
  j["name"] = row.name;
  j["description"] = row.description;
  j["digest"] = digest;
  j["op"] = to_string(row.op);
  j["H"] = row.H;
  j["HV"] = row.HV;
  j["K"] = row.K;
  j["V"] = row.V;
  j["seqlens"] = row.seqlens;
  j["tokens"] = row.total_tokens();
  j["world"] = row.world;
  if (!row.rank_tokens.empty()) j["rank_tokens"] = row.rank_tokens;
  j["dtype"] = to_string(row.dtype);
  j["gate"] = to_string(row.gate);
  j["qk_l2norm"] = row.qk_l2norm;
  j["initial_state"] = row.initial_state;
  j["final_state"] = row.final_state;
  j["dht"] = row.dht;
  j["seed"] = row.seed;
  std::vector<std::string> packages, saved;
  for (auto p : row.forms.packages) packages.push_back(to_string(p));
  for (auto s : row.forms.saved) saved.push_back(to_string(s));
  j["forms"] = {{"packages", packages},
                {"saved", saved},
                {"forced_P", row.forms.forced_P},
                {"forced_rule", to_string(row.forms.forced_rule)}};
  j["has_budgets"] = !row.budgets.empty();
  return j;
}

nlohmann::json plan_json(const SegmentPlan& plan, bool with_segments) {
  nlohmann::json j;
  j["row"] = plan.row;
  j["world"] = plan.world;
  j["chunk"] = plan.chunk;
  j["device"] = {{"class", plan.device.name},
                 {"sm_count", plan.device.sm_count},
                 {"min_segment_chunks", plan.device.min_segment_chunks}};
  j["v_tile"] = plan.v_tile;
  j["forced_P"] = plan.forced_P;
  j["fingerprint"] = plan.fingerprint;
  std::vector<int> P;
  for (const auto& rp : plan.ranks) P.push_back(rp.P);
  j["P"] = P;
  auto& ranks = j["ranks"] = nlohmann::json::array();
  for (const auto& rp : plan.ranks) {
    nlohmann::json r;
    r["rank"] = rp.rank;
    r["tokens"] = {rp.global_begin, rp.global_end};
    r["P"] = rp.P;
    r["planned_P"] = rp.planned_P;
    r["chunks"] = rp.chunks;
    r["pre_ranks"] = rp.pre_ranks;
    r["post_ranks"] = rp.post_ranks;
    auto& pieces = r["pieces"] = nlohmann::json::array();
    for (const auto& pc : rp.pieces)
      pieces.push_back({{"seq", pc.seq},
                        {"local", {pc.local_begin, pc.local_end}},
                        {"seq_offset", pc.seq_offset},
                        {"from_prev_rank", pc.from_prev_rank},
                        {"to_next_rank", pc.to_next_rank}});
    if (with_segments) {
      auto& segs = r["segments"] = nlohmann::json::array();
      for (const auto& s : rp.segments) segs.push_back({{"piece", s.piece}, {"local", {s.local_begin, s.local_end}}});
    }
    r["workspace_bytes"] = {
        {"segment_summaries", rp.workspace.segment_summaries}, {"transfer_planes", rp.workspace.transfer_planes},
        {"entry_states", rp.workspace.entry_states},           {"chunk_states", rp.workspace.chunk_states},
        {"det_partials", rp.workspace.det_partials},           {"total", rp.workspace.total()}};
    ranks.push_back(r);
  }
  return j;
}

}  // namespace kcp
