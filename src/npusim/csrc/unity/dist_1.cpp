// A unity translation unit of the npusim_dist_C extension: see Note [Unity build] in
// npusim/_sources.py. Every .cpp of csrc/ is included by exactly one unit.
#include "../distributed/comm_stream.cpp"
#include "../distributed/work.cpp"
#include "../distributed/mirror_backend.cpp"
