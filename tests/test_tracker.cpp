// Algorithm 1 (freeze/tracker.h) on synthetic plasticity sequences: bootstrapping, the
// slope fits and tolerance, freezing, unfreezing on an LR fall, and the tracker's state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "freeze/tracker.h"

namespace eg::freeze {
namespace {

TEST(Tracker, FitSlopeIsLeastSquares) {
  EXPECT_DOUBLE_EQ(fit_slope({1, 3, 5, 7}), 2.0);
  EXPECT_DOUBLE_EQ(fit_slope({4}), 0.0);
  EXPECT_NEAR(fit_slope({0, 1, 0, 1}), 0.2, 1e-12);
}

TEST(Tracker, DefaultIntervalFollowsThePapersGuideline) {
  // ResNet-56, 7 modules, W = 10, ~78k iterations: the paper uses n = 300.
  EXPECT_EQ(default_interval(78000, 7, 10), 318);
  EXPECT_EQ(default_interval(4690, 8, 10), 16);  // ResNet-56, 10 epochs of Fashion-MNIST
  // Too short for the guideline to cover every module: the floor.
  EXPECT_EQ(default_interval(100, 50, 10), kMinDefaultInterval);
  EXPECT_EQ(default_interval(79, 4, 10), kMinDefaultInterval);
  EXPECT_EQ(default_interval(3500, 4, 10), 25);  // above the floor: the guideline alone
  // From pretrained weights the floor is lower (Note [n for a pretrained network]): the
  // fine-tuning task's 460 steps of 6 units, whose guideline is 2.
  EXPECT_EQ(default_interval(460, 6, 10), kMinDefaultInterval);
  EXPECT_EQ(default_interval(460, 6, 10, true), kMinPretrainedInterval);
  EXPECT_LT(kMinPretrainedInterval, kMinDefaultInterval);
  EXPECT_EQ(default_interval(78000, 7, 10, true), 318);  // above both floors: the guideline alone
}

TEST(Tracker, TheBootstrappingCheckSpansAnEpochATenthOfAShortRunAndAtLeastN) {
  // The paper's run: an epoch of ~390 iterations, n = 300 (Note [The bootstrapping
  // check's span]).
  EXPECT_EQ(default_bootstrap_interval(78000, 390, 300), 390);
  // ResNet-56, 10 epochs of Fashion-MNIST: an epoch, not n = 16.
  EXPECT_EQ(default_bootstrap_interval(4680, 468, 16), 468);
  // Shorter than 10 epochs: a tenth of the run (the quickstart: 2 epochs of 468).
  EXPECT_EQ(default_bootstrap_interval(936, 468, 10), 93);
  // Never below n; no epoch known: a tenth of the run.
  EXPECT_EQ(default_bootstrap_interval(79, 79, 10), 10);
  EXPECT_EQ(default_bootstrap_interval(79, 10, 500), 500);
  EXPECT_EQ(default_bootstrap_interval(5000, 0, 10), 500);
}

TEST(Tracker, BootstrappingEndsWhenTheLossChangesLessThanTenPercent) {
  FreezeTracker t(4, {});
  EXPECT_EQ(t.bootstrap_check(10, 2.0, 0.1), Decision::none);
  EXPECT_EQ(t.bootstrap_check(20, 1.5, 0.1), Decision::none);  // -25%
  EXPECT_TRUE(t.bootstrapping());
  EXPECT_EQ(t.bootstrap_check(30, 1.4, 0.1), Decision::end_bootstrap);  // -6.7%
  EXPECT_FALSE(t.bootstrapping());
  EXPECT_THROW(FreezeTracker(4, {}).check_plasticity(1, 0.1, 0.1), Error);
}

FreezeTracker started(int64_t modules, TrackerOptions o) {
  o.refresh_every = 1000000;  // these sequences are against one reference
  FreezeTracker t(modules, o);
  t.bootstrap_check(0, 1.0, 0.1);
  t.bootstrap_check(1, 1.0, 0.1);
  return t;
}

// A plasticity that rises quickly then flattens: the module converges.
double converging(int i) { return 1.0 - std::exp(-0.5 * i); }

TEST(Tracker, AFlatPlasticityFreezesAfterWStaleReadings) {
  TrackerOptions o;
  o.window = 5;
  FreezeTracker t = started(4, o);
  int froze_at = -1;
  for (int i = 0; i < 200 && froze_at < 0; ++i)
    if (t.check_plasticity(i, converging(i), 0.1) == Decision::freeze) froze_at = i;
  ASSERT_GE(froze_at, 0) << "a converged module was never frozen";
  EXPECT_EQ(t.front(), 1);
  // The events show W consecutive stale readings right before the freeze.
  auto ev = t.take_events();
  ASSERT_EQ(ev.back().type, "freeze");
  int stale = 0;
  for (auto it = ev.rbegin() + 1; it != ev.rend() && it->type == "evaluation" && it->counter > 0; ++it) {
    EXPECT_LT(std::abs(it->slope), it->tolerance);
    ++stale;
  }
  EXPECT_EQ(stale, 5);
  // The readings before the stale run were not stale: freezing was not premature.
  EXPECT_GT(froze_at, 3 + 5);
}

TEST(Tracker, ASteadilyMovingNoisyPlasticityNeverFreezes) {
  TrackerOptions o;
  o.window = 5;
  FreezeTracker t = started(4, o);
  Generator g(7);
  Tensor noise = Tensor::randn({400}, g);
  for (int i = 0; i < 400; ++i) {
    // Rising at a constant rate with noise of the same order as a step.
    const double p = 0.01 * i + 0.01 * noise.data<float>()[i];
    ASSERT_EQ(t.check_plasticity(i, p, 0.1), Decision::none) << "froze at reading " << i;
  }
  EXPECT_EQ(t.front(), 0);
}

TEST(Tracker, TheHeadIsNeverFrozen) {
  TrackerOptions o;
  o.window = 3;
  FreezeTracker t = started(2, o);
  int freezes = 0;
  for (int i = 0; i < 500; ++i) freezes += t.check_plasticity(i, converging(i % 60), 0.1) == Decision::freeze;
  EXPECT_EQ(freezes, 1);
  EXPECT_TRUE(t.done());
  EXPECT_EQ(t.front(), 1);
}

// Feeds converging readings at `lr` until `modules` modules have frozen; the next step.
int freeze_front(FreezeTracker& t, int64_t modules, double lr) {
  int i = 0;
  while (t.front() < modules && i < 1000) {
    t.check_plasticity(i, converging(i % 40), lr);
    ++i;
  }
  return i;
}

TEST(Tracker, AnLrDropOfTenTimesUnfreezesAllAndHalvesW) {
  TrackerOptions o;
  o.window = 6;
  FreezeTracker t = started(5, o);
  const int i = freeze_front(t, 2, 0.1);
  ASSERT_EQ(t.front(), 2);
  EXPECT_EQ(t.check_lr(i, 0.02), Decision::none);  // 5x: not yet
  EXPECT_EQ(t.check_lr(i + 1, 0.01), Decision::unfreeze_all);
  EXPECT_EQ(t.front(), 0);
  EXPECT_EQ(t.window(), 3);
  EXPECT_EQ(t.check_lr(i + 2, 0.01), Decision::none);  // once per drop
  auto ev = t.take_events();
  EXPECT_EQ(ev.back().type, "unfreeze");
  EXPECT_EQ(ev.back().reason, "lr");
  // Refreezing measures against the LR at the new front freeze.
  int j = 0;
  while (t.front() < 1 && j < 1000) {
    t.check_plasticity(i + 10 + j, converging(j), 0.01);
    ++j;
  }
  EXPECT_EQ(t.front(), 1);
  EXPECT_EQ(t.check_lr(i + 2000, 0.002), Decision::none);
  EXPECT_EQ(t.check_lr(i + 2001, 0.001), Decision::unfreeze_all);
  EXPECT_EQ(t.window(), 1);
}

// --freeze-unfreeze never: the same falls unfreeze nothing, W stays, and Algorithm 1
// goes on with the next module, which then freezes behind the others.
TEST(Tracker, WithUnfreezeNeverAnLrFallKeepsWhatFroze) {
  TrackerOptions o;
  o.window = 6;
  o.unfreeze_on_lr_fall = false;
  FreezeTracker t = started(5, o);
  const int i = freeze_front(t, 2, 0.1);
  ASSERT_EQ(t.front(), 2);
  EXPECT_EQ(t.check_lr(i, 0.01), Decision::none);
  EXPECT_EQ(t.check_lr(i + 1, 0.001), Decision::none);
  EXPECT_EQ(t.front(), 2);
  EXPECT_EQ(t.frozen(), 2);
  EXPECT_EQ(t.window(), 6);
  for (const Event& e : t.take_events()) EXPECT_NE(e.type, "unfreeze");
  int j = 0;
  while (t.front() < 3 && j < 1000) {
    t.check_plasticity(i + 10 + j, converging(j), 0.001);
    ++j;
  }
  EXPECT_EQ(t.front(), 3);
  // A custom hook (cyclic schedules) still unfreezes.
  t.custom_unfreeze = [](int64_t, double) { return true; };
  EXPECT_EQ(t.check_lr(i + 2000, 0.001), Decision::unfreeze_all);
  EXPECT_EQ(t.front(), 0);
}

// --freeze-window-min: the halving stops at the floor, and a floor above W leaves W as is.
TEST(Tracker, WindowHalvingStopsAtItsFloor) {
  for (auto [window, floor, after1, after2] :
       {std::tuple{10, 5, 5, 5}, std::tuple{10, 4, 5, 4}, std::tuple{10, 1, 5, 2}, std::tuple{3, 5, 3, 3}}) {
    TrackerOptions o;
    o.window = window;
    o.min_window = floor;
    FreezeTracker t = started(5, o);
    int i = 0;
    double lr = 0.1;
    for (int drop : {after1, after2}) {
      for (int j = 0; t.front() < 1 && j < 1000; ++j, ++i) t.check_plasticity(i, converging(j), lr);
      ASSERT_EQ(t.front(), 1) << "W " << window << " floor " << floor;
      lr /= 10;
      EXPECT_EQ(t.check_lr(i++, lr), Decision::unfreeze_all);
      EXPECT_EQ(t.window(), drop) << "W " << window << " floor " << floor;
    }
  }
  TrackerOptions bad;
  bad.min_window = 0;
  EXPECT_THROW(FreezeTracker(4, bad), Error);
}

// --freeze-first-phase off: Algorithm 1 runs in the first phase, but its freezes are
// held (the front moves on, nothing is frozen) until the LR falls 10x below its peak;
// then they all apply at once, and the paper's LR unfreeze counts from there.
TEST(Tracker, FirstPhaseOffHoldsFreezesUntilTheLrFalls) {
  TrackerOptions o;
  o.window = 3;
  o.freeze_first_phase = false;
  FreezeTracker t = started(4, o);
  EXPECT_TRUE(t.holding());
  int i = 0;
  for (int j = 0; t.front() < 2 && j < 1000; ++j, ++i)
    EXPECT_NE(t.check_plasticity(i, converging(j), 0.1), Decision::freeze) << "a freeze at the peak LR";
  ASSERT_EQ(t.front(), 2) << "Algorithm 1 moves on as usual";
  EXPECT_EQ(t.frozen(), 0) << "but freezes nothing";
  int holds = 0;
  for (auto& e : t.take_events()) {
    EXPECT_NE(e.type, "freeze");
    holds += e.type == "hold";
  }
  EXPECT_EQ(holds, 2);
  const nlohmann::json held_state = t.state();
  EXPECT_EQ(t.check_lr(i++, 0.02), Decision::none) << "5x below the peak: still the first phase";
  EXPECT_EQ(t.frozen(), 0);
  // The first reading at 10x below the peak applies both held freezes.
  EXPECT_EQ(t.check_plasticity(i++, 1.0, 0.01), Decision::freeze);
  EXPECT_FALSE(t.holding());
  EXPECT_EQ(t.frozen(), 2);
  auto ev = t.take_events();
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().type, "freeze");
  EXPECT_EQ(ev.back().reason, "held");
  EXPECT_EQ(ev.back().module, 1);
  EXPECT_EQ(ev.back().to_json()["reason"], "held");
  EXPECT_EQ(t.check_lr(i++, 0.01), Decision::none) << "applied once";
  // After that, a freeze applies as it is decided.
  for (int j = 0; t.front() < 3 && j < 1000; ++j, ++i) t.check_plasticity(i, converging(j), 0.01);
  EXPECT_EQ(t.frozen(), 3);
  EXPECT_EQ(t.take_events().back().reason, "");
  EXPECT_EQ(t.check_lr(i++, 0.001), Decision::unfreeze_all) << "10x below the LR they froze at";
  EXPECT_EQ(t.frozen(), 0);

