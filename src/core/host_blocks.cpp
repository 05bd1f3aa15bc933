// Note [Host blocks]
// ~~~~~~~~~~~~~~~~~~
// An inference loop frees and allocates the same tens of MiB every step or tile. glibc's malloc
// either hands blocks above its mmap threshold back to the kernel at each free and faults them in
// again page by page, or keeps them in its heap, where a long-lived block above a freed region
// pins it: the heap can only give back its top, so the resident set grows past what the tensors
// ever hold at once (a tiled VAE decode: 1.9x the resident set of the same work in PyTorch, with
// a lower tensor peak). Here every block from kHostBlockFrom on comes from anonymous mappings, and
// freed blocks become free page ranges, merged with free neighbours, which a request takes the
// smallest fitting one of (splitting it: pages already resident are reused without a fault) and
// which are unmapped, oldest first, whenever keeping them would break the rule
//     live + kept <= high + kHostBlockSlack,
// where high is the most the live blocks have ever taken. Unlike a heap's, any free range can go
// back to the kernel, whatever lies around it. So the cache never makes the process hold more
// than its tensors already needed at their peak plus the slack (which absorbs a loop whose sizes
// do not tile each other exactly), and a loop that asks for the same sizes every step (a training
// step, a denoising step, a tile) is served without page faults. Mappings from 2 MiB on ask for
// transparent huge pages (MADV_HUGEPAGE: a kernel whose THP mode is "madvise" then faults 2 MiB at
// a time, not 4 KiB).
#include "detail/host_blocks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include <c10/util/Exception.h>

namespace remat::memory::detail {
namespace {

struct FreeRange {
  size_t bytes;
  uint64_t freed_at;  // for eviction, oldest first (a merged range takes its newest part's time)
};

struct Counts {
  size_t live;  // handed out, not yet released
  size_t kept;  // released, still mapped
  size_t high;  // the most `live` has been
};

constexpr size_t kHugePage = size_t{2} << 20;

std::mutex g_mutex;
std::map<char*, FreeRange> g_free;  // by address, never two adjacent ones
uint64_t g_clock = 0;
Counts g_counts{0, 0, 0};

size_t round_to_pages(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

struct Range {
  char* base;
  size_t bytes;
};

// Under the lock: takes the oldest free ranges out until the rule holds again.
void evict_locked(std::vector<Range>& evicted) {
  while (!g_free.empty() && g_counts.live + g_counts.kept > g_counts.high + kHostBlockSlack) {
    auto oldest = std::min_element(g_free.begin(), g_free.end(), [](const auto& a, const auto& b) {
      return a.second.freed_at < b.second.freed_at;
    });
    evicted.push_back({oldest->first, oldest->second.bytes});
    g_counts.kept -= oldest->second.bytes;
    g_free.erase(oldest);
  }
}

// Unmaps outside the lock: munmap can take a while.
void unmap_all(const std::vector<Range>& ranges) {
  for (const Range& range : ranges) munmap(range.base, range.bytes);
}

}  // namespace

void* host_block_allocate(size_t bytes, size_t* mapped) {
  const size_t size = round_to_pages(bytes);
  *mapped = size;
  std::vector<Range> evicted;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto best = g_free.end();
    for (auto it = g_free.begin(); it != g_free.end(); ++it) {
      if (it->second.bytes >= size && (best == g_free.end() || it->second.bytes < best->second.bytes)) best = it;
    }
    if (best != g_free.end()) {
      char* base = best->first;
      const FreeRange rest{best->second.bytes - size, best->second.freed_at};
      g_free.erase(best);
      if (rest.bytes > 0) g_free.emplace(base + size, rest);
      g_counts.kept -= size;
      g_counts.live += size;
      return base;
    }
    g_counts.live += size;
    g_counts.high = std::max(g_counts.high, g_counts.live);
    evict_locked(evicted);
  }
  unmap_all(evicted);
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_counts.live -= size;
    TORCH_CHECK(false, "DefaultCPUAllocator: not enough memory: you tried to allocate ", bytes, " bytes.");
  }
#if defined(MADV_HUGEPAGE)
  if (size >= kHugePage) madvise(base, size, MADV_HUGEPAGE);  // advice only: its failure changes nothing
#endif
  return base;
}

void host_block_release(void* block, size_t mapped) {
  char* base = static_cast<char*>(block);
  std::vector<Range> evicted;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    FreeRange range{mapped, ++g_clock};
    // Merge with the free neighbours: adjacent anonymous mappings are one range of addresses.
    auto next = g_free.lower_bound(base);
    if (next != g_free.end() && next->first == base + range.bytes) {
      range.bytes += next->second.bytes;
      next = g_free.erase(next);
    }
    if (next != g_free.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second.bytes == base) {
        base = previous->first;
        range.bytes += previous->second.bytes;
        g_free.erase(previous);
      }
    }
    g_free.emplace(base, range);
    g_counts.live -= mapped;
    g_counts.kept += mapped;
    evict_locked(evicted);  // live + kept is unchanged unless the slack was in use
  }
  unmap_all(evicted);
}

void host_block_drop_cache() {
  std::vector<Range> evicted;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [base, range] : g_free) evicted.push_back({base, range.bytes});
    g_free.clear();
    g_counts.kept = 0;
    g_counts.high = g_counts.live;  // what was needed before no longer justifies a cache
  }
  unmap_all(evicted);
}

}  // namespace remat::memory::detail
