// Threading: work items handed out one at a time over the calling thread and a persistent pool.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

namespace {

// Worker threads started once per process and parked on a condition variable between calls (glibc's pthread_cond_t).
// Starting std::threads on every call cost ~20-60 us per call (two parallel sections per call,
// one thread each on a 2-core machine), as much as the whole attention at S = 16-64; waking a
// parked thread costs a futex wake. One caller at a time uses the pool: a concurrent call
// (two sessions in parallel threads) runs on its own thread alone rather than queueing.
// The pool is never destroyed (its threads are detached and parked when the process exits),
// and a forked child, which has none of its parent's threads, starts a pool of its own.
class WorkerPool {
public:
    static WorkerPool* get() {
        static std::mutex guard;
        static WorkerPool* pool = nullptr;
        std::lock_guard<std::mutex> lock(guard);
        if (!pool || pool->owner != getpid()) pool = new WorkerPool();  // the parent's, in a child: left as is
        return pool;
    }

    // Runs fn on the calling thread and on up to `helpers` pool threads; false when the pool is
    // in use by another caller (fn has not run then). The caller waits only for the helpers that
    // joined before its own fn returned: on a loaded machine a helper that is not scheduled in
    // time is left out (it finds the job closed), instead of the call waiting a time slice for it.
    bool run(int helpers, const std::function<void()>& fn) {
        bool idle = false;
        if (!busy.compare_exchange_strong(idle, true)) return false;
        pthread_mutex_lock(&m);
        while (int(started) < helpers) {
            std::thread(&WorkerPool::loop, this, int(started)).detach();
            ++started;
        }
        job = &fn;
        wanted = helpers;
        open = true;
        ++generation;
        pthread_mutex_unlock(&m);
        pthread_cond_broadcast(&wake);
        fn();
        pthread_mutex_lock(&m);
        open = false;
        while (active != 0) pthread_cond_wait(&finished, &m);
        job = nullptr;
        pthread_mutex_unlock(&m);
        busy.store(false);
        return true;
    }

private:
    WorkerPool() : owner(getpid()) {}

    void loop(int index) {
        uint64_t seen = 0;
        pthread_mutex_lock(&m);
        for (;;) {
            while (generation == seen) pthread_cond_wait(&wake, &m);
            seen = generation;
            if (!open || index >= wanted) continue;
            ++active;
            const std::function<void()>* fn = job;
            pthread_mutex_unlock(&m);
            (*fn)();  // does not throw: parallel_items' worker catches
            pthread_mutex_lock(&m);
            if (--active == 0 && !open) pthread_cond_signal(&finished);
        }
    }

    const pid_t owner;
    // The pool's locks are glibc's own, not std::mutex::try_lock and std::condition_variable:
    // libstdc++ 12 binds those to pthread_mutex_trylock@GLIBC_2.34 and condition_variable::wait
    // @GLIBCXX_3.4.30, which would raise the wheel's manylinux tag past 2_24 (auditwheel refuses).
    std::atomic<bool> busy{false};  // set by the one caller using the pool
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;  // guards what follows
    pthread_cond_t wake = PTHREAD_COND_INITIALIZER, finished = PTHREAD_COND_INITIALIZER;
    size_t started = 0;
    const std::function<void()>* job = nullptr;
    uint64_t generation = 0;
    int wanted = 0;     // pool threads [0, wanted) may take part in the current job
    bool open = false;  // the caller is still working on it: a helper that wakes may join
    int active = 0;     // helpers working on it
};

// Runs body(item) for item in [0, items) on `threads` threads (the caller's included), items
// handed out one at a time so that uneven items (causal rows) balance. Returns false when a
// thread ran out of memory (or failed otherwise).
template <class Body>
bool parallel_items(int items, int threads, const Body& body) {
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    const std::function<void()> worker = [&]() {
        if (next.load() >= items) return;  // a helper that woke late: no scratch for nothing
        try {
            auto run_item = body();  // per-thread state (scratch) lives in the returned closure
            for (int i = next.fetch_add(1); i < items && !failed.load(); i = next.fetch_add(1)) run_item(i);
        } catch (...) {
            failed.store(true);
        }
    };
    const int n = std::max(1, std::min(threads, items));
    if (n == 1 || !WorkerPool::get()->run(n - 1, worker)) worker();
    return !failed.load();
}

}  // namespace
