// Per-sequence FP64 reference: inputs regenerated for the sequence's token range (the same
// counter-based values every rank sees), run through reference/ (which reads the floats as double).
#include "core/compare/reference_data.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <tuple>

#include "core/inputs/inputs.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "reference/reference.h"

namespace kcp {

namespace {
ref::Problem ref_problem(const RowConfig& row, int64_t len) {
  ref::Problem p;
  p.op = row.op;
  p.H = row.H;
  p.HV = row.HV;
  p.K = row.K;
  p.V = row.V;
  p.cu_seqlens = {0, len};
  // The kernels use the scale as fp32 (K^-1/2 rounded); the reference uses the same value.
  p.scale = row.scale != 0 ? double(float(row.scale)) : double(1.0f / std::sqrt(float(row.K)));
  p.qk_l2norm = row.qk_l2norm;
  p.gate = row.gate;
  p.lower_bound = double(float(row.lower_bound));
  p.has_A_log = row.A_log;
  p.has_dt_bias = row.dt_bias;
  p.has_h0 = row.initial_state;
  p.has_dht = row.dht;
  return p;
}

// inputs_secs: the part of the time spent drawing the inputs (make_inputs).
SequenceReference compute_sequence(const RowConfig& row, const std::string& digest, int seq, int threads,
                                   const std::vector<int64_t>& probes, HeadRange heads, double& inputs_secs) {
  int64_t t0 = 0;
  for (int s = 0; s < seq; ++s) t0 += row.seqlens[s];
  const int64_t len = row.seqlens[seq];
  const auto t_in = std::chrono::steady_clock::now();
  RowInputs in = make_inputs(row, digest, t0, t0 + len, heads, threads);
  inputs_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_in).count();
  const RowConfig part = head_range_row(row, heads);
  const int64_t state = int64_t(part.HV) * part.K * part.V;
  // The reference reads the float inputs directly (converted to double exactly as it reads them);
  // h0 and dht are this sequence's rows of the row's [N, HV, K, V] states.
  ref::Inputs ri;
  ri.q = in.q.data();
  ri.k = in.k.data();
  ri.v = in.v.data();
  ri.g = in.g.data();
  ri.beta = in.beta.data();
  ri.A_log = row.A_log ? in.A_log.data() : nullptr;
  ri.dt_bias = row.dt_bias ? in.dt_bias.data() : nullptr;
  ri.h0 = row.initial_state ? in.h0.data() + seq * state : nullptr;
  ri.dO = in.dO.data();
  ri.dht = row.dht ? in.dht.data() + seq * state : nullptr;
  ref::Outputs out;
  ref::Grads gr;
  ref::Problem problem = ref_problem(part, len);
  if (!probes.empty()) {  // docs/algorithm.md 1.4: S_p and dS_p at the boundaries the forms judge
    problem.probe_cu = {0, static_cast<int64_t>(probes.size())};
    problem.probes = probes;
  }
  ref::forward_backward(problem, ri, out, gr, threads);
  SequenceReference r;
  r.seq = seq;
  r.t_begin = t0;
  r.t_end = t0 + len;
  r.o = std::move(out.o);
  r.ht = std::move(out.ht);
  r.dq = std::move(gr.dq);
  r.dk = std::move(gr.dk);
  r.dv = std::move(gr.dv);
  r.dg = std::move(gr.dg);
  r.dbeta = std::move(gr.dbeta);
  r.dA_log = std::move(gr.dA_log);
  r.ddt_bias = std::move(gr.ddt_bias);
  r.dh0 = std::move(gr.dh0);
  r.probes = probes;
  r.probe_S = std::move(out.probe_S);
  r.probe_dS = std::move(gr.probe_dS);
  r.heads = heads;
  return r;
}

// Cache file (kcpbench-ref/4): the magic line, a header with the key the file was made for (row
// digest, seed, sequence, reference version, the reference's SIMD (its last bits follow the packet
// width: ref::simd_description), the element count of every field, the number and a hash of the
// probe positions) and a checksum of the payload, then the payload: the probe
// positions (int64), then each field's doubles in fields() order. A file that does not
// match its key, is cut short, is longer, or fails the checksum is reported in one warning line
// naming the file and why, recomputed and rewritten.
std::vector<std::vector<double>*> fields(SequenceReference& r) {
  return {&r.o, &r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.ht, &r.dh0, &r.dA_log, &r.ddt_bias, &r.probe_S, &r.probe_dS};
}
constexpr int kFields = 12;
constexpr char kCacheMagic[] = "kcpbench-ref/4\n";
constexpr size_t kMagicBytes = sizeof(kCacheMagic) - 1;
// Bump when reference/ changes the numbers it computes: files of another version are recomputed.
constexpr int64_t kReferenceVersion = 1;
constexpr int64_t kMaxCachedBytes = int64_t(256) << 20;  // per sequence

struct CacheHeader {
  char digest[64] = {};  // the row digest (hex), zero padded
  uint64_t seed = 0;
  int64_t seq = 0;
  int64_t version = kReferenceVersion;
  char simd[48] = {};  // ref::simd_description(), zero padded
  int64_t counts[kFields] = {};
  int64_t n_probes = 0;
  uint64_t probes_hash = 0;  // fnv_words of the probe positions
  uint64_t checksum = 0;     // payload_checksum of the payload
};

// FNV-1a over 64-bit words: each step is a bijection of the state for a given word, so a change
// in any one word always changes the hash.
template <class T>
void fnv_words(uint64_t& h, const std::vector<T>& v) {
  static_assert(sizeof(T) == sizeof(uint64_t));
  for (const T& x : v) {
    uint64_t w;
    std::memcpy(&w, &x, sizeof(w));
    h = (h ^ w) * 1099511628211ull;
  }
}
constexpr uint64_t kFnvStart = 1469598103934665603ull;

// At most 8 positions, for a warning line.
std::string positions_text(const std::vector<int64_t>& p) {
  const size_t n = std::min<size_t>(p.size(), 8);
  return fmt::format("{} [{}{}]", p.size(), fmt::join(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(n), ", "),
                     p.size() > n ? ", ..." : "");
}

// The payload's checksum: the probe positions, then every field.
uint64_t payload_checksum(SequenceReference& r) {
  uint64_t h = kFnvStart;
  fnv_words(h, r.probes);
  for (auto* v : fields(r)) fnv_words(h, *v);
  return h;
}

// Why a file made for other probe positions cannot be used, naming both lists (the file's read
// from its payload when it can be).
std::string probes_mismatch(std::ifstream& f, const CacheHeader& h, const std::vector<int64_t>& want) {
  std::vector<int64_t> have(static_cast<size_t>(std::clamp<int64_t>(h.n_probes, 0, int64_t(1) << 24)));
  f.read(reinterpret_cast<char*>(have.data()), std::streamsize(have.size() * sizeof(int64_t)));
  const std::string theirs = f ? positions_text(have) : fmt::format("{} (unreadable)", h.n_probes);
  return fmt::format("made for other probe positions ({}), not ({})", theirs, positions_text(want));
}

// Loads a cache file made for `key`. Returns false with why empty when there is no file, with
// why set when the file cannot be used.
bool load(const std::string& path, const CacheHeader& key, const std::vector<int64_t>& probes, SequenceReference& r,
          std::string& why) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    why = fmt::format("cannot be opened ({})", std::strerror(errno));
    return false;
  }
  char magic[kMagicBytes] = {};
  if (!f.read(magic, kMagicBytes) || std::memcmp(magic, kCacheMagic, kMagicBytes) != 0) {
    why = "not a kcpbench-ref/4 file (another format or version of kcpbench)";
    return false;
  }
  CacheHeader h;
  if (!f.read(reinterpret_cast<char*>(&h), sizeof(h))) {
    why = "short read (the header is cut off)";
    return false;
  }
  const std::string have(h.digest, strnlen(h.digest, sizeof(h.digest))),
      want(key.digest, strnlen(key.digest, sizeof(key.digest)));
  if (have != want)
    why = fmt::format("made for row digest {}, not {}", have.substr(0, 16), want.substr(0, 16));
  else if (h.seed != key.seed)
    why = fmt::format("made for seed {}, not {}", h.seed, key.seed);
  else if (h.seq != key.seq)
    why = fmt::format("made for sequence {}, not {}", h.seq, key.seq);
  else if (h.version != key.version)
    why = fmt::format("made by reference version {}, not {}", h.version, key.version);
  else if (std::memcmp(h.simd, key.simd, sizeof(h.simd)) != 0)
    why = fmt::format("made by a reference built for {}, not {}", std::string(h.simd, strnlen(h.simd, sizeof(h.simd))),
                      std::string(key.simd, strnlen(key.simd, sizeof(key.simd))));
  else if (h.n_probes != key.n_probes || h.probes_hash != key.probes_hash)
    why = probes_mismatch(f, h, probes);
  else if (!std::equal(h.counts, h.counts + kFields, key.counts))
    why = fmt::format("element counts [{}] differ from the row's [{}]", fmt::join(h.counts, h.counts + kFields, ", "),
                      fmt::join(key.counts, key.counts + kFields, ", "));
  if (!why.empty()) return false;
  r.probes.resize(static_cast<size_t>(key.n_probes));
  if (!f.read(reinterpret_cast<char*>(r.probes.data()), std::streamsize(r.probes.size() * sizeof(int64_t)))) {
    why = "short read (the probe positions are cut off)";
    return false;
  }
  if (r.probes != probes) {  // the header's hash agreed: only a collision or damage gets here
    why = fmt::format("probe positions {} differ from its header's", positions_text(r.probes));
    return false;
  }
  int64_t payload = 0;
  auto fs = fields(r);
  for (int i = 0; i < kFields; ++i) {
    fs[i]->resize(static_cast<size_t>(key.counts[i]));
    payload += key.counts[i] * int64_t(sizeof(double));
  }
  int64_t got = 0;
  for (auto* v : fs) {
    f.read(reinterpret_cast<char*>(v->data()), static_cast<std::streamsize>(v->size() * sizeof(double)));
    got += f.gcount();
    if (!f) {
      why = fmt::format("short read ({} of {} payload bytes)", got, payload);
      return false;
    }
  }
  if (f.peek() != std::char_traits<char>::eof()) {
    why = "longer than its header says";
    return false;
  }
  if (payload_checksum(r) != h.checksum) {
    why = "checksum mismatch (damaged)";
    return false;
  }
  return true;
}