  // The held state survives a checkpoint.
  FreezeTracker u(4, o);
  u.load_state(held_state);
  EXPECT_TRUE(u.holding());
  EXPECT_EQ(u.front(), 2);
  EXPECT_EQ(u.frozen(), 0);
  EXPECT_EQ(u.check_lr(0, 0.01), Decision::freeze);
  EXPECT_EQ(u.frozen(), 2);

  // A warm-up's rising LR is not a fall: the peak is the largest LR seen.
  FreezeTracker w(4, o);
  w.bootstrap_check(0, 1.0, 0.001);
  w.bootstrap_check(1, 1.0, 0.01);
  for (double lr : {0.05, 0.1, 0.1, 0.05, 0.02}) {
    EXPECT_EQ(w.check_lr(2, lr), Decision::none);
    EXPECT_TRUE(w.holding()) << lr;
  }
  w.check_lr(3, 0.01);
  EXPECT_FALSE(w.holding());

  // After the phase is over, a checkpoint keeps it over.
  FreezeTracker after(4, o);
  after.load_state(t.state());
  EXPECT_FALSE(after.holding());
  EXPECT_EQ(after.frozen(), after.front());
  // A checkpoint from before the option: what it froze stays frozen.
  nlohmann::json old = t.state();
  old.erase("first_phase_over");
  old.erase("peak_lr");
  old["front"] = 1;
  FreezeTracker resumed(4, o);
  resumed.load_state(old);
  EXPECT_FALSE(resumed.holding());
  EXPECT_EQ(resumed.frozen(), 1);

