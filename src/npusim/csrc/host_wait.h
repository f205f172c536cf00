// Host waits that Ctrl-C interrupts (header-only: both extensions use it).
//
// Note [Interruptible host waits]
// A host thread waiting for a stream, an event or a collective slept on a
// condition variable until the work was done, so a SIGINT (Ctrl-C), which
// Python acts on only between bytecodes, took effect when the wait ended:
// 67-90 s behind a stalled collective. A wait on a thread that runs Python now
// sleeps in slices of kWaitSlice; after each one it takes the GIL and runs
// Python's pending signal handlers (PyErr_CheckSignals). A handler that raises
// (KeyboardInterrupt) ends the wait with that Python error, which pybind11 and
// PyTorch's bindings hand back to the caller as the exception; the work itself
// goes on, as a GPU's does after an interrupted synchronize. The wait's own
// lock is released while the GIL is taken, so a thread holding the GIL never
// waits for that lock. Threads that never ran Python (stream workers, the comm
// stream, gloo's threads) wait as before and never take the GIL.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace npusim {

constexpr std::chrono::milliseconds kWaitSlice{50};

// Raises the Python error of a signal handler that raised, on a Python thread.
inline void check_python_signals() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (!Py_IsInitialized() || finalizing || PyGILState_GetThisThreadState() == nullptr) {
    return;
  }
  pybind11::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    throw pybind11::error_already_set();
  }
}

// cv.wait / cv.wait_for (timeout_s < 0: no limit) that Ctrl-C interrupts:
// true when `ready`, false at the timeout. `lock` holds the cv's mutex.
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
    lock.unlock();
    check_python_signals();  // throws with the lock released: the unique_lock then owns nothing
    lock.lock();
  }
  return true;
}

}  // namespace npusim
