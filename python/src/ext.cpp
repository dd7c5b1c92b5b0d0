// qksoftmax._C: the nanobind binding of the C++ API (include/qksoftmax/qksoftmax.h).
//
// One entry per operation: plan_forward / plan_backward describe each tensor once, validate the call once
// (qksoftmax::plan_forward / plan_backward) and return a Plan that knows the workspace the call needs;
// Plan.run launches it with the caller's workspace and stream. The Python layer (python/qksoftmax) allocates
// the outputs before the plan and the workspace between plan and run: nothing here calls back into Python.
//
// Tensors: a plain torch.Tensor (or nn.Parameter) is described from one C-level DLPack export
// (torch._C._to_dlpack: data pointer, shape, strides, dtype and device in one call, released at once; not
// __dlpack__, which is Python code); any other tensor, or one that export refuses or gives in terms this
// library does not take, from its own attributes (data_ptr, shape, stride, dtype, device), which also phrase
// every refusal. Either way the description declares the tensor's CUDA device (TensorDesc::device_index), so the
// library asks the driver nothing about its pointer. An input on a CUDA device whose last dimension is not
// dense (which the CUDA backend refuses) is described as its contiguous copy (tensor.detach().contiguous(), on
// that device's current stream), which the plan keeps: the strides are read here anyway, so the Python layer
// asks nothing of a tensor before the call. Any other array (numpy, or anything with __dlpack__) goes through
// nanobind's ndarray, its device as DLPack gives it.
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
  nb::object new_empty;                    // the method that allocates on a plain tensor's device
  nb::object empty;                        // torch.empty, called with sizes and the keywords below
  nb::object dtype_device;                 // ("dtype", "device"): the keyword names of torch.empty's allocation
  nb::object dtype_only;                   // ("dtype",): new_empty's keyword where the dtype is not q's
  nb::object uint8;                        // the dtype of a workspace
  nb::object to_dlpack;  // torch._C._to_dlpack (None where this torch lacks it: the attributes are read instead)
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
  t.to_dlpack = nb::getattr(torch_c, "_to_dlpack", nb::none());
  t.parameter_type = torch.attr("nn").attr("Parameter");
  t.dispatch_modes = nb::getattr(torch_c, "_len_torch_dispatch_stack", nb::none());
  t.function_modes = nb::getattr(torch_c, "_is_torch_function_mode_enabled", nb::none());
  const nb::object functorch = nb::getattr(torch_c, "_functorch", nb::none());
  t.transforms = functorch.is_none() ? nb::none() : nb::getattr(functorch, "peek_interpreter_stack", nb::none());
  for (auto [field, name] : {std::pair{&t.data_ptr, "data_ptr"}, {&t.shape, "shape"}, {&t.stride, "stride"},
                             {&t.dtype, "dtype"}, {&t.is_cuda, "is_cuda"}, {&t.is_cpu, "is_cpu"},
                             {&t.get_device, "get_device"}, {&t.device, "device"}, {&t.layout, "layout"},
                             {&t.detach, "detach"}, {&t.contiguous, "contiguous"}, {&t.new_empty, "new_empty"}}) {
    PyObject* interned = PyUnicode_InternFromString(name);
    if (interned == nullptr) throw nb::python_error();
    *field = nb::steal(interned);
  }
  t.dtype_device = nb::make_tuple(t.dtype, t.device);
  t.dtype_only = nb::make_tuple(t.dtype);
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

// torch.Tensor or nn.Parameter exactly: no subclass, whose attributes and methods may be overridden.
bool plain_type(const Torch& torch, nb::handle t) {
  const PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(t.ptr()));
  return type == torch.tensor_type.ptr() || type == torch.parameter_type.ptr();
}

// The library's dtype of a DLPack dtype (nullopt: one it does not take).
std::optional<qksoftmax::DType> from_dlpack(nb::dlpack::dtype dtype) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dtype.code);
  if (dtype.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Bfloat && dtype.bits == 16) return qksoftmax::DType::kBFloat16;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 16) return qksoftmax::DType::kFloat16;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 32) return qksoftmax::DType::kFloat32;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 64) return qksoftmax::DType::kFloat64;
  }
  return std::nullopt;
}

