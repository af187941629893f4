// FlashAttention on the CPU: the semantics of ortflash/spec.py, computed in float32 tiles.
//
// One source, built three times by setup.py (module_avx512.cpp, module_avx2.cpp,
// module_generic.cpp) with different ISA flags; the vector width follows the flags through
// GCC vector extensions. ortflash/kernels/cpu.py imports the best build the CPU runs.
//
// Work is split over (batch, query head, query tile). For each query tile the scores of a key
// tile are one register-blocked product (MR query rows broadcast x NR packed K^T columns), the
// softmax runs over that tile (online) or over the whole score row (naive), and P x V is a
// second register-blocked product with Dv across the vector lanes. K^T and V are packed once
// per kv head and shared by the grouped query heads. Nothing here is proportional to Sq * Sk.
// A call with few query rows per kv head (a decode step or a short prefill: (Hq / Hkv) * Sq <= DIRECT_MAX_ROWS)
// packs nothing: work is split over (batch, kv head), and K and V are read in place (run_direct).
//
// The discrete edge cases follow ortflash/kernels/reference.py operation by operation: NaN
// propagates through the row max, a fully -inf row yields NaN (or 0 with masked_rows="zero"),
// and a finite mask_fill gives masked keys that weight, including the causal keys right of the
// diagonal that are never multiplied (their scores are all mask_fill, so they enter the softmax
// as one closed-form term: count * exp(fill - max) and exp(fill - max) * suffix sum of V).
// One difference is by design: V rows of skipped causal keys are never read, so a NaN there
// does not reach the output (the reference multiplies it by p = 0).
//
// Padding is skipped, not multiplied: in online mode a key tile whose bias or mask puts every
// score far below the rest (a padded tail, e.g. bias = float32 lowest) is set aside until the
// other tiles have set the row maxima, and then dropped when a Cauchy-Schwarz bound
// (|score| <= |scale| |q| |k|, key norms recorded while packing) proves each of its exps is
// exactly 0 and its V rows are finite, so it would add exactly 0 to the sums. NaN or inf in
// its K or V, or a row that sees no other key, keeps the tile in (then processed last).
//
// Scores stay in natural units and log2(e) is applied inside vexp to (score - max): folding
// scale * log2(e) into the scores would turn a float32-lowest mask_fill into -inf, and a
// row masked with that finite fill must stay a uniform softmax, not become NaN.

#ifndef ORTFLASH_MODULE_NAME
#error "define ORTFLASH_MODULE_NAME (the extension module's name) before including this file"
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <pthread.h>
#include <unistd.h>

#if defined(__SSE2__) || defined(__AVX__)
#include <immintrin.h>
#endif

// The kernel's parts, by job (csrc/flash/); each opens the anonymous namespace again, so they
// stay one translation unit's internal functions, in this order.
#include "flash/simd.hpp"
#include "flash/tiles.hpp"
#include "flash/problem.hpp"
#include "flash/threads.hpp"
#include "flash/pack.hpp"
#include "flash/scores.hpp"
#include "flash/scratch.hpp"
#include "flash/bounds.hpp"
#include "flash/padding.hpp"
#include "flash/online.hpp"
#include "flash/naive.hpp"
#include "flash/decode.hpp"
#include "flash/dispatch.hpp"
#include "flash/call.hpp"
#include "flash/ort_op.hpp"
#include "flash/python.hpp"

PyMODINIT_FUNC ORTFLASH_CAT(PyInit_, ORTFLASH_MODULE_NAME)(void) {
    PyObject* m = PyModule_Create(&module_def);
    if (!m) return nullptr;
    if (PyModule_AddStringConstant(m, "ISA", ISA_NAME) < 0 || PyModule_AddIntConstant(m, "VECTOR_FLOATS", W) < 0 ||
        PyModule_AddStringConstant(m, "NATIVE_DOMAIN", NATIVE_DOMAIN) < 0 ||
        PyModule_AddStringConstant(m, "NATIVE_OP", NATIVE_OP_NAME) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
