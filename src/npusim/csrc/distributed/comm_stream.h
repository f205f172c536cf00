// The comm stream of a collective backend: a worker thread that runs one
// group's collectives in issue order. See Note [Comm stream].
#pragma once

#include "../runtime/trace.h"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace npusim::dist {

// A one-shot flag with an optional error. Device tasks capture this instead
// of the Work so that a stream worker never holds the Work's tensors.
class Completion {
 public:
  // chip_us: when it completed on the chip clock (Note [Chip clock]).
  void set(std::string error = {}, double chip_us = 0.0);
  double chip_us() const;
  // timeout_s < 0 waits forever; false on timeout.
  bool wait(double timeout_s) const;
  bool done() const;
  // Empty while running or on success.
  std::string error() const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
  double chip_us_ = 0.0;
};

struct CommJob {
  // Set by a task on the issuing stream once the work issued there before
  // the collective has run; null when that stream was idle at issue time.
  std::shared_ptr<Completion> inputs_ready;
  // A collective: runs it to completion (blocking; throws on failure).
  std::function<void()> run;
  // A point-to-point transfer: posts it and returns gloo's work unwaited.
  std::function<c10::intrusive_ptr<c10d::Work>()> post;
  // Called once on the comm stream's thread with "" or the error message,
  // as soon as the transfer has finished. Must not need the GIL: a host
  // thread holding it may be waiting for exactly this (see Note [Comm stream]).
  std::function<void(const std::string&, double chip_us)> complete;
  // Called afterwards, with the same message, on a separate release thread
  // that then drops every capture of the job; may take the GIL.
  std::function<void(const std::string&)> release;
  // The collective's chip time (timing model; Note [Chip clock]).
  double duration_us = 0.0;
  // The host's chip clock when it was issued, and (point-to-point) the chip
  // time its transfer ends, set when the comm stream places it.
  double issue_us = 0.0;
  double chip_end_us = 0.0;
  // Under the chip clock: the latest of every participant's ready time, from
  // this rank's (a max all-reduce over the group); null for point-to-point.
  std::function<double(double ready_us)> agree_start;
  // "all_reduce on npu:0 (rank 0 of 2)", for error messages.
  std::string what;
  // Set when issued under torch.profiler: the collective is a device activity
  // on its device's collectives row (Note [Device tasks in torch.profiler]).
  std::shared_ptr<TaskProfile> profile;
};

class CommStream {
 public:
  CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;
  // Queued jobs still run; the threads end when the queues are drained.
  ~CommStream();

  void submit(CommJob job);

  // Waits (at most timeout_s) until every comm stream of the process has
  // released the captures of its completed jobs. Called at exit with the GIL
  // released: a thread that takes the GIL while Python finalizes aborts it.
  static bool drain_releases(double timeout_s);

  // Waits (at most timeout_s) until every job issued so far on every comm
  // stream has finished and dropped its tensors; false on timeout. Called
  // with the GIL released (the release thread may need it).
  static bool wait_idle(double timeout_s);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace npusim::dist
