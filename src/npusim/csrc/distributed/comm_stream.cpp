#include "comm_stream.h"

#include "../runtime/host_wait.h"
#include "../runtime/stream.h"
#include "../runtime/subnormals.h"
#include "core_api_client.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

// Note [Comm stream]
// NCCL runs each process group's collectives on one internal stream, in issue
// order, after the issuing stream's earlier work and without blocking the
// host. npusim's comm stream is a worker thread per backend rather than one of
// the device core's streams: a collective blocks its stream until every peer
// has joined it, and the core's pool streams are shared round-robin with user
// and FSDP streams, so a blocked collective could stall unrelated work and,
// with two groups issued in different orders on different ranks, deadlock.
// A job holds no tensor (Note [Collectives hold no tensors]); the comm
// stream reports issued and finished jobs to the core's stream-ordered free
// through a FenceCounter, so that a block freed, or swapped out (resize_(0)),
// under a running collective is not reused before the collective is done
// with it.
//
// Note [Collectives hold no tensors]
// A job reaches its tensors through CPU aliases that do not own them, and the
// Work's future holds its outputs weakly until it completes. Until issue 38
// each job held its tensors until it had finished and its captures were
// dropped, on the releaser thread: the last reference to a tensor the host
// had already let go of then fell whenever that thread ran, so the device's
// allocated bytes (max_memory_allocated) depended on this machine's timing
// (rank 0 of a 2-rank FSDP2 step read 12.7 to 18.8 MB over four runs). CUDA's
// figure is a function of the program: a tensor's block counts as free when
// the host drops it, and the caching allocator keeps it from reuse until the
// streams that used it are done (record_stream's events; NCCL's stashed
// tensors are released at the host's wait). npusim does the same: the host's
// free frees the block, and the comm stream's FenceCounter defers its reuse.
// The same step now reads 10.6 MB in every run, on both ranks. A user who
// keeps only a Work's future of an output that nothing else holds gets that
// output dropped from the future's value.
//
// The GIL: dropping the last reference to a tensor that Python created takes
// the GIL, and a host thread may hold the GIL while it waits for a device
// stream that waits for a collective (a Python kernel calling an npu op).
// So the threads that run and complete collectives never drop a job's
// captures; a third thread, the releaser, does it after completion, and
// nothing ever waits for the releaser.
//
// Point-to-point transfers are posted without waiting: gloo's send completes
// only once the peer has posted the matching recv, so two ranks that each
// isend before they irecv would deadlock if the comm stream waited for the
// send. A second thread (the reaper) waits for posted transfers in order, and
// the comm stream waits for all of them before it starts the next collective,
// which is how NCCL orders a group of p2p calls before later collectives.

namespace npusim::dist {

void Completion::set(std::string error, double chip_us) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
    chip_us_ = chip_us;
  }
  cv_.notify_all();
}

double Completion::chip_us() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return chip_us_;
}

bool Completion::wait(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return wait_on_host(cv_, lock, timeout_s, [&] { return done_; });  // Note [Interruptible host waits]
}

bool Completion::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::string Completion::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

namespace {

std::string message_of(const std::exception& e) {
  if (const auto* err = dynamic_cast<const c10::Error*>(&e)) {
    return err->what_without_backtrace();
  }
  return e.what();
}

}  // namespace

struct CommStream::State : std::enable_shared_from_this<CommStream::State> {
  // Jobs issued / finished, for the core's stream-ordered free.
  FenceCounter* fence = core().new_fence_counter();
  std::mutex mutex;
  bool stop = false;
  // comm stream: jobs in issue order
  std::condition_variable cv;
  std::deque<CommJob> queue;
  bool worker_done = false;
  // reaper: posted point-to-point transfers, waited for in order
  std::condition_variable p2p_cv;
  std::deque<std::pair<c10::intrusive_ptr<c10d::Work>, CommJob>> posted;
  size_t unfinished_p2p = 0;
  bool reaper_running = false;
  // releaser: completed jobs whose captures are still to be dropped
  std::condition_variable release_cv;
  std::deque<std::pair<CommJob, std::string>> completed;
  bool releaser_running = false;
  size_t unreleased = 0;  // completed jobs whose captures are not dropped yet
  std::condition_variable released_cv;
  // The comm stream's chip clock (Note [Chip clock]): the end of its last job.
  double clock_us = 0.0;