  // The default (the paper) freezes as soon as it decides.
  FreezeTracker p = started(4, {});
  EXPECT_FALSE(p.holding());
  for (int j = 0; p.front() < 1 && j < 1000; ++j) p.check_plasticity(j, converging(j), 0.1);
  EXPECT_EQ(p.frozen(), 1);
}

// The policy observes each step's LR before acting on its readings: a reading at the
// fallen LR that completes W stale readings then freezes at once, after the held ones.
TEST(Tracker, AReadingAtTheFallenLrFreezesAtOnceOnceTheFallIsObserved) {
  TrackerOptions o;
  o.window = 3;
  o.freeze_first_phase = false;
  // Where module 1's W-th stale reading comes, fed at the peak LR throughout.
  FreezeTracker a = started(4, o);
  int k = 0;
  for (; a.front() < 2 && k < 1000; ++k) a.check_plasticity(k, converging(k), 0.1);
  ASSERT_EQ(a.front(), 2);
  const int last = k - 1;
  // The same readings, with the LR falling just before that one.
  FreezeTracker b = started(4, o);
  for (int j = 0; j < last; ++j) b.check_plasticity(j, converging(j), 0.1);
  ASSERT_EQ(b.front(), 1);
  ASSERT_EQ(b.frozen(), 0);
  EXPECT_EQ(b.observe_lr(last, 0.01), Decision::freeze);
  EXPECT_EQ(b.frozen(), 1) << "the held freeze, applied at the fall";
  EXPECT_EQ(b.check_plasticity(last, converging(last), 0.01), Decision::freeze);
  EXPECT_EQ(b.frozen(), 2);
  auto ev = b.take_events();
  EXPECT_EQ(ev.back().type, "freeze");
  EXPECT_EQ(ev.back().reason, "") << "decided after the fall: not held";
  EXPECT_EQ(b.observe_lr(last + 1, 0.01), Decision::none);

  // A fall straight into a last phase that trains whole: the holds lapse, nothing freezes.
  TrackerOptions l = o;
  l.freeze_last_phase = false;
  l.final_lr = 0.01;
  FreezeTracker c = started(4, l);
  for (int j = 0; c.front() < 1 && j < 1000; ++j) c.check_plasticity(j, converging(j), 0.1);
  ASSERT_EQ(c.front(), 1);
  EXPECT_EQ(c.check_lr(2000, 0.01), Decision::none);
  EXPECT_EQ(c.front(), 0);
  EXPECT_EQ(c.frozen(), 0);
  EXPECT_TRUE(c.done());
  auto cev = c.take_events();
  EXPECT_EQ(cev.back().type, "last_phase");
  for (auto& e : cev) EXPECT_NE(e.type, "unfreeze") << "nothing was frozen";
}

// --freeze-last-phase off: once the LR is within 10x of the run's final LR nothing is
// frozen: entering that phase unfreezes what is frozen (reason "last_phase") and ends
// the evaluations; earlier phases, and a schedule whose LR ends at 0, freeze as usual.
TEST(Tracker, LastPhaseTrainsWholeWhenAsked) {
  TrackerOptions o;
  o.window = 3;
  o.freeze_last_phase = false;
  o.final_lr = 0.001;
  FreezeTracker t = started(4, o);
  int i = 0;
  for (int j = 0; t.front() < 2 && j < 1000; ++j, ++i) t.check_plasticity(i, converging(j), 0.1);
  ASSERT_EQ(t.front(), 2) << "the first phase (LR 100x the final) freezes as usual";
  EXPECT_FALSE(t.done());
  // 0.1 -> 0.01: the paper's LR unfreeze, then refreezing in the middle phase.
  EXPECT_EQ(t.check_lr(i++, 0.01), Decision::unfreeze_all);
  EXPECT_EQ(t.take_events().back().reason, "lr");
  for (int j = 0; t.front() < 1 && j < 1000; ++j, ++i) t.check_plasticity(i, converging(j), 0.01);
  ASSERT_EQ(t.front(), 1) << "LR 10x the final: still a phase with a drop ahead";
  EXPECT_FALSE(t.in_last_phase());
  // A drop of less than 10x into the last phase: no LR unfreeze, the last-phase one.
  EXPECT_EQ(t.check_lr(i++, 0.002), Decision::unfreeze_all);
  EXPECT_EQ(t.take_events().back().reason, "last_phase");
  EXPECT_EQ(t.front(), 0);
  EXPECT_TRUE(t.in_last_phase());
  EXPECT_TRUE(t.done()) << "no more evaluations";
  for (int j = 0; j < 200; ++j, ++i) EXPECT_EQ(t.check_plasticity(i, 1e-9, 0.002), Decision::none);
  EXPECT_EQ(t.front(), 0);
  // The state survives a checkpoint.
  FreezeTracker u(4, o);
  u.load_state(t.state());
  EXPECT_TRUE(u.in_last_phase());

  // Entering the last phase with nothing frozen logs it and freezes nothing after.
  FreezeTracker v = started(4, o);
  EXPECT_EQ(v.check_lr(0, 0.005), Decision::none);
  auto ev = v.take_events();
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().type, "last_phase");
  for (int j = 0; j < 200; ++j) v.check_plasticity(j, converging(j), 0.005);
  EXPECT_EQ(v.front(), 0);

