// Note [Host blocks]
// ~~~~~~~~~~~~~~~~~~
// An inference loop frees and allocates the same tens of MiB every step or tile. glibc's malloc
// either hands blocks above its mmap threshold back to the kernel at each free and faults them in
// again page by page, or keeps them in its heap, where a long-lived block above a freed region
// pins it and blocks of other sizes reuse it only in part: the resident set then grows past what
// the tensors ever hold at once (a tiled VAE decode: 1.9x the resident set of the same work in
// PyTorch, with a lower tensor peak). So every block from kHostBlockFrom on is a mapping of its
// own, which freeing can always return whole, and freed blocks are kept for reuse under one rule:
// live + kept <= high, the most the live blocks have ever taken. A release moves bytes from live
// to kept and cannot break it; a new mapping that would unmaps the oldest kept blocks first. So
// the cache never makes the process hold more than its tensors already needed at their peak, and a
// loop that asks for the same sizes every step (a training step, a denoising step, a tile) is
// served from it without a page fault. A request takes the smallest kept block that holds it
// without wasting more than half of it (a loop's shapes are close, not always equal). Blocks from
// 2 MiB on ask for transparent huge pages (MADV_HUGEPAGE: a kernel whose THP mode is "madvise"
// then faults 2 MiB at a time, not 4 KiB).
#include "detail/host_blocks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <list>
#include <mutex>

#include <c10/util/Exception.h>

namespace remat::memory::detail {
namespace {

struct Block {
  void* base;
  size_t mapped;
};

constexpr size_t kHugePage = size_t{2} << 20;

std::mutex g_mutex;
std::list<Block> g_kept;  // oldest first
HostBlockCounts g_counts{0, 0, 0};

size_t round_to_pages(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// Unmaps outside the lock: munmap can take a while.
void unmap_all(const std::list<Block>& blocks) {
  for (const Block& block : blocks) munmap(block.base, block.mapped);
}

}  // namespace

void* host_block_allocate(size_t bytes, size_t* mapped) {
  const size_t size = round_to_pages(bytes);
  std::list<Block> evicted;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto best = g_kept.end();
    for (auto it = g_kept.begin(); it != g_kept.end(); ++it) {
      // Later (newer) blocks win ties: they are the likeliest still in the CPU's caches.
      if (it->mapped >= size && it->mapped / 2 <= size && (best == g_kept.end() || it->mapped <= best->mapped)) {
        best = it;
      }
    }
    if (best != g_kept.end()) {
      void* base = best->base;
      *mapped = best->mapped;
      g_counts.kept -= best->mapped;
      g_counts.live += best->mapped;
      g_kept.erase(best);
      return base;
    }
    g_counts.live += size;
    g_counts.high = std::max(g_counts.high, g_counts.live);
    while (g_counts.live + g_counts.kept > g_counts.high) {
      g_counts.kept -= g_kept.front().mapped;
      evicted.splice(evicted.end(), g_kept, g_kept.begin());
    }
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
  *mapped = size;
  return base;
}

void host_block_release(void* base, size_t mapped) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kept.push_back({base, mapped});
  g_counts.live -= mapped;
  g_counts.kept += mapped;
}

void host_block_drop_cache() {
  std::list<Block> evicted;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    evicted.swap(g_kept);
    g_counts.kept = 0;
    g_counts.high = g_counts.live;  // what was needed before no longer justifies a cache
  }
  unmap_all(evicted);
}

HostBlockCounts host_block_counts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_counts;
}

}  // namespace remat::memory::detail
