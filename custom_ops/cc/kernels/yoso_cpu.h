// CPU algorithms of the keras-yoso ops: plain C++ templates over raw pointers.
// No TensorFlow include; the TF wrappers (yoso_kernels.cc) pass a ParallelFor
// that runs on TF's worker pool.
//
// ParallelFor is any callable `pf(int64_t units, int64_t cost_per_unit,
// std::function<void(int64_t begin, int64_t end)>)` that runs every unit in
// [0, units) exactly once. Each unit writes a disjoint part of the output (or,
// in WeightedLshCumulationCpu, of a partial sum that a second pass adds in a
// fixed order), and the split into units depends on the shapes only, so every
// element is summed in the same order and results are bitwise identical for any
// number of threads. Element type T is float, Eigen::half or Eigen::bfloat16
// (anything with static_cast to and from float); all sums are float32.
//
// The hot loops (KY_CPU_CLONES) are compiled for x86-64-v4 (AVX-512),
// x86-64-v3 (AVX2 + FMA) and baseline x86-64, and the best one for the CPU is
// picked at load time (GCC function multiversioning); the rest of the library
// stays baseline. The hash codes and LshCumulationCpu give the same bits on
// every version; WeightedLshCumulationCpu may differ in the last bits between
// CPUs of different levels (fused multiply-adds), never between runs on one.
// Define KY_NO_CLONES to build the baseline version only (e.g. for toolchains
// without ifunc support).
#ifndef KERAS_YOSO_KERNELS_YOSO_CPU_H_
#define KERAS_YOSO_KERNELS_YOSO_CPU_H_

// One header per kernel family.
#include "collision_cpu.h"
#include "hash_cpu.h"
#include "lsh_cpu.h"
#include "weighted_cpu.h"

#endif  // KERAS_YOSO_KERNELS_YOSO_CPU_H_
