#include "cache/activation_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace eg::cache {

// Napkin math: ResNet-20 on Fashion-MNIST with stem + first stage frozen caches
// 16x28x28 f32 = 50 KB per sample (25 KB in bf16), 3.0 GB for 60,000 images; a batch of
// 128 is 6.4 MB to gather, about 1 ms of memcpy against a ~130 ms step, and done in the
// background.
// On disk the file is mapped shared, so the kernel's page cache keeps what fits in memory.

namespace {

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
int64_t available_memory() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return int64_t(kb) * 1024;
}

}  // namespace

ActivationCache::ActivationCache(std::string dir, int64_t num_samples, Tier tier, int sharers)
    : dir_(std::move(dir)), tier_(tier), num_samples_(num_samples), sharers_(sharers) {
  EG_CHECK(num_samples > 0, "activation cache: need at least one sample, got ", num_samples);
  EG_CHECK(sharers >= 1, "activation cache: sharers must be at least 1, got ", sharers);
  std::string path = dir_ + "/.egeria-activation-cache-XXXXXX";
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  fd_ = ::mkstemp(buf.data());
  EG_CHECK(fd_ >= 0, "activation cache: cannot create a file in '", dir_, "': ", std::strerror(errno));
  ::unlink(buf.data());  // lives while open, gone when the process ends however it ends
  slot_.assign(size_t(num_samples), -1);
}

ActivationCache::~ActivationCache() {
  if (pending_.valid()) pending_.wait();
  unmap();
  if (fd_ >= 0) ::close(fd_);
}

void ActivationCache::unmap() {
  if (base_) ::munmap(base_, size_t(num_samples_ * entry_bytes_));
  base_ = nullptr;
  if (stats_.on_disk) ::ftruncate(fd_, 0);  // gives the blocks back
  stats_.bytes_reserved = 0;
  stats_.on_disk = false;
}

void ActivationCache::wait_prefetch() {
  if (pending_.valid()) pending_.wait();
  pending_ = {};
  pending_ids_.clear();
}

void ActivationCache::set_key(int64_t key) {
  if (key == key_) return;
  wait_prefetch();
  if (stats_.entries > 0) ++stats_.resets;
  key_ = key;
  std::fill(slot_.begin(), slot_.end(), -1);
  stats_.entries = 0;
  sample_shape_.clear();  // the next store sizes the file
}

void ActivationCache::release() {
  set_key(-1);
  unmap();
}

void ActivationCache::map(int64_t entry_bytes) {
  unmap();
  entry_bytes_ = entry_bytes;
  const int64_t bytes = num_samples_ * entry_bytes;
  const double gib = double(bytes) / double(1 << 30);
  if (tier_ == Tier::memory || (tier_ == Tier::automatic && bytes <= available_memory() / 2 / sharers_)) {
    void* p = ::mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EG_CHECK(p != MAP_FAILED, "activation cache: cannot allocate ", gib, " GiB of memory: ", std::strerror(errno));
    // Small pages even where the system would give huge ones: with 2 MB pages a store's first
    // touch of memory was no faster and far less steady (eg_bench_freeze CacheStore), and
    // entries are not read often enough for fewer TLB misses to pay for it.
    ::madvise(p, size_t(bytes), MADV_NOHUGEPAGE);
    base_ = static_cast<char*>(p);
    stats_.bytes_reserved = bytes;
    stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, bytes);
    return;
  }
  EG_CHECK(::ftruncate(fd_, 0) == 0 && ::ftruncate(fd_, bytes) == 0, "activation cache: cannot size its file in '",
           dir_, "' to ", gib, " GiB: ", std::strerror(errno));
  // Reserve the blocks now: writing through a mapping to a full disk would be a
  // SIGBUS in the middle of training instead of this error.
  const int rc = ::posix_fallocate(fd_, 0, bytes);
  if (rc != 0) {
    ::ftruncate(fd_, 0);
    stats_.bytes_reserved = 0;
    EG_THROW("activation cache: it needs ", gib, " GiB in '", dir_, "' (", num_samples_, " samples x ",
             double(entry_bytes) / 1024, " KiB) and cannot reserve it: ", std::strerror(rc),
             ". Free space there, point --freeze-cache-dir at a larger disk, or use --freeze-cache off");
  }
  void* p = ::mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  EG_CHECK(p != MAP_FAILED, "activation cache: cannot map its ", gib, " GiB file in '", dir_,
           "': ", std::strerror(errno));
  base_ = static_cast<char*>(p);
  stats_.bytes_reserved = bytes;
  stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, bytes);
  stats_.on_disk = stats_.ever_on_disk = true;
}

void ActivationCache::check_ids(const std::vector<int64_t>& ids, const char* what) const {
  EG_CHECK(!ids.empty(), "activation cache: ", what, " of an empty batch");
  for (int64_t id : ids)
    EG_CHECK(id >= 0 && id < num_samples_, "activation cache: ", what, " of sample id ", id, ", outside [0, ",
             num_samples_, ")");
}

bool ActivationCache::contains(const std::vector<int64_t>& ids) const {
  if (key_ < 0 || !base_ || ids.empty()) return false;
  for (int64_t id : ids)
    if (id < 0 || id >= num_samples_ || slot_[size_t(id)] < 0) return false;
  return true;
}

std::vector<int64_t> ActivationCache::missing(const std::vector<int64_t>& ids) const {
  std::vector<int64_t> pos;
  for (size_t i = 0; i < ids.size(); ++i)
    if (key_ < 0 || !base_ || ids[i] < 0 || ids[i] >= num_samples_ || slot_[size_t(ids[i])] < 0)
      pos.push_back(int64_t(i));
  return pos;
}

