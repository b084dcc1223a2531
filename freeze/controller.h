// The asynchronous side of Egeria (§4.1, §4.2): the reference model's forward and the
// plasticity computation run on two background CPU threads, connected to the training
// loop by bounded single-producer/single-consumer queues:
//
//   training thread --input (x, module, training output)--> reference thread
//   reference thread --(training output, reference Gram)--> plasticity thread
//   plasticity thread --result (step, module, P)----------> training thread (polled)
//
// The training output travels with its input, so the two sides of an evaluation can
// never be mismatched, and every accepted evaluation ends completed or dropped.
//
// An evaluation that finds the pipeline full is dropped and counted; submit() never
// waits. Whether training waits for results is the policy's choice (PolicyConfig::
// apply_on_arrival: the paper's acts on a result when it lands and never waits; the
// default acts at the next evaluation step, and drain()s there if it is late). The
// reference is rebuilt from the latest snapshot on the reference thread.
// Background threads run at a lower scheduling priority (nice) with their own thread
// count, so they take the CPU the training leaves idle, and with max_cpu_load below 1
// the reference forward waits until the machine's CPU load is at most that share (the
// paper: "only at low CPU load (e.g., <50%)", so as not to get in the way of data
// loading and other CPU work beside GPU training); while the training thread waits in
// drain() that gate is open, the wait itself being the spare capacity.
// `synchronous` evaluates inline instead (deterministic; for tests and reproducible runs).
// A reference on the training GPU (precision "fp32-gpu" or "fp16-gpu") runs on the
// reference thread too (not niced, and not gated by the CPU load), which queues its
// forward on a side stream of the GPU (Note [Side streams] in core/side_stream.h), after
// a mark of the training stream where the unit's input was written: the training thread
// queues only the training output's Gram and its copy to the host, waits for none of it,
// and the GPU runs the reference beside the step. The reference's Gram comes to the host
// on the side stream.
//
// Note [The reference's scope]
// A reading compares the front unit's output in training with the reference's output
// of the same unit for the same batch. What the reference runs for it is a choice
// (--freeze-reference-scope):
//   unit     the default: the front unit alone, on the training model's input to it
//            (the output of the layer module before it, captured in the training
//            forward: the frozen front's output, from the activation cache when the
//            step was cached, or the held units' while --freeze-first-phase off holds
//            their freezes). The reading measures the unit's own change since the
//            snapshot, and its cost is the unit's forward.
//   network  the paper: the network from the images through the front unit. The
//            reading also carries the reference front's difference from the training
//            front: int8 quantisation error, folded batch norm against batch statistics,
//            and, until the next refresh, the training the front had between the
//            snapshot and its freeze. Its cost grows with the depth of the front.
// Why unit is the default: (1) cost. A reading costs the front unit's forward, not the
// whole front's, which grows with the front's depth, so on a deep network the
// reference's overhead with network outgrows its bound (2% of training time).
// (2) What a reading means. With network, a unit's first readings after the units
// before it froze carry the training those had between the snapshot and their freeze:
// that transient makes the first fitted slopes steep, so the unit's tolerance (20% of
// the largest) comes out far too high and the unit freezes at the high LR. A unit
// reading is the unit's own change from the start. A Transformer, whose layer modules
// are not a chain, always runs network.
// Measurements: docs/freezing-measurements.md, "The reference's scope".
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/deferred_read.h"
#include "core/side_stream.h"
#include "freeze/spsc_queue.h"
#include "quant/reference.h"

