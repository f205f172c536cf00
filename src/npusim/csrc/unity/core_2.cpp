// A unity translation unit of the npusim_C extension: see Note [Unity build] in
// npusim/_sources.py. Every .cpp of csrc/ is included by exactly one unit.
#include "../aten_ops.cpp"
#include "../fallback.cpp"
#include "../fallback_routes.cpp"
#include "../intraop_threads.cpp"
#include "../graph.cpp"
#include "../generator.cpp"
#include "../random_ops.cpp"
#include "../cuda_semantics.cpp"
#include "../attention.cpp"
