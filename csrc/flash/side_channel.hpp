// A FlashAttention node as fusion writes it (domain ai.onnx.contrib, the declared attributes and the
// `exact_floats` side channel), read into the native op's call: the C++ twin of the one Python reading,
// ortflash/op/side_channel.py (SideChannel.decode, .resolved), op/spec.py (validate), kernels/config.py
// (KernelConfig.of_side_channel) and kernels/native_op.py (native_attributes). A plain
// onnxruntime.InferenceSession made with ortflash.session_options() runs such nodes natively with it, so
// nothing Python runs per call. tests/test_plain_native.py holds both readings equal on every zoo node.
//
// What Python's str/float/int do is mirrored where the side channel's text meets them: int() and float() take
// surrounding whitespace, a sign and single underscores between digits, float() also inf/infinity/nan in any
// case, and a float item counts where it equals the attribute or agrees with it to 6 significant digits
// (f"{x:.6g}", which rounds as C's %.6g does). Only ASCII whitespace and digits are taken (Python also takes
// other Unicode ones: such text is garbled here, where Python would read it).
// Part of csrc/flash_attention.hpp (one translation unit per ISA build).
#pragma once

#include <sched.h>

#include <cctype>
#include <cerrno>
#include <string>
#include <string_view>

#include "call.hpp"

namespace {

// op/spec.py ATTRIBUTES, in its order.
enum BridgeName {
    A_SCALE,
    A_IS_CAUSAL,
    A_SOFTMAX,
    A_BLOCK_SIZE,
    A_MIN_SEQ_LEN,
    A_MASK_FILL,
    A_MASKED_ROWS,
    A_SOFTCAP,
    A_EXACT_FLOATS,
    A_BIAS_AFTER_MASK,
    A_WINDOW_LEFT,
    A_WINDOW_RIGHT,
    A_COUNT
};
constexpr const char* BRIDGE_NAMES[A_COUNT] = {"scale",       "is_causal",   "softmax",     "block_size",
                                               "min_seq_len", "mask_fill",   "masked_rows", "softcap",
                                               "exact_floats", "bias_after_mask", "window_left", "window_right"};

struct BridgeAttribute {  // one attribute as the node holds it
    enum Kind { ABSENT, FLOAT, INT, TEXT } kind = ABSENT;
    double number = 0;
    int64_t integer = 0;
    std::string text;
};

struct BridgeNode {
    BridgeAttribute attr[A_COUNT];
};

// native_op.native_attributes' values, and the side channel's kernel choice.
struct BridgeCall {
    CallOptions options;
    int softmax = 0;  // index in SOFTMAX_MODES
    int64_t min_seq_len = 0;
    int min_query_tile = 6;
    std::string backend = "cpu";
};

constexpr const char* SOFTMAX_MODES[] = {"naive", "online", "auto"};
constexpr const char* MASKED_ROWS[] = {"nan", "zero"};
// ortflash.kernels.cpu.QUERY_TILE and MIN_QUERY_TILE (the test compares them)
constexpr int BRIDGE_QUERY_TILE = 64;
constexpr int BRIDGE_MIN_QUERY_TILE = 6;

// ---- Python's str.strip, int() and float() on ASCII text ----

inline bool py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

inline std::string_view py_strip(std::string_view s) {
    while (!s.empty() && py_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && py_space(s.back())) s.remove_suffix(1);
    return s;
}

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Digits with single underscores between them from s[*at] on, appended to out without the underscores;
// false if none or an underscore is not between two digits.
inline bool digit_part(std::string_view s, size_t* at, std::string* out) {
    size_t i = *at;
    if (i >= s.size() || !is_digit(s[i])) return false;
    while (i < s.size()) {
        if (is_digit(s[i])) {
            out->push_back(s[i++]);
        } else if (s[i] == '_' && i + 1 < s.size() && is_digit(s[i + 1])) {
            ++i;
        } else {
            break;
        }
    }
    *at = i;
    return true;
}

// int(text): false where Python raises ValueError (or the value is outside int64).
inline bool py_int(std::string_view text, int64_t* out) {
    const std::string_view s = py_strip(text);
    size_t i = 0;
    std::string digits;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) digits.push_back(s[i++]);
    if (!digit_part(s, &i, &digits) || i != s.size()) return false;
    errno = 0;
    char* end = nullptr;
    const long long value = std::strtoll(digits.c_str(), &end, 10);
    if (errno == ERANGE) return false;
    *out = value;
    return true;
}

inline bool equals_ignoring_case(std::string_view s, const char* word) {
    size_t n = std::strlen(word);
    if (s.size() != n) return false;
    for (size_t i = 0; i < n; ++i)
        if (std::tolower(static_cast<unsigned char>(s[i])) != word[i]) return false;
    return true;
}

