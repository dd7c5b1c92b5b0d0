// qksoftmax._C: the nanobind binding of the C++ API (include/qksoftmax/qksoftmax.h).
//
// One entry per operation: plan_forward / plan_backward describe each tensor once, validate the call once
// (qksoftmax::plan_forward / plan_backward) and return a Plan that knows the workspace the call needs;
// Plan.run launches it with the caller's workspace and stream. The Python layer (python/qksoftmax) allocates
// the outputs before the plan and the workspace between plan and run: nothing here calls back into Python.
//
// Tensors: a torch.Tensor is described from its own attributes (data_ptr, shape, stride, dtype, device),
// which costs a fraction of a DLPack export (torch's __dlpack__ is Python code) and declares the tensor's
// CUDA device (TensorDesc::device_index), so the library asks the driver nothing about its pointer. An input on
// a CUDA device whose last dimension is not dense (which the CUDA backend refuses) is described as its
// contiguous copy (tensor.detach().contiguous(), on that device's current stream), which the plan keeps: the
// strides are read here anyway, so the Python layer asks nothing of a tensor before the call. Any other array
// (numpy, or anything with __dlpack__) goes through nanobind's ndarray, its device as DLPack gives it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>

#include "counters.h"
#include "qksoftmax/qksoftmax.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

constexpr size_t kMaxTensors = 7;  // backward: q, k, dp, p, lse, dq, dk
constexpr int kDTypes = 4;         // qksoftmax::DType's values, in order

uint64_t conversions = 0;  // tensors described (under the GIL), for counters()

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

[[noreturn]] void raise_dtype(const char* name) {
  raise(PyExc_TypeError, std::string(name) + " must have dtype bfloat16, float16, float32 or float64");
}

// torch's tensor type and dtypes, looked up once torch has been imported (by the caller: a torch tensor
// cannot exist before), and the attribute names asked of a tensor, interned.
struct Torch {
  nb::object tensor_type;
  std::array<nb::object, kDTypes> dtypes;  // torch.bfloat16, float16, float32, float64
  nb::object strided;                      // the layout of a dense tensor
  nb::object data_ptr, shape, stride, dtype, is_cuda, is_cpu, get_device, device, layout, detach, contiguous;
  nb::object empty;                        // torch.empty, called with sizes and the keywords below
  nb::object dtype_device;                 // ("dtype", "device"): the keyword names of an allocation
  nb::object uint8;                        // the dtype of a workspace
  nb::object raw_stream;  // torch._C._cuda_getCurrentRawStream (None where this torch lacks it)
  nb::object parameter_type;  // torch.nn.Parameter: with torch.Tensor, the plain tensor types
  // What tells that a mode or transform is active (None each where this torch lacks it): the length of the
  // dispatch-mode stack, whether a torch-function mode is on, the innermost functorch transform.
  nb::object dispatch_modes, function_modes, transforms;
};

const Torch* torch_api() {
  // Filled once, under the GIL, and never freed: Python objects must not be released after the interpreter.
  static const Torch* api = nullptr;
  if (api) return api;
  PyObject* module = PyImport_GetModule(nb::str("torch").ptr());
  if (module == nullptr) {
    if (PyErr_Occurred()) throw nb::python_error();
    return nullptr;
  }
  const nb::object torch = nb::steal(module);
  Torch t;
  t.tensor_type = torch.attr("Tensor");
  const char* dtype_names[kDTypes] = {"bfloat16", "float16", "float32", "float64"};
  for (int i = 0; i < kDTypes; ++i) t.dtypes[size_t(i)] = torch.attr(dtype_names[i]);
  t.strided = torch.attr("strided");
  t.empty = torch.attr("empty");
  t.uint8 = torch.attr("uint8");
  const nb::object torch_c = torch.attr("_C");
  t.raw_stream = nb::getattr(torch_c, "_cuda_getCurrentRawStream", nb::none());
  t.parameter_type = torch.attr("nn").attr("Parameter");
  t.dispatch_modes = nb::getattr(torch_c, "_len_torch_dispatch_stack", nb::none());
  t.function_modes = nb::getattr(torch_c, "_is_torch_function_mode_enabled", nb::none());
  const nb::object functorch = nb::getattr(torch_c, "_functorch", nb::none());
  t.transforms = functorch.is_none() ? nb::none() : nb::getattr(functorch, "peek_interpreter_stack", nb::none());
  for (auto [field, name] : {std::pair{&t.data_ptr, "data_ptr"}, {&t.shape, "shape"}, {&t.stride, "stride"},
                             {&t.dtype, "dtype"}, {&t.is_cuda, "is_cuda"}, {&t.is_cpu, "is_cpu"},
                             {&t.get_device, "get_device"}, {&t.device, "device"}, {&t.layout, "layout"},
                             {&t.detach, "detach"}, {&t.contiguous, "contiguous"}}) {
    PyObject* interned = PyUnicode_InternFromString(name);
    if (interned == nullptr) throw nb::python_error();
    *field = nb::steal(interned);
  }
  t.dtype_device = nb::make_tuple(t.dtype, t.device);
  api = new Torch(std::move(t));
  return api;
}

