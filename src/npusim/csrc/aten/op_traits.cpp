// Per-operator facts the launch of a fallback op reads: see op_traits.h.
#include "op_traits.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <string>
#include <unordered_map>
#include <vector>

namespace npusim {
namespace {

// Whether every return is a tensor (or a list of them): anything else is a
// value computed from device data, which the host must wait for.
bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const c10::Argument& ret : schema.returns()) {
    const c10::TypePtr& type = ret.type();
    const bool tensor = type->kind() == c10::TypeKind::TensorType ||
        (type->kind() == c10::TypeKind::ListType &&
            type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType) ||
        (type->kind() == c10::TypeKind::OptionalType &&
            type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType);
    if (!tensor) {
      return false;
    }
  }
  return true;
}

// The dispatcher's entry for the CPU kernel the fallback would run ("CPU:
// registered at <file>:<line> [kernel]"); empty when the op has none.
std::string cpu_kernel_entry(const c10::OperatorHandle& op) {
  const std::string table = op.dumpComputedTable();
  const size_t line = table.find("\nCPU: ") != std::string::npos ? table.find("\nCPU: ") + 1
      : (table.rfind("CPU: ", 0) == 0 ? 0 : std::string::npos);
  if (line == std::string::npos) {
    return "";
  }
  return table.substr(line, table.find('\n', line) - line);
}

// Whether a CPU kernel entry is written in Python: a stream worker never
// takes the GIL (the host may hold it while it waits for the stream), so
// such an op runs on the host. The dispatcher records where each kernel was
// registered; C++ registrations name a C++ source file.
bool is_python_kernel(const std::string& entry) {
  for (const char* cxx : {".cpp:", ".cc:", ".h:", ".hpp:", ".cu:"}) {
    if (entry.find(cxx) != std::string::npos) {
      return false;
    }
  }
  return true;
}

// Note [Statistics dtypes of CPU norms]
// A compute task's outputs are allocated at launch from the Meta kernel's
// answer, and a later op's CPU kernel reads them. For a reduced-precision
// input the Meta kernels of layer and batch norm return their saved mean
// and rstd in float32 (CUDA's accumulate type), while CPU's kernels return
// them in the weight's dtype (float32 only for a float32 weight, else the
// input's) and CPU's backward kernels insist on that dtype ("expected scalar
// type BFloat16 but found Float"). The statistics are the op's own
// intermediates, only its backward reads them, so they take CPU's dtype:
// what the host run gives, and what the backward's CPU kernel accepts.
// `weight` is the schema index of the weight argument. CPU's batch norm
// kernels out of training save no statistics at all (empty tensors) where
// the Meta kernels size them by channel, so those outputs are planned
// empty: always for the eval-only ops, else when the `training` flag is
// false (`eval_only` below; `npusim conformance ops --stream-tasks` found
// _native_batch_norm_legit in eval failing its task, and the bf16 and fp16
// statistics of _batch_norm_with_update in float32).
struct NormStats {
  const char* name;
  int weight;
  bool eval_only;
};
constexpr NormStats kCpuNormStats[] = {
    {"aten::native_layer_norm", 2, false},
    {"aten::native_batch_norm", 1, false},
    {"aten::_native_batch_norm_legit", 1, false},
    {"aten::_native_batch_norm_legit_no_training", 1, true},
    {"aten::_native_batch_norm_legit_functional", 1, false},
    {"aten::_batch_norm_with_update", 1, false},
    {"aten::_batch_norm_no_update", 1, true},
};

// Ops whose CPU kernel sizes some outputs otherwise than their Meta kernel,
// from what only the kernel sees: CPU's _embedding_bag returns an empty
// offset2bag on its fast sum path and sizes max_indices by bag, where the
// Meta kernel gives CUDA's shapes (it cannot tell a CPU kernel will run).
// A stream task's outputs are allocated at launch from the Meta kernel's
// answer, so such an op runs on the host after the stream's earlier work,
// where the outputs are the CPU kernel's own; nn.EmbeddingBag over 20000
// indices failed its task ("the CPU kernel's result has shape [0] where the
// Meta kernel's has shape [20000]") before.
constexpr std::string_view kCpuSizesOutputsOtherwise[] = {
    "aten::_embedding_bag", "aten::_embedding_bag_forward_only"};

