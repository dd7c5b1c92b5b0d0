// Host memory aligned to qksoftmax::kWorkspaceAlignment (workspace and tensors of the CPU backend).
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#include "qksoftmax/qksoftmax.h"

namespace qkbench {

class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes)
      : data_(bytes ? new (kAlign) std::byte[bytes] : nullptr), bytes_(bytes) {}

  void* get() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  static constexpr std::align_val_t kAlign{qksoftmax::kWorkspaceAlignment};
  struct Delete {
    void operator()(std::byte* p) const { ::operator delete[](p, kAlign); }
  };
  std::unique_ptr<std::byte[], Delete> data_;
  size_t bytes_ = 0;
};

}  // namespace qkbench
