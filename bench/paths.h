// The two ways the bench runs: on a CUDA GPU (ceilings, qksoftmax and the cuBLAS baseline, checked and
// timed), or on the CPU backend alone (no GPU, or --cpu).
#pragma once

#include "cli.h"
#include "result.h"
#include "results.h"

namespace qkbench {

// Number of CUDA devices (0 when the runtime finds none or fails to start, or without CUDA).
int cuda_device_count();

// Fills report (environment and runs). A Result error means the run could not start (no results).
Result run_gpu(const CliOptions& options, Report* report);
Result run_cpu(const CliOptions& options, Report* report);

}  // namespace qkbench
