// A call's options and shapes checked and turned into a Problem: the one step both front doors take, the
// Python interface (python.hpp) and the native ONNX Runtime op (ort_op.hpp), so that both run the same problem.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "problem.hpp"

namespace {

// ---- one call's options ----

struct CallOptions {  // what a call asks besides its operands (ortflash.kernels.cpu.KernelCall, resolved)
    double scale = 1.0, mask_fill = -INFINITY, softcap = 0.0;
    int causal = 0;  // spec.py is_causal: 0, 1 (top-left) or 2 (bottom-right)
    bool zero_rows = false, online = false, bias_after_mask = false;
    int block = 128, query_tile = 64, threads = 1;
    int window_left = -1, window_right = -1;  // -1: unbounded
};

// The first of is_causal and the window outside the kernel's contract, or nullptr.
inline const char* flags_error(const CallOptions& o) {
    if (o.causal < 0 || o.causal > 2) return "is_causal must be 0, 1 or 2";
    if (o.window_left < -1 || o.window_right < -1)
        return "window_left and window_right must be -1 (unbounded) or >= 0";
    return nullptr;
}

constexpr const char* SHAPES_MESSAGE =
    "shapes must be q [B,Hq,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv], out [B,Hq,Sq,Dv] (Q's dtype), Hq a multiple of "
    "Hkv";

// q [B,Hq,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv], out [B,Hq,Sq,Dv], each of 4 axes; the first misfit as a
// message, or nullptr. Index is Py_ssize_t (Python buffers) or int64_t (ONNX Runtime shapes).
template <class Index>
const char* shapes_error(const Index* qs, const Index* ks, const Index* vs, const Index* os) {
    const bool fit = ks[0] == qs[0] && vs[0] == qs[0] && vs[1] == ks[1] && vs[2] == ks[2] && ks[3] == qs[3] &&
                     ks[1] > 0 && qs[1] % ks[1] == 0 && os[0] == qs[0] && os[1] == qs[1] && os[2] == qs[2] &&
                     os[3] == vs[3];
    if (!fit) return SHAPES_MESSAGE;
    for (int a = 0; a < 4; ++a)
        if (qs[a] <= 0 || ks[a] <= 0 || vs[a] <= 0 || qs[a] > INT32_MAX / 4 || ks[a] > INT32_MAX / 4)
            return "every dimension must be positive (and below 2^29)";
    return nullptr;
}

inline const char* sizes_error(const CallOptions& o) {
    if (o.block < 1 || o.query_tile < 1 || o.threads < 1) return "block_size, query_tile and threads must be positive";
    return nullptr;
}

// pb's options from o; pb's shapes (B, Hq, Sq, Sk, D, Dv) are already set.
inline void set_options(Problem& pb, const CallOptions& o) {
    pb.scale = float(o.scale);
    pb.mask_fill = float(o.mask_fill);
    pb.softcap = float(o.softcap);
    // spec.key_bounds: position p = i + (Sk - Sq under is_causal 2, else 0); keys j <= p under
    // is_causal, j <= p + window_right under a window without it (the same right frontier, moved),
    // and j >= p - window_left.
    const int position = o.causal == 2 ? pb.Sk - pb.Sq : 0;
    pb.causal = o.causal != 0 || o.window_right >= 0;
    pb.causal_offset = o.causal != 0 ? position : position + o.window_right;
    pb.windowed = o.window_left >= 0;
    pb.left_offset = position - o.window_left;
    pb.bias_after_mask = o.bias_after_mask;
    pb.zero_rows = o.zero_rows;
    pb.online = o.online;
    pb.block = std::min(o.block, pb.Sk);  // one tile holds every key when block_size >= Sk
    pb.query_tile = o.query_tile;
    // A thread costs tens of microseconds to start: give each at least ~4M multiply-adds.
    const double multiply_adds = double(pb.B) * pb.Hq * pb.Sq * pb.Sk * (pb.D + pb.Dv);
    pb.threads = int(std::max(1.0, std::min(double(o.threads), multiply_adds / double(1 << 22))));
}

}  // namespace
