// (g) segment summaries nobody reads (kernels/api/summary_needs.h): the rule on hand-made
// layouts, and twin runs that skip them give the same bits as runs that compute every summary.
//
// The reference run computes every summary through the public phase API: a wrapper backend calls
// the twin's fwd_summaries / bwd_summaries once per piece with a one-piece layout of that piece
// that neither starts nor ends its sequence (a middle rank, where the rule needs everything) and
// the tensors offset to the piece. Its folds and walks are the twin's own, so any summary the
// rule wrongly drops (a zero where a value is read) or any bit the skipping changes shows up.
#include <cstring>
#include <stdexcept>

#include "kernels/api/summary_needs.h"
#include "twin_test_util.h"

namespace kcp::test {
namespace {

namespace kk = kcp::kernels;

// "h M dh" per segment, '-' where not needed, e.g. "h-- --d".
std::string needs_of(const kk::RankLayout& L, bool h0, bool dht) {
  std::string s;
  const kk::LayoutView v = L.view();
  for (int32_t i = 0; i < v.n_segments; ++i) {
    const kk::SummaryNeeds n = kk::summary_needs(v.pieces, v.n_pieces, v.segments[i], h0, dht);
    if (i > 0) s += ' ';
    s += n.h_ext ? 'h' : '-';
    s += n.M ? 'M' : '-';
    s += n.dh_ext ? 'd' : '-';
  }
  return s;
}

// needs_of when every part of n segments is needed.
std::string every_part(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += i ? " hMd" : "hMd";
  return s;
}

// One piece [0, len) with its starts / ends flags, cut into P even segments.
kk::RankLayout one_piece(int64_t len, int P, bool starts, bool ends) {
  std::vector<kk::SegmentSpec> ss;
  kk::RankLayout::append_even_segments(0, 0, len, P, kk::kChunk, ss);
  return kk::RankLayout({{0, len, starts, ends}}, ss);
}

TEST(SummaryNeeds, OneSequenceOnOneRank) {
  const kk::RankLayout two = kk::RankLayout::even({128}, 2), three = kk::RankLayout::even({192}, 3);
  // No h0, no dht: X_0 = 0 and the last exit gradient is 0, so no M is ever applied to a nonzero
  // state; h_ext of the last segment and dh_ext of the first only feed unsent rank summaries.
  EXPECT_EQ(needs_of(two, false, false), "h-- --d");
  EXPECT_EQ(needs_of(three, false, false), "h-- hMd --d");
  // h0 makes X_0 nonzero: M_0 feeds the entry state of segment 1.
  EXPECT_EQ(needs_of(two, true, false), "hM- --d");
  // dht makes the last exit gradient nonzero: M_1^T feeds the exit gradient of segment 0.
  EXPECT_EQ(needs_of(two, false, true), "h-- -Md");
  EXPECT_EQ(needs_of(two, true, true), "hM- -Md");
  EXPECT_EQ(needs_of(three, true, true), "hM- hMd -Md");
  // One segment per piece: its entry state is x0 and its exit gradient y0; nothing is read.
  EXPECT_EQ(needs_of(kk::RankLayout::even({100, 0, 37}, 1), true, true), "--- ---");
}

TEST(SummaryNeeds, RanksOfACrossingSequence) {
  for (bool h0 : {false, true})
    for (bool dht : {false, true}) {
      SCOPED_TRACE(std::string("h0 ") + (h0 ? "on" : "off") + ", dht " + (dht ? "on" : "off"));
      // A middle rank: both rank summaries are sent (composed transfers need every M).
      EXPECT_EQ(needs_of(one_piece(192, 3, false, false), h0, dht), "hMd hMd hMd");
      EXPECT_EQ(needs_of(one_piece(50, 1, false, false), h0, dht), "hMd");
      // The first rank: only the forward summary is sent; the first segment's dh_ext is not read.
      EXPECT_EQ(needs_of(one_piece(128, 2, true, false), h0, dht), "hM- hMd");
      // The last rank: only the backward summary is sent; the last segment's h_ext is not read.
      EXPECT_EQ(needs_of(one_piece(128, 2, false, true), h0, dht), "hMd -Md");
    }
  // A rank holding the tail of seq 0, all of seq 1 and the head of seq 2: the incoming state and
  // the exit gradient of the outer pieces are given, so their inner M are read; only seq 1 depends
  // on h0 / dht.
  const kk::RankLayout L({{0, 128, false, true}, {128, 256, true, true}, {256, 384, true, false}},
                         {{0, 0, 64}, {0, 64, 128}, {1, 128, 192}, {1, 192, 256}, {2, 256, 320}, {2, 320, 384}});
  EXPECT_EQ(needs_of(L, false, false), "hMd -Md h-- --d hM- hMd");
  EXPECT_EQ(needs_of(L, true, true), "hMd -Md hM- -Md hM- hMd");
}

// ---- bitwise: skipping vs computing every summary ----

// The twin, except that fwd_summaries / bwd_summaries compute every summary (see the top).
class EverySummaryBackend final : public kk::Backend {
 public:
  const char* name() const override { return "cpu-every-summary"; }
  kk::Status can_implement(const kk::Problem& p) const override { return in_->can_implement(p); }
  kk::Storage dtype_storage() const override { return in_->dtype_storage(); }
  kk::Storage caller_storage() const override { return in_->caller_storage(); }
  void prep(const kk::PrepArgs& a) const override { in_->prep(a); }
  void wy(const kk::WyArgs& a) const override { in_->wy(a); }
  void fwd_summaries(const kk::FwdSummaryArgs& a) const override {
    const kk::Problem& p = a.ctx.problem;
    for_each_piece(a, [&](kk::FwdSummaryArgs& b, int64_t t0, int64_t s0) {
      b.U = a.U.at(t0 * p.HV * p.V);
      b.seg_h_ext = a.seg_h_ext + s0 * p.HV * p.K * p.V;
      b.seg_Mt = a.seg_Mt + s0 * p.HV * p.K * p.K;
      in_->fwd_summaries(b);
    });
  }
  void fold(const kk::FoldArgs& a) const override { in_->fold(a); }
  void fwd_states(const kk::FwdStateArgs& a) const override { in_->fwd_states(a); }
  void fwd_output(const kk::FwdOutputArgs& a) const override { in_->fwd_output(a); }
  void bwd_local_dv(const kk::BwdLocalDvArgs& a) const override { in_->bwd_local_dv(a); }
  void bwd_summaries(const kk::BwdSummaryArgs& a) const override {
    const kk::Problem& p = a.ctx.problem;
    for_each_piece(a, [&](kk::BwdSummaryArgs& b, int64_t t0, int64_t s0) {
      b.q = a.q.at(t0 * p.H * p.K);
      b.dO = a.dO.at(t0 * p.HV * p.V);
      b.dv_local = a.dv_local.at(t0 * p.HV * p.V);
      b.seg_dh_ext = a.seg_dh_ext + s0 * p.HV * p.K * p.V;
      in_->bwd_summaries(b);
    });
  }
  void bwd_states(const kk::BwdStateArgs& a) const override { in_->bwd_states(a); }
  void bwd_grads(const kk::BwdGradArgs& a) const override { in_->bwd_grads(a); }
  void bwd_finalize(const kk::BwdFinalizeArgs& a) const override { in_->bwd_finalize(a); }
  void copy_floats(float* d, const float* s, int64_t n, const kk::Exec& e) const override {
    in_->copy_floats(d, s, n, e);
  }
  void fill_floats(float* d, float v, int64_t n, const kk::Exec& e) const override { in_->fill_floats(d, v, n, e); }
  void fill_16(uint16_t* d, uint16_t bits, int64_t n, const kk::Exec& e) const override { in_->fill_16(d, bits, n, e); }
  float* alloc_floats(int64_t n) const override { return in_->alloc_floats(n); }
  void free_floats(float* p) const override { in_->free_floats(p); }
  void upload(float* d, const float* s, int64_t n, const kk::Exec& e) const override { in_->upload(d, s, n, e); }
  void download(float* d, const float* s, int64_t n, const kk::Exec& e) const override { in_->download(d, s, n, e); }
  void upload_16(uint16_t* d, const uint16_t* s, int64_t n, const kk::Exec& e) const override {
    in_->upload_16(d, s, n, e);
  }
  void download_16(uint16_t* d, const uint16_t* s, int64_t n, const kk::Exec& e) const override {
    in_->download_16(d, s, n, e);
  }
  std::unique_ptr<kk::PhaseTimer> make_timer() const override { return in_->make_timer(); }
  std::string device_name() const override { return in_->device_name(); }

