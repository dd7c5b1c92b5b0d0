#include "json.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace qkbench {
namespace {

constexpr double kPercent = 100;

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string number(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return "null";
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, *v);
  return ec == std::errc() ? std::string(buf, end) : "null";
}

// Writes "key": value pairs separated by commas, inside braces.
class Object {
 public:
  explicit Object(std::ostream& out, int indent) : out_(out), indent_(indent) { out_ << "{"; }
  ~Object() {
    if (!first_) out_ << "\n" << std::string(size_t(indent_), ' ');
    out_ << "}";
  }

  std::ostream& key(const std::string& name) {
    out_ << (first_ ? "\n" : ",\n") << std::string(size_t(indent_ + 1), ' ') << quote(name) << ": ";
    first_ = false;
    return out_;
  }

 private:
  std::ostream& out_;
  int indent_;
  bool first_ = true;
};

void write_ceilings(std::ostream& out, const std::optional<Ceilings>& c, int indent) {
  auto value = [&](double Ceilings::* field) { return c ? number((*c).*field) : "null"; };
  Object o(out, indent);
  o.key("copy_GBps") << value(&Ceilings::copy_GBps);
  o.key("write_GBps") << value(&Ceilings::write_GBps);
  o.key("l2_read_GBps") << value(&Ceilings::l2_read_GBps);
  o.key("l2_reduce_GBps") << value(&Ceilings::l2_reduce_GBps);
  o.key("bf16_TFLOPs") << value(&Ceilings::bf16_TFLOPs);
  o.key("fp16_TFLOPs") << value(&Ceilings::fp16_TFLOPs);
  o.key("tf32_TFLOPs") << value(&Ceilings::tf32_TFLOPs);
  o.key("fp32_TFLOPs") << value(&Ceilings::fp32_TFLOPs);
}

// One case on one line.
void write_case(std::ostream& out, const CaseResult& c) {
  std::ostringstream errors;
  errors << "{";
  for (size_t i = 0; i < c.errors.size(); ++i)
    errors << (i ? ", " : "") << quote(c.errors[i].name) << ": " << number(c.errors[i].rel_error);
  errors << "}";
  const bool timed = c.us.has_value();
  out << "{\"B\": " << c.shape.B << ", \"H\": " << c.shape.H << ", \"S\": " << c.shape.S << ", \"D\": " << c.shape.D
      << ", \"us\": " << number(c.us) << ", \"host_us\": " << number(c.host_us) << ", \"sol_us\": " << number(c.sol_us)
      << ", \"sol_pct\": " << number(timed && c.sol_us ? std::optional(kPercent * *c.sol_us / *c.us) : std::nullopt)
      << ", \"bytes\": " << number(c.cost.bytes) << ", \"flops\": " << number(c.cost.flops)
      << ", \"copies\": " << c.copies << ", \"err\": " << errors.str()
      << ", \"error\": " << (c.passed() ? "null" : quote(c.failure)) << "}";
}

void write_run(std::ostream& out, const RunResult& run, int indent) {
  const Aggregate a = aggregate(run);
  Object o(out, indent);
  o.key("suite") << quote(run.suite);
  o.key("mode") << quote(mode_name(run.mode));
  o.key("dtype") << quote(dtype_short_name(run.dtype));
  o.key("impl") << quote(run.impl);
  o.key("mean_us") << number(a.mean_us);
  o.key("sol_pct") << number(a.sol_pct);
  std::ostream& cases = o.key("cases");
  const std::string pad(size_t(indent + 2), ' ');
  cases << "[";
  for (size_t i = 0; i < run.cases.size(); ++i) {
    cases << (i ? ",\n" : "\n") << pad;
    write_case(cases, run.cases[i]);
  }
  cases << "\n" << std::string(size_t(indent + 1), ' ') << "]";
}

void write_report(std::ostream& out, const Report& report) {
  const Environment& env = report.env;
  constexpr int kTop = 0, kNested = 1, kRun = 2;
  Object o(out, kTop);
  o.key("gpu") << quote(env.gpu);
  o.key("date") << quote(env.date);
  write_ceilings(o.key("ceilings"), env.ceilings, kNested);
  o.key("command") << quote(env.command);
  o.key("mask") << quote(env.mask == Mask::kCausal ? "causal" : "none");
  o.key("runs_per_case") << env.runs;
  o.key("warmup") << env.warmup;
  o.key("inject_error") << (env.inject_error ? "true" : "false");
  o.key("l2_bytes") << env.l2_bytes;
  o.key("sms") << env.sms;
  o.key("cuda_runtime") << quote(env.cuda_runtime);
  o.key("qksoftmax_version") << quote(env.library_version);
  std::ostream& runs = o.key("runs");
  runs << "[";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    runs << (i ? ", " : "");
    write_run(runs, report.runs[i], kRun);
  }
  runs << "]";
}

}  // namespace

Result write_json(const Report& report, const std::string& path) {
  std::error_code ec;
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (!folder.empty()) std::filesystem::create_directories(folder, ec);
  if (ec) return Result("cannot create " + folder.string() + ": " + ec.message());
  std::ofstream out(path);
  if (!out) return Result("cannot write " + path);
  write_report(out, report);
  out << "\n";
  out.close();
  if (!out) return Result("writing " + path + " failed");
  return {};
}

}  // namespace qkbench