  // The default (the paper) freezes in the last phase; a final LR of 0 never starts one.
  for (auto [last, final_lr] : {std::pair{true, 0.001}, std::pair{false, 0.0}}) {
    TrackerOptions p = o;
    p.freeze_last_phase = last;
    p.final_lr = final_lr;
    FreezeTracker w = started(4, p);
    int k = 0;
    for (int j = 0; w.front() < 1 && j < 1000; ++j, ++k) w.check_plasticity(k, converging(j), 0.0001);
    EXPECT_EQ(w.front(), 1) << "freeze_last_phase " << last << " final_lr " << final_lr;
  }
  TrackerOptions bad;
  bad.freeze_last_phase = false;
  EXPECT_THROW(FreezeTracker(4, bad), Error) << "off needs the final LR";
}

TEST(Tracker, CustomUnfreezeHookForCyclicSchedules) {
  TrackerOptions o;
  o.window = 3;
  FreezeTracker t = started(3, o);
  t.custom_unfreeze = [](int64_t step, double) { return step >= 1000; };
  int i = 0;
  while (t.front() < 1 && i < 500) t.check_plasticity(i, converging(i), 0.1), ++i;
  ASSERT_EQ(t.front(), 1);
  EXPECT_EQ(t.check_lr(999, 0.1), Decision::none);
  EXPECT_EQ(t.check_lr(1000, 0.1), Decision::unfreeze_all);
  EXPECT_EQ(t.take_events().back().reason, "custom");
}