namespace eg::freeze {

using Snapshot = std::map<std::string, Tensor>;

struct ControllerOptions {
  std::string precision = "int8";  // quant::reference_precisions()
  Device gpu = Device::cuda(0);  // the training GPU, for a "-gpu" reference
  bool synchronous = false;
  int threads = 1;  // OpenMP threads of each background thread
  int nice = 10;  // added scheduling niceness of the background threads (Linux)
  int capacity = 2;  // queue capacity, in evaluations
  // int8: convolution inputs calibrated on this many batches (0: per batch; Note [Static activation scales]).
  int64_t calibration_batches = quant::kCalibrationBatches;
  // The reference's batch norms: the snapshot's running statistics, or each batch's own
  // (Note [The reference's batch norm] in quant/reference.h).
  quant::ReferenceBn bn = quant::ReferenceBn::running;
  // The reference forward runs only while the CPU load of the whole machine is at most
  // this share (1: always). `cpu_load` measures it (empty: CpuLoadProbe, /proc/stat).
  double max_cpu_load = 1.0;
  std::function<double()> cpu_load;
};

// A background thread of the freezing policies starts with this: o.threads OpenMP
// threads, o.nice added niceness (best effort). `renice`: false for the thread that
// launches a GPU reference's kernels: niced on a machine whose cores are all busy (the
// reason to put the reference on the GPU), it would wait for a core, and the training
// with it at the next evaluation step.
void background_thread_setup(const ControllerOptions& o, bool renice = true);
int64_t thread_cpu_ns();  // CPU time of the calling thread

// The share of the machine's CPU time (all cores) spent busy over a short interval,
// from /proc/stat: each call compares with the previous call's sample, or, when that
// is older than a second (or there is none), with one taken `window` earlier.
// 0 where /proc/stat cannot be read.
class CpuLoadProbe {
 public:
  explicit CpuLoadProbe(std::chrono::milliseconds window = std::chrono::milliseconds(100)) : window_(window) {}
  double operator()();

 private:
  struct Sample {
    uint64_t busy = 0, total = 0;
    std::chrono::steady_clock::time_point at;
  };
  static bool read(Sample& s);
  std::chrono::milliseconds window_;
  Sample last_;
  bool have_ = false;
};

class PlasticityController {
 public:
  // make_model builds an untrained model of the training model's architecture.
  PlasticityController(quant::ModelFactory make_model, ControllerOptions o);
  PlasticityController(const models::ModelConfig& mc, ControllerOptions o);
  ~PlasticityController();
  PlasticityController(const PlasticityController&) = delete;
  PlasticityController& operator=(const PlasticityController&) = delete;

  // The snapshot later evaluations are measured against (CPU copies, not shared with
  // the training model).
  void set_snapshot(std::shared_ptr<const Snapshot> snap);
  bool has_snapshot() const { return snapshot_ != nullptr; }
  // Queues one evaluation: x is the CPU input batch (a Transformer's source ids, with
  // its target input ids in x2), `train_out` the training model's output of layer
  // module `module` for it (any device; on a GPU its Gram is computed there and only
  // b x b floats come back). False, and counted, when the pipeline is full.
  // With `unit_input` (the training model's output of layer module begin - 1, any
  // device), the reference runs only layer modules begin..module on it instead of the
  // network from x (--freeze-reference-scope unit; sequential models).
  bool submit(int64_t step, int64_t module, const Tensor& x, const Tensor& train_out, const Tensor& x2 = Tensor(),
              const Tensor& unit_input = Tensor(), int64_t begin = 0);

  struct Result {
    int64_t step = 0, module = 0;
    double plasticity = 0;
  };
  // Results completed since the last call, in submission order.
  std::vector<Result> poll();
  // Waits until every accepted evaluation has completed or been dropped (checkpoints, tests,
  // and a policy that acts on results at fixed steps); the time it waited is counted.
  void drain();
  // Results drain() collected that poll() has not handed out yet (checkpointed, so that a
  // resumed run acts on them where the uninterrupted run would), and their restoration.
  std::vector<Result> pending() const { return sync_results_; }
  void restore_pending(std::vector<Result> r) { sync_results_ = std::move(r); }

  // The calibration of the reference built from `snap`, empty when the current one
  // was built from another snapshot (or none yet). Call after drain().
  quant::Calibration calibration_for(const std::shared_ptr<const Snapshot>& snap) const;
  // A checkpoint's calibration, applied when the reference is built from `snap` (the
  // snapshot restored with it); a newer snapshot's reference calibrates afresh.
  void restore_calibration(std::shared_ptr<const Snapshot> snap, quant::Calibration c);

