// MGG's pipeline-centric aggregation kernel (OSDI'23, §3.3-§3.4).
//
// Warp w takes the neighbor partitions w*dist .. w*dist+dist-1 of both kinds and
// interleaves them: LNP k (rows of this PE), then RNP k (rows of peers), for each k.
// A partition holds at most ps in-edges of one destination node.
//
// Remote rows come one of two ways (compile-time MGG_REMOTE_GET):
//   0  p2p: loads through a table of peer base pointers (nvshmem_ptr), no shared memory;
//   1  get: nvshmemx_float_get_nbi_warp into shared memory, double-buffered: the rows of
//      RNP k+1 are in flight while the warp aggregates LNP k+1 and RNP k (Listing 2's
//      layout: ps ids + 2 * ps * D staging floats per warp).
//
// Lanes: for D < 32 a warp splits into 32/L groups of L = next_pow2(D) lanes, each group
// summing a different edge, combined by shuffles at the end; for D >= 32 the warp walks
// 128-column chunks with 16-byte loads (D a multiple of 4, as each head's width), else
// 32-column chunks. Reads of a row are coalesced either way.
//
// The output is initialized (zeros, or (1+eps)*x for GIN) by mgg_init before, and
// divided by the in-degree by mgg_finalize_mean after, for mean. A partition whose node
// is touched by no other warp (excl[k] = 1) adds with plain stores; the others use
// atomicAdd.
//
// Edge weights (compile-time MGG_WEIGHTED=1): local_w / remote_w hold `heads` floats per
// edge, row-major [E, heads] in the partitions' edge order; column j of the output takes
// w[e * heads + j / (dim / heads)] (heads divides dim). heads = 1 is GCN's one weight per
// edge (the plan's normalization); more heads are GAT's per-head attention coefficients.
// Both variants take `heads` as the last argument; the unweighted one ignores it.
//
// Compile-time options: MGG_WEIGHTED (edge weights), MGG_REMOTE_GET (see above).

#ifndef MGG_WEIGHTED
#define MGG_WEIGHTED 0
#endif
#ifndef MGG_REMOTE_GET
#define MGG_REMOTE_GET 0
#endif

#if MGG_REMOTE_GET
#include <nvshmem.h>
#include <nvshmemx.h>
#endif

typedef long long i64;

#define FULL_MASK 0xffffffffu

extern "C" __global__ void mgg_init(const float* __restrict__ x, float* __restrict__ out,
                                    i64 count, float self_scale) {
    // out[i] = self_scale * x[i] over the first `count` floats (self_scale 0: zeros)
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        out[i] = self_scale == 0.0f ? 0.0f : self_scale * x[i];
}

extern "C" __global__ void mgg_finalize_mean(float* __restrict__ out,
                                             const i64* __restrict__ local_indptr,
                                             const i64* __restrict__ remote_indptr,
                                             i64 n, int dim) {
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n * dim; i += stride) {
        i64 v = i / dim;
        i64 deg = local_indptr[v + 1] - local_indptr[v] + remote_indptr[v + 1] -
                  remote_indptr[v];
        if (deg > 0) out[i] /= (float)deg;
    }
}

// lanes per edge group: the next power of two >= dim, at most 32
__device__ __forceinline__ int group_width(int dim) {
    int l = 1;
    while (l < dim && l < 32) l <<= 1;
    return l;
}

__device__ __forceinline__ void emit(float* __restrict__ out, i64 idx, float v, bool excl) {
    if (excl)
        out[idx] += v;
    else
        atomicAdd(out + idx, v);
}

__device__ __forceinline__ float4 load4(const float* p) {
    if (((unsigned long long)p & 15) == 0) return *reinterpret_cast<const float4*>(p);
    return make_float4(p[0], p[1], p[2], p[3]);
}

__device__ __forceinline__ void fma4(float4& acc, float s, float4 v) {
    acc.x += s * v.x;
    acc.y += s * v.y;
    acc.z += s * v.z;
    acc.w += s * v.w;
}

__device__ __forceinline__ void emit4(float* __restrict__ out, i64 idx, float4 v, bool excl) {
    float* p = out + idx;
    const bool aligned = ((unsigned long long)p & 15) == 0;
    if (excl && aligned) {  // one 16-byte store, not four 4-byte ones a sector apart
        float4 o = *reinterpret_cast<float4*>(p);
        fma4(o, 1.0f, v);
        *reinterpret_cast<float4*>(p) = o;
        return;
    }
    if (excl) {
        p[0] += v.x;
        p[1] += v.y;
        p[2] += v.z;
        p[3] += v.w;
        return;
    }
#if __CUDA_ARCH__ >= 900
    if (aligned) {
        atomicAdd(reinterpret_cast<float4*>(p), v);
        return;
    }
#endif
    atomicAdd(p, v.x);
    atomicAdd(p + 1, v.y);
    atomicAdd(p + 2, v.z);
    atomicAdd(p + 3, v.w);
}