void store(const std::string& path, CacheHeader key, SequenceReference& r) {
  static std::atomic<int> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
  key.checksum = payload_checksum(r);
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) return;  // the folder was usable when the run began; the cache only saves time
    f.write(kCacheMagic, kMagicBytes);
    f.write(reinterpret_cast<const char*>(&key), sizeof(key));
    f.write(reinterpret_cast<const char*>(r.probes.data()), std::streamsize(r.probes.size() * sizeof(int64_t)));
    for (auto* v : fields(r))
      f.write(reinterpret_cast<const char*>(v->data()), std::streamsize(v->size() * sizeof(double)));
    if (!f.flush()) {
      f.close();
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

size_t expected_size(const RowConfig& row, int seq, int which, size_t n_probes) {
  const size_t len = static_cast<size_t>(row.seqlens[seq]), HV = row.HV, H = row.H, K = row.K, V = row.V;
  const size_t gw = row.op == Op::Kda ? K : 1;
  switch (which) {
    case 0:
      return len * HV * V;  // o
    case 1:
    case 2:
      return len * H * K;  // dq, dk
    case 3:
      return len * HV * V;  // dv
    case 4:
      return len * HV * gw;  // dg
    case 5:
      return len * HV;  // dbeta
    case 6:
      return HV * K * V;  // ht
    case 7:
      return row.initial_state ? HV * K * V : 0;
    case 8:
      return row.A_log ? HV : 0;
    case 9:
      return row.dt_bias ? HV * gw : 0;
    default:
      return n_probes * HV * K * V;  // probe_S, probe_dS
  }
}
CacheHeader cache_key(const RowConfig& row, const std::string& digest, int seq, const std::vector<int64_t>& probes) {
  CacheHeader h;
  std::memcpy(h.digest, digest.data(), std::min(digest.size(), sizeof(h.digest)));
  h.seed = row.seed;
  h.seq = seq;
  const std::string simd = ref::simd_description();
  std::memcpy(h.simd, simd.data(), std::min(simd.size(), sizeof(h.simd) - 1));
  for (int i = 0; i < kFields; ++i) h.counts[i] = static_cast<int64_t>(expected_size(row, seq, i, probes.size()));
  h.n_probes = static_cast<int64_t>(probes.size());
  h.probes_hash = kFnvStart;
  fnv_words(h.probes_hash, probes);
  return h;
}

// The cache folder if it can be created and written, else "" after one warning line per folder
// and process (not per row or sequence): the run goes on without a cache.
std::string usable_cache_dir(const std::string& dir) {
  if (dir.empty()) return dir;
  static std::mutex mutex;
  static std::map<std::string, bool> checked;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = checked.find(dir); it != checked.end()) return it->second ? dir : "";
  std::string why;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    why = ec ? fmt::format("it cannot be created: {}", ec.message()) : "it is not a folder";
  } else {
    const std::string probe = fmt::format("{}/.kcpbench-probe-{}", dir, ::getpid());
    std::FILE* f = std::fopen(probe.c_str(), "wb");
    if (!f)
      why = fmt::format("a file cannot be created in it: {}", std::strerror(errno));
    else {
      std::fclose(f);
      std::filesystem::remove(probe, ec);
    }
  }
  checked[dir] = why.empty();
  if (!why.empty())
    log::warn("FP64 reference cache folder {} cannot be used ({}); running without a reference cache", dir, why);
  return why.empty() ? dir : "";
}
}  // namespace

