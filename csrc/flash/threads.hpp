// Threading: work items handed out one at a time over a pool of std::threads.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

namespace {

// Runs body(item) for item in [0, items) on `threads` threads (the caller's included), items
// handed out one at a time so that uneven items (causal rows) balance. Returns false when a
// thread ran out of memory.
template <class Body>
bool parallel_items(int items, int threads, const Body& body) {
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    auto worker = [&]() {
        try {
            auto run_item = body();  // per-thread state (scratch) lives in the returned closure
            for (int i = next.fetch_add(1); i < items && !failed.load(); i = next.fetch_add(1)) run_item(i);
        } catch (const std::bad_alloc&) {
            failed.store(true);
        }
    };
    const int n = std::max(1, std::min(threads, items));
    std::vector<std::thread> pool;
    pool.reserve(n - 1);
    for (int t = 1; t < n; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    return !failed.load();
}

}  // namespace
