// The few facts of ONNX Runtime's C ABI that the native op (ort_op.hpp) uses, declared here by us.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
//
// Source of these facts: microsoft/onnxruntime, include/onnxruntime/core/session/onnxruntime_c_api.h
// (read in the copy vendored by yalue/onnxruntime_go at 8ce7fa5, ORT_API_VERSION 29, and in onnxruntime's own
// at API versions 8 and 13), with onnxruntime/core/session/custom_ops.cc for which OrtCustomOp fields ONNX
// Runtime reads at which version. No ONNX Runtime header ships with its wheel, so nothing is included.
//
// The ABI is stable: OrtApiBase::GetApi(version) returns a table of function pointers whose slots never move
// (new functions are only appended), and an OrtCustomOp is read field by field up to what its `version`
// declares. We name only the slots we call (kApi*, their index in that table) and the OrtCustomOp fields up to
// version 16 (KernelComputeV2, the first that returns errors as a status), which onnxruntime>=1.22 provides.
#pragma once

extern "C" {

struct OrtStatus;
struct OrtApi;  // read through its slot indices below
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtValue;
struct OrtTensorTypeAndShapeInfo;

struct OrtApiBase {
    const OrtApi* (*GetApi)(uint32_t version) noexcept;
    const char* (*GetVersionString)() noexcept;
};

}  // extern "C"

namespace {

// The API version this op is written against: its OrtCustomOp layout and the table it asks for.
constexpr uint32_t ORT_OP_API_VERSION = 16;

// OrtErrorCode
constexpr int ORT_CODE_FAIL = 1;
constexpr int ORT_CODE_INVALID_ARGUMENT = 2;
constexpr int ORT_CODE_RUNTIME_EXCEPTION = 6;
// ONNXTensorElementDataType
constexpr int ORT_ELEMENT_FLOAT = 1;
constexpr int ORT_ELEMENT_BOOL = 9;
// OrtCustomOpInputOutputCharacteristic
constexpr int ORT_CHARACTERISTIC_REQUIRED = 0;
constexpr int ORT_CHARACTERISTIC_OPTIONAL = 1;

// Slots of the OrtApi table (index of each function pointer).
constexpr int kApiCreateStatus = 0;
constexpr int kApiCreateCustomOpDomain = 26;
constexpr int kApiCustomOpDomainAdd = 27;
constexpr int kApiAddCustomOpDomain = 28;
constexpr int kApiGetTensorMutableData = 51;
constexpr int kApiGetTensorElementType = 60;
constexpr int kApiGetDimensionsCount = 61;
constexpr int kApiGetDimensions = 62;
constexpr int kApiGetTensorTypeAndShape = 65;
constexpr int kApiKernelInfoGetAttributeFloat = 85;
constexpr int kApiKernelInfoGetAttributeInt64 = 86;
constexpr int kApiKernelInfoGetAttributeString = 87;
constexpr int kApiKernelContextGetInputCount = 88;
constexpr int kApiKernelContextGetInput = 90;
constexpr int kApiKernelContextGetOutput = 91;
constexpr int kApiReleaseStatus = 93;
constexpr int kApiReleaseTensorTypeAndShapeInfo = 99;

// The functions we call, typed, taken from the table once.
struct OrtFunctions {
    OrtStatus* (*CreateStatus)(int code, const char* message) noexcept;
    OrtStatus* (*CreateCustomOpDomain)(const char* domain, OrtCustomOpDomain** out) noexcept;
    OrtStatus* (*CustomOpDomain_Add)(OrtCustomOpDomain* domain, const void* op) noexcept;
    OrtStatus* (*AddCustomOpDomain)(OrtSessionOptions* options, OrtCustomOpDomain* domain) noexcept;
    OrtStatus* (*GetTensorMutableData)(OrtValue* value, void** out) noexcept;
    OrtStatus* (*GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info, int* out) noexcept;
    OrtStatus* (*GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out) noexcept;
    OrtStatus* (*GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dims, size_t count) noexcept;
    OrtStatus* (*GetTensorTypeAndShape)(const OrtValue* value, OrtTensorTypeAndShapeInfo** out) noexcept;
    OrtStatus* (*KernelInfoGetAttribute_float)(const OrtKernelInfo* info, const char* name, float* out) noexcept;
    OrtStatus* (*KernelInfoGetAttribute_int64)(const OrtKernelInfo* info, const char* name, int64_t* out) noexcept;
    // out: a buffer of *size bytes (the NUL included); *size becomes the string's size, an error if it does not fit
    OrtStatus* (*KernelInfoGetAttribute_string)(const OrtKernelInfo* info, const char* name, char* out,
                                                size_t* size) noexcept;
    OrtStatus* (*KernelContext_GetInputCount)(const OrtKernelContext* context, size_t* out) noexcept;
    OrtStatus* (*KernelContext_GetInput)(const OrtKernelContext* context, size_t index, const OrtValue** out) noexcept;
    OrtStatus* (*KernelContext_GetOutput)(OrtKernelContext* context, size_t index, const int64_t* dims, size_t count,
                                          OrtValue** out) noexcept;
    void (*ReleaseStatus)(OrtStatus* status) noexcept;
    void (*ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* info) noexcept;

