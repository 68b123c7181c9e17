// A cached shard's per-batch work in one pass: find the batch's rows in the set-associative
// index, choose victims, write dirty victims back to the row store, load the misses into their
// slots, map every id to its slot.
//
// The decisions are those of dlrm_scale.tiering.cache.SetAssociativeCache.assign (its torch
// path stays as the fallback without a compiler, and as the reference the tests compare to):
// rows a batch uses are locked; the k-th miss of a set, in ascending id order, takes the set's
// k-th unlocked way in eviction order (empty first, then least recently used, or least
// frequently requested then least recently used, ties to the lower way); misses that find no
// way go to the overflow region. The torch path spends ~13 ms a table and batch on this
// machine class in sorts and temporaries; here a row is found by comparing its set's int32
// tags (two cache lines at 32 ways, prefetched ahead; no per-row map, which would cost 4 bytes
// a row of the shard), and only the misses (a fraction) are sorted and deduplicated.
//
// The store holds one fp32 record per row (weights, then optimizer state): an array in memory,
// or the SSD store's base file with its append-only log and location index. Written-back
// records go to the log while it has room, else in place; the caller compacts the log between
// batches. The SSD store is read with pread, or O_DIRECT, or copied from its files' mappings
// (`maps`; writes still go through pwrite, which a shared mapping sees).
#include "kernels.h"

#include <fcntl.h>
#include <unistd.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kEmpty = -1;
constexpr uint64_t kHash = 0x9E3779B97F4A7C15ull;
constexpr uint8_t kFrequencyMax = 255;  // cache.py's FREQUENCY_MAX
constexpr int64_t kBlock = 4096;  // O_DIRECT's alignment
constexpr int64_t kDirectQueue = 16;  // O_DIRECT reads in flight (a virtio disk here serves ~25k a second one at a time)
constexpr int64_t kAhead = 16;  // ids (or misses) between a prefetch and its use

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Same as cache.py's set_of: wrapping int64 product, arithmetic shift, non-negative remainder.
inline int64_t set_of(int64_t id, int64_t sets) {
  const int64_t h = static_cast<int64_t>(static_cast<uint64_t>(id) * kHash) >> 20;
  const int64_t r = h % sets;
  return r < 0 ? r + sets : r;
}

struct Move {
  int64_t row, slot, old;  // the miss, the slot it takes, the slot's previous row (or kEmpty)
};

// The way of `row` in its set, or -1 (a row is in one way at most): eight tags a compare
// where the processor has AVX2.
inline int64_t way_of(const int32_t* set_tags, int64_t ways, int32_t row) {
  int64_t w = 0;
#if defined(__AVX2__)
  const __m256i key = _mm256_set1_epi32(row);
  for (; w + 8 <= ways; w += 8) {
    const __m256i found = _mm256_cmpeq_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(set_tags + w)), key);
    const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(found));
    if (mask != 0) return w + __builtin_ctz(mask);
  }
#endif
  for (; w < ways; ++w) {
    if (set_tags[w] == row) return w;
  }
  return -1;
}

// The slot of `row` (its set's first slot plus its way), or kEmpty where it is not cached.
inline int64_t cached_slot(const int32_t* tag, int64_t sets, int64_t ways, int64_t row) {
  const int64_t first = set_of(row, sets) * ways;
  const int64_t w = way_of(tag + first, ways, static_cast<int32_t>(row));
  return w < 0 ? kEmpty : first + w;
}

inline void prefetch_set(const int32_t* set_first, int64_t ways, bool write) {
  for (int64_t w = 0; w < ways; w += 16) write ? __builtin_prefetch(set_first + w, 1) : __builtin_prefetch(set_first + w);
}

// Buffers kept between calls: a batch's worth of pages is not faulted in again every batch.
thread_local std::vector<uint64_t> scratch_missed;
thread_local std::vector<int64_t> scratch_misses;
thread_local std::vector<Move> scratch_moves;
thread_local std::vector<float> scratch_appended;

