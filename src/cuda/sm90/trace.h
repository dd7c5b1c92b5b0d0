// Phase timing of the single-pass backward and of the key-block pass, for the step micro-benchmark
// (qksoftmax-step --trace). A config's Trace type is NoTrace (every call compiles to nothing); a benchmark's
// config may name ClockTrace<Sink>, under which lane 0 of the first warp of each role reads the SM clock at every
// phase boundary of its loop and adds the cycles since the previous boundary to Sink::add(role, phase, cycles)
// (a global counter in the benchmark). Roles and phases are each kernel's enums (TraceRole and TracePhase,
// KbTraceRole and KbTracePhase), passed on as ints.
#pragma once

#include <cute/config.hpp>

#include <cstdint>

namespace qksoftmax::cuda::sm90 {

// The roles whose loops are timed, and the phases of each (a phase ends where the next begins).
enum class TraceRole : int { kConsumer0, kConsumer1, kReducer, kProducer, kCount };
enum class TracePhase : int {
  // consumers, in the order of a turn of the step loop
  kStageWait,     // the next step's Q and dP (and P) loaded
  kIssueS,        // S of the next step issued
  kStatsWait,     // every CTA's statistics of this step arrived
  kCombine,       // the statistics combined, the slots freed
  kDs,            // dS computed and written
  kDsBarrier,     // both consumers' dS written
  kIssueDkDq,     // the dK and dQ products issued
  kWaitS,         // S of the next step done
  kFront,         // the next step's dP (and P) read, its partial statistics
  kPushStats,     // the statistics pushed
  kWaitDkDq,      // the dK and dQ products done
  kDqEmpty,       // the owners' dQ slots free
  kSendDq,        // the stage freed, the dQ pieces pushed (or stored)
  kItem,          // per work item: K waited for, dK stored
  // reducers
  kDqFullWait = 0,  // every CTA's dQ pieces arrived
  kReduce,          // summed, scaled, stored, the slots freed
  // producer
  kAcquire = 0,  // a stage free
  kIssueLoads,   // its loads issued
  kCount = kItem + 1  // the consumers' phases, the most of any role (enumerators are ints until the brace)
};

// The key-block pass's roles (kb_kernel.cuh) and the phases of each.
enum class KbTraceRole : int { kConsumer0, kConsumer1, kLoad, kRows, kDq, kCount };
enum class KbTracePhase : int {
  // consumers, in the order of a step of kb_mainloop.cuh's loop
  kStageWait,     // the step's stage loaded (saved-P; recompute waits for it when issuing the previous step's Sᵀ)
  kLoadDp,        // dPᵀ (and Pᵀ) read by ldmatrix
  kRowsWait,      // the step's rows' terms in the rows pipeline
  kDs,            // dSᵀ element-wise (dst_of), the rows' slot freed
  kStoreDs,       // dS written by stmatrix
  kWaitDq,        // this consumer's dQ product of the previous step done (wait 0), dS announced off turn
  kIssueS,        // Sᵀ of the next step issued, after its stage's wait (recompute)
  kIssueDk,       // the dK product issued
  kWriteDq,       // the previous step's dQ partial staged, after its buffer's empty barrier (the turn after)
  kDsBarrier,     // the other consumer's dS written (on turn)
  kIssueDq,       // the dQ product issued (on turn)
  kWaitProducts,  // Sᵀ and dK done (wait 1 on turn, 0 off), the stage released
  kTileStart,     // per tile: its index read from the ring, K awaited and (recompute) read, Sᵀ of its step 0
  kTileEnd,       // per tile: its last products awaited, K handed back, the last dQ partial staged, dK stored
  // load thread
  kAcquire = 0,  // a stage free
  kIssueLoads,   // its loads issued (at a tile's first step also K's, after its buffer's hand-back)
  // rows warp
  kRowsAcquire = 0,  // the step's LSE and D loads issued, its slot free
  kRowsWrite,        // the slot written and committed
  // dQ warp
  kDqFullWait = 0,  // the step's staging buffer written
  kReduceAdd,       // its reduce-add issued, the previous one's read of shared memory done
  kCount = kTileEnd + 1  // the consumers' phases, the most of any role
};

// The pingpong single pass (sp_pp_mainloop.cuh): its consumers' phases, in the order of a block of their own
// (roles as KbTraceRole's consumers).
enum class PpTracePhase : int {
  kWaitS,          // S of the block done, dP read
  kSums,           // the rows' max and sums over the CTA's keys
  kPush,           // in a cluster, the rows' partials pushed to the other CTAs
  kExchange,       // in a cluster, the other CTAs' partials awaited
  kCombine,        // in a cluster, the partials combined
  kSoftmax,        // the factors and dS in registers
  kDsFree,         // the dS buffer's previous block's products done
  kStoreDs,        // dS written by stmatrix
  kTurnWait,       // this consumer's turn
  kIssue,          // dK (the other's block and this one), dQ and the next block's S issued, the turn passed on
  kWaitProducts,   // dK and dQ done, the Q slots handed back, the dS buffers announced read
  kStoreDq,        // dQ staged and stored, the store's read done, the dP slot handed back
  kTileStart,      // per tile: S of this consumer's first block issued (its Q awaited), unless issued ahead
  kTileEnd,        // per tile: K handed back, the last block's dK (the other's block), dK stored
  kTileRead,       // per tile: its index read from the tile ring
  kTileK,          // per tile: its K loaded
  kCount
};
// Its dK warpgroup (sp_pp_dk.cuh; KbTraceRole's kDq), in the order of a block.
enum class PpDkTracePhase : int {
  kDsWait,   // the block's dS written, its Q loaded
  kProduct,  // dK += dSᵀ Q issued and done, the dS buffer and the Q slot freed
  kTileEnd,  // per tile: dK stored, the next tile read from the ring
  kCount
};

struct NoTrace {
  template <class Role>
  CUTE_DEVICE explicit NoTrace(Role, bool) {}
  template <class Phase>
  CUTE_DEVICE void mark(Phase) {}
};

template <class Sink>
struct ClockTrace {
  uint32_t last;
  int role;
  bool on;  // lane 0 of the role's first warp

  CUTE_DEVICE static uint32_t now() {
    uint32_t c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    return c;
  }
  template <class Role>  // an int or a kernel's role enum
  CUTE_DEVICE ClockTrace(Role r, bool first_warp)
      : last(now()), role(int(r)), on(first_warp && threadIdx.x % 32 == 0) {}
  template <class Phase>  // an int or a kernel's phase enum
  CUTE_DEVICE void mark(Phase phase) {
    const uint32_t t = now();
    if (on) Sink::add(role, int(phase), t - last);
    last = t;
  }
};

}  // namespace qksoftmax::cuda::sm90
