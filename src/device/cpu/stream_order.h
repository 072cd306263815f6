// NCCL's execution semantics for a Collectives that is not NCCL (the CPU platform's
// `--p2p-semantics nccl`).
//
// NCCL enqueues every operation of a communicator on a CUDA stream, so the communicator runs them
// one at a time, in the order the rank issued them, whatever the host waits on; a send completes
// only when the peer's matching receive is executing, because NCCL has no buffering to hide it in
// (the NCCL user guide, "Point-to-point communication": send/recv are blocking for the GPU, and
// pairs that must progress together belong in one ncclGroupStart/End). Schedules that rely on MPI's
// eager buffering or on independent progress of a communicator's operations pass on MPI and hang
// on a real cluster; under this emulation they hang on the CPU too, and the trial's deadline
// reports `timeout`.
//
// How: each communicator is a queue (its "stream"). A non-blocking call enqueues its operation and
// returns at once. Only the operation at the head is started on `inner`, and the next starts when
// it has completed. `inner` must complete a send only when the receive is posted and match by
// order (MakeMpiCollectives' NCCL matching: MPI_Issend, one tag), so a send at the head completes
// only when the peer's receive is at the head of the peer's queue: the rendezvous. An
// IBatchSendRecv is one queue entry whose operations start together, as an NCCL group.
//
// Progress: testing any request advances every queue of the process (as a GPU runs every stream
// whatever the host waits on). Blocking calls wait for their own operation (or for the queue to
// drain, where `inner` has no non-blocking form), without a deadline, as NCCL would. One thread
// drives the collectives of a process, as the trial does.
#pragma once

#include <memory>

#include "autopar/device/collectives.h"

namespace autopar::device {

std::unique_ptr<Collectives> MakeStreamOrdered(std::unique_ptr<Collectives> inner);

}  // namespace autopar::device