// Where a shard's records live: in memory (`memory`), or in files written with pwrite and read
// with pread (the SSD store; ~0.7-1.1 us a row on this machine class, mostly the system call
// and the page cache's lookup), or, where the files stay mapped (`base_map`/`log_map`), copied
// from the mappings (~0.2 us a row once a page is mapped, prefetched ahead like the slots).
// `read_fd`/`log_read_fd` may be opened with O_DIRECT (`direct`), so that reads come from the
// device, not the page cache.
struct Store {
  float* memory = nullptr;
  const float* base_map = nullptr;
  const float* log_map = nullptr;
  int base_fd = -1, log_fd = -1, read_fd = -1, log_read_fd = -1;
  bool direct = false;
  int32_t* location = nullptr;  // newest record's log slot per row, -1: the base
  int64_t width = 0, log_rows = 0, log_used = 0;
  std::vector<float>& appended = scratch_appended;  // records appended since the last flush(), one pwrite
  float* bounce = nullptr;  // O_DIRECT's aligned buffer
  int64_t bounce_bytes = 0;

  ~Store() { std::free(bounce); }

  int64_t record_bytes() const { return width * static_cast<int64_t>(sizeof(float)); }

  void pread_all(int fd, void* out, int64_t bytes, int64_t offset) const {
    char* at = static_cast<char*>(out);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd, at, bytes, offset);
      TORCH_CHECK(got > 0, "reading the row store failed: ", got < 0 ? std::strerror(errno) : "short file");
      at += got, bytes -= got, offset += got;
    }
  }

  void pwrite_all(int fd, const void* data, int64_t bytes, int64_t offset) const {
    const char* at = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t put = ::pwrite(fd, at, bytes, offset);
      TORCH_CHECK(put > 0, "writing the row store failed: ", put < 0 ? std::strerror(errno) : "no progress");
      at += put, bytes -= put, offset += put;
    }
  }

  void read_at(int fd, int64_t offset, float* out) {
    const int64_t bytes = record_bytes();
    if (!direct) return pread_all(fd, out, bytes, offset);
    const int64_t first = offset / kBlock * kBlock, span = (offset + bytes + kBlock - 1) / kBlock * kBlock - first;
    if (span > bounce_bytes) {
      std::free(bounce);
      bounce = static_cast<float*>(std::aligned_alloc(kBlock, span));
      TORCH_CHECK(bounce != nullptr, "no memory for an O_DIRECT buffer");
      bounce_bytes = span;
    }
    const ssize_t got = ::pread(fd, bounce, span, first);  // may stop at the end of the file
    TORCH_CHECK(got >= offset - first + bytes, "reading the row store failed: ", got < 0 ? std::strerror(errno) : "short file");
    std::memcpy(out, reinterpret_cast<char*>(bounce) + (offset - first), bytes);
  }

  // The record's address where the store has one (in memory, or mapped), else nullptr.
  const float* address(int64_t id) const {
    if (memory != nullptr) return memory + id * width;
    if (base_map == nullptr) return nullptr;
    return location[id] >= 0 ? log_map + static_cast<int64_t>(location[id]) * width : base_map + id * width;
  }

  // Where the record is depends on the row's log slot: that (cold) entry first, the record later.
  void prefetch_location(int64_t id) const {
    if (base_map != nullptr) __builtin_prefetch(location + id);
  }

  void prefetch(int64_t id) const {
    const float* at = address(id);
    if (at == nullptr) return;
    for (int64_t c = 0; c < width; c += 16) __builtin_prefetch(at + c);
  }

  void read(int64_t id, float* out) {
    if (const float* at = address(id)) {
      std::memcpy(out, at, record_bytes());
    } else if (location != nullptr && location[id] >= 0) {
      read_at(log_read_fd, static_cast<int64_t>(location[id]) * record_bytes(), out);
    } else {
      read_at(read_fd, id * record_bytes(), out);
    }
  }

  // A written-back record: appended to the log while it has room (one pwrite at flush()),
  // else in place.
  void write(int64_t id, const float* record) {
    if (memory != nullptr) {
      std::memcpy(memory + id * width, record, record_bytes());
    } else if (log_used < log_rows) {
      location[id] = static_cast<int32_t>(log_used++);
      appended.insert(appended.end(), record, record + width);
    } else {
      flush();  // a record in place may supersede one still waiting to be appended
      location[id] = -1;
      pwrite_all(base_fd, record, record_bytes(), id * record_bytes());
    }
  }

  void flush() {
    if (appended.empty()) return;
    const int64_t records = static_cast<int64_t>(appended.size()) / width;
    pwrite_all(log_fd, appended.data(), records * record_bytes(), (log_used - records) * record_bytes());
    appended.clear();
  }
};

