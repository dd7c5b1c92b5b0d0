// API fuzzing of the C++ entry points: forward, backward and their workspace-size queries.
//
// Each iteration builds a call at random: shapes, dtypes, masks, modes and strides of every kind the API takes
// (permuted, padded, broadcast inputs, size-1 dimensions with any stride, element-aligned bases off 16 bytes,
// inputs aliasing each other), then spoils it in zero or more ways: null, misaligned and aliased pointers,
// wrong ranks, shapes, dtypes and devices, negative, zero and colliding strides, sizes at and past 2^31 and
// 2^32 (over buffers far too small for them), bad options and workspaces, descriptors of one device over memory
// of another. The API's rules are checked here independently of the library's validation, and:
//   - every call returns a Status with one of Code's values; a refusal names (at the start of its message)
//     an argument that breaks a rule, with that rule's code;
//   - a call that breaks a rule is refused, and every byte of every buffer (poisoned where no value belongs)
//     is as before; the size query refuses it with the same status, unless only the call can tell;
//   - a call that breaks no rule is accepted: it writes every element of its outputs and nothing else, and
//     gives what the same call gives on contiguous copies of its inputs (host: bit for bit; CUDA: the CPU
//     backend's result within the accuracy bound);
//   - a valid call whose descriptors reach past their buffers goes to the size query only, which reads no
//     tensor memory.
// A crash or a hang is a failure of the program itself.
//
//   qksoftmax_fuzz [--device cpu|cuda] [--iterations N] [--seconds T] [--seed S] [--json FILE] [--verbose]
//
// --seconds ends the run after T seconds even if fewer than N iterations were made (the report and the JSON
// file count the iterations made), so that a run on the GPU machine fits a time budget.
//
// Exit status: 0 when every outcome was as expected, 1 otherwise, 2 when the program could not run.
#include <algorithm>
#include <array>
#include <cfloat>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dtype.h"
#include "qksoftmax/qksoftmax.h"

