// A unity translation unit of the npusim_dist_C extension: see Note [Unity build] in
// npusim/_sources.py. Every .cpp of csrc/ is included by exactly one unit.
#include "../distributed/backend.cpp"
#include "../distributed/module.cpp"
