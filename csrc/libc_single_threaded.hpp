// Forced into each kernel module by setup.py (-include), so that a wheel built on a new glibc runs on older ones.
//
// libstdc++'s inline code (std::thread's shared state, shared_ptr counts) reads glibc's
// __libc_single_threaded (GLIBC_2.32) to skip atomic operations while a process has one thread;
// that one symbol raised the wheel's lowest manylinux tag from manylinux_2_24 to manylinux_2_34.
// This module's own copy stays 0 ("threads may exist"), so those counts are always atomic:
// the same results, without the import. Hidden, so it binds inside the module and is exported to
// no one. Elsewhere (musl, older glibc, macOS) the header is absent and nothing is defined.
#pragma once
#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#if defined(__GLIBC__)
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
#endif
#endif