qksoftmax::DType to_dtype(nb::dlpack::dtype dtype, const char* name) {
  if (const std::optional<qksoftmax::DType> known = from_dlpack(dtype)) return *known;
  raise_dtype(name);
}

// A legacy DLPack capsule ("dltensor") holds a managed tensor (dlpack.h, whose ABI is fixed).
struct ManagedTensor {
  nb::dlpack::dltensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};
constexpr const char* kDlpackCapsule = "dltensor";

// A plain tensor described by one C-level DLPack export, released before returning (the caller keeps t, whose
// memory it is). nullopt where the export fails or gives what the attribute reading may refuse (a dtype or
// device this library does not take, a rank past kMaxRank): that reading then describes t or phrases the error.
std::optional<qksoftmax::TensorDesc> describe_dlpack(const Torch& torch, nb::handle t) {
  PyObject* capsule = PyObject_CallOneArg(torch.to_dlpack.ptr(), t.ptr());
  if (capsule == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  const nb::object release = nb::steal(capsule);  // unconsumed, the capsule's destructor calls the deleter
  const auto* managed = static_cast<const ManagedTensor*>(PyCapsule_GetPointer(capsule, kDlpackCapsule));
  if (managed == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  const nb::dlpack::dltensor& dl = managed->dl_tensor;
  const std::optional<qksoftmax::DType> dtype = from_dlpack(dl.dtype);
  if (!dtype || dl.ndim < 0 || dl.ndim > qksoftmax::kMaxRank) return std::nullopt;
  qksoftmax::TensorDesc desc;
  desc.dtype = *dtype;
  if (dl.device.device_type == nb::device::cuda::value) {
    desc.device = qksoftmax::Device::kCUDA;
    desc.device_index = dl.device.device_id;
  } else if (dl.device.device_type != nb::device::cpu::value) {
    return std::nullopt;
  }
  desc.rank = dl.ndim;
  int64_t compact = 1;  // null strides: the compact row-major layout
  for (int i = desc.rank - 1; i >= 0; --i) {
    desc.shape[i] = dl.shape[i];
    desc.stride[i] = dl.strides != nullptr ? dl.strides[i] : compact;
    compact *= dl.shape[i];
  }
  desc.data = static_cast<char*>(dl.data) + dl.byte_offset;
  return desc;
}

qksoftmax::TensorDesc describe_torch(const Torch& torch, nb::handle t, const char* name, Access access,
                                     nb::object* keep, bool copied = false);

// An input on a CUDA device whose last dimension is not dense: described as its contiguous copy (once).
bool needs_copy(const qksoftmax::TensorDesc& desc, Access access, bool copied) {
  const int last = desc.rank - 1;
  return desc.device == qksoftmax::Device::kCUDA && access == Access::kRead && !copied && desc.rank > 0 &&
         desc.shape[last] > 1 && desc.stride[last] != 1;
}

qksoftmax::TensorDesc describe_copy(const Torch& torch, nb::handle t, const char* name, Access access,
                                    nb::object* keep) {
  const nb::object copy = call_method(call_method(t, torch.detach), torch.contiguous);
  return describe_torch(torch, copy, name, access, keep, true);
}

// t described from its attributes, which phrase every refusal in the caller's terms.
qksoftmax::TensorDesc describe_attributes(const Torch& torch, nb::handle t, const char* name, Access access,
                                          nb::object* keep, bool copied) {
  qksoftmax::TensorDesc desc;
  const nb::object dtype = attribute(t, torch.dtype);
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
  const nb::object shape = attribute(t, torch.shape);
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
  if (needs_copy(desc, access, copied)) return describe_copy(torch, t, name, access, keep);
  *keep = nb::borrow(t);
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

// `keep` receives the object whose memory the description points into: t, or the copy made of it (at most one).
// A plain tensor is exported once by DLPack where it can be; any other, by its attributes.
qksoftmax::TensorDesc describe_torch(const Torch& torch, nb::handle t, const char* name, Access access,
                                     nb::object* keep, bool copied) {
  std::optional<qksoftmax::TensorDesc> exported;
  if (!torch.to_dlpack.is_none() && plain_type(torch, t)) exported = describe_dlpack(torch, t);
  if (!exported) return describe_attributes(torch, t, name, access, keep, copied);
  if (needs_copy(*exported, access, copied)) return describe_copy(torch, t, name, access, keep);
  *keep = nb::borrow(t);
  return *exported;
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
// (one allocation each, on q's device: allocate), the call validated once, then run at once: on CUDA with its
// workspace allocated likewise and on the current stream of the tensors' device. One call from Python per operation.

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
    if (!t.is_none() && !plain_type(torch, t)) return false;
  }
  if (torch.dispatch_modes.is_none() || torch.function_modes.is_none() || torch.transforms.is_none()) return false;
  const nb::object modes = torch.dispatch_modes();
  if (!modes.is_valid() || to_int64(modes) != 0) return false;
  const nb::object function_mode = torch.function_modes();
  if (!function_mode.is(Py_False)) return false;
  return torch.transforms().is_none();
}

// describe() for a fused call: a torch.Tensor or None.
qksoftmax::TensorDesc describe_input(const Torch& torch, nb::handle t, const char* name, nb::object* keep) {
  if (t.is_none()) return {};
  if (!PyObject_TypeCheck(t.ptr(), (PyTypeObject*)torch.tensor_type.ptr())) {
    raise(PyExc_TypeError, std::string(name) + " must be a torch.Tensor like q, got " +
                               nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(t.ptr())).attr("__name__"))));
  }
  ++conversions;
  return describe_torch(torch, t, name, Access::kRead, keep);
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