  void run();
  std::string run_collective(CommJob& job);
  // The job's chip start and end; the comm stream's clock moves to the end.
  std::pair<double, double> place_on_chip_clock(CommJob& job);
  void reap();
  void release();
  void finish(CommJob&& job, const std::string& error, double chip_end_us = 0.0);
  void start(bool& running, void (State::*loop)());
};

void CommStream::State::start(bool& running, void (State::*loop)()) {
  // Caller holds `mutex`. Threads hold the state and are never joined.
  if (!running) {
    running = true;
    std::thread([self = shared_from_this(), loop] {
      set_flush_denormal_bits(0);  // Note [Subnormals on npu]
      ((*self).*loop)();
    }).detach();
  }
}

void CommStream::State::finish(CommJob&& job, const std::string& error, double chip_end_us) {
  const std::string message = error.empty() ? error : job.what + " failed: " + error;
  job.complete(message, chip_end_us);
  {
    std::lock_guard<std::mutex> lock(mutex);
    completed.emplace_back(std::move(job), message);
    ++unreleased;
    // Counted finished together with queueing its release, so that wait_idle
    // never sees it finished but not yet unreleased. Jobs finish in issue
    // order (collectives wait for earlier transfers, the reaper waits for
    // transfers in order), as FenceCounter requires.
    fence->finished.fetch_add(1, std::memory_order_acq_rel);
    start(releaser_running, &State::release);
  }
  release_cv.notify_all();
  core().maybe_reclaim();
}

std::pair<double, double> CommStream::State::place_on_chip_clock(CommJob& job) {
  double ready = std::max(clock_us, job.issue_us);
  if (job.inputs_ready) {
    ready = std::max(ready, job.inputs_ready->chip_us());
  }
  const double start = job.agree_start ? job.agree_start(ready) : ready;
  clock_us = start + job.duration_us;
  return {start, clock_us};
}

std::string CommStream::State::run_collective(CommJob& job) {
  const auto start_time = std::chrono::steady_clock::now();
  std::string error;
  try {
    job.run();
  } catch (const std::exception& e) {
    error = message_of(e);
  }
  if (job.duration_us > 0 && (core().realtime_timing() || !core().chip_clock_on())) {
    std::this_thread::sleep_until(start_time +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double, std::micro>(job.duration_us)));
  }
  return error;
}

void CommStream::State::run() {
  pthread_setname_np(pthread_self(), "npusim comm");
  for (;;) {
    CommJob job;
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) {
        worker_done = true;  // stopped and drained
        p2p_cv.notify_all();
        release_cv.notify_all();
        return;
      }
      job = std::move(queue.front());
      queue.pop_front();
    }
    if (job.inputs_ready) {
      job.inputs_ready->wait(-1.0);
    }
    const bool on_chip_clock = core().chip_clock_on();
    if (job.post) {
      // Point-to-point: placed from this rank's own ready time (the peers' are not exchanged).
      if (on_chip_clock) {
        job.chip_end_us = place_on_chip_clock(job).second;
      }
      c10::intrusive_ptr<c10d::Work> work;
      std::string error;
      try {
        work = job.post();
      } catch (const std::exception& e) {
        error = message_of(e);
      }
      if (!work) {
        finish(std::move(job), error.empty() ? "gloo returned no work" : error);
        continue;
      }
      std::lock_guard<std::mutex> lock(mutex);
      ++unfinished_p2p;
      posted.emplace_back(std::move(work), std::move(job));
      start(reaper_running, &State::reap);
      p2p_cv.notify_all();
      continue;
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      p2p_cv.wait(lock, [&] { return unfinished_p2p == 0; });
    }
    std::string error;
    std::pair<double, double> chip{0.0, 0.0};
    if (on_chip_clock) {
      try {
        chip = place_on_chip_clock(job);
      } catch (const std::exception& e) {
        finish(std::move(job), c10::str("exchanging the chip clock with the group's peers failed: ",
            message_of(e)));
        continue;
      }
    }
    auto run_placed = [&] {
      error = run_collective(job);
      if (on_chip_clock) {
        core().note_task_span(chip.first, chip.second);  // the profiler's activity: Note [Chip clock]
      }
    };
    if (job.profile) {
      core().run_profiled(*job.profile, run_placed);
    } else {
      run_placed();
    }
    job.profile = nullptr;
    finish(std::move(job), error, chip.second);
  }
}

