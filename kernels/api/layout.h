// Rank layout: how one rank's T_local tokens split into pieces (local sequences) and segments
// (chunk-aligned runs of chunks inside a piece), and the chunk table derived from them.
//
// Invariants (checked by RankLayout's constructor and validate_layout(); std::invalid_argument
// naming the field):
//  * pieces are in token order, contiguous, and cover [0, T) exactly: pieces[0].begin == 0,
//    pieces[i].end == pieces[i+1].begin, pieces.back().end == T;
//  * only the first piece may continue from an earlier rank (starts_sequence == 0) and only the
//    last piece may continue into a later rank (ends_sequence == 0);
//  * chunking restarts at every piece start: chunk c of a piece covers local tokens
//    [begin + c*C, min(begin + (c+1)*C, end)); the last chunk of a piece may be partial;
//  * segments cover every non-empty piece exactly once, in order; a segment's begin lies on a
//    chunk boundary of its piece and its end on a chunk boundary or at the piece end; segments
//    are non-empty; zero-length pieces have no segments (their "state recurrence" is the
//    identity: the engine/driver maps entry state -> ht and dht -> dh0 with a fold of length 0).
//
// Indexing used by every tensor of the kernel API:
//   token t in [0, T)                      -> tensors [T, ...]
//   chunk n in [0, n_chunks) (rank-global) -> per-chunk tensors h, dh [n_chunks, HV, K, V]
//   segment s in [0, n_segments)           -> per-segment tensors [n_segments, HV, ...]
//   piece p in [0, n_pieces)               -> h0, ht, dht, dh0 [n_pieces, HV, K, V]
//
// LayoutView is the POD handed to kernels: plain pointers into host arrays owned by a
// RankLayout. Every backend receives host pointers; a device backend uploads the (small)
// tables itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/api/problem.h"

