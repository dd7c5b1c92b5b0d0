#include "cli.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <map>
#include <string_view>

namespace qkbench {
namespace {

constexpr int kDefaultRuns = 30;
constexpr int kMinRuns = 20;
constexpr int kDefaultWarmup = 5;
constexpr int kMinWarmup = 3;
constexpr int kShapeFields = 4;  // B,H,S,D

bool parse_int(std::string_view text, int64_t* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end;
}

Result parse_shape(std::string_view text, Shape* shape) {
  int64_t fields[kShapeFields] = {};
  size_t start = 0;
  for (int i = 0; i < kShapeFields; ++i) {
    const size_t comma = text.find(',', start);
    const bool last = i == kShapeFields - 1;
    if (last != (comma == std::string_view::npos) || !parse_int(text.substr(start, comma - start), &fields[i]) ||
        fields[i] < 1)
      return Result("--case wants B,H,S,D (four integers >= 1), got '" + std::string(text) + "'");
    start = comma + 1;
  }
  *shape = {fields[0], fields[1], fields[2], fields[3]};
  return {};
}

Result parse_count(std::string_view flag, std::string_view text, int minimum, int* value) {
  int64_t v = 0;
  if (!parse_int(text, &v) || v < minimum || v > INT32_MAX)
    return Result(std::string(flag) + " wants an integer >= " + std::to_string(minimum) + ", got '" +
                  std::string(text) + "'");
  *value = int(v);
  return {};
}

// "all" (every value), or values by name separated by commas ("bf16,fp16"), in the order given.
template <typename T, size_t N>
Result parse_one_or_all(std::string_view flag, std::string_view text, const T (&all)[N],
                        std::optional<T> (*parse)(std::string_view), const char* (*name_of)(T), std::vector<T>* out) {
  if (text == "all") {
    out->assign(std::begin(all), std::end(all));
    return {};
  }
  std::vector<T> values;
  for (size_t begin = 0;;) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::optional<T> value = parse(text.substr(begin, end - begin));
    if (!value) {
      std::string choices;
      for (T v : all) choices += std::string(name_of(v)) + "|";
      return Result(std::string(flag) + " wants " + choices + "all or a comma-separated list, got '" +
                    std::string(text) + "'");
    }
    if (std::find(values.begin(), values.end(), *value) == values.end()) values.push_back(*value);
    if (end == text.size()) break;
    begin = end + 1;
  }
  *out = std::move(values);
  return {};
}

Result parse_impls(std::string_view text, std::vector<std::string>* impls) {
  if (text == "all")
    *impls = {kImplQkSoftmax, kImplQkSoftmaxDeterministic, kImplCublasUnfused};
  else if (text == kImplQkSoftmax || text == kImplQkSoftmaxDeterministic || text == kImplCublasUnfused)
    *impls = {std::string(text)};
  else
    return Result("--impl wants qksoftmax|qksoftmax_deterministic|cublas_unfused|all, got '" + std::string(text) + "'");
  return {};
}

std::string join_command(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i) command += ' ';
    command += argv[i];
  }
  return command;
}

}  // namespace

std::string bench_source_dir() { return QKSOFTMAX_BENCH_SOURCE_DIR; }

std::string usage() {
  return "usage: qksoftmax-bench [options]\n"
         "  --suite seed16|long|all   shapes to run (default seed16)\n"
         "  --case B,H,S,D            one shape instead of a suite (repeatable)\n"
         "  --mode forward|recompute|recompute_lse|saved_p|all   (default all; a comma-separated list)\n"
         "  --dtype bf16|fp16|fp32|all                           (default bf16; a comma-separated list)\n"
         "  --impl qksoftmax|qksoftmax_deterministic|cublas_unfused|all   (default all)\n"
         "  --no-baseline             same as --impl qksoftmax\n"
         "  --no-mask                 no mask (default causal)\n"
         "  --json PATH               results file (default " + bench_source_dir() + "/results/latest.json)\n"
         "  --runs N                  timed calls per case, median reported (>= 20, default 30)\n"
         "  --warmup N                untimed calls first (>= 3, default 5)\n"
         "  --inject-error            perturb the outputs of the checked call: every case must FAIL\n"
         "  --time-failed             time the cases whose check fails too (diagnostic builds that leave work\n"
         "                            out); they stay failed\n"
         "  --cpu                     run the CPU backend (as when no CUDA GPU is found)\n"
         "  --plot                    run python3 plot.py on the JSON afterwards\n"
         "  --help\n";
}

Result parse_cli(int argc, char** argv, CliOptions* out) {
  CliOptions o;
  o.runs = kDefaultRuns;
  o.warmup = kDefaultWarmup;
  o.modes.assign(std::begin(kAllModes), std::end(kAllModes));
  o.dtypes = {DType::kBFloat16};
  o.impls = {kImplQkSoftmax, kImplQkSoftmaxDeterministic, kImplCublasUnfused};
  o.json_path = bench_source_dir() + "/results/latest.json";
  o.command = join_command(argc, argv);

  const std::map<std::string_view, std::function<void()>> switches = {
      {"--no-mask", [&] { o.mask = Mask::kNone; }},
      {"--inject-error", [&] { o.inject_error = true; }},
      {"--time-failed", [&] { o.time_failed = true; }},
      {"--cpu", [&] { o.force_cpu = true; }},
      {"--no-baseline", [&] { o.impls = {kImplQkSoftmax}; }},
      {"--plot", [&] { o.plot = true; }},
      {"--help", [&] { o.help = true; }},
      {"-h", [&] { o.help = true; }},
  };
  const std::map<std::string_view, std::function<Result(std::string_view)>> valued = {
      {"--suite", [&](std::string_view v) {
         if (suites_named(v).empty()) return Result("--suite wants seed16|long|all, got '" + std::string(v) + "'");
         o.suite = v;
         o.suite_given = true;
         return Result();
       }},
      {"--case", [&](std::string_view v) {
         Shape shape;
         QKB_TRY(parse_shape(v, &shape));
         o.cases.push_back(shape);
         return Result();
       }},
      {"--mode", [&](std::string_view v) {
         return parse_one_or_all("--mode", v, kAllModes, parse_mode, mode_name, &o.modes);
       }},
      {"--dtype", [&](std::string_view v) {
         return parse_one_or_all("--dtype", v, kAllDTypes, parse_dtype, dtype_short_name, &o.dtypes);
       }},
      {"--impl", [&](std::string_view v) { return parse_impls(v, &o.impls); }},
      {"--json", [&](std::string_view v) {
         o.json_path = v;
         return Result();
       }},
      {"--runs", [&](std::string_view v) { return parse_count("--runs", v, kMinRuns, &o.runs); }},
      {"--warmup", [&](std::string_view v) { return parse_count("--warmup", v, kMinWarmup, &o.warmup); }},
  };

  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (auto s = switches.find(arg); s != switches.end()) {
      s->second();
      continue;
    }
    auto v = valued.find(arg);
    if (v == valued.end()) return Result("unknown argument '" + std::string(arg) + "'");
    if (i + 1 == argc) return Result(std::string(arg) + " needs a value");
    QKB_TRY(v->second(argv[++i]));
  }
  *out = std::move(o);
  return {};
}

}  // namespace qkbench