nb::object attribute(nb::handle obj, const nb::object& name) {
  PyObject* value = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (value == nullptr) throw nb::python_error();
  return nb::steal(value);
}

nb::object call_method(nb::handle obj, const nb::object& name) {
  PyObject* value = PyObject_CallMethodNoArgs(obj.ptr(), name.ptr());
  if (value == nullptr) throw nb::python_error();
  return nb::steal(value);
}

int64_t to_int64(nb::handle value) {
  const long long v = PyLong_AsLongLong(value.ptr());
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

void check_rank(size_t rank, const char* name) {
  if (rank > size_t(qksoftmax::kMaxRank)) raise(PyExc_ValueError, std::string(name) + " has too many dimensions");
}

enum class Access : uint8_t { kRead, kWrite };

// What a fused call (torch_forward / torch_backward) reuses of a described tensor to allocate the outputs.
struct Seen {
  nb::object shape;  // torch.Size, whose items are the sizes of an output
  nb::object dtype;
};

// `keep` receives the object whose memory the description points into: t, or the copy made of it (at most one);
// `seen`, where given, t's shape and dtype objects.
qksoftmax::TensorDesc describe_torch(const Torch& torch, nb::handle t, const char* name, Access access,
                                     nb::object* keep, Seen* seen = nullptr, bool copied = false) {
  qksoftmax::TensorDesc desc;
  nb::object dtype = attribute(t, torch.dtype);
  int code = 0;
  while (code < kDTypes && !dtype.is(torch.dtypes[size_t(code)])) ++code;
  if (code == kDTypes) raise_dtype(name);
  desc.dtype = qksoftmax::DType(code);
  if (attribute(t, torch.is_cuda).is(Py_True)) {
    desc.device = qksoftmax::Device::kCUDA;
    desc.device_index = int(to_int64(call_method(t, torch.get_device)));
  } else if (!attribute(t, torch.is_cpu).is(Py_True)) {
    raise(PyExc_ValueError, std::string(name) + " must be on the CPU or a CUDA device, got " +
                                nb::cast<std::string>(nb::str(attribute(t, torch.device))));
  }
  nb::object shape = attribute(t, torch.shape);
  const nb::object strides = call_method(t, torch.stride);
  if (!PyTuple_Check(shape.ptr()) || !PyTuple_Check(strides.ptr()) ||
      PyTuple_GET_SIZE(shape.ptr()) != PyTuple_GET_SIZE(strides.ptr())) {
    raise(PyExc_TypeError, std::string(name) + ": a torch.Tensor whose shape and stride() are not tuples");
  }
  const size_t rank = size_t(PyTuple_GET_SIZE(shape.ptr()));
  check_rank(rank, name);
  desc.rank = int(rank);
  for (size_t i = 0; i < rank; ++i) {
    desc.shape[i] = to_int64(PyTuple_GET_ITEM(shape.ptr(), Py_ssize_t(i)));
    desc.stride[i] = to_int64(PyTuple_GET_ITEM(strides.ptr(), Py_ssize_t(i)));
  }
  const size_t last = rank - 1;
  if (desc.device == qksoftmax::Device::kCUDA && access == Access::kRead && !copied && rank > 0 &&
      desc.shape[last] > 1 && desc.stride[last] != 1) {
    const nb::object copy = call_method(call_method(t, torch.detach), torch.contiguous);
    return describe_torch(torch, copy, name, access, keep, seen, true);
  }
  *keep = nb::borrow(t);
  if (seen != nullptr) *seen = {std::move(shape), std::move(dtype)};
  PyObject* address = PyObject_CallMethodNoArgs(t.ptr(), torch.data_ptr.ptr());
  if (address == nullptr) {  // sparse and other layouts have no data pointer to describe
    nb::python_error error;
    const nb::object layout = attribute(t, torch.layout);
    if (layout.is(torch.strided)) throw error;
    raise(PyExc_TypeError, std::string(name) + " must be a strided (dense) torch.Tensor, got layout " +
                               nb::cast<std::string>(nb::str(layout)));
  }
  desc.data = PyLong_AsVoidPtr(nb::steal(address).ptr());
  if (desc.data == nullptr && PyErr_Occurred()) throw nb::python_error();
  return desc;
}

qksoftmax::DType to_dtype(nb::dlpack::dtype dtype, const char* name) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dtype.code);
  if (dtype.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Bfloat && dtype.bits == 16) return qksoftmax::DType::kBFloat16;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 16) return qksoftmax::DType::kFloat16;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 32) return qksoftmax::DType::kFloat32;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 64) return qksoftmax::DType::kFloat64;
  }
  raise_dtype(name);
}

