// The per-token recurrence (docs/algorithm.md 1.1) and its exact reverse-mode backward, in FP64.
//
// Math, per sequence and value head j (state S: K x V, D_t = diag(exp(a_t)), scalar for GDN):
//   Sbar_t = D_t S_{t-1};  e_t = v_t - Sbar_t^T k_t;  S_t = Sbar_t + beta_t k_t e_t^T;
//   o_t = rho S_t^T q_t = rho (Sbar_t^T q_t + beta_t (q_t . k_t) e_t).
// Every column s = S[:, c] evolves on its own: s <- D s, e_c = v_c - k . s, s += beta e_c k.
// Reverse mode, with dS the gradient w.r.t. S_t from tokens after t (and dht):
//   G = dS + rho q_t dO_t^T                  (gradient w.r.t. S_t, output term included)
//   kG = G^T k_t,  de = beta_t kG,  dv_t = de,  dbeta_t = kG . e_t
//   dq_t = rho S_t dO_t,  dk_t = beta_t G e_t - Sbar_t de
//   dSbar = G - k_t de^T,  da_t[d] = sum_c Sbar[d, c] dSbar[d, c]  (GDN: summed over d too)
//   dS <- D_t dSbar                          (gradient w.r.t. S_{t-1})
// dq, dk, da, dbeta are sums over columns; everything else stays column-separable.
//
// Work decomposition. A work item is (sequence n, value head j, group of column blocks of kCB =
// 16 columns); threads take items from one counter. There are as few groups per (n, j) as give
// each thread about Tuning::items_per_thread items: a wide item reads each token's q, k and decay
// once per window for all its blocks. Within an item, time runs in windows of W tokens (default
// 64), cut further at probe positions (detail::Windows); inside a window each block runs through
// the tokens with its K x 16 state slice in L1 and SIMD over columns. The probe states S_p and
// gradients dS_p (docs/algorithm.md 1.4) are copies of the item's S and dS at window boundaries.
//
// Memory held at once per work item (backward), in doubles, with Wc = the item's columns rounded
// up to 16 and nb = Wc / 16 its blocks:
//   * checkpoints of the item's state at window starts: min(#windows, Cmax) x K x Wc; above
//     Cmax windows (default 256) checkpoints are two-level, one per segment of ceil(sqrt(#windows))
//     windows plus the window checkpoints of the current segment, about 2 sqrt(#windows) x K x Wc
//     (at the cost of one extra forward pass that refills each segment);
//   * the item's state and dS: 2 x K x Wc;
//   * one window of one block: (W + 1) x K x 16 recomputed states (1 MiB at K = 128), plus
//     W x 16 each for e, v, dO, dv;
//   * the window's contributions to dq, dk, da, dbeta, per block: W x nb x (2 K + Kg + 1).
// Per (sequence, value head), summed over its groups: the same with Wc = V rounded up to 16,
// i.e. at K = V = 128 and 8192 tokens 16 MiB of checkpoints plus ~1.5 MiB of window buffers per
// group. Per-token states are never all kept. Forward-only holds the state and window buffers.
//
// Determinism. Every sum over column blocks (dq, dk, da, dbeta per token) is formed in global
// block order, whatever the grouping: an item keeps its window contributions per block, and the
// items of one (sequence, q/k head) form a chain ordered by (value head, group) that adds them to
// dq, dk, dg, dbeta strictly in chain order (item r waits until item r - 1 has published the same
// window). So the grouping may follow the thread count, and the bits never do. Items are claimed
// from one counter in chain order, so the item waited on is always running or done: no deadlock.
// The bits do follow the SIMD packet width (kPS): a horizontal sum over a block's 16 columns adds
// kNP packets, then the kPS lanes, so an AVX-512 build (CMake option KCP_REFERENCE_ARCH) rounds
// the per-token dq, dk, da, dbeta sums in another order than the default SSE2 build (the results'
// context.build.reference_simd names it). Every product and sum still rounds once: no fma.
#include <Eigen/Core>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

#include "reference/detail.h"

