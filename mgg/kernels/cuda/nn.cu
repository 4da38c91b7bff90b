// Element-wise training kernels, the CUDA twins of mgg/kernels/cpu_nn.py:
// dropout keyed by a hash of (key, global row, column) — the same hash, so a GPU run
// draws the CPU run's masks — the same for edges (attention dropout), SDDMM
// (per-edge, per-head dot products), GAT's attention softmax over each destination's
// in-edges (forward, backward), a segment sum by source, and a row gather.
//
// Rows may be bfloat16 (the _bf16 kernels): held as their 16-bit words (NVRTC has no
// cuda_bf16.h), widened exactly, computed in float32 and rounded once to nearest even.

typedef long long i64;
typedef unsigned long long u64;

struct __align__(2) bf16 {  // one bfloat16 by its bits
    unsigned short bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float((unsigned)v.bits << 16); }

// float -> bf16, to nearest even: __float2bfloat16_rn's instruction from compute capability
// 8.0; the same arithmetic by hand before it (these kernels also build for older GPUs)
__device__ __forceinline__ bf16 round_bf16(float f) {
    bf16 h;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
#else
    const unsigned u = __float_as_uint(f);
    h.bits = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)  // NaN
                                             : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
    return h;
}

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ bool keep(u64 key, i64 row, i64 col, i64 ncols,
                                     unsigned int threshold) {
    u64 z = mix64(key + ((u64)row * (u64)ncols + (u64)col + 1ull) * 0x9E3779B97F4A7C15ull);
    return (unsigned int)(z >> 32) >= threshold;
}

// a mask's key: by value, or (key_at not null) read from the device, where a captured
// training step (a CUDA graph, replayed with fixed arguments) finds each step's keys
__device__ __forceinline__ u64 mask_key(const u64* key_at, u64 key) {
    return key_at ? *key_at : key;
}

// out[i, j] = x[i, j] * scale where (key, lb + i, j) survives, else 0
extern "C" __global__ void mgg_dropout_dense(const float* __restrict__ x,
                                             float* __restrict__ out, i64 n, i64 d, u64 key,
                                             i64 lb, unsigned int threshold, float scale,
                                             const u64* __restrict__ key_at) {
    key = mask_key(key_at, key);
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < n * d; t += stride) {
        i64 i = t / d, j = t % d;
        out[t] = keep(key, lb + i, j, d, threshold) ? x[t] * scale : 0.0f;
    }
}

// the same over bf16 rows: the same mask, x * scale in float32 rounded once
extern "C" __global__ void mgg_dropout_dense_bf16(const bf16* __restrict__ x,
                                                  bf16* __restrict__ out, i64 n, i64 d,
                                                  u64 key, i64 lb, unsigned int threshold,
                                                  float scale, const u64* __restrict__ key_at) {
    key = mask_key(key_at, key);
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < n * d; t += stride) {
        i64 i = t / d, j = t % d;
        out[t] = round_bf16(keep(key, lb + i, j, d, threshold) ? to_float(x[t]) * scale : 0.0f);
    }
}

// the stored entries of a CSR matrix (rows lb.., ncols columns), in place
extern "C" __global__ void mgg_dropout_csr(const i64* __restrict__ indptr,
                                           const int* __restrict__ indices,
                                           float* __restrict__ data, i64 n, i64 ncols,
                                           u64 key, i64 lb, unsigned int threshold,
                                           float scale, const u64* __restrict__ key_at) {
    key = mask_key(key_at, key);
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        for (i64 e = indptr[i]; e < indptr[i + 1]; ++e)
            data[e] = keep(key, lb + i, indices[e], ncols, threshold) ? data[e] * scale : 0.0f;
}

// out[e, h] = scale where edge e (src[e] -> dst[e], global ids) survives in head h, else 0:
// keyed by (key, dst, src * heads + h) over num_nodes * heads columns, as cpu_nn's
extern "C" __global__ void mgg_edge_dropout(const i64* __restrict__ dst,
                                            const i64* __restrict__ src,
                                            float* __restrict__ out, i64 n_edges, int heads,
                                            i64 num_nodes, u64 key, unsigned int threshold,
                                            float scale, const u64* __restrict__ key_at) {
    key = mask_key(key_at, key);
    const i64 total = n_edges * heads, ncols = num_nodes * heads;
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const i64 e = t / heads, h = t % heads;
        out[t] = keep(key, dst[e], src[e] * heads + h, ncols, threshold) ? scale : 0.0f;
    }
}

