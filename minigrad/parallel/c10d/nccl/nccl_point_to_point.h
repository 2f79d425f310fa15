// ProcessGroupNccl's send and recv: internal to nccl_process_group.cpp, not the user API.
//
// NCCL has no tags, pairs a rank's sends and recvs with a peer strictly in order, and runs
// the kernels of one communicator one after another: a send and a recv between two ranks,
// issued separately, wait for each other's kernel and deadlock. So the messages of each
// direction between two ranks go through a lane of their own: a two-rank communicator
// (made on first use, its unique id through the store), a stream and a thread.
//
//   out-lane (this rank -> peer): sends each message's header (p2p_message.h) and payload,
//     in post order, after the caller's stream has produced them.
//   in-lane (peer -> this rank): while a recv is waiting, takes the next header, then the
//     payload: into the oldest waiting recv of that tag when the header matches it, into
//     scratch memory when it does not (that recv fails, the message is dropped), or, when
//     no recv of that tag is waiting, into a buffer of its own that a later recv of that
//     tag takes. So messages are matched by (peer, tag), and the sender's lane is never
//     stuck behind a message the receiver asked for in another order.
//
// A lane's host thread is what may block (making the communicator waits for the peer; a
// header waits for its message), never the caller. A lane fails on an NCCL error, a dead
// peer or a timeout: its communicator is aborted (by its own thread, the only one that
// calls NCCL on it), its messages in flight fail, and later ones fail at once. The other
// lanes and the group's collectives are separate communicators and go on.
#pragma once

#ifdef MINIGRAD_WITH_NCCL

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>

namespace mg::parallel::detail {

struct NcclLaneConfig {
  std::shared_ptr<Store>
      store;           // for its address: every lane meets over a connection of its own
  std::string prefix;  // the group's keys in the store
  int rank = 0;
  int size = 1;
  int device_index = 0;
  std::chrono::milliseconds timeout{0};
};

class NcclLane;  // nccl_point_to_point.cpp

class NcclPointToPoint {
 public:
  explicit NcclPointToPoint(NcclLaneConfig config);
  ~NcclPointToPoint();  // stops every lane
  NcclPointToPoint(const NcclPointToPoint&) = delete;
  NcclPointToPoint& operator=(const NcclPointToPoint&) = delete;

  // `tensors` checked by ProcessGroup::check_message; `description` names the message in
  // errors ("send #4 (to rank 1, tag 0: ...)").
  std::shared_ptr<Work> send(std::vector<Tensor> tensors, int dst, int tag,
                             std::string description);
  std::shared_ptr<Work> recv(std::vector<Tensor> tensors, int src, int tag,
                             std::string description);

 private:
  std::shared_ptr<NcclLane> lane(int peer, bool sending);

  NcclLaneConfig config_;
  std::mutex mutex_;
  std::map<std::pair<int, bool>, std::shared_ptr<NcclLane>> lanes_;  // by (peer, sending)
};

}  // namespace mg::parallel::detail

#endif  // MINIGRAD_WITH_NCCL
