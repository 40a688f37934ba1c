#include "args.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace sparge::tool {

Args::Args(std::string command, int argc, char** argv, int first) : command_(std::move(command)) {
  for (int i = first; i < argc; ++i) {
    std::string tok = argv[i];
    std::string body = tok;
    if (body.rfind("--", 0) == 0) {
      body = body.substr(2);
    } else if (body.rfind('-', 0) == 0) {
      body = body.substr(1);
    } else {
      throw UsageError("sparge " + command_ + ": unexpected argument '" + tok +
                       "' (flags are written -name=value; see sparge help)");
    }
    const auto eq = body.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError("sparge " + command_ + ": flag '" + tok + "' has no value (write -name=value, e.g. -v=1)");
    }
    const std::string name = body.substr(0, eq);
    if (values_.count(name)) throw UsageError("sparge " + command_ + ": flag -" + name + " is given twice");
    values_[name] = body.substr(eq + 1);
  }
}

void Args::fail(const std::string& name, const std::string& why) const {
  const auto it = values_.find(name);
  const std::string value = it == values_.end() ? "" : it->second;
  throw UsageError("sparge " + command_ + ": -" + name + "=" + value + ": " + why);
}

const std::string* Args::raw(const std::string& name) {
  read_.insert(name);
  const auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

std::int64_t Args::get_int(const std::string& name, std::int64_t def, std::int64_t lo, std::int64_t hi) {
  const std::string* s = raw(name);
  if (s == nullptr) return def;
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
  if (s->empty() || ec != std::errc() || end != s->data() + s->size()) fail(name, "not an integer");
  if (v < lo || v > hi) fail(name, "out of range (expected " + std::to_string(lo) + ".." + std::to_string(hi) + ")");
  return v;
}

std::uint64_t Args::get_u64(const std::string& name, std::uint64_t def) {
  const std::string* s = raw(name);
  if (s == nullptr) return def;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
  if (s->empty() || ec != std::errc() || end != s->data() + s->size()) fail(name, "not a non-negative integer");
  return v;
}

std::optional<double> Args::get_optional_float(const std::string& name, double lo, double hi, bool lo_open) {
  const std::string* s = raw(name);
  if (s == nullptr) return std::nullopt;
  char* end = nullptr;
  const double v = s->empty() ? 0.0 : std::strtod(s->c_str(), &end);
  if (s->empty() || end != s->c_str() + s->size() || !std::isfinite(v)) fail(name, "not a finite number");
  const bool below = lo_open ? !(v > lo) : !(v >= lo);
  if (below || v > hi) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "out of range (expected %s%g, %g])", lo_open ? "(" : "[", lo, hi);
    fail(name, buf);
  }
  return v;
}

double Args::get_float(const std::string& name, double def, double lo, double hi, bool lo_open) {
  const auto v = get_optional_float(name, lo, hi, lo_open);
  return v ? *v : def;
}

bool Args::get_bool(const std::string& name, bool def) {
  const std::string* s = raw(name);
  if (s == nullptr) return def;
  if (*s == "1" || *s == "true") return true;
  if (*s == "0" || *s == "false") return false;
  fail(name, "expected 0 or 1");
}

std::string Args::get_choice(const std::string& name, const std::string& def,
                             std::initializer_list<const char*> choices) {
  const std::string* s = raw(name);
  if (s == nullptr) return def;
  std::string list;
  for (const char* c : choices) {
    if (*s == c) return *s;
    list += list.empty() ? "" : "|";
    list += c;
  }
  fail(name, "expected one of " + list);
}

void Args::finish() const {
  for (const auto& [name, value] : values_) {
    if (!read_.count(name)) {
      throw UsageError("sparge " + command_ + ": unknown flag -" + name + "=" + value + " (see sparge help)");
    }
  }
}

}  // namespace sparge::tool
