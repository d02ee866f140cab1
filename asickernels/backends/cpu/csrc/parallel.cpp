// A small persistent thread pool: threads block on a condition variable between calls (no
// spinning, so an idle pool costs nothing on a shared machine) and are created on the first
// parallel call that needs them.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels.h"

namespace asickernels_cpu {
namespace {

class ThreadPool {
 public:
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  int max_threads() const { return max_threads_.load(); }

  void set_max_threads(int threads) {
    const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    max_threads_.store(std::clamp(threads, 1, hardware));
  }

  void run(int64_t count, const std::function<void(int64_t)>& task) {
    const int threads = static_cast<int>(std::min<int64_t>(count, max_threads()));
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (threads <= 1 || !busy.owns_lock()) {
      for (int64_t i = 0; i < count; ++i) task(i);
      return;
    }
    Job job{&task, count, threads - 1};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(workers_.size()) < threads - 1) {
        workers_.emplace_back([this] { work(); });
      }
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    job.drain();
    // Close the job, then wait only for helpers that joined it (they are running): on a
    // busy machine a helper may wake long after the caller has done every task alone.
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = nullptr;
    done_.wait(lock, [&] { return job.active == 0; });
  }

 private:
  struct Job {
    const std::function<void(int64_t)>* task;
    int64_t count;
    int helpers_allowed;
    std::atomic<int64_t> next{0};
    int active = 0;  // helpers running it (guarded by mutex_)

    Job(const std::function<void(int64_t)>* t, int64_t c, int h)
        : task(t), count(c), helpers_allowed(h) {}

    void drain() {
      for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) (*task)(i);
    }
  };

  void work() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || (job_ != nullptr && generation_ != seen); });
      if (stopping_) return;
      seen = generation_;
      Job* job = job_;
      if (job->active >= job->helpers_allowed) continue;
      ++job->active;
      lock.unlock();
      job->drain();
      lock.lock();
      if (--job->active == 0) done_.notify_all();
    }
  }

  std::atomic<int> max_threads_{1};
  std::mutex busy_;  // one parallel call at a time; others run serially
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;  // the open job, if any (guarded by mutex_)
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

ThreadPool& pool() {
  static ThreadPool instance;
  return instance;
}

}  // namespace

void parallel_for(int64_t count, const std::function<void(int64_t)>& task) {
  pool().run(count, task);
}

int max_threads() { return pool().max_threads(); }

void set_max_threads(int threads) { pool().set_max_threads(threads); }

}  // namespace asickernels_cpu

extern "C" {

int asickernels_cpu_max_threads() { return asickernels_cpu::max_threads(); }

void asickernels_cpu_set_max_threads(int threads) { asickernels_cpu::set_max_threads(threads); }

}  // extern "C"
