// The freezing policies behind FreezePolicy (freeze/policy.h), a file each:
// freeze/policy_static.cpp, policy_freezeout.cpp, policy_autofreeze.cpp,
// policy_egeria.cpp, policy_smartfrz.cpp. make_policy() finds them by name in its table (freeze/policy.cpp);
// a new policy is its file, a row of that table, and its options' rows in the option
// table (train/options_freezing.cpp).
#pragma once
#include <cstdint>
#include <memory>

#include "freeze/policy.h"

namespace eg::freeze {

// Each takes the run's configuration, its partition set, and its number of units.
std::unique_ptr<FreezePolicy> make_static_policy(const PolicyConfig& c, int64_t units);
std::unique_ptr<FreezePolicy> make_freezeout_policy(const PolicyConfig& c, int64_t units);
std::unique_ptr<FreezePolicy> make_autofreeze_policy(const PolicyConfig& c, int64_t units);
std::unique_ptr<FreezePolicy> make_egeria_policy(const PolicyConfig& c, int64_t units);
std::unique_ptr<FreezePolicy> make_smartfrz_policy(const PolicyConfig& c, int64_t units);

}  // namespace eg::freeze