namespace kcp::ref::detail {

namespace {

namespace ei = Eigen::internal;
using Pk = ei::packet_traits<double>::type;
constexpr int kPS = ei::packet_traits<double>::size;  // doubles per SIMD register (SSE2: 2)
// 16 columns per block: the per-row scalar broadcasts and horizontal sums are amortised over 16
// columns, and one window of recomputed states ((W + 1) x K x 16 doubles) stays in L2.
constexpr int kCB = kPS >= 16 ? kPS : 16;  // columns per block
constexpr int kNP = kCB / kPS;             // SIMD registers per row of a block
static_assert((kNP & (kNP - 1)) == 0, "kNP must be a power of two");

inline Pk bc(double x) { return ei::pset1<Pk>(x); }
inline Pk ld(const double* p) { return ei::ploadu<Pk>(p); }
inline void st(double* p, const Pk& x) { ei::pstoreu(p, x); }
inline Pk zero() { return ei::pset1<Pk>(0.0); }

inline size_t zs(int64_t n) { return static_cast<size_t>(n); }

// Read-only view of one (sequence, value head) for the block kernels.
struct HeadView {
  const Prepared* pr;
  const float* beta;  // [T, HV]
  int j, i, K, H, HV, Kg;
  double rho;
  QKRow q(int64_t t) const { return pr->qn(t * H + i); }
  QKRow k(int64_t t) const { return pr->kn(t * H + i); }
  const double* dec(int64_t t) const { return pr->dec.get() + (t * HV + j) * Kg; }
  double b(int64_t t) const { return beta[t * HV + j]; }
  double qk(int64_t t) const { return pr->qk[zs(t * H + i)]; }
};

// Forward over tokens [t0, t1) for one block of kCB columns.
//   S       [K][kCB]  in: S_{t0-1}; out: S_{t1-1}
//   vwin    [L][kCB]  v of the block's columns (zero padded)
//   owin    [L][kCB]  out (kOut): o
//   states  [(L+1)][K][kCB] out (kStore): slot l holds S_{t0+l-1}
//   ewin    [L][kCB]  out (kStore): e_t
// The update S_t = Sbar + beta k e^T of token t is applied in token t+1's single pass over S
// (the "pending" update), so every token reads and writes its state slice once.
template <bool kPerChannel, bool kOut, bool kStore>
[[gnu::noinline]] void fwd_window(const HeadView& h, int64_t t0, int64_t t1, double* S, const double* vwin,
                                  double* owin, double* states, double* ewin) {
  const int K = h.K;
  Pk be[kNP];  // beta * e of the pending update
  for (auto& x : be) x = zero();
  QKRow kprev{h.pr->zeros.data(), 1.0};
  const Pk rho = bc(h.rho);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t lt = t - t0;
    const QKRow kt = h.k(t);
    const QKRow qt = h.q(t);
    const double* dt = h.dec(t);
    const Pk dscalar = bc(dt[0]);
    double* slot = kStore ? states + lt * K * kCB : nullptr;
    Pk accK[kNP], accQ[kNP];
    for (int u = 0; u < kNP; ++u) accK[u] = accQ[u] = zero();
    for (int d = 0; d < K; ++d) {
      double* row = S + d * kCB;
      const Pk kp = bc(kprev[d]);
      const Pk kd = bc(kt[d]);
      const Pk dd = kPerChannel ? bc(dt[d]) : dscalar;
      [[maybe_unused]] Pk qd;
      if constexpr (kOut) qd = bc(qt[d]);
      for (int u = 0; u < kNP; ++u) {
        const Pk s = ei::padd(ld(row + u * kPS), ei::pmul(kp, be[u]));  // S_{t-1}
        if constexpr (kStore) st(slot + d * kCB + u * kPS, s);
        const Pk sb = ei::pmul(dd, s);  // Sbar_t
        st(row + u * kPS, sb);
        accK[u] = ei::padd(accK[u], ei::pmul(kd, sb));
        if constexpr (kOut) accQ[u] = ei::padd(accQ[u], ei::pmul(qd, sb));
      }
    }
    const Pk bt = bc(h.b(t));
    [[maybe_unused]] const Pk qkb = bc(h.qk(t));
    for (int u = 0; u < kNP; ++u) {
      const Pk e = ei::psub(ld(vwin + lt * kCB + u * kPS), accK[u]);
      if constexpr (kStore) st(ewin + lt * kCB + u * kPS, e);
      be[u] = ei::pmul(bt, e);
      if constexpr (kOut) st(owin + lt * kCB + u * kPS, ei::pmul(rho, ei::padd(accQ[u], ei::pmul(qkb, be[u]))));
    }
    kprev = kt;
  }
  // Apply the last pending update: S_{t1-1}.
  double* last = kStore ? states + (t1 - t0) * K * kCB : nullptr;
  for (int d = 0; d < K; ++d) {
    const Pk kp = bc(kprev[d]);
    for (int u = 0; u < kNP; ++u) {
      const Pk s = ei::padd(ld(S + d * kCB + u * kPS), ei::pmul(kp, be[u]));
      st(S + d * kCB + u * kPS, s);
      if constexpr (kStore) st(last + d * kCB + u * kPS, s);
    }
  }
}

// Two running sums over the kNP registers of a row (even / odd registers), so that the per-row
// reductions need two accumulators instead of kNP temporaries; fixed order.
struct RowSum {
  Pk a[2];
  template <int kU>
  void add(const Pk& x) {
    if constexpr (kU < 2) {
      a[kU] = x;
    } else {
      a[kU & 1] = ei::padd(a[kU & 1], x);
    }
  }
  double total() const { return kNP == 1 ? ei::predux(a[0]) : ei::predux(ei::padd(a[0], a[1])); }
};

// Compile-time loop u = 0 .. kNP-1 (the register index must be a constant for RowSum).
template <int kU = 0, class F>
inline void for_each_reg(F&& f) {
  if constexpr (kU < kNP) {
    f(std::integral_constant<int, kU>{});
    for_each_reg<kU + 1>(f);
  }
}

// One reverse step (token t) over the rows of a block; with kFuse the next reverse step's first
// half (G and kG for token t-1, dq_{t-1}) is fused in, so each token touches its slices once.
template <bool kPerChannel, bool kFuse>
inline void bwd_step(int K, const double* sprev /*S_{t-1} [K][kCB]*/, const double* dect, const QKRow& kt,
                     const Pk (&de)[kNP], const Pk (&be)[kNP], double* G, double* dS, double* dk_row, double* da_row,
                     const QKRow& qp, const QKRow& kp, const Pk (&rdOp)[kNP], double* dq_row_prev, Pk (&kGn)[kNP]) {
  Pk daacc[2] = {zero(), zero()};  // GDN: sum over rows and columns of Sbar o dSbar
  const Pk dscalar = bc(dect[0]);
  for (int d = 0; d < K; ++d) {
    const Pk dd = kPerChannel ? bc(dect[d]) : dscalar;
    const Pk kd = bc(kt[d]);
    [[maybe_unused]] Pk qpd, kpd;
    if constexpr (kFuse) {
      qpd = bc(qp[d]);
      kpd = bc(kp[d]);
    }
    RowSum dk, da, dq;
    const double* sp_row = sprev + d * kCB;
    double* g_row = G + d * kCB;
    for_each_reg([&](auto uc) {
      constexpr int u = decltype(uc)::value;
      const Pk sp = ld(sp_row + u * kPS);
      const Pk sb = ei::pmul(dd, sp);
      const Pk g = ld(g_row + u * kPS);
      const Pk dsb = ei::psub(g, ei::pmul(de[u], kd));
      dk.add<u>(ei::psub(ei::pmul(be[u], g), ei::pmul(de[u], sb)));
      if constexpr (kPerChannel) {
        da.add<u>(ei::pmul(sb, dsb));
      } else {
        daacc[u & 1] = ei::padd(daacc[u & 1], ei::pmul(sb, dsb));
      }
      const Pk ds = ei::pmul(dd, dsb);
      if constexpr (kFuse) {
        const Pk gn = ei::padd(ds, ei::pmul(qpd, rdOp[u]));
        st(g_row + u * kPS, gn);
        kGn[u] = ei::padd(kGn[u], ei::pmul(kpd, gn));
        dq.add<u>(ei::pmul(sp, rdOp[u]));
      } else {
        st(dS + d * kCB + u * kPS, ds);
      }
    });
    dk_row[d] = dk.total();
    if constexpr (kPerChannel) da_row[d] = da.total();
    if constexpr (kFuse) dq_row_prev[d] = dq.total();
  }
  if constexpr (!kPerChannel) da_row[0] = ei::predux(ei::padd(daacc[0], daacc[1]));
}

// Reverse sweep over tokens [t0, t1) for one block.
//   states  [(L+1)][K][kCB]  from fwd_window<kStore>;  ewin [L][kCB];  rdOwin [L][kCB] = rho dO
//   dS      [K][kCB]  in: gradient w.r.t. S_{t1-1} from later tokens; out: w.r.t. S_{t0-1}
//   G       [K][kCB]  scratch
//   contrib out: this block's contributions for token t0 + l at contrib + l * stride: dq [K], dk
//   [K],
//           da [Kg], dbeta [1] (each written exactly once)
//   dvwin   [L][kCB]  out
template <bool kPerChannel>
[[gnu::noinline]] void bwd_window(const HeadView& h, int64_t t0, int64_t t1, const double* states, const double* ewin,
                                  const double* rdOwin, double* dS, double* G, double* contrib, int64_t stride,
                                  double* dvwin) {
  const int K = h.K;
  const int64_t L = t1 - t0;
  auto dq_row = [&](int64_t l) { return contrib + l * stride; };
  auto dk_row = [&](int64_t l) { return contrib + l * stride + K; };
  auto da_row = [&](int64_t l) { return contrib + l * stride + 2 * K; };
  auto db_at = [&](int64_t l) { return contrib + l * stride + 2 * K + h.Kg; };
  Pk kG[kNP];
  {  // G and kG of token t1-1, and its dq (uses S_{t1-1}, the last state slot)
    const int64_t lt = L - 1;
    const QKRow qt = h.q(t1 - 1);
    const QKRow kt = h.k(t1 - 1);
    const double* sl = states + L * K * kCB;
    Pk rdO[kNP];
    for (int u = 0; u < kNP; ++u) {
      rdO[u] = ld(rdOwin + lt * kCB + u * kPS);
      kG[u] = zero();
    }
    for (int d = 0; d < K; ++d) {
      const Pk qd = bc(qt[d]);
      const Pk kd = bc(kt[d]);
      RowSum dq;
      for_each_reg([&](auto uc) {
        constexpr int u = decltype(uc)::value;
        const int64_t o = d * kCB + u * kPS;
        const Pk g = ei::padd(ld(dS + o), ei::pmul(qd, rdO[u]));
        st(G + o, g);
        kG[u] = ei::padd(kG[u], ei::pmul(kd, g));
        dq.add<u>(ei::pmul(ld(sl + o), rdO[u]));
      });
      dq_row(lt)[d] = dq.total();
    }
  }
  for (int64_t t = t1 - 1; t >= t0; --t) {
    const int64_t lt = t - t0;
    const Pk bt = bc(h.b(t));
    Pk de[kNP], be[kNP], kGn[kNP], rdOp[kNP];
    RowSum db;
    for_each_reg([&](auto uc) {
      constexpr int u = decltype(uc)::value;
      const Pk e = ld(ewin + lt * kCB + u * kPS);
      de[u] = ei::pmul(bt, kG[u]);
      be[u] = ei::pmul(bt, e);
      db.add<u>(ei::pmul(kG[u], e));
      st(dvwin + lt * kCB + u * kPS, de[u]);
      kGn[u] = zero();
      rdOp[u] = lt > 0 ? ld(rdOwin + (lt - 1) * kCB + u * kPS) : zero();
    });
    *db_at(lt) = db.total();
    const double* sprev = states + lt * K * kCB;
    if (t > t0) {
      bwd_step<kPerChannel, true>(K, sprev, h.dec(t), h.k(t), de, be, G, dS, dk_row(lt), da_row(lt), h.q(t - 1),
                                  h.k(t - 1), rdOp, dq_row(lt - 1), kGn);
    } else {
      bwd_step<kPerChannel, false>(K, sprev, h.dec(t), h.k(t), de, be, G, dS, dk_row(lt), da_row(lt), QKRow{}, QKRow{},
                                   rdOp, nullptr, kGn);
    }
    for (int u = 0; u < kNP; ++u) kG[u] = kGn[u];
  }
}

}  // namespace

