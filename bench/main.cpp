// qksoftmax-bench: ceilings, correctness check and timing of qksoftmax (and the unfused cuBLAS baseline)
// under the SOL model of CONTRACT.md section 6; results as CONTRACT.md section 7.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>

#include "cli.h"
#include "json.h"
#include "paths.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr size_t kDateLength = 32;

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[kDateLength];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Runs python3 plot.py on the JSON; a missing python3 or matplotlib is reported, not fatal.
void plot(const std::string& json_path) {
  const std::string script = qkbench::bench_source_dir() + "/plot.py";
  const std::string command = "python3 '" + script + "' '" + json_path + "'";
  if (std::system(command.c_str()) != 0) std::fprintf(stderr, "note: '%s' did not succeed\n", command.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  qkbench::CliOptions options;
  if (qkbench::Result r = qkbench::parse_cli(argc, argv, &options); !r.ok()) {
    std::fprintf(stderr, "qksoftmax-bench: %s\n\n%s", r.message().c_str(), qkbench::usage().c_str());
    return kExitUsage;
  }
  if (options.help) {
    std::printf("%s", qkbench::usage().c_str());
    return kExitOk;
  }

  qkbench::Report report;
  qkbench::Environment& env = report.env;
  env.date = utc_now();
  env.command = options.command;
  env.library_version = qksoftmax::version();
  env.mask = options.mask;
  env.runs = options.runs;
  env.warmup = options.warmup;
  env.inject_error = options.inject_error;

  qkbench::Result run;
  if (options.force_cpu || qkbench::cuda_device_count() == 0) {
    std::printf("%s: running the CPU backend on %s\n", options.force_cpu ? "--cpu" : "no CUDA GPU found",
                options.cases.empty() ? "a small case" : "the given cases");
    run = qkbench::run_cpu(options, &report);
  } else {
    run = qkbench::run_gpu(options, &report);
  }
  if (!run.ok()) {
    std::fprintf(stderr, "qksoftmax-bench: %s\n", run.message().c_str());
    return kExitFailed;
  }

  if (qkbench::Result r = qkbench::write_json(report, options.json_path); !r.ok()) {
    std::fprintf(stderr, "qksoftmax-bench: %s\n", r.message().c_str());
    return kExitFailed;
  }
  std::printf("\nresults: %s\n", std::filesystem::absolute(options.json_path).c_str());
  if (options.plot) plot(options.json_path);

  if (!report.all_passed()) {
    std::printf("some cases FAILED or did not run (see above): no time is reported for them\n");
    return kExitFailed;
  }
  return kExitOk;
}
