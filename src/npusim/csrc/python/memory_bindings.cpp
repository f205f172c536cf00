// Bindings of the allocators: device memory, its settings, private pools and
// their checkpoints, snapshots, pinned host memory, the host-memory test hooks.
#include "bindings.h"

#include "../runtime/device_allocator.h"
#include "../runtime/host_allocator.h"
#include "../runtime/host_memory.h"

#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <unordered_set>

namespace py = pybind11;

namespace {

using PoolId = std::pair<uint64_t, uint64_t>;

c10::MempoolId_t pool_id(const PoolId& id) {
  return {id.first, id.second};
}

py::list snapshot_list(const PoolId& pool) {
  py::list segments;
  for (const auto& seg : npusim::memory_snapshot(pool_id(pool))) {
    py::list blocks;
    for (const auto& b : seg.blocks) {
      py::dict block;
      block["address"] = b.address;
      block["size"] = b.size;
      block["requested_size"] = b.requested_size;
      block["state"] = b.state;
      block["frames"] = py::list();
      blocks.append(block);
    }
    py::dict d;
    d["device"] = static_cast<int>(seg.device);
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = seg.stream;
    d["segment_type"] = seg.is_large ? "large" : "small";
    d["segment_pool_id"] = py::make_tuple(seg.pool.first, seg.pool.second);
    d["is_expandable"] = false;
    d["adopted"] = seg.adopted;
    d["frames"] = py::list();
    d["blocks"] = blocks;
    segments.append(d);
  }
  return segments;
}

py::list trace_list(int device) {
  py::list out;
  for (const auto& e : npusim::memory_trace(static_cast<c10::DeviceIndex>(device))) {
    py::dict d;
    d["action"] = e.action;
    d["addr"] = e.address;
    d["size"] = e.size;
    d["stream"] = e.stream;
    d["time_us"] = e.time_us;
    d["frames"] = py::list();
    if (e.action == "oom") {
      d["device_free"] = e.address;  // torch.cuda's oom entries carry the device's free bytes
    }
    out.append(d);
  }
  return out;
}

// Python's reader of PYTORCH_NPU_ALLOC_CONF, which the allocator calls when it
// initialises (set_settings_init_hook). Leaked: it may be called at exit.
py::object& settings_reader() {
  static auto* reader = new py::object();
  return *reader;
}

void read_settings_from_python() {
  if (!Py_IsInitialized()) {
    return;  // the interpreter is gone: keep the settings the allocator has
  }
  py::gil_scoped_acquire gil;
  if (!settings_reader()) {
    return;
  }
  try {
    settings_reader()();
  } catch (py::error_already_set& e) {
    // A ConfigError (a ValueError) stays a ValueError, whatever called the allocator.
    TORCH_CHECK_VALUE(false, py::str(e.value()).cast<std::string>());
  }
}

// torch.cuda's _cuda_setCheckpointPoolState contract: restores `checkpoint`,
// strips the storages whose blocks it freed of their deleter (the allocator
// has freed them) and hands the blocks it allocated to the storages given
// for them, matched by address.
void set_checkpoint_pool_state(const npusim::PoolCheckpoint& checkpoint, const std::vector<uintptr_t>& stale,
    const std::vector<uintptr_t>& to_add_deleters) {
  std::vector<c10::StorageImpl*> storages;
  for (uintptr_t address : stale) {
    auto* storage = reinterpret_cast<c10::StorageImpl*>(address);
    if (std::find(storages.begin(), storages.end(), storage) == storages.end()) {
      storages.push_back(storage);
    }
  }
  npusim::RestoredPool delta = npusim::restore_pool(checkpoint);
  std::unordered_set<void*> freed(delta.freed.begin(), delta.freed.end());
  std::unordered_set<void*> allocated;
  for (const c10::DataPtr& d : delta.allocated) {
    allocated.insert(d.get());
  }
  const size_t gone = static_cast<size_t>(std::count_if(delta.freed.begin(), delta.freed.end(),
      [&](void* ptr) { return allocated.count(ptr) == 0; }));
  // As CUDA: a block freed for good must have had its storage passed as
  // stale, or that storage would free it a second time.
  TORCH_CHECK(storages.size() >= gone, "_npu_setCheckpointPoolState: any stale tensors which are being manually "
      "freed must be passed to set checkpoint (", gone, " freed, ", storages.size(), " stale storages given)");
  for (c10::StorageImpl* storage : storages) {
    if (freed.count(storage->mutable_data_ptr().get()) > 0) {
      storage->mutable_data_ptr().release_context();
    }
  }
  for (uintptr_t address : to_add_deleters) {
    auto* storage = reinterpret_cast<c10::StorageImpl*>(address);
    void* const ptr = storage->data_ptr().get();
    auto it = std::find_if(delta.allocated.begin(), delta.allocated.end(),
        [&](const c10::DataPtr& d) { return d.get() == ptr; });
    TORCH_CHECK(it != delta.allocated.end(), "_npu_setCheckpointPoolState: the storage at ", ptr,
        " is not a block the checkpoint allocated");
    storage->set_data_ptr_noswap(std::move(*it));
  }
}

}  // namespace