    explicit OrtFunctions(const OrtApi* api) {
        const auto slots = reinterpret_cast<void* const*>(api);
        take(CreateStatus, slots[kApiCreateStatus]);
        take(CreateCustomOpDomain, slots[kApiCreateCustomOpDomain]);
        take(CustomOpDomain_Add, slots[kApiCustomOpDomainAdd]);
        take(AddCustomOpDomain, slots[kApiAddCustomOpDomain]);
        take(GetTensorMutableData, slots[kApiGetTensorMutableData]);
        take(GetTensorElementType, slots[kApiGetTensorElementType]);
        take(GetDimensionsCount, slots[kApiGetDimensionsCount]);
        take(GetDimensions, slots[kApiGetDimensions]);
        take(GetTensorTypeAndShape, slots[kApiGetTensorTypeAndShape]);
        take(KernelInfoGetAttribute_float, slots[kApiKernelInfoGetAttributeFloat]);
        take(KernelInfoGetAttribute_int64, slots[kApiKernelInfoGetAttributeInt64]);
        take(KernelInfoGetAttribute_string, slots[kApiKernelInfoGetAttributeString]);
        take(KernelContext_GetInputCount, slots[kApiKernelContextGetInputCount]);
        take(KernelContext_GetInput, slots[kApiKernelContextGetInput]);
        take(KernelContext_GetOutput, slots[kApiKernelContextGetOutput]);
        take(ReleaseStatus, slots[kApiReleaseStatus]);
        take(ReleaseTensorTypeAndShapeInfo, slots[kApiReleaseTensorTypeAndShapeInfo]);
    }

private:
    template <class Fn>
    static void take(Fn& fn, void* slot) {
        std::memcpy(&fn, &slot, sizeof fn);  // a data pointer to a function pointer, without a strict-aliasing cast
    }
};

// The OrtCustomOp fields ONNX Runtime reads of an op that declares version 16, in their order; the fields of
// later versions follow as null pointers, so a runtime that reads one anyway finds "not provided".
struct OrtCustomOpV16 {
    uint32_t version;
    void* (*CreateKernel)(const OrtCustomOpV16* op, const OrtApi* api, const OrtKernelInfo* info) noexcept;
    const char* (*GetName)(const OrtCustomOpV16* op) noexcept;
    const char* (*GetExecutionProviderType)(const OrtCustomOpV16* op) noexcept;
    int (*GetInputType)(const OrtCustomOpV16* op, size_t index) noexcept;
    size_t (*GetInputTypeCount)(const OrtCustomOpV16* op) noexcept;
    int (*GetOutputType)(const OrtCustomOpV16* op, size_t index) noexcept;
    size_t (*GetOutputTypeCount)(const OrtCustomOpV16* op) noexcept;
    void (*KernelCompute)(void* kernel, OrtKernelContext* context) noexcept;
    void (*KernelDestroy)(void* kernel) noexcept;
    int (*GetInputCharacteristic)(const OrtCustomOpV16* op, size_t index) noexcept;
    int (*GetOutputCharacteristic)(const OrtCustomOpV16* op, size_t index) noexcept;
    int (*GetInputMemoryType)(const OrtCustomOpV16* op, size_t index) noexcept;  // OrtMemType; 0: default
    int (*GetVariadicInputMinArity)(const OrtCustomOpV16* op) noexcept;
    int (*GetVariadicInputHomogeneity)(const OrtCustomOpV16* op) noexcept;
    int (*GetVariadicOutputMinArity)(const OrtCustomOpV16* op) noexcept;
    int (*GetVariadicOutputHomogeneity)(const OrtCustomOpV16* op) noexcept;
    OrtStatus* (*CreateKernelV2)(const OrtCustomOpV16* op, const OrtApi* api, const OrtKernelInfo* info,
                                 void** kernel) noexcept;
    OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context) noexcept;
    void* later_versions[8];  // InferOutputShapeFn (17) and after: not provided
};

}  // namespace
