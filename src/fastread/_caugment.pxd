# Declarations of the augmentation API (csrc/include/fastread_augment.h). Logic lives in _augment.pyx.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t


cdef extern from "fastread_augment.h" nogil:
    enum:
        FR_AUGMENT_FLOAT32
        FR_AUGMENT_FLOAT16
        FR_AUGMENT_UINT8

    ctypedef struct fr_augment_crop:
        double scale[2]
        double ratio[2]
        double flip

    int fr_augment_crop_params(uint64_t seed, uint64_t epoch, const int64_t *indices, size_t n,
                               int height, int width, const fr_augment_crop *crop,
                               int32_t *boxes, uint8_t *flips, char *err, size_t err_len)

    ctypedef struct fr_augment:
        pass

    int fr_augment_open(int device, const char *nvrtc_path, const char *cache_dir,
                        fr_augment **out, char *err, size_t err_len)
    void fr_augment_close(fr_augment *aug)
    const char *fr_augment_kernel_source(const fr_augment *aug)

    ctypedef struct fr_augment_batch:
        uint64_t src
        uint64_t src_stride
        int height
        int width
        uint64_t dst
        int out_height
        int out_width
        int dtype
        size_t n
        const int32_t *boxes
        const uint8_t *flips
        float mean[3]
        float std[3]
        void *stream

    int fr_augment_run(fr_augment *aug, const fr_augment_batch *b, char *err, size_t err_len)
    int fr_augment_run_host(const fr_augment_batch *b, unsigned threads, char *err,
                            size_t err_len)