struct ReferenceCache::Impl {
  using Key = std::tuple<int, int, int>;  // sequence, first head, heads (0: every head)
  const RowConfig& row;
  std::string digest, dir;
  int threads;
  ProbePositions probes;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<Key, std::shared_ptr<const SequenceReference>> done;
  std::map<Key, bool> running;
  double seconds = 0, inputs_seconds = 0;
  Impl(const RowConfig& r, std::string d, std::string c, int t, ProbePositions p)
      : row(r), digest(std::move(d)), dir(usable_cache_dir(c)), threads(t), probes(std::move(p)) {}
  const std::vector<int64_t>& probes_of(int seq) const {
    static const std::vector<int64_t> none;
    return size_t(seq) < probes.size() ? probes[size_t(seq)] : none;
  }
  Key key(int seq, HeadRange h) const { return h.whole(row.H) ? Key{seq, 0, 0} : Key{seq, h.first, h.count}; }
  // The sequence's reference from the disk cache, or computed (and stored when whole and small).
  void load_or_compute(int seq, HeadRange heads, SequenceReference& r, double& secs, double& inputs_secs);
};

ReferenceCache::ReferenceCache(const RowConfig& row, std::string digest, std::string cache_dir, int threads,
                               ProbePositions probes)
    : impl_(std::make_unique<Impl>(row, std::move(digest), std::move(cache_dir), threads, std::move(probes))) {}
