// The fused augmentation kernel (csrc/gpu/augment.c compiles it with NVRTC,
// after augment_params.h): for every output pixel of every sample, the
// sample's crop box resampled bilinearly to out_h x out_w (pixel centres
// at +0.5, align_corners=False, edges clamped: torch's
// interpolate(mode="bilinear", antialias=False)), mirrored when the box
// says so, normalized per channel and written channels-first. One thread
// per output pixel (all three channels): neighbouring threads write
// neighbouring addresses of each plane; the 2 x 2 source pixels they read
// overlap and come from L1/L2.

__device__ __forceinline__ unsigned short fr_f32_to_f16(float v)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

extern "C" __global__ void fr_augment_rrc(const fr_aug_params p)
{
    const unsigned long long plane = (unsigned long long)p.out_h * p.out_w;
    const unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= plane * (unsigned long long)p.n)
        return;
    const int s = (int)(idx / plane);
    const int r = (int)(idx - (unsigned long long)s * plane);
    const int oy = r / p.out_w;
    const int ox = r - oy * p.out_w;
    const int top = p.box[s][0], left = p.box[s][1], bh = p.box[s][2];
    const int bw = p.box[s][3] & 0x7fff;
    const bool flip = (p.box[s][3] & FR_AUG_FLIP) != 0;
    // The output column ox shows column (out_w - 1 - ox) of the resized crop when mirrored.
    const int cx = flip ? p.out_w - 1 - ox : ox;

    float fy = ((float)oy + 0.5f) * ((float)bh / (float)p.out_h) - 0.5f;
    float fx = ((float)cx + 0.5f) * ((float)bw / (float)p.out_w) - 0.5f;
    fy = fmaxf(fy, 0.0f);
    fx = fmaxf(fx, 0.0f);
    int y0 = min((int)fy, bh - 1), x0 = min((int)fx, bw - 1);
    const int y1 = min(y0 + 1, bh - 1), x1 = min(x0 + 1, bw - 1);
    const float ly = fy - (float)y0, lx = fx - (float)x0;

    const unsigned char *img =
        (const unsigned char *)(p.src + (unsigned long long)s * p.src_stride);
    const long long row = 3LL * p.in_w;
    const unsigned char *r0 = img + (long long)(top + y0) * row;
    const unsigned char *r1 = img + (long long)(top + y1) * row;
    const int c0 = 3 * (left + x0), c1 = 3 * (left + x1);

    const unsigned long long out0 = (unsigned long long)s * 3 * plane + (unsigned long long)r;
#pragma unroll
    for (int c = 0; c < 3; c++) {
        const float top_v = (float)r0[c0 + c] + lx * ((float)r0[c1 + c] - (float)r0[c0 + c]);
        const float bot_v = (float)r1[c0 + c] + lx * ((float)r1[c1 + c] - (float)r1[c0 + c]);
        const float v = top_v + ly * (bot_v - top_v);
        const unsigned long long o = out0 + (unsigned long long)c * plane;
        if (p.dtype == 0) {
            ((float *)p.dst)[o] = v * p.scale[c] + p.bias[c];
        } else if (p.dtype == 1) {
            ((unsigned short *)p.dst)[o] = fr_f32_to_f16(v * p.scale[c] + p.bias[c]);
        } else {
            ((unsigned char *)p.dst)[o] = (unsigned char)fminf(fmaxf(rintf(v), 0.0f), 255.0f);
        }
    }
}
