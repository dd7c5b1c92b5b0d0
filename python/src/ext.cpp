// qksoftmax._C: the nanobind binding of the C++ API (include/qksoftmax/qksoftmax.h).
//
// Thin by design: every tensor arrives as a DLPack-capable array (torch, numpy, ...) of any dtype, device
// and strides, is described as a qksoftmax::TensorDesc, and the C++ API does the validation. Outputs and
// the workspace are allocated by the Python layer (python/qksoftmax), which also gives friendlier errors.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "qksoftmax/qksoftmax.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Input = nb::ndarray<nb::ro>;  // read-only views are fine for inputs (numpy broadcasts, ...)
using Output = nb::ndarray<>;
using OptionalInput = std::optional<Input>;
using OptionalOutput = std::optional<Output>;

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

void check(const qksoftmax::Status& status) {
  if (status.ok()) return;
  switch (status.code()) {
    case qksoftmax::Code::kInvalidArgument: raise(PyExc_ValueError, status.message());
    case qksoftmax::Code::kUnsupported: raise(PyExc_NotImplementedError, status.message());
    default: raise(PyExc_RuntimeError, status.message());
  }
}

qksoftmax::DType to_dtype(nb::dlpack::dtype dtype, const char* name) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dtype.code);
  if (dtype.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Bfloat && dtype.bits == 16) return qksoftmax::DType::kBFloat16;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 16) return qksoftmax::DType::kFloat16;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 32) return qksoftmax::DType::kFloat32;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 64) return qksoftmax::DType::kFloat64;
  }
  raise(PyExc_TypeError, std::string(name) + " must have dtype bfloat16, float16, float32 or float64");
}

qksoftmax::Device to_device(int device_type, const char* name) {
  if (device_type == nb::device::cpu::value) return qksoftmax::Device::kCPU;
  if (device_type == nb::device::cuda::value) return qksoftmax::Device::kCUDA;
  raise(PyExc_ValueError, std::string(name) + " must be on the CPU or a CUDA device");
}

template <typename Array>
qksoftmax::TensorDesc describe(const Array& array, const char* name) {
  qksoftmax::TensorDesc desc;
  if (array.ndim() > static_cast<size_t>(qksoftmax::kMaxRank)) {
    raise(PyExc_ValueError, std::string(name) + " has too many dimensions");
  }
  desc.data = const_cast<void*>(static_cast<const void*>(array.data()));
  desc.dtype = to_dtype(array.dtype(), name);
  desc.device = to_device(array.device_type(), name);
  desc.rank = static_cast<int>(array.ndim());
  for (int i = 0; i < desc.rank; ++i) {
    desc.shape[i] = static_cast<int64_t>(array.shape(i));
    desc.stride[i] = array.stride(i);
  }
  return desc;
}

template <typename Array>
qksoftmax::TensorDesc describe(const std::optional<Array>& array, const char* name) {
  return array ? describe(*array, name) : qksoftmax::TensorDesc{};
}

qksoftmax::Options make_options(std::optional<double> scale, bool causal, qksoftmax::BackwardMode mode) {
  qksoftmax::Options options;
  options.scale = scale;
  options.mask = causal ? qksoftmax::Mask::kCausal : qksoftmax::Mask::kNone;
  options.mode = mode;
  return options;
}

qksoftmax::BackwardMode backward_mode(const OptionalInput& p) {
  return p ? qksoftmax::BackwardMode::kSavedP : qksoftmax::BackwardMode::kRecompute;
}

qksoftmax::ForwardArgs forward_args(const Input& q, const Input& k, const Output& p, const OptionalOutput& lse) {
  return {describe(q, "q"), describe(k, "k"), describe(p, "p"), describe(lse, "lse")};
}

qksoftmax::BackwardArgs backward_args(const Input& q, const Input& k, const Input& dp, const OptionalInput& p,
                                      const OptionalInput& lse, const Output& dq, const Output& dk) {
  return {describe(q, "q"),     describe(k, "k"),   describe(dp, "dp"), describe(p, "p"),
          describe(lse, "lse"), describe(dq, "dq"), describe(dk, "dk")};
}

struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

Workspace workspace_of(const OptionalOutput& workspace) {
  if (!workspace) return {};
  return {workspace->data(), workspace->nbytes()};
}

