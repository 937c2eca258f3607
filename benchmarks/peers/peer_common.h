// What both Ceres peer programs share: a checked BAL reader, a --key=value argument parser,
// a small JSON writer and timing statistics. Header-only so each program is one translation unit.
#ifndef PYCLAD_PEERS_PEER_COMMON_H_
#define PYCLAD_PEERS_PEER_COMMON_H_

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ceres/version.h"

namespace pyclad_peers {

// A usage or input error: main() prints it to stderr and exits with status 2.
struct PeerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- BAL files

struct BalProblem {
  int num_cameras = 0, num_points = 0, num_observations = 0;
  std::vector<int> camera_index, point_index;  // per observation
  std::vector<double> observations;            // 2 per observation (x, y)
  std::vector<double> parameters;              // 9 per camera, then 3 per point

  double* camera(int i) { return &parameters[9 * static_cast<size_t>(i)]; }
  double* point(int j) { return &parameters[9 * static_cast<size_t>(num_cameras) + 3 * static_cast<size_t>(j)]; }
};

inline bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The whole file as text; a .bz2 file goes through `bzip2 -dc` so the peers need no libbz2.
inline std::string ReadText(const std::string& path) {
  FILE* f = nullptr;
  const bool compressed = EndsWith(path, ".bz2");
  if (compressed) {
    if (path.find('\'') != std::string::npos) throw PeerError("--input: a .bz2 path may not contain a quote");
    f = popen(("bzip2 -dc '" + path + "'").c_str(), "r");
  } else {
    f = std::fopen(path.c_str(), "rb");
  }
  if (!f) throw PeerError("--input: cannot open " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const int status = compressed ? pclose(f) : std::fclose(f);
  if (compressed && status != 0)
    throw PeerError("--input: `bzip2 -dc " + path + "` failed (is bzip2 installed? or pass the decompressed file)");
  return text;
}

class Tokens {
 public:
  explicit Tokens(const std::string& text, const std::string& path) : p_(text.c_str()), path_(path) {}
  double Number(const char* what) {
    char* end = nullptr;
    const double v = std::strtod(p_, &end);
    if (end == p_) throw PeerError(path_ + ": expected a number for " + what + " (truncated or malformed BAL file)");
    if (!std::isfinite(v)) throw PeerError(path_ + ": non-finite value for " + what);
    p_ = end;
    return v;
  }
  int Integer(const char* what, long lo, long hi) {
    const double v = Number(what);
    if (v != std::floor(v) || v < lo || v >= hi)
      throw PeerError(path_ + ": " + what + " = " + std::to_string(v) + " is not an integer in [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + ")");
    return static_cast<int>(v);
  }
  bool AtEnd() {
    while (*p_ && std::isspace(static_cast<unsigned char>(*p_))) ++p_;
    return *p_ == '\0';
  }

 private:
  const char* p_;
  std::string path_;
};

// Reads a BAL problem ("num_cameras num_points num_observations", the observations
// "camera point x y", then 9 parameters per camera and 3 per point) and checks every index.
inline BalProblem LoadBal(const std::string& path) {
  const std::string text = ReadText(path);
  Tokens t(text, path);
  BalProblem bal;
  const long kMax = 1L << 30;
  bal.num_cameras = t.Integer("num_cameras", 1, kMax);
  bal.num_points = t.Integer("num_points", 1, kMax);
  bal.num_observations = t.Integer("num_observations", 1, kMax);
  const size_t m = bal.num_observations;
  bal.camera_index.resize(m);
  bal.point_index.resize(m);
  bal.observations.resize(2 * m);
  for (size_t i = 0; i < m; ++i) {
    bal.camera_index[i] = t.Integer("an observation's camera index", 0, bal.num_cameras);
    bal.point_index[i] = t.Integer("an observation's point index", 0, bal.num_points);
    bal.observations[2 * i] = t.Number("an observation's x");
    bal.observations[2 * i + 1] = t.Number("an observation's y");
  }
  bal.parameters.resize(9 * static_cast<size_t>(bal.num_cameras) + 3 * static_cast<size_t>(bal.num_points));
  for (double& v : bal.parameters) v = t.Number("a camera or point parameter");
  if (!t.AtEnd()) throw PeerError(path + ": unexpected text after the last parameter");
  return bal;
}

// ---------------------------------------------------------------- arguments

// --key=value (or --flag, meaning true) arguments; every key must be known to the caller.
class Args {
 public:
  Args(int argc, char** argv, const std::map<std::string, std::string>& defaults) : values_(defaults) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        help_ = true;
        continue;
      }
      if (a.rfind("--", 0) != 0) throw PeerError("unexpected argument '" + a + "' (use --key=value)");
      const size_t eq = a.find('=');
      const std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (!values_.count(key)) throw PeerError("unknown option --" + key + " (see --help)");
      values_[key] = eq == std::string::npos ? "true" : a.substr(eq + 1);
    }
  }
  bool help() const { return help_; }
  const std::string& Str(const std::string& key) const { return values_.at(key); }
  int Int(const std::string& key, int lo, int hi) const {
    char* end = nullptr;
    const long v = std::strtol(Str(key).c_str(), &end, 10);
    if (Str(key).empty() || *end || v < lo || v > hi)
      throw PeerError("--" + key + "=" + Str(key) + ": expected an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
    return static_cast<int>(v);
  }
  double Double(const std::string& key, double lo) const {
    char* end = nullptr;
    const double v = std::strtod(Str(key).c_str(), &end);
    if (Str(key).empty() || *end || !(v >= lo) || !std::isfinite(v))
      throw PeerError("--" + key + "=" + Str(key) + ": expected a finite number >= " + std::to_string(lo));
    return v;
  }
  bool Bool(const std::string& key) const {
    const std::string& v = Str(key);
    if (v == "true" || v == "1") return true;
    if (v == "false" || v == "0") return false;
    throw PeerError("--" + key + "=" + v + ": expected true or false");
  }
  std::string OneOf(const std::string& key, const std::vector<std::string>& allowed) const {
    std::string v = Str(key);
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const auto& a : allowed)
      if (v == a) return v;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    throw PeerError("--" + key + "=" + Str(key) + ": expected one of " + list);
  }

 private:
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