namespace kcp::kernels {

struct PieceDesc {
  int64_t begin = 0, end = 0;  // local tokens [begin, end)
  int64_t chunk_begin = 0;     // first rank-global chunk index of the piece
  int32_t n_chunks = 0;        // ceil((end - begin) / C)
  int32_t seg_begin = 0;       // segments [seg_begin, seg_end) belong to this piece
  int32_t seg_end = 0;
  uint8_t starts_sequence = 1;  // 1: the piece holds its sequence's first token (h0 applies)
  uint8_t ends_sequence = 1;    // 1: the piece holds its sequence's last token (ht, dht apply)
};

struct SegmentDesc {
  int32_t piece = 0;  // owning piece
  int32_t index_in_piece = 0;
  int64_t begin = 0, end = 0;  // local tokens [begin, end)
  int64_t chunk_begin = 0;     // rank-global chunks [chunk_begin, chunk_end)
  int64_t chunk_end = 0;
};

struct ChunkDesc {
  int64_t begin = 0;    // first local token of the chunk
  int32_t len = 0;      // 1..C (the last chunk of a piece may be partial)
  int32_t segment = 0;  // owning segment
  int32_t piece = 0;    // owning piece
  int32_t index_in_piece = 0;
};

struct LayoutView {
  int64_t T = 0;  // local tokens
  int64_t n_chunks = 0;
  int32_t n_pieces = 0;
  int32_t n_segments = 0;
  const PieceDesc* pieces = nullptr;      // [n_pieces]
  const SegmentDesc* segments = nullptr;  // [n_segments]
  const ChunkDesc* chunks = nullptr;      // [n_chunks]
};

// What a caller specifies; RankLayout derives the rest.
struct PieceSpec {
  int64_t begin = 0, end = 0;
  bool starts_sequence = true;
  bool ends_sequence = true;
};
struct SegmentSpec {
  int32_t piece = 0;
  int64_t begin = 0, end = 0;  // local tokens
};

// Checks a LayoutView against the invariants above (used by every phase entry; cheap).
inline void validate_layout(const LayoutView& L, int32_t C = kChunk) {
  auto fail = [](const std::string& m) { throw std::invalid_argument("kcp kernels: layout." + m); };
  if (L.T < 0) fail("T (" + std::to_string(L.T) + ") must be >= 0");
  if (L.n_pieces < 1) fail("n_pieces (" + std::to_string(L.n_pieces) + ") must be >= 1");
  if (!L.pieces) fail("pieces is null");
  if (L.n_segments > 0 && !L.segments) fail("segments is null");
  if (L.n_chunks > 0 && !L.chunks) fail("chunks is null");
  int64_t tok = 0, chunk = 0;
  int32_t seg = 0;
  for (int32_t p = 0; p < L.n_pieces; ++p) {
    const PieceDesc& P = L.pieces[p];
    const std::string at = "pieces[" + std::to_string(p) + "]";
    if (P.begin != tok)
      fail(at + ".begin (" + std::to_string(P.begin) + ") must equal the previous end (" + std::to_string(tok) + ")");
    if (P.end < P.begin) fail(at + ".end (" + std::to_string(P.end) + ") < begin");
    if (p > 0 && !P.starts_sequence)
      fail(at + ".starts_sequence must be 1: only the first piece can continue from an earlier rank");
    if (p + 1 < L.n_pieces && !P.ends_sequence)
      fail(at + ".ends_sequence must be 1: only the last piece can continue into a later rank");
    const int64_t nc = (P.end - P.begin + C - 1) / C;
    if (P.chunk_begin != chunk || P.n_chunks != nc)
      fail(at + ".chunk_begin/n_chunks (" + std::to_string(P.chunk_begin) + ", " + std::to_string(P.n_chunks) +
           ") must be (" + std::to_string(chunk) + ", " + std::to_string(nc) + ")");
    if (P.seg_begin != seg)
      fail(at + ".seg_begin (" + std::to_string(P.seg_begin) + ") must be " + std::to_string(seg));
    if (P.seg_end < P.seg_begin || P.seg_end > L.n_segments)
      fail(at + ".seg_end (" + std::to_string(P.seg_end) + ") out of range");
    if (P.end == P.begin && P.seg_end != P.seg_begin) fail(at + " is empty but has segments");
    if (P.end > P.begin && P.seg_end == P.seg_begin) fail(at + " is not empty but has no segments");
    int64_t st = P.begin;
    for (int32_t s = P.seg_begin; s < P.seg_end; ++s) {
      const SegmentDesc& S = L.segments[s];
      const std::string sat = "segments[" + std::to_string(s) + "]";
      if (S.piece != p) fail(sat + ".piece (" + std::to_string(S.piece) + ") must be " + std::to_string(p));
      if (S.index_in_piece != s - P.seg_begin) fail(sat + ".index_in_piece is inconsistent");
      if (S.begin != st) fail(sat + ".begin (" + std::to_string(S.begin) + ") must equal " + std::to_string(st));
      if (S.end <= S.begin || S.end > P.end)
        fail(sat + ".end (" + std::to_string(S.end) + ") must be in (begin, piece end " + std::to_string(P.end) + "]");
      if ((S.begin - P.begin) % C != 0)
        fail(sat + ".begin (" + std::to_string(S.begin) + ") is not on a chunk boundary of piece " + std::to_string(p) +
             " (piece begin " + std::to_string(P.begin) + ", C = " + std::to_string(C) + ")");
      if (S.end != P.end && (S.end - P.begin) % C != 0)
        fail(sat + ".end (" + std::to_string(S.end) + ") is not on a chunk boundary of piece " + std::to_string(p) +
             " nor the piece end");
      const int64_t cb = P.chunk_begin + (S.begin - P.begin) / C;
      const int64_t ce = P.chunk_begin + (S.end - P.begin + C - 1) / C;
      if (S.chunk_begin != cb || S.chunk_end != ce) fail(sat + ".chunk_begin/chunk_end are inconsistent");
      st = S.end;
    }
    if (P.end > P.begin && st != P.end)
      fail("segments of piece " + std::to_string(p) + " end at " + std::to_string(st) + ", not at the piece end " +
           std::to_string(P.end));
    tok = P.end;
    chunk += nc;
    seg = P.seg_end;
  }
  if (tok != L.T) fail("pieces end at " + std::to_string(tok) + ", not at T (" + std::to_string(L.T) + ")");
  if (chunk != L.n_chunks) fail("n_chunks (" + std::to_string(L.n_chunks) + ") must be " + std::to_string(chunk));
  if (seg != L.n_segments) fail("n_segments (" + std::to_string(L.n_segments) + ") must be " + std::to_string(seg));
}

// Host-side owner of the layout arrays. Immutable after construction.
class RankLayout {
 public:
  RankLayout() = default;
  // pieces in token order covering [0, T); segments in order covering every non-empty piece.
  RankLayout(const std::vector<PieceSpec>& pieces, const std::vector<SegmentSpec>& segments, int32_t C = kChunk) {
    for (size_t p = 0; p < pieces.size(); ++p) {
      PieceDesc d;
      d.begin = pieces[p].begin;
      d.end = pieces[p].end;
      d.starts_sequence = pieces[p].starts_sequence ? 1 : 0;
      d.ends_sequence = pieces[p].ends_sequence ? 1 : 0;
      pieces_.push_back(d);
    }
    int64_t chunk = 0;
    size_t s = 0;
    for (size_t p = 0; p < pieces_.size(); ++p) {
      PieceDesc& d = pieces_[p];
      if (d.end < d.begin)
        throw std::invalid_argument("kcp kernels: layout.pieces[" + std::to_string(p) + "].end (" +
                                    std::to_string(d.end) + ") < begin (" + std::to_string(d.begin) + ")");
      d.chunk_begin = chunk;
      d.n_chunks = static_cast<int32_t>((d.end - d.begin + C - 1) / C);
      d.seg_begin = static_cast<int32_t>(s);
      while (s < segments.size() && segments[s].piece == static_cast<int32_t>(p)) {
        SegmentDesc sd;
        sd.piece = static_cast<int32_t>(p);
        sd.index_in_piece = static_cast<int32_t>(s) - d.seg_begin;
        sd.begin = segments[s].begin;
        sd.end = segments[s].end;
        sd.chunk_begin = d.chunk_begin + (sd.begin - d.begin) / C;
        sd.chunk_end = d.chunk_begin + (sd.end - d.begin + C - 1) / C;
        segments_.push_back(sd);
        ++s;
      }
      d.seg_end = static_cast<int32_t>(s);
      chunk += d.n_chunks;
    }
    if (s != segments.size())
      throw std::invalid_argument("kcp kernels: layout.segments[" + std::to_string(s) + "].piece (" +
                                  std::to_string(segments[s].piece) +
                                  ") is out of order or out of range (segments must be sorted by piece)");
    T_ = pieces_.empty() ? 0 : pieces_.back().end;
    for (const PieceDesc& d : pieces_) {
      for (int32_t c = 0; c < d.n_chunks; ++c) {
        ChunkDesc cd;
        cd.begin = d.begin + int64_t(c) * C;
        cd.len = static_cast<int32_t>(std::min<int64_t>(C, d.end - cd.begin));
        cd.piece = static_cast<int32_t>(&d - pieces_.data());
        cd.index_in_piece = c;
        cd.segment = -1;
        for (int32_t sg = d.seg_begin; sg < d.seg_end; ++sg)
          if (cd.begin >= segments_[sg].begin && cd.begin < segments_[sg].end) cd.segment = sg;
        chunks_.push_back(cd);
      }
    }
    validate_layout(view(), C);
    for (size_t c = 0; c < chunks_.size(); ++c)
      if (chunks_[c].segment < 0)
        throw std::invalid_argument("kcp kernels: layout: chunk " + std::to_string(c) + " is in no segment");
  }