  int64_t dropped() const { return dropped_.load(); }
  int64_t completed() const { return completed_.load(); }
  double background_cpu_seconds() const;  // CPU time of the background threads
  // A GPU reference's device time in the background: each reading's span on its side
  // stream, from its first kernel to its Gram (other work sharing the GPU meanwhile
  // included, so at most what it took from training). 0 for the other references.
  double reference_gpu_seconds() const { return double(gpu_ns_.load()) * 1e-9; }
  // What made the first dropped background evaluation fail ("" when none failed): a
  // failure there is counted as a drop, never thrown at the training loop.
  std::string first_error() const;
  double wait_seconds() const { return wait_seconds_; }  // training-thread time spent in drain()
  // Evaluations whose reference forward waited for the CPU load to fall, and how long.
  int64_t deferred() const { return deferred_.load(); }
  double deferred_seconds() const { return double(deferred_ns_.load()) * 1e-9; }
  // The gate in force: 1 (none) for an inline (synchronous) or GPU reference.
  double max_cpu_load() const {
    return opt_.synchronous || quant::reference_on_gpu(opt_.precision) ? 1.0 : opt_.max_cpu_load;
  }
  double reference_build_count() const { return builds_.load(); }

 private:
  struct Input {
    int64_t step = -1, module = 0;
    Tensor x, x2;
    Tensor unit_input;  // when defined, the reference runs layer modules begin..module on it
    StreamMark unit_input_written;  // a GPU unit_input's, for the reference's side stream
    int64_t begin = 0;
    std::shared_ptr<const Snapshot> snap;
    Tensor train;  // b x b Gram on the CPU, or a CPU activation whose Gram is still to be taken
    bool train_is_gram = false;
    // From a GPU: unit_input and train on their way to the host, until land().
    HostCopy unit_input_later, train_later;
  };
  static void land(Input& in);  // waits for the copies from a GPU, on the calling thread
  struct Pair {
    int64_t step = -1, module = 0;
    Tensor train, ref;  // ref: the reference Gram; undefined when the reference failed
    bool train_is_gram = false;
  };
  void build_reference(const Input& in);  // from in.snap, unless the current one is
  Tensor reference_gram(const Input& in);
  void wait_for_spare_cpu();
  void reference_loop();
  void plasticity_loop();

  quant::ModelFactory make_model_;
  ControllerOptions opt_;
  std::shared_ptr<const Snapshot> snapshot_, built_from_;
  std::unique_ptr<quant::ReferenceModel> ref_;
  std::shared_ptr<const Snapshot> restored_for_;  // restore_calibration's snapshot, until its reference is built
  quant::Calibration restored_;
  SpscQueue<Input> in_q_;
  SpscQueue<Pair> ref_q_;
  SpscQueue<Result> res_q_;
  std::vector<Result> sync_results_;  // synchronous results, or asynchronous ones drain() collected
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> dropped_{0}, completed_{0}, submitted_{0}, finished_{0}, builds_{0};
  std::atomic<int64_t> cpu_ns_{0}, gpu_ns_{0}, deferred_{0}, deferred_ns_{0};
  std::atomic<bool> draining_{false};
  std::function<double()> cpu_load_;
  double wait_seconds_ = 0;
  void note_error(const std::string& what);
  mutable std::mutex error_mu_;
  std::string first_error_;
  // Idle background threads sleep until work arrives (no polling: on a machine whose
  // cores all train, every wake-up of a polling thread stalls a training thread, and
  // with it the whole OpenMP team at its next barrier).
  struct Doorbell {
    std::mutex m;
    std::condition_variable cv;
    void ring() {
      { std::lock_guard<std::mutex> lk(m); }
      cv.notify_one();
    }
    template <class Pred>
    void wait(Pred ready) {
      std::unique_lock<std::mutex> lk(m);
      cv.wait_for(lk, std::chrono::milliseconds(200), ready);
    }
  };
  Doorbell ref_bell_, plast_bell_;
  std::thread ref_thread_, plast_thread_;
};

}  // namespace eg::freeze
