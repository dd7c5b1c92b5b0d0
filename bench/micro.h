// What the micro-benchmarks (qksoftmax-step, qksoftmax-exchange, qksoftmax-wgmma) share: the device, a stream,
// cuBLAS and the ceilings, measured first in the same run; a results file that opens with the GPU, the time
// and the cuBLAS bf16 rate; the exit status.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

#include "ceilings.h"
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

// The process's exit status for r, its message on stderr after the program's name.
int micro_exit(const char* program, const Result& r);

}  // namespace qkbench