#if QKSOFTMAX_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace qksoftmax::fuzz {
namespace {

constexpr std::byte kPoison{0xFF};  // a NaN in every dtype; an output element of all 0xFF was not written
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr size_t kSlackBytes = 16;       // after every buffer: room for a base moved by a byte or an element
constexpr int64_t kMaxLeadElements = 3;  // elements before a tensor's first one in its buffer
constexpr int kMaxMutations = 3;
constexpr double kMutationChance = 0.75;
constexpr double kNullBytesChance = 0.02;
const std::vector<int64_t> kCudaHeadDims = {64, 128};  // what the CUDA kernels cover (else kUnsupported)
constexpr double kLseMargin = 3.0;  // a given LSE: drawn around log Sk + this (the scores are about N(0, 1))
constexpr bool kTestCuda = QKSOFTMAX_TEST_CUDA;        // the library has its CUDA backend

enum class Kind : uint8_t { kQ, kK, kProbs, kLse, kDq, kDk };

int rank_of(Kind kind) { return kind == Kind::kLse ? 3 : kMaxRank; }
size_t element_bytes(Kind kind, DType dtype) { return kind == Kind::kLse ? sizeof(float) : dtype_size(dtype); }
bool valid_dtype(DType t) { return uint8_t(t) <= uint8_t(DType::kFloat64); }
bool valid_device(Device d) { return d == Device::kCPU || d == Device::kCUDA; }

// Where the buffers of a call live. Failures of the memory itself are failures of this program (throw).
class Memory {
 public:
  virtual ~Memory() = default;
  virtual Device device() const = 0;
  virtual std::byte* allocate(size_t bytes) = 0;  // aligned to kWorkspaceAlignment
  virtual void release(std::byte* p) = 0;
  virtual void store(std::byte* dst, const std::vector<std::byte>& bytes) = 0;
  virtual std::vector<std::byte> load(const std::byte* src, size_t bytes) = 0;
  virtual CUstream_st* stream() { return nullptr; }
  // Waits for the work of the last call; the device's error as text, empty if none.
  virtual std::string wait() { return {}; }
};

class HostMemory final : public Memory {
 public:
  Device device() const override { return Device::kCPU; }
  std::byte* allocate(size_t bytes) override {
    return static_cast<std::byte*>(::operator new(std::max<size_t>(bytes, 1), std::align_val_t(kWorkspaceAlignment)));
  }
  void release(std::byte* p) override { ::operator delete(p, std::align_val_t(kWorkspaceAlignment)); }
  void store(std::byte* dst, const std::vector<std::byte>& bytes) override {
    std::memcpy(dst, bytes.data(), bytes.size());
  }
  std::vector<std::byte> load(const std::byte* src, size_t bytes) override {
    return std::vector<std::byte>(src, src + bytes);
  }
};

#if QKSOFTMAX_TEST_CUDA
void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Device memory of the current device, and a stream for the calls.
class DeviceMemory final : public Memory {
 public:
  DeviceMemory() { cuda_check(cudaStreamCreate(&stream_), "cudaStreamCreate"); }
  ~DeviceMemory() override { cudaStreamDestroy(stream_); }
  Device device() const override { return Device::kCUDA; }
  std::byte* allocate(size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc");
    return static_cast<std::byte*>(p);
  }
  void release(std::byte* p) override { cudaFree(p); }
  void store(std::byte* dst, const std::vector<std::byte>& bytes) override {
    cuda_check(cudaMemcpy(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  }
  std::vector<std::byte> load(const std::byte* src, size_t bytes) override {
    std::vector<std::byte> out(bytes);
    cuda_check(cudaMemcpy(out.data(), src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
    return out;
  }
  CUstream_st* stream() override { return stream_; }
  std::string wait() override {
    const cudaError_t err = cudaStreamSynchronize(stream_);
    return err == cudaSuccess ? std::string() : cudaGetErrorString(err);
  }

 private:
  cudaStream_t stream_ = nullptr;
};

// Page-locked host memory: what a descriptor that says CUDA must not be accepted over.
class PinnedHostMemory final : public Memory {
 public:
  Device device() const override { return Device::kCPU; }
  std::byte* allocate(size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMallocHost(&p, std::max<size_t>(bytes, 1)), "cudaMallocHost");
    return static_cast<std::byte*>(p);
  }
  void release(std::byte* p) override { cudaFreeHost(p); }
  void store(std::byte* dst, const std::vector<std::byte>& bytes) override {
    std::memcpy(dst, bytes.data(), bytes.size());
  }
  std::vector<std::byte> load(const std::byte* src, size_t bytes) override {
    return std::vector<std::byte>(src, src + bytes);
  }
};
#endif

// Memory of one Memory, with the bytes it must hold.
class Buffer {
 public:
  Buffer(Memory& memory, size_t bytes) : memory_(&memory), bytes_(bytes, kPoison), base_(memory.allocate(bytes)) {}
  ~Buffer() {
    if (base_) memory_->release(base_);
  }
  Buffer(Buffer&& o) noexcept
      : memory_(o.memory_), bytes_(std::move(o.bytes_)), base_(std::exchange(o.base_, nullptr)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer& operator=(Buffer&&) = delete;

  std::byte* base() const { return base_; }
  size_t size() const { return bytes_.size(); }
  Memory& memory() const { return *memory_; }
  std::vector<std::byte>& staged() { return bytes_; }
  const std::vector<std::byte>& staged() const { return bytes_; }
  void upload() { memory_->store(base_, bytes_); }
  std::vector<std::byte> contents() const { return memory_->load(base_, bytes_.size()); }
  bool holds(uintptr_t first, uintptr_t last) const {
    const auto base = reinterpret_cast<uintptr_t>(base_);
    return first >= base && last < base + bytes_.size() && first <= last;
  }

 private:
  Memory* memory_;
  std::vector<std::byte> bytes_;
  std::byte* base_;
};

struct Dims {
  int64_t B = 1, Hq = 1, Hk = 1, Sq = 1, Sk = 1, D = 1;
};

std::array<int64_t, kMaxRank> shape_of(Kind kind, const Dims& d) {
  switch (kind) {
    case Kind::kQ:
    case Kind::kDq: return {d.B, d.Hq, d.Sq, d.D};
    case Kind::kK:
    case Kind::kDk: return {d.B, d.Hk, d.Sk, d.D};
    case Kind::kProbs: return {d.B, d.Hq, d.Sq, d.Sk};
    case Kind::kLse: return {d.B, d.Hq, d.Sq, 0};
  }
  return {};
}

// One tensor argument of a call.
struct Arg {
  const char* name;
  Kind kind;
  bool output;
  TensorDesc* desc;
};

// Inclusive byte range of a descriptor's elements, in 128-bit arithmetic. Each dimension's reach is clamped to
// ±2^100 elements, so that no int64 shapes and strides overflow the sum: a reach that far is past every address
// either way, and only a tensor refused already (a size below 1, a negative stride) has reaches that cancel.
struct Span {
  __int128 first = 0, last = 0;
};

Span span_of(const TensorDesc& t, size_t element) {
  constexpr __int128 kFar = __int128(1) << 100;
  __int128 last_element = 0;
  for (int d = 0; d < t.rank; ++d) {
    last_element += std::clamp((__int128(t.shape[d]) - 1) * t.stride[d], -kFar, kFar);
  }
  const auto first = __int128(reinterpret_cast<uintptr_t>(t.data));
  return {first, first + (last_element + 1) * __int128(element) - 1};
}

// Calls f(element offset) for every element of a (small, valid) descriptor, in row-major order of its shape.
void for_each_offset(const TensorDesc& t, const std::function<void(int64_t)>& f) {
  std::array<int64_t, kMaxRank> index{};
  const int64_t count = [&] {
    int64_t n = 1;
    for (int d = 0; d < t.rank; ++d) n *= t.shape[d];
    return n;
  }();
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat, offset = 0;
    for (int d = t.rank; d-- > 0;) {
      index[d] = rest % t.shape[d];
      rest /= t.shape[d];
      offset += index[d] * t.stride[d];
    }
    f(offset);
  }
}

// A rule that a call breaks: the status it must be refused with.
struct Broken {
  Code code;
  std::string arg;  // the argument the message must start with; empty: any message (environment errors)
  std::string rule;

  bool operator<(const Broken& o) const { return std::tie(code, arg, rule) < std::tie(o.code, o.arg, o.rule); }
};

class Call {
 public:
  Call(bool backward, Memory& memory) : backward_(backward), memory_(&memory) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  bool backward() const { return backward_; }
  Memory& memory() const { return *memory_; }
  // Every tensor argument of the pass, present or not.
  std::vector<Arg> args() {
    if (!backward_) {
      return {{"q", Kind::kQ, false, &fwd.q},
              {"k", Kind::kK, false, &fwd.k},
              {"p", Kind::kProbs, true, &fwd.p},
              {"lse", Kind::kLse, true, &fwd.lse}};
    }
    return {{"q", Kind::kQ, false, &bwd.q},       {"k", Kind::kK, false, &bwd.k},
            {"dp", Kind::kProbs, false, &bwd.dp}, {"p", Kind::kProbs, false, &bwd.p},
            {"lse", Kind::kLse, false, &bwd.lse}, {"dq", Kind::kDq, true, &bwd.dq},
            {"dk", Kind::kDk, true, &bwd.dk}};
  }
  std::vector<Arg> present_args() {
    std::vector<Arg> out;
    for (const Arg& a : args()) {
      if (a.desc->present()) out.push_back(a);
    }
    return out;
  }
  Status size_query(size_t* bytes) {
    return backward_ ? backward_workspace_size(bwd, options, bytes) : forward_workspace_size(fwd, options, bytes);
  }
  Status run() {
    return backward_ ? qksoftmax::backward(bwd, options, workspace, workspace_bytes, memory_->stream())
                     : qksoftmax::forward(fwd, options, workspace, workspace_bytes, memory_->stream());
  }
  // The buffer that holds the whole of [first, last], if any.
  const Buffer* holder(uintptr_t first, uintptr_t last) const {
    for (const Buffer& b : buffers) {
      if (b.holds(first, last)) return &b;
    }
    return nullptr;
  }
  const Buffer* holder_of(const TensorDesc& t, size_t element) const {
    const Span s = span_of(t, element);
    if (s.first < 0 || s.last > __int128(UINTPTR_MAX)) return nullptr;
    return holder(uintptr_t(s.first), uintptr_t(s.last));
  }

  ForwardArgs fwd;
  BackwardArgs bwd;
  Options options;
  DType dtype = DType::kFloat32;
  std::vector<Buffer> buffers;  // reserved up front: descriptors point into them
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // How the workspace is chosen once the size query has answered.
  enum class Workspace : uint8_t {
    kExact,
    kLarger,
    kOneShort,
    kNull,
    kMisaligned
  } workspace_choice = Workspace::kExact;
  std::vector<std::string> mutations;  // what was spoiled, for the report
  bool scale_spoiled = false;          // options.scale set to an extreme (values then compared on the host only)

 private:
  bool backward_;
  Memory* memory_;
};

// ---- The API's rules, written from the header, independently of src/validate.cpp.

// Rules that the size query checks (no memory is read): the broken ones, each with the status it must give.
std::set<Broken> broken_rules(Call& call) {
  std::set<Broken> broken;
  const auto add = [&](Code code, const std::string& arg, const std::string& rule) {
    broken.insert({code, arg, rule});
  };
  const Options& o = call.options;
  if (o.mask != Mask::kNone && o.mask != Mask::kCausal) add(Code::kInvalidArgument, "options.mask", "mask value");
  if (call.backward() && o.mode != BackwardMode::kRecompute && o.mode != BackwardMode::kSavedP) {
    add(Code::kInvalidArgument, "options.mode", "mode value");
  }
  if (o.scale && !(std::isfinite(*o.scale) && std::fabs(*o.scale) <= FLT_MAX)) {
    add(Code::kInvalidArgument, "options.scale", "scale finite within float32 range");
  }
  std::vector<Arg> args = call.args();
  const auto find = [&](const char* name) -> TensorDesc& {
    return *std::find_if(args.begin(), args.end(), [&](const Arg& a) { return std::string(a.name) == name; })->desc;
  };
  const bool saved_p = o.mode == BackwardMode::kSavedP;
  for (const Arg& a : args) {
    const std::string name = a.name;
    const bool required =
        name == "q" || name == "k" || (!call.backward() && name == "p") ||
        (call.backward() && (name == "dp" || name == "dq" || name == "dk" || (name == "p" && saved_p)));
    if (required && !a.desc->present()) add(Code::kInvalidArgument, name, "required tensor present");
    if (call.backward() && name == "p" && a.desc->present() && o.mode == BackwardMode::kRecompute) {
      add(Code::kInvalidArgument, name, "no p in recompute mode");
    }
  }
  // The tensor rules apply to present tensors, once q and k exist to compare with.
  const std::vector<Arg> present = call.present_args();
  const TensorDesc& q = find("q");
  const TensorDesc& k = find("k");
  bool shapes_known = q.present() && k.present();
  for (const Arg& a : present) {
    const TensorDesc& t = *a.desc;
    const int rank = rank_of(a.kind);
    if (t.rank != rank) {
      add(Code::kInvalidArgument, a.name, "rank");
      if (a.kind == Kind::kQ || a.kind == Kind::kK) shapes_known = false;
      continue;
    }
    if (!valid_dtype(t.dtype)) add(Code::kInvalidArgument, a.name, "dtype value");
    if (!valid_device(t.device)) add(Code::kInvalidArgument, a.name, "device value");
    if (std::any_of(t.shape, t.shape + rank, [](int64_t n) { return n < 1; })) {
      add(Code::kInvalidArgument, a.name, "sizes >= 1");
    }
    if (std::any_of(t.stride, t.stride + rank, [](int64_t s) { return s < 0; })) {
      add(Code::kInvalidArgument, a.name, "strides >= 0");
    }
    if (valid_dtype(t.dtype) && reinterpret_cast<uintptr_t>(t.data) % element_bytes(a.kind, t.dtype) != 0) {
      add(Code::kInvalidArgument, a.name, "element-aligned data");
    }
  }
  if (!shapes_known) return broken;
  if (k.shape[0] != q.shape[0] || k.shape[3] != q.shape[3] || (k.shape[1] >= 1 && q.shape[1] % k.shape[1] != 0)) {
    add(Code::kInvalidArgument, "k", "k's shape agrees with q's");
  }
  if (q.shape[2] > kInt32Max || q.shape[3] > kInt32Max) add(Code::kInvalidArgument, "q", "Sq, D <= 2^31 - 1");
  if (k.shape[2] > kInt32Max) add(Code::kInvalidArgument, "k", "Sk <= 2^31 - 1");
  const Dims dims{q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  for (const Arg& a : present) {
    const TensorDesc& t = *a.desc;
    if (t.rank != rank_of(a.kind)) continue;
    const auto want = shape_of(a.kind, dims);
    if (!std::equal(t.shape, t.shape + t.rank, want.begin())) add(Code::kInvalidArgument, a.name, "shape");
    if (a.kind == Kind::kLse ? t.dtype != DType::kFloat32 : t.dtype != q.dtype) {
      add(Code::kInvalidArgument, a.name, "dtype like q (lse float32)");
    }
    if (t.device != q.device) add(Code::kInvalidArgument, a.name, "device like q");
    const int last = t.rank - 1;
    if (t.device == Device::kCUDA && t.shape[last] > 1 && t.stride[last] != 1) {
      add(Code::kInvalidArgument, a.name, "stride 1 in the last dimension on CUDA");
    }
  }
  // Memory: every tensor addresses less than 2^63 bytes; outputs overlap neither themselves nor anything else.
  std::vector<Span> spans;
  for (const Arg& a : present) {
    const TensorDesc& t = *a.desc;
    if (t.rank != rank_of(a.kind) || !valid_dtype(t.dtype)) return broken;  // reported above
    const Span s = span_of(t, element_bytes(a.kind, t.dtype));
    if (s.last - s.first + 1 > __int128(kInt64Max) || s.last > __int128(UINTPTR_MAX)) {
      add(Code::kInvalidArgument, a.name, "fewer than 2^63 bytes addressed");
    }
    spans.push_back(s);
  }
  for (size_t i = 0; i < present.size(); ++i) {
    if (!present[i].output) continue;
    const TensorDesc& t = *present[i].desc;
    // Sorted by stride, each dimension of size > 1 must step past everything the smaller strides reach: the
    // API's (conservative) test of an output that does not overlap itself.
    std::vector<std::pair<int64_t, int64_t>> dims_by_stride;
    for (int d = 0; d < t.rank; ++d) {
      if (t.shape[d] > 1) dims_by_stride.emplace_back(t.stride[d], t.shape[d]);
    }
    std::sort(dims_by_stride.begin(), dims_by_stride.end());
    __int128 reach = 1;
    for (const auto& [stride, size] : dims_by_stride) {
      if (stride < reach) {
        add(Code::kInvalidArgument, present[i].name, "output does not overlap itself");
        break;
      }
      reach = __int128(stride) * size;
    }
    for (size_t j = 0; j < present.size(); ++j) {
      if (j != i && spans[i].first <= spans[j].last && spans[j].first <= spans[i].last) {
        add(Code::kInvalidArgument, present[i].name, "output's bytes apart from every other tensor's");
      }
    }
  }
  if (q.dtype == DType::kFloat64 && q.device == Device::kCUDA) {
    add(Code::kUnsupported, "q", "float64 on the CPU backend only");
  }
  return broken;
}

// Rules only the call checks (the workspace, what the device can tell), for a call whose size query said
// `required` bytes.
std::set<Broken> call_rules(Call& call, size_t required, bool gpu_present) {
  std::set<Broken> broken;
  const auto misalignment = reinterpret_cast<uintptr_t>(call.workspace) % kWorkspaceAlignment;
  if (misalignment != 0 || call.workspace_bytes < required || (required > 0 && call.workspace == nullptr)) {
    broken.insert({Code::kWorkspaceTooSmall, "workspace", "workspace aligned and large enough"});
  }
  const std::vector<Arg> present = call.present_args();
  if (present.empty() || present[0].desc->device != Device::kCUDA) return broken;
  if (!gpu_present) {  // no device, or (kUnsupported) a library built without CUDA
    broken.insert({kTestCuda ? Code::kCudaError : Code::kUnsupported, "q", "a CUDA device"});
    return broken;
  }
  for (const Arg& a : present) {
    const Buffer* b = call.holder(reinterpret_cast<uintptr_t>(a.desc->data), reinterpret_cast<uintptr_t>(a.desc->data));
    if (b == nullptr || b->memory().device() != Device::kCUDA) {
      broken.insert({Code::kInvalidArgument, a.name, "data is device memory"});
    }
  }
  const int64_t head_dim = present[0].desc->shape[3];
  if (std::find(kCudaHeadDims.begin(), kCudaHeadDims.end(), head_dim) == kCudaHeadDims.end()) {
    broken.insert({Code::kUnsupported, "q", "a head dimension the CUDA kernels cover"});
  }
  return broken;
}

// ---- Generation.

class Fuzzer {
 public:
  Fuzzer(uint64_t seed, Memory& memory, Memory& host, Memory* other_memory, bool gpu_present, bool verbose)
      : rng_(seed), memory_(memory), host_(host), other_(other_memory), gpu_present_(gpu_present), verbose_(verbose) {}

  void iteration(int index);
  bool stopped() const { return !device_error_.empty(); }

  // Counts for the report.
  int64_t calls = 0, size_queries = 0, refused = 0, accepted_runs = 0, size_query_only = 0, unexpected = 0;
  std::string device_error_;

 private:
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[size_t(uniform(0, int64_t(v.size()) - 1))];
  }

  std::unique_ptr<Call> make_valid_call();
  void place(Call& call, Arg& arg, const Dims& dims, Memory& memory);
  void mutate(Call& call);
  void report(const Call& call, const std::string& what);
  void check(Call& call);
  void check_accepted(Call& call, const std::vector<std::vector<std::byte>>& before);
  std::vector<std::byte> reference_output(Call& call, const char* name);

  std::mt19937_64 rng_;
  Memory& memory_;
  Memory& host_;
  Memory* other_;  // memory of another kind (pinned host memory beside device memory), if any
  bool gpu_present_;
  bool verbose_;
  int index_ = 0;
};

void Fuzzer::report(const Call& call, const std::string& what) {
  ++unexpected;
  std::string spoiled;
  for (const std::string& m : call.mutations) spoiled += " [" + m + "]";
  // The call's dtype, mask, mode and the shapes of q and k: enough to reproduce it as a test.
  const TensorDesc& q = call.backward() ? call.bwd.q : call.fwd.q;
  const TensorDesc& k = call.backward() ? call.bwd.k : call.fwd.k;
  const auto shape = [](const TensorDesc& t) {
    std::string text;
    for (int d = 0; d < t.rank; ++d) {
      if (d > 0) text += 'x';
      text += std::to_string(t.shape[d]);
    }
    return text;
  };
  const char* mode = !call.backward() ? "" : call.bwd.p.present() ? " saved-P" : call.bwd.lse.present() ? " lse" : " recompute";
  std::fprintf(stderr, "UNEXPECTED (iteration %d, %s%s; dtype %d%s%s, q %s, k %s): %s\n", index_,
               call.backward() ? "backward" : "forward", spoiled.c_str(), int(q.dtype), mode,
               call.options.mask == Mask::kCausal ? " causal" : "", shape(q).c_str(), shape(k).c_str(), what.c_str());
}

// Strides of a valid layout of `shape` on this memory's device: any order of the dimensions, padding after
// any of them, a last-dimension step > 1 on the host, zero strides for broadcast inputs, size-1 dimensions with
// any stride.
std::array<int64_t, kMaxRank> random_strides(std::mt19937_64& rng, const std::array<int64_t, kMaxRank>& shape, int rank,
                                             bool input, bool cuda) {
  const auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  std::vector<int> order(static_cast<size_t>(rank));  // innermost first
  for (int d = 0; d < rank; ++d) order[d] = rank - 1 - d;
  if (chance(0.3)) {
    std::shuffle(order.begin() + (cuda ? 1 : 0), order.end(), rng);
  }
  std::array<int64_t, kMaxRank> stride{};
  int64_t next = (!cuda && chance(0.15)) ? std::uniform_int_distribution<int64_t>(2, 3)(rng) : 1;
  for (int d : order) {
    stride[d] = next;
    const int64_t pad = chance(0.25) ? std::uniform_int_distribution<int64_t>(1, 9)(rng) : 0;
    next = next * shape[d] + pad;
  }
  for (int d = 0; d < rank; ++d) {
    const bool last_on_cuda = cuda && d == rank - 1;
    if (shape[d] == 1 && !last_on_cuda && chance(0.3)) {
      const std::vector<int64_t> any = {0, 1, 7, int64_t(1) << 40, int64_t(1) << 62, kInt64Max};
      stride[d] = any[std::uniform_int_distribution<size_t>(0, any.size() - 1)(rng)];
    } else if (input && shape[d] > 1 && !last_on_cuda && chance(0.05)) {
      stride[d] = 0;  // broadcast
    }
  }
  return stride;
}

// Gives arg a buffer of its own, laid out at random, its elements random (inputs) or poisoned (outputs).
void Fuzzer::place(Call& call, Arg& arg, const Dims& dims, Memory& memory) {
  TensorDesc& t = *arg.desc;
  const auto shape = shape_of(arg.kind, dims);
  t.dtype = arg.kind == Kind::kLse ? DType::kFloat32 : call.dtype;
  t.device = memory.device();
  t.rank = rank_of(arg.kind);
  const auto stride = random_strides(rng_, shape, t.rank, !arg.output, memory.device() == Device::kCUDA);
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) {
    t.shape[d] = shape[d];
    t.stride[d] = stride[d];
    last += (shape[d] - 1) * stride[d];
  }
  const size_t elem = element_bytes(arg.kind, t.dtype);
  const int64_t lead = chance(0.5) ? 0 : uniform(1, kMaxLeadElements);
  call.buffers.emplace_back(memory, size_t(lead + last + 1) * elem + kSlackBytes);
  Buffer& buffer = call.buffers.back();
  t.data = buffer.base() + lead * elem;
  if (!arg.output) {
    // A given LSE is the forward's (docs/SPEC.md): about log Sk above the scores here, so that P stays near or
    // below 1. One far below it makes P, and with it 16-bit dS, overflow where the fp64 reference does not.
    const double mean = arg.kind == Kind::kLse ? std::log(double(std::max<int64_t>(dims.Sk, 1))) + kLseMargin : 0.0;
    std::normal_distribution<double> normal(mean, 1.0);
    std::byte* at = buffer.staged().data() + lead * elem;
    for_each_offset(t, [&](int64_t offset) { store_from_double(at, offset, t.dtype, normal(rng_)); });
  }
  buffer.upload();
}

std::unique_ptr<Call> Fuzzer::make_valid_call() {
  const bool cuda = memory_.device() == Device::kCUDA;
  auto call = std::make_unique<Call>(chance(0.5), memory_);
  Dims d;
  d.B = uniform(1, 3);
  d.Hk = uniform(1, 3);
  d.Hq = d.Hk * uniform(1, 3);
  // On the device: now and then the Hopper kernels' shapes (S a multiple of 8, D = 128), else anything small.
  const bool hopper_shape = cuda && chance(0.3);
  d.Sq = hopper_shape ? 8 * uniform(1, 9) : uniform(1, 40);
  d.Sk = hopper_shape ? 8 * uniform(1, 9) : uniform(1, 40);
  d.D = hopper_shape ? 128 : cuda ? pick(kCudaHeadDims) : uniform(1, 24);
  const std::vector<DType> dtypes =
      cuda ? std::vector<DType>{DType::kBFloat16, DType::kFloat16, DType::kFloat32}
           : std::vector<DType>{DType::kBFloat16, DType::kFloat16, DType::kFloat32, DType::kFloat64};
  call->dtype = hopper_shape ? pick(std::vector<DType>{DType::kBFloat16, DType::kFloat16}) : pick(dtypes);
  call->options.mask = chance(0.5) ? Mask::kCausal : Mask::kNone;
  call->options.mode = chance(0.5) ? BackwardMode::kSavedP : BackwardMode::kRecompute;
  call->options.deterministic = chance(0.3);
  if (chance(0.3)) {  // on the device within ±2/sqrt(D): exp(S − lse) of a random lse stays within float range
    const double bound = cuda ? 2.0 / std::sqrt(double(d.D)) : 2.0;
    call->options.scale = std::uniform_real_distribution<double>(-bound, bound)(rng_);
  }
  call->buffers.reserve(16);  // every buffer a call may get, so that descriptors into them stay valid
  for (Arg& a : call->args()) {
    const std::string name = a.name;
    const bool wanted = name != "lse" && name != "p" ? true
                        : name == "lse"              ? chance(0.6)
                        : !call->backward()          ? true
                                                     : call->options.mode == BackwardMode::kSavedP;
    if (wanted) place(*call, a, d, memory_);
  }
  call->workspace_choice = Call::Workspace::kExact;
  return call;
}

// A value as int64 arithmetic wraps it: mutations stack, so the size or stride one changes may be extreme already.
int64_t wrapped(__int128 v) { return int64_t(uint64_t(v)); }

// Spoils the call in one way (which may or may not break a rule: the rules decide).
void Fuzzer::mutate(Call& call) {
  std::vector<Arg> args = call.args();
  Arg& a = args[size_t(uniform(0, int64_t(args.size()) - 1))];
  TensorDesc& t = *a.desc;
  const int dim = int(uniform(0, kMaxRank - 1));
  const auto note = [&](const std::string& what) { call.mutations.push_back(std::string(a.name) + " " + what); };
  const std::vector<int64_t> huge = {kInt32Max,
                                     int64_t(1) << 31,
                                     (int64_t(1) << 32) - 1,
                                     int64_t(1) << 32,
                                     (int64_t(1) << 32) + 1,
                                     int64_t(1) << 40,
                                     int64_t(1) << 62,
                                     kInt64Max};
  switch (uniform(0, 15)) {
    case 0:
      t.data = nullptr;
      note("data null");
      break;
    case 1: {
      const int64_t by =
          uniform(0, 1) ? 1 : int64_t(element_bytes(a.kind, valid_dtype(t.dtype) ? t.dtype : call.dtype));
      t.data = static_cast<std::byte*>(t.data) + by;
      note("data + " + std::to_string(by) + " bytes");
      break;
    }
    case 2: {  // point at another tensor's memory, at its start or inside it
      const Arg& other = args[size_t(uniform(0, int64_t(args.size()) - 1))];
      if (!other.desc->present()) return;
      const size_t elem = valid_dtype(other.desc->dtype) ? element_bytes(other.kind, other.desc->dtype) : 1;
      t.data = static_cast<std::byte*>(other.desc->data) + elem * size_t(uniform(0, 2));
      note(std::string("data into ") + other.name + "'s");
      break;
    }
    case 3:
      t.rank = int(pick(std::vector<int64_t>{-1, 0, 1, 3, 4, 5, 100, INT_MIN}));
      note("rank " + std::to_string(t.rank));
      break;
    case 4:
      t.shape[dim] =
          pick(std::vector<int64_t>{0, -1, kInt64Min, wrapped(__int128(t.shape[dim]) + 1),
                                    std::max<int64_t>(1, wrapped(__int128(t.shape[dim]) - 1))});
      note("shape[" + std::to_string(dim) + "] " + std::to_string(t.shape[dim]));
      break;
    case 5:
      t.stride[dim] = pick(
          std::vector<int64_t>{-1, wrapped(-__int128(t.stride[dim])), 0, 1, wrapped(__int128(t.stride[dim]) + 1),
                               int64_t(1) << 62, kInt64Max, kInt64Min});
      note("stride[" + std::to_string(dim) + "] " + std::to_string(t.stride[dim]));
      break;
    case 6:
      t.dtype = DType(uniform(0, 5));
      note("dtype " + std::to_string(int(t.dtype)));
      break;
    case 7:
      t.device = Device(uniform(0, 3));
      note("device " + std::to_string(int(t.device)));
      break;
    case 8: {  // a size at or past 2^31 / 2^32, set consistently in every tensor that has it; strides of a
               // contiguous layout computed as a caller would, wrapping on overflow or saturating
      const int which = int(uniform(0, 4));  // B, Hq (with Hk), Sq, Sk, D
      const int64_t value = pick(huge);
      const bool wrap = chance(0.5);
      for (Arg& x : args) {
        TensorDesc& u = *x.desc;
        if (!u.present() || u.rank != rank_of(x.kind)) continue;
        const bool k_side = x.kind == Kind::kK || x.kind == Kind::kDk;
        const int at = which == 0   ? 0
                       : which == 1 ? 1
                       : which == 2 ? (k_side ? -1 : 2)
                       : which == 3 ? (k_side                   ? 2
                                       : x.kind == Kind::kProbs ? 3
                                                                : -1)
                                    : (x.kind == Kind::kQ || x.kind == Kind::kDq || k_side ? 3 : -1);
        if (at < 0) continue;
        u.shape[at] = value;
        uint64_t next = 1;
        for (int d = u.rank; d-- > 0;) {
          u.stride[d] = int64_t(next);
          uint64_t product = 0;
          if (__builtin_mul_overflow(next, uint64_t(u.shape[d]), &product))
            product = wrap ? next * uint64_t(u.shape[d]) : uint64_t(kInt64Max);
          next = product;
        }
      }
      const char* const dimension_names[] = {"B", "Hq", "Sq", "Sk", "D"};
      call.mutations.push_back(std::string(dimension_names[which]) + " = " + std::to_string(value) +
                               (wrap ? " (strides wrap)" : " (strides saturate)"));
      break;
    }
    case 9: {  // an output's strides made to collide
      if (!a.output || t.rank < 2 || t.rank > kMaxRank) return;
      t.stride[dim % t.rank] = t.stride[(dim + 1) % t.rank];
      note("stride collides");
      break;
    }
    case 10:
      call.options.scale = pick(std::vector<double>{
          0.0, -1.0, 1e-300, 5e-324, FLT_MAX, -FLT_MAX, 1e39, 1e300, std::numeric_limits<double>::infinity(),
          -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()});
      call.mutations.push_back("scale " + std::to_string(*call.options.scale));
      call.scale_spoiled = true;
      break;
    case 11:
      call.options.mask = Mask(uniform(0, 3));
      call.mutations.push_back("mask " + std::to_string(int(call.options.mask)));
      break;
    case 12:
      call.options.mode = BackwardMode(uniform(0, 3));
      call.mutations.push_back("mode " + std::to_string(int(call.options.mode)));
      break;
    case 13:
      call.workspace_choice = Call::Workspace(uniform(1, 4));
      call.mutations.push_back("workspace choice " + std::to_string(int(call.workspace_choice)));
      break;
    case 14:  // every descriptor says the other device (the memory stays where it is)
      for (Arg& x : args) {
        if (x.desc->present() && valid_device(x.desc->device)) {
          x.desc->device = x.desc->device == Device::kCPU ? Device::kCUDA : Device::kCPU;
        }
      }
      call.mutations.push_back("every device flipped");
      break;
    default: {  // the tensor moved to memory of the other kind, its descriptor unchanged
      if (other_ == nullptr || !t.present() || t.rank != rank_of(a.kind) || !valid_dtype(t.dtype)) return;
      const Buffer* from = call.holder_of(t, element_bytes(a.kind, t.dtype));
      if (from == nullptr) return;
      call.buffers.emplace_back(*other_, from->size());
      Buffer& to = call.buffers.back();
      to.staged() = from->contents();
      to.upload();
      t.data = to.base() + (static_cast<std::byte*>(t.data) - from->base());
      note("moved to memory of the other kind");
      break;
    }
  }
}

// What the same call gives for output `name` on contiguous host copies of its inputs, on the CPU backend,
// as the bytes of a contiguous tensor of the output's dtype.
std::vector<std::byte> Fuzzer::reference_output(Call& call, const char* name) {
  Call ref(call.backward(), host_);
  ref.options = call.options;
  ref.dtype = call.dtype;
  ref.buffers.reserve(16);
  std::vector<Arg> from = call.args(), to = ref.args();
  std::vector<std::byte> out;
  for (size_t i = 0; i < from.size(); ++i) {
    const TensorDesc& s = *from[i].desc;
    if (!s.present()) continue;
    TensorDesc& t = *to[i].desc;
    t = s;
    t.device = Device::kCPU;
    const size_t elem = element_bytes(from[i].kind, s.dtype);
    int64_t count = 1;
    for (int d = t.rank; d-- > 0;) {
      t.stride[d] = count;
      count *= t.shape[d];
    }
    ref.buffers.emplace_back(host_, size_t(count) * elem);
    Buffer& buffer = ref.buffers.back();
    t.data = buffer.base();
    if (!from[i].output) {  // gather the input's elements in row-major order
      const Buffer* src = call.holder_of(s, elem);
      const std::vector<std::byte> bytes = src->contents();
      const std::byte* at = bytes.data() + (static_cast<const std::byte*>(s.data) - src->base());
      std::byte* dst = buffer.staged().data();
      for_each_offset(s, [&](int64_t offset) {
        std::memcpy(dst, at + offset * int64_t(elem), elem);
        dst += elem;
      });
      buffer.upload();
    }
  }
  const Status s = ref.run();
  if (!s.ok()) throw std::runtime_error("reference call on contiguous copies refused: " + s.message());
  for (size_t i = 0; i < to.size(); ++i) {
    if (std::string(to[i].name) == name && to[i].output) {
      const TensorDesc& t = *to[i].desc;
      const std::byte* data = static_cast<const std::byte*>(t.data);
      int64_t count = 1;
      for (int d = 0; d < t.rank; ++d) count *= t.shape[d];
      out.assign(data, data + count * int64_t(element_bytes(to[i].kind, t.dtype)));
    }
  }
  return out;
}

double tolerance(DType t) {  // the accuracy bound, plus the reference's own rounding to the dtype
  switch (t) {
    case DType::kBFloat16: return 1e-2 + 2 * std::ldexp(1.0, -8);
    case DType::kFloat16: return 2e-3 + 2 * std::ldexp(1.0, -11);
    case DType::kFloat32:
    case DType::kFloat64: return 1e-5;
  }
  return 0;
}

void Fuzzer::check_accepted(Call& call, const std::vector<std::vector<std::byte>>& before) {
  // Bytes that the outputs may have written.
  std::vector<std::vector<bool>> writable(call.buffers.size());
  for (size_t b = 0; b < call.buffers.size(); ++b) writable[b].assign(call.buffers[b].size(), false);
  for (const Arg& a : call.present_args()) {
    if (!a.output) continue;
    const TensorDesc& t = *a.desc;
    const size_t elem = element_bytes(a.kind, t.dtype);
    const Buffer* holder = call.holder_of(t, elem);
    const size_t b = size_t(holder - call.buffers.data());
    const int64_t start = static_cast<std::byte*>(t.data) - holder->base();
    int64_t collisions = 0;
    for_each_offset(t, [&](int64_t offset) {
      const int64_t at = start + offset * int64_t(elem);
      collisions += writable[b][size_t(at)];
      std::fill_n(writable[b].begin() + at, elem, true);
    });
    if (collisions > 0) report(call, std::string(a.name) + ": accepted an output whose elements overlap");
  }
  std::vector<std::vector<std::byte>> after;
  for (size_t b = 0; b < call.buffers.size(); ++b) {
    after.push_back(call.buffers[b].contents());
    size_t changed = 0;
    for (size_t i = 0; i < after[b].size(); ++i) changed += !writable[b][i] && after[b][i] != before[b][i];
    if (changed > 0) report(call, "accepted call changed " + std::to_string(changed) + " bytes outside its outputs");
  }
  // An input that reads poison (a base moved onto it) can pass a NaN of all 0xFF on to the outputs.
  bool poisoned_input = false;
  for (const Arg& a : call.present_args()) {
    if (a.output) continue;
    const size_t elem = element_bytes(a.kind, a.desc->dtype);
    const Buffer* holder = call.holder_of(*a.desc, elem);
    const std::byte* at =
        before[size_t(holder - call.buffers.data())].data() + (static_cast<std::byte*>(a.desc->data) - holder->base());
    for_each_offset(*a.desc,
                    [&](int64_t offset) { poisoned_input |= std::isnan(load_as_double(at, offset, a.desc->dtype)); });
  }
  for (const Arg& a : call.present_args()) {
    if (!a.output) continue;
    const TensorDesc& t = *a.desc;
    const size_t elem = element_bytes(a.kind, t.dtype);
    const Buffer* holder = call.holder_of(t, elem);
    const std::vector<std::byte>& bytes = after[size_t(holder - call.buffers.data())];
    const std::byte* at = bytes.data() + (static_cast<std::byte*>(t.data) - holder->base());
    const std::vector<std::byte> ref = reference_output(call, a.name);
    int64_t unwritten = 0, differ = 0, i = 0;
    double diff = 0, norm = 0, worst = 0, largest = 0;
    for_each_offset(t, [&](int64_t offset) {
      const std::byte* e = at + offset * int64_t(elem);
      unwritten += std::all_of(e, e + elem, [](std::byte x) { return x == kPoison; });
      differ += std::memcmp(e, ref.data() + i * int64_t(elem), elem) != 0;
      const double got = load_as_double(e, 0, t.dtype), want = load_as_double(ref.data(), i, t.dtype);
      if (std::isfinite(want)) norm += want * want;
      const double d = got == want ? 0.0 : std::fabs(got - want);  // NaN or inf where they differ: caught below
      diff += d * d;
      if (!(d <= worst)) worst = d;
      largest = std::max(largest, std::fabs(want));
      ++i;
    });
    // Where every query row sees one key (recompute mode), dS = P ∘ (dP − D) vanishes in exact arithmetic: dQ
    // and dK are rounding noise, judged element by element.
    const bool gradients_vanish =
        (a.kind == Kind::kDq || a.kind == Kind::kDk) && !call.bwd.p.present() && !call.bwd.lse.present() &&
        (call.bwd.k.shape[2] == 1 || (call.options.mask == Mask::kCausal && call.bwd.q.shape[2] == 1));
    const double error = gradients_vanish ? worst : std::sqrt(diff);
    const double scale_of_values = gradients_vanish ? std::max(1.0, largest) : std::max(1.0, std::sqrt(norm));
    if (unwritten > 0 && !poisoned_input)
      report(call, std::string(a.name) + ": " + std::to_string(unwritten) + " elements not written");
    if (memory_.device() == Device::kCPU) {
      if (differ > 0) {
        report(call, std::string(a.name) + ": " + std::to_string(differ) +
                         " elements differ from the same call on contiguous copies");
      }
    } else if (!poisoned_input && !call.scale_spoiled &&  // (else NaN and infinity where fp64 may have none)
               !(error <= tolerance(t.dtype) * scale_of_values)) {
      report(call, std::string(a.name) + ": off the CPU backend by " + std::to_string(error) + " (values up to " +
                       std::to_string(scale_of_values) + ")");
    }
  }
}

bool names(const Status& s, const std::set<Broken>& broken) {
  for (const Broken& b : broken) {
    if (b.code != s.code()) continue;
    if (b.arg.empty() || s.message().rfind(b.arg + ": ", 0) == 0) return true;
  }
  return false;
}

std::string rules_text(const std::set<Broken>& broken) {
  std::string out;
  for (const Broken& b : broken) out += " {" + b.arg + ": " + b.rule + "}";
  return out.empty() ? " none" : out;
}

// One call: the size query, then (where safe) the call, each outcome against the rules.
void Fuzzer::check(Call& call) {
  std::set<Broken> broken = broken_rules(call);
  std::vector<Arg> present = call.present_args();
  bool backed = true;
  for (const Arg& a : present) {
    const TensorDesc& t = *a.desc;
    if (t.rank != rank_of(a.kind) || !valid_dtype(t.dtype)) continue;
    if (std::any_of(t.shape, t.shape + t.rank, [](int64_t n) { return n < 1; }) ||
        std::any_of(t.stride, t.stride + t.rank, [](int64_t s) { return s < 0; }) ||
        call.holder_of(t, element_bytes(a.kind, t.dtype)) == nullptr) {
      backed = false;
    }
  }
  size_t required = 0;
  ++size_queries;
  ++calls;
  if (chance(kNullBytesChance)) {  // nowhere to write the size: refused whatever the tensors
    ++size_queries;
    ++calls;
    const Status s = call.size_query(nullptr);
    if (s.code() != Code::kInvalidArgument || s.message().rfind("bytes: ", 0) != 0) {
      report(call, "size query without a place for the size: '" + s.message() + "'");
    }
  }
  const Status query = call.size_query(&required);
  if (uint8_t(query.code()) > uint8_t(Code::kInternal)) report(call, "size query returned an unknown code");
  if (query.ok() && !broken.empty()) {
    report(call, "size query accepted a call that breaks" + rules_text(broken));
    return;  // not run: it would touch memory it must not
  }
  if (!query.ok() && !names(query, broken)) {
    report(call, "size query refused with '" + query.message() + "'; rules broken:" + rules_text(broken));
  }
  if (!query.ok() && backed) {  // the call must refuse the same way, and write nothing
    call.workspace = nullptr;
    call.workspace_bytes = 0;
  } else if (!query.ok() || !backed) {
    ++size_query_only;
    return;
  }

  std::optional<Buffer> workspace;
  if (query.ok()) {
    const size_t bytes = call.workspace_choice == Call::Workspace::kLarger     ? required + kWorkspaceAlignment
                         : call.workspace_choice == Call::Workspace::kOneShort ? (required > 0 ? required - 1 : 0)
                         : call.workspace_choice == Call::Workspace::kNull     ? 0
                                                                               : required;
    workspace.emplace(memory_, bytes + kWorkspaceAlignment);
    workspace->upload();
    call.workspace = call.workspace_choice == Call::Workspace::kNull ? nullptr : workspace->base();
    call.workspace_bytes = call.workspace_choice == Call::Workspace::kNull ? required : bytes;
    if (call.workspace_choice == Call::Workspace::kMisaligned) {
      call.workspace = workspace->base() + uniform(1, int64_t(kWorkspaceAlignment) - 1);
    }
    broken = call_rules(call, required, gpu_present_);
  }
  std::vector<std::vector<std::byte>> before;
  for (const Buffer& b : call.buffers) before.push_back(b.contents());
  ++calls;
  const Status status = call.run();
  const std::string device_error = memory_.wait();
  if (!device_error.empty()) {
    device_error_ = device_error;
    report(call, "the device reported an error after the call: " + device_error);
    return;
  }
  if (uint8_t(status.code()) > uint8_t(Code::kInternal)) report(call, "call returned an unknown code");
  if (!query.ok() && (status.code() != query.code() || status.message() != query.message())) {
    report(call, "call and size query disagree: '" + status.message() + "' against '" + query.message() + "'");
  }
  if (status.ok() && !broken.empty()) report(call, "call accepted what breaks" + rules_text(broken));
  if (!status.ok() && !names(status, broken)) {
    report(call, "call refused with '" + status.message() + "'; rules broken:" + rules_text(broken));
  }
  if (!status.ok()) {
    ++refused;
    size_t written = 0;
    for (size_t b = 0; b < call.buffers.size(); ++b) {
      const std::vector<std::byte> after = call.buffers[b].contents();
      written += !std::equal(after.begin(), after.end(), before[b].begin(), before[b].end());
    }
    if (written > 0) report(call, "a refused call wrote memory (" + std::to_string(written) + " buffers)");
    return;
  }
  ++accepted_runs;
  check_accepted(call, before);
}

void Fuzzer::iteration(int index) {
  index_ = index;
  const std::unique_ptr<Call> call = make_valid_call();
  const int mutations = chance(kMutationChance) ? int(uniform(1, kMaxMutations)) : 0;
  for (int m = 0; m < mutations; ++m) mutate(*call);
  if (memory_.device() == Device::kCUDA) {
    // Device memory that every descriptor declares host memory would be read by the CPU backend: a caller's lie
    // that no library can catch. q keeps saying CUDA then, and the call is refused as mixing devices.
    std::vector<Arg> present = call->present_args();
    if (!present.empty() &&
        std::all_of(present.begin(), present.end(), [](const Arg& a) { return a.desc->device == Device::kCPU; })) {
      call->fwd.q.device = Device::kCUDA;
      call->bwd.q.device = Device::kCUDA;
    }
  }
  if (verbose_) {
    std::string spoiled;
    for (const std::string& m : call->mutations) spoiled += " [" + m + "]";
    std::fprintf(stderr, "iteration %d: %s%s\n", index, call->backward() ? "backward" : "forward", spoiled.c_str());
  }
  check(*call);
}

bool gpu_present() {
#if QKSOFTMAX_TEST_CUDA
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return present;
#else
  return false;
#endif
}

int main_(int argc, char** argv) {
  std::string device = "cpu", json;
  int64_t iterations = 2000;
  double seconds = 0;  // 0: no time limit
  uint64_t seed = 1;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--device")
      device = value();
    else if (a == "--iterations")
      iterations = std::stoll(value());
    else if (a == "--seconds")
      seconds = std::stod(value());
    else if (a == "--seed")
      seed = std::stoull(value());
    else if (a == "--json")
      json = value();
    else if (a == "--verbose")
      verbose = true;
    else
      throw std::invalid_argument("unknown argument " + a + " (see the top of fuzz_api.cpp)");
  }
  HostMemory host;
  std::unique_ptr<Memory> target;
  std::unique_ptr<Memory> other;
  const bool gpu = gpu_present();
  if (device == "cuda") {
#if QKSOFTMAX_TEST_CUDA
    if (!gpu) throw std::runtime_error("--device cuda: no CUDA device");
    target = std::make_unique<DeviceMemory>();
    other = std::make_unique<PinnedHostMemory>();
#else
    throw std::runtime_error("--device cuda: built without CUDA");
#endif
  } else if (device != "cpu") {
    throw std::invalid_argument("--device must be cpu or cuda");
  }
  Memory& memory = target ? *target : host;
  Fuzzer fuzzer(seed, memory, host, other.get(), gpu, verbose);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int64_t made = 0;
  for (; made < iterations && !fuzzer.stopped(); ++made) {
    if (seconds > 0 && std::chrono::steady_clock::now() >= deadline) break;
    fuzzer.iteration(int(made));
  }
  std::printf(
      "fuzz %s: seed %llu, %lld iterations, %lld calls (%lld size queries), %lld refused calls, "
      "%lld accepted calls run, %lld size queries only, %lld unexpected outcomes\n",
      device.c_str(), static_cast<unsigned long long>(seed), static_cast<long long>(made),
      static_cast<long long>(fuzzer.calls), static_cast<long long>(fuzzer.size_queries),
      static_cast<long long>(fuzzer.refused), static_cast<long long>(fuzzer.accepted_runs),
      static_cast<long long>(fuzzer.size_query_only), static_cast<long long>(fuzzer.unexpected));
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"device\": \"" << device << "\", \"seed\": " << seed << ", \"iterations\": " << made
        << ", \"calls\": " << fuzzer.calls << ", \"size_queries\": " << fuzzer.size_queries
        << ", \"refused_calls\": " << fuzzer.refused << ", \"accepted_calls_run\": " << fuzzer.accepted_runs
        << ", \"size_query_only\": " << fuzzer.size_query_only << ", \"unexpected\": " << fuzzer.unexpected
        << ", \"device_error\": \"" << fuzzer.device_error_ << "\"}\n";
  }
  return fuzzer.unexpected == 0 ? 0 : 1;
}

}  // namespace
}  // namespace qksoftmax::fuzz

int main(int argc, char** argv) {
  try {
    return qksoftmax::fuzz::main_(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qksoftmax_fuzz: %s\n", e.what());
    return 2;
  }
}
