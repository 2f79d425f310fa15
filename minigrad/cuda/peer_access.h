// Direct access between two GPUs' memory (NVLink or PCIe peer-to-peer), for plain
// allocations and for the stream-ordered memory pools minigrad allocates from.
// Internal to cuda/ and to the NCCL communicator of parallel/.
#pragma once

namespace mg::cuda {

// Lets devices `a` and `b` read and write each other's memory directly where the
// hardware allows it, in both directions, including memory from each device's pool
// (which, unlike cudaMalloc memory, stays private to its device until cudaMemPoolSetAccess
// grants a peer access). Done once per pair; without peer support it does nothing, and
// copies between the two are staged through the host by the driver.
void enable_peer_access(int a, int b);

}  // namespace mg::cuda