// The resident rows: the TBE's weights and optimizer-state views, one record per slot.
struct Slots {
  float* weights;
  int64_t cols;
  std::vector<float*> states;
  std::vector<int64_t> state_cols;

  void load(int64_t slot, const float* record) {
    std::memcpy(weights + slot * cols, record, cols * sizeof(float));
    int64_t at = cols;
    for (size_t s = 0; s < states.size(); ++s) {
      std::memcpy(states[s] + slot * state_cols[s], record + at, state_cols[s] * sizeof(float));
      at += state_cols[s];
    }
  }

  void prefetch(int64_t slot) const {
    for (int64_t c = 0; c < cols; c += 16) __builtin_prefetch(weights + slot * cols + c, 1);
    for (size_t s = 0; s < states.size(); ++s) __builtin_prefetch(states[s] + slot * state_cols[s], 1);
  }

  void save(int64_t slot, float* record) const {
    std::memcpy(record, weights + slot * cols, cols * sizeof(float));
    int64_t at = cols;
    for (size_t s = 0; s < states.size(); ++s) {
      std::memcpy(record + at, states[s] + slot * state_cols[s], state_cols[s] * sizeof(float));
      at += state_cols[s];
    }
  }
};

Slots slots_of(torch::Tensor& weights, std::vector<torch::Tensor>& states, int64_t width) {
  TORCH_CHECK(weights.scalar_type() == torch::kFloat && weights.dim() == 2 && weights.is_contiguous(), "fp32 [slots, cols] weights");
  Slots r{weights.data_ptr<float>(), weights.size(1), {}, {}};
  int64_t w = r.cols;
  for (auto& s : states) {
    TORCH_CHECK(s.scalar_type() == torch::kFloat && s.is_contiguous() && s.size(0) == weights.size(0), "fp32 state per slot");
    r.states.push_back(s.data_ptr<float>());
    r.state_cols.push_back(s.numel() / s.size(0));
    w += r.state_cols.back();
  }
  TORCH_CHECK(w == width, "store records are ", width, " wide, the cache's rows ", w);
  return r;
}

// fds: base, log, base for reads, log for reads (-1 each for a memory store); location: the
// log's index (empty for a memory store); maps: the base and log files' mappings, to read from
// (none: read the files).
void open_store(Store& store, torch::Tensor& memory, const std::vector<int64_t>& fds, bool direct, torch::Tensor& location,
                int64_t width, int64_t log_rows, const std::vector<torch::Tensor>& maps, int64_t log_used) {
  TORCH_CHECK(fds.size() == 4, "four file descriptors (or -1)");
  TORCH_CHECK(maps.empty() || (maps.size() == 2 && !direct), "a base and a log mapping, or none (and not with O_DIRECT)");
  store.width = width;
  store.appended.clear();
  if (memory.numel() > 0) {
    TORCH_CHECK(memory.scalar_type() == torch::kFloat && memory.is_contiguous() && memory.size(1) == width, "fp32 [rows, width] store");
    store.memory = memory.data_ptr<float>();
    return;
  }
  TORCH_CHECK(location.scalar_type() == torch::kInt, "int32 location per row");
  store.base_fd = static_cast<int>(fds[0]), store.log_fd = static_cast<int>(fds[1]);
  store.read_fd = static_cast<int>(fds[2]), store.log_read_fd = static_cast<int>(fds[3]);
  store.direct = direct;
  store.location = location.data_ptr<int32_t>();
  store.log_rows = log_rows, store.log_used = log_used;
  if (!maps.empty()) {
    for (const auto& m : maps) {
      TORCH_CHECK(m.scalar_type() == torch::kFloat && m.is_contiguous() && m.dim() == 2 && m.size(1) == width, "fp32 [rows, width] mappings");
    }
    TORCH_CHECK(maps[0].size(0) == location.numel() && maps[1].size(0) == log_rows, "mappings of the base file's rows and the log's");
    store.base_map = maps[0].data_ptr<float>(), store.log_map = maps[1].data_ptr<float>();
  }
}

}  // namespace

