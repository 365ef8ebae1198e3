// Argument checks whose messages are built without iostreams.
//
// TORCH_CHECK(cond, "x ", n) formats its message with std::ostringstream, instantiated in this
// extension. With torch 2.11 and g++ 13 a failing check was seen to crash inside the stream's
// number formatting (a locale facet call landed in codecvt) instead of raising, so every
// bad-argument path was a segfault there. std::to_string formats through snprintf, and a single
// std::string message goes to torch's own library untouched.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdio>

#include <string>
#include <type_traits>

namespace strand {

inline std::string text(const std::string& s) { return s; }
inline std::string text(const char* s) { return s; }
inline std::string text(c10::ScalarType t) { return c10::toString(t); }

template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
std::string text(T v) { return std::to_string(v); }

// Shortest round-trip form (as a stream prints 0.5, not to_string's 0.500000).
template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
std::string text(T v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  return buf;
}

// As a stream prints sizes: [2, 3, 4].
inline std::string text(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

template <typename... Args>
std::string message(const Args&... args) {
  return (std::string() + ... + text(args));
}

}  // namespace strand

#define STRAND_CHECK(cond, ...) TORCH_CHECK(cond, ::strand::message(__VA_ARGS__))
#define STRAND_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, ::strand::message(__VA_ARGS__))