// ---------------------------------------------------------------- JSON output

inline std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// The shortest of %.15g/%.16g/%.17g that reads back as the same double (1e-06, not
// 9.9999999999999995e-07); NaN and infinities (not JSON) become null.
inline std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}
inline std::string JsonNumber(int v) { return std::to_string(v); }
inline std::string JsonNumber(long v) { return std::to_string(v); }
inline std::string JsonBool(bool v) { return v ? "true" : "false"; }

// Builds one JSON object from already-encoded values, keys in insertion order.
class JsonObject {
 public:
  JsonObject& Raw(const std::string& key, const std::string& encoded) {
    items_.emplace_back(key, encoded);
    return *this;
  }
  JsonObject& Str(const std::string& key, const std::string& v) { return Raw(key, JsonString(v)); }
  template <typename T>
  JsonObject& Num(const std::string& key, T v) {
    return Raw(key, JsonNumber(v));
  }
  JsonObject& Bool(const std::string& key, bool v) { return Raw(key, JsonBool(v)); }
  std::string Encode(const std::string& indent = "") const {
    std::string out = "{";
    for (size_t i = 0; i < items_.size(); ++i)
      out += (i ? "," : "") + std::string("\n") + indent + "  " + JsonString(items_[i].first) + ": " +
             items_[i].second;
    return out + "\n" + indent + "}";
  }

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

inline std::string JsonArray(const std::vector<std::string>& encoded) {
  std::string out = "[";
  for (size_t i = 0; i < encoded.size(); ++i) out += (i ? ", " : "") + encoded[i];
  return out + "]";
}

// ---------------------------------------------------------------- timing

inline double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Linear-interpolated quantile, the same definition benchmarks/harness.py uses.
inline double Quantile(std::vector<double> s, double q) {
  std::sort(s.begin(), s.end());
  const double pos = q * (s.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, s.size() - 1);
  return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

// median/q25/q75/min/samples of wall-clock samples, plus per-item throughput.
inline JsonObject TimingJson(const std::vector<double>& samples, long items) {
  std::vector<std::string> enc;
  for (double s : samples) enc.push_back(JsonNumber(s));
  const double median = Quantile(samples, 0.5);
  JsonObject o;
  o.Num("median_s", median)
      .Num("q25_s", Quantile(samples, 0.25))
      .Num("q75_s", Quantile(samples, 0.75))
      .Num("min_s", *std::min_element(samples.begin(), samples.end()))
      .Num("runs", static_cast<int>(samples.size()))
      .Raw("samples_s", JsonArray(enc))
      .Num("obs_per_s", items / median)
      .Num("ns_per_obs", median * 1e9 / items);
  return o;
}

inline const char* CeresVersion() { return CERES_VERSION_STRING; }

}  // namespace pyclad_peers

#endif  // PYCLAD_PEERS_PEER_COMMON_H_
