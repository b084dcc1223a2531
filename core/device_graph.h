// CUDA graphs of device work: captured once, replayed at the cost of one launch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"

namespace eg {

class Allocator;

// Note [Device graphs]
// A training step of a small network on a GPU is bound by its launches: ResNet-56 queues
// ~1,000 kernels a step, each a few microseconds of host work. A DeviceGraph captures
// what a function queues on the device's compute stream (cudaStreamBeginCapture in
// thread-local mode: unsafe calls of other threads do not end the capture, but the
// compute stream is the device's one, so only the capturing thread queues work on it
// meanwhile: the loader's and the reference's threads do not) and replays it with one
// cudaGraphLaunch. A replay runs the captured
// kernels with the arguments and at the addresses they had:
// - every block the capture allocates comes from the graph's private pool and stays the
//   graph's until it is destroyed (Note [Private pools] in core/caching_allocator.cpp);
//   tensors made before the capture (parameters, gradient buckets, optimizer state, the
//   inputs) must keep their storage for as long as the graph is replayed;
// - values that change between replays are read from device memory (the learning rate,
//   AdamW's step counts, dropout's seed and base counter: Note [Random state on the
//   device] in core/rng.h), written outside the graph before a replay;
// - a capture runs nothing: the host code of the captured function runs once (its
//   host-side effects, such as counters reserved from a generator, happen then), and the
//   work happens at each replay(), the first included.
// A capture fails, naming what CUDA said, when the function does what a capture forbids:
// a host sync (Note [Host syncs] in core/device.h), a copy from pageable memory, work on
// a stream not ordered into the capture. Steps free of them are checked without a GPU by
// recording their ops (Note [Op records] in kernels/ops.h).
//
// Note [Shared graph pools]
// Graphs that are replayed one at a time, on one stream, may capture into one private
// pool (a GraphPool, as PyTorch's graph_pool_handle): a capture takes the blocks earlier
// captures freed, so their temporaries take the memory of the largest step, not the
// sum of every graph's. What a captured step keeps alive (its outputs) stays its own; but
// a block one graph freed may hold another graph's output, so a graph's outputs are
// valid until another graph of the pool replays: read them (or queue their copy, as a
// deferred read does) first. A graph destroyed (an evicted batch shape's) hands back the
// blocks no other graph of the pool used (end_capture, Note [Private pools]); the pool
// goes back to the shared cache when its last graph and its last other holder are gone
// (each graph waits for its replays first).
class GraphPool {
 public:
  explicit GraphPool(Allocator& alloc);
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  Allocator& allocator() const { return alloc_; }
  uint64_t id() const { return id_; }
  size_t bytes() const;  // what the pool holds, in use or idle

 private:
  Allocator& alloc_;
  uint64_t id_;
};

class DeviceGraph {
 public:
  // Throws, naming what it needs, on the CPU or in a build without CUDA. `pool`: the
  // pool to capture into, shared with other graphs (Note [Shared graph pools]; it must be
  // the device's allocator's); none: a pool of its own.
  explicit DeviceGraph(Device device, std::shared_ptr<GraphPool> pool = nullptr);
  ~DeviceGraph();  // waits for the graph's queued replays, then lets go of its pool
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  // Captures what `body` queues on the device's compute stream from this thread. On a
  // throw nothing is captured and the error says it happened during a capture.
  void capture(const std::function<void()>& body);
  bool captured() const;
  void replay();  // queues the captured work on the compute stream
  int64_t replays() const;
  size_t pool_bytes() const;  // what its pool holds on the device (shared: every graph's of it)
  const std::shared_ptr<GraphPool>& pool() const;  // to share with graphs captured after it
  Device device() const { return device_; }

 private:
  struct Impl;
  Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace eg