template <class Array>
qksoftmax::TensorDesc describe_array(const Array& array, const char* name) {
  qksoftmax::TensorDesc desc;
  check_rank(array.ndim(), name);
  desc.data = const_cast<void*>(static_cast<const void*>(array.data()));
  desc.dtype = to_dtype(array.dtype(), name);
  if (array.device_type() == nb::device::cuda::value) {
    desc.device = qksoftmax::Device::kCUDA;
    desc.device_index = array.device_id();
  } else if (array.device_type() != nb::device::cpu::value) {
    raise(PyExc_ValueError, std::string(name) + " must be on the CPU or a CUDA device");
  }
  desc.rank = static_cast<int>(array.ndim());
  for (int i = 0; i < desc.rank; ++i) {
    desc.shape[i] = static_cast<int64_t>(array.shape(i));
    desc.stride[i] = array.stride(i);
  }
  return desc;
}

// The one conversion of a tensor argument (None: absent); `keep` receives what the plan must keep alive.
qksoftmax::TensorDesc describe(nb::handle obj, const char* name, Access access, nb::object* keep) {
  *keep = nb::borrow(obj);
  if (obj.is_none()) return {};
  ++conversions;
  if (const Torch* torch = torch_api(); torch && PyObject_TypeCheck(obj.ptr(), (PyTypeObject*)torch->tensor_type.ptr())) {
    return describe_torch(*torch, obj, name, access, keep);
  }
  if (access == Access::kRead) {
    nb::ndarray<nb::ro> array;
    if (nb::try_cast(obj, array, false)) return describe_array(array, name);
  } else {
    nb::ndarray<> array;
    if (nb::try_cast(obj, array, false)) return describe_array(array, name);
  }
  raise(PyExc_TypeError, std::string(name) + " must be a torch.Tensor or an array (buffer protocol or DLPack)" +
                             (access == Access::kWrite ? ", writable" : "") + ", got " +
                             nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(obj.ptr())).attr("__name__"))));
}

qksoftmax::Options make_options(std::optional<double> scale, bool causal, qksoftmax::BackwardMode mode) {
  qksoftmax::Options options;
  options.scale = scale;
  options.mask = causal ? qksoftmax::Mask::kCausal : qksoftmax::Mask::kNone;
  options.mode = mode;
  return options;
}

