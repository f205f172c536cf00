// The intra-op thread count of npu kernels on autograd's device thread
// (intraop_threads.cpp; Note [Intra-op threads of autograd's npu thread]).
#pragma once

#include <cstdint>

namespace npusim {

// Called by every fallback op before its CPU kernel runs: outside a
// backward pass it records the calling thread's intra-op thread count; inside
// one it applies the recorded count to the calling thread when they differ.
void follow_user_intraop_threads();

// The cores this process may run on (its affinity mask), read once.
int usable_cores();

// The team a stream worker runs a kernel over `elements` elements with,
// given the user's count: Note [A core for the host].
int worker_intraop_threads(int user, int64_t elements);

// Called by a stream worker before it runs an op's CPU kernel whose largest
// tensor holds `elements` elements: applies the user's count
// (recorded on the host by follow_user_intraop_threads), less a core for the
// host for a small kernel, to the worker when it differs.
void apply_user_intraop_threads(int64_t elements);

// Device work the host does in place (Note [Work on an idle stream]) runs
// with the team a stream worker would give it: the calling thread's count,
// less a core for a small kernel; the thread's own count is restored after.
class DeviceWorkThreads {
 public:
  explicit DeviceWorkThreads(int64_t elements);
  ~DeviceWorkThreads();
  DeviceWorkThreads(const DeviceWorkThreads&) = delete;
  DeviceWorkThreads& operator=(const DeviceWorkThreads&) = delete;

 private:
  int restore_ = 0;  // the thread's count, when it was changed
};

}  // namespace npusim
