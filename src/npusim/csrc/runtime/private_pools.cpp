// A device cache's private pools (npu graphs, MemPool), their allocation
// scopes, checkpoints, and the snapshot of its segments.
#include "device_cache.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <unordered_map>

namespace npusim {

// Note [Private pools]
// CUDA's private pools (Note [Interaction with CUDA graph capture] in
// CUDACachingAllocator.cpp): a pool, keyed by its MempoolId_t, has small and
// large block pools of its own. While a scope routes allocations to it (an
// npu graph's capture: every allocation on the captured stream; use_mem_pool:
// every allocation of the calling thread), those allocations take its free
// blocks or map segments for it, and its blocks go back to it when freed, so
// that a later allocation of the same pool (later in the capture, or another
// graph captured into the pool) reuses them while nothing outside the pool
// can. The pool lives while its use count is above zero (the graphs captured
// into it, a MemPool object, an open scope); after that, its segments go
// back to the host at the next empty_cache once they are free (static outputs
// of a graph keep theirs until those tensors die), and the pool is deleted
// when it has none left. Its segments are only released after the device's
// streams were waited for, since a replay may still run on them. For graph
// trees (inductor's cudagraph_trees), a pool's layout can be checkpointed
// and restored: checkpoint_pool records every segment's blocks (address,
// size, allocated or not); restore_pool frees what is allocated in the pool
// now, then allocates exactly the checkpoint's allocated blocks again (the
// caller hands their DataPtrs to the tensors that stand for them and strips
// the deleters of the tensors whose blocks it freed), as
// _cuda_setCheckpointPoolState does.

PrivatePool* DeviceCache::private_pool_locked(c10::MempoolId_t id) const {
  auto it = private_pools_.find(id);
  TORCH_CHECK(it != private_pools_.end(), "npu private pool (", id.first, ", ", id.second, ") does not exist on npu:",
      static_cast<int>(device));
  return it->second.get();
}

void DeviceCache::create_or_incref_pool_locked(c10::MempoolId_t id, bool no_split, bool use_on_oom) {
  TORCH_CHECK(id.first != 0 || id.second != 0, "npu private pool: (0, 0) names the device's own pool");
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) {
    auto pool = std::make_unique<PrivatePool>(id);
    pool->no_split = no_split;
    pool->use_on_oom = use_on_oom;
    private_pools_.emplace(id, std::move(pool));
    return;
  }
  // A pool nobody holds any more may be taken up again while its segments live.
  it->second->use_count += 1;
}

void DeviceCache::begin_allocate_to_pool_locked(c10::MempoolId_t id, const AllocationScope& scope) {
  for (const AllocationScope& open : scopes_) {
    TORCH_CHECK(open.pool != id, "npu private pool (", id.first, ", ", id.second,
        "): allocations are already being routed to it (one scope per pool at a time, as on CUDA)");
  }
  create_or_incref_pool_locked(id, false, false);
  scopes_.push_back(scope);
}

void DeviceCache::join_allocate_to_pool_locked(c10::MempoolId_t id, c10::StreamId stream) {
  bool open = false;
  for (const AllocationScope& scope : scopes_) {
    TORCH_CHECK(scope.pool != id || scope.stream != stream, "npu private pool (", id.first, ", ", id.second,
        "): allocations of this stream are already routed to it");
    open = open || (scope.pool == id && scope.stream >= 0);
  }
  TORCH_CHECK(open, "npu private pool (", id.first, ", ", id.second,
      "): a stream can join only a pool a capture's stream allocates from");
  scopes_.push_back(AllocationScope{id, stream, {}});  // the scope it joins holds the pool
}

void DeviceCache::end_allocate_to_pool_locked(c10::MempoolId_t id, std::optional<c10::StreamId> stream) {
  for (auto it = scopes_.begin(); it != scopes_.end(); ++it) {
    if (it->pool == id && (!stream || it->stream == *stream)) {
      scopes_.erase(it);
      return;
    }
  }
  TORCH_CHECK(false, "npu private pool (", id.first, ", ", id.second, "): no allocation scope to end");
}

void DeviceCache::release_pool_locked(c10::MempoolId_t id) {
  PrivatePool* pp = private_pool_locked(id);
  TORCH_CHECK(pp->use_count > 0, "npu private pool (", id.first, ", ", id.second, ") released more often than held");
  pp->use_count -= 1;
  if (pp->use_count == 0 && pp->segments == 0) {
    private_pools_.erase(id);
  }
}

int DeviceCache::pool_use_count_locked(c10::MempoolId_t id) const {
  auto it = private_pools_.find(id);
  return it == private_pools_.end() ? 0 : it->second->use_count;
}

Block* DeviceCache::from_use_on_oom_pools_locked(c10::StreamId stream, size_t size) {
  for (auto& [id, pp] : private_pools_) {
    if (pp->use_on_oom && pp->use_count > 0) {
      if (Block* b = get_free_block_locked(size <= kSmallSize ? pp->small : pp->large, stream, size)) {
        return b;
      }
    }
  }
  return nullptr;
}

std::vector<const void*> DeviceCache::pool_live_allocations_locked(c10::MempoolId_t id) const {
  const PrivatePool* pp = private_pool_locked(id);
  std::vector<const void*> live;
  for (const auto& [ptr, b] : allocated_) {
    if (b->pool->owner == pp) {
      live.push_back(ptr);
    }
  }
  std::sort(live.begin(), live.end());
  return live;
}

