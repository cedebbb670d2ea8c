// pagedattn::Error and the checks that raise it.
//
// Everything a request or a caller can get wrong raises pagedattn::Error with a message that starts
// with the operation's name and names the argument at fault. PA_ASSERT is only for internal
// invariants (a bug in pagedattn, never bad input).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace pagedattn {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request that the engine refuses at its door (Engine::validate, before anything is queued): the
// request field at fault (OpenAI's "param": prompt, n, max_tokens, stop, ...) and a reason code
// (invalid_value, context_length_exceeded). The server answers it with a 400.
class RequestError : public Error {
 public:
  RequestError(std::string param, std::string code, const std::string& message)
      : Error(message), param_(std::move(param)), code_(std::move(code)) {}
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  std::string param_, code_;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws Error with the parts of the message concatenated: fail("paged_attention: kv_len[", b, "] ...").
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

}  // namespace pagedattn

// PA_CHECK(cond, parts...): throw pagedattn::Error(parts...) unless cond holds.
#define PA_CHECK(cond, ...)                  \
  do {                                       \
    if (!(cond)) ::pagedattn::fail(__VA_ARGS__); \
  } while (0)

// PA_ASSERT(cond): an internal invariant; a failure is a bug in pagedattn.
#define PA_ASSERT(cond)                                                                    \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ::pagedattn::fail("internal error: ", #cond, " failed at ", __FILE__, ":", __LINE__); \
  } while (0)