// A contiguous tensor of this shape on q's device, of q's dtype or of `dtype` where given: on a plain q
// q.new_empty(*shape), which has no keyword to parse unless the dtype is another (the allocation costs about a
// tenth less than torch.empty's); on any other, whose new_empty may be overridden, torch.empty(*shape,
// dtype=..., device=q.device).
nb::object allocate(const Torch& torch, nb::handle q, const int64_t* shape, int rank, nb::handle dtype = {}) {
  std::array<nb::object, qksoftmax::kMaxRank> sizes;
  PyObject* args[qksoftmax::kMaxRank + 2];  // q, the sizes, the dtype
  for (int i = 0; i < rank; ++i) {
    sizes[size_t(i)] = nb::steal(PyLong_FromLongLong(shape[i]));
    if (!sizes[size_t(i)].is_valid()) throw nb::python_error();
    args[i + 1] = sizes[size_t(i)].ptr();
  }
  if (!plain_type(torch, q)) {
    const nb::object q_dtype = dtype.is_valid() ? nb::borrow(dtype) : attribute(q, torch.dtype);
    return empty(torch, args + 1, size_t(rank), q_dtype, attribute(q, torch.device));
  }
  args[0] = q.ptr();
  size_t count = size_t(rank) + 1;
  if (dtype.is_valid()) args[count] = dtype.ptr();
  PyObject* out = PyObject_VectorcallMethod(torch.new_empty.ptr(), args, count,
                                            dtype.is_valid() ? torch.dtype_only.ptr() : nullptr);
  if (out == nullptr) throw nb::python_error();
  return nb::steal(out);
}

void* data_pointer(const Torch& torch, nb::handle t) {
  const nb::object address = call_method(t, torch.data_ptr);
  void* data = PyLong_AsVoidPtr(address.ptr());
  if (data == nullptr && PyErr_Occurred()) throw nb::python_error();
  return data;
}

// An output that allocate() has just made on `like`'s device: contiguous, of this shape and dtype, so only its
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