// D (and each head's width) a multiple of 4: a lane sums 4 columns with 16-byte loads
// (a warp covers 128 columns a pass), four edges' rows in flight at a time.
template <typename RowFn>
__device__ __forceinline__ void reduce_partition_vec(RowFn row, const float* __restrict__ w,
                                                     i64 e0, i64 e1, float* __restrict__ out,
                                                     i64 node, int dim, bool excl, int lane,
                                                     int heads) {
    for (int j0 = 0; j0 < dim; j0 += 128) {
        const int j = j0 + 4 * lane;
        if (j >= dim) return;
#if MGG_WEIGHTED
        const int h = j / (dim / heads);  // this lane's head (its 4 columns share it)
        auto scale = [&](i64 e) { return w[e * heads + h]; };
#else
        auto scale = [](i64) { return 1.0f; };
#endif
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        i64 e = e0;
        for (; e + 4 <= e1; e += 4) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = load4(row(e + u) + j);
#pragma unroll
            for (int u = 0; u < 4; ++u) fma4(acc, scale(e + u), v[u]);
        }
        for (; e < e1; ++e) fma4(acc, scale(e), load4(row(e) + j));
        emit4(out, node * dim + j, acc, excl);
    }
}

// Sum the rows of edges [e0, e1) into out[node]; row(e) gives the address of an edge's
// source row. Used for local partitions, p2p remote partitions and staged rows. With
// MGG_WEIGHTED, edge e's row is scaled by w[e * heads + h], h the head of the column.
template <typename RowFn>
__device__ __forceinline__ void reduce_partition(RowFn row, const float* __restrict__ w,
                                                 i64 e0, i64 e1, float* __restrict__ out,
                                                 i64 node, int dim, bool excl, int lane,
                                                 int heads) {
    if (dim < 32) {
        const int L = group_width(dim);
        const int groups = 32 / L;
        const int g = lane / L, c = lane % L;
#if MGG_WEIGHTED
        const int h = c < dim ? c / (dim / heads) : 0;  // this lane's head
#endif
        float acc = 0.0f;
        for (i64 e = e0 + g; e < e1; e += groups) {
            if (c < dim) {
#if MGG_WEIGHTED
                acc += w[e * heads + h] * row(e)[c];
#else
                acc += row(e)[c];
#endif
            }
        }
        for (int off = L; off < 32; off <<= 1) acc += __shfl_down_sync(FULL_MASK, acc, off);
        if (g == 0 && c < dim) emit(out, node * dim + c, acc, excl);
        return;
    }
#if MGG_WEIGHTED
    const int width = dim / heads;  // each head's columns (a multiple of 4: so is dim)
#else
    const int width = dim;
#endif
    if ((width & 3) == 0) {
        reduce_partition_vec(row, w, e0, e1, out, node, dim, excl, lane, heads);
        return;
    }
    for (int j0 = 0; j0 < dim; j0 += 32) {
        const int j = j0 + lane;
        float acc = 0.0f;
        if (j < dim) {
#if MGG_WEIGHTED
            const int h = j / (dim / heads);  // this lane's head
#endif
            for (i64 e = e0; e < e1; ++e) {
#if MGG_WEIGHTED
                acc += w[e * heads + h] * row(e)[j];
#else
                acc += row(e)[j];
#endif
            }
            emit(out, node * dim + j, acc, excl);
        }
    }
}

#if !MGG_REMOTE_GET

