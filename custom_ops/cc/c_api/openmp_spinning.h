// Throttles the spinning of a host framework's OpenMP (libgomp) workers: PyTorch's.
//
// After each parallel region, libgomp's idle workers spin before they sleep: about 300,000 spins
// (milliseconds) by default, about 100 when the process holds more libgomp threads than it has CPUs
// (libgomp's documented throttled spin count, GOMP_SPINCOUNT), none with OMP_WAIT_POLICY=PASSIVE.
// On a machine whose cores other processes use, the default spinning takes the cores from the
// threads that have work, at every PyTorch op: one YosoAttention layer's forward+backward on PyTorch
// took 1.5-3x longer than with OMP_WAIT_POLICY=PASSIVE, the README quick start up to 10x
// (docs/benchmarks.md, "A busy machine"). libgomp reads that variable once, when PyTorch loads it,
// so keras_yoso cannot set it; it can make libgomp see more threads than CPUs: one parallel region
// of `num_threads` threads, opened by a detached thread, whose members sleep forever. They hold no
// CPU; libgomp's workers then spin briefly and sleep, as if the wait policy were passive.
#ifndef KERAS_YOSO_C_API_OPENMP_SPINNING_H_
#define KERAS_YOSO_C_API_OPENMP_SPINNING_H_

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace keras_yoso {

// libgomp's GOMP_parallel, what `#pragma omp parallel` compiles to: runs fn(data) on a team of
// num_threads threads (the caller among them) and returns when every member has.
using ParallelRegion = void (*)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);

// A team member's body: sleeps forever (the mutex and condition are never destroyed, so the members
// may outlive main()).
inline void SleepForever(void*) {
  static std::mutex* mutex = new std::mutex();
  static std::condition_variable* never = new std::condition_variable();
  std::unique_lock<std::mutex> lock(*mutex);
  for (;;) never->wait(lock);
}

// Once per process: opens the sleeping region of `num_threads` threads on `region`'s runtime.
// Returns true when this call opened it (false: already open, or nothing to do).
inline bool ThrottleOpenMPSpinning(ParallelRegion region, int num_threads) {
  static std::atomic<bool> opened{false};
  if (region == nullptr || num_threads < 1 || opened.exchange(true)) return false;
  std::thread([region, num_threads] { region(&SleepForever, nullptr, static_cast<unsigned>(num_threads), 0); })
      .detach();
  return true;
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_C_API_OPENMP_SPINNING_H_
