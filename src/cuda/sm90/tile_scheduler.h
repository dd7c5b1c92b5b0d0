// The persistent tile scheduler of the single-pass backward: each cluster walks the work items (batch, key
// head) from its index with the stride of the grid's cluster count. Every item of a problem has the same
// causal geometry and so the same work: a static order is also longest-first. `work` may be a multiple of
// `heads` (the step micro-benchmark walks the same heads again, their data resident in L2).
#pragma once

#include <cute/config.hpp>

#include <cstdint>

#include "problem.h"

namespace qksoftmax::cuda::sm90 {

struct WorkItem {
  int64_t b, kv_head;
};

class PersistentScheduler {
 public:
  CUTE_DEVICE PersistentScheduler(int64_t work, int64_t heads, int64_t hk, int cluster)
      : work_(work), heads_(heads), hk_(hk), next_(blockIdx.x / cluster), stride_(gridDim.x / cluster) {}

  // The next item of this cluster into `item`; false when none is left.
  CUTE_DEVICE bool next(WorkItem& item) {
    if (next_ >= work_) return false;
    const int64_t head = next_ % heads_;
    item = {head / hk_, head % hk_};
    next_ += stride_;
    return true;
  }

 private:
  int64_t work_, heads_, hk_, next_, stride_;
};

// The steps of a work item, in order: (query head of the key head's group, block of kBlockM rows), the row
// blocks of each query head in turn.
template <int kBlockM>
struct ItemSteps {
  int row_blocks;  // per query head
  int group;       // query heads per key head
  int count;       // steps per item (bwd_can_implement, checked at the launch, keeps it in 32 bits)

  CUTE_HOST_DEVICE explicit ItemSteps(const Problem& prob)
      : row_blocks(int((prob.Sq + kBlockM - 1) / kBlockM)), group(int(prob.group())), count(row_blocks * group) {}

  CUTE_HOST_DEVICE int64_t head(const WorkItem& item, int t) const { return item.kv_head * group + t / row_blocks; }
  CUTE_HOST_DEVICE int row_block(int t) const { return t % row_blocks; }
  CUTE_HOST_DEVICE int64_t row0(int t) const { return int64_t(row_block(t)) * kBlockM; }
};

}  // namespace qksoftmax::cuda::sm90
