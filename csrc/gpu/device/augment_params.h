/*
 * The augmentation kernel's one argument (fr_augment_rrc), passed by value:
 * cuLaunchKernel copies it at launch, so the host may reuse its copy at
 * once and launches need no device buffer of parameters, no copy and no
 * wait. Shared verbatim by augment.c (C) and the kernel (NVRTC, which
 * compiles it ahead of augment_kernel.cu): plain C types only, no includes.
 * 8 + 8 + 8 + 6 * 4 + 6 * 4 + FR_AUG_CHUNK * 8 bytes: under cuLaunchKernel's
 * 4 KiB of parameters; batches of more samples are launched in chunks.
 */
#ifndef FASTREAD_AUGMENT_PARAMS_H
#define FASTREAD_AUGMENT_PARAMS_H

#define FR_AUG_CHUNK 384
#define FR_AUG_FLIP 0x8000u /* in box[i][3]: mirror sample i horizontally */
#define FR_AUG_MAX_SIDE 32767

typedef struct fr_aug_params {
    unsigned long long src;        /* the first sample's pixels: uint8 HWC, 3 channels */
    unsigned long long src_stride; /* bytes from one sample to the next */
    unsigned long long dst;        /* the first output sample: CHW of out_h x out_w */
    int in_h, in_w;                /* every sample's height and width; rows packed */
    int out_h, out_w;
    int n;     /* samples in this launch (<= FR_AUG_CHUNK) */
    int dtype; /* FR_AUGMENT_FLOAT32, FLOAT16, UINT8 (fastread_augment.h) */
    float scale[3], bias[3];       /* float outputs: pixel * scale[c] + bias[c] */
    /* Sample i's crop: top, left, height, width | FR_AUG_FLIP. */
    unsigned short box[FR_AUG_CHUNK][4];
} fr_aug_params;

#endif
