// The table's freezing rows (train/options.cpp has the rest): the policy, Egeria's
// tracker, the reference model and the activation cache, in the table's order.
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "freeze/policy.h"
#include "quant/reference.h"
#include "train/config.h"
#include "train/option_rows.h"

namespace eg::train::rows {

namespace {

// SmartFRZ's rows (freeze/policy_smartfrz.cpp) and its recorder's (train/smartfrz_record.h).
void add_smartfrz_options(std::vector<Option>& t) {
  using G = OptionGroup;
  const OnResume F = OnResume::fixed;
  t.push_back(text("--smartfrz-predictor", "smartfrz_predictor", G::freezing, F,
                   "smartfrz: the trained attention predictor, a safetensors file (freeze/smartfrz.h)",
                   EG_FIELD(freezing.smartfrz.predictor), "FILE"));
  t.push_back(choice(
      "--smartfrz-order", "smartfrz_order", G::freezing, F,
      "smartfrz: prefix (the front units the predictor names, up to the first it keeps) or any (every "
      "unit it names; one behind trainable units skips its weight gradients and update)",
      EG_FIELD(freezing.smartfrz.order),
      Names<freeze::SmartFrzOrder>{{"prefix", freeze::SmartFrzOrder::prefix}, {"any", freeze::SmartFrzOrder::any}}));
  t.push_back(number("--smartfrz-window", "smartfrz_window", G::freezing, F,
                     "smartfrz: records in a unit's weight history (0: the predictor's own)",
                     EG_FIELD(freezing.smartfrz.window),
                     Rule<int64_t>{[](int64_t v) { return v == 0 || v >= 2; }, "0 or at least 2"}));
  t.push_back(number("--smartfrz-record-every", "smartfrz_record_every", G::freezing, F,
                     "smartfrz: steps between records of the tailored weights (0: an epoch's steps / the window)",
                     EG_FIELD(freezing.smartfrz.record_every),
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(number("--smartfrz-stage-every", "smartfrz_stage_every", G::freezing, F,
                     "smartfrz: steps between freezing stages (0: once an epoch)",
                     EG_FIELD(freezing.smartfrz.stage_every),
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(number("--smartfrz-threshold", "smartfrz_threshold", G::freezing, F,
                     "smartfrz: a unit freezes when the predictor's probability of freeze is at least this (0.99: "
                     "the shipped predictor's precision at least 0.9 on every model it never saw)",
                     EG_FIELD(freezing.smartfrz.threshold),
                     Rule<double>{[](double v) { return v > 0 && v < 1; }, "in (0, 1)"}));
  t.push_back(number("--smartfrz-max-per-stage", "smartfrz_max_per_stage", G::freezing, F,
                     "smartfrz: the most units one freezing stage may freeze, front first (0: no limit)",
                     EG_FIELD(freezing.smartfrz.max_per_stage),
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(number("--smartfrz-patience", "smartfrz_patience", G::freezing, F,
                     "smartfrz: a unit freezes when its probability of freeze is at or over the threshold at this "
                     "many stages in a row",
                     EG_FIELD(freezing.smartfrz.patience),
                     Rule<int64_t>{[](int64_t v) { return v >= 1; }, "at least 1"}));
  t.push_back(number("--smartfrz-start-below", "smartfrz_start_below", G::freezing, F,
                     "smartfrz: freezing stages begin once the mean training loss since the last stage is at most "
                     "this times the loss of predicting the training targets' frequencies (a network that has not "
                     "begun to learn is not judged converged; 0: from the first stage, as published)",
                     EG_FIELD(freezing.smartfrz.start_below),
                     Rule<double>{[](double v) { return v >= 0; }, "0 or positive"}));
  t.push_back(choice("--smartfrz-record", "smartfrz_record", G::freezing, F,
                     "record every unit's tailored weights and its output's Gram on a probe batch, every "
                     "--smartfrz-record-every steps, into the run's smartfrz-records.safetensors (any policy): the "
                     "data SmartFRZ's predictor is trained on (bench/train_smartfrz_predictor.py)",
                     EG_FIELD(freezing.smartfrz.record), kOnOff));
  t.push_back(number("--smartfrz-record-probe", "smartfrz_record_probe", G::freezing, F,
                     "--smartfrz-record: samples of the probe batch, the first of the run's first training batch",
                     EG_FIELD(freezing.smartfrz.probe), Rule<int64_t>{[](int64_t v) { return v >= 2; }, "at least 2"}));
}

// Egeria's decisions (Algorithm 1, freeze/tracker.h): n, bootstrapping, W, T, unfreezing.
void add_egeria_decision_options(std::vector<Option>& t) {
  using G = OptionGroup;
  const OnResume F = OnResume::fixed;
  t.push_back(number("--freeze-interval", "freeze_interval", G::freezing, F,
                     "egeria/autofreeze: iterations between evaluations n (0: egeria, the paper's guideline, at least "
                     "10, or 3 for a run from --init-from's pretrained weights; autofreeze, one epoch)",
                     EG_FIELD(freezing.tracker.interval),
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  {
    Option o = row("--freeze-bootstrap-interval", "freeze_bootstrap_interval", G::freezing, F,
                   "egeria: iterations between the bootstrapping stage's checks, each comparing the mean training loss "
                   "over its iterations with the previous check's: auto (an epoch, or a tenth of a shorter run, and at "
                   "least n; none for a run that starts from --init-from's pretrained weights), n (every n "
                   "iterations, the paper), a number, or off (no bootstrapping: readings from the first step)",
                   "auto|n|N|off");
    // config.json keeps TrainConfig's number (0: auto, -1: n), as runs before the table did.
    o.get = [](const TrainConfig& c) { return json(c.freezing.tracker.bootstrap_interval); };
    o.set = [](TrainConfig& c, const json& j) {
      if (j == "auto" || j == 0) return void(c.freezing.tracker.bootstrap_interval = 0);
      if (j == "n" || j == -1) return void(c.freezing.tracker.bootstrap_interval = -1);
      if (j == "off" || j == -2) return void(c.freezing.tracker.bootstrap_interval = freeze::kNoBootstrapping);
      int64_t v = 0;
      try {
        v = to_number<int64_t>("--freeze-bootstrap-interval", j);
      } catch (const Error&) {
      }
      EG_CHECK(v >= 1, "--freeze-bootstrap-interval must be auto, n, off or a positive number of iterations, got ",
               j.is_string() ? "'" + j.get<std::string>() + "'" : j.dump());
      c.freezing.tracker.bootstrap_interval = v;
    };
    o.check = [](const TrainConfig& c) {
      EG_CHECK(c.freezing.tracker.bootstrap_interval >= freeze::kNoBootstrapping,
               "--freeze-bootstrap-interval must be auto, n, off or a positive number of iterations, got ",
               c.freezing.tracker.bootstrap_interval);
    };
    t.push_back(o);
  }
  t.push_back(number("--freeze-window", "freeze_window", G::freezing, F, "egeria: W, stale readings before freezing",
                     EG_FIELD(freezing.tracker.window), Rule<int64_t>{[](int64_t v) { return v >= 1; }, "at least 1"}));
  t.push_back(number("--freeze-lookahead", "freeze_lookahead", G::freezing, F,
                     "egeria: units after the front read at each evaluation as well, each with its own history, so "
                     "that the next unit can freeze soon after the front (0: the front only, the paper)",
                     EG_FIELD(freezing.tracker.lookahead),
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(number("--freeze-window-min", "freeze_window_min", G::freezing, F,
                     "egeria: W halves after each unfreeze, but not below this (1: the paper)",
                     EG_FIELD(freezing.tracker.min_window),
                     Rule<int64_t>{[](int64_t v) { return v >= 1; }, "at least 1"}));
  t.push_back(number("--freeze-tolerance", "freeze_tolerance", G::freezing, F, "egeria: T coefficient",
                     EG_FIELD(freezing.tracker.tolerance_coef),
                     Rule<double>{[](double v) { return v > 0; }, "positive"}));
  using TF = freeze::ToleranceFrom;
  t.push_back(choice("--freeze-tolerance-from", "freeze_tolerance_from", G::freezing, F,
                     "egeria: T = coefficient x the largest |slope| of a module's first 3 fits (first3, the paper) or "
                     "of all its fits so far (peak: for modules already settled when readings start); auto: peak "
                     "for a run from --init-from's pretrained weights, first3 otherwise",
                     EG_FIELD(freezing.tracker.tolerance_from),
                     Names<TF>{{"auto", TF::automatic}, {"first3", TF::first3}, {"peak", TF::peak}}));
  t.push_back(choice("--freeze-reading", "freeze_reading", G::freezing, F,
                     "egeria: what Algorithm 1 reads of a unit: its SP loss against the reference (sp-loss, the "
                     "paper), or that divided by the sum of the squared LRs of the updates since the reference "
                     "(per-lr2: a decaying LR's own fall in plasticity is not read as convergence)",
                     EG_FIELD(freezing.tracker.readings_per_lr_sq),
                     Names<bool>{{"sp-loss", false}, {"per-lr2", true}}));
  using RT = freeze::RefreezeTolerance;
  t.push_back(choice("--freeze-refreeze-tolerance", "freeze_refreeze_tolerance", G::freezing, F,
                     "egeria: the T a module refreezes with after an LR unfreeze: measured again from its first 3 fits "
                     "at the new LR (remeasure), the T of its first fits ever (keep, the paper), or that T scaled by "
                     "the LR's fall (scaled)",
                     EG_FIELD(freezing.tracker.refreeze_tolerance),
                     Names<RT>{{"remeasure", RT::remeasure}, {"keep", RT::keep}, {"scaled", RT::scaled}}));
  t.push_back(choice("--freeze-first-phase", "freeze_first_phase", G::freezing, F,
                     "egeria: on (the paper) freezes as soon as a module is found converged; off holds those freezes "
                     "until the LR first falls 10x below its peak, then applies them at once",
                     EG_FIELD(freezing.tracker.freeze_first_phase), kOnOff));
  t.push_back(choice("--freeze-unfreeze", "freeze_unfreeze", G::freezing, F,
                     "egeria: lr (the paper) unfreezes every module when the LR has fallen 10x since the front one "
                     "froze; never keeps what froze frozen to the end, as AutoFreeze",
                     EG_FIELD(freezing.tracker.unfreeze_on_lr_fall), Names<bool>{{"lr", true}, {"never", false}}));
  t.push_back(
      choice("--freeze-last-phase", "freeze_last_phase", G::freezing, F,
             "egeria: on (the paper) freezes in every LR phase; off trains the schedule's last phase (LR within "
             "10x of its final value) whole, unfreezing what is frozen when it begins",
             EG_FIELD(freezing.tracker.freeze_last_phase), kOnOff));
}

// Egeria's reference model (quant/reference.h, freeze/controller.h).
void add_reference_options(std::vector<Option>& t) {
  using G = OptionGroup;
  const OnResume F = OnResume::fixed;
  t.push_back(checked(
      text("--freeze-reference", "freeze_reference", G::reference, F,
           "egeria: reference model: int8 or fp32 on spare CPU cores, or fp32-gpu or fp16-gpu on the training GPU",
           EG_FIELD(freezing.reference.precision), "PRECISION"),
      [](const TrainConfig& c) {
    EG_CHECK(member(quant::reference_precisions(), c.freezing.reference.precision),
             "--freeze-reference must be one of ", joined(quant::reference_precisions()), ", got '",
             c.freezing.reference.precision, "'");
      }));
  t.push_back(number("--freeze-reference-calibration", "freeze_reference_calibration", G::reference, F,
                     "egeria, int8 reference: calibrate each convolution's input scale on this many batches after "
                     "every refresh of the reference, then keep it (static quantisation, the paper); 0: every batch "
                     "its own scales (dynamic)",
                     EG_FIELD(freezing.reference.calibration_batches),
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, ">= 0 batches (0: every batch its own scales)"}));
  t.push_back(choice("--freeze-reference-scope", "freeze_reference_scope", G::reference, F,
                     "egeria: what the reference runs for an evaluation: only the front unit, on the training model's "
                     "input to it (unit: its cost does not grow with the depth of the front), or the network from the "
                     "images through the front unit (network, the paper); Transformers always run network",
                     EG_FIELD(freezing.reference_scope),
                     Names<ReferenceScope>{{"unit", ReferenceScope::unit}, {"network", ReferenceScope::network}}));
  t.push_back(choice(
      "--freeze-reference-bn", "freeze_reference_bn", G::reference, F,
      "egeria: the reference's batch norms normalise with the snapshot's running statistics, folded "
      "(running, the paper) or with each batch's own, as the training front does (batch: a reading "
      "measures the weights' change alone)",
      EG_FIELD(freezing.reference.bn),
      Names<quant::ReferenceBn>{{"running", quant::ReferenceBn::running}, {"batch", quant::ReferenceBn::batch}}));
  {
    Option o = row("--freeze-reference-max-load", "freeze_reference_max_load", G::reference, F,
                   "egeria: run the reference forward only while the machine's CPU load is at most this percentage "
                   "(auto: 50 when training on a GPU with --freeze-apply arrival, as the paper; else 100, never "
                   "waiting)",
                   "auto|PERCENT");
    o.get = [](const TrainConfig& c) {
      return c.freezing.reference_max_load == 0 ? json("auto") : json(c.freezing.reference_max_load);
    };
    o.set = [](TrainConfig& c, const json& j) {
      if (j == "auto") return void(c.freezing.reference_max_load = 0);
      double v = -1;
      try {
        v = to_number<double>("--freeze-reference-max-load", j);
      } catch (const Error&) {
      }
      EG_CHECK(v > 0 && v <= 100, "--freeze-reference-max-load must be auto or a percentage of the machine's CPU, a ",
               "number in (0, 100] without %, got ", j.is_string() ? "'" + j.get<std::string>() + "'" : j.dump());
      c.freezing.reference_max_load = v;
    };
    o.check = [](const TrainConfig& c) {
      const double v = c.freezing.reference_max_load;
      EG_CHECK(v == 0 || (v > 0 && v <= 100),
               "--freeze-reference-max-load must be auto or a percentage of the machine's CPU, a number in (0, 100] "
               "without %, got ",
               v);
    };
    t.push_back(o);
  }
}

}  // namespace

void add_freezing_options(std::vector<Option>& t) {
  using G = OptionGroup;
  const OnResume F = OnResume::fixed, Free = OnResume::free;
  // ---- freezing
  t.push_back(
      checked(text("--freeze", "freeze", G::freezing, F, "layer freezing policy", EG_FIELD(freezing.policy), "POLICY"),
              [](const TrainConfig& c) {
    EG_CHECK(member(freeze::policy_names(), c.freezing.policy), "--freeze: unknown policy '", c.freezing.policy,
             "' (known: ", joined(freeze::policy_names()), ")");
      }));
  t.push_back(choice("--freeze-modules", "freeze_modules", G::freezing, F,
                     "freezing units: auto (the paper's: stages, large ones split) or layers (every layer module)",
                     EG_FIELD(freezing.units),
                     Names<FreezeUnits>{{"auto", FreezeUnits::automatic}, {"layers", FreezeUnits::layers}}));
  t.push_back(text("--freeze-module-regex", "freeze_module_regex", G::freezing, F,
                   "freezing units by parameter name: parameters whose match of this regex (its first group, if any) "
                   "is the same form one unit, e.g. '^(layer[0-9]+)\\.'",
                   EG_FIELD(freezing.unit_regex), "REGEX"));
  add_egeria_decision_options(t);
  t.push_back(
      choice("--freeze-bn", "freeze_bn", G::freezing, F,
             "frozen BatchNorms keep batch statistics as in training (batch: as PyTorch's requires_grad_(False)) "
             "or normalise with their running statistics (running: a fixed function, as the activation cache "
             "needs)",
             EG_FIELD(freezing.bn), Names<FrozenBn>{{"batch", FrozenBn::batch}, {"running", FrozenBn::running}}));
  {
    Option o = row("--freeze-bn-settle", "freeze_bn_settle", G::freezing, F,
                   "with --freeze-bn running: steps a newly frozen unit's BatchNorms keep normalising with each "
                   "batch's statistics while their running statistics become those batches' average at the frozen "
                   "weights (the activation cache stores from then on): auto (" +
                       std::to_string(freeze::kBnSettleAutoSteps) +
                       "), a number, or 0 (running statistics from the freeze, as their exponential average holds "
                       "them)",
                   "auto|N");
    o.get = [](const TrainConfig& c) { return c.freezing.bn_settle < 0 ? json("auto") : json(c.freezing.bn_settle); };
    o.set = [](TrainConfig& c, const json& j) {
      if (j == "auto" || j == -1) return void(c.freezing.bn_settle = -1);
      int64_t v = -1;
      try {
        v = to_number<int64_t>("--freeze-bn-settle", j);
      } catch (const Error&) {
      }
      EG_CHECK(v >= 0, "--freeze-bn-settle must be auto or a non-negative number of steps, got ",
               j.is_string() ? "'" + j.get<std::string>() + "'" : j.dump());
      c.freezing.bn_settle = v;
    };
    o.check = [](const TrainConfig& c) {
      EG_CHECK(c.freezing.bn_settle >= -1, "--freeze-bn-settle must be auto or a non-negative number of steps, got ",
               c.freezing.bn_settle);
    };
    t.push_back(o);
  }
  t.push_back(flag_switch("--freeze-sync", "freeze_sync", G::freezing, F,
                          "egeria: evaluate plasticity inline (deterministic, slower)",
                          EG_FIELD(freezing.reference.synchronous)));
  t.push_back(choice("--freeze-apply", "freeze_apply", G::freezing, F,
                     "egeria: act on a background evaluation's result at the next evaluation step, waiting for it if "
                     "late (next: the same run makes the same decisions), or as soon as it arrives (arrival: never "
                     "waits, as the paper; decisions then depend on timing)",
                     EG_FIELD(freezing.apply_on_arrival), Names<bool>{{"next", false}, {"arrival", true}}));
  t.push_back(number("--freeze-threads", "freeze_threads", G::freezing, F, "egeria: threads of each background thread",
                     EG_FIELD(freezing.reference.threads), Rule<int>{[](int v) { return v >= 1; }, "at least 1"}));
  t.push_back(number("--static-modules", "static_modules", G::freezing, F,
                     "static: number of front units to freeze (-1: half)", EG_FIELD(freezing.static_modules)));
  t.push_back(checked(number_list("--static-units", "static_units", G::freezing, F,
                                  "static: these units freeze instead of a front (0 is the first; any set, e.g. 0,2,5: "
                                  "a unit behind a trainable one skips its weight gradients and update)",
                                  EG_FIELD(freezing.static_units), "U1,U2,..."),
                      [](const TrainConfig& c) {
    EG_CHECK(c.freezing.static_units.empty() || c.freezing.static_modules < 0,
             "--static-units and --static-modules both say what static freezes: give one");
    for (int64_t u : c.freezing.static_units) EG_CHECK(u >= 0, "--static-units: unit ", u, " is negative");
  }));
  t.push_back(number("--static-epoch", "static_epoch", G::freezing, F, "static: epoch at which they freeze (-1: half)",
                     EG_FIELD(freezing.static_epoch)));
  t.push_back(number("--freezeout-t0", "freezeout_t0", G::freezing, F,
                     "freezeout: fraction of training when the first unit freezes", EG_FIELD(freezing.freezeout_t0),
                     Rule<double>{[](double v) { return v > 0 && v <= 1; }, "in (0, 1]"}));
  t.push_back(number("--autofreeze-percentile", "autofreeze_percentile", G::freezing, F,
                     "autofreeze: gradient-change percentile", EG_FIELD(freezing.autofreeze_percentile),
                     Rule<double>{[](double v) { return v >= 0 && v <= 100; }, "in [0, 100]"}));
  add_smartfrz_options(t);
  add_reference_options(t);
  // ---- activation cache
  t.push_back(choice("--freeze-cache", "freeze_cache", G::cache, F,
                     "on: keep the frozen prefix's output per sample and skip its forward when the sample comes again "
                     "(the paper's activation cache; needs --freeze-bn running and --augment-mode sample)",
                     EG_FIELD(freezing.cache), kOnOff));
  t.push_back(text("--freeze-cache-dir", "freeze_cache_dir", G::cache, Free,
                   "keep the activation cache in a file in this directory (deleted when the run ends); by default it "
                   "is kept in memory when it takes at most half the available memory, else in a file in --out",
                   EG_FIELD(freezing.cache_dir), "DIR"));
}

}  // namespace eg::train::rows