Windows windows(const Problem& p, int n, int window) {
  const int64_t len = p.cu_seqlens[zs(n) + 1] - p.cu_seqlens[zs(n)];
  auto [r, r1] = probe_rows(p, n);
  Windows w;
  // Next boundary: the next multiple of the window, the next probe or the end, whichever is first.
  for (int64_t x = 0;; x = std::min({len, (x / window + 1) * window, r < r1 ? p.probes[zs(r)] : len})) {
    w.pos.push_back(x);
    w.probe.push_back(r < r1 && p.probes[zs(r)] == x ? r++ : -1);
    if (x == len) return w;
  }
}

namespace {

struct Item {
  int n = 0, j = 0;    // sequence, value head
  int b0 = 0, b1 = 0;  // column blocks [b0, b1)
  int64_t prev = -1;   // chain predecessor (item index) or -1
};

class Runner {
 public:
  Runner(const Problem& p, const Inputs& in, const Prepared& pr, Outputs& out, Grads* gr, const Tuning& tu)
      : p_(p), in_(in), pr_(pr), out_(out), gr_(gr), tu_(tu) {}

  void run(int threads) {
    for (int n = 0; n < p_.sequences(); ++n) win_.push_back(windows(p_, n, tu_.window));
    build_items(threads);
    progress_ = std::vector<std::atomic<int>>(items_.size());
    parallel_for(
        static_cast<int64_t>(items_.size()), threads,
        [&](int64_t r) {
          if (gr_ == nullptr) {
            forward_item(items_[zs(r)]);
          } else {
            backward_item(items_[zs(r)], r);
          }
        },
        [&](int64_t r) {  // let successors run on (the error is rethrown afterwards)
          progress_[zs(r)].store(std::numeric_limits<int>::max());
          progress_[zs(r)].notify_all();
        });
  }