// SDDMM over a CSR (indptr [n+1], indices [E]): out[e, h] = <a[v, hC:(h+1)C],
// b[indices[e], hC:(h+1)C]> for the edges e of row v; a [n, heads*C], b [R, heads*C]
// (float32, or bf16: mgg_sddmm_bf16); out float32, summed in float32.
// One warp per row; its lanes take the row's (edge, head) pairs in order, so the lanes
// of one edge read its source row's heads side by side and the stores are contiguous.
template <typename T>
__device__ __forceinline__ void sddmm(const i64* __restrict__ indptr,
                                      const int* __restrict__ indices, const T* __restrict__ a,
                                      const T* __restrict__ b, float* __restrict__ out, i64 n,
                                      int heads, int c) {
    const int lane = threadIdx.x & 31;
    const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
    const i64 width = (i64)heads * c;
    for (i64 v = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; v < n; v += warps) {
        const i64 e0 = indptr[v], pairs = (indptr[v + 1] - e0) * heads;
        for (i64 t = lane; t < pairs; t += 32) {
            const i64 e = e0 + t / heads;
            const int h = (int)(t % heads);
            const T* x = a + v * width + h * c;
            const T* y = b + (i64)indices[e] * width + h * c;
            float acc = 0.0f;
            for (int j = 0; j < c; ++j) acc += to_float(x[j]) * to_float(y[j]);
            out[e * heads + h] = acc;
        }
    }
}

extern "C" __global__ void mgg_sddmm(const i64* __restrict__ indptr,
                                     const int* __restrict__ indices,
                                     const float* __restrict__ a, const float* __restrict__ b,
                                     float* __restrict__ out, i64 n, i64 n_edges, int heads,
                                     int c) {
    sddmm(indptr, indices, a, b, out, n, heads, c);
}

extern "C" __global__ void mgg_sddmm_bf16(const i64* __restrict__ indptr,
                                          const int* __restrict__ indices,
                                          const bf16* __restrict__ a, const bf16* __restrict__ b,
                                          float* __restrict__ out, i64 n, i64 n_edges,
                                          int heads, int c) {
    sddmm(indptr, indices, a, b, out, n, heads, c);
}

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)  // NVRTC has no math.h: -inf by its bits

__device__ __forceinline__ float leaky(float x, float slope) { return x > 0.0f ? x : x * slope; }

__device__ __forceinline__ float warp_sum(float x) {
    for (int off = 16; off; off >>= 1) x += __shfl_xor_sync(FULL_MASK, x, off);
    return x;
}

// The t-th in-edge of row v: its local edges lp[v]..lp[v+1], then its remote ones
// el + rp[v]..el + rp[v+1].
__device__ __forceinline__ i64 nth_edge(const i64* lp, const i64* rp, i64 el, i64 v, i64 t) {
    const i64 nl = lp[v + 1] - lp[v];
    return t < nl ? lp[v] + t : el + rp[v] + (t - nl);
}

// alpha[e, h] = softmax over the in-edges e of v of LeakyReLU(a_all[src[e], h] + a_dst[v, h]).
// One warp per destination; each lane keeps an online (max, sum) over its edges
// (rescaling the sum when the max grows), the warp merges them, then writes alpha.
extern "C" __global__ void mgg_gat_softmax(const i64* __restrict__ lp, const i64* __restrict__ rp,
                                           const i64* __restrict__ src,
                                           const float* __restrict__ a_all,
                                           const float* __restrict__ a_dst,
                                           float* __restrict__ alpha, i64 n, int heads,
                                           float slope) {
    const int lane = threadIdx.x & 31;
    const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
    const i64 el = lp[n];
    for (i64 v = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; v < n; v += warps) {
        const i64 deg = lp[v + 1] - lp[v] + rp[v + 1] - rp[v];
        for (int h = 0; h < heads; ++h) {
            const float ad = a_dst[v * heads + h];
            float m = NEG_INF, s = 0.0f;
            for (i64 t = lane; t < deg; t += 32) {
                const float x = leaky(a_all[src[nth_edge(lp, rp, el, v, t)] * heads + h] + ad, slope);
                if (x > m) {
                    s = s * expf(m - x) + 1.0f;  // m = -inf: s is 0
                    m = x;
                } else {
                    s += expf(x - m);
                }
            }
            for (int off = 16; off; off >>= 1) {
                const float m2 = __shfl_xor_sync(FULL_MASK, m, off);
                const float s2 = __shfl_xor_sync(FULL_MASK, s, off);
                const float mm = fmaxf(m, m2);
                if (mm != NEG_INF)
                    s = (m == NEG_INF ? 0.0f : s * expf(m - mm)) +
                        (m2 == NEG_INF ? 0.0f : s2 * expf(m2 - mm));
                m = mm;
            }
            const float inv = 1.0f / s;
            for (i64 t = lane; t < deg; t += 32) {
                const i64 e = nth_edge(lp, rp, el, v, t);
                const float x = leaky(a_all[src[e] * heads + h] + ad, slope);
                alpha[e * heads + h] = expf(x - m) * inv;
            }
        }
    }
}

