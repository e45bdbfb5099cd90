// Errors of kcpbench. Every failure is an exception of one of these classes; only app/main.cpp
// turns them into exit codes (docs/design.md section 8):
//   ConfigError    -> 2  bad command line, row file or API misuse that the user must fix
//   RefusedError   -> 2  a backend refused a phase's arguments (a ConfigError; an injected package
//                        mismatch turns it into a "refused" entry instead, core/kcp/row_runner.cpp)
//   ApiError       -> 3  a failed CUDA / NCCL / MPI / I/O call
//   InvariantError -> 3  an internal bug
//   ContractError  -> 4  a determinism or bitwise contract broken (det reruns, full vs light)
//   DeadlineError  -> 5  a per-row deadline passed (hang)
// Every message carries the rank prefix ("[r3/8 host]") and the call site.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kcp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  virtual int exit_code() const = 0;
};

#define KCP_DECLARE_ERROR(Name, code)                       \
  class Name : public Error {                               \
   public:                                                  \
    explicit Name(const std::string& what) : Error(what) {} \
    int exit_code() const override { return code; }         \
  }

KCP_DECLARE_ERROR(ConfigError, 2);
KCP_DECLARE_ERROR(ApiError, 3);
KCP_DECLARE_ERROR(InvariantError, 3);
KCP_DECLARE_ERROR(ContractError, 4);
KCP_DECLARE_ERROR(DeadlineError, 5);
#undef KCP_DECLARE_ERROR

class RefusedError : public ConfigError {
 public:
  explicit RefusedError(const std::string& what) : ConfigError(what) {}
};

// "[r3/8 host dev1]" for the calling thread's rank (set by the launcher of each rank).
std::string rank_prefix();
void set_thread_rank(int rank, int world, int device = -1);
int thread_rank();

// Strips the source-tree prefix so messages say "core/plan/segment_plan.cpp:42".
const char* short_path(const char* file);

[[noreturn]] void raise_api_error(const char* kind, const char* expr, long code, const std::string& detail,
                                  const char* file, int line);

namespace detail {
template <class E>
[[noreturn]] void raise(const char* file, int line, const std::string& msg) {
  throw E(fmt::format("{} {} (at {}:{})", rank_prefix(), msg, short_path(file), line));
}
}  // namespace detail

}  // namespace kcp

// Precondition on user input: throws ConfigError with the formatted values.
#define KCP_REQUIRE(cond, ...)                                                                           \
  do {                                                                                                   \
    if (!(cond)) ::kcp::detail::raise<::kcp::ConfigError>(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
// Internal invariant: throws InvariantError.
#define KCP_CHECK(cond, ...)                                                                          \
  do {                                                                                                \
    if (!(cond))                                                                                      \
      ::kcp::detail::raise<::kcp::InvariantError>(                                                    \
          __FILE__, __LINE__, fmt::format("check '{}' failed: {}", #cond, fmt::format(__VA_ARGS__))); \
  } while (0)
#define KCP_THROW(Kind, ...) ::kcp::detail::raise<::kcp::Kind>(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