// The workspace of a call, from the caller's allocator (bytes → an array of at least that many bytes, aligned
// as kWorkspaceAlignment asks): none when the call needs none or no allocator is given (then the C++ API
// reports the missing workspace). Sizing inside the call converts each tensor once, not once per query.
OptionalOutput allocate_workspace(size_t bytes, const nb::object& allocate) {
  if (bytes == 0 || allocate.is_none()) return std::nullopt;
  return nb::cast<Output>(allocate(bytes));
}

CUstream_st* to_stream(uintptr_t stream) { return reinterpret_cast<CUstream_st*>(stream); }

size_t forward_workspace_size(const Input& q, const Input& k, const Output& p, const OptionalOutput& lse,
                              std::optional<double> scale, bool causal) {
  const auto args = forward_args(q, k, p, lse);
  const auto options = make_options(scale, causal, qksoftmax::BackwardMode::kRecompute);
  size_t bytes = 0;
  check(qksoftmax::forward_workspace_size(args, options, &bytes));
  return bytes;
}

void forward(const Input& q, const Input& k, const Output& p, const OptionalOutput& lse, const nb::object& allocate,
             std::optional<double> scale, bool causal, uintptr_t stream) {
  const auto args = forward_args(q, k, p, lse);
  const auto options = make_options(scale, causal, qksoftmax::BackwardMode::kRecompute);
  size_t bytes = 0;
  check(qksoftmax::forward_workspace_size(args, options, &bytes));
  const OptionalOutput workspace = allocate_workspace(bytes, allocate);
  const Workspace ws = workspace_of(workspace);
  qksoftmax::Status status;
  {
    nb::gil_scoped_release release;
    status = qksoftmax::forward(args, options, ws.data, ws.bytes, to_stream(stream));
  }
  check(status);
}

size_t backward_workspace_size(const Input& q, const Input& k, const Input& dp, const OptionalInput& p,
                               const OptionalInput& lse, const Output& dq, const Output& dk,
                               std::optional<double> scale, bool causal) {
  const auto args = backward_args(q, k, dp, p, lse, dq, dk);
  const auto options = make_options(scale, causal, backward_mode(p));
  size_t bytes = 0;
  check(qksoftmax::backward_workspace_size(args, options, &bytes));
  return bytes;
}

void backward(const Input& q, const Input& k, const Input& dp, const OptionalInput& p, const OptionalInput& lse,
              const Output& dq, const Output& dk, const nb::object& allocate, std::optional<double> scale,
              bool causal, uintptr_t stream) {
  const auto args = backward_args(q, k, dp, p, lse, dq, dk);
  const auto options = make_options(scale, causal, backward_mode(p));
  size_t bytes = 0;
  check(qksoftmax::backward_workspace_size(args, options, &bytes));
  const OptionalOutput workspace = allocate_workspace(bytes, allocate);
  const Workspace ws = workspace_of(workspace);
  qksoftmax::Status status;
  {
    nb::gil_scoped_release release;
    status = qksoftmax::backward(args, options, ws.data, ws.bytes, to_stream(stream));
  }
  check(status);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "qksoftmax C++ API binding (use the qksoftmax package, not this module)";
  m.attr("WORKSPACE_ALIGNMENT") = qksoftmax::kWorkspaceAlignment;

  m.def("version", &qksoftmax::version, "The library's version, \"major.minor.patch\".");

  m.def("forward_workspace_size", &forward_workspace_size, "q"_a, "k"_a, "p"_a, "lse"_a.none(),
        "scale"_a.none(), "causal"_a, "Workspace bytes that forward needs for these arguments.");
  m.def("forward", &forward, "q"_a, "k"_a, "p"_a, "lse"_a.none(), "allocate"_a.none(), "scale"_a.none(),
        "causal"_a, "stream"_a,
        "P = softmax(mask(scale * q k^T)) into p (and the log-sum-exp into lse) on the given CUDA stream; "
        "allocate(nbytes) returns the workspace when one is needed.");

  m.def("backward_workspace_size", &backward_workspace_size, "q"_a, "k"_a, "dp"_a, "p"_a.none(),
        "lse"_a.none(), "dq"_a, "dk"_a, "scale"_a.none(), "causal"_a,
        "Workspace bytes that backward needs for these arguments.");
  m.def("backward", &backward, "q"_a, "k"_a, "dp"_a, "p"_a.none(), "lse"_a.none(), "dq"_a, "dk"_a,
        "allocate"_a.none(), "scale"_a.none(), "causal"_a, "stream"_a,
        "dq, dk from dp: saved-P mode when p is given, recompute mode otherwise; allocate(nbytes) returns the "
        "workspace when one is needed.");
}