  // One piece per sequence (lengths in order, all starting and ending their sequences), each
  // cut into `P` segments of (nearly) equal chunk counts (fewer when a piece has fewer chunks).
  static RankLayout even(const std::vector<int64_t>& lengths, int32_t P, int32_t C = kChunk) {
    std::vector<PieceSpec> ps;
    std::vector<SegmentSpec> ss;
    int64_t t = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      ps.push_back({t, t + lengths[i], true, true});
      append_even_segments(static_cast<int32_t>(i), t, t + lengths[i], P, C, ss);
      t += lengths[i];
    }
    return RankLayout(ps, ss, C);
  }
  // Segments of [begin, end) (one piece) cut into P runs of nearly equal chunk counts.
  static void append_even_segments(int32_t piece, int64_t begin, int64_t end, int32_t P, int32_t C,
                                   std::vector<SegmentSpec>& out) {
    const int64_t nc = (end - begin + C - 1) / C;
    if (nc == 0) return;
    const int64_t np = std::max<int64_t>(1, std::min<int64_t>(P, nc));
    int64_t c0 = 0;
    for (int64_t i = 0; i < np; ++i) {
      const int64_t c1 = (nc * (i + 1)) / np;
      out.push_back({piece, begin + c0 * C, std::min(end, begin + c1 * C)});
      c0 = c1;
    }
  }

  LayoutView view() const {
    LayoutView v;
    v.T = T_;
    v.n_chunks = static_cast<int64_t>(chunks_.size());
    v.n_pieces = static_cast<int32_t>(pieces_.size());
    v.n_segments = static_cast<int32_t>(segments_.size());
    v.pieces = pieces_.data();
    v.segments = segments_.data();
    v.chunks = chunks_.data();
    return v;
  }
  int64_t T() const { return T_; }
  const std::vector<PieceDesc>& pieces() const { return pieces_; }
  const std::vector<SegmentDesc>& segments() const { return segments_; }
  const std::vector<ChunkDesc>& chunks() const { return chunks_; }

 private:
  int64_t T_ = 0;
  std::vector<PieceDesc> pieces_;
  std::vector<SegmentDesc> segments_;
  std::vector<ChunkDesc> chunks_;
};

}  // namespace kcp::kernels
