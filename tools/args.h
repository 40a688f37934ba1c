// Command-line flags of the sparge tool: "-name=value" tokens, read with typed getters that check
// the range and name the flag and the value in every error. Unknown or unread flags are an error
// (finish()), so a typo never silently runs the default.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

namespace sparge::tool {

// Bad command line: the tool prints the message and exits with code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  // Parses argv[first..argc) for the command `command` (used in messages).
  Args(std::string command, int argc, char** argv, int first);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const std::string& command() const { return command_; }

  std::int64_t get_int(const std::string& name, std::int64_t def, std::int64_t lo, std::int64_t hi);
  std::uint64_t get_u64(const std::string& name, std::uint64_t def);
  // A finite float in [lo, hi], or (lo, hi] when lo_open.
  double get_float(const std::string& name, double def, double lo, double hi, bool lo_open = false);
  std::optional<double> get_optional_float(const std::string& name, double lo, double hi, bool lo_open = false);
  bool get_bool(const std::string& name, bool def);
  std::string get_choice(const std::string& name, const std::string& def,
                         std::initializer_list<const char*> choices);

  // Throws UsageError naming the first flag that no getter read.
  void finish() const;

 private:
  [[noreturn]] void fail(const std::string& name, const std::string& why) const;
  const std::string* raw(const std::string& name);

  std::string command_;
  std::map<std::string, std::string> values_;
  std::set<std::string> read_;
};

}  // namespace sparge::tool
