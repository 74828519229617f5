// The native library's own CPU thread pool: the ParallelFor of yoso_cpu.h for callers that
// bring none (the C ABI, so JAX and PyTorch). TensorFlow's op kernels use TF's pool instead.
//
// One process-wide pool of worker threads, grown on demand to the largest thread count asked
// for. A call splits [0, units) into contiguous chunks that the calling thread and up to
// num_threads - 1 workers take in turn; it returns when every chunk is done. Several callers
// may run at once (their chunks share the workers), and a caller never waits for a worker to
// become free: it works through the chunks itself. yoso_cpu.h's units write disjoint outputs,
// so the result does not depend on which thread ran a chunk. An exception from a chunk is rethrown
// to the caller once every chunk is done.
#ifndef KERAS_YOSO_C_API_THREAD_POOL_H_
#define KERAS_YOSO_C_API_THREAD_POOL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace keras_yoso {

class ThreadPool {
 public:
  static ThreadPool& Global() {
    static ThreadPool* pool = new ThreadPool();  // never destroyed: workers may outlive main()
    return *pool;
  }

  static int HardwareThreads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }

  // Runs fn(begin, end) over [0, units) with at most num_threads threads (<= 0: every core).
  // Work below kMinParallelCost in total runs on the calling thread alone.
  void ParallelFor(int64_t units, int64_t cost_per_unit, int num_threads,
                   const std::function<void(int64_t, int64_t)>& fn) {
    if (units <= 0) return;
    if (num_threads <= 0) num_threads = HardwareThreads();
    const double total = static_cast<double>(units) * static_cast<double>(cost_per_unit);
    const int64_t by_cost = static_cast<int64_t>(total / kMinParallelCost) + 1;
    const int64_t threads = std::min<int64_t>({num_threads, units, by_cost});
    if (threads <= 1) {
      fn(0, units);
      return;
    }
    // Four chunks a thread balance uneven units without much scheduling.
    auto call = std::make_shared<Call>();
    call->units = units;
    call->chunks = std::min<int64_t>(units, threads * 4);
    call->fn = &fn;
    EnsureWorkers(static_cast<int>(threads) - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int64_t t = 1; t < threads; ++t) queue_.push_back(call);
    }
    wake_.notify_all();
    Work(call.get());
    std::unique_lock<std::mutex> lock(call->mutex);
    call->finished.wait(lock, [&] { return call->done == call->chunks; });
    if (call->error) std::rethrow_exception(call->error);
  }

 private:
  // Below this many cost units (about one cost unit a multiply-add) threads cost more than
  // they save.
  static constexpr double kMinParallelCost = 20000.0;

  struct Call {
    int64_t units = 0, chunks = 0;
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    std::atomic<int64_t> next{0};
    int64_t done = 0;          // guarded by mutex
    std::exception_ptr error;  // the first chunk's exception; guarded by mutex
    std::mutex mutex;
    std::condition_variable finished;
  };

  // Takes chunks of `call` until none is left. fn is only touched while a chunk is taken, and
  // the caller returns only after every taken chunk is done, so fn outlives its use.
  static void Work(Call* call) {
    for (;;) {
      const int64_t chunk = call->next.fetch_add(1);
      if (chunk >= call->chunks) return;
      const int64_t begin = call->units * chunk / call->chunks;
      const int64_t end = call->units * (chunk + 1) / call->chunks;
      std::exception_ptr error;
      try {
        (*call->fn)(begin, end);
      } catch (...) {  // a worker must not let it escape (std::terminate), nor the caller before the rest
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(call->mutex);
      if (error && !call->error) call->error = error;
      if (++call->done == call->chunks) call->finished.notify_all();
    }
  }

  void EnsureWorkers(int wanted) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (static_cast<int>(workers_.size()) < wanted) {
      workers_.emplace_back([this] { Loop(); });
      workers_.back().detach();
    }
  }

  void Loop() {
    for (;;) {
      std::shared_ptr<Call> call;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return !queue_.empty(); });
        call = std::move(queue_.front());
        queue_.pop_front();
      }
      Work(call.get());
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Call>> queue_;
  std::vector<std::thread> workers_;
};

// The ParallelFor callable yoso_cpu.h takes, bound to a thread count.
struct PoolParallelFor {
  int num_threads;
  void operator()(int64_t units, int64_t cost_per_unit,
                  const std::function<void(int64_t, int64_t)>& fn) const {
    ThreadPool::Global().ParallelFor(units, cost_per_unit, num_threads, fn);
  }
};

}  // namespace keras_yoso

#endif  // KERAS_YOSO_C_API_THREAD_POOL_H_
