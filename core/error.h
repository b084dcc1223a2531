// Errors. Every failure in egeria throws eg::Error with the failed expression,
// file and line, and a message in the user's terms. Nothing calls exit().
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace eg {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... A>
std::string concat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace eg

// EG_CHECK(cond, "message", value, ...): throws eg::Error with the message and where it
// was raised (the condition is not shown: the message says it in the user's terms).
#define EG_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) ::eg::detail::throw_error(__FILE__, __LINE__, ::eg::detail::concat(__VA_ARGS__)); \
  } while (0)

#define EG_THROW(...) ::eg::detail::throw_error(__FILE__, __LINE__, ::eg::detail::concat(__VA_ARGS__))

// One generic check for library status codes; specialised per library as
// EG_CUDA_CHECK, EG_CUDNN_CHECK, EG_CUBLAS_CHECK, EG_NCCL_CHECK (core/cuda_context.h).
#define EG_CHECK_GEN(expr, success, to_string)                                                                 \
  do {                                                                                                         \
    auto eg_status_ = (expr);                                                                                  \
    if (eg_status_ != (success))                                                                               \
      ::eg::detail::throw_error(__FILE__, __LINE__, ::eg::detail::concat(#expr, ": ", to_string(eg_status_))); \
  } while (0)
