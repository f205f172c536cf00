// Note [Intra-op threads of autograd's npu thread]
// PyTorch's autograd engine runs the backward of non-CPU devices on one
// worker thread per device, and at::init_num_threads gives that thread the
// intra-op thread count (OpenMP team size) that torch.set_num_threads had
// set when the thread started; later torch.set_num_threads calls on the
// user's thread never reach it (OpenMP's team size is per thread). On CUDA
// this does not matter: the device thread only launches kernels. npu's
// kernels are CPU kernels run on the calling thread (fallback.cpp), so a
// program that starts with the default count and then asks for one thread
// still ran its whole backward with the default team (issue 15: a small
// model's training step then costs up to 2x CPU's on 2 cores), and one that
// asks for more threads later never gets them in backward.
//
// The user's count is the one their own thread has. So every fallback op
// records its thread's count when it runs outside a backward pass (the
// forward, the optimizer: the user's threads), and applies the recorded
// count, through at::set_num_threads, when it runs inside one (autograd's
// device thread, or the user's thread when it runs the backward itself) and
// the two differ. In the steady state that is one OpenMP query and one
// relaxed atomic load per op. A program whose threads use different counts
// makes the backward follow the thread that ran an npu op last.
//
// Now that npu kernels run on the stream workers (Note [Compute on the
// stream]), a worker is in the same place as autograd's thread: its team
// size was fixed when it started. Each op follows the user's count on the
// host as before (recording it) and the worker applies it before it runs a
// kernel, less the core the host needs (Note [A core for the host]).

// Note [A core for the host]
// The simulated device computes on the machine's cores, and so does the
// host thread that launches its work and runs ahead of it. A worker running
// a kernel with the user's whole team (torch's default: one thread per core)
// while the host dispatches the next ops puts one runnable thread more on
// the machine than it has cores, and every OpenMP barrier of the kernel
// then waits for a team thread the scheduler has put aside: on 2 cores the
// demo model's training step took 6.5 ms on npu against 3.4 ms on CPU (the
// medians of 4 alternating processes each; docs/BENCHMARKS.md). Running
// every small kernel with one thread fewer brought it to 3.2 ms, but npu
// must compute what CPU computes, bit for bit, and many CPU kernels split
// their work by the team's size (batch norm's statistics of an 8x4 input
// differ between one thread and two, as do the reductions of larger
// tensors). So only pointwise kernels (PyTorch's pointwise tag, and foreach
// ops whose per-tensor op carries it: OpTraits::pointwise), whose every
// output element comes from the inputs' elements alone whatever the team,
// leave the core: one thread fewer than the user's count, when that count
// takes every core the process may use and the kernel's largest tensor
// (a foreach op runs a kernel per tensor) holds fewer than
// kFullTeamElements elements. A larger one, where intra-op parallelism
// pays and the host is usually waiting for it, gets the whole team; so do
// matrix products, reductions and norms of any size.

// Note [OpenMP's count of busy threads]
// libgomp decides how long an idle team thread spins before it sleeps by
// comparing the threads it manages with the CPUs the process may use: up to
// that number it spins 300,000 turns (about 3 ms) after each parallel
// region, so that the next region finds its team awake; beyond it, 100
// turns, because a spinning thread then takes a core some other thread needs
// (libgomp's do_spin and env.c, OMP_WAIT_POLICY unset). In a CPU program the
// user's thread is a master of its own team and both are counted. In an npu
// program the parallel regions run on a stream worker (Note [Compute on the
// stream]), and libgomp counts the threads it made: the worker's team
// threads, besides the process's first thread. On 2 cores with the default 2
// threads it counted 2 threads where 3 were busy (the user's thread
// launching the next ops, the worker, its team thread), so the team thread
// spun through the gaps between kernels while the host waited for a core: in
// a perf profile of the demo model's training step the team thread spent
// about a quarter of all samples in libgomp's spin loop and the worker
// another tenth in its barrier, the host a quarter in all. So the user's
// thread makes its own team, of its count, the first time an op records that
// count (and again when it grows): the team it would have had in the CPU
// program. libgomp then counts the threads that are busy and spins briefly
// where they outnumber the cores, and keeps its long spin where they do not.
// In fresh processes taking turns (2026-12-03, 2 cores, 2 threads), the demo
// step took 4.6-9.2 ms with the team against 7.2-11.1 ms without (CPU
// 6.5-9.3 ms), the dispatch-bound MLP step 1.28-1.44 against 1.30-1.50. The
// team sizes, and so every result, are unchanged.
#include "intraop_threads.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/fill_native.h>
#include <torch/csrc/autograd/node.h>

#include <algorithm>
#include <atomic>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace npusim {
namespace {

std::atomic<int> g_user_threads{0};

// Pointwise kernels whose largest tensor holds fewer elements than this leave a core to the host.
constexpr int64_t kFullTeamElements = int64_t{1} << 18;

// Gives the calling thread an OpenMP team of `threads`: a libtorch CPU kernel
// (npusim itself is not built with OpenMP, so at::parallel_for here would run
// inline) over a grain of bytes per thread, called below the dispatcher so
// that no dispatch mode or profiler sees it.
void make_own_team(int threads) {
  at::Tensor bytes = at::detail::empty_cpu({at::internal::GRAIN_SIZE * threads}, at::kByte, std::nullopt,
      std::nullopt, std::nullopt, std::nullopt);
  at::native::fill_(bytes, 0);
}

}  // namespace

void follow_user_intraop_threads() {
  const int mine = at::get_num_threads();
  const int user = g_user_threads.load(std::memory_order_relaxed);
  if (mine == user) {
    return;
  }
  if (torch::autograd::get_current_node() == nullptr) {
    g_user_threads.store(mine, std::memory_order_relaxed);
    if (mine > user && mine > 1 && !at::in_parallel_region()) {
      make_own_team(mine);  // Note [OpenMP's count of busy threads]
    }
  } else if (user > 0) {
    at::set_num_threads(user);
  }
}

// The cores this process may run on (its affinity mask, which containers
// and taskset narrow), read once.
int usable_cores() {
  static const int cores = [] {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      return std::max(1, CPU_COUNT(&set));
    }
#endif
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return cores;
}

int worker_intraop_threads(int user, int64_t elements, bool pointwise) {
  if (pointwise && user > 1 && elements < kFullTeamElements && user >= usable_cores()) {
    return user - 1;
  }
  return user;
}

void apply_user_intraop_threads(int64_t elements, bool pointwise) {
  const int user = g_user_threads.load(std::memory_order_relaxed);
  if (user <= 0) {
    return;
  }
  const int team = worker_intraop_threads(user, elements, pointwise);
  if (at::get_num_threads() != team) {
    at::set_num_threads(team);
  }
}

}  // namespace npusim