namespace npusim {

void init_memory_bindings(py::module& m) {
  using release = py::call_guard<py::gil_scoped_release>;

  // memory
  m.def("memory_capacity", [](int device) { return npusim::memory_capacity(device); });
  m.def("set_memory_capacity", [](int device, int64_t bytes) { npusim::set_memory_capacity(device, bytes); });
  m.def("memory_fraction", [](int device) { return npusim::memory_fraction(device); });
  m.def("set_memory_fraction", [](int device, double f) { npusim::set_memory_fraction(device, f); });
  m.def("reset_peak_memory_stats", [](int device) { npusim::reset_peak_stats(device); });
  m.def("reset_accumulated_memory_stats", [](int device) { npusim::reset_accumulated_stats(device); });
  m.def("empty_cache", [] {
    npusim::empty_cache();
    npusim::reclaim_pinned_frees();
  }, release());

  // settings (Note [Allocator settings], npusim/config.py)
  m.def("set_allocator_settings", [](int64_t max_split_size, int64_t max_non_split_rounding,
      int64_t large_segment_size, double gc_threshold, const std::vector<int64_t>& divisions, bool expandable) {
    npusim::AllocatorSettings s;
    s.max_split_size = max_split_size < 0 ? SIZE_MAX : static_cast<size_t>(max_split_size);
    s.large_segment_size = static_cast<size_t>(large_segment_size);
    s.max_non_split_rounding = max_non_split_rounding < 0 ? s.large_segment_size
                                                          : static_cast<size_t>(max_non_split_rounding);
    s.garbage_collection_threshold = gc_threshold;
    TORCH_CHECK(divisions.size() == npusim::kRoundupIntervals, "set_allocator_settings: expected ",
        npusim::kRoundupIntervals, " roundup_power2_divisions, got ", divisions.size());
    for (size_t i = 0; i < divisions.size(); ++i) {
      s.roundup_power2_divisions[i] = static_cast<size_t>(std::max<int64_t>(0, divisions[i]));
    }
    s.expandable_segments = expandable;
    npusim::set_allocator_settings(s);
  });
  m.def("allocator_settings", [] {
    npusim::ensure_allocator_settings();
    const npusim::AllocatorSettings s = npusim::allocator_settings();
    py::dict d;
    d["max_split_size"] = s.max_split_size == SIZE_MAX ? py::object(py::none()) : py::int_(s.max_split_size);
    d["max_non_split_rounding"] = s.max_non_split_rounding;
    d["large_segment_size"] = s.large_segment_size;
    d["garbage_collection_threshold"] = s.garbage_collection_threshold;
    d["roundup_power2_divisions"] = py::tuple(py::cast(std::vector<size_t>(
        s.roundup_power2_divisions.begin(), s.roundup_power2_divisions.end())));
    d["expandable_segments"] = s.expandable_segments;
    return d;
  });
  m.def("set_allocator_settings_reader", [](py::object reader) {
    settings_reader() = std::move(reader);
    npusim::set_settings_init_hook(&read_settings_from_python);
  });
  m.def("ensure_allocator_settings", &npusim::ensure_allocator_settings);

  // snapshots and history
  m.def("memory_snapshot", &snapshot_list, py::arg("pool") = PoolId{0, 0});
  m.def("record_memory_history", [](bool enabled, int64_t max_entries) {
    npusim::record_memory_history(enabled, static_cast<size_t>(std::max<int64_t>(0, max_entries)));
  });
  m.def("memory_trace", &trace_list);

  // private pools (Note [Private pools])
  m.def("new_mempool_id", [](bool user_created) {
    const c10::MempoolId_t id = npusim::new_mempool_id(user_created);
    return py::make_tuple(id.first, id.second);
  });
  m.def("create_or_incref_pool", [](int device, const PoolId& id, bool no_split, bool use_on_oom) {
    npusim::create_or_incref_pool(static_cast<c10::DeviceIndex>(device), pool_id(id), no_split, use_on_oom);
  });
  m.def("begin_allocate_current_thread_to_pool", [](int device, const PoolId& id) {
    npusim::begin_allocate_current_thread_to_pool(static_cast<c10::DeviceIndex>(device), pool_id(id));
  });
  m.def("end_allocate_to_pool", [](int device, const PoolId& id) {
    npusim::end_allocate_to_pool(static_cast<c10::DeviceIndex>(device), pool_id(id));
  });
  m.def("release_pool", [](int device, const PoolId& id) {
    npusim::release_pool(static_cast<c10::DeviceIndex>(device), pool_id(id));
  });
  m.def("pool_use_count", [](int device, const PoolId& id) {
    return npusim::pool_use_count(static_cast<c10::DeviceIndex>(device), pool_id(id));
  });
  m.def("pool_live_allocations", [](int device, const PoolId& id) {
    std::vector<uintptr_t> out;
    for (const void* ptr : npusim::pool_live_allocations(static_cast<c10::DeviceIndex>(device), pool_id(id))) {
      out.push_back(reinterpret_cast<uintptr_t>(ptr));
    }
    return out;
  });
  py::class_<npusim::PoolCheckpoint, std::shared_ptr<npusim::PoolCheckpoint>>(m, "PoolCheckpoint")
      .def_property_readonly("device", [](const npusim::PoolCheckpoint& c) { return static_cast<int>(c.device); })
      .def_property_readonly("pool", [](const npusim::PoolCheckpoint& c) {
        return py::make_tuple(c.pool.first, c.pool.second);
      })
      .def_property_readonly("segments", [](const npusim::PoolCheckpoint& c) {
        py::list segments;
        for (const auto& segment : c.segments) {
          py::list blocks;
          for (const auto& b : segment) {
            blocks.append(py::make_tuple(reinterpret_cast<uintptr_t>(b.ptr), b.size, b.allocated));
          }
          segments.append(blocks);
        }
        return segments;
      });
  m.def("checkpoint_pool", [](int device, const PoolId& id) {
    return npusim::checkpoint_pool(static_cast<c10::DeviceIndex>(device), pool_id(id));
  });
  m.def("set_checkpoint_pool_state", &set_checkpoint_pool_state);

  // pinned host memory
  // CUDA's keys (torch.cuda.host_memory_stats): Note [Pinned host memory statistics]
  m.def("host_memory_stats", [] {
    const at::HostStats h = npusim::host_stats();
    py::dict d;
    auto add = [&d](const char* name, const c10::CachingAllocator::Stat& stat) {
      const std::string prefix(name);
      d[py::str(prefix + ".current")] = stat.current;
      d[py::str(prefix + ".peak")] = stat.peak;
      d[py::str(prefix + ".allocated")] = stat.allocated;
      d[py::str(prefix + ".freed")] = stat.freed;
    };
    add("allocations", h.allocations);
    add("allocated_bytes", h.allocated_bytes);
    add("active_requests", h.active_requests);
    add("active_bytes", h.active_bytes);
    d["num_host_alloc"] = h.num_host_alloc;
    d["num_host_free"] = h.num_host_free;
    return d;
  });
  m.def("reset_peak_host_memory_stats", &npusim::reset_host_peak_stats);
  m.def("reset_accumulated_host_memory_stats", &npusim::reset_host_accumulated_stats);

  // the host behind the device (Note [Host memory behind the device]); test hooks
  m.def("set_host_memory_margin", &npusim::set_host_memory_margin);
  m.def("simulate_host_memory", &npusim::simulate_host_memory);
  m.def("fail_host_mappings", &npusim::fail_host_mappings);
  m.def("mapped_segment_bytes", &npusim::mapped_segment_bytes);
}

}  // namespace npusim
