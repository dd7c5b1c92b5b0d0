// What the CUDA driver says once, cached: the driver entry points, each device's properties, the kernels'
// shared-memory attribute per device; where a call's tensors live; the device scope of a call; the TMA
// descriptor encoder. Every cache is filled on first use and is thread-safe. Nothing here synchronises.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "counters.h"
#include "cuda/cuda_backend.h"
#include "cuda/device.h"
#include "cuda/tma_encode.h"

namespace qksoftmax::cuda {
namespace {

constexpr int kTmaMajor = 9;
// The driver ABI versions of the entry points (those CUTLASS asks for, and the first of each function).
constexpr unsigned kEncodeTiledVersion = 12000;
constexpr unsigned kContextVersion = 4000;
constexpr unsigned kErrorNameVersion = 6000;

Status cuda_error(cudaError_t err, const std::string& what) {
  cudaGetLastError();  // the error is returned here; it must not linger as the thread's last error
  return {Code::kCudaError, what + ": " + cudaGetErrorString(err)};
}

// The driver functions the library calls directly, resolved once per process through the runtime (the
// library does not link libcuda).
struct Driver {
  cudaError_t error = cudaSuccess;  // of the first lookup that failed
  const char* missing = nullptr;    // the function it was for
  PFN_cuTensorMapEncodeTiled_v12000 encode_tiled = nullptr;
  PFN_cuCtxGetCurrent_v4000 get_context = nullptr;
  PFN_cuCtxSetCurrent_v4000 set_context = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;

  template <class Fn>
  void resolve(const char* symbol, unsigned version, Fn* fn) {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &found);
    if (err == cudaSuccess && found == cudaDriverEntryPointSuccess) {
      *fn = reinterpret_cast<Fn>(address);
      return;
    }
    cudaGetLastError();
    if (missing == nullptr) {
      error = err == cudaSuccess ? cudaErrorSymbolNotFound : err;
      missing = symbol;
    }
  }

  Status unavailable() const {
    return {Code::kCudaError, std::string("the CUDA driver's ") + missing + " could not be found: " +
                                  cudaGetErrorString(error)};
  }
};

const Driver& driver() {
  static const Driver resolved = [] {
    Driver d;
    d.resolve("cuTensorMapEncodeTiled", kEncodeTiledVersion, &d.encode_tiled);
    d.resolve("cuCtxGetCurrent", kContextVersion, &d.get_context);
    d.resolve("cuCtxSetCurrent", kContextVersion, &d.set_context);
    d.resolve("cuGetErrorName", kErrorNameVersion, &d.error_name);
    return d;
  }();
  return resolved;
}

std::string result_name(CUresult result) {
  const char* name = nullptr;
  if (driver().error_name != nullptr && driver().error_name(result, &name) == CUDA_SUCCESS && name != nullptr) {
    return name;
  }
  return "CUresult " + std::to_string(int(result));
}

// One device's properties, asked for on its first use.
struct DeviceSlot {
  std::once_flag once;
  cudaError_t error = cudaSuccess;
  DeviceInfo info;
};

struct Devices {
  cudaError_t error = cudaSuccess;
  int count = 0;
  std::unique_ptr<DeviceSlot[]> slots;
};

// The devices this process sees (fixed for its lifetime: CUDA_VISIBLE_DEVICES is read once by the runtime).
const Devices& devices() {
  static const Devices seen = [] {
    Devices d;
    d.error = cudaGetDeviceCount(&d.count);
    if (d.error != cudaSuccess || d.count == 0) {
      cudaGetLastError();
      if (d.error == cudaSuccess) d.error = cudaErrorNoDevice;
      d.count = 0;
      return d;
    }
    d.slots = std::make_unique<DeviceSlot[]>(size_t(d.count));
    return d;
  }();
  return seen;
}

// Why no CUDA device can be used, in the caller's terms: without a driver the runtime reports an "insufficient"
// driver (version 0).
Status no_device() {
  const cudaError_t err = devices().error;
  int driver_version = 0;
  const bool no_driver = err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver_version) == cudaSuccess &&
                         driver_version == 0;
  cudaGetLastError();
  return {Code::kCudaError, std::string("q: no CUDA device is available (") +
                                (no_driver ? "no CUDA driver is installed" : cudaGetErrorString(err)) +
                                "); Device::kCPU runs the CPU backend"};
}

cudaError_t query_device(int device, DeviceInfo* info) {
  const std::pair<cudaDeviceAttr, int*> attributes[] = {
      {cudaDevAttrComputeCapabilityMajor, &info->major},
      {cudaDevAttrComputeCapabilityMinor, &info->minor},
      {cudaDevAttrMultiProcessorCount, &info->sm_count},
      {cudaDevAttrMaxSharedMemoryPerBlockOptin, &info->max_smem_per_block}};
  for (const auto& [attribute, value] : attributes) {
    if (cudaError_t err = cudaDeviceGetAttribute(value, attribute, device); err != cudaSuccess) return err;
  }
  info->tma = info->major >= kTmaMajor;
  return cudaSuccess;
}

// What encode_tma_tiled saw fail on this thread since the last take_tma_failure.
struct TmaFailure {
  bool failed = false;
  bool unresolved = false;  // the driver's encoder could not be found
  CUresult result = CUDA_SUCCESS;
};
thread_local TmaFailure tma_failure;

struct NamedOperand {
  const char* name;
  const Operand& op;
};

}  // namespace