TEST(Tracker, RefreshKeepsTheHistoryAndTheCounter) {
  TrackerOptions o;
  o.window = 4;
  FreezeTracker t(3, o);
  t.bootstrap_check(0, 1, 0.1);
  t.bootstrap_check(1, 1, 0.1);
  for (int i = 0; i < 4; ++i) t.check_plasticity(i, converging(i), 0.1);
  EXPECT_TRUE(t.refresh_due());
  const int64_t c = t.stale_counter();
  t.reference_refreshed(4, 0.1);
  EXPECT_FALSE(t.refresh_due());
  EXPECT_EQ(t.stale_counter(), c);
  EXPECT_EQ(t.state()["raw"].size(), 4u);
}

// What plasticity looks like with the reference refreshed every W evaluations: within
// a period the distance to the fresh reference grows with the module's speed, so the
// readings are a sawtooth. The module slows down and then moves at a constant (noise)
// speed: the moving average over one period is flat from then on, and it freezes;
// while it is still slowing down, it does not.
TEST(Tracker, TheRefreshSawtoothAveragesOutAndAModuleThatStoppedSlowingDownFreezes) {
  TrackerOptions o;
  o.window = 5;  // and the reference refreshed every W evaluations, the default
  FreezeTracker t(3, o);
  t.bootstrap_check(0, 1.0, 0.1);
  t.bootstrap_check(1, 1.0, 0.1);
  auto speed = [](int i) { return 1.0 + 9.0 * std::exp(-i / 15.0); };  // flat (within 3%) from reading ~90
  int since_refresh = 0, froze_at = -1;
  for (int i = 0; i < 400 && froze_at < 0; ++i) {
    const double p = speed(i) * double(since_refresh + 1);
    if (t.check_plasticity(i, p, 0.1) == Decision::freeze) froze_at = i;
    ++since_refresh;
    if (t.refresh_due()) {
      t.reference_refreshed(i, 0.1);
      since_refresh = 0;
    }
  }
  ASSERT_GE(froze_at, 0) << "the sawtooth of refreshes kept a converged module active";
  EXPECT_GT(froze_at, 30) << "froze while the module was still slowing down fast";
}

