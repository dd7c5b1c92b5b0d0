// The results file of docs/SPEC.md, section 7.
#pragma once

#include <string>

#include "result.h"
#include "results.h"

namespace qkbench {

// {"gpu", "date", "ceilings": {copy_GBps, write_GBps, l2_read_GBps, l2_reduce_GBps, bf16_TFLOPs, fp16_TFLOPs,
//                              tf32_TFLOPs, fp32_TFLOPs},
//  "runs": [{"suite", "mode", "dtype", "impl", "mean_us", "sol_pct",
//            "cases": [{"B", "H", "S", "D", "us", "sol_us", + extras}]}], + extras}
// Numbers that are absent or not finite are written as null. Creates the file's folder if needed.
Result write_json(const Report& report, const std::string& path);

}  // namespace qkbench
