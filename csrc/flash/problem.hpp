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

// Buffers of finished calls, kept by the thread that freed them for its next call: without it
// every call allocated its packed K/V and scratch anew, and blocks above glibc's mmap threshold
// (128 KiB to start with) came back as fresh pages to fault in again (S = 512, H = 12: ~1.6 MB).
struct BufferCache {
    struct Entry {
        float* ptr;
        size_t bytes;
    };
    static constexpr size_t MAX_ENTRIES = 16;
    static constexpr size_t MAX_BYTES = size_t(64) << 20;
    std::vector<Entry> entries;
    size_t held = 0;
    ~BufferCache() {
        for (const Entry& e : entries) std::free(e.ptr);
    }
    // The smallest kept buffer of at least `bytes` (taken out of the cache), or null.
    float* take(size_t bytes, size_t* got) {
        size_t best = entries.size();
        for (size_t i = 0; i < entries.size(); ++i)
            if (entries[i].bytes >= bytes && (best == entries.size() || entries[i].bytes < entries[best].bytes))
                best = i;
        if (best == entries.size()) return nullptr;
        float* p = entries[best].ptr;
        *got = entries[best].bytes;
        held -= *got;
        entries[best] = entries.back();
        entries.pop_back();
        return p;
    }
    void give(float* p, size_t bytes) {
        if (entries.size() >= MAX_ENTRIES || held + bytes > MAX_BYTES) {
            std::free(p);
            return;
        }
        entries.push_back(Entry{p, bytes});
        held += bytes;
    }
};

inline BufferCache& buffer_cache() {
    static thread_local BufferCache cache;
    return cache;
}

struct AlignedFloats {  // a 64-byte aligned float buffer (not zeroed), from this thread's cache when it can be
    float* ptr = nullptr;
    size_t bytes = 0;
    explicit AlignedFloats(size_t n) {
        if (n == 0) n = 1;
        const size_t want = (n * sizeof(float) + 63) / 64 * 64;
        ptr = buffer_cache().take(want, &bytes);
        if (ptr) return;
        ptr = static_cast<float*>(std::aligned_alloc(64, want));
        if (!ptr) throw std::bad_alloc();
        bytes = want;
    }
    ~AlignedFloats() { buffer_cache().give(ptr, bytes); }
    AlignedFloats(const AlignedFloats&) = delete;
    AlignedFloats& operator=(const AlignedFloats&) = delete;
};

}  // namespace
