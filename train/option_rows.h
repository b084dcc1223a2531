// The builders of the option table's rows (train/options.cpp): a number, a text, one of
// a few names, a list of numbers, a switch; each row's own rule and recipe defaults.
// Each builder names the flag in the errors of the values it reads.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "train/config.h"

// Where a row's value lives in a TrainConfig, when it is not a member of its own (a
// member pointer, &TrainConfig::epochs, says that): a field of a member, for const and
// non-const configurations alike, as EG_FIELD(freezing.tracker.window).
#define EG_FIELD(path) \
  [](auto& c) -> auto& { return c.path; }

namespace eg::train::rows {

using json = nlohmann::json;

// The value a field (a member pointer or EG_FIELD) reaches in c, and its type.
template <class F, class C>
decltype(auto) at(const F& field, C& c) {
  return std::invoke(field, c);
}
template <class F>
using FieldType = std::decay_t<std::invoke_result_t<F, TrainConfig&>>;

// A number from JSON, or from the command line's text (a JSON string).
template <class T>
T to_number(const std::string& flag, const json& j) {
  if (j.is_number()) {
    if constexpr (std::is_integral_v<T>)
      EG_CHECK(j.is_number_integer() || j.is_number_unsigned(), flag, " must be a whole number, got ", j.dump());
    if constexpr (std::is_unsigned_v<T>)
      EG_CHECK(!(j.is_number_integer() && j.get<int64_t>() < 0), flag, " must be a non-negative whole number, got ",
               j.dump());
    return j.get<T>();
  }
  EG_CHECK(j.is_string(), flag, " must be a number, got ", j.dump());
  const std::string s = j.get<std::string>();
  size_t used = 0;
  T v{};
  try {
    if constexpr (std::is_floating_point_v<T>) {
      v = T(std::stod(s, &used));
    } else if constexpr (std::is_unsigned_v<T>) {
      EG_CHECK(s.find('-') == std::string::npos, flag, " must be a non-negative whole number, got '", s, "'");
      v = T(std::stoull(s, &used));
    } else {
      v = T(std::stoll(s, &used));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception&) {
    used = 0;
  }
  EG_CHECK(used == s.size() && !s.empty(), flag, " must be ",
           std::is_floating_point_v<T> ? "a number" : "a whole number", ", got '", s, "'");
  if constexpr (std::is_floating_point_v<T>)
    EG_CHECK(std::isfinite(v), flag, " must be a finite number, got '", s, "'");
  return v;
}

template <class E>
using Names = std::vector<std::pair<std::string, E>>;

template <class E>
std::string names_text(const Names<E>& names, const char* sep) {
  std::string t;
  for (auto& [n, v] : names) {
    bool alias = false;  // a later name for a value already listed (multistep for step)
    for (auto& [m, w] : names) {
      if (&m == &n) break;
      alias |= w == v;
    }
    if (!alias) t += (t.empty() ? "" : sep) + n;
  }
  return t;
}

inline Option row(const char* flag, const char* key, OptionGroup g, OnResume r, std::string help,
                  std::string value_text) {
  Option o;
  o.flag = flag, o.key = key, o.group = g, o.on_resume = r, o.help = std::move(help),
  o.value_text = std::move(value_text);
  return o;
}

// A number's own rule: `ok` holds for the values it accepts, and `says` ends the
// sentence "FLAG must be ..." that names the others.
template <class T>
struct Rule {
  bool (*ok)(T) = nullptr;
  const char* says = "";
};

template <class F, class T = FieldType<F>>
Option number(const char* flag, const char* key, OptionGroup g, OnResume r, std::string help, F m, Rule<T> rule = {}) {
  Option o = row(flag, key, g, r, std::move(help), std::is_floating_point_v<T> ? "X" : "N");
  o.get = [m](const TrainConfig& c) { return json(at(m, c)); };
  o.set = [m, f = std::string(flag)](TrainConfig& c, const json& j) { at(m, c) = to_number<T>(f, j); };
  if (rule.ok)
    o.check = [m, rule, f = std::string(flag)](const TrainConfig& c) {
      EG_CHECK(rule.ok(at(m, c)), f, " must be ", rule.says, ", got ", at(m, c));
    };
  return o;
}

// A row with a rule of its own beyond a number's range (a known name, several values).
inline Option checked(Option o, std::function<void(const TrainConfig&)> check) {
  o.check = std::move(check);
  return o;
}

// A row with defaults of its own under the other recipes (Note [Model-dependent defaults]).
inline Option recipe(Option o, std::function<void(TrainConfig&, int world_size)> defaults) {
  o.recipe_default = std::move(defaults);
  return o;
}

// The global batch, which the image-folder recipes scale the LR by (Goyal et al.).
inline double global_batch(const TrainConfig& c, int world_size) {
  return double(c.batch_size) * double(std::max(world_size, 1));
}

inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

inline bool member(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

template <class F>
Option text(const char* flag, const char* key, OptionGroup g, OnResume r, std::string help, F m,
            std::string value_text = "TEXT") {
  Option o = row(flag, key, g, r, std::move(help), std::move(value_text));
  o.get = [m](const TrainConfig& c) { return json(at(m, c)); };
  o.set = [m, f = std::string(flag)](TrainConfig& c, const json& j) {
    EG_CHECK(j.is_string(), f, " must be text, got ", j.dump());
    at(m, c) = j.get<std::string>();
  };
  return o;
}

// One of a few names (an enum, or on/off for a bool).
template <class F, class E>
Option choice(const char* flag, const char* key, OptionGroup g, OnResume r, std::string help, F m, Names<E> names) {
  static_assert(std::is_same_v<FieldType<F>, E>, "a choice's names are of its field's type");
  Option o = row(flag, key, g, r, std::move(help), names_text(names, "|"));
  o.get = [m, names](const TrainConfig& c) {
    for (auto& [n, v] : names)
      if (v == at(m, c)) return json(n);
    return json(nullptr);
  };
  o.set = [m, names, f = std::string(flag)](TrainConfig& c, const json& j) {
    if constexpr (std::is_same_v<E, bool>)
      if (j.is_boolean()) return void(at(m, c) = j.get<bool>());
    static const TrainConfig defaults;
    if (j.is_null()) return void(at(m, c) = at(m, defaults));  // a value no name shows (--cpu-winograd unset)
    if (j.is_string())
      for (auto& [n, v] : names)
        if (n == j.get<std::string>()) return void(at(m, c) = v);
    EG_THROW(f, " must be ", names_text(names, " or "), ", got ",
             j.is_string() ? "'" + j.get<std::string>() + "'" : j.dump());
  };
  return o;
}

inline const Names<bool> kOnOff = {{"on", true}, {"off", false}};

// Numbers separated by commas (a JSON array in config.json).
template <class F>
Option number_list(const char* flag, const char* key, OptionGroup g, OnResume r, std::string help, F m,
                   std::string value_text = "X1,X2,...") {
  using T = typename FieldType<F>::value_type;
  Option o = row(flag, key, g, r, std::move(help), std::move(value_text));
  o.get = [m](const TrainConfig& c) { return json(at(m, c)); };
  o.set = [m, f = std::string(flag)](TrainConfig& c, const json& j) {
    std::vector<T> v;
    if (j.is_array()) {
      for (auto& e : j) v.push_back(to_number<T>(f, e));
    } else {
      EG_CHECK(j.is_string(), f, " must be numbers separated by commas, got ", j.dump());
      const std::string s = j.get<std::string>();
      for (size_t b = 0; b <= s.size();) {
        const size_t e = std::min(s.find(',', b), s.size());
        v.push_back(to_number<T>(f, json(s.substr(b, e - b))));
        b = e + 1;
      }
    }
    at(m, c) = std::move(v);
  };
  return o;
}

// Names separated by commas (a JSON array in config.json); "" is none.
template <class F>
Option text_list(const char* flag, const char* key, OptionGroup g, OnResume r, std::string help, F m,
                 std::string value_text = "A,B,...") {
  Option o = row(flag, key, g, r, std::move(help), std::move(value_text));
  o.get = [m](const TrainConfig& c) { return json(at(m, c)); };
  o.set = [m, f = std::string(flag)](TrainConfig& c, const json& j) {
    std::vector<std::string> v;
    if (j.is_array()) {
      for (auto& e : j) {
        EG_CHECK(e.is_string(), f, " must be names, got ", e.dump());
        v.push_back(e.get<std::string>());
      }
    } else {
      EG_CHECK(j.is_string(), f, " must be names separated by commas, got ", j.dump());
      const std::string s = j.get<std::string>();
      for (size_t b = 0; b < s.size();) {
        const size_t e = std::min(s.find(',', b), s.size());
        EG_CHECK(e > b, f, " has an empty name in '", s, "'");
        v.push_back(s.substr(b, e - b));
        b = e + 1;
      }
    }
    at(m, c) = std::move(v);
  };
  return o;
}

// A flag without a value: giving it sets the field to `when_given`.
template <class F>
Option flag_switch(const char* flag, const char* key, OptionGroup g, OnResume r, std::string help, F m,
                   bool when_given = true) {
  static_assert(std::is_same_v<FieldType<F>, bool>, "a switch sets a bool");
  Option o = row(flag, key, g, r, std::move(help), "");
  o.is_switch = true;
  o.get = [m](const TrainConfig& c) { return json(at(m, c)); };
  o.set = [m, when_given, f = std::string(flag)](TrainConfig& c, const json& j) {
    if (j.is_boolean()) return void(at(m, c) = j.get<bool>());
    EG_CHECK(j.is_string() && j.get<std::string>().empty(), f, " takes no value");
    at(m, c) = when_given;
  };
  return o;
}

// The freezing, reference-model and activation-cache rows (train/options_freezing.cpp),
// appended to `t` in the table's order.
void add_freezing_options(std::vector<Option>& t);

}  // namespace eg::train::rows