// The same for out= overloads only (by their full name): in eval, CPU's
// native_batch_norm.out leaves its statistics outputs as given, where the
// Meta kernel sizes them by channel (the functional op's empty statistics,
// Note [Statistics dtypes of CPU norms], are its own). Found by the
// out-dtype sweep of npusim.conformance.misuse over float64 samples, with
// outputs of the functional results' shapes: the task failed the device.
constexpr std::string_view kCpuSizesOutOutputsOtherwise[] = {"aten::native_batch_norm.out"};

// "aten::X" for a foreach op "aten::_foreach_X" (the op its CPU composite
// runs per tensor, up to the overload); nullopt for any other op.
std::optional<std::string> foreach_per_tensor_name(const std::string& name) {
  constexpr std::string_view kForeach = "aten::_foreach_";
  if (name.rfind(kForeach, 0) != 0) {
    return std::nullopt;
  }
  return "aten::" + name.substr(kForeach.size());
}

// _foreach_X(Tensor[] self) -> Tensor[] and aten::X.out(Tensor self, *,
// Tensor(a!) out): the per-tensor op of a unary foreach op, as its CPU
// composite calls it (at::X per tensor), writing into a given output.
std::optional<c10::OperatorHandle> find_foreach_unary_out(const c10::FunctionSchema& schema) {
  const c10::OperatorName& name = schema.operator_name();
  const std::optional<std::string> per_tensor_name = foreach_per_tensor_name(name.name);
  auto is_tensor_list = [](const c10::TypePtr& type) {
    return type->kind() == c10::TypeKind::ListType &&
        type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType;
  };
  if (!per_tensor_name.has_value() || !name.overload_name.empty() || schema.arguments().size() != 1 ||
      schema.returns().size() != 1 || !is_tensor_list(schema.arguments()[0].type()) ||
      !is_tensor_list(schema.returns()[0].type())) {
    return std::nullopt;
  }
  auto out = c10::Dispatcher::singleton().findSchema({*per_tensor_name, "out"});
  if (!out.has_value()) {
    return std::nullopt;
  }
  const c10::FunctionSchema& per_tensor = out->schema();
  const auto& args = per_tensor.arguments();
  if (args.size() != 2 || args[0].type()->kind() != c10::TypeKind::TensorType || !args[1].is_out() ||
      args[1].type()->kind() != c10::TypeKind::TensorType) {
    return std::nullopt;
  }
  return out;
}

