// RoPE frequencies with Hugging Face's rope_scaling types, by the formulas of
// transformers' modeling_rope_utils.py (ROPE_INIT_FUNCTIONS), in double.
#include "attn/rope_scaling.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>
#include <vector>

#include "attn/error.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("rope_scaling: " + msg); }

// 'key', as the messages quote a key.
std::string quoted(const std::string& key) { return std::string(1, '\'') + key + '\''; }

std::string number_text(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

struct TypeInfo {
  RopeType type;
  const char* name;
  std::vector<std::string> keys;  // besides rope_type, partial_rotary_factor, mrope_section
};

const std::vector<TypeInfo>& types() {
  static const std::vector<TypeInfo> t{
      {RopeType::Default, "default", {}},
      {RopeType::Linear, "linear", {"factor"}},
      {RopeType::Dynamic, "dynamic",
       {"factor", "original_max_position_embeddings", "max_position_embeddings"}},
      {RopeType::Yarn, "yarn",
       {"factor", "original_max_position_embeddings", "max_position_embeddings", "attention_factor",
        "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}},
      {RopeType::LongRope, "longrope",
       {"short_factor", "long_factor", "factor", "original_max_position_embeddings",
        "max_position_embeddings", "attention_factor"}},
      {RopeType::Llama3, "llama3",
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
        "max_position_embeddings"}},
  };
  return t;
}

const TypeInfo& info(RopeType type) {
  for (const TypeInfo& t : types())
    if (t.type == type) return t;
  fail("unknown rope_type " + std::to_string(static_cast<int>(type)));
}

std::string key_list(const TypeInfo& t) {
  std::string list;
  for (const auto& k : t.keys) list += k + ", ";
  return list + "partial_rotary_factor, mrope_section";
}

// The keys set in s, by their Hugging Face names.
std::vector<std::string> set_keys(const RopeScaling& s) {
  std::vector<std::string> keys;
  const auto add = [&](bool set, const char* name) {
    if (set) keys.push_back(name);
  };
  add(s.factor.has_value(), "factor");
  add(s.original_max_position_embeddings.has_value(), "original_max_position_embeddings");
  add(s.max_position_embeddings.has_value(), "max_position_embeddings");
  add(s.attention_factor.has_value(), "attention_factor");
  add(s.beta_fast.has_value(), "beta_fast");
  add(s.beta_slow.has_value(), "beta_slow");
  add(s.mscale.has_value(), "mscale");
  add(s.mscale_all_dim.has_value(), "mscale_all_dim");
  add(!s.truncate, "truncate");
  add(!s.short_factor.empty(), "short_factor");
  add(!s.long_factor.empty(), "long_factor");
  add(s.low_freq_factor.has_value(), "low_freq_factor");
  add(s.high_freq_factor.has_value(), "high_freq_factor");
  return keys;
}

// The values rope_frequencies works with, every derivation done and every
// key checked: what a key of the type needs and cannot derive is an error.
struct Resolved {
  double factor = 1;
  double original = 0;  // the original context length (0 where unused)
  double attention_factor = 1;
};

void check_positive(const std::optional<double>& x, const char* name) {
  if (x && (!std::isfinite(*x) || *x <= 0))
    fail(quoted(name) + " must be a finite number > 0, got " + number_text(*x));
}

Resolved resolve(const RopeScaling& s) {
  const TypeInfo& t = info(s.rope_type);
  for (const std::string& key : set_keys(s))
    if (std::find(t.keys.begin(), t.keys.end(), key) == t.keys.end())
      fail(quoted(key) + " is not a key of rope_type '" + t.name + "' (its keys: " + key_list(t) + ")");
  if (!(s.partial_rotary_factor > 0 && s.partial_rotary_factor <= 1))
    fail("'partial_rotary_factor' must be in (0, 1], got " + number_text(s.partial_rotary_factor));
  for (int64_t section : s.mrope_section)
    if (section < 0) fail("'mrope_section' sizes must be >= 0, got " + std::to_string(section));
  for (const auto& [x, name] : {std::pair{s.factor, "factor"}, {s.attention_factor, "attention_factor"},
                                {s.low_freq_factor, "low_freq_factor"}, {s.high_freq_factor, "high_freq_factor"}})
    check_positive(x, name);
  for (const auto& [x, name] : {std::pair{s.beta_fast, "beta_fast"}, {s.beta_slow, "beta_slow"}})
    if (x && (!std::isfinite(*x) || *x < 0))  // 0 is "unset", as Hugging Face's `or 32`
      fail(quoted(name) + " must be a finite number >= 0, got " + number_text(*x));
  for (const auto& [x, name] : {std::pair{s.mscale, "mscale"}, {s.mscale_all_dim, "mscale_all_dim"}})
    if (x && !std::isfinite(*x)) fail(quoted(name) + " must be finite, got " + number_text(*x));
  for (const auto& [n, name] : {std::pair{s.original_max_position_embeddings, "original_max_position_embeddings"},
                                {s.max_position_embeddings, "max_position_embeddings"}})
    if (n && *n < 1) fail(quoted(name) + " must be >= 1, got " + std::to_string(*n));
  for (const auto& [list, name] : {std::pair{&s.short_factor, "short_factor"}, {&s.long_factor, "long_factor"}})
    for (double x : *list)
      if (!std::isfinite(x) || x <= 0)
        fail(quoted(name) + " values must be finite numbers > 0, got " + number_text(x));

  Resolved r;
  const std::string type = t.name;
  const auto need = [&](const auto& x, const char* key, const char* why) {
    if (!x) fail("rope_type '" + type + "' needs '" + key + "'" + why);
    return *x;
  };
  // Where Hugging Face reads the original context from the config's
  // max_position_embeddings when rope_scaling has none.
  const auto original = [&] {
    const auto o = s.original_max_position_embeddings ? s.original_max_position_embeddings
                                                      : s.max_position_embeddings;
    return double(need(o, "original_max_position_embeddings", " (the context the model was trained with)"));
  };
  // yarn and longrope: factor, or the extended context over the original.
  const auto factor_or_ratio = [&] {
    if (s.factor) return *s.factor;
    if (!s.max_position_embeddings)
      fail("rope_type '" + type + "' needs 'factor' (or 'max_position_embeddings' and "
           "'original_max_position_embeddings', whose ratio it is then)");
    return double(*s.max_position_embeddings) / r.original;
  };
  switch (s.rope_type) {
    case RopeType::Default: break;
    case RopeType::Linear: r.factor = need(s.factor, "factor", ""); break;
    case RopeType::Dynamic:
      r.factor = need(s.factor, "factor", "");
      r.original = original();
      break;
    case RopeType::Yarn: {
      r.original = original();
      r.factor = factor_or_ratio();
      const auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
      if (s.attention_factor) r.attention_factor = *s.attention_factor;
      else if (s.mscale.value_or(0) != 0 && s.mscale_all_dim.value_or(0) != 0)
        r.attention_factor = mscale(r.factor, *s.mscale) / mscale(r.factor, *s.mscale_all_dim);
      else r.attention_factor = mscale(r.factor, 1.0);
      break;
    }
    case RopeType::LongRope:
      if (s.short_factor.empty()) fail("rope_type 'longrope' needs 'short_factor'");
      if (s.long_factor.empty()) fail("rope_type 'longrope' needs 'long_factor'");
      r.original = original();
      r.factor = factor_or_ratio();
      r.attention_factor = s.attention_factor.value_or(
          r.factor <= 1 ? 1.0 : std::sqrt(1 + std::log(r.factor) / std::log(r.original)));
      break;
    case RopeType::Llama3:
      r.factor = need(s.factor, "factor", "");
      need(s.low_freq_factor, "low_freq_factor", "");
      need(s.high_freq_factor, "high_freq_factor", "");
      if (!(*s.high_freq_factor > *s.low_freq_factor))
        fail("'high_freq_factor' (" + number_text(*s.high_freq_factor) +
             ") must be greater than 'low_freq_factor' (" + number_text(*s.low_freq_factor) + ")");
      r.original = original();
      break;
  }
  return r;
}

// JSON value readers, each naming the key.
double json_number(const nlohmann::json& v, const std::string& key) {
  if (!v.is_number()) fail(quoted(key) + " must be a number, got " + v.dump());
  return v.get<double>();
}

int64_t json_integer(const nlohmann::json& v, const std::string& key) {
  const double x = json_number(v, key);
  if (!(std::trunc(x) == x) || std::fabs(x) > 9.0e15) fail(quoted(key) + " must be an integer, got " + v.dump());
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(x);
}

template <class T, class Read>
std::vector<T> json_list(const nlohmann::json& v, const std::string& key, Read read) {
  if (!v.is_array()) fail(quoted(key) + " must be a list, got " + v.dump());
  std::vector<T> out;
  for (const auto& e : v) out.push_back(read(e, key));
  return out;
}

}  // namespace

std::string rope_type_name(RopeType type) { return info(type).name; }

RopeScaling parse_rope_scaling(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail("must be a dict (a JSON object), got " + j.dump());
  // rope_type, or Hugging Face's legacy name for it.
  std::string type_name;
  for (const char* key : {"rope_type", "type"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_string()) fail(quoted(key) + " must be a string, got " + j[key].dump());
    const std::string name = j[key].get<std::string>();
    if (!type_name.empty() && name != type_name)
      fail("'rope_type' is '" + type_name + "' but 'type' is '" + name + "'");
    type_name = name;
  }
  if (type_name.empty()) fail("no 'rope_type' (or legacy 'type') in " + j.dump());
  RopeScaling s;
  const TypeInfo* t = nullptr;
  std::string known;
  for (const TypeInfo& candidate : types()) {
    known += (known.empty() ? "" : ", ") + std::string(candidate.name);
    if (type_name == candidate.name) t = &candidate;
  }
  if (type_name == "mrope") t = &info(RopeType::Default);  // Qwen2-VL's name, as Hugging Face maps it
  if (!t) fail("unknown rope_type '" + type_name + "' (known: " + known + ", and mrope)");
  s.rope_type = t->type;

  for (const auto& [key, v] : j.items()) {
    if (key == "rope_type" || key == "type" || v.is_null()) continue;  // null: not set
    if (key == "partial_rotary_factor") {
      s.partial_rotary_factor = json_number(v, key);
      continue;
    }
    if (key == "mrope_section") {
      s.mrope_section = json_list<int64_t>(v, key, json_integer);
      continue;
    }
    if (std::find(t->keys.begin(), t->keys.end(), key) == t->keys.end())
      fail(quoted(key) + " is not a key of rope_type '" + t->name + "' (its keys: " + key_list(*t) + ")" +
           (key == "rope_theta" ? "; pass the base (rope_theta) as base" : ""));
    if (key == "factor") s.factor = json_number(v, key);
    else if (key == "original_max_position_embeddings") s.original_max_position_embeddings = json_integer(v, key);
    else if (key == "max_position_embeddings") s.max_position_embeddings = json_integer(v, key);
    else if (key == "attention_factor") s.attention_factor = json_number(v, key);
    else if (key == "beta_fast") s.beta_fast = json_number(v, key);
    else if (key == "beta_slow") s.beta_slow = json_number(v, key);
    else if (key == "mscale") s.mscale = json_number(v, key);
    else if (key == "mscale_all_dim") s.mscale_all_dim = json_number(v, key);
    else if (key == "low_freq_factor") s.low_freq_factor = json_number(v, key);
    else if (key == "high_freq_factor") s.high_freq_factor = json_number(v, key);
    else if (key == "short_factor") s.short_factor = json_list<double>(v, key, json_number);
    else if (key == "long_factor") s.long_factor = json_list<double>(v, key, json_number);
    else if (key == "truncate") {
      if (!v.is_boolean()) fail("'truncate' must be true or false, got " + v.dump());
      s.truncate = v.get<bool>();
    }
  }
  resolve(s);
  return s;
}

std::string rope_scaling_json(const RopeScaling& s) {
  nlohmann::ordered_json j;
  j["rope_type"] = rope_type_name(s.rope_type);
  const auto put = [&](const char* key, const auto& x) {
    if (x) j[key] = *x;
  };
  put("factor", s.factor);
  put("original_max_position_embeddings", s.original_max_position_embeddings);
  put("max_position_embeddings", s.max_position_embeddings);
  put("attention_factor", s.attention_factor);
  put("beta_fast", s.beta_fast);
  put("beta_slow", s.beta_slow);
  put("mscale", s.mscale);
  put("mscale_all_dim", s.mscale_all_dim);
  if (!s.truncate) j["truncate"] = false;
  if (!s.short_factor.empty()) j["short_factor"] = s.short_factor;
  if (!s.long_factor.empty()) j["long_factor"] = s.long_factor;
  put("low_freq_factor", s.low_freq_factor);
  put("high_freq_factor", s.high_freq_factor);
  if (s.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = s.partial_rotary_factor;
  if (!s.mrope_section.empty()) j["mrope_section"] = s.mrope_section;
  return j.dump();
}

RopeFrequencies rope_frequencies(int64_t rotary_dim, double base, const RopeScaling& s,
                                 std::optional<int64_t> seq_len) {
  if (!(base > 0) || !std::isfinite(base))
    throw ValueError("rope_frequencies: base must be a finite number > 0, got " + number_text(base));
  if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > kMaxRotaryDim)
    throw ValueError("rope_frequencies: rotary_dim must be even and in [0, " + std::to_string(kMaxRotaryDim) +
                     "] (the rotated features of a head), got " + std::to_string(rotary_dim));
  const Resolved v = resolve(s);
  const int64_t half = rotary_dim / 2;
  const double r = double(rotary_dim);
  RopeFrequencies f;
  f.attention_factor = v.attention_factor;
  f.factor = v.factor;
  f.inv_freq.resize(static_cast<size_t>(half));
  // base^(-2k/r) for this call's base: the default frequencies.
  const auto plain = [&](double b) {
    for (int64_t k = 0; k < half; ++k) f.inv_freq[k] = std::pow(b, -2.0 * double(k) / r);
  };
  const double length = seq_len ? double(*seq_len) : v.original;  // seq_len unset: the original context
  switch (s.rope_type) {
    case RopeType::Default: plain(base); break;
    case RopeType::Linear:
      plain(base);
      for (double& x : f.inv_freq) x /= v.factor;
      break;
    case RopeType::Dynamic: {
      if (half == 1)
        fail("rope_type 'dynamic' needs rotary_dim > 2 (its base grows as a power r / (r - 2)), got 2");
      const double grown = std::max(length, v.original);
      plain(base * std::pow(v.factor * grown / v.original - (v.factor - 1), r / (r - 2)));
      break;
    }
    case RopeType::Yarn: {
      if (base == 1) fail("rope_type 'yarn' needs a base other than 1 (its ramp divides by log(base))");
      // The pair index where a frequency turns `rotations` times over the
      // original context.
      const auto correction = [&](double rotations) {
        return r * std::log(v.original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
      };
      const double beta_fast = s.beta_fast.value_or(0) != 0 ? *s.beta_fast : 32.0;
      const double beta_slow = s.beta_slow.value_or(0) != 0 ? *s.beta_slow : 1.0;
      double low = correction(beta_fast), high = correction(beta_slow);
      if (s.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0);
      high = std::min(high, r - 1);
      if (low == high) high += 0.001;  // as Hugging Face: no division by 0
      for (int64_t k = 0; k < half; ++k) {
        const double extrapolation = std::pow(base, -2.0 * double(k) / r);
        const double interpolation = extrapolation / v.factor;
        const double ramp = std::clamp((double(k) - low) / (high - low), 0.0, 1.0);
        f.inv_freq[k] = interpolation * ramp + extrapolation * (1 - ramp);
      }
      break;
    }
    case RopeType::LongRope: {
      for (const auto* list : {&s.short_factor, &s.long_factor})
        if (static_cast<int64_t>(list->size()) != half)
          fail(quoted(list == &s.short_factor ? "short_factor" : "long_factor") + " has " +
               std::to_string(list->size()) + " values, expected one per pair: rotary_dim / 2 = " +
               std::to_string(half));
      const auto& ext = seq_len && double(*seq_len) > v.original ? s.long_factor : s.short_factor;
      for (int64_t k = 0; k < half; ++k) f.inv_freq[k] = 1.0 / (ext[k] * std::pow(base, 2.0 * double(k) / r));
      break;
    }
    case RopeType::Llama3: {
      const double low_wavelen = v.original / *s.low_freq_factor;
      const double high_wavelen = v.original / *s.high_freq_factor;
      for (int64_t k = 0; k < half; ++k) {
        const double inv = std::pow(base, -2.0 * double(k) / r);
        const double wavelen = 2 * std::numbers::pi / inv;
        if (wavelen < high_wavelen) f.inv_freq[k] = inv;                 // high frequencies: kept
        else if (wavelen > low_wavelen) f.inv_freq[k] = inv / v.factor;  // low ones: interpolated
        else {                                                           // between: a smooth blend
          const double smooth = (v.original / wavelen - *s.low_freq_factor) /
                                (*s.high_freq_factor - *s.low_freq_factor);
          f.inv_freq[k] = (1 - smooth) * inv / v.factor + smooth * inv;
        }
      }
      break;
    }
  }
  for (int64_t k = 0; k < half; ++k)
    if (!std::isfinite(f.inv_freq[k]))
      fail("pair " + std::to_string(k) + "'s frequency comes out as " + number_text(f.inv_freq[k]) +
           " for base " + number_text(base) + " and rope_type '" + rope_type_name(s.rope_type) +
           "': a factor or the base is too extreme");
  return f;
}

}  // namespace attn
