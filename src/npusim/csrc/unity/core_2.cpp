// A unity translation unit of the npusim_C extension: see Note [Unity build] in
// npusim/_sources.py. Every .cpp of csrc/ is included by exactly one unit.
#include "../aten/aten_ops.cpp"
#include "../aten/fallback.cpp"
#include "../aten/fallback_routes.cpp"
#include "../aten/intraop_threads.cpp"
#include "../aten/generator.cpp"
#include "../aten/random_ops.cpp"
#include "../aten/cuda_semantics.cpp"
#include "../aten/attention.cpp"
#include "../graph/op_recorder.cpp"
#include "../graph/graph.cpp"
#include "../python/graph_bindings.cpp"
#include "../python/ops_bindings.cpp"