std::vector<torch::Tensor> row_cache_install(const torch::Tensor& ids, torch::Tensor& tags, torch::Tensor& last_used,
                                             torch::Tensor& frequency, torch::Tensor& way_frequency, int64_t num_rows, int64_t clock,
                                             const torch::Tensor& overflow_ids, int64_t overflow_rows, torch::Tensor& weights,
                                             std::vector<torch::Tensor> states, torch::Tensor& dirty, torch::Tensor& memory,
                                             std::vector<int64_t> fds, bool direct, torch::Tensor& location, int64_t width,
                                             int64_t log_rows, std::vector<torch::Tensor> maps, int64_t log_used,
                                             const torch::Tensor& staged_ids, const torch::Tensor& staged_records, bool training) {
  TORCH_CHECK(ids.scalar_type() == torch::kLong && overflow_ids.scalar_type() == torch::kLong && staged_ids.scalar_type() == torch::kLong,
              "int64 ids");
  TORCH_CHECK(tags.scalar_type() == torch::kInt && last_used.scalar_type() == torch::kInt && tags.is_contiguous() &&
                  last_used.is_contiguous(), "int32 [sets, ways] tags and clocks");
  TORCH_CHECK(dirty.scalar_type() == torch::kBool, "bool dirty");
  const bool lfu = frequency.numel() > 0;
  TORCH_CHECK(!lfu || (frequency.scalar_type() == torch::kByte && frequency.numel() == num_rows && way_frequency.scalar_type() == torch::kByte &&
                       way_frequency.sizes() == tags.sizes() && way_frequency.is_contiguous()),
              "uint8 frequency per row and per way");
  Slots cached = slots_of(weights, states, width);
  Store store;
  open_store(store, memory, fds, direct, location, width, log_rows, maps, log_used);

  const int64_t sets = tags.size(0), ways = tags.size(1);
  const int64_t n = ids.numel();
  const int64_t* id = ids.data_ptr<int64_t>();
  int32_t* tag = tags.data_ptr<int32_t>();
  int32_t* used = last_used.data_ptr<int32_t>();
  uint8_t* freq = lfu ? frequency.data_ptr<uint8_t>() : nullptr;
  uint8_t* way_freq = lfu ? way_frequency.data_ptr<uint8_t>() : nullptr;  // freq[tag], beside the tag
  bool* is_dirty = dirty.data_ptr<bool>();
  const int64_t overflow_base = sets * ways;

  // staged (prefetched) records serve loads unless this pass writes the row first
  const int64_t staged = staged_ids.numel();
  const int64_t* staged_id = staged_ids.data_ptr<int64_t>();
  const float* staged_record = staged > 0 ? staged_records.data_ptr<float>() : nullptr;
  std::vector<char> staged_valid(staged, 1);
  auto find_staged = [&](int64_t row) -> int64_t {
    const int64_t* at = std::lower_bound(staged_id, staged_id + staged, row);
    return (at != staged_id + staged && *at == row) ? at - staged_id : -1;
  };
  std::vector<float> record(width);
  int64_t written = 0, loaded = 0, prefetched = 0, evictions = 0, hits = 0;
  auto write_back = [&](int64_t row, int64_t s) {
    if (!is_dirty[s]) return;
    const int64_t k = find_staged(row);
    if (k >= 0) staged_valid[k] = 0;
    cached.save(s, record.data());
    store.write(row, record.data());
    is_dirty[s] = false;
    ++written;
  };
  auto load = [&](int64_t row, int64_t s) {
    const int64_t k = find_staged(row);
    if (k >= 0 && staged_valid[k]) {
      cached.load(s, staged_record + k * width);
      ++prefetched;
    } else {
      store.read(row, record.data());
      cached.load(s, record.data());
    }
    is_dirty[s] = false;
    ++loaded;
  };

  // the previous batch's overflow rows leave the cache (this batch may load them again)
  const int64_t* over = overflow_ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < overflow_ids.numel(); ++i) write_back(over[i], overflow_base + i);
  store.flush();

  const int64_t started_ns = now_ns();  // the pass's three parts are timed: index, moves, the log's append
  // hits lock their way and have their slot; misses are collected. Each id's set tags are
  // cold: prefetched 2*kAhead ids ahead, compared kAhead ahead (the found way's clock then
  // prefetched, the slot kept in a ring until its id's turn), so that the misses overlap.
  torch::Tensor out = torch::empty({n}, torch::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  auto find = [&](int64_t i) -> int64_t {
    const int64_t row = id[i];
    TORCH_CHECK(row >= 0 && row < num_rows, "embedding id ", row, " out of range [0, ", num_rows, ")");
    return cached_slot(tag, sets, ways, row);
  };
  constexpr int64_t kRing = 2 * kAhead;
  int64_t ring[kRing];
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) ring[i] = find(i);
  // each missed id as (row << 32 | position): one sort orders the rows and keeps where each was
  TORCH_CHECK(n < (int64_t{1} << 32), "a batch of at most 2^32 ids a table");
  std::vector<uint64_t>& missed = scratch_missed;
  missed.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (i + 2 * kAhead < n) prefetch_set(tag + set_of(id[i + 2 * kAhead], sets) * ways, ways, false);
    if (i + kAhead < n) {
      const int64_t ahead = find(i + kAhead);
      ring[(i + kAhead) % kRing] = ahead;
      if (ahead >= 0) __builtin_prefetch(used + ahead, 1);
      if (lfu) __builtin_prefetch(freq + id[i + kAhead], 1);
    }
    const int64_t s = ring[i % kRing];
    o[i] = s;
    if (s < 0) {
      missed.push_back(static_cast<uint64_t>(id[i]) << 32 | static_cast<uint64_t>(i));
    } else if (used[s] != clock) {
      used[s] = static_cast<int32_t>(clock);
      ++hits;
      if (lfu && freq[id[i]] < kFrequencyMax) way_freq[s] = ++freq[id[i]];
    }
  }
  std::sort(missed.begin(), missed.end());
  std::vector<int64_t>& misses = scratch_misses;  // distinct, ascending
  misses.clear();
  for (const uint64_t key : missed) {
    const int64_t row = static_cast<int64_t>(key >> 32);
    if (!misses.empty() && misses.back() == row) continue;
    misses.push_back(row);
    if (lfu && freq[row] < kFrequencyMax) ++freq[row];
  }
  const int64_t num_misses = static_cast<int64_t>(misses.size());

  // victims next, in ascending id order as the torch path (moving no data yet)
  std::vector<int64_t> spill;
  std::vector<int64_t> miss_slot(num_misses, kEmpty);
  std::vector<Move>& moves = scratch_moves;
  moves.clear();
  for (int64_t m = 0; m < num_misses; ++m) {
    if (m + 2 * kAhead < num_misses) {  // the set's tags, clocks and counts; the miss's count
      const int64_t ahead = set_of(misses[m + 2 * kAhead], sets) * ways;
      prefetch_set(tag + ahead, ways, true);
      prefetch_set(used + ahead, ways, true);
      if (lfu) {
        for (int64_t w = 0; w < ways; w += 64) __builtin_prefetch(way_freq + ahead + w, 1);
      }
    }
    const int64_t row = misses[m];
    const int64_t set = set_of(row, sets);
    int32_t* set_tags = tag + set * ways;
    int32_t* set_used = used + set * ways;
    int64_t best = -1, best_priority = 0;
    for (int64_t w = 0; w < ways; ++w) {
      if (set_used[w] == clock) continue;  // locked: hit or placed this batch
      int64_t priority;
      if (set_tags[w] == kEmpty) {
        priority = -1;
      } else {
        priority = lfu ? (static_cast<int64_t>(way_freq[set * ways + w]) << 32) + set_used[w] : set_used[w];
      }
      if (best < 0 || priority < best_priority) {
        best = w;
        best_priority = priority;
      }
    }
    if (best < 0) {
      miss_slot[m] = overflow_base + static_cast<int64_t>(spill.size());
      spill.push_back(row);
      continue;
    }
    const int64_t s = set * ways + best;
    const int64_t old = set_tags[best];
    if (old != kEmpty) ++evictions;
    set_tags[best] = static_cast<int32_t>(row);
    set_used[best] = static_cast<int32_t>(clock);
    if (lfu) way_freq[s] = freq[row];
    miss_slot[m] = s;
    moves.push_back({row, s, old});
  }

  const int64_t chosen_ns = now_ns();
  // then the rows move: each victim's record out, the miss's in, the slots (and the misses'
  // records, where the store has an address for them) prefetched ahead
  const int64_t num_moves = static_cast<int64_t>(moves.size());
  for (int64_t k = 0; k < num_moves; ++k) {
    if (k + 2 * kAhead < num_moves) store.prefetch_location(moves[k + 2 * kAhead].row);
    if (k + kAhead < num_moves) {
      cached.prefetch(moves[k + kAhead].slot);
      store.prefetch(moves[k + kAhead].row);
    }
    const Move& move = moves[k];
    if (move.old != kEmpty) write_back(move.old, move.slot);
    load(move.row, move.slot);
  }

  const int64_t spilled = static_cast<int64_t>(spill.size());
  torch::Tensor stats = torch::empty({11}, torch::kLong);
  torch::Tensor overflow = torch::empty({spilled}, torch::kLong);
  if (spilled <= overflow_rows) {  // else the caller raises: the cache is too small for the batch
    for (int64_t k = 0; k < spilled; ++k) {
      load(spill[k], overflow_base + k);
      overflow.data_ptr<int64_t>()[k] = spill[k];
    }
    int64_t m = -1;  // the placed misses' slots, in the order `missed` has them
    for (size_t k = 0; k < missed.size(); ++k) {
      if (k == 0 || (missed[k] >> 32) != (missed[k - 1] >> 32)) ++m;
      o[missed[k] & 0xffffffffu] = miss_slot[m];
    }
    for (int64_t i = 0; training && i < n; ++i) is_dirty[o[i]] = true;
  }
  const int64_t moved_ns = now_ns();
  store.flush();
  const int64_t values[11] = {hits, num_misses, evictions, spilled, loaded, prefetched, written, store.log_used,
                              chosen_ns - started_ns, moved_ns - chosen_ns, now_ns() - moved_ns};
  std::copy(values, values + 11, stats.data_ptr<int64_t>());
  return {out, overflow, stats};
}

