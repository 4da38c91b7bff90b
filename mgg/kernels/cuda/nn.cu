// Element-wise training kernels, the CUDA twins of mgg/kernels/cpu_nn.py:
// dropout keyed by a hash of (key, global row, column) — the same hash, so a GPU run
// draws the CPU run's masks — the same for edges (attention dropout), and SDDMM
// (per-edge, per-head dot products).

typedef long long i64;
typedef unsigned long long u64;

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

// out[i, j] = x[i, j] * scale where (key, lb + i, j) survives, else 0
extern "C" __global__ void mgg_dropout_dense(const float* __restrict__ x,
                                             float* __restrict__ out, i64 n, i64 d, u64 key,
                                             i64 lb, unsigned int threshold, float scale) {
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < n * d; t += stride) {
        i64 i = t / d, j = t % d;
        out[t] = keep(key, lb + i, j, d, threshold) ? x[t] * scale : 0.0f;
    }
}

// the stored entries of a CSR matrix (rows lb.., ncols columns), in place
extern "C" __global__ void mgg_dropout_csr(const i64* __restrict__ indptr,
                                           const int* __restrict__ indices,
                                           float* __restrict__ data, i64 n, i64 ncols,
                                           u64 key, i64 lb, unsigned int threshold,
                                           float scale) {
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
                                            float scale) {
    const i64 total = n_edges * heads, ncols = num_nodes * heads;
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const i64 e = t / heads, h = t % heads;
        out[t] = keep(key, dst[e], src[e] * heads + h, ncols, threshold) ? scale : 0.0f;
    }
}

// SDDMM over a CSR (indptr [n+1], indices [E]): out[e, h] = <a[v, hC:(h+1)C],
// b[indices[e], hC:(h+1)C]> for the edges e of row v; a [n, heads*C], b [R, heads*C].
// One thread per (edge, head); the row is found by binary search over indptr.
extern "C" __global__ void mgg_sddmm(const i64* __restrict__ indptr,
                                     const int* __restrict__ indices,
                                     const float* __restrict__ a, const float* __restrict__ b,
                                     float* __restrict__ out, i64 n, i64 n_edges, int heads,
                                     int c) {
    const i64 total = n_edges * heads, width = (i64)heads * c;
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const i64 e = t / heads, h = t % heads;
        i64 lo = 0, hi = n - 1;  // the last row v with indptr[v] <= e (its edges hold e)
        while (lo < hi) {
            const i64 mid = (lo + hi + 1) >> 1;
            if (indptr[mid] <= e)
                lo = mid;
            else
                hi = mid - 1;
        }
        const float* x = a + lo * width + h * c;
        const float* y = b + (i64)indices[e] * width + h * c;
        float acc = 0.0f;
        for (int j = 0; j < c; ++j) acc += x[j] * y[j];
        out[t] = acc;
    }
}
