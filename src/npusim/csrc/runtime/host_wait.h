// Host waits that Ctrl-C interrupts (header-only: both extensions use it).
//
// Note [Interruptible host waits]
// A host thread waiting for a stream, an event or a collective slept on a
// condition variable until the work was done, so a SIGINT (Ctrl-C), which
// Python acts on only between bytecodes, took effect when the wait ended:
// 67-90 s behind a stalled collective. A wait now sleeps in slices of
// kWaitSlice and, after each one, calls the interrupt check that the Python
// bindings install (python/runtime_bindings.cpp; the collective backend gets
// the same function through the core API table): on a thread that runs
// Python it takes the GIL and runs Python's pending signal handlers
// (PyErr_CheckSignals), and a handler that raises (KeyboardInterrupt) ends the
// wait with that Python error, which pybind11 and PyTorch's bindings hand back
// to the caller; the work itself goes on, as a GPU's does after an
// interrupted synchronize. The wait's own lock is released during the check,
// so a thread holding the GIL never waits for that lock. Threads that never
// ran Python (stream workers, the comm stream, gloo's threads) return from the
// check at once. This floor knows nothing of Python: without an installed
// check (a runtime built alone) waits are not interruptible.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace npusim {

constexpr std::chrono::milliseconds kWaitSlice{50};

// One turn of a spin-wait: the CPU's hint that this thread spins.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Throws to end a host wait (e.g. a pending KeyboardInterrupt); returns otherwise.
using HostWaitInterrupt = void (*)();
// One per extension (an inline variable): each binding module installs it.
inline std::atomic<HostWaitInterrupt> g_host_wait_interrupt{nullptr};
inline void set_host_wait_interrupt(HostWaitInterrupt check) {
  g_host_wait_interrupt.store(check, std::memory_order_release);
}

// cv.wait / cv.wait_for (timeout_s < 0: no limit) that the interrupt check can
// end: true when `ready`, false at the timeout. `lock` holds the cv's mutex.
template <class Ready>
bool wait_on_host(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, double timeout_s, Ready ready) {
  using Clock = std::chrono::steady_clock;
  const bool bounded = timeout_s >= 0;
  const Clock::time_point deadline = Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(bounded ? timeout_s : 0.0));
  while (!ready()) {
    Clock::time_point until = Clock::now() + kWaitSlice;
    if (bounded && deadline < until) {
      until = deadline;
    }
    if (cv.wait_until(lock, until, ready)) {
      return true;
    }
    if (bounded && Clock::now() >= deadline) {
      return false;
    }
    if (const HostWaitInterrupt check = g_host_wait_interrupt.load(std::memory_order_acquire)) {
      lock.unlock();
      check();  // throws with the lock released: the unique_lock then owns nothing
      lock.lock();
    }
  }
  return true;
}

}  // namespace npusim
