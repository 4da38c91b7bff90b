// Element-wise training kernels, the CUDA twins of mgg/kernels/cpu_nn.py:
// dropout keyed by a hash of (key, global row, column) — the same hash, so a GPU run
// draws the CPU run's masks — and a fused softmax cross-entropy over a node mask.

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

// One thread per row: grad = softmax - onehot on masked rows (0 elsewhere);
// stats[0] += -log p(y), stats[1] += 1, stats[2] += (argmax == y)
extern "C" __global__ void mgg_softmax_ce(const float* __restrict__ logits,
                                          const i64* __restrict__ y,
                                          const bool* __restrict__ mask,
                                          float* __restrict__ grad, double* stats, i64 n,
                                          int c) {
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float* row = logits + i * c;
        float* g = grad + i * c;
        if (!mask[i]) {
            for (int j = 0; j < c; ++j) g[j] = 0.0f;
            continue;
        }
        int best = 0;
        for (int j = 1; j < c; ++j)
            if (row[j] > row[best]) best = j;
        const float top = row[best];
        double total = 0.0;
        for (int j = 0; j < c; ++j) {
            float e = expf(row[j] - top);
            g[j] = e;
            total += e;
        }
        const float inv = (float)(1.0 / total);
        for (int j = 0; j < c; ++j) g[j] *= inv;
        const i64 yi = y[i];
        g[yi] -= 1.0f;
        atomicAdd(stats, log(total) - (double)(row[yi] - top));
        atomicAdd(stats + 1, 1.0);
        if (best == yi) atomicAdd(stats + 2, 1.0);
    }
}
