// The Python interface: buffer checks, flash_attention() and cpu_features(), and the module's method table.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "simd.hpp"
#include "problem.hpp"
#include "dispatch.hpp"
#include "call.hpp"
#include "side_channel.hpp"
#include "ort_op.hpp"

namespace {

// ---- Python interface ----

struct Buffer {  // a Py_buffer released on scope exit
    Py_buffer view{};
    bool held = false;
    bool get(PyObject* obj, int flags) {
        held = PyObject_GetBuffer(obj, &view, flags) == 0;
        return held;
    }
    ~Buffer() {
        if (held) PyBuffer_Release(&view);
    }
    char kind() const {  // the struct format letter, byte-order prefix skipped
        const char* f = view.format ? view.format : "B";
        while (*f == '@' || *f == '=' || *f == '<') ++f;
        return *f;
    }
};

bool float_kind(const Buffer& b, const char* name, bool* half) {
    const char kind = b.kind();
    if (kind == 'f' && b.view.itemsize == 4) {
        *half = false;
        return true;
    }
    if (kind == 'e' && b.view.itemsize == 2) {
        *half = true;
        return true;
    }
    PyErr_Format(PyExc_TypeError, "%s must be float32 or float16 (buffer format '%s')", name,
                 b.view.format ? b.view.format : "B");
    return false;
}

bool four_d(const Buffer& b, const char* name) {
    if (b.view.ndim != 4) {
        PyErr_Format(PyExc_ValueError, "%s must be 4-D, got %d dimensions", name, b.view.ndim);
        return false;
    }
    return true;
}

// bias or mask: 4-D, each axis 1 (broadcast, stride 0) or the scores' size.
bool broadcast_operand(const Buffer& b, const char* name, const Py_ssize_t* scores, Broadcast4* out) {
    if (!four_d(b, name)) return false;
    out->data = static_cast<const char*>(b.view.buf);
    out->item = int(b.view.itemsize);
    for (int a = 0; a < 4; ++a) {
        const Py_ssize_t n = b.view.shape[a];
        if (n != 1 && n != scores[a]) {
            PyErr_Format(PyExc_ValueError, "%s axis %d has size %zd; want 1 or %zd", name, a, n, scores[a]);
            return false;
        }
        if (b.view.strides[a] % b.view.itemsize) {
            PyErr_Format(PyExc_ValueError, "%s has a stride that is not a whole number of elements", name);
            return false;
        }
        out->stride[a] = n == 1 ? 0 : b.view.strides[a] / b.view.itemsize;
    }
    return true;
}

PyObject* py_flash_attention(PyObject*, PyObject* args, PyObject* kwargs) {
    static const char* keywords[] = {"q", "k", "v", "out", "bias", "mask", "scale", "is_causal", "mask_fill",
                                     "zero_rows", "softcap", "online", "block_size", "query_tile", "threads",
                                     "bias_after_mask", "window_left", "window_right", nullptr};
    PyObject *q_obj, *k_obj, *v_obj, *out_obj, *bias_obj, *mask_obj;
    double scale, mask_fill, softcap;
    int causal, zero_rows, online, block, query_tile, threads, bias_after_mask = 0, window_left = -1,
                                                                   window_right = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOdidpdpiii|pii", const_cast<char**>(keywords), &q_obj,
                                     &k_obj, &v_obj, &out_obj, &bias_obj, &mask_obj, &scale, &causal, &mask_fill,
                                     &zero_rows, &softcap, &online, &block, &query_tile, &threads, &bias_after_mask,
                                     &window_left, &window_right))
        return nullptr;
    CallOptions o;
    o.scale = scale;
    o.mask_fill = mask_fill;
    o.softcap = softcap;
    o.causal = causal;
    o.zero_rows = zero_rows != 0;
    o.online = online != 0;
    o.bias_after_mask = bias_after_mask != 0;
    o.block = block;
    o.query_tile = query_tile;
    o.threads = threads;
    o.window_left = window_left;
    o.window_right = window_right;
    if (const char* error = flags_error(o)) {
        PyErr_SetString(PyExc_ValueError, error);
        return nullptr;
    }
    Buffer q, k, v, out, bias, mask;
    const int dense = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
    if (!q.get(q_obj, dense) || !k.get(k_obj, dense) || !v.get(v_obj, dense) ||
        !out.get(out_obj, dense | PyBUF_WRITABLE))
        return nullptr;
    Problem pb{};
    if (!four_d(q, "q") || !four_d(k, "k") || !four_d(v, "v") || !four_d(out, "out")) return nullptr;
    if (!float_kind(q, "q", &pb.q_half) || !float_kind(k, "k", &pb.k_half) || !float_kind(v, "v", &pb.v_half))
        return nullptr;
    bool out_half = false;
    if (!float_kind(out, "out", &out_half)) return nullptr;
    const Py_ssize_t* qs = q.view.shape;
    const Py_ssize_t* ks = k.view.shape;
    if (out_half != pb.q_half) {
        PyErr_SetString(PyExc_ValueError, SHAPES_MESSAGE);
        return nullptr;
    }
    if (const char* error = shapes_error(qs, ks, v.view.shape, out.view.shape)) {
        PyErr_SetString(PyExc_ValueError, error);
        return nullptr;
    }
    if (const char* error = sizes_error(o)) {
        PyErr_SetString(PyExc_ValueError, error);
        return nullptr;
    }
    const Py_ssize_t scores[4] = {qs[0], qs[1], qs[2], ks[2]};
    const int strided = PyBUF_STRIDES | PyBUF_FORMAT;
    if (bias_obj != Py_None) {
        if (!bias.get(bias_obj, strided) || !float_kind(bias, "bias", &pb.bias.half) ||
            !broadcast_operand(bias, "bias", scores, &pb.bias))
            return nullptr;
    }
    if (mask_obj != Py_None) {
        if (!mask.get(mask_obj, strided)) return nullptr;
        if (mask.kind() != '?' || mask.view.itemsize != 1) {
            PyErr_SetString(PyExc_TypeError, "mask must be a bool array");
            return nullptr;
        }
        if (!broadcast_operand(mask, "mask", scores, &pb.mask)) return nullptr;
    }
    pb.B = int(qs[0]);
    pb.Hq = int(qs[1]);
    pb.Sq = int(qs[2]);
    pb.D = int(qs[3]);
    pb.Hkv = int(ks[1]);
    pb.Sk = int(ks[2]);
    pb.Dv = int(v.view.shape[3]);
    pb.q = q.view.buf;
    pb.k = k.view.buf;
    pb.v = v.view.buf;
    pb.out = out.view.buf;
    set_options(pb, o);
    bool ok = false;
    Py_BEGIN_ALLOW_THREADS
    try {
        ok = run_problem(pb);
    } catch (const std::exception&) {
        ok = false;
    }
    Py_END_ALLOW_THREADS
    if (!ok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyObject* py_cpu_features(PyObject*, PyObject*) {
    // What this CPU (and the OS, for the AVX register state) supports, for the ISA choice.
    PyObject* names = PyList_New(0);
    if (!names) return nullptr;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const struct {
        const char* name;
        bool present;
    } features[] = {
        {"sse2", bool(__builtin_cpu_supports("sse2"))},         {"avx", bool(__builtin_cpu_supports("avx"))},
        {"avx2", bool(__builtin_cpu_supports("avx2"))},         {"fma", bool(__builtin_cpu_supports("fma"))},
        {"f16c", bool(__builtin_cpu_supports("f16c"))},         {"avx512f", bool(__builtin_cpu_supports("avx512f"))},
        {"avx512dq", bool(__builtin_cpu_supports("avx512dq"))}, {"avx512vl", bool(__builtin_cpu_supports("avx512vl"))},
        {"avx512bw", bool(__builtin_cpu_supports("avx512bw"))},
    };
    for (const auto& f : features) {
        if (!f.present) continue;
        PyObject* s = PyUnicode_FromString(f.name);
        if (!s || PyList_Append(names, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(names);
            return nullptr;
        }
        Py_DECREF(s);
    }
#endif
    return names;
}

PyObject* py_native_calls(PyObject*, PyObject*) {
    return PyLong_FromUnsignedLongLong(native_call_count.load(std::memory_order_relaxed));
}

// decode_bridge_node(attributes, default_threads): side_channel.hpp's reading of a node's attributes (a dict of
// float, int, str or bytes, as onnx.helper.get_attribute_value gives them), as native_op.native_attributes' dict;
// ValueError with the reason where the node is outside the op's contract. For tests/test_plain_native.py.
PyObject* py_decode_bridge_node(PyObject*, PyObject* args) {
    PyObject* attrs = nullptr;
    int default_threads = 1;
    if (!PyArg_ParseTuple(args, "O!i", &PyDict_Type, &attrs, &default_threads)) return nullptr;
    BridgeNode node;
    PyObject *key = nullptr, *value = nullptr;
    Py_ssize_t at = 0;
    while (PyDict_Next(attrs, &at, &key, &value)) {
        const char* name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
        if (!name) return PyErr_Format(PyExc_TypeError, "attribute names must be str");
        const int n = name_index(name, 0, A_COUNT - 1);
        if (n < 0) continue;  // an attribute ONNX Runtime would hand the op but it never asks for
        BridgeAttribute& a = node.attr[n];
        if (PyFloat_Check(value)) {
            a.kind = BridgeAttribute::FLOAT;
            a.number = PyFloat_AsDouble(value);
        } else if (PyLong_Check(value) && !PyBool_Check(value)) {
            a.kind = BridgeAttribute::INT;
            a.integer = PyLong_AsLongLong(value);
            if (PyErr_Occurred()) return nullptr;
        } else if (PyUnicode_Check(value) || PyBytes_Check(value)) {
            const char* text = PyBytes_Check(value) ? PyBytes_AsString(value) : PyUnicode_AsUTF8(value);
            if (!text) return nullptr;
            a.kind = BridgeAttribute::TEXT;
            a.text = text;
        } else {
            return PyErr_Format(PyExc_TypeError, "attribute %s: a float, int or text, as a node holds them", name);
        }
    }
    BridgeCall call;
    std::string error;
    if (!decode_bridge_node(node, default_threads, &call, &error)) {
        PyErr_SetString(PyExc_ValueError, error.c_str());
        return nullptr;
    }
    const CallOptions& o = call.options;
    return Py_BuildValue("{s:d,s:d,s:d,s:i,s:s,s:s,s:L,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "scale", o.scale, "mask_fill",
                         o.mask_fill, "softcap", o.softcap, "is_causal", o.causal, "masked_rows",
                         o.zero_rows ? "zero" : "nan", "softmax", SOFTMAX_MODES[call.softmax], "min_seq_len",
                         static_cast<long long>(call.min_seq_len), "block_size", o.block, "bias_after_mask",
                         int(o.bias_after_mask), "window_left", o.window_left, "window_right", o.window_right,
                         "query_tile", o.query_tile, "min_query_tile", call.min_query_tile, "threads", o.threads);
}

PyObject* py_bridge_op_address(PyObject*, PyObject*) {
    return PyLong_FromVoidPtr(const_cast<OrtCustomOpV16*>(&bridge_format_op));
}

PyMethodDef methods[] = {
    {"decode_bridge_node", py_decode_bridge_node, METH_VARARGS,
     "decode_bridge_node(attributes, default_threads) -> the native call's attributes, read as the C++ op reads a "
     "node of ai.onnx.contrib (side channel included)."},
    {"bridge_op_address", py_bridge_op_address, METH_NOARGS,
     "The address of the OrtCustomOp for FlashAttention nodes as fusion writes them (ai.onnx.contrib)."},
    {"flash_attention", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_flash_attention)),
     METH_VARARGS | METH_KEYWORDS,
     "flash_attention(q, k, v, out, bias, mask, scale, is_causal (0/1/2), mask_fill, zero_rows, softcap, online, "
     "block_size, query_tile, threads, bias_after_mask=False, window_left=-1, window_right=-1)\n\nWrites FlashAttention of q, k, v into out (see ortflash.kernels.cpu)."},
    {"cpu_features", py_cpu_features, METH_NOARGS, "The x86 features this CPU and OS support, as names."},
    {"native_calls", py_native_calls, METH_NOARGS,
     "How many times ONNX Runtime ran this build's native FlashAttention op in this process."},
    {nullptr, nullptr, 0, nullptr},
};

#define ORTFLASH_STR2(x) #x
#define ORTFLASH_STR(x) ORTFLASH_STR2(x)
#define ORTFLASH_CAT2(a, b) a##b
#define ORTFLASH_CAT(a, b) ORTFLASH_CAT2(a, b)

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, ORTFLASH_STR(ORTFLASH_MODULE_NAME),
    "FlashAttention CPU kernel (one ISA build); use ortflash.kernels.cpu.", -1, methods, nullptr, nullptr, nullptr,
    nullptr,
};

}  // namespace
