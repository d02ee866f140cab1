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
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(workers_.size()) < threads - 1) {
        workers_.emplace_back([this] { work(); });
      }
      task_ = &task;
      count_ = count;
      next_.store(0);
      helpers_wanted_ = threads - 1;
      helpers_running_ = threads - 1;
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return helpers_running_ == 0; });
    task_ = nullptr;
  }

 private:
  void drain() {
    for (int64_t i = next_.fetch_add(1); i < count_; i = next_.fetch_add(1)) (*task_)(i);
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || (generation_ != seen && helpers_wanted_ > 0); });
        if (stopping_) return;
        seen = generation_;
        --helpers_wanted_;
      }
      drain();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --helpers_running_;
      }
      done_.notify_one();
    }
  }

  std::atomic<int> max_threads_{1};
  std::mutex busy_;  // one parallel call at a time; others run serially
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0};
  int helpers_wanted_ = 0, helpers_running_ = 0;
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