// Runs a validated call. On CUDA: the workspace (where the call needs one) allocated on q's device, freed
// once the launch is queued (the caching allocator reuses it in stream order), and the launch on the
// device's current stream, as torch reports it.
void launch(const Torch& torch, const qksoftmax::Plan& plan, nb::handle q) {
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  uintptr_t stream = 0;
  nb::object buffer;
  const int device_index = plan.device_index();
  if (device_index >= 0) {
    workspace_bytes = plan.workspace_bytes();
    if (workspace_bytes != 0) {
      const int64_t size = int64_t(workspace_bytes + qksoftmax::kWorkspaceAlignment - 1);
      buffer = allocate(torch, q, &size, 1, torch.uint8);
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

// q and k of a fused call described (keep[0], keep[1]).
void describe_q_k(const Torch& torch, nb::handle q, nb::handle k, nb::object* keep, qksoftmax::TensorDesc* q_desc,
                  qksoftmax::TensorDesc* k_desc) {
  *q_desc = describe_input(torch, q, "q", &keep[0]);
  *k_desc = describe_input(torch, k, "k", &keep[1]);
  if (k.is_none()) raise(PyExc_TypeError, "k must be a torch.Tensor like q, got NoneType");
}

nb::object torch_forward(nb::handle q, nb::handle k, std::optional<double> scale, bool causal, bool plain_only) {
  const Torch& torch = require_torch(q);
  if (plain_only && !plain_eager(torch, {q, k})) return nb::none();
  std::array<nb::object, 2> keep;
  qksoftmax::ForwardArgs args;
  describe_q_k(torch, q, k, keep.data(), &args.q, &args.k);
  check_forward_ranks(args.q, args.k);
  const int64_t shape[4] = {args.q.shape[0], args.q.shape[1], args.q.shape[2], args.k.shape[2]};
  nb::object p = allocate(torch, q, shape, 4);
  nb::object lse = allocate(torch, q, shape, 3, torch.dtypes[size_t(qksoftmax::DType::kFloat32)]);
  args.p = describe_output(torch, p, args.q, shape, 4, args.q.dtype);
  args.lse = describe_output(torch, lse, args.q, shape, 3, qksoftmax::DType::kFloat32);
  qksoftmax::Plan plan;
  check(qksoftmax::plan_forward(args, make_options(scale, causal, qksoftmax::BackwardMode::kRecompute), &plan));
  launch(torch, plan, q);
  return nb::make_tuple(p, lse);
}

nb::object torch_backward(nb::handle q, nb::handle k, nb::handle dp, nb::handle p, nb::handle lse,
                          std::optional<double> scale, bool causal, bool plain_only) {
  const Torch& torch = require_torch(q);
  if (plain_only && !plain_eager(torch, {q, k, dp, p, lse})) return nb::none();
  std::array<nb::object, 5> keep;
  qksoftmax::BackwardArgs args;
  describe_q_k(torch, q, k, keep.data(), &args.q, &args.k);
  args.dp = describe_input(torch, dp, "dp", &keep[2]);
  args.p = describe_input(torch, p, "p", &keep[3]);
  args.lse = describe_input(torch, lse, "lse", &keep[4]);
  nb::object dq = allocate(torch, q, args.q.shape, args.q.rank);
  nb::object dk = allocate(torch, q, args.k.shape, args.k.rank);
  args.dq = describe_output(torch, dq, args.q, args.q.shape, args.q.rank, args.q.dtype);
  args.dk = describe_output(torch, dk, args.q, args.k.shape, args.k.rank, args.q.dtype);
  const auto mode = p.is_none() ? qksoftmax::BackwardMode::kRecompute : qksoftmax::BackwardMode::kSavedP;
  qksoftmax::Plan plan;
  check(qksoftmax::plan_backward(args, make_options(scale, causal, mode), &plan));
  launch(torch, plan, q);
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
        "plan_forward and its run in one call on torch tensors: returns (p, lse), allocated on q's device, computed "
        "on that device's current stream. With plain_only, returns None without running unless the tensors are plain "
        "(torch.Tensor or nn.Parameter) and no mode or functorch transform is active.");
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