// Note [A functional op's results in place]
// The boxed route's task runs an op's functional CPU kernel, which returns a
// fresh result, and then copies it into the output the host allocated at
// launch (TaskAliases::place): an allocation, the first touch of its pages,
// a copy and a free per result. relu over 1M floats took 624 us on npu
// against 298 us on CPU (2026-12-07). Where the functional kernel is, by how
// PyTorch builds it, its out= variant's kernel run into a fresh tensor, the
// task runs that out= variant into the host's outputs instead: the same
// kernel, the same values, no copy. Three kinds of op are such:
//  - a structured op's functional variant, recognised by the
//    CompositeExplicitAutogradNonFunctional kernel PyTorch's codegen gives
//    every structured op (Note [Structured ops go straight to the fallback]):
//    its CPU kernel runs the meta function, allocates the outputs and runs
//    the out= variant's impl on them. The out= overload is found by its
//    schema: the op's own arguments, then one Tensor(a!) per return (max.dim
//    has max.dim_max, topk has topk.values, elu_backward has
//    elu_backward.grad_input).
//  - relu, whose CPU kernel (in PyTorch's activations) refuses a Bool input,
//    then returns clamp_min(self, 0), structured: its task runs
//    clamp_min.out with min 0, except for a Bool input.
//  - hardtanh, where.self and index_select, whose CPU kernels allocate the
//    result and run the op's own out= kernel on it (kCpuKernelRunsItsOut).
// An impl may still treat the output it is given otherwise than a fresh
// one. A sweep of PyTorch's OpInfo ops with every op made a stream task
// (`python -m npusim conformance ops --stream-tasks --samples 3`: all
// dtypes, forward and backward) found three: mse_loss and smooth_l1_loss
// resize a reduced output to the input's shape (and warn that resizing an
// output is deprecated), and linalg_lu_solve with adjoint returns a lazily
// conjugated result. The first two keep the functional kernel
// (kOutResizesItsOutput); a result with a lazy conjugate or negation keeps
// it too (BoxedLaunch::returns_fresh), as does any return that is not a
// fresh output. Should another impl resize or restride its output, the
// outputs it was given are aliases over storages of their own
// (TaskAliases::own), so a resize moves that alias alone, and place copies
// whatever result came back into the device memory, as for a functional
// kernel. With those rules 208 structured ops and relu took their out=
// variant in that sweep, and each of its 24602 comparisons with CPU came out
// as with every result copied (the same passes, failures and errors); with
// hardtanh and where added, the sweep has no failure at all.

// Unstructured ops whose functional CPU kernel allocates its result and runs
// the op's out= kernel on it (torch 2.13, under torch.profiler: hardtanh
// calls empty_like and hardtanh.out; where.self allocates and runs
// where_self_out; index_select, which nn.Embedding's forward runs, allocates
// an empty result that index_select_out_cpu_, its out= kernel, resizes).
constexpr std::string_view kCpuKernelRunsItsOut[] = {"aten::hardtanh", "aten::where.self", "aten::index_select"};

constexpr std::string_view kOutResizesItsOutput[] = {
    "aten::mse_loss", "aten::smooth_l1_loss"};

// Whether `name` is one of `names` (the lists of ops above).
template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// The aten ops' overloads by name ("aten::max"): [0] those with out= arguments,
// [1] those that write none of their arguments; built once.
enum OverloadKind { kWithOut = 0, kFunctional = 1 };
const std::unordered_map<std::string, std::vector<c10::OperatorHandle>>& overloads(OverloadKind kind) {
  using Index = std::array<std::unordered_map<std::string, std::vector<c10::OperatorHandle>>, 2>;
  static const Index* index = [] {
    auto* by_name = new Index();
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) {
        continue;
      }
      const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
      if (!op.has_value() || !op->hasSchema()) {
        continue;
      }
      const auto& args = op->schema().arguments();
      if (!op->schema().is_mutable()) {
        (*by_name)[kFunctional][name.name].push_back(*op);
      } else if (std::any_of(args.begin(), args.end(), [](const c10::Argument& a) { return a.is_out(); })) {
        (*by_name)[kWithOut][name.name].push_back(*op);
      }
    }
    return by_name;
  }();
  return (*index)[kind];
}

bool is_plain_tensor(const c10::TypePtr& type) {
  return type->kind() == c10::TypeKind::TensorType;
}

// X's out= overload for a functional X whose arguments are all read and
// whose returns are all tensors: the overload with X's arguments, in order
// and of the same names and types, then one tensor out= argument per return.
std::optional<c10::OperatorHandle> out_overload_of(const c10::FunctionSchema& schema) {
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  if (rets.empty() || !std::all_of(rets.begin(), rets.end(), [](const auto& r) { return is_plain_tensor(r.type()); }) ||
      std::any_of(args.begin(), args.end(), [](const auto& a) { return use_of(a) == ArgUse::kWritten; })) {
    return std::nullopt;
  }
  const auto found = overloads(kWithOut).find(schema.operator_name().name);
  if (found == overloads(kWithOut).end()) {
    return std::nullopt;
  }
  for (const c10::OperatorHandle& candidate : found->second) {
    const auto& cargs = candidate.schema().arguments();
    if (cargs.size() != args.size() + rets.size()) {
      continue;
    }
    bool fits = true;
    for (size_t i = 0; i < cargs.size() && fits; ++i) {
      fits = i < args.size()
          ? !cargs[i].is_out() && cargs[i].name() == args[i].name() && *cargs[i].type() == *args[i].type()
          : cargs[i].is_out() && is_plain_tensor(cargs[i].type());
    }
    if (fits) {
      return candidate;
    }
  }
  return std::nullopt;
}