// A validated call and the tensors it points into, kept alive as long as the plan is.
struct Plan {
  qksoftmax::Plan plan;
  std::array<nb::object, kMaxTensors> tensors;
};

Plan plan_forward(nb::handle q, nb::handle k, nb::handle p, nb::handle lse, std::optional<double> scale, bool causal) {
  Plan plan;
  auto& keep = plan.tensors;
  const qksoftmax::ForwardArgs args{
      describe(q, "q", Access::kRead, &keep[0]), describe(k, "k", Access::kRead, &keep[1]),
      describe(p, "p", Access::kWrite, &keep[2]), describe(lse, "lse", Access::kWrite, &keep[3])};
  check(qksoftmax::plan_forward(args, make_options(scale, causal, qksoftmax::BackwardMode::kRecompute), &plan.plan));
  return plan;
}

Plan plan_backward(nb::handle q, nb::handle k, nb::handle dp, nb::handle p, nb::handle lse, nb::handle dq,
                   nb::handle dk, std::optional<double> scale, bool causal) {
  Plan plan;
  auto& keep = plan.tensors;
  const qksoftmax::BackwardArgs args{
      describe(q, "q", Access::kRead, &keep[0]),     describe(k, "k", Access::kRead, &keep[1]),
      describe(dp, "dp", Access::kRead, &keep[2]),   describe(p, "p", Access::kRead, &keep[3]),
      describe(lse, "lse", Access::kRead, &keep[4]), describe(dq, "dq", Access::kWrite, &keep[5]),
      describe(dk, "dk", Access::kWrite, &keep[6])};
  const auto mode = p.is_none() ? qksoftmax::BackwardMode::kRecompute : qksoftmax::BackwardMode::kSavedP;
  check(qksoftmax::plan_backward(args, make_options(scale, causal, mode), &plan.plan));
  return plan;
}

void run(const Plan& self, uintptr_t workspace, size_t workspace_bytes, uintptr_t stream) {
  qksoftmax::Status status;
  {
    nb::gil_scoped_release release;
    status = self.plan.run(reinterpret_cast<void*>(workspace), workspace_bytes,
                           reinterpret_cast<CUstream_st*>(stream));
  }
  check(status);
}

// The fused calls on torch tensors (torch_forward / torch_backward): the inputs described, the outputs allocated
// (torch.empty, one call each, on q's device), the call validated once, then run at once: on CUDA with its
// workspace from torch.empty and on the current stream of the tensors' device. One call from Python per operation.

const Torch& require_torch(nb::handle q) {
  const Torch* torch = torch_api();
  if (torch == nullptr || !PyObject_TypeCheck(q.ptr(), (PyTypeObject*)torch->tensor_type.ptr())) {
    raise(PyExc_TypeError, "q must be a torch.Tensor, got " +
                               nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(q.ptr())).attr("__name__"))));
  }
  return *torch;
}

// Whether an eager call may skip the ops (what _ops.plain_eager says in Python): every tensor given (None:
// absent) of type torch.Tensor or torch.nn.Parameter exactly (no subclass: fake, functional, DTensor, ...), and
// no dispatch or torch-function mode and no functorch transform active. False where this torch cannot tell.
bool plain_eager(const Torch& torch, std::initializer_list<nb::handle> tensors) {
  for (nb::handle t : tensors) {
    const PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(t.ptr()));
    if (!t.is_none() && type != torch.tensor_type.ptr() && type != torch.parameter_type.ptr()) return false;
  }
  if (torch.dispatch_modes.is_none() || torch.function_modes.is_none() || torch.transforms.is_none()) return false;
  const nb::object modes = torch.dispatch_modes();
  if (!modes.is_valid() || to_int64(modes) != 0) return false;
  const nb::object function_mode = torch.function_modes();
  if (!function_mode.is(Py_False)) return false;
  return torch.transforms().is_none();
}