 private:
  // For every non-empty piece: fn(b, first token of the piece, first segment of the piece), b =
  // `a` on a one-piece middle layout of that piece with k, gcum, W and kg (every summary phase
  // has them) moved to the piece's first token; fn moves the rest. Chunking restarts at every
  // piece start, so the chunks are the same.
  template <class Args, class F>
  static void for_each_piece(const Args& a, F&& fn) {
    const kk::Problem& p = a.ctx.problem;
    const kk::LayoutView& lv = a.ctx.layout;
    for (int32_t q = 0; q < lv.n_pieces; ++q) {
      const kk::PieceDesc& pc = lv.pieces[q];
      if (pc.seg_end == pc.seg_begin) continue;
      std::vector<kk::SegmentSpec> ss;
      for (int32_t s = pc.seg_begin; s < pc.seg_end; ++s)
        ss.push_back({0, lv.segments[s].begin - pc.begin, lv.segments[s].end - pc.begin});
      const kk::RankLayout L({{0, pc.end - pc.begin, false, false}}, ss, p.chunk);
      // The reference leans on this (pinned by RanksOfACrossingSequence too): refuse otherwise.
      if (needs_of(L, p.has_h0, p.has_dht) != every_part(int(ss.size())))
        throw std::logic_error("EverySummaryBackend: the rule does not need every summary of a middle piece");
      const int64_t t0 = pc.begin;
      auto at = [t0](const float* x, int64_t width) { return x ? x + t0 * width : x; };
      Args b = a;
      b.ctx.layout = L.view();
      b.k = a.k.at(t0 * p.H * p.K);
      b.gcum = at(a.gcum, int64_t(p.HV) * p.gate_width());
      b.W = a.W.at(t0 * p.HV * p.K);
      b.kg = a.kg.at(t0 * p.HV * p.K);
      fn(b, t0, int64_t(pc.seg_begin));
    }
  }
  std::unique_ptr<kk::Backend> in_ = kk::make_cpu_backend();
};

// Every tensor bitwise equal; names the first that differs.
void expect_same_bits(const std::string& label, const TwinResults& every, const TwinResults& skipping) {
  ASSERT_EQ(every.t.size(), skipping.t.size()) << label;
  for (const auto& [name, x] : every.t) {
    const auto& y = skipping.t.at(name);
    ASSERT_EQ(x.size(), y.size()) << label << ": " << name;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0)
        << label << ": " << name << " differs from the run that computes every summary";
    EXPECT_EQ(non_finite(y), 0) << label << ": " << name;
  }
}

class SkippedSummaries : public ::testing::TestWithParam<kk::Op> {};

TEST_P(SkippedSummaries, GiveTheSameBitsAsEverySummary) {
  // [400, 0, 100, 100] over ranks [0,150) [150,260) [260,600): rank 0 starts seq 0 and sends,
  // rank 1 is a middle rank, rank 2 holds seq 0's tail (receives), the empty seq 1, seq 2 and
  // seq 3. Every non-empty piece has 2 or 3 segments: first, middle and last ones.
  const EverySummaryBackend every;
  for (bool state : {false, true}) {
    Case c = GetParam() == kk::Op::Gdn ? gdn_varlen() : kda_varlen();
    c.name += state ? "_needs_h0_dht" : "_needs";
    c.h0 = c.dht = state;
    // Long memory: the default gates decay a state by ~e^-50 over a chunk, so M X vanishes under
    // fp32 rounding and a wrongly dropped M would go unseen; here every transfer moves the bits.
    c.gate_div = 32.0;
    c.lens = {400, 0, 100, 100};
    const Data& d = data_for(c);
    for (kk::SavedKind kind : {kk::SavedKind::Full, kk::SavedKind::Light}) {
      TwinOptions opt;
      opt.rank_bounds = {0, 150, 260, 600};
      opt.P = {2, 2, 3};
      opt.kind = kind;
      const TwinResults skipping = run_twin(c, d, opt);
      opt.backend = &every;
      const TwinResults all = run_twin(c, d, opt);
      expect_same_bits(c.name + (kind == kk::SavedKind::Full ? " full" : " light"), all, skipping);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, SkippedSummaries, ::testing::Values(kk::Op::Gdn, kk::Op::Kda),
                         [](const ::testing::TestParamInfo<kk::Op>& i) { return std::string(kk::to_string(i.param)); });

}  // namespace
}  // namespace kcp::test
