#include "comm_stream.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <thread>

// Note [Comm stream]
// NCCL runs each process group's collectives on one internal stream, in issue
// order, after the issuing stream's earlier work and without blocking the
// host. npusim's comm stream is a worker thread per backend rather than one of
// the device core's streams: a collective blocks its stream until every peer
// has joined it, and the core's pool streams are shared round-robin with user
// and FSDP streams, so a blocked collective could stall unrelated work and,
// with two groups issued in different orders on different ranks, deadlock.
// Consequence: the core's stream-ordered free does not see this thread, so
// each job keeps its tensors alive until it finishes (NCCL stashes tensors
// for the same reason).
//
// Point-to-point transfers are posted without waiting: gloo's send completes
// only once the peer has posted the matching recv, so two ranks that each
// isend before they irecv would deadlock if the comm stream waited for the
// send. A second thread (the reaper) waits for posted transfers in order, and
// the comm stream waits for all of them before it starts the next collective,
// which is how NCCL orders a group of p2p calls before later collectives.

namespace npusim::dist {

void Completion::set(std::string error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

bool Completion::wait(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout_s < 0) {
    cv_.wait(lock, [&] { return done_; });
    return true;
  }
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return done_; });
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

// Drops the job's captures (tensors, gloo work) before reporting completion.
void finish_job(CommJob& job, const std::string& error) {
  auto finish = std::move(job.finish);
  const std::string what = job.what;
  job = CommJob{};
  finish(error.empty() ? error : what + " failed: " + error);
}

}  // namespace

struct CommStream::State : std::enable_shared_from_this<CommStream::State> {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<CommJob> queue;
  bool stop = false;
  // Posted point-to-point transfers, waited for by the reaper in order.
  std::deque<std::pair<c10::intrusive_ptr<c10d::Work>, CommJob>> posted;
  size_t unfinished_p2p = 0;
  std::condition_variable p2p_cv;
  bool reaper_started = false;
  bool worker_done = false;  // the reaper may only stop after the worker

  void run();
  void reap();
  void wait_p2p_drained();
  void start_reaper();
};

void CommStream::State::run() {
  for (;;) {
    CommJob job;
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) {
        worker_done = true;  // stopped and drained
        p2p_cv.notify_all();
        return;
      }
      job = std::move(queue.front());
      queue.pop_front();
    }
    if (job.inputs_ready) {
      job.inputs_ready->wait(-1.0);
    }
    if (job.post) {
      c10::intrusive_ptr<c10d::Work> work;
      std::string error;
      try {
        work = job.post();
      } catch (const std::exception& e) {
        error = message_of(e);
      }
      if (!work) {
        finish_job(job, error.empty() ? "gloo returned no work" : error);
        continue;
      }
      start_reaper();
      std::lock_guard<std::mutex> lock(mutex);
      ++unfinished_p2p;
      posted.emplace_back(std::move(work), std::move(job));
      p2p_cv.notify_all();
      continue;
    }
    wait_p2p_drained();
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    try {
      job.run();
    } catch (const std::exception& e) {
      error = message_of(e);
    }
    if (job.duration_us > 0) {
      std::this_thread::sleep_until(start +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double, std::micro>(job.duration_us)));
    }
    finish_job(job, error);
  }
}

void CommStream::State::start_reaper() {
  std::lock_guard<std::mutex> lock(mutex);
  if (reaper_started) {
    return;
  }
  reaper_started = true;
  // Holds the state, like the worker: neither thread is ever joined.
  std::thread([self = shared_from_this()] { self->reap(); }).detach();
}

void CommStream::State::reap() {
  for (;;) {
    std::pair<c10::intrusive_ptr<c10d::Work>, CommJob> item;
    {
      std::unique_lock<std::mutex> lock(mutex);
      p2p_cv.wait(lock, [&] { return worker_done || !posted.empty(); });
      if (posted.empty()) {
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
    item.first.reset();
    finish_job(item.second, error);
    {
      std::lock_guard<std::mutex> lock(mutex);
      --unfinished_p2p;
    }
    p2p_cv.notify_all();
  }
}

void CommStream::State::wait_p2p_drained() {
  std::unique_lock<std::mutex> lock(mutex);
  p2p_cv.wait(lock, [&] { return unfinished_p2p == 0; });
}

CommStream::CommStream() : state_(std::make_shared<State>()) {
  // The thread owns a reference to the state, so destroying the backend
  // while a collective is blocked on a peer never frees what it uses.
  std::thread([state = state_] { state->run(); }).detach();
}

CommStream::~CommStream() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->p2p_cv.notify_all();
}

void CommStream::submit(CommJob job) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    TORCH_CHECK(!state_->stop, "npusim: ", job.what, " issued after the backend shut down");
    state_->queue.push_back(std::move(job));
  }
  state_->cv.notify_all();
}

}  // namespace npusim::dist