// The backward of mgg_gat_softmax: dscore[e, h] = alpha (dalpha - sum_e' alpha dalpha) *
// LeakyReLU'(score), da_dst[v, h] = sum over v's edges of dscore. One warp per destination.
extern "C" __global__ void mgg_gat_softmax_backward(
    const i64* __restrict__ lp, const i64* __restrict__ rp, const i64* __restrict__ src,
    const float* __restrict__ a_all, const float* __restrict__ a_dst,
    const float* __restrict__ alpha, const float* __restrict__ dalpha,
    float* __restrict__ dscore, float* __restrict__ da_dst, i64 n, int heads, float slope) {
    const int lane = threadIdx.x & 31;
    const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
    const i64 el = lp[n];
    for (i64 v = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; v < n; v += warps) {
        const i64 deg = lp[v + 1] - lp[v] + rp[v + 1] - rp[v];
        for (int h = 0; h < heads; ++h) {
            float dot = 0.0f;
            for (i64 t = lane; t < deg; t += 32) {
                const i64 e = nth_edge(lp, rp, el, v, t);
                dot += alpha[e * heads + h] * dalpha[e * heads + h];
            }
            dot = warp_sum(dot);
            const float ad = a_dst[v * heads + h];
            float acc = 0.0f;
            for (i64 t = lane; t < deg; t += 32) {
                const i64 e = nth_edge(lp, rp, el, v, t);
                const float x = a_all[src[e] * heads + h] + ad;
                const float d = alpha[e * heads + h] * (dalpha[e * heads + h] - dot) *
                                (x > 0.0f ? 1.0f : slope);
                dscore[e * heads + h] = d;
                acc += d;
            }
            acc = warp_sum(acc);
            if (lane == 0) da_dst[v * heads + h] = acc;
        }
    }
}

// out[s, h] = sum of values[perm[k], h] over k in ptr[s]..ptr[s+1]: one warp per segment,
// a fixed order of additions (no atomics).
extern "C" __global__ void mgg_segment_sum(const i64* __restrict__ ptr,
                                           const i64* __restrict__ perm,
                                           const float* __restrict__ values,
                                           float* __restrict__ out, i64 segments, int heads) {
    const int lane = threadIdx.x & 31;
    const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 s = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; s < segments; s += warps) {
        for (int h = 0; h < heads; ++h) {
            float acc = 0.0f;
            for (i64 k = ptr[s] + lane; k < ptr[s + 1]; k += 32) acc += values[perm[k] * heads + h];
            acc = warp_sum(acc);
            if (lane == 0) out[s * heads + h] = acc;
        }
    }
}

// out[i, :] = x[src[i], :] for i < H; a row is q units of 16, 4 or 2 bytes (the widest
// the row's bytes and the pointers allow; bits copied, whatever the rows hold), units = H * q
template <typename T>
__device__ __forceinline__ void gather(const T* __restrict__ x, const i64* __restrict__ src,
                                       T* __restrict__ out, i64 units, int q) {
    const i64 step = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < units; t += step) {
        const i64 i = t / q;
        out[t] = x[src[i] * q + (t - i * q)];
    }
}

extern "C" __global__ void mgg_gather_rows4(const float4* __restrict__ x,
                                            const i64* __restrict__ src,
                                            float4* __restrict__ out, i64 units, int q) {
    gather(x, src, out, units, q);
}

extern "C" __global__ void mgg_gather_rows1(const float* __restrict__ x,
                                            const i64* __restrict__ src,
                                            float* __restrict__ out, i64 units, int q) {
    gather(x, src, out, units, q);
}

extern "C" __global__ void mgg_gather_rows_half(const unsigned short* __restrict__ x,
                                                const i64* __restrict__ src,
                                                unsigned short* __restrict__ out, i64 units,
                                                int q) {
    gather(x, src, out, units, q);
}
