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
// host as before (recording it) and the worker applies the recorded count
// before it runs a kernel.
#include "intraop_threads.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/node.h>

#include <atomic>

namespace npusim {
namespace {

std::atomic<int> g_user_threads{0};

}  // namespace

void follow_user_intraop_threads() {
  const int mine = at::get_num_threads();
  const int user = g_user_threads.load(std::memory_order_relaxed);
  if (mine == user) {
    return;
  }
  if (torch::autograd::get_current_node() == nullptr) {
    g_user_threads.store(mine, std::memory_order_relaxed);
  } else if (user > 0) {
    at::set_num_threads(user);
  }
}

void apply_user_intraop_threads() {
  const int user = g_user_threads.load(std::memory_order_relaxed);
  if (user > 0 && at::get_num_threads() != user) {
    at::set_num_threads(user);
  }
}

}  // namespace npusim
