# The DLPack exchange ABI (https://dmlc.github.io/dlpack/latest/c_api.html),
# unversioned form: what DALI's from_dlpack_list, PyTorch and CuPy consume.
# Declared here rather than included: no dlpack.h is needed at build time.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t

cdef enum:
    kDLCPU = 1
    kDLCUDA = 2

cdef enum:
    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLComplex = 5
    kDLBool = 6

cdef struct DLDevice:
    int32_t device_type  # a C enum in dlpack.h: int-sized
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void *data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t *shape
    int64_t *strides
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void *manager_ctx
    void (*deleter)(DLManagedTensor *) noexcept nogil
