#include "impl.h"

#include "cli.h"
#include "cuda_check.h"

namespace qkbench {
namespace {

class QkSoftmax final : public Impl {
 public:
  explicit QkSoftmax(bool deterministic) : deterministic_(deterministic) {}
  const char* name() const override { return deterministic_ ? kImplQkSoftmaxDeterministic : kImplQkSoftmax; }
  bool supports(Mode) const override { return true; }
  size_t planned_workspace_bytes(const CaseSpec&) const override { return 0; }

  Result workspace_bytes(const CaseSpec& spec, const TensorSet& set, size_t* bytes) const override {
    return library_result(library_workspace_bytes(spec, set, qksoftmax::Device::kCUDA, bytes, deterministic_),
                          "qksoftmax workspace size");
  }

  Result call(const CaseSpec& spec, const TensorSet& set, Workspace workspace, cudaStream_t stream) override {
    return library_result(
        library_call(spec, set, qksoftmax::Device::kCUDA, workspace.data, workspace.bytes, stream, deterministic_),
        "qksoftmax");
  }

 private:
  bool deterministic_;
};

}  // namespace

std::unique_ptr<Impl> make_qksoftmax_impl(bool deterministic) { return std::make_unique<QkSoftmax>(deterministic); }

}  // namespace qkbench