// float(text): false where Python raises ValueError.
inline bool py_float(std::string_view text, double* out) {
    const std::string_view s = py_strip(text);
    size_t i = 0;
    std::string clean;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean.push_back(s[i++]);
    const std::string_view word = s.substr(i);
    if (equals_ignoring_case(word, "inf") || equals_ignoring_case(word, "infinity")) {
        *out = clean == "-" ? -INFINITY : INFINITY;
        return true;
    }
    if (equals_ignoring_case(word, "nan")) {
        *out = clean == "-" ? -NAN : NAN;
        return true;
    }
    const bool whole = digit_part(s, &i, &clean);
    bool fraction = false;
    if (i < s.size() && s[i] == '.') {
        clean.push_back(s[i++]);
        fraction = digit_part(s, &i, &clean);
    }
    if (!whole && !fraction) return false;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        clean.push_back(s[i++]);
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean.push_back(s[i++]);
        if (!digit_part(s, &i, &clean)) return false;
    }
    if (i != s.size()) return false;
    *out = std::strtod(clean.c_str(), nullptr);  // correctly rounded, overflow to inf as Python's float
    return true;
}

// float(f"{x:.6g}")
inline double six_digits(double x) {
    char text[64];
    std::snprintf(text, sizeof text, "%.6g", x);
    double back = 0;
    py_float(text, &back);
    return back;
}

// float(value) of an attribute as resolve() and validate() take it: false where Python raises.
inline bool attribute_float(const BridgeAttribute& a, double* out) {
    if (a.kind == BridgeAttribute::FLOAT) *out = a.number;
    else if (a.kind == BridgeAttribute::INT) *out = double(a.integer);
    else if (a.kind == BridgeAttribute::TEXT) return py_float(a.text, out);
    else return false;
    return true;
}

// ---- the side channel (SideChannel.decode and .resolved) ----

inline bool is_runtime_key(std::string_view key) {
    key = py_strip(key);
    return key == "backend" || key == "threads";
}

inline int name_index(std::string_view name, int first, int last) {
    for (int n = first; n <= last; ++n)
        if (name == BRIDGE_NAMES[n]) return n;
    return -1;
}

// The node's attributes with its side channel read into them (side_channel.resolve), and the channel's kernel
// choice (runtime items, the later of a key given twice). False with a message where Python raises.
inline bool resolve_side_channel(BridgeNode& node, std::string* backend, std::string* threads, std::string* error) {
    const BridgeAttribute& channel = node.attr[A_EXACT_FLOATS];
    if (channel.kind == BridgeAttribute::ABSENT) return true;
    if (channel.kind != BridgeAttribute::TEXT) {
        *error = "exact_floats must be text";
        return false;
    }
    const std::string text = channel.text;
    std::vector<std::string_view> items, runtime;
    for (size_t start = 0; start <= text.size();) {
        size_t end = text.find(';', start);
        if (end == std::string::npos) end = text.size();
        if (end > start) items.emplace_back(text.data() + start, end - start);
        start = end + 1;
    }
    for (std::string_view item : items)
        if (is_runtime_key(item.substr(0, item.find('=')))) runtime.push_back(item);
    for (std::string_view item : runtime) {
        const size_t eq = item.find('=');
        const std::string_view key = py_strip(item.substr(0, eq));
        const std::string_view value = eq == std::string_view::npos ? std::string_view() : py_strip(item.substr(eq + 1));
        *(key == "backend" ? backend : threads) = std::string(value);
    }
    for (std::string_view item : items) {
        if (std::find(runtime.begin(), runtime.end(), item) != runtime.end()) continue;  // `item not in runtime`
        const size_t eq = item.find('=');
        const std::string_view name = item.substr(0, eq);
        const std::string_view value = eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
        const int ints = name_index(name, A_BIAS_AFTER_MASK, A_WINDOW_RIGHT);
        if (ints >= 0) {
            int64_t v = 0;
            if (py_int(value, &v)) {
                node.attr[ints].kind = BridgeAttribute::INT;
                node.attr[ints].integer = v;
            }
            continue;
        }
        int f = name == "scale" ? A_SCALE : name == "mask_fill" ? A_MASK_FILL : name == "softcap" ? A_SOFTCAP : -1;
        if (f < 0 || node.attr[f].kind == BridgeAttribute::ABSENT) continue;
        double exact = 0, got = 0;
        if (!py_float(value, &exact)) continue;
        if (!attribute_float(node.attr[f], &got)) {
            *error = std::string(BRIDGE_NAMES[f]) + " must be a number";
            return false;
        }
        if (exact == got || six_digits(exact) == six_digits(got)) {
            node.attr[f].kind = BridgeAttribute::FLOAT;
            node.attr[f].number = exact;
        }
    }
    return true;
}

// ---- spec.validate, native_attributes ----