extern "C" __global__ void mgg_aggregate(
    const float* __restrict__ x,  // this PE's rows [n, dim]
    const i64* __restrict__ lnp_ptr, const int* __restrict__ lnp_node,
    const unsigned char* __restrict__ lnp_excl, i64 n_lnp,
    const int* __restrict__ local_idx, const float* __restrict__ local_w,
    const i64* __restrict__ rnp_ptr, const int* __restrict__ rnp_node,
    const unsigned char* __restrict__ rnp_excl, i64 n_rnp,
    const int* __restrict__ remote_pe, const int* __restrict__ remote_row,
    const float* __restrict__ remote_w,
    const unsigned long long* __restrict__ peer_ptrs,  // base address of each PE's rows
    float* __restrict__ out, int dim, int dist,
    int heads) {  // edge weights per edge (MGG_WEIGHTED; ignored otherwise)
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 k0 = warp * dist;
    for (int i = 0; i < dist; ++i) {
        const i64 k = k0 + i;
        if (k < n_lnp) {
            auto row = [&](i64 e) { return x + (i64)local_idx[e] * dim; };
            reduce_partition(row, local_w, lnp_ptr[k], lnp_ptr[k + 1], out, lnp_node[k], dim,
                             lnp_excl[k], lane, heads);
        }
        if (k < n_rnp) {
            auto row = [&](i64 e) {
                const float* base = (const float*)peer_ptrs[remote_pe[e]];
                return base + (i64)remote_row[e] * dim;
            };
            reduce_partition(row, remote_w, rnp_ptr[k], rnp_ptr[k + 1], out, rnp_node[k], dim,
                             rnp_excl[k], lane, heads);
        }
    }
}

#else  // MGG_REMOTE_GET

// Start fetching the rows of RNP k into staging (rows in edge order); one
// non-blocking warp-collective get per edge.
__device__ __forceinline__ void fetch_partition(const float* sym_x, const i64* rnp_ptr,
                                                const int* remote_pe,
                                                const int* remote_row, i64 k,
                                                float* staging, int dim) {
    for (i64 e = rnp_ptr[k]; e < rnp_ptr[k + 1]; ++e)
        nvshmemx_float_get_nbi_warp(staging + (e - rnp_ptr[k]) * dim,
                                    sym_x + (i64)remote_row[e] * dim, dim, remote_pe[e]);
}

extern "C" __global__ void mgg_aggregate(
    const float* __restrict__ x,  // this PE's rows [n, dim], in the symmetric heap
    const i64* __restrict__ lnp_ptr, const int* __restrict__ lnp_node,
    const unsigned char* __restrict__ lnp_excl, i64 n_lnp,
    const int* __restrict__ local_idx, const float* __restrict__ local_w,
    const i64* __restrict__ rnp_ptr, const int* __restrict__ rnp_node,
    const unsigned char* __restrict__ rnp_excl, i64 n_rnp,
    const int* __restrict__ remote_pe, const int* __restrict__ remote_row,
    const float* __restrict__ remote_w,
    const unsigned long long* __restrict__ peer_ptrs,  // unused: peers are reached by gets
    float* __restrict__ out, int dim, int dist, int ps,
    int heads) {  // edge weights per edge (MGG_WEIGHTED; ignored otherwise)
    // Listing 2: ps ids per warp, then 2 * ps * dim staging floats per warp
    extern __shared__ int part_meta[];
    const int warps_per_block = blockDim.x >> 5;
    const int wib = threadIdx.x >> 5;
    int* ids = part_meta + wib * ps;  // the neighbor ids of the current LNP
    float* staging = (float*)&part_meta[ps * warps_per_block] + (i64)wib * 2 * ps * dim;
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 k0 = warp * dist;
    const i64 k_end = min(k0 + dist, n_rnp);
    if (k0 < k_end) fetch_partition(x, rnp_ptr, remote_pe, remote_row, k0, staging, dim);
    for (int i = 0; i < dist; ++i) {
        const i64 k = k0 + i;
        if (k < n_lnp) {  // overlaps with the gets in flight
            const i64 e0 = lnp_ptr[k], e1 = lnp_ptr[k + 1];
            for (i64 t = lane; t < e1 - e0; t += 32) ids[t] = local_idx[e0 + t];
            __syncwarp();
            auto row = [&](i64 e) { return x + (i64)ids[e - e0] * dim; };
            reduce_partition(row, local_w, e0, e1, out, lnp_node[k], dim, lnp_excl[k], lane,
                             heads);
            __syncwarp();
        }
        if (k < k_end) {
            nvshmem_quiet();  // the rows of RNP k (and anything older) have landed
            __syncwarp();
            float* cur = staging + (i64)(i & 1) * ps * dim;
            if (k + 1 < k_end)  // overlaps with aggregating RNP k and LNP k+1
                fetch_partition(x, rnp_ptr, remote_pe, remote_row, k + 1,
                                staging + (i64)((i + 1) & 1) * ps * dim, dim);
            const i64 e0 = rnp_ptr[k];
            auto row = [&](i64 e) { return cur + (e - e0) * dim; };
            reduce_partition(row, remote_w, e0, rnp_ptr[k + 1], out, rnp_node[k], dim,
                             rnp_excl[k], lane, heads);
            __syncwarp();
        }
    }
}

#endif
