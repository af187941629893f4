// One call as the kernel sees it: shapes, operands and options (Problem), and the aligned float buffer.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

namespace {

// ---- the call ----

struct Broadcast4 {  // an optional bias or mask: base pointer and element strides, 0 on broadcast axes
    const char* data = nullptr;
    int64_t stride[4] = {0, 0, 0, 0};
    int item = 0;
    bool half = false;
};

struct Problem {
    int B, Hq, Hkv, Sq, Sk, D, Dv;
    const void* q;
    const void* k;
    const void* v;
    void* out;
    bool q_half, k_half, v_half;
    Broadcast4 bias, mask;
    float scale, mask_fill, softcap;
    bool causal, zero_rows, online;
    int causal_offset;     // with causal: query i sees key j <= i + causal_offset (spec.key_bounds: the
                           // causal frontier, or a window's right edge)
    bool windowed;         // a window's left edge: query i sees key j >= i + left_offset
    int left_offset;
    bool bias_after_mask;  // the bias is added after the mask and causal fills (spec: bias_after_mask)
    int block;       // keys per tile of the online softmax
    int query_tile;  // query rows per work item
    int threads;
};

struct AlignedFloats {  // a 64-byte aligned float buffer
    float* ptr = nullptr;
    explicit AlignedFloats(size_t n) {
        if (n == 0) n = 1;
        ptr = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
        if (!ptr) throw std::bad_alloc();
    }
    ~AlignedFloats() { std::free(ptr); }
    AlignedFloats(const AlignedFloats&) = delete;
    AlignedFloats& operator=(const AlignedFloats&) = delete;
};

}  // namespace