// A unit that stops drifting and is then moved by SGD's noise alone, under an LR that
// decays linearly (the fine-tuning recipe): its SP loss against a reference grows with
// the sum of the squared LRs of the updates since the reference (a random walk), so the
// raw readings keep falling with the LR long after the unit has settled and their slope
// stays over T; read per squared LR (Note [Readings per squared learning rate]) they are
// flat once the drift is gone, and the unit freezes there. The event carries both.
TEST(Tracker, ReadPerSquaredLrASettledUnitFreezesThoughTheDecayingLrKeepsItsSpLossFalling) {
  const int total = 150, n = 3;  // readings, steps between them; the LR falls to 0 over the run
  auto lr = [&](int update) { return 0.1 * (1.0 - double(update) / double(total * n)); };
  auto drift = [](int i) { return 1.0 + 0.3 * std::exp(-i / 10.0); };  // flat (within 2%) from reading ~27
  auto run = [&](bool per_lr) -> int {
    TrackerOptions o;
    o.window = 5;  // the reference refreshed every W evaluations, the default
    o.readings_per_lr_sq = per_lr;
    FreezeTracker t(3, o);
    t.bootstrap_check(0, 1.0, 0.1);
    t.bootstrap_check(1, 1.0, 0.1);
    t.take_events();
    double lr_sq = 0;  // since the reference
    for (int i = 0; i < total; ++i) {
      for (int u = 0; u < n; ++u) lr_sq += lr(i * n + u) * lr(i * n + u);
      const double p = 1e-3 * drift(i) * lr_sq;
      const Decision d = t.check_plasticity(i, 0, p, lr(i * n), per_lr ? lr_sq : 0);
      const auto events = t.take_events();  // a refresh, then the evaluation, then a freeze
      const auto ev = std::find_if(events.begin(), events.end(), [](const Event& x) { return x.type == "evaluation"; });
      if (ev == events.end()) {
        ADD_FAILURE() << "reading " << i << " logged no evaluation";
        return -2;
      }
      const nlohmann::json e = ev->to_json();
      EXPECT_EQ(e["plasticity"].get<double>(), p);
      EXPECT_EQ(e.contains("lr_sq"), per_lr);
      if (per_lr) {
        EXPECT_DOUBLE_EQ(e["reading"].get<double>(), p / lr_sq);
      }
      if (d == Decision::freeze) return i;
      if (t.refresh_due()) {
        t.reference_refreshed(i, lr(i * n));
        lr_sq = 0;
      }
    }
    return -1;
  };
  const int raw = run(false), per_lr = run(true);
  ASSERT_GE(per_lr, 0) << "read per squared LR, a settled unit never froze";
  EXPECT_GT(per_lr, 20) << "froze while the unit was still drifting";
  EXPECT_LT(per_lr, 50);
  EXPECT_TRUE(raw < 0 || raw > 2 * per_lr) << "the raw SP loss froze at " << raw << ", per squared LR at " << per_lr;
}

// A module that has settled before its first fits (tiny first slopes), then swings once
// and goes back to noise well under its swing: the paper's T (first 3 fits) sits under
// the noise and never freezes it; T from the peak slope does (Note [Egeria's freezing
// decisions]).
TEST(Tracker, ASettledModuleFreezesWithPeakToleranceButNotWithTheFirstThree) {
  Generator g(11);
  Tensor noise = Tensor::randn({300}, g);
  auto p = [&](int i) {
    if (i < 9) return 1.0 + 0.001 * (i % 2);  // settled: first 3 fits ~0
    if (i < 29) return 1.0 + 0.5 * std::sin(3.14159265 * (i - 9) / 20.0);  // one swing
    return 1.0 + 0.02 * double(noise.data<float>()[i]);  // noise, 25x under the swing
  };
  // auto takes peak for a pretrained run (Note [T for a pretrained network]), first3 otherwise.
  using TF = ToleranceFrom;
  for (auto [from, pretrained, peak] : {std::tuple{TF::first3, false, false}, std::tuple{TF::peak, false, true},
                                        std::tuple{TF::automatic, false, false}, std::tuple{TF::automatic, true, true},
                                        std::tuple{TF::first3, true, false}}) {
    SCOPED_TRACE(testing::Message() << "tolerance from " << int(from) << ", pretrained " << pretrained);
    TrackerOptions o;
    o.window = 5;
    o.tolerance_from = from;
    o.pretrained = pretrained;
    FreezeTracker t = started(4, o);
    int froze_at = -1;
    for (int i = 0; i < 300 && froze_at < 0; ++i)
      if (t.check_plasticity(i, p(i), 0.1) == Decision::freeze) froze_at = i;
    if (peak) {
      EXPECT_GT(froze_at, 29) << "froze during the swing";
      EXPECT_LT(froze_at, 60) << "the noise after the swing is far under 20% of its slope";
    } else {
      EXPECT_EQ(froze_at, -1) << "the paper's T is ~1e-4 here, under the noise's slopes";
    }
  }
}