// The functional overload of an out= op X.out: the one whose arguments are
// X.out's before its out= arguments (the same names and types, in order) and
// that returns one tensor per out= argument; nullopt if there is none.
std::optional<c10::OperatorHandle> functional_of_out(const c10::FunctionSchema& schema, size_t out_args) {
  const auto& args = schema.arguments();
  const auto found = overloads(kFunctional).find(schema.operator_name().name);
  if (out_args == 0 || found == overloads(kFunctional).end()) {
    return std::nullopt;
  }
  const size_t in_args = args.size() - out_args;
  for (const c10::OperatorHandle& candidate : found->second) {
    const auto& cargs = candidate.schema().arguments();
    const auto& crets = candidate.schema().returns();
    if (cargs.size() != in_args || crets.size() != out_args ||
        !std::all_of(crets.begin(), crets.end(), [](const auto& r) { return is_plain_tensor(r.type()); })) {
      continue;
    }
    bool fits = true;
    for (size_t i = 0; i < in_args && fits; ++i) {
      fits = cargs[i].name() == args[i].name() && *cargs[i].type() == *args[i].type();
    }
    if (fits) {
      return candidate;
    }
  }
  return std::nullopt;
}

// The FunctionalOut of `op` (Note [A functional op's results in place]), or
// null; leaked, as the traits are.
// `full_name` is the op's name with its overload (OpTraits::name).
const FunctionalOut* find_functional_out(const c10::OperatorHandle& op, std::string_view full_name) {
  const c10::OperatorName& name = op.schema().operator_name();
  if (name.name == "aten::relu" && name.overload_name.empty()) {
    const auto clamp_min_out = c10::Dispatcher::singleton().findSchema({"aten::clamp_min", "out"});
    if (!clamp_min_out.has_value()) {
      return nullptr;
    }
    return new FunctionalOut{*clamp_min_out, c10::IValue(c10::Scalar(0)), /*not_for_bool=*/true};
  }
  const bool structured = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
  if (!(structured || listed(kCpuKernelRunsItsOut, full_name)) || !op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
      listed(kOutResizesItsOutput, name.name)) {
    return nullptr;
  }
  const std::optional<c10::OperatorHandle> out = out_overload_of(op.schema());
  return out.has_value() ? new FunctionalOut{*out, c10::IValue(), false} : nullptr;
}

