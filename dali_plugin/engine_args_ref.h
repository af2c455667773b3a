// Engine arguments that hold secrets (S3 credentials given to a reader
// explicitly) kept out of DALI's operator arguments, which
// pipe.serialize() writes out whole: fastread.dali registers the full
// string in this process under a random token
// (fastread_dali_register_engine_args) and gives the operator
// engine_args="fastread_engine_args_ref=<token>"; the operator looks it up
// here when it is built. A serialized pipeline then holds the token, not the
// secret, and loaded in another process it fails naming why.
//
// The table lives for the process (a pipeline may be rebuilt from its
// arguments at any time); its entries are a few hundred bytes each, one per
// reader built with explicit credentials. Thread-safe: one mutex.
#ifndef FASTREAD_DALI_ENGINE_ARGS_REF_H
#define FASTREAD_DALI_ENGINE_ARGS_REF_H

#include <mutex>
#include <string>
#include <unordered_map>

#include <dali/core/error_handling.h>

extern "C" int fastread_dali_register_engine_args(const char *token, const char *args);

namespace fastread_dali {

inline constexpr const char kEngineArgsRef[] = "fastread_engine_args_ref=";

struct EngineArgsTable {
  std::mutex mutex;
  std::unordered_map<std::string, std::string> args;
};

// One table per process: an inline function's static is shared by every
// translation unit of the plugin library.
inline EngineArgsTable &engine_args_table() {
  static EngineArgsTable table;
  return table;
}

// The engine arguments an operator was given, a reference resolved.
inline std::string ResolveEngineArgs(const std::string &given, const char *op_name) {
  const std::string prefix(kEngineArgsRef);
  if (given.compare(0, prefix.size(), prefix) != 0) return given;
  const std::string token = given.substr(prefix.size());
  EngineArgsTable &t = engine_args_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.args.find(token);
  DALI_ENFORCE(it != t.args.end(),
               dali::make_string(op_name, ": engine_args refer to credentials that this "
                                 "process never registered (", given, "): a pipeline "
                                 "serialized with explicit S3 credentials keeps them out of "
                                 "its arguments; give the credentials to the reader again in "
                                 "this process, or through the environment or a profile"));
  return it->second;
}

}  // namespace fastread_dali

#endif  // FASTREAD_DALI_ENGINE_ARGS_REF_H
