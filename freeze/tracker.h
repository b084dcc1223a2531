// Algorithm 1 of the Egeria paper (§4.2.2): the decision logic of knowledge-guided
// layer freezing, free of tensors and threads so that it can be tested on synthetic
// plasticity sequences and checkpointed as plain JSON.
//
// Note [Egeria's freezing decisions]
// - Bootstrapping: every n iterations the mean training loss of the last n iterations
//   is compared with the previous check's; when it changes by less than 10% the
//   critical period is over and plasticity evaluation starts.
// - Every n iterations the frontmost active module l is evaluated: its plasticity P
//   (SP loss against the reference model) is smoothed by a moving average over the
//   last W readings (Equation 2), appended to l's history, and a least-squares line is
//   fitted to the last W smoothed values (averages of a full window of W readings).
//   The module's tolerance T is 20% of the largest slope among its first 3 fits. A
//   slope below T counts as stale; W consecutive stale readings freeze l and move to
//   l + 1. The last module (the head) is never frozen.
// - Unfreezing: when the LR has fallen by 10x or more since the front module froze,
//   every module is unfrozen, l goes back to the first module, and W is halved for
//   refreezing. A hook lets cyclic schedules decide their own unfreezing.
// - Where this departs from the letter of the paper, and why:
//   * Slopes are compared by magnitude (|s| < T, T = 0.2 max|s| of the first 3 fits).
//     The paper writes s < T; with a signed slope a plasticity that falls steeply
//     would count as stale, which is not "stationary".
//   * The reference is regenerated every W evaluations (the paper: "every W
//     iterations", with W also the moving-average window), and the histories are
//     kept across a refresh. Against a fresh reference a module's plasticity starts
//     near zero and grows with the distance it moves, so the raw readings form a
//     sawtooth with period W; the moving average over W readings spans one whole
//     period and cancels it: the smoothed plasticity is the module's distance moved
//     per period, flat once that speed has stopped falling. Cleared histories would
//     read every rising edge as a steep slope, and nothing would freeze. The stale
//     counter and T survive a refresh.
//   * After an unfreeze, the T a module refreezes with is a choice (refreeze_tolerance,
//     --freeze-refreeze-tolerance): remeasure (the default): from its first 3 fits after
//     the unfreeze, at the lower LR; keep: the T of its first 3 fits ever (the paper:
//     T is per module, set once; "refreezing takes much less time because of the
//     relaxed criteria"); scaled: that T times lr_now / lr_when_measured, as the module
//     and its plasticity move that much slower. remeasure can miss: after a 10x drop
//     the plasticity is already flat, its first 3 fits are noise, and T lands far
//     below the noise of later fits.
//   * Optionally (tolerance_from = peak, --freeze-tolerance-from peak) T is coef x the
//     largest |slope| the module has shown so far, not in its first 3 fits. A module
//     already settled when bootstrapping ends shows tiny first slopes, so the paper's
//     T sits below its own noise and it does not freeze until the LR drops; with peak,
//     stale means "moving at under 20% of its fastest observed rate". first3 (the
//     paper) stays the default from scratch; a pretrained run takes peak (Note [T for
//     a pretrained network]).
//   * Optionally (min_window, --freeze-window-min) the halving of W after an unfreeze
//     stops at a floor. W is the moving-average span, the slope-fit span, the stale
//     count and the refresh period at once; W = 10 halves to 2 after a step schedule's
//     second LR drop, where a fit over two averages of two readings is noise.
//   * Optionally (freeze_last_phase = false, --freeze-last-phase off) nothing is frozen
//     in the last phase of the schedule: once the LR is within 10x of the run's final
//     LR it can no longer fall 10x, so a freeze there would last to the end and the
//     frozen modules would never fine-tune at the low LR. Entering that phase unfreezes
//     everything (event "unfreeze", reason "last_phase") and ends the evaluations. The
//     paper's behaviour stays the default (docs/freezing-measurements.md: why).
//   * Optionally (freeze_first_phase = false, --freeze-first-phase off) no freeze is
//     applied before the LR first falls 10x below its peak (the end of warm-up does
//     not count). Algorithm 1 runs as usual, so T comes from fits at the high LR, but
//     a freeze decision is held (event "hold"): the front moves on while the held
//     modules keep training. When the LR has fallen 10x every held module freezes at
//     once (event "freeze", reason "held"), and the LR unfreeze rule counts from there.
//     Why: on a short step schedule the accuracy a freeze costs is built while the
//     front is frozen at the high LR. It keeps accuracy better but freezes little. The
//     paper's behaviour stays the default.
//   * Optionally (unfreeze_on_lr_fall = false, --freeze-unfreeze never) an LR fall
//     unfreezes nothing: what froze stays frozen and Algorithm 1 goes on with the next
//     module, as AutoFreeze never unfreezes. Why: on a short schedule the second decay
//     unfroze everything, and the last phase ran at full cost with nothing refreezing;
//     but the front's fine-tuning at the lowest LR can be worth more accuracy than the
//     time saved. The paper's unfreeze stays the default; --freeze-last-phase off still
//     unfreezes when the last phase begins.
// Measurements: docs/freezing-measurements.md, "Egeria's freezing decisions".
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace eg::freeze {

enum class RefreezeTolerance { remeasure, keep, scaled };
// Whose slopes T is a share of: a unit's first 3 fits (the paper), all its fits so far,
// or automatic: peak for a pretrained run, first3 otherwise (Note [T for a pretrained network]).
enum class ToleranceFrom { first3, peak, automatic };

struct TrackerOptions {
  int64_t interval = 0;  // n: iterations between evaluations (0: derive, see default_interval)
  // Iterations between the bootstrapping stage's loss checks (0: derive, see
  // default_bootstrap_interval, or no bootstrapping when `pretrained`; -1: n, the paper;
  // -2: no bootstrapping, Note [Bootstrapping a pretrained network]).
  int64_t bootstrap_interval = 0;
  // The run starts from a pretrained network's weights (--init-from): the auto
  // bootstrapping interval is then none, and the auto T from the steepest fit.
  bool pretrained = false;
  int64_t window = 10;  // W: stale readings to freeze; moving-average and fit window
  int64_t min_window = 1;  // halving W after an unfreeze stops here (1: the paper)
  double tolerance_coef = 0.2;  // T = coef x the largest |slope| of a module's first 3 fits
  ToleranceFrom tolerance_from = ToleranceFrom::automatic;  // ... or of all its fits so far
  bool tolerance_from_peak() const {
    return tolerance_from == ToleranceFrom::peak || (tolerance_from == ToleranceFrom::automatic && pretrained);
  }
  // The T a module refreezes with after an unfreeze (Note [Egeria's freezing decisions]).
  RefreezeTolerance refreeze_tolerance = RefreezeTolerance::remeasure;
  double bootstrap_change = 0.10;  // bootstrapping ends when the loss changes by less than this
  double unfreeze_lr_factor = 10;  // unfreeze all when the LR has fallen by this factor
  // The LR of the run's last step (< 0: unknown). With freeze_last_phase false, the
  // last phase of the schedule (LR below unfreeze_lr_factor x final_lr) trains whole.
  double final_lr = -1;
  bool freeze_last_phase = true;  // true: the paper
  bool freeze_first_phase = true;  // false: hold freezes until the LR falls 10x below its peak
  bool unfreeze_on_lr_fall = true;  // false: an LR fall never unfreezes (custom_unfreeze still may)
  int64_t refresh_every = 0;  // evaluations between reference refreshes (0: W)
  // Units after the front read at each evaluation as well (Note [Reading ahead of the
  // front]); 0: the front only, the paper.
  int64_t lookahead = 0;
  // Each reading divided by the sum of the squared LRs of the updates between the
  // reference and the reading (Note [Readings per squared learning rate]); false: the
  // SP loss itself, the paper.
  bool readings_per_lr_sq = false;
};

// The paper's guideline (§4.2.2): n = total / (2W) / modules / 1.75, covering
// bootstrapping, smoothing delay and the halved windows after unfreezing, and at least
// kMinDefaultInterval. A run too short for the guideline to give that many (the
// quickstart's 79 steps: n = 1) cannot evaluate every module whatever n is, and at
// n = 1 the bootstrapping check compares the losses of two single batches (it ended at
// step 2, inside the warmup, on a 1.4% change) and the reference reads every step: 33%
// of the quickstart's training time, 1.9 s of it waiting for readings. The paper warns
// the same way: "further reducing n could consume more CPUs and potentially slow down
// the training" (§6.4). --freeze-interval sets any n >= 1.
// A run from pretrained weights has its own, lower floor: Note [n for a pretrained network].
constexpr int64_t kMinDefaultInterval = 10;
constexpr int64_t kMinPretrainedInterval = 3;
int64_t default_interval(int64_t total_iterations, int64_t modules, int64_t window, bool pretrained = false);

// Note [n for a pretrained network]
// Algorithm 1 cannot freeze a unit before about 2W + 3 of its readings: W for the
// first full moving average, 3 fits for T, then W stale ones; and the next unit
// starts from none. At the floor of 10 a 460-step fine-tuning run (docs/fine-tuning.md's
// ResNet-20 task: 6 units, W = 10) could freeze its front unit at step ~230 at the
// earliest, and at the defaults froze it in its last third or not at all, though a
// pretrained front is stable from its first steps (the paper: a pretrained model's
// front needs few iterations, §2.3). Neither of the floor's two reasons holds there
// as it does from scratch: a pretrained run has no bootstrapping check to be made of
// single batches (Note [Bootstrapping a pretrained network]), and its reference's
// share of the time is what a reading every n steps costs against a run that freezes
// from its first third. So with --init-from the guideline's floor is
// kMinPretrainedInterval. Measured on that task (3 seeds, against n = 2 and 10, and
// W = 5): docs/freezing.md, "n for a pretrained network".

// Note [T for a pretrained network]
// The paper's T is 20% of the steepest of a unit's first 3 slopes: from scratch those
// fits fall in the early fast stage, and "stale" means moving far slower than then
// (§6.4: "considerably lower compared to itself during the early fast training
// stage"). A pretrained unit has no such stage, and without bootstrapping its first
// fits are those of the run's first steps: where they happen to fall on a flat stretch
// of its smoothed plasticity, T lands under the slopes its own noise gives later, and
// the unit freezes late or never, where another seed of the same run, whose first fits
// were steeper, freezes it early. So with --init-from T is a share of the steepest slope
// the unit has shown so far (peak): a unit freezes once it moves at under 20% of the
// fastest rate it was seen moving at, whichever fits showed it. --freeze-tolerance-from
// first3|peak sets either way. Measured on the fine-tuning task: docs/freezing.md, "T for
// a pretrained network".

// Note [The bootstrapping check's span]
// Bootstrapping ends when the mean training loss over one check's span differs by less
// than 10% from the span's before (§4.2.2). The paper checks every n iterations, and
// its n spans most of an epoch (ResNet-56 on CIFAR-10: n = 300 of ~390 iterations an
// epoch), so its 10% is a change of the loss from one 0.77-epoch stretch to the next.
// A shorter run gets a smaller n from the guideline, and with it the same 10% came
// to mean something else: 10 epochs of ResNet-56 on Fashion-MNIST have n = 16, and
// bootstrapping ended at step 48 or 80 (0.1-0.17 epochs), the loss at 2.08 or 1.70
// from 2.3, the network barely started; the front unit's tolerance then came from
// the steep slopes of the first fits, and it froze at epoch 1.3-1.5, at the high LR
// (seeds 0 and 1 ended 2.05 and 0.91 pt below the unfrozen run). So the span is an
// epoch, or a tenth of a run shorter than 10 epochs, and never less than n: the
// loss's change from one epoch to the next is what the paper's 10% measures.
// --freeze-bootstrap-interval sets it (n: the paper's check, at the run's own n).
// Measured, 10 epochs, seeds 0-2, against the check every n: docs/time-to-accuracy.md.
int64_t default_bootstrap_interval(int64_t total_iterations, int64_t steps_per_epoch, int64_t interval);

// Note [Bootstrapping a pretrained network]
// Bootstrapping waits out the critical period of training from scratch, in which every
// layer still changes fast (§4.2.2). A fine-tuning run starts past it: the front of a
// pretrained network is already trained, and what falls fast is the loss of a new head.
// The 10% rule reads that fall as a critical period of the whole network: on the
// transfer task of docs/fine-tuning.md (ResNet-20, 6,000 images, 10 epochs) the loss
// fell by more than 10% from each epoch to the next until epoch 7, and nothing could
// freeze before the last 30% of the run. So with --init-from the auto interval is no
// bootstrapping (-2): the reference is the network after its first step, and readings
// start there. --freeze-bootstrap-interval auto|n|N|off sets it either way.
constexpr int64_t kNoBootstrapping = -2;

// Note [Reading ahead of the front]
// Algorithm 1 reads the front module alone, so a module's history starts only when
// the one before it freezes, and a module cannot freeze before about 2W + 3 of its own
// readings (Note [n for a pretrained network]): on a 460-step fine-tuning run at n = 3
// the front froze at step 150-290 and the next unit had no time left. With lookahead L
// the L units after the front are read at every evaluation too (each against the same
// snapshot, each on its own input in the training forward under the unit scope), and
// each keeps its own moving average, fits, tolerance and stale counter, so that when
// the front freezes the next unit takes its history along: if it has been stale for W
// readings already, it freezes at its next reading. Only the front freezes, so the
// frozen set stays a prefix and the criterion stays Algorithm 1's, unit by unit. The
// reference is refreshed every W of the front's readings, as before. Readings ahead
// cost one more unit's reference forward each. Under the network scope (a
// Transformer) a reading ahead also carries the change of the units before it.
// Measured on the fine-tuning task: docs/freezing.md, "Reading ahead of the front".

// Note [Readings per squared learning rate]
// Algorithm 1 reads a unit's SP loss against a reference of up to W readings ago as its
// speed of change, and freezes it when that speed has stopped falling. On the paper's
// step schedules the LR is constant between decays, so a falling speed is the unit
// settling. On a schedule that decays the LR at every step (the fine-tuning recipe's
// linear decay, cosine) it is also the LR: a unit moved only by SGD's noise moves, from
// its reference, a distance whose square grows with the sum of the squared LRs of its
// updates (a random walk), and its SP loss, which grows with that square, keeps falling
// with the LR long after the unit has settled; its slope stays over T, and the unit
// freezes late or never. With readings_per_lr_sq (--freeze-reading per-lr2) each SP loss
// is divided by that sum, taken over the updates between the reference's snapshot and
// the capture the reading was taken from (the policy keeps it per capture, and in the
// checkpoint): a unit moving by noise alone reads flat, what still falls is its drift.
// Within a refresh period this also divides the sawtooth by its own ramp. A reading whose
// capture holds the snapshot's weights (n = 1) is divided by one update's.
// The division assumes a reading that is all movement: the reference's own disagreement
// at no movement (the int8 error; with --freeze-reference-bn running the snapshot's
// running statistics against the batch's, a fifth of a period's SP loss and up to all of
// it) does not shrink with the LR, and divided by the small sums of the warmup's first
// steps it makes the first fits, and so T, huge: the unit then freezes as soon as it has
// had W readings after them, whatever they say. So per-lr2 is meant with the batch's
// statistics (--freeze-reference-bn batch, whose disagreement is the int8 error alone).
// Measured on the fine-tuning task: docs/freezing.md, "Readings per squared LR".

// Least-squares slope of ys against 0, 1, 2, ...; 0 for fewer than two points.
double fit_slope(const std::vector<double>& ys);

enum class Decision { none, end_bootstrap, freeze, unfreeze_all };
const char* decision_name(Decision d);

// One evaluation or decision, with every input it was taken from (DIR/freeze.jsonl).
struct Event {
  std::string type;  // "bootstrap", "evaluation", "freeze", "unfreeze", "refresh"
  std::string reason;  // unfreeze: "lr", "last_phase" or "custom"; freeze: "held" (applying held freezes)
  int64_t step = 0, module = -1, counter = 0, window = 0;
  double plasticity = 0, smoothed = 0, slope = 0, tolerance = 0, lr = 0, loss = 0, prev_loss = 0;
  // > 0: the reading Algorithm 1 took is plasticity / lr_sq (Note [Readings per squared
  // learning rate]).
  double lr_sq = 0;
  bool has_slope = false;
  nlohmann::json to_json() const;
};

class FreezeTracker {
 public:
  FreezeTracker(int64_t num_modules, TrackerOptions o);

  const TrackerOptions& options() const { return opt_; }
  int64_t num_modules() const { return num_modules_; }
  bool bootstrapping() const { return bootstrapping_; }
  // The frontmost active module: the one Algorithm 1 evaluates. Modules [0, front())
  // are frozen, unless their freeze is held (freeze_first_phase off).
  int64_t front() const { return front_; }
  // The modules the model has frozen: [0, frozen()).
  int64_t frozen() const { return holding() ? 0 : front_; }
  // Freezes are being held: freeze_first_phase off, and the LR has not yet fallen
  // unfreeze_lr_factor x below its peak.
  bool holding() const { return !opt_.freeze_first_phase && !first_phase_over_; }
  int64_t window() const { return window_; }
  int64_t stale_counter() const { return cur_.counter; }
  // Nothing left to evaluate: only the head is active, or the last phase has begun
  // with freeze_last_phase off.
  bool done() const { return front_ >= num_modules_ - 1 || last_phase_; }
  bool in_last_phase() const { return last_phase_; }

  // Bootstrapping check with the mean training loss since the last check.
  Decision bootstrap_check(int64_t step, double mean_loss, double lr);
  // Algorithm 1's checkPlasticity for the front module's reading P at `step`.
  Decision check_plasticity(int64_t step, double plasticity, double lr);
  // A reading of `module`, the front or one of the units read ahead of it (reads());
  // only the front's can freeze (Note [Reading ahead of the front]). lr_sq > 0: the
  // sum of the squared LRs of the updates between the reference and the reading, which
  // Algorithm 1 then reads plasticity per (Note [Readings per squared learning rate]).
  Decision check_plasticity(int64_t step, int64_t module, double plasticity, double lr, double lr_sq = 0);
  // The modules an evaluation reads now: [front(), last_read()], none when done().
  int64_t last_read() const { return std::min(front_ + opt_.lookahead, num_modules_ - 2); }
  bool reads(int64_t module) const { return !bootstrapping_ && !done() && module >= front_ && module <= last_read(); }
  // LR-based unfreezing (Algorithm 1, lines 19-27), checked every step so that an
  // unfreeze is not delayed to the next evaluation.
  Decision check_lr(int64_t step, double lr);
  // The step's LR, before its readings are acted on: follows the LR's peak and, with
  // freeze_first_phase off, ends the first phase when the LR has fallen
  // unfreeze_lr_factor x below it, applying the held freezes (Decision::freeze) at
  // this step, so that a reading at the fallen LR freezes at once instead of holding.
  // check_lr() does the same; calling this first only moves it ahead of the readings.
  Decision observe_lr(int64_t step, double lr);
  // The controller asks after each evaluation whether the reference should be
  // regenerated, and reports when it was.
  bool refresh_due() const;
  void reference_refreshed(int64_t step, double lr);

  // Cyclic schedules: called every step with (step, lr) while a unit is frozen;
  // returning true unfreezes all. Set from PolicyConfig::unfreeze_hook (the C++ API's
  // FreezeOptions::unfreeze_hook).
  std::function<bool(int64_t, double)> custom_unfreeze;

  std::vector<Event> take_events();
  nlohmann::json state() const;
  void load_state(const nlohmann::json& s);

 private:
  // One module's readings and what Algorithm 1 derives from them.
  struct Readings {
    std::vector<double> raw, smoothed;  // since the module's history began (kept across refreshes)
    std::vector<double> first_slopes;  // its first 3 fits
    double peak_slope = 0;  // its largest |slope| so far
    double tolerance_lr = 0;  // the LR of its third fit
    int64_t counter = 0;  // stale readings in a row
    nlohmann::json to_json() const;
    static Readings from_json(const nlohmann::json& j);
  };
  // The front becomes the next module: with its readings ahead when it has them, else
  // a fresh history (with the kept T under keep and scaled).
  void start_module();
  Readings fresh(int64_t module) const;
  // Remembers the front module's T before the front moves (freeze or unfreeze), and
  // the T of the modules read ahead when their readings are dropped (an unfreeze).
  void leave_module();
  // Adds reading p to r: the moving average, the fit, T and the stale counter, in e.
  void add_reading(Readings& r, double p, double lr, Event& e);
  // The reading Algorithm 1 takes of plasticity p, noted in e.
  static double reading_of(double p, double lr_sq, Event& e);
  void unfreeze_all(int64_t step, double lr, const char* why);
  // Held freezes lapse without being applied: Algorithm 1 starts again at module 0.
  void drop_holds();
  // lr is in the schedule's last phase and freeze_last_phase is off.
  bool last_phase_lr(double lr) const;
  // An event of this type with the tracker's current module, counter, window and LR.
  Event event(const char* type, int64_t step, double lr) const;

  TrackerOptions opt_;
  int64_t num_modules_;
  bool bootstrapping_ = true;
  double prev_loss_ = -1;
  int64_t front_ = 0, window_, evals_since_refresh_ = 0;
  double lr_at_front_freeze_ = 0;  // 0: nothing frozen since the last unfreeze
  bool last_phase_ = false;  // the LR has reached the last phase (freeze_last_phase off)
  double peak_lr_ = 0;  // the largest LR seen
  bool first_phase_over_ = false;  // the LR has fallen unfreeze_lr_factor x below peak_lr_
  Readings cur_;  // the front module's
  std::vector<Readings> ahead_;  // modules front_ + 1, front_ + 2, ... read so far (lookahead)
  // Each module's first 3 fits, peak and their LR, kept across unfreezes (keep, scaled).
  struct Kept {
    std::vector<double> first;
    double peak = 0, lr = 0;
  };
  std::vector<Kept> kept_;
  double tolerance(const Readings& r, double lr) const;
  std::vector<Event> events_;
};

}  // namespace eg::freeze