// After an LR unfreeze the plasticity is flat from the first reading (a module that had
// converged, now moving 10x slower). T measured again from those first fits is the
// noise's own scale and nothing refreezes; the module's first T (keep, the paper) or
// that T scaled by the LR's fall (scaled) refreezes it after the halved W. The choice
// survives a checkpoint taken between the unfreeze and the refreeze.
TEST(Tracker, RefreezingAfterAnLrDropUsesTheToleranceAsAsked) {
  auto refreeze = [](RefreezeTolerance mode, double noise, std::vector<Event>* evaluations, bool resume) {
    TrackerOptions o;
    o.window = 10;
    o.refreeze_tolerance = mode;
    FreezeTracker t = started(4, o);
    for (int i = 0; t.front() < 1 && i < 500; ++i) t.check_plasticity(i, converging(i), 0.1);
    EXPECT_EQ(t.front(), 1);
    EXPECT_EQ(t.check_lr(1000, 0.01), Decision::unfreeze_all);
    EXPECT_EQ(t.window(), 5);
    t.take_events();
    Generator g(5);
    Tensor z = Tensor::randn({300}, g);
    for (int j = 0; j < 300; ++j) {
      if (resume && j == 3) {
        FreezeTracker u(4, o);
        u.load_state(nlohmann::json::parse(t.state().dump()));
        t = u;
      }
      const Decision d = t.check_plasticity(1001 + j, 1.0 + noise * double(z.data<float>()[j]), 0.01);
      for (auto& e : t.take_events())
        if (e.type == "evaluation" && evaluations) evaluations->push_back(e);
      if (d == Decision::freeze) return j;
    }
    return -1;
  };
  for (double noise : {1e-3, 3e-2}) {
    EXPECT_EQ(refreeze(RefreezeTolerance::remeasure, noise, nullptr, false), -1) << "noise " << noise;
    // W/2 = 5 readings fill the first average, then the next 5 fits are stale.
    EXPECT_EQ(refreeze(RefreezeTolerance::keep, noise, nullptr, false), 9) << "noise " << noise;
    EXPECT_EQ(refreeze(RefreezeTolerance::keep, noise, nullptr, true), 9) << "noise " << noise;
  }
  // Noise 1000x under the converging curve's first slopes: 10x under the scaled T too.
  EXPECT_EQ(refreeze(RefreezeTolerance::scaled, 1e-3, nullptr, false), 9);
  EXPECT_EQ(refreeze(RefreezeTolerance::scaled, 1e-3, nullptr, true), 9);
  // Noise 30x larger: under the kept T, but not under a tenth of it for 5 fits in a row.
  std::vector<Event> kept, scaled;
  refreeze(RefreezeTolerance::keep, 3e-2, &kept, false);
  EXPECT_GT(refreeze(RefreezeTolerance::scaled, 3e-2, &scaled, false), 20);
  ASSERT_FALSE(kept.empty());
  ASSERT_FALSE(scaled.empty());
  EXPECT_GT(kept.front().tolerance, 0) << "the kept T applies from the first fit after the unfreeze";
  EXPECT_NEAR(scaled.front().tolerance, kept.front().tolerance * 0.1, 1e-12 * kept.front().tolerance);
}

