// Choosing an algorithm by timing its candidates (cuDNN's convolutions under
// EG_CUDNN_BENCHMARK=1, kernels/cuda/conv2d.cu). Host code only, so that the choice is
// tested without a GPU.
//
// Note [Median of three timings]
// One timing of a candidate can be far off: its first launch loads its kernels, the
// clocks change, another process shares the GPU. cudnnFind* reports one time per
// algorithm, so a process could keep a slow algorithm for a shape for its whole run, and
// two runs of the same step differ by what each happened to pick. PyTorch's cuDNN
// benchmark takes each candidate's median of three runs (cudnn_frontend's
// CUDNN_FIND_SAMPLE_MEDIAN_OF_THREE); so do we: three calls of cudnnFind*, each
// algorithm's median of its three times, the lowest median chosen.
#pragma once
#include <algorithm>
#include <cstddef>
#include <map>
#include <vector>

namespace eg {

// One candidate's result in one timing trial.
struct AlgoTiming {
  int algo = 0;
  bool ok = false;  // ran (cuDNN: CUDNN_STATUS_SUCCESS)
  float ms = 0.f;
  size_t memory = 0;  // its workspace
};

// The algorithm whose median time over the trials is lowest, among those that ran in
// every trial within `max_memory` of workspace; a tie goes to the one the first trial
// lists first. An algorithm listed twice in a trial (cuDNN may list one per math mode)
// counts with its first entry there. -1 when none qualifies (or there are no trials).
inline int fastest_by_median(const std::vector<std::vector<AlgoTiming>>& trials, size_t max_memory) {
  if (trials.empty()) return -1;
  std::map<int, std::vector<float>> times;
  std::map<int, bool> disqualified;
  for (const auto& trial : trials) {
    std::map<int, bool> seen;
    for (const AlgoTiming& t : trial) {
      if (seen[t.algo]) continue;
      seen[t.algo] = true;
      if (!t.ok || t.memory > max_memory) disqualified[t.algo] = true;
      times[t.algo].push_back(t.ms);
    }
  }
  int best = -1;
  float best_ms = 0.f;
  for (const AlgoTiming& t : trials.front()) {  // the first trial's order breaks ties
    std::vector<float> v = times[t.algo];
    if (disqualified[t.algo] || v.size() != trials.size()) continue;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    const float median = v[v.size() / 2];
    if (best < 0 || median < best_ms) best = t.algo, best_ms = median;
  }
  return best;
}

}  // namespace eg
