// A unity translation unit of the npusim_C extension: see Note [Unity build] in
// npusim/_sources.py. Every .cpp of csrc/ is included by exactly one unit.
#include "../runtime.cpp"
#include "../memory.cpp"
#include "../device_hooks.cpp"
#include "../host_transfer.cpp"
#include "../host_allocator.cpp"
#include "../record_stream.cpp"
#include "../trace.cpp"
#include "../primitives.cpp"
#include "../foreach_copy.cpp"
#include "../autocast.cpp"
#include "../zero_tensor.cpp"
#include "../module.cpp"