std::unique_ptr<OpTraits> make_traits(const c10::OperatorHandle& op) {
  auto traits = std::make_unique<OpTraits>();
  const c10::FunctionSchema& schema = op.schema();
  const c10::OperatorName& name = schema.operator_name();
  // Leaked: tasks and traces refer to it for the life of the process.
  traits->name = (new std::string(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name))
                     ->c_str();
  for (const c10::Argument& arg : schema.arguments()) {
    traits->uses.push_back(use_of(arg));
    traits->generator.push_back(is_optional_generator(arg));
  }
  for (const NormStats& norm : kCpuNormStats) {
    if (name.name == norm.name) {
      traits->stats_dtype_from = norm.weight;
      traits->stats_saved_unless = norm.eval_only ? OpTraits::kStatsNever : OpTraits::kStatsAlways;
      for (size_t i = 0; i < schema.arguments().size() && !norm.eval_only; ++i) {
        if (schema.arguments()[i].name() == "training") {
          traits->stats_saved_unless = static_cast<int>(i);
        }
      }
    }
  }
  traits->pointwise = is_pointwise(op);
  traits->floating_scalars_by_kind = traits->pointwise && foreach_per_tensor_name(name.name).has_value();
  if (auto out = find_foreach_unary_out(schema)) {
    traits->foreach_unary_out = new c10::OperatorHandle(*out);  // leaked, as the traits are
  }
  traits->functional_out = find_functional_out(op, traits->name);
  // The out= arguments close the schema: their count, and the functional overload whose Meta kernel gives
  // the dtypes they should have (Note [out= tensors of another dtype], op_launch.cpp).
  const auto& all_args = schema.arguments();
  const auto out_args = static_cast<size_t>(std::count_if(all_args.begin(), all_args.end(),
      [](const c10::Argument& a) { return a.is_out(); }));
  const bool outs_close = out_args > 0 &&
      std::all_of(all_args.end() - static_cast<std::ptrdiff_t>(out_args), all_args.end(),
          [](const c10::Argument& a) { return a.is_out() && is_plain_tensor(a.type()); });
  if (outs_close) {
    if (auto functional = functional_of_out(schema, out_args)) {
      traits->functional_of_out = new c10::OperatorHandle(*functional);  // leaked, as the traits are
      traits->out_args = out_args;
    }
  }
  traits->host_check = host_check_of(traits->name);
  const std::string cpu_kernel = cpu_kernel_entry(op);
  if (!returns_only_tensors(schema)) {
    traits->host_only = "returns a host value computed from device data";
  } else if (cpu_kernel.empty()) {
    // CUDA's own ops (fused attention, cuDNN's): the host path raises PyTorch's "Could not run ... with
    // arguments from the 'CPU' backend" from the call, where a task would fail the device with it.
    traits->host_only = "it has no CPU kernel";
  } else if (is_python_kernel(cpu_kernel)) {
    traits->host_only = "its CPU kernel is a Python function";
  } else if (listed(kCpuSizesOutputsOtherwise, name.name) || listed(kCpuSizesOutOutputsOtherwise, traits->name)) {
    traits->host_only = "its CPU kernel sizes its outputs otherwise than its Meta kernel";
  }
  return traits;
}

}  // namespace

bool is_pointwise(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::pointwise)) {
    return true;
  }
  // aten::_foreach_lerp_.Scalar runs aten::lerp_ per tensor: pointwise when
  // that op is (so _foreach_norm and _foreach_max are not).
  const c10::OperatorName& name = op.schema().operator_name();
  const std::optional<std::string> per_tensor_name = foreach_per_tensor_name(name.name);
  if (!per_tensor_name.has_value()) {
    return false;
  }
  const std::string& base = *per_tensor_name;
  for (const std::string& candidate : {base, base.back() == '_' ? base.substr(0, base.size() - 1) : base + "_"}) {
    for (const char* overload : {"", "Tensor", "Scalar", "default"}) {
      const auto handle = c10::Dispatcher::singleton().findSchema({candidate, overload});
      if (handle.has_value()) {
        return handle->hasTag(at::Tag::pointwise);
      }
    }
  }
  return false;
}

namespace {

std::mutex& g_traits_mutex = *new std::mutex();
std::unordered_map<const void*, std::unique_ptr<OpTraits>>& g_traits =
    *new std::unordered_map<const void*, std::unique_ptr<OpTraits>>();
thread_local std::unordered_map<const void*, const OpTraits*> tls_traits;

}  // namespace

const OpTraits& op_traits(const c10::OperatorHandle& op) {
  const void* key = &op.schema();  // one per operator, for the life of the registration
  const auto mine = tls_traits.find(key);
  if (mine != tls_traits.end()) {
    return *mine->second;
  }
  const OpTraits* traits = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_traits_mutex);
    auto& slot = g_traits[key];
    if (!slot) {
      slot = make_traits(op);
    }
    traits = slot.get();
  }
  tls_traits.emplace(key, traits);
  return *traits;
}

const char* interned_op_name(const c10::OperatorHandle& op) {
  return op_traits(op).name;
}

}  // namespace npusim