inline bool read_number(const BridgeNode& node, int n, double fallback, double* out, std::string* error) {
    const BridgeAttribute& a = node.attr[n];
    if (a.kind == BridgeAttribute::ABSENT) {
        *out = fallback;
        return true;
    }
    if (attribute_float(a, out)) return true;
    *error = std::string(BRIDGE_NAMES[n]) + " must be a number";
    return false;
}

inline bool read_integer(const BridgeNode& node, int n, int64_t fallback, int64_t lo, int64_t hi, int64_t* out,
                         std::string* error) {
    const BridgeAttribute& a = node.attr[n];
    if (a.kind != BridgeAttribute::ABSENT && a.kind != BridgeAttribute::INT) {
        *error = std::string(BRIDGE_NAMES[n]) + " must be an integer";
        return false;
    }
    *out = a.kind == BridgeAttribute::INT ? a.integer : fallback;
    if (*out < lo || *out > hi) {
        *error = std::string(BRIDGE_NAMES[n]) + " = " + std::to_string(*out) + " is out of range";
        return false;
    }
    return true;
}

inline bool read_choice(const BridgeNode& node, int n, const char* const* choices, int count, int fallback,
                        int* out, std::string* error) {
    const BridgeAttribute& a = node.attr[n];
    if (a.kind == BridgeAttribute::ABSENT) {
        *out = fallback;
        return true;
    }
    for (int i = 0; i < count && a.kind == BridgeAttribute::TEXT; ++i)
        if (a.text == choices[i]) {
            *out = i;
            return true;
        }
    *error = std::string(BRIDGE_NAMES[n]) + " is not one of the op's values";
    return false;
}

// The cores this process may run on (cpu.default_threads: len(os.sched_getaffinity(0))).
inline int affinity_threads() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

// A bridge node's call, as ortflash.InferenceSession's native path resolves it (node_attributes, then
// native_attributes with the side channel's threads or `default_threads`); false with a message where the node
// is outside the op's contract.
inline bool decode_bridge_node(BridgeNode node, int default_threads, BridgeCall* call, std::string* error) {
    std::string backend = "cpu", threads;
    if (!resolve_side_channel(node, &backend, &threads, error)) return false;
    CallOptions& o = call->options;
    const int64_t big = INT32_MAX;
    int64_t causal = 0, block = 0, after = 0, left = 0, right = 0;
    int zero_rows = 0;
    if (!read_number(node, A_SCALE, 1.0, &o.scale, error) || !read_number(node, A_MASK_FILL, -INFINITY, &o.mask_fill, error) ||
        !read_number(node, A_SOFTCAP, 0.0, &o.softcap, error) ||
        !read_integer(node, A_IS_CAUSAL, 0, 0, 2, &causal, error) ||
        !read_integer(node, A_BIAS_AFTER_MASK, 0, 0, 1, &after, error) ||
        !read_integer(node, A_WINDOW_LEFT, -1, -1, big, &left, error) ||
        !read_integer(node, A_WINDOW_RIGHT, -1, -1, big, &right, error) ||
        !read_choice(node, A_SOFTMAX, SOFTMAX_MODES, 3, 2, &call->softmax, error) ||
        !read_integer(node, A_BLOCK_SIZE, 128, 1, big, &block, error) ||
        !read_integer(node, A_MIN_SEQ_LEN, 1024, 0, big, &call->min_seq_len, error) ||
        !read_choice(node, A_MASKED_ROWS, MASKED_ROWS, 2, 0, &zero_rows, error))
        return false;
    if (!std::isfinite(o.scale) || o.scale == 0.0) {
        *error = "scale must be finite and non-zero";
        return false;
    }
    if (o.softcap < 0 || !std::isfinite(o.softcap)) {
        *error = "softcap must be >= 0 and finite";
        return false;
    }
    if (std::isnan(o.mask_fill) || o.mask_fill > 0) {
        *error = "mask_fill must be -inf or a negative number";
        return false;
    }
    if (backend != "cpu") {
        *error = backend == "reference" || backend == "wgpu"
                     ? "the side channel asks for backend " + backend + ", which runs in Python: open the model "
                                                                        "with ortflash.InferenceSession(..., backend=...)"
                     : "unknown backend " + backend;
        return false;
    }
    int64_t workers = default_threads;
    if (!threads.empty() && (!py_int(threads, &workers) || workers < 1 || workers > 4096)) {
        *error = "threads must be a positive integer, got " + threads;
        return false;
    }
    o.causal = int(causal);
    o.zero_rows = zero_rows != 0;
    o.block = int(block);
    o.bias_after_mask = after != 0;
    o.window_left = int(left);
    o.window_right = int(right);
    o.query_tile = BRIDGE_QUERY_TILE;
    o.threads = int(workers);
    call->min_query_tile = BRIDGE_MIN_QUERY_TILE;
    call->backend = backend;
    return true;
}

}  // namespace
