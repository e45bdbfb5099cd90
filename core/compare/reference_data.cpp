// Per-sequence FP64 reference: inputs regenerated for the sequence's token range (the same
// counter-based values every rank sees), converted to double, run through reference/.
#include "core/compare/reference_data.h"

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "core/inputs/inputs.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "reference/reference.h"

namespace kcp {

namespace {
std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

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

SequenceReference compute_sequence(const RowConfig& row, const std::string& digest, int seq, int threads) {
  int64_t t0 = 0;
  for (int s = 0; s < seq; ++s) t0 += row.seqlens[s];
  const int64_t len = row.seqlens[seq];
  const RowInputs in = make_inputs(row, digest, t0, t0 + len);
  const int64_t state = int64_t(row.HV) * row.K * row.V;
  const auto q = to_double(in.q), k = to_double(in.k), v = to_double(in.v), g = to_double(in.g),
             beta = to_double(in.beta), dO = to_double(in.dO), A_log = to_double(in.A_log),
             dt_bias = to_double(in.dt_bias);
  std::vector<double> h0, dht;
  if (row.initial_state) h0.assign(in.h0.begin() + seq * state, in.h0.begin() + (seq + 1) * state);
  if (row.dht) dht.assign(in.dht.begin() + seq * state, in.dht.begin() + (seq + 1) * state);
  ref::Inputs ri;
  ri.q = q.data();
  ri.k = k.data();
  ri.v = v.data();
  ri.g = g.data();
  ri.beta = beta.data();
  ri.A_log = row.A_log ? A_log.data() : nullptr;
  ri.dt_bias = row.dt_bias ? dt_bias.data() : nullptr;
  ri.h0 = row.initial_state ? h0.data() : nullptr;
  ri.dO = dO.data();
  ri.dht = row.dht ? dht.data() : nullptr;
  ref::Outputs out;
  ref::Grads gr;
  ref::forward_backward(ref_problem(row, len), ri, out, gr, threads);
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
  return r;
}

// Binary cache file: a header line, then each vector as (int64 size, doubles).
std::vector<std::vector<double>*> fields(SequenceReference& r) {
  return {&r.o, &r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.ht, &r.dh0, &r.dA_log, &r.ddt_bias};
}
constexpr const char* kCacheMagic = "kcpbench-ref/1";
constexpr int64_t kMaxCachedBytes = int64_t(256) << 20;  // per sequence

bool load(const std::string& path, SequenceReference& r) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::string magic;
  std::getline(f, magic);
  if (magic != kCacheMagic) return false;
  for (auto* v : fields(r)) {
    int64_t n = 0;
    if (!f.read(reinterpret_cast<char*>(&n), sizeof(n)) || n < 0 || n > (int64_t(1) << 40)) return false;
    v->resize(static_cast<size_t>(n));
    if (!f.read(reinterpret_cast<char*>(v->data()), n * int64_t(sizeof(double)))) return false;
  }
  return true;
}

void store(const std::string& path, SequenceReference& r) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(reinterpret_cast<uintptr_t>(&r));
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) return;  // the cache is an optimisation: an unwritable cache only costs time
    f << kCacheMagic << "\n";
    for (auto* v : fields(r)) {
      const int64_t n = static_cast<int64_t>(v->size());
      f.write(reinterpret_cast<const char*>(&n), sizeof(n));
      f.write(reinterpret_cast<const char*>(v->data()), n * int64_t(sizeof(double)));
    }
  }
  std::filesystem::rename(tmp, path, ec);
}

size_t expected_size(const RowConfig& row, int seq, int which) {
  const size_t len = static_cast<size_t>(row.seqlens[seq]), HV = row.HV, H = row.H, K = row.K, V = row.V;
  const size_t gw = row.op == Op::Kda ? K : 1;
  switch (which) {
    case 0: return len * HV * V;           // o
    case 1: case 2: return len * H * K;    // dq, dk
    case 3: return len * HV * V;           // dv
    case 4: return len * HV * gw;          // dg
    case 5: return len * HV;               // dbeta
    case 6: return HV * K * V;             // ht
    case 7: return row.initial_state ? HV * K * V : 0;
    case 8: return row.A_log ? HV : 0;
    default: return row.dt_bias ? HV * gw : 0;
  }
}
}  // namespace

struct ReferenceCache::Impl {
  const RowConfig& row;
  std::string digest, dir;
  int threads;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<int, std::shared_ptr<const SequenceReference>> done;
  std::map<int, bool> running;
  double seconds = 0;
  Impl(const RowConfig& r, std::string d, std::string c, int t) : row(r), digest(std::move(d)), dir(std::move(c)), threads(t) {}
};

ReferenceCache::ReferenceCache(const RowConfig& row, std::string digest, std::string cache_dir, int threads)
    : impl_(std::make_unique<Impl>(row, std::move(digest), std::move(cache_dir), threads)) {}
ReferenceCache::~ReferenceCache() = default;

double ReferenceCache::compute_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->seconds;
}

std::shared_ptr<const SequenceReference> ReferenceCache::get(int seq) {
  Impl& m = *impl_;
  {
    std::unique_lock<std::mutex> lock(m.mutex);
    m.cv.wait(lock, [&] { return m.done.count(seq) || !m.running[seq]; });
    if (auto it = m.done.find(seq); it != m.done.end()) return it->second;
    m.running[seq] = true;
  }
  auto r = std::make_shared<SequenceReference>();
  const std::string path =
      m.dir.empty() ? "" : fmt::format("{}/{}-seed{}-seq{}.bin", m.dir, m.digest.substr(0, 16), m.row.seed, seq);
  bool loaded = !path.empty() && load(path, *r);
  if (loaded) {
    auto fs = fields(*r);
    for (int i = 0; i < int(fs.size()); ++i) loaded = loaded && fs[i]->size() == expected_size(m.row, seq, i);
  }
  double secs = 0;
  if (!loaded) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      *r = compute_sequence(m.row, m.digest, seq, m.threads);
    } catch (const std::invalid_argument& e) {
      std::lock_guard<std::mutex> lock(m.mutex);
      m.running[seq] = false;
      m.cv.notify_all();
      KCP_THROW(InvariantError, "FP64 reference refused row {} sequence {}: {}", m.row.name, seq, e.what());
    }
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Long sequences are not cached: an int3 sequence's FP64 gradients take gigabytes, more disk
    // than recomputing them costs time.
    int64_t bytes = 0;
    for (auto* v : fields(*r)) bytes += static_cast<int64_t>(v->size() * sizeof(double));
    if (!path.empty() && bytes <= kMaxCachedBytes) store(path, *r);
  }
  int64_t t0 = 0;
  for (int s = 0; s < seq; ++s) t0 += m.row.seqlens[s];
  r->seq = seq;
  r->t_begin = t0;
  r->t_end = t0 + m.row.seqlens[seq];
  std::lock_guard<std::mutex> lock(m.mutex);
  m.seconds += secs;
  m.running[seq] = false;
  m.done[seq] = r;
  m.cv.notify_all();
  return r;
}

}  // namespace kcp