ReferenceCache::~ReferenceCache() = default;

double ReferenceCache::compute_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->seconds;
}

double ReferenceCache::inputs_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->inputs_seconds;
}

void ReferenceCache::Impl::load_or_compute(int seq, HeadRange heads, SequenceReference& r, double& secs,
                                           double& inputs_secs) {
  const bool whole = heads.whole(row.H);
  const std::string path =
      dir.empty() || !whole ? "" : fmt::format("{}/{}-seed{}-seq{}.bin", dir, digest.substr(0, 16), row.seed, seq);
  const CacheHeader k = cache_key(row, digest, seq, probes_of(seq));
  std::string why;
  const bool loaded = !path.empty() && load(path, k, probes_of(seq), r, why);
  if (!why.empty()) log::warn("FP64 reference cache file {}: {}; recomputing it", path, why);
  if (loaded) return;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r = compute_sequence(row, digest, seq, threads, probes_of(seq), whole ? HeadRange{} : heads, inputs_secs);
  } catch (const std::invalid_argument& e) {
    KCP_THROW(InvariantError, "FP64 reference refused row {} sequence {}: {}", row.name, seq, e.what());
  }
  secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Long sequences are not cached: an int3 sequence's FP64 gradients take gigabytes, more disk
  // than recomputing them costs time.
  int64_t bytes = 0;
  std::error_code ec;
  for (auto* v : fields(r)) bytes += static_cast<int64_t>(v->size() * sizeof(double));
  if (!path.empty() && bytes <= kMaxCachedBytes)
    store(path, k, r);
  else if (!why.empty())
    std::filesystem::remove(path, ec);  // too large to store again: no stale file
}

std::shared_ptr<const SequenceReference> ReferenceCache::get(int seq, HeadRange heads) {
  Impl& m = *impl_;
  const Impl::Key key = m.key(seq, heads);
  {
    std::unique_lock<std::mutex> lock(m.mutex);
    m.cv.wait(lock, [&] { return m.done.count(key) || !m.running[key]; });
    if (auto it = m.done.find(key); it != m.done.end()) return it->second;
    m.running[key] = true;
  }
  auto r = std::make_shared<SequenceReference>();
  double secs = 0, inputs_secs = 0;
  try {
    m.load_or_compute(seq, heads, *r, secs, inputs_secs);
  } catch (...) {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.running[key] = false;
    m.cv.notify_all();
    throw;
  }
  int64_t t0 = 0;
  for (int s = 0; s < seq; ++s) t0 += m.row.seqlens[s];
  r->seq = seq;
  r->t_begin = t0;
  r->t_end = t0 + m.row.seqlens[seq];
  r->heads = heads.whole(m.row.H) ? HeadRange{} : heads;
  std::lock_guard<std::mutex> lock(m.mutex);
  m.seconds += secs;
  m.inputs_seconds += inputs_secs;
  m.running[key] = false;
  m.done[key] = r;
  m.cv.notify_all();
  return r;
}

void ReferenceCache::release(HeadRange heads) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  for (auto it = m.done.begin(); it != m.done.end();)
    it = m.key(std::get<0>(it->first), heads) == it->first ? m.done.erase(it) : std::next(it);
}

const double* SequenceReference::probe_state(const std::vector<double>& field, int64_t p, int64_t state) const {
  const auto it = std::lower_bound(probes.begin(), probes.end(), p);
  if (it == probes.end() || *it != p) return nullptr;
  return field.data() + (it - probes.begin()) * state;
}

}  // namespace kcp