torch::Tensor row_cache_missing(const torch::Tensor& ids, const torch::Tensor& tags, int64_t num_rows) {
  TORCH_CHECK(ids.scalar_type() == torch::kLong && tags.scalar_type() == torch::kInt && tags.is_contiguous(),
              "int64 ids, int32 [sets, ways] tags");
  const int64_t* id = ids.data_ptr<int64_t>();
  const int32_t* tag = tags.data_ptr<int32_t>();
  const int64_t sets = tags.size(0), ways = tags.size(1);
  std::vector<int64_t> missing;
  const int64_t n = ids.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_set(tag + set_of(id[i + kAhead], sets) * ways, ways, false);
    const int64_t row = id[i];
    TORCH_CHECK(row >= 0 && row < num_rows, "embedding id ", row, " out of range [0, ", num_rows, ")");
    if (cached_slot(tag, sets, ways, row) < 0) missing.push_back(row);
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  torch::Tensor out = torch::empty({static_cast<int64_t>(missing.size())}, torch::kLong);
  std::copy(missing.begin(), missing.end(), out.data_ptr<int64_t>());
  return out;
}

torch::Tensor row_store_read(const torch::Tensor& ids, torch::Tensor& memory, std::vector<int64_t> fds, bool direct,
                             torch::Tensor& location, int64_t width, int64_t log_rows, std::vector<torch::Tensor> maps) {
  TORCH_CHECK(ids.scalar_type() == torch::kLong, "int64 ids");
  Store store;
  open_store(store, memory, fds, direct, location, width, log_rows, maps, 0);
  const int64_t n = ids.numel();
  torch::Tensor out = torch::empty({n, width}, torch::kFloat);
  const int64_t* id = ids.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  pybind11::gil_scoped_release released;  // a reader thread overlaps the trainer's Python
  if (!direct) {
    for (int64_t i = 0; i < n; ++i) store.read(id[i], o + i * width);
    return out;
  }
  // from the device: a queue of reads in flight, one per thread (each waits on the disk, not a core)
  std::vector<std::thread> readers;
  std::vector<std::exception_ptr> failures(kDirectQueue);
  for (int64_t t = 0; t < kDirectQueue; ++t) {
    readers.emplace_back([&, t] {
      try {
        Store mine;
        open_store(mine, memory, fds, direct, location, width, 0, {}, 0);
        for (int64_t i = t; i < n; i += kDirectQueue) mine.read(id[i], o + i * width);
      } catch (...) {
        failures[t] = std::current_exception();
      }
    });
  }
  for (auto& r : readers) r.join();
  for (auto& f : failures) {
    if (f) std::rethrow_exception(f);
  }
  return out;
}
