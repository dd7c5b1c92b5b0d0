#include "micro.h"

#include <ctime>

namespace qkbench {

Result start_micro(MicroRun* run) {
  QKB_TRY(device_info(&run->info));
  QKB_TRY(create_stream(&run->stream));
  QKB_TRY(create_cublas(run->stream.get(), &run->cublas));
  return measure_ceilings(run->stream.get(), run->cublas.get(), &run->ceilings);
}

Result open_micro_json(const std::string& path, const MicroRun& run, std::FILE** file) {
  *file = std::fopen(path.c_str(), "w");
  if (*file == nullptr) return Result("cannot write " + path);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::fprintf(*file, "{\"gpu\": \"%s\", \"date\": \"%s\", \"bf16_TFLOPs\": %.1f", run.info.name.c_str(), date,
               run.ceilings.bf16_TFLOPs);
  return {};
}

int micro_exit(const char* program, const Result& r) {
  if (r.ok()) return 0;
  std::fprintf(stderr, "%s: %s\n", program, r.message().c_str());
  return 1;
}

}  // namespace qkbench