// describe() for a fused call: a torch.Tensor or None.
qksoftmax::TensorDesc describe_input(const Torch& torch, nb::handle t, const char* name, nb::object* keep,
                                     Seen* seen = nullptr) {
  if (t.is_none()) return {};
  if (!PyObject_TypeCheck(t.ptr(), (PyTypeObject*)torch.tensor_type.ptr())) {
    raise(PyExc_TypeError, std::string(name) + " must be a torch.Tensor like q, got " +
                               nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(t.ptr())).attr("__name__"))));
  }
  ++conversions;
  return describe_torch(torch, t, name, Access::kRead, keep, seen);
}

// torch.empty(*sizes, dtype=dtype, device=device).
nb::object empty(const Torch& torch, PyObject* const* sizes, size_t count, nb::handle dtype, nb::handle device) {
  PyObject* args[qksoftmax::kMaxRank + 2];
  for (size_t i = 0; i < count; ++i) args[i] = sizes[i];
  args[count] = dtype.ptr();
  args[count + 1] = device.ptr();
  PyObject* out = PyObject_Vectorcall(torch.empty.ptr(), args, count, torch.dtype_device.ptr());
  if (out == nullptr) throw nb::python_error();
  return nb::steal(out);
}

// The sizes of a shape (torch.Size) as the arguments of empty().
void sizes_of(const Seen& seen, PyObject** sizes, int count) {
  for (int i = 0; i < count; ++i) sizes[i] = PyTuple_GET_ITEM(seen.shape.ptr(), Py_ssize_t(i));
}

void* data_pointer(const Torch& torch, nb::handle t) {
  const nb::object address = call_method(t, torch.data_ptr);
  void* data = PyLong_AsVoidPtr(address.ptr());
  if (data == nullptr && PyErr_Occurred()) throw nb::python_error();
  return data;
}