TEST(Tracker, StateRoundTripContinuesTheSameDecisions) {
  for (auto [peak, mode] :
       {std::pair{false, RefreezeTolerance::remeasure}, std::pair{true, RefreezeTolerance::remeasure},
        std::pair{false, RefreezeTolerance::keep}, std::pair{true, RefreezeTolerance::scaled}}) {
    TrackerOptions o;
    o.window = 4;
    o.tolerance_from = peak ? ToleranceFrom::peak : ToleranceFrom::first3;
    o.refreeze_tolerance = mode;
    auto run = [&](FreezeTracker& t, int from, int to, std::vector<int>& decisions) {
      for (int i = from; i < to; ++i) {
        if (t.bootstrapping()) {
          t.bootstrap_check(i, 2.0 / (1 + 0.1 * i), 0.1);
          continue;
        }
        decisions.push_back(int(t.check_plasticity(i, converging(i % 37), i < 150 ? 0.1 : 0.001)));
        if (t.refresh_due()) t.reference_refreshed(i, 0.1);
      }
    };
    FreezeTracker full(6, o);
    std::vector<int> want, got;
    run(full, 0, 300, want);
    FreezeTracker a(6, o);
    run(a, 0, 120, got);
    FreezeTracker b(6, o);
    b.load_state(nlohmann::json::parse(a.state().dump()));
    run(b, 120, 300, got);
    EXPECT_EQ(got, want);
    EXPECT_EQ(b.state(), full.state());
    FreezeTracker other(5, o);
    EXPECT_THROW(other.load_state(a.state()), Error);
  }
}

// Note [Reading ahead of the front]: readings every evaluation of the front (converging
// late) and of the unit after it (converged early). The unit after it freezes right
// behind the front with lookahead, and only 2W + 3 readings later without.
struct AheadRun {
  std::vector<int> froze_at;  // the reading index at which each of modules 0, 1 froze
  FreezeTracker tracker;
};
AheadRun read_ahead(int64_t lookahead, int stop_after = -1, const nlohmann::json* resume = nullptr) {
  TrackerOptions o;
  o.window = 4;
  o.lookahead = lookahead;
  FreezeTracker t = started(4, o);
  if (resume) t.load_state(*resume);
  AheadRun r{{-1, -1}, t};
  const int first = resume ? resume->at("test_next").get<int>() : 0;
  for (int i = first; i < 200 && r.tracker.front() < 2; ++i) {
    if (i == stop_after) break;
    // Each evaluation reads the front, then the units after it (the policy's order).
    for (int64_t m = r.tracker.front(); m <= r.tracker.last_read() && m < 2; ++m) {
      const int64_t before = r.tracker.front();
      const double p = m == 0 ? converging(i / 3) : converging(i);
      r.tracker.check_plasticity(i, m, p, 0.1);
      if (r.tracker.front() > before) r.froze_at[size_t(before)] = i;
    }
  }
  return r;
}

TEST(Tracker, ReadingAheadLetsTheNextUnitFreezeRightBehindTheFront) {
  const AheadRun alone = read_ahead(0), ahead = read_ahead(1);
  ASSERT_GE(alone.froze_at[0], 0);
  ASSERT_GE(alone.froze_at[1], 0);
  // The front's readings are the same either way: it freezes at the same reading.
  EXPECT_EQ(ahead.froze_at[0], alone.froze_at[0]);
  // Module 1, stale for W readings already, freezes at its reading of the same
  // evaluation; alone it starts its history there and needs 2W + 3 more.
  EXPECT_EQ(ahead.froze_at[1], ahead.froze_at[0]);
  EXPECT_GE(alone.froze_at[1], alone.froze_at[0] + 2 * 4 + 3);
  // Module 1's readings before the front froze are logged as its own evaluations.
  int early = 0;
  FreezeTracker t = read_ahead(1).tracker;
  for (const Event& e : t.take_events()) early += e.type == "evaluation" && e.module == 1 && e.step < ahead.froze_at[0];
  EXPECT_EQ(early, ahead.froze_at[0]);
  // Only the units read take readings; an unfreeze drops the units read ahead.
  EXPECT_THROW(t.check_plasticity(500, 0, 0.5, 0.1), Error);  // frozen
  EXPECT_THROW(t.check_plasticity(500, 3, 0.5, 0.1), Error);  // the head is never read
  EXPECT_EQ(t.check_lr(501, 0.01), Decision::unfreeze_all);
  EXPECT_TRUE(t.state()["ahead"].empty());
}

TEST(Tracker, TheUnitsReadAheadResumeFromTheState) {
  const AheadRun full = read_ahead(1);
  for (int stop : {3, 9, full.froze_at[0]}) {
    AheadRun a = read_ahead(1, stop);
    nlohmann::json s = nlohmann::json::parse(a.tracker.state().dump());
    if (stop < full.froze_at[0]) {
      EXPECT_FALSE(s["ahead"].empty()) << stop;
    }
    s["test_next"] = stop;
    const AheadRun b = read_ahead(1, -1, &s);
    EXPECT_EQ(b.tracker.front(), 2) << stop;
    nlohmann::json sb = b.tracker.state(), sf = full.tracker.state();
    EXPECT_EQ(sb, sf) << stop;
  }
}

}  // namespace
}  // namespace eg::freeze
