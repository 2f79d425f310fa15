// Which DataParallel replica's forward runs on this thread, so that the nodes it records
// remember it (Node::replica) and a trace can show each replica's backward
// (core/profiler.h). Defined in node.cpp, beside the Node constructor that reads it.
#pragma once

namespace mg {

// The replica whose forward runs on this thread, or -1: none.
int current_replica();

// Sets it for a scope: parallel_apply around replica i's forward.
class ReplicaScope {
 public:
  explicit ReplicaScope(int replica);
  ~ReplicaScope();
  ReplicaScope(const ReplicaScope&) = delete;
  ReplicaScope& operator=(const ReplicaScope&) = delete;

 private:
  int previous_;
};

}  // namespace mg