std::vector<Block*> DeviceCache::all_heads_locked(const PrivatePool* only) const {
  std::vector<Block*> heads;
  const auto add = [&](Block* b) {
    if (b->prev == nullptr && (only == nullptr || b->pool->owner == only)) {
      heads.push_back(b);
    }
  };
  const auto add_pool = [&](const BlockPool& pool) {
    for (Block* b : pool.blocks) {
      add(b);
    }
  };
  if (only == nullptr) {
    add_pool(small_);
    add_pool(large_);
    for (const auto& [id, pp] : private_pools_) {
      add_pool(pp->small);
      add_pool(pp->large);
    }
  } else {
    add_pool(only->small);
    add_pool(only->large);
  }
  for (const auto& [ptr, b] : allocated_) {
    add(b);
  }
  for (const PendingFree& p : pending_) {
    add(p.block);
  }
  std::sort(heads.begin(), heads.end(), [](const Block* a, const Block* b) { return a->ptr < b->ptr; });
  return heads;
}

std::vector<SegmentSnapshot> DeviceCache::snapshot_locked(c10::MempoolId_t pool) const {
  const PrivatePool* only = nullptr;
  if (pool.first != 0 || pool.second != 0) {
    auto it = private_pools_.find(pool);
    if (it == private_pools_.end()) {
      return {};
    }
    only = it->second.get();
  }
  std::vector<SegmentSnapshot> out;
  for (const Block* head : all_heads_locked(only)) {
    SegmentSnapshot s;
    s.device = device;
    s.address = reinterpret_cast<uintptr_t>(head->ptr);
    s.stream = head->stream;
    s.is_large = !head->pool->is_small;
    s.adopted = static_cast<bool>(head->adopted);
    if (head->pool->owner != nullptr) {
      s.pool = head->pool->owner->id;
    }
    for (const Block* b = head; b != nullptr; b = b->next) {
      BlockSnapshot block;
      block.address = reinterpret_cast<uintptr_t>(b->ptr);
      block.size = b->size;
      block.requested_size = b->allocated || b->pending ? b->requested : 0;
      block.state = b->allocated ? "active_allocated" : (b->pending ? "active_pending_free" : "inactive");
      s.total_size += b->size;
      if (b->allocated) {
        s.allocated_size += b->size;
      }
      if (b->allocated || b->pending) {
        s.active_size += b->size;
        s.requested_size += b->requested;
      }
      s.blocks.push_back(std::move(block));
    }
    out.push_back(std::move(s));
  }
  return out;
}

// ---- checkpoints (graph trees) ---------------------------------------------------------

std::shared_ptr<PoolCheckpoint> DeviceCache::checkpoint_pool_locked(c10::MempoolId_t id) const {
  const PrivatePool* pp = private_pool_locked(id);
  TORCH_CHECK(pp->use_count > 0, "npu private pool (", id.first, ", ", id.second,
      "): no longer held by anyone, so it cannot be checkpointed");
  auto checkpoint = std::make_shared<PoolCheckpoint>();
  checkpoint->device = device;
  checkpoint->pool = id;
  for (const Block* head : all_heads_locked(pp)) {
    std::vector<PoolCheckpoint::BlockState> segment;
    for (const Block* b = head; b != nullptr; b = b->next) {
      TORCH_CHECK(!b->pending, "npu private pool (", id.first, ", ", id.second, "): a free of the pool is still "
          "waiting for a stream; synchronize before checkpointing it");
      segment.push_back({b->ptr, b->size, b->allocated, b->stream});
    }
    checkpoint->segments.push_back(std::move(segment));
  }
  return checkpoint;
}

std::pair<std::vector<void*>, std::vector<Block*>> DeviceCache::restore_pool_locked(const PoolCheckpoint& checkpoint) {
  PrivatePool* pp = private_pool_locked(checkpoint.pool);
  TORCH_CHECK(pp->use_count > 0, "npu private pool (", checkpoint.pool.first, ", ", checkpoint.pool.second,
      "): no longer held by anyone, so it cannot be restored");
  reclaim_locked();
  std::vector<void*> freed;
  std::vector<Block*> live;
  for (const auto& [ptr, b] : allocated_) {
    if (b->pool->owner == pp) {
      live.push_back(b);
    }
  }
  for (Block* b : live) {
    freed.push_back(b->ptr);
    free_locked(b, {});  // the caller strips these blocks' DataPtrs of their deleter
  }
  TORCH_CHECK(std::none_of(pending_.begin(), pending_.end(), [&](const PendingFree& p) {
    return p.block->pool->owner == pp;
  }), "npu private pool: a free of the pool is still waiting for a stream; synchronize before restoring it");
  // Every segment is now one free block.
  std::unordered_map<void*, Block*> heads;
  for (BlockPool* pool : {&pp->small, &pp->large}) {
    for (Block* b : pool->blocks) {
      heads.emplace(b->ptr, b);
    }
  }
  std::vector<Block*> allocated;
  for (const auto& segment : checkpoint.segments) {
    auto head = heads.find(segment.front().ptr);
    TORCH_CHECK(head != heads.end(), "npu private pool: the checkpoint's segment at ", segment.front().ptr,
        " is no longer in the pool");
    Block* curr = head->second;
    std::vector<Block*> blocks;
    for (const auto& state : segment) {
      TORCH_INTERNAL_ASSERT(curr != nullptr && curr->ptr == state.ptr && curr->size >= state.size);
      Block* b = hand_out_locked(*curr->pool, curr, state.size, state.size, /*exact=*/true);
      blocks.push_back(b);
      curr = b->next;
    }
    for (size_t i = 0; i < segment.size(); ++i) {
      if (segment[i].allocated) {
        allocated.push_back(blocks[i]);
      } else {
        free_locked(blocks[i], {});
      }
    }
  }
  return {std::move(freed), std::move(allocated)};
}

}  // namespace npusim