Status device_info(int device, const DeviceInfo** info) {
  const Devices& all = devices();
  if (all.error != cudaSuccess) return no_device();
  if (device < 0 || device >= all.count) {
    return {Code::kInvalidArgument, "q: expected a CUDA device index below " + std::to_string(all.count) +
                                        " (the devices this process sees), got cuda:" + std::to_string(device)};
  }
  DeviceSlot& slot = all.slots[size_t(device)];
  std::call_once(slot.once, [&] {
    slot.error = query_device(device, &slot.info);
    if (slot.error != cudaSuccess) cudaGetLastError();
  });
  if (slot.error != cudaSuccess) {
    return {Code::kCudaError, "properties of CUDA device " + std::to_string(device) + ": " +
                                  cudaGetErrorString(slot.error)};
  }
  *info = &slot.info;
  return {};
}

Status reserve_dynamic_smem(const void* kernel, int bytes, const char* name) {
  // Per kernel, the shared memory already granted on each device (0: not yet).
  static std::mutex mutex;
  static std::unordered_map<const void*, std::vector<int>> granted;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_error(err, name);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = granted.find(kernel);
    if (found != granted.end() && size_t(device) < found->second.size() && found->second[size_t(device)] >= bytes) {
      return {};
    }
  }
  if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      err != cudaSuccess) {
    return cuda_error(err, std::string("launch of ") + name + " failed");
  }
  const std::lock_guard<std::mutex> lock(mutex);
  std::vector<int>& per_device = granted[kernel];
  if (per_device.size() <= size_t(device)) per_device.resize(size_t(device) + 1, 0);
  per_device[size_t(device)] = std::max(per_device[size_t(device)], bytes);
  return {};
}

CUresult encode_tma_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                          const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                          const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                          CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                          CUtensorMapFloatOOBfill fill) noexcept {
  const Driver& d = driver();
  if (d.encode_tiled == nullptr) {
    if (!tma_failure.failed) tma_failure = {true, true, CUDA_ERROR_NOT_FOUND};
    return CUDA_SUCCESS;
  }
  const CUresult result = d.encode_tiled(map, type, rank, address, dims, strides, box, element_strides, interleave,
                                         swizzle, promotion, fill);
  if (result != CUDA_SUCCESS && !tma_failure.failed) tma_failure = {true, false, result};
  return CUDA_SUCCESS;
}

Status take_tma_failure(const char* kernel) {
  if (!tma_failure.failed) return {};
  const TmaFailure failure = std::exchange(tma_failure, {});
  const std::string cause = failure.unresolved ? driver().unavailable().message()
                                               : "cuTensorMapEncodeTiled returned " + result_name(failure.result);
  return {Code::kCudaError,
          std::string(kernel) + ": a TMA descriptor failed to encode (" + cause + "); the kernel was not launched"};
}

Status locate(Problem* prob) {
  const Devices& all = devices();
  if (all.error != cudaSuccess) return no_device();
  if (prob->devices_declared) {
    const DeviceInfo* info = nullptr;
    return device_info(prob->device_index, &info);
  }
  const NamedOperand operands[] = {{"q", prob->q},   {"k", prob->k},   {"p", prob->p},
                                   {"dp", prob->dp}, {"lse", prob->lse}, {"p", prob->out_p},
                                   {"lse", prob->out_lse}, {"dq", prob->dq}, {"dk", prob->dk},
                                   {"lse", prob->unread_lse}};
  const void* asked[std::size(operands)] = {};
  size_t asked_count = 0;
  int device = prob->device_index;  // a declared device, or -1
  const char* device_from = device >= 0 ? "the declared device" : nullptr;
  for (const NamedOperand& o : operands) {
    if (!o.op.present() || std::find(asked, asked + asked_count, o.op.ptr) != asked + asked_count) continue;
    asked[asked_count++] = o.op.ptr;
    detail::count(detail::call_counters().pointer_queries);
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, o.op.ptr);
    if (err != cudaSuccess) cudaGetLastError();
    const bool on_device =
        err == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
    if (!on_device) {
      return {Code::kInvalidArgument,
              std::string(o.name) + ": data is not CUDA device memory (the tensor was declared Device::kCUDA)"};
    }
    if (device_from == nullptr) {
      device = attr.device;
      device_from = o.name;
    } else if (attr.device != device) {
      return {Code::kInvalidArgument, std::string(o.name) + ": expected memory of CUDA device " +
                                          std::to_string(device) + " like " + device_from + ", got memory of device " +
                                          std::to_string(attr.device) + " (the tensors of a call must be on one device)"};
    }
  }
  prob->device_index = device;
  const DeviceInfo* info = nullptr;
  return device_info(device, &info);
}

DeviceScope::~DeviceScope() {
  if (changed_) driver().set_context(reinterpret_cast<CUcontext>(previous_context_));
}

Status DeviceScope::enter(int device) {
  tma_failure = {};
  // A launch's error is read back as the thread's last error: one that an earlier runtime call left there (the
  // caller's failed cudaMalloc, say), already returned by that call, must not be taken for this call's.
  cudaGetLastError();
  const Driver& d = driver();
  if (d.get_context == nullptr || d.set_context == nullptr) return d.unavailable();
  CUcontext previous = nullptr;
  int current = -1;
  if (d.get_context(&previous) != CUDA_SUCCESS) previous = nullptr;
  if (previous != nullptr) {
    if (cudaError_t err = cudaGetDevice(&current); err != cudaSuccess) return cuda_error(err, "no usable CUDA device");
  }
  if (previous != nullptr && current == device) return {};
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return cuda_error(err, "cannot make CUDA device " + std::to_string(device) + " current");
  }
  // Restored as the driver's context, not with cudaSetDevice, which would create a context on a device the
  // thread never used: a thread that had no context gets none back (the runtime's device of such a thread is
  // then this call's, as after torch's own device guard).
  previous_context_ = previous;
  changed_ = true;
  return {};
}

}  // namespace qksoftmax::cuda