 private:
  void build_items(int threads) {
    const int N = p_.sequences();
    const int nb = (p_.V + kCB - 1) / kCB;
    int nonempty = 0;
    for (int n = 0; n < N; ++n) nonempty += len(n) > 0 ? 1 : 0;
    if (nonempty == 0) return;
    const int64_t heads = static_cast<int64_t>(nonempty) * p_.HV;
    // Column groups: enough items for the threads, as wide as possible otherwise (wider items
    // reuse each token's q, k and decay over more column blocks). Results do not depend on it.
    const int64_t want = static_cast<int64_t>(tu_.items_per_thread) * threads;
    const int groups = static_cast<int>(
        std::clamp<int64_t>(tu_.column_groups > 0 ? tu_.column_groups : (want + heads - 1) / heads, 1, nb));
    // Chains (n, i), longest sequences first (a scheduling choice only: results do not depend on
    // it).
    std::vector<int> order(static_cast<size_t>(N));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return len(a) > len(b); });
    const int G = p_.HV / p_.H;
    for (int n : order) {
      if (len(n) == 0) continue;
      for (int i = 0; i < p_.H; ++i) {
        int64_t prev = -1;
        for (int j = i * G; j < (i + 1) * G; ++j) {
          for (int g = 0; g < groups; ++g) {
            Item it;
            it.n = n;
            it.j = j;
            it.b0 = static_cast<int>(static_cast<int64_t>(nb) * g / groups);
            it.b1 = static_cast<int>(static_cast<int64_t>(nb) * (g + 1) / groups);
            it.prev = prev;
            prev = static_cast<int64_t>(items_.size());
            items_.push_back(it);
          }
        }
      }
    }
  }

  int64_t bos(int n) const { return p_.cu_seqlens[zs(n)]; }
  int64_t len(int n) const { return p_.cu_seqlens[zs(n) + 1] - p_.cu_seqlens[zs(n)]; }

  HeadView view(const Item& it) const {
    return HeadView{&pr_, in_.beta, it.j, it.j / pr_.G, pr_.K, pr_.H, pr_.HV, pr_.Kg, pr_.rho};
  }

  // Offset of row `row` (a sequence, or a probe), value head j, in a [rows, HV, K, V] tensor.
  int64_t state_offset(int64_t row, int j) const { return (row * p_.HV + j) * p_.K * p_.V; }

  // Loads the item's state [nbl][K][kCB] from a [N, HV, K, V] tensor (or zeros); stores it back
  // into row `row` of a [rows, HV, K, V] tensor.
  void load_state(const Item& it, const float* src, double* S) const {
    const int K = p_.K, V = p_.V;
    const int nbl = it.b1 - it.b0;
    std::fill(S, S + static_cast<int64_t>(nbl) * K * kCB, 0.0);
    if (src == nullptr) return;
    const float* base = src + state_offset(it.n, it.j);
    for (int b = 0; b < nbl; ++b) {
      const int c0 = (it.b0 + b) * kCB, nc = std::min(kCB, V - c0);
      for (int d = 0; d < K; ++d)
        for (int c = 0; c < nc; ++c) S[(static_cast<int64_t>(b) * K + d) * kCB + c] = base[d * V + c0 + c];
    }
  }
  void store_state(const Item& it, const double* S, double* dst, int64_t row) const {
    const int K = p_.K, V = p_.V;
    double* base = dst + state_offset(row, it.j);
    for (int b = 0; b < it.b1 - it.b0; ++b) {
      const int c0 = (it.b0 + b) * kCB, nc = std::min(kCB, V - c0);
      for (int d = 0; d < K; ++d)
        for (int c = 0; c < nc; ++c) base[d * V + c0 + c] = S[(static_cast<int64_t>(b) * K + d) * kCB + c];
    }
  }
  // When boundary w of the item's windows is a probe, copies the item's state there (S or dS) into
  // the probe's row of dst [P, HV, K, V] (docs/algorithm.md 1.4).
  void store_probe(const Item& it, int64_t w, const double* S, std::vector<double>& dst) const {
    const int64_t row = win_[zs(it.n)].probe[zs(w)];
    if (row >= 0) store_state(it, S, dst.data(), row);
  }

  // Token-major [T, HV, V] tensor <-> window block [L][kCB] (zero padded), with a factor.
  void gather(const float* src, double f, int j, int blk, int64_t t0, int64_t t1, double* win) const {
    const int c0 = blk * kCB, nc = std::min(kCB, p_.V - c0);
    for (int64_t t = t0; t < t1; ++t) {
      double* w = win + (t - t0) * kCB;
      const float* s = src + (t * p_.HV + j) * p_.V + c0;
      for (int c = 0; c < kCB; ++c) w[c] = c < nc ? f * s[c] : 0.0;
    }
  }
  void scatter(const double* win, int j, int blk, int64_t t0, int64_t t1, double* dst) const {
    const int c0 = blk * kCB, nc = std::min(kCB, p_.V - c0);
    for (int64_t t = t0; t < t1; ++t)
      std::memcpy(dst + (t * p_.HV + j) * p_.V + c0, win + (t - t0) * kCB, zs(nc) * sizeof(double));
  }

  template <bool kPerChannel, bool kOut>
  void fwd(const HeadView& h, int64_t t0, int64_t t1, double* S, const double* vwin, double* owin) const {
    fwd_window<kPerChannel, kOut, false>(h, t0, t1, S, vwin, owin, nullptr, nullptr);
  }

  // Forward over windows [w0, w1) of the item, all blocks; optionally a copy of the state at the
  // start of windows w with (w - w0) % every == 0 into ckpt[(w - w0) / every]. The first pass
  // (with_o) also writes o and the probe states at the boundaries w0 .. w1.
  void forward_span(const Item& it, const HeadView& h, int64_t w0, int64_t w1, bool with_o, double* S, double* ckpt,
                    int64_t every, std::vector<double>& vwin, std::vector<double>& owin) const {
    const int64_t b = bos(it.n);
    const std::vector<int64_t>& pos = win_[zs(it.n)].pos;
    const int nbl = it.b1 - it.b0;
    const int64_t item_sz = static_cast<int64_t>(nbl) * p_.K * kCB;
    const bool perc = p_.op == Op::Kda;
    for (int64_t w = w0; w < w1; ++w) {
      if (with_o) store_probe(it, w, S, out_.probe_S);
      if (ckpt != nullptr && (w - w0) % every == 0) std::copy(S, S + item_sz, ckpt + (w - w0) / every * item_sz);
      const int64_t t0 = b + pos[zs(w)], t1 = b + pos[zs(w) + 1];
      for (int blk = 0; blk < nbl; ++blk) {
        double* Sb = S + static_cast<int64_t>(blk) * p_.K * kCB;
        gather(in_.v, 1.0, it.j, it.b0 + blk, t0, t1, vwin.data());
        if (with_o) {
          if (perc)
            fwd<true, true>(h, t0, t1, Sb, vwin.data(), owin.data());
          else
            fwd<false, true>(h, t0, t1, Sb, vwin.data(), owin.data());
          scatter(owin.data(), it.j, it.b0 + blk, t0, t1, out_.o.data());
        } else {
          if (perc)
            fwd<true, false>(h, t0, t1, Sb, vwin.data(), nullptr);
          else
            fwd<false, false>(h, t0, t1, Sb, vwin.data(), nullptr);
        }
      }
    }
    if (with_o) store_probe(it, w1, S, out_.probe_S);
  }

  void forward_item(const Item& it) {
    const HeadView h = view(it);
    const int64_t W = tu_.window, nwin = win_[zs(it.n)].count();
    const int64_t item_sz = static_cast<int64_t>(it.b1 - it.b0) * p_.K * kCB;
    std::vector<double> S(zs(item_sz)), vwin(zs(W * kCB)), owin(zs(W * kCB));
    load_state(it, p_.has_h0 ? in_.h0 : nullptr, S.data());
    forward_span(it, h, 0, nwin, true, S.data(), nullptr, 1, vwin, owin);
    store_state(it, S.data(), out_.ht.data(), it.n);
  }

  // Buffers of the reverse sweep over one window of an item (backward_item).
  struct Sweep {
    std::vector<double> Sblk, G, states, ewin, vwin, rdOwin, dvwin;
    // Each block's contributions to dq, dk, da, dbeta of the window, token-major with the blocks
    // of a token adjacent ([W][nbl][rec], rec = 2 K + Kg + 1); added to the sums in block order
    // (publish_window), so that the order of every sum over blocks is the same for any grouping.
    std::vector<double> contrib;
  };
  int64_t rec() const { return 2 * static_cast<int64_t>(p_.K) + pr_.Kg + 1; }
  Sweep make_sweep(const Item& it) const {
    const int64_t W = tu_.window, blk_sz = static_cast<int64_t>(p_.K) * kCB;
    Sweep x;
    x.Sblk.resize(zs(blk_sz));
    x.G.resize(zs(blk_sz));
    x.states.resize(zs((W + 1) * blk_sz));
    for (auto* v : {&x.ewin, &x.vwin, &x.rdOwin, &x.dvwin}) v->resize(zs(W * kCB));
    x.contrib.resize(zs(W * (it.b1 - it.b0) * rec()));
    return x;
  }

  // Reverse sweep over tokens [t0, t1), block by block, from the item's checkpoint ck (the state
  // at t0): dS goes from the gradient w.r.t. the state at t1 to the one at t0; dv is written.
  void reverse_window(const Item& it, const HeadView& h, int64_t t0, int64_t t1, const double* ck, double* dS,
                      Sweep& x) const {
    const int nbl = it.b1 - it.b0;
    const int64_t blk_sz = static_cast<int64_t>(p_.K) * kCB, stride = nbl * rec();
    for (int blk = 0; blk < nbl; ++blk) {
      std::copy(ck + blk * blk_sz, ck + (blk + 1) * blk_sz, x.Sblk.begin());
      gather(in_.v, 1.0, it.j, it.b0 + blk, t0, t1, x.vwin.data());
      gather(in_.dO, pr_.rho, it.j, it.b0 + blk, t0, t1, x.rdOwin.data());
      double* dSb = dS + blk * blk_sz;
      double* cb = x.contrib.data() + blk * rec();
      if (p_.op == Op::Kda) {
        fwd_window<true, false, true>(h, t0, t1, x.Sblk.data(), x.vwin.data(), nullptr, x.states.data(), x.ewin.data());
        bwd_window<true>(h, t0, t1, x.states.data(), x.ewin.data(), x.rdOwin.data(), dSb, x.G.data(), cb, stride,
                         x.dvwin.data());
      } else {
        fwd_window<false, false, true>(h, t0, t1, x.Sblk.data(), x.vwin.data(), nullptr, x.states.data(),
                                       x.ewin.data());
        bwd_window<false>(h, t0, t1, x.states.data(), x.ewin.data(), x.rdOwin.data(), dSb, x.G.data(), cb, stride,
                          x.dvwin.data());
      }
      scatter(x.dvwin.data(), it.j, it.b0 + blk, t0, t1, gr_->dv.data());
    }
  }

  // Ordered publication of one window's partial sums of dq, dk, dg, dbeta (see the file comment):
  // waits until the chain predecessor has published as many windows, adds, publishes.
  void publish_window(const Item& it, int64_t self, int64_t t0, int64_t t1, const std::vector<double>& contrib,
                      int& published) {
    const int K = p_.K, Kg = pr_.Kg, nbl = it.b1 - it.b0, i = it.j / pr_.G;
    if (it.prev >= 0) {
      std::atomic<int>& pv = progress_[zs(it.prev)];
      for (int cur = pv.load(std::memory_order_acquire); cur <= published; cur = pv.load(std::memory_order_acquire))
        pv.wait(cur, std::memory_order_acquire);
    }
    for (int64_t t = t0; t < t1; ++t) {
      double* dq = gr_->dq.data() + (t * p_.H + i) * K;
      double* dk = gr_->dk.data() + (t * p_.H + i) * K;
      double* dg = gr_->dg.data() + (t * p_.HV + it.j) * Kg;
      double& db = gr_->dbeta[zs(t * p_.HV + it.j)];
      for (int blk = 0; blk < nbl; ++blk) {
        const double* c = contrib.data() + ((t - t0) * nbl + blk) * rec();
        for (int d = 0; d < K; ++d) {
          dq[d] += c[d];
          dk[d] += c[K + d];
        }
        for (int d = 0; d < Kg; ++d) dg[d] += c[2 * K + d];
        db += c[2 * K + Kg];
      }
    }
    ++published;
    progress_[zs(self)].store(published, std::memory_order_release);
    progress_[zs(self)].notify_all();
  }

  void backward_item(const Item& it, int64_t self) {
    const HeadView h = view(it);
    const std::vector<int64_t>& pos = win_[zs(it.n)].pos;
    const int64_t W = tu_.window, b = bos(it.n), nwin = win_[zs(it.n)].count();
    const bool single = nwin <= tu_.max_checkpoints;
    const int64_t seg = single ? nwin : static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(nwin))));
    const int64_t nseg = (nwin + seg - 1) / seg;
    const int64_t item_sz = static_cast<int64_t>(it.b1 - it.b0) * p_.K * kCB;

    std::vector<double> S(zs(item_sz)), dS(zs(item_sz)), vwin(zs(W * kCB)), owin(zs(W * kCB));
    std::vector<double> outer(zs((single ? nwin : nseg) * item_sz));
    std::vector<double> inner(single ? 0 : zs(seg * item_sz));

    // Pass A: forward with o, ht and the probe states; checkpoints at every window (one level) or
    // segment (two).
    load_state(it, p_.has_h0 ? in_.h0 : nullptr, S.data());
    forward_span(it, h, 0, nwin, true, S.data(), outer.data(), single ? 1 : seg, vwin, owin);
    store_state(it, S.data(), out_.ht.data(), it.n);

    Sweep x = make_sweep(it);
    load_state(it, p_.has_dht ? in_.dht : nullptr, dS.data());
    store_probe(it, nwin, dS.data(), gr_->probe_dS);
    int published = 0;
    for (int64_t s = nseg - 1; s >= 0; --s) {
      const int64_t ws0 = s * seg, ws1 = std::min(nwin, ws0 + seg);
      if (!single) {  // recompute this segment's window checkpoints
        std::copy(outer.begin() + s * item_sz, outer.begin() + (s + 1) * item_sz, S.begin());
        forward_span(it, h, ws0, ws1, false, S.data(), inner.data(), 1, vwin, owin);
      }
      const double* ck = single ? outer.data() : inner.data();
      const int64_t ck0 = single ? 0 : ws0;  // window index of ck's first checkpoint
      for (int64_t w = ws1 - 1; w >= ws0; --w) {
        const int64_t t0 = b + pos[zs(w)], t1 = b + pos[zs(w) + 1];
        reverse_window(it, h, t0, t1, ck + (w - ck0) * item_sz, dS.data(), x);
        publish_window(it, self, t0, t1, x.contrib, published);
        store_probe(it, w, dS.data(), gr_->probe_dS);
      }
    }
    if (p_.has_h0) store_state(it, dS.data(), gr_->dh0.data(), it.n);
  }

  const Problem& p_;
  const Inputs& in_;
  const Prepared& pr_;
  Outputs& out_;
  Grads* gr_;
  Tuning tu_;
  std::vector<Item> items_;
  std::vector<Windows> win_;  // per sequence
  std::vector<std::atomic<int>> progress_;
};

}  // namespace

void run_recurrence(const Problem& p, const Inputs& in, const Prepared& pr, Outputs& out, Grads* grads, int threads,
                    const Tuning& tuning) {
  Runner(p, in, pr, out, grads, tuning).run(threads);
}

}  // namespace kcp::ref::detail

namespace kcp::ref {

std::string simd_description() {
#if defined(EIGEN_VECTORIZE_AVX512)
  const char* isa = "AVX-512";
#elif defined(EIGEN_VECTORIZE_AVX2)
  const char* isa = "AVX2";
#elif defined(EIGEN_VECTORIZE_AVX)
  const char* isa = "AVX";
#elif defined(EIGEN_VECTORIZE_SSE2)
  const char* isa = "SSE2";
#else
  const char* isa = detail::kPS > 1 ? "other SIMD" : "no SIMD";  // NEON, VSX, ...
#endif
  return std::string(isa) + ", " + std::to_string(detail::kPS) + (detail::kPS == 1 ? " double" : " doubles") +
         " a packet";
}

}  // namespace kcp::ref