Tensor ActivationCache::gather_now(const std::vector<int64_t>& ids) const {
  Shape s = sample_shape_;
  s.insert(s.begin(), int64_t(ids.size()));
  Tensor out = Tensor::empty(s, dtype_);
  out.set_format(format_);
  char* o = static_cast<char*>(out.raw_any());
  const size_t n = size_t(entry_bytes_);
  for (size_t i = 0; i < ids.size(); ++i) std::memcpy(o + i * n, base_ + size_t(slot_[size_t(ids[i])]) * n, n);
  return out;
}

Tensor ActivationCache::gather(const std::vector<int64_t>& ids) {
  check_ids(ids, "gather");
  EG_CHECK(contains(ids), "activation cache: gather of a batch that is not wholly cached");
  stats_.served += int64_t(ids.size());
  if (pending_.valid() && pending_ids_ == ids) {
    Tensor t = pending_.get();
    pending_ids_.clear();
    ++stats_.prefetched;
    return t;
  }
  wait_prefetch();
  return gather_now(ids);
}

void ActivationCache::store(const std::vector<int64_t>& ids, const Tensor& h) {
  check_ids(ids, "store");
  EG_CHECK(key_ >= 0, "activation cache: store before set_key()");
  EG_CHECK(h.defined() && (h.dtype() == DType::f32 || is_half(h.dtype())) && h.dim() >= 2 &&
               h.size(0) == int64_t(ids.size()),
           "activation cache: store of ", h.defined() ? h.str() : std::string("an undefined tensor"), " for ",
           ids.size(), " sample ids; need f32, bf16 or f16 [", ids.size(), ", ...]");
  Tensor p = h.to(Device::cpu());
  const Shape sample(p.shape().begin() + 1, p.shape().end());
  if (sample_shape_.empty()) {
    wait_prefetch();
    const int64_t bytes = shape_numel(sample) * int64_t(dtype_size(p.dtype()));
    if (!base_ || bytes != entry_bytes_) map(bytes);
    sample_shape_ = sample;
    dtype_ = p.dtype();
    // See Note [Entries in the convolutions' layout]
    format_ = p.format();
  }
  EG_CHECK(sample == sample_shape_ && p.dtype() == dtype_, "activation cache: store of ", p.str(),
           " into a cache of per-sample ", Tensor::empty(sample_shape_, dtype_).str());
  p = p.to_format(format_);
  const char* src = static_cast<const char*>(p.raw_any());
  const size_t n = size_t(entry_bytes_);
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t& slot = slot_[size_t(ids[i])];
    if (slot >= 0) continue;  // the same values (Note [Activation cache validity]), maybe being prefetched
    slot = stats_.entries++;  // the next free slot: entries are packed in store order
    std::memcpy(base_ + size_t(slot) * n, src + i * n, n);
    ++stats_.stored;
  }
}

void ActivationCache::prefetch(const std::vector<int64_t>& ids) {
  if (!contains(ids) || (pending_.valid() && pending_ids_ == ids)) return;
  wait_prefetch();
  pending_ids_ = ids;
  // Entries are immutable until the key changes, and set_key()/store()-sizing wait
  // for this gather first, so it may read the mapping without a lock.
  pending_ = std::async(std::launch::async, [this, ids] { return gather_now(ids); });
}

ActivationCache::Pass ActivationCache::through(const std::vector<int64_t>& ids, const Tensor& x, Device dev,
                                               const std::function<Tensor(const Tensor&)>& prefix,
                                               const std::vector<Lower>& lowers) {
  Pass p;
  // Positions in `ids` of the samples to compute: from each lower cache's entries, or
  // from the input.
  std::vector<std::vector<int64_t>> from_lower(lowers.size());
  std::vector<int64_t> from_input;
  const std::vector<int64_t> miss = missing(ids);
  for (int64_t i : miss) {
    size_t l = 0;
    while (l < lowers.size() && !lowers[l].cache->contains({ids[size_t(i)]})) ++l;
    (l < lowers.size() ? from_lower[l] : from_input).push_back(i);
  }
  p.hits = int64_t(ids.size() - miss.size());
  for (auto& f : from_lower) p.from_lower.push_back(int64_t(f.size()));
  auto ids_at = [&](const std::vector<int64_t>& pos) {
    std::vector<int64_t> v;
    for (int64_t i : pos) v.push_back(ids[size_t(i)]);
    return v;
  };
  auto onward = [&](size_t l, const std::vector<int64_t>& sub) {
    return lowers[l].rest(lowers[l].cache->gather(sub).to(dev));
  };
  if (from_input.size() == ids.size()) {  // nothing to gather: the prefix's output is the batch's
    p.h = prefix(x);
    store(ids, p.h);
    return p;
  }
  for (size_t l = 0; l < lowers.size(); ++l) {
    if (from_lower[l].empty()) continue;
    const std::vector<int64_t> sub = ids_at(from_lower[l]);
    Tensor h = onward(l, sub);
    store(sub, h);
    if (sub.size() == ids.size()) {  // the batch's, in its order
      p.h = h;
      return p;
    }
  }
  if (!from_input.empty()) {
    const int64_t per = x.numel() / x.size(0);
    Shape s = x.shape();
    s[0] = int64_t(from_input.size());
    Tensor xm = Tensor::empty(s);
    for (size_t i = 0; i < from_input.size(); ++i)
      std::copy_n(x.data<float>() + from_input[i] * per, per, xm.data<float>() + int64_t(i) * per);
    store(ids_at(from_input), prefix(xm));
  }
  p.h = gather(ids).to(dev);
  return p;
}

}  // namespace eg::cache