void CommStream::State::reap() {
  for (;;) {
    std::pair<c10::intrusive_ptr<c10d::Work>, CommJob> item;
    {
      std::unique_lock<std::mutex> lock(mutex);
      p2p_cv.wait(lock, [&] { return worker_done || !posted.empty(); });
      if (posted.empty()) {
        reaper_running = false;
        release_cv.notify_all();
        return;
      }
      item = std::move(posted.front());
      posted.pop_front();
    }
    std::string error;
    try {
      item.first->wait();
    } catch (const std::exception& e) {
      error = message_of(e);
    }
    item.first.reset();  // gloo's work holds only CPU views: no GIL needed
    const double chip_end = item.second.chip_end_us;  // placed when it was posted
    finish(std::move(item.second), error, chip_end);
    {
      std::lock_guard<std::mutex> lock(mutex);
      --unfinished_p2p;
    }
    p2p_cv.notify_all();
  }
}

void CommStream::State::release() {
  for (;;) {
    std::pair<CommJob, std::string> item;
    {
      std::unique_lock<std::mutex> lock(mutex);
      release_cv.wait(lock, [&] { return (worker_done && !reaper_running) || !completed.empty(); });
      if (completed.empty()) {
        releaser_running = false;
        return;
      }
      item = std::move(completed.front());
      completed.pop_front();
    }
    if (item.first.release) {
      item.first.release(item.second);
    }
    item = {};  // drops the job's tensors (may take the GIL)
    {
      std::lock_guard<std::mutex> lock(mutex);
      --unreleased;
    }
    released_cv.notify_all();
  }
}

namespace {
// Every comm stream's state, for drain_releases at exit. Leaked on purpose:
// detached threads may outlive static destructors.
std::mutex& g_states_mutex = *new std::mutex();
std::vector<std::weak_ptr<CommStream::State>>& g_states = *new std::vector<std::weak_ptr<CommStream::State>>();
}  // namespace

namespace {

std::vector<std::shared_ptr<CommStream::State>> live_states() {
  std::vector<std::shared_ptr<CommStream::State>> states;
  std::lock_guard<std::mutex> lock(g_states_mutex);
  for (const auto& weak : g_states) {
    if (auto state = weak.lock()) {
      states.push_back(std::move(state));
    }
  }
  return states;
}

std::chrono::steady_clock::time_point deadline_after(double timeout_s) {
  return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(timeout_s));
}

}  // namespace

bool CommStream::drain_releases(double timeout_s) {
  const auto deadline = deadline_after(timeout_s);
  bool drained = true;
  for (auto& state : live_states()) {
    std::unique_lock<std::mutex> lock(state->mutex);
    drained &= state->released_cv.wait_until(lock, deadline, [&] { return state->unreleased == 0; });
  }
  return drained;
}

bool CommStream::wait_idle(double timeout_s) {
  const auto deadline = deadline_after(timeout_s);
  bool idle = true;
  for (auto& state : live_states()) {
    std::unique_lock<std::mutex> lock(state->mutex);
    const uint64_t issued = state->fence->issued.load(std::memory_order_acquire);
    idle &= state->released_cv.wait_until(lock, deadline, [&] {
      return state->fence->finished.load(std::memory_order_acquire) >= issued && state->unreleased == 0;
    });
  }
  return idle;
}

CommStream::CommStream() : state_(std::make_shared<State>()) {
  {
    std::lock_guard<std::mutex> lock(g_states_mutex);
    std::erase_if(g_states, [](const auto& weak) { return weak.expired(); });
    g_states.push_back(state_);
  }
  std::thread([state = state_] {
    set_flush_denormal_bits(0);  // Note [Subnormals on npu]
    state->run();
  }).detach();
}

CommStream::~CommStream() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->cv.notify_all();
}

void CommStream::submit(CommJob job) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    TORCH_CHECK(!state_->stop, "npusim: ", job.what, " issued after the backend shut down");
    state_->fence->issued.fetch_add(1, std::memory_order_acq_rel);
    state_->queue.push_back(std::move(job));
  }
  state_->cv.notify_all();
}

}  // namespace npusim::dist
