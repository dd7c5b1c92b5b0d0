// What the micro-benchmarks (qksoftmax-step, qksoftmax-exchange, qksoftmax-wgmma) share: the device, a stream,
// cuBLAS and the ceilings, measured first in the same run; a results file that opens with the GPU, the time
// and the cuBLAS bf16 rate; the exit status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ceilings.h"
#include "cuda_check.h"
#include "gpu.h"
#include "result.h"

namespace qkbench {

struct MicroRun {
  DeviceInfo info;
  Stream stream;
  Cublas cublas;
  Ceilings ceilings;
};

Result start_micro(MicroRun* run);

// Opens path for writing and writes `{"gpu": ..., "date": ..., "bf16_TFLOPs": ...` (no separator after it: the
// caller writes ", " and the rest, and closes the file).
Result open_micro_json(const std::string& path, const MicroRun& run, std::FILE** file);

// Writes `, "key": [`, n objects one per line (entry(f, i) prints object i, braces included) and `\n]`.
template <class Entry>
void write_json_list(std::FILE* f, const char* key, size_t n, Entry&& entry) {
  std::fprintf(f, ", \"%s\": [", key);
  for (size_t i = 0; i < n; ++i) {
    std::fprintf(f, "%s\n  ", i ? "," : "");
    entry(f, i);
  }
  std::fprintf(f, "\n]");
}

inline constexpr double kMicro = 1e-6;  // seconds per µs
inline constexpr double kTera = 1e12;

// The bits of bf16 1.0: the step benchmarks' operands (the values do not change a kernel's schedule; finite, not
// zero).
inline constexpr uint16_t kBf16One = 0x3F80;

// n copies of value into device memory at ptr. The copy is from pageable memory: it has left the host buffer when
// the call returns.
template <class T>
Result fill_value(void* ptr, size_t n, T value, cudaStream_t stream) {
  const std::vector<T> host(n, value);
  return cuda_result(cudaMemcpyAsync(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice, stream),
                     "cudaMemcpyAsync");
}

// The process's exit status for r, its message on stderr after the program's name.
int micro_exit(const char* program, const Result& r);

}  // namespace qkbench