// An output that empty() has just made on `like`'s device: contiguous, of this shape and dtype, so only its
// address is asked of it (one conversion all the same).
qksoftmax::TensorDesc describe_output(const Torch& torch, nb::handle t, const qksoftmax::TensorDesc& like,
                                      const int64_t* shape, int rank, qksoftmax::DType dtype) {
  ++conversions;
  qksoftmax::TensorDesc desc;
  desc.dtype = dtype;
  desc.device = like.device;
  desc.device_index = like.device_index;
  desc.rank = rank;
  int64_t stride = 1;  // torch's contiguous strides: a size of 0 counts as 1
  for (int i = rank - 1; i >= 0; --i) {
    desc.shape[i] = shape[i];
    desc.stride[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  desc.data = data_pointer(torch, t);
  return desc;
}

// Runs a validated call. On CUDA: the workspace (where the call needs one) from torch.empty on that device,
// freed once the launch is queued (the caching allocator reuses it in stream order), and the launch on the
// device's current stream, as torch reports it.
void launch(const Torch& torch, const qksoftmax::Plan& plan, nb::handle device) {
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  uintptr_t stream = 0;
  nb::object buffer;
  const int device_index = plan.device_index();
  if (device_index >= 0) {
    workspace_bytes = plan.workspace_bytes();
    if (workspace_bytes != 0) {
      const nb::object size = nb::steal(PyLong_FromSize_t(workspace_bytes + qksoftmax::kWorkspaceAlignment - 1));
      if (!size.is_valid()) throw nb::python_error();
      PyObject* sizes[1] = {size.ptr()};
      buffer = empty(torch, sizes, 1, torch.uint8, device);
      const uintptr_t address = reinterpret_cast<uintptr_t>(data_pointer(torch, buffer));
      const uintptr_t alignment = qksoftmax::kWorkspaceAlignment;
      workspace = reinterpret_cast<void*>((address + alignment - 1) / alignment * alignment);
    }
    const nb::object index = nb::int_(device_index);
    nb::object handle;
    if (!torch.raw_stream.is_none()) {
      handle = torch.raw_stream(index);
    } else {
      handle = nb::module_::import_("torch").attr("cuda").attr("current_stream")(index).attr("cuda_stream");
    }
    stream = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(handle.ptr()));
    if (stream == 0 && PyErr_Occurred()) throw nb::python_error();
  }
  qksoftmax::Status status;
  {
    nb::gil_scoped_release release;
    status = plan.run(workspace, workspace_bytes, reinterpret_cast<CUstream_st*>(stream));
  }
  check(status);
}

// The sizes of q and k that p's shape is made of; the C++ API reports any other wrong rank.
void check_forward_ranks(const qksoftmax::TensorDesc& q, const qksoftmax::TensorDesc& k) {
  for (auto [t, name, dims] : {std::tuple{&q, "q", "(B, Hq, Sq, D)"}, {&k, "k", "(B, Hk, Sk, D)"}}) {
    if (t->rank < 3) {
      raise(PyExc_ValueError,
            std::string(name) + ": expected rank 4 " + dims + ", got rank " + std::to_string(t->rank));
    }
  }
}

// q and k of a fused call described (keep[0], keep[1]), what the outputs are made from, and q's device.
struct QK {
  Seen q, k;
  nb::object device;
};

QK describe_q_k(const Torch& torch, nb::handle q, nb::handle k, nb::object* keep, qksoftmax::TensorDesc* q_desc,
                qksoftmax::TensorDesc* k_desc) {
  QK seen;
  *q_desc = describe_input(torch, q, "q", &keep[0], &seen.q);
  *k_desc = describe_input(torch, k, "k", &keep[1], &seen.k);
  if (k.is_none()) raise(PyExc_TypeError, "k must be a torch.Tensor like q, got NoneType");
  seen.device = attribute(q, torch.device);
  return seen;
}

nb::object torch_forward(nb::handle q, nb::handle k, std::optional<double> scale, bool causal, bool plain_only) {
  const Torch& torch = require_torch(q);
  if (plain_only && !plain_eager(torch, {q, k})) return nb::none();
  std::array<nb::object, 2> keep;
  qksoftmax::ForwardArgs args;
  const auto [q_seen, k_seen, device] = describe_q_k(torch, q, k, keep.data(), &args.q, &args.k);
  check_forward_ranks(args.q, args.k);
  PyObject* sizes[4];
  sizes_of(q_seen, sizes, 3);
  sizes[3] = PyTuple_GET_ITEM(k_seen.shape.ptr(), 2);
  const int64_t shape[4] = {args.q.shape[0], args.q.shape[1], args.q.shape[2], args.k.shape[2]};
  nb::object p = empty(torch, sizes, 4, q_seen.dtype, device);
  nb::object lse = empty(torch, sizes, 3, torch.dtypes[size_t(qksoftmax::DType::kFloat32)], device);
  args.p = describe_output(torch, p, args.q, shape, 4, args.q.dtype);
  args.lse = describe_output(torch, lse, args.q, shape, 3, qksoftmax::DType::kFloat32);
  qksoftmax::Plan plan;
  check(qksoftmax::plan_forward(args, make_options(scale, causal, qksoftmax::BackwardMode::kRecompute), &plan));
  launch(torch, plan, device);
  return nb::make_tuple(p, lse);
}

nb::object torch_backward(nb::handle q, nb::handle k, nb::handle dp, nb::handle p, nb::handle lse,
                          std::optional<double> scale, bool causal, bool plain_only) {
  const Torch& torch = require_torch(q);
  if (plain_only && !plain_eager(torch, {q, k, dp, p, lse})) return nb::none();
  std::array<nb::object, 5> keep;
  qksoftmax::BackwardArgs args;
  const auto [q_seen, k_seen, device] = describe_q_k(torch, q, k, keep.data(), &args.q, &args.k);
  args.dp = describe_input(torch, dp, "dp", &keep[2]);
  args.p = describe_input(torch, p, "p", &keep[3]);
  args.lse = describe_input(torch, lse, "lse", &keep[4]);
  PyObject* sizes[qksoftmax::kMaxRank];
  sizes_of(q_seen, sizes, args.q.rank);
  nb::object dq = empty(torch, sizes, size_t(args.q.rank), q_seen.dtype, device);
  sizes_of(k_seen, sizes, args.k.rank);
  nb::object dk = empty(torch, sizes, size_t(args.k.rank), q_seen.dtype, device);
  args.dq = describe_output(torch, dq, args.q, args.q.shape, args.q.rank, args.q.dtype);
  args.dk = describe_output(torch, dk, args.q, args.k.shape, args.k.rank, args.q.dtype);
  const auto mode = p.is_none() ? qksoftmax::BackwardMode::kRecompute : qksoftmax::BackwardMode::kSavedP;
  qksoftmax::Plan plan;
  check(qksoftmax::plan_backward(args, make_options(scale, causal, mode), &plan));
  launch(torch, plan, device);
  return nb::make_tuple(dq, dk);
}

nb::dict counters() {
  const qksoftmax::detail::CallCounters& c = qksoftmax::detail::call_counters();
  nb::dict out;
  out["validations"] = c.validations.load();
  out["pointer_queries"] = c.pointer_queries.load();
  out["conversions"] = conversions;
  return out;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "qksoftmax C++ API binding (use the qksoftmax package, not this module)";
  m.attr("WORKSPACE_ALIGNMENT") = qksoftmax::kWorkspaceAlignment;

  m.def("version", &qksoftmax::version, "The library's version, \"major.minor.patch\".");

  nb::class_<Plan>(m, "Plan", "A validated call: run it with a workspace of workspace_bytes bytes.")
      .def_prop_ro("workspace_bytes", [](const Plan& p) { return p.plan.workspace_bytes(); },
                   "Workspace bytes the call needs, on its device, aligned to WORKSPACE_ALIGNMENT.")
      .def_prop_ro("device_index", [](const Plan& p) { return p.plan.device_index(); },
                   "The CUDA device the call runs on; -1 on the CPU.")
      .def("run", &run, "workspace"_a, "workspace_bytes"_a, "stream"_a,
           "Launches the call on the plan's device, on `stream` (a cudaStream_t of that device as an int, 0 for "
           "its default stream; ignored on the CPU), with the workspace at address `workspace`.");

  m.def("plan_forward", &plan_forward, "q"_a, "k"_a, "p"_a, "lse"_a.none(), "scale"_a.none(), "causal"_a,
        "Validates P = softmax(mask(scale * q k^T)) into p (and the log-sum-exp into lse, if given).");
  m.def("plan_backward", &plan_backward, "q"_a, "k"_a, "dp"_a, "p"_a.none(), "lse"_a.none(), "dq"_a, "dk"_a,
        "scale"_a.none(), "causal"_a,
        "Validates dq, dk from dp: saved-P mode when p is given, recompute mode otherwise.");
  m.def("torch_forward", &torch_forward, "q"_a, "k"_a.none(), "scale"_a.none(), "causal"_a, "plain_only"_a = false,
        "plan_forward and its run in one call on torch tensors: returns (p, lse), allocated with torch.empty on q's "
        "device, computed on that device's current stream. With plain_only, returns None without running unless "
        "the tensors are plain (torch.Tensor or nn.Parameter) and no mode or functorch transform is active.");
  m.def("torch_backward", &torch_backward, "q"_a, "k"_a.none(), "dp"_a.none(), "p"_a.none(), "lse"_a.none(),
        "scale"_a.none(), "causal"_a, "plain_only"_a = false,
        "plan_backward and its run in one call on torch tensors: returns (dq, dk), as torch_forward does (p, lse).");
  m.def(
      "plain_eager",
      [](nb::handle q, nb::handle k) {
        const Torch* torch = torch_api();
        return torch != nullptr && plain_eager(*torch, {q, k});
      },
      "q"_a.none(), "k"_a.none(),
      "Whether an eager call on q and k may skip the custom ops: both of type torch.Tensor or torch.nn.Parameter "
      "exactly, and no dispatch or torch-function mode and no functorch transform active.");
  m.def("counters", &counters,
        "Totals since the module was loaded: validations (the C++ API's), pointer_queries (asked of the CUDA "
        "driver), conversions (tensor arguments described). The tests keep each call at one validation.");
}
