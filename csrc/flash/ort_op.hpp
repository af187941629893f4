// FlashAttention as a native ONNX Runtime custom op: RegisterCustomOps, and a kernel that runs the problem on ORT's
// own tensor buffers, no Python on the way (SessionOptions.register_custom_ops_library with this module's file).
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
//
// The node's attributes are plain values that ortflash.kernels.native_op resolved in Python (the side channel,
// the softmax policy, the thread count): nothing here parses text. Inputs Q, K, V (float32, 4-D), bias (float32)
// and mask (bool), both optional and of rank <= 4 (broadcast as the Python interface takes them); the bridge's
// neutral placeholders (a one-element bias of 0, a one-element mask of true) read as absent, as
// spec.absent_as_none reads them. Nothing throws across the C ABI: every error is an OrtStatus with a message.
#pragma once

#include "ort_abi.hpp"
#include "call.hpp"
#include "dispatch.hpp"
#include "side_channel.hpp"

namespace {

constexpr const char* NATIVE_DOMAIN = "ortflash.native";
constexpr const char* NATIVE_OP_NAME = "FlashAttention";

// Calls of the native op in this process (ortflash.kernels.native_op.calls(): what the tests read).
std::atomic<uint64_t> native_call_count{0};

struct NativeKernel {  // one node's resolved call
    OrtFunctions api;
    CallOptions options;
    int64_t online_from = -1;  // key length from which the online softmax runs; -1: never (naive)
    int min_query_tile = 6;
    explicit NativeKernel(const OrtApi* table) : api(table) {}
};

OrtStatus* error_status(const OrtFunctions& api, int code, const char* what, const char* detail = "") {
    char text[512];
    std::snprintf(text, sizeof text, "ortflash native FlashAttention: %s%s", what, detail);
    return api.CreateStatus(code, text);
}

// ---- creating a kernel: the node's attributes ----

OrtStatus* read_int(const OrtFunctions& api, const OrtKernelInfo* info, const char* name, int64_t lo, int64_t hi,
                    int* out) {
    int64_t value = 0;
    if (OrtStatus* s = api.KernelInfoGetAttribute_int64(info, name, &value)) return s;
    if (value < lo || value > hi) {
        char detail[160];
        std::snprintf(detail, sizeof detail, "%s = %lld is out of range", name, static_cast<long long>(value));
        return error_status(api, ORT_CODE_INVALID_ARGUMENT, "attribute ", detail);
    }
    *out = int(value);
    return nullptr;
}

// One of `choices` (a string attribute), as its index.
OrtStatus* read_choice(const OrtFunctions& api, const OrtKernelInfo* info, const char* name,
                       const char* const* choices, int count, int* out) {
    char text[16] = {};
    size_t size = sizeof text;
    if (OrtStatus* s = api.KernelInfoGetAttribute_string(info, name, text, &size)) return s;
    for (int i = 0; i < count; ++i)
        if (std::strcmp(text, choices[i]) == 0) {
            *out = i;
            return nullptr;
        }
    char detail[64];
    std::snprintf(detail, sizeof detail, "%s = '%s' is not one of the op's values", name, text);
    return error_status(api, ORT_CODE_INVALID_ARGUMENT, "attribute ", detail);
}

// The node's attributes: the spec's names (op/spec.py), each already resolved by ortflash.kernels.native_op
// (side channel, policy), and the compiled kernel's own (threads, query tiles).
OrtStatus* read_kernel(NativeKernel& kernel, const OrtKernelInfo* info) {
    const OrtFunctions& api = kernel.api;
    CallOptions& o = kernel.options;
    float scale = 0, mask_fill = 0, softcap = 0;
    if (OrtStatus* s = api.KernelInfoGetAttribute_float(info, "scale", &scale)) return s;
    if (OrtStatus* s = api.KernelInfoGetAttribute_float(info, "mask_fill", &mask_fill)) return s;
    if (OrtStatus* s = api.KernelInfoGetAttribute_float(info, "softcap", &softcap)) return s;
    o.scale = scale;
    o.mask_fill = mask_fill;
    o.softcap = softcap;
    static const char* const softmax_modes[] = {"naive", "online", "auto"};
    static const char* const masked_rows[] = {"nan", "zero"};
    int mode = 0, zero_rows = 0, bias_after_mask = 0, min_seq_len = 0;
    const int big = INT32_MAX;
    OrtStatus* s = nullptr;
    if ((s = read_int(api, info, "is_causal", 0, 2, &o.causal)) ||
        (s = read_choice(api, info, "masked_rows", masked_rows, 2, &zero_rows)) ||
        (s = read_choice(api, info, "softmax", softmax_modes, 3, &mode)) ||
        (s = read_int(api, info, "min_seq_len", 0, big, &min_seq_len)) ||
        (s = read_int(api, info, "bias_after_mask", 0, 1, &bias_after_mask)) ||
        (s = read_int(api, info, "window_left", -1, big, &o.window_left)) ||
        (s = read_int(api, info, "window_right", -1, big, &o.window_right)) ||
        (s = read_int(api, info, "block_size", 1, big, &o.block)) ||
        (s = read_int(api, info, "query_tile", 1, big, &o.query_tile)) ||
        (s = read_int(api, info, "min_query_tile", 1, big, &kernel.min_query_tile)) ||
        (s = read_int(api, info, "threads", 1, 4096, &o.threads)))
        return s;
    o.zero_rows = zero_rows != 0;
    o.bias_after_mask = bias_after_mask != 0;
    // SoftmaxPolicy.choose: naive never, online always, auto from min_seq_len keys
    kernel.online_from = mode == 0 ? -1 : (mode == 1 ? 0 : min_seq_len);
    if (const char* error = flags_error(o)) return error_status(api, ORT_CODE_INVALID_ARGUMENT, error);
    if (const char* error = sizes_error(o)) return error_status(api, ORT_CODE_INVALID_ARGUMENT, error);
    return nullptr;
}

// One attribute of a bridge node as the node holds it: a float, an int or a string (tried in that order; any
// other kind reads as absent, so the default applies).
BridgeAttribute probe_attribute(const OrtFunctions& api, const OrtKernelInfo* info, const char* name) {
    BridgeAttribute a;
    float number = 0;
    int64_t integer = 0;
    size_t size = 0;
    if (OrtStatus* s = api.KernelInfoGetAttribute_float(info, name, &number)) {
        api.ReleaseStatus(s);
    } else {
        a.kind = BridgeAttribute::FLOAT;
        a.number = number;
        return a;
    }
    if (OrtStatus* s = api.KernelInfoGetAttribute_int64(info, name, &integer)) {
        api.ReleaseStatus(s);
    } else {
        a.kind = BridgeAttribute::INT;
        a.integer = integer;
        return a;
    }
    if (OrtStatus* s = api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) {
        api.ReleaseStatus(s);
        return a;
    }
    std::string text(size, '\0');
    if (OrtStatus* s = api.KernelInfoGetAttribute_string(info, name, text.data(), &size)) {
        api.ReleaseStatus(s);
        return a;
    }
    text.resize(size > 0 ? size - 1 : 0);  // the size counts the NUL
    a.kind = BridgeAttribute::TEXT;
    a.text = std::move(text);
    return a;
}

// A node as fusion writes it (ai.onnx.contrib, the side channel): read by side_channel.hpp, the twin of
// ortflash's Python reading, with the side channel's thread count or every core this process may run on.
OrtStatus* read_bridge_kernel(NativeKernel& kernel, const OrtKernelInfo* info) {
    const OrtFunctions& api = kernel.api;
    BridgeNode node;
    for (int n = 0; n < A_COUNT; ++n) node.attr[n] = probe_attribute(api, info, BRIDGE_NAMES[n]);
    BridgeCall call;
    std::string error;
    if (!decode_bridge_node(node, affinity_threads(), &call, &error))
        return error_status(api, ORT_CODE_INVALID_ARGUMENT, "a node outside the op's contract: ", error.c_str());
    kernel.options = call.options;
    kernel.min_query_tile = call.min_query_tile;
    kernel.online_from = call.softmax == 0 ? -1 : (call.softmax == 1 ? 0 : call.min_seq_len);
    if (const char* e = flags_error(kernel.options)) return error_status(api, ORT_CODE_INVALID_ARGUMENT, e);
    if (const char* e = sizes_error(kernel.options)) return error_status(api, ORT_CODE_INVALID_ARGUMENT, e);
    return nullptr;
}

using KernelReader = OrtStatus* (*)(NativeKernel&, const OrtKernelInfo*);

template <KernelReader read>
OrtStatus* create_kernel_v2(const OrtCustomOpV16*, const OrtApi* table, const OrtKernelInfo* info,
                            void** out) noexcept {
    *out = nullptr;
    NativeKernel* kernel = nullptr;
    try {
        kernel = new NativeKernel(table);
    } catch (...) {
        return OrtFunctions(table).CreateStatus(ORT_CODE_FAIL, "ortflash native FlashAttention: out of memory");
    }
    OrtStatus* s = nullptr;
    try {
        s = read(*kernel, info);
    } catch (...) {
        s = OrtFunctions(table).CreateStatus(ORT_CODE_FAIL, "ortflash native FlashAttention: out of memory");
    }
    if (s) {
        delete kernel;
        return s;
    }
    *out = kernel;
    return nullptr;
}

void destroy_kernel(void* kernel) noexcept { delete static_cast<NativeKernel*>(kernel); }

// ---- one call ----

struct Tensor {  // an input or output as ORT holds it
    int64_t dims[8] = {};
    size_t rank = 0;
    int64_t count = 1;
    void* data = nullptr;
};

OrtStatus* read_tensor(const OrtFunctions& api, const OrtValue* value, int element, const char* name, Tensor* t) {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    if (OrtStatus* s = api.GetTensorTypeAndShape(value, &info)) return s;
    int type = 0;
    OrtStatus* s = api.GetTensorElementType(info, &type);
    if (!s) s = api.GetDimensionsCount(info, &t->rank);
    if (!s && t->rank > 8) s = error_status(api, ORT_CODE_INVALID_ARGUMENT, name, " has more than 8 dimensions");
    if (!s) s = api.GetDimensions(info, t->dims, t->rank);
    api.ReleaseTensorTypeAndShapeInfo(info);
    if (s) return s;
    if (type != element)
        return error_status(api, ORT_CODE_INVALID_ARGUMENT, name,
                            element == ORT_ELEMENT_BOOL ? " must be bool" : " must be float32");
    for (size_t a = 0; a < t->rank; ++a) t->count *= t->dims[a];
    return api.GetTensorMutableData(const_cast<OrtValue*>(value), &t->data);
}

// A bias or mask as the kernel reads it: rank <= 4, left-padded with 1s, each axis 1 (stride 0) or the scores'.
OrtStatus* broadcast_input(const OrtFunctions& api, const Tensor& t, const char* name, const int64_t* scores,
                           int item, Broadcast4* out) {
    if (t.rank > 4) return error_status(api, ORT_CODE_INVALID_ARGUMENT, name, " must have at most 4 dimensions");
    int64_t dims[4] = {1, 1, 1, 1};
    for (size_t a = 0; a < t.rank; ++a) dims[4 - t.rank + a] = t.dims[a];
    int64_t stride = 1;
    for (int a = 3; a >= 0; --a) {
        if (dims[a] != 1 && dims[a] != scores[a]) {
            char detail[160];
            std::snprintf(detail, sizeof detail, " axis %d has size %lld; want 1 or %lld", a,
                          static_cast<long long>(dims[a]), static_cast<long long>(scores[a]));
            return error_status(api, ORT_CODE_INVALID_ARGUMENT, name, detail);
        }
        out->stride[a] = dims[a] == 1 ? 0 : stride;
        stride *= dims[a];
    }
    out->data = static_cast<const char*>(t.data);
    out->item = item;
    out->half = false;  // float32 bias (the op's declared type) or a bool mask
    return nullptr;
}

// ortflash.kernels.cpu.query_tile: rows per work item, halved while that leaves a thread without work.
int query_tile_for(int batch_heads, int sq, int threads, int rows, int min_rows) {
    while (rows / 2 >= min_rows && int64_t(batch_heads) * ((sq + rows - 1) / rows) < threads) rows /= 2;
    return rows;
}

OrtStatus* compute(const NativeKernel& kernel, OrtKernelContext* context) {
    const OrtFunctions& api = kernel.api;
    native_call_count.fetch_add(1, std::memory_order_relaxed);
    size_t inputs = 0;
    if (OrtStatus* s = api.KernelContext_GetInputCount(context, &inputs)) return s;
    if (inputs < 3) return error_status(api, ORT_CODE_INVALID_ARGUMENT, "needs Q, K and V");
    const char* names[5] = {"q", "k", "v", "bias", "mask"};
    Tensor t[5];
    bool present[5] = {};
    for (size_t i = 0; i < 5 && i < inputs; ++i) {
        const OrtValue* value = nullptr;
        if (OrtStatus* s = api.KernelContext_GetInput(context, i, &value)) return s;
        if (!value) continue;  // an optional input left out
        if (OrtStatus* s = read_tensor(api, value, i == 4 ? ORT_ELEMENT_BOOL : ORT_ELEMENT_FLOAT, names[i], &t[i]))
            return s;
        present[i] = true;
    }
    if (!present[0] || !present[1] || !present[2]) return error_status(api, ORT_CODE_INVALID_ARGUMENT, "needs Q, K and V");
    for (int i = 0; i < 3; ++i)
        if (t[i].rank != 4) return error_status(api, ORT_CODE_INVALID_ARGUMENT, names[i], " must be 4-D");
    // spec.absent_as_none: the bridge's neutral placeholders stand for no bias, no mask
    if (present[3] && t[3].count == 1 && *static_cast<const float*>(t[3].data) == 0.0f) present[3] = false;
    if (present[4] && t[4].count == 1 && *static_cast<const uint8_t*>(t[4].data) != 0) present[4] = false;
    // A batch of 1 in Q, K or V broadcasts over the others' (as reference.flash_attention computes it): the
    // call then runs one problem per batch item.
    const int64_t batch = std::max(t[0].dims[0], std::max(t[1].dims[0], t[2].dims[0]));
    for (int i = 0; i < 3; ++i)
        if (t[i].dims[0] != 1 && t[i].dims[0] != batch)
            return error_status(api, ORT_CODE_INVALID_ARGUMENT, names[i], "'s batch is neither 1 nor the others'");
    const int64_t qs[4] = {batch, t[0].dims[1], t[0].dims[2], t[0].dims[3]};
    const int64_t ks[4] = {batch, t[1].dims[1], t[1].dims[2], t[1].dims[3]};
    const int64_t vs[4] = {batch, t[2].dims[1], t[2].dims[2], t[2].dims[3]};
    const int64_t os[4] = {batch, qs[1], qs[2], vs[3]};
    OrtValue* out_value = nullptr;
    if (OrtStatus* s = api.KernelContext_GetOutput(context, 0, os, 4, &out_value)) return s;
    void* out = nullptr;
    if (OrtStatus* s = api.GetTensorMutableData(out_value, &out)) return s;
    const int64_t out_count = os[0] * os[1] * os[2] * os[3];
    if (t[0].count == 0 || t[1].count == 0 || t[2].count == 0) {
        // reference.no_keys_output: no keys attend to nothing, O is zeros; an empty O has nothing to write
        if (out_count == 0) return nullptr;
        if (ks[2] != 0)
            return error_status(api, ORT_CODE_INVALID_ARGUMENT, "a zero-sized dimension other than the key length");
        std::memset(out, 0, size_t(out_count) * sizeof(float));
        return nullptr;
    }
    if (const char* error = shapes_error(qs, ks, vs, os)) return error_status(api, ORT_CODE_INVALID_ARGUMENT, error);
    Problem pb{};
    const int64_t scores[4] = {qs[0], qs[1], qs[2], ks[2]};
    if (present[3])
        if (OrtStatus* s = broadcast_input(api, t[3], "bias", scores, 4, &pb.bias)) return s;
    if (present[4])
        if (OrtStatus* s = broadcast_input(api, t[4], "mask", scores, 1, &pb.mask)) return s;
    const bool per_item = t[0].dims[0] != batch || t[1].dims[0] != batch || t[2].dims[0] != batch;
    pb.B = per_item ? 1 : int(batch);
    pb.Hq = int(qs[1]);
    pb.Sq = int(qs[2]);
    pb.D = int(qs[3]);
    pb.Hkv = int(ks[1]);
    pb.Sk = int(ks[2]);
    pb.Dv = int(vs[3]);
    pb.q_half = pb.k_half = pb.v_half = false;
    CallOptions o = kernel.options;
    o.online = kernel.online_from >= 0 && ks[2] >= kernel.online_from;
    o.query_tile = query_tile_for(pb.B * pb.Hq, pb.Sq, o.threads, o.query_tile, kernel.min_query_tile);
    set_options(pb, o);
    const int64_t q_item = qs[1] * qs[2] * qs[3], k_item = ks[1] * ks[2] * ks[3], v_item = vs[1] * vs[2] * vs[3];
    const Broadcast4 bias = pb.bias, mask = pb.mask;
    for (int64_t b = 0; b < (per_item ? batch : 1); ++b) {
        pb.q = static_cast<const float*>(t[0].data) + (t[0].dims[0] == 1 ? 0 : b * q_item);
        pb.k = static_cast<const float*>(t[1].data) + (t[1].dims[0] == 1 ? 0 : b * k_item);
        pb.v = static_cast<const float*>(t[2].data) + (t[2].dims[0] == 1 ? 0 : b * v_item);
        pb.out = static_cast<float*>(out) + b * os[1] * os[2] * os[3];
        if (bias.data) pb.bias.data = bias.data + b * bias.stride[0] * bias.item;
        if (mask.data) pb.mask.data = mask.data + b * mask.stride[0] * mask.item;
        if (!run_problem(pb)) return error_status(api, ORT_CODE_FAIL, "out of memory");
    }
    return nullptr;
}

OrtStatus* compute_v2(void* kernel, OrtKernelContext* context) noexcept {
    const NativeKernel& k = *static_cast<const NativeKernel*>(kernel);
    try {
        return compute(k, context);
    } catch (const std::bad_alloc&) {
        return error_status(k.api, ORT_CODE_FAIL, "out of memory");
    } catch (const std::exception& e) {
        return error_status(k.api, ORT_CODE_RUNTIME_EXCEPTION, "failed: ", e.what());
    } catch (...) {
        return error_status(k.api, ORT_CODE_RUNTIME_EXCEPTION, "failed");
    }
}

// The version-1 callbacks, for a runtime that would not take the V2 ones (onnxruntime>=1.22 does): an error
// there cannot be returned, so it is released and the call leaves its output as ORT allocated it.
template <KernelReader read>
void* create_kernel_v1(const OrtCustomOpV16* op, const OrtApi* table, const OrtKernelInfo* info) noexcept {
    void* kernel = nullptr;
    if (OrtStatus* s = create_kernel_v2<read>(op, table, info, &kernel)) OrtFunctions(table).ReleaseStatus(s);
    return kernel;
}

void compute_v1(void* kernel, OrtKernelContext* context) noexcept {
    if (!kernel) return;
    if (OrtStatus* s = compute_v2(kernel, context)) static_cast<NativeKernel*>(kernel)->api.ReleaseStatus(s);
}

// ---- the op's schema ----

const char* op_name(const OrtCustomOpV16*) noexcept { return NATIVE_OP_NAME; }
const char* op_provider(const OrtCustomOpV16*) noexcept { return nullptr; }  // the CPU execution provider
int input_type(const OrtCustomOpV16*, size_t index) noexcept {
    return index == 4 ? ORT_ELEMENT_BOOL : ORT_ELEMENT_FLOAT;
}
size_t input_count(const OrtCustomOpV16*) noexcept { return 5; }
int output_type(const OrtCustomOpV16*, size_t) noexcept { return ORT_ELEMENT_FLOAT; }
size_t output_count(const OrtCustomOpV16*) noexcept { return 1; }
int input_characteristic(const OrtCustomOpV16*, size_t index) noexcept {
    return index >= 3 ? ORT_CHARACTERISTIC_OPTIONAL : ORT_CHARACTERISTIC_REQUIRED;
}
int output_characteristic(const OrtCustomOpV16*, size_t) noexcept { return ORT_CHARACTERISTIC_REQUIRED; }
int input_memory_type(const OrtCustomOpV16*, size_t) noexcept { return 0; }
int variadic_min_arity(const OrtCustomOpV16*) noexcept { return 1; }
int variadic_homogeneity(const OrtCustomOpV16*) noexcept { return 1; }

template <KernelReader read>
constexpr OrtCustomOpV16 op_reading() {
    return {
        ORT_OP_API_VERSION,
        create_kernel_v1<read>,
        op_name,
        op_provider,
        input_type,
        input_count,
        output_type,
        output_count,
        compute_v1,
        destroy_kernel,
        input_characteristic,
        output_characteristic,
        input_memory_type,
        variadic_min_arity,
        variadic_homogeneity,
        variadic_min_arity,
        variadic_homogeneity,
        create_kernel_v2<read>,
        compute_v2,
        {},
    };
}

// The op of the domain ortflash.native: plain attributes, resolved by ortflash.kernels.native_op.
const OrtCustomOpV16 native_op = op_reading<read_kernel>();
// The op for nodes as fusion writes them (ai.onnx.contrib, the side channel), which ortflash.session_options()
// adds to onnxruntime-extensions' ai.onnx.contrib domain (its AddExternalCustomOp): a plain session then runs
// them natively, beside the extensions' own ops.
const OrtCustomOpV16 bridge_format_op = op_reading<read_bridge_kernel>();

}  // namespace

// What ONNX Runtime calls when this module is registered as a custom-op library: the op in its own domain on
// these options. The domain is never released: a session made from the options reads it for its whole life.
extern "C" __attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                              const OrtApiBase* base) noexcept {
    const OrtApi* table = base->GetApi(ORT_OP_API_VERSION);
    if (!table) {
        const OrtApi* first = base->GetApi(1);
        if (!first) return nullptr;  // nothing to report the error with
        return OrtFunctions(first).CreateStatus(ORT_CODE_FAIL,
                                                "ortflash native FlashAttention needs ONNX Runtime API version 16");
    }
    const OrtFunctions api(table);
    OrtCustomOpDomain* domain = nullptr;
    if (OrtStatus* s = api.CreateCustomOpDomain(NATIVE_DOMAIN, &domain)) return s;
    if (OrtStatus* s = api.CustomOpDomain_Add(domain, &native_op)) return s;
    return api.AddCustomOpDomain(options, domain);
}
