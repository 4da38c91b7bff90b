// MGG's pipeline-centric aggregation kernel (OSDI'23, §3.3-§3.4).
//
// Warp w takes the neighbor partitions w*dist .. w*dist+dist-1 of both kinds and
// interleaves them: LNP k (rows of this PE), then RNP k (rows of peers), for each k.
// A partition holds at most ps in-edges of one destination node.
//
// Rows (compile-time MGG_BF16): float32, or bfloat16 (1), read as their 16-bit words and
// widened exactly to float32; either way sums are float32. A bf16 kernel sums into a
// float32 accumulator (the launcher's ``acc``), which mgg_round then rounds once, to
// nearest even, into the bf16 output (after the division by the in-degree, for mean).
// A launch may take the partitions of one range of destination rows only, from row0:
// node v sums into out[v - row0], so the accumulator holds that range's rows alone.
// NVRTC has no cuda_bf16.h: bf16 is spelled by its bits here, and rounded by the
// instruction __float2bfloat16_rn compiles to (cvt.rn.bf16.f32, compute capability 8.0).
//
// Remote rows come one of two ways (compile-time MGG_REMOTE_GET):
//   0  p2p: loads through a table of peer base pointers (nvshmem_ptr), no shared memory;
//   1  get: nvshmemx_float_get_nbi_warp (bf16: nvshmemx_getmem_nbi_warp of 2 * D bytes)
//      into shared memory, double-buffered: the rows of RNP k+1 are in flight while the
//      warp aggregates LNP k+1 and RNP k (Listing 2's layout: ps ids per warp, all warps'
//      rounded up to 4, then 2 * ps * D staging rows' elements per warp).
//
// Lanes, by width class (compile-time MGG_VEC and MGG_WIDTH, which the launcher picks
// from D and the row's bytes: width_class in occupancy.py). A lane loads VEC elements at
// once. float32: 4 (16-byte loads; D and each head's width multiples of 4) or 1. bf16: 8
// (16-byte loads; multiples of 8), 2 (4-byte loads; even) or 1. A class of width W lays a row out
// as SLOTS = W / VEC vectors, a power of two up to 64:
//   SLOTS <= 32: a warp splits into 32 / SLOTS groups of SLOTS lanes, each group summing
//     a different edge, combined by shuffles at the end (D = 16: 4 lanes, 8 edges at once);
//   SLOTS = 32 or 64: the warp sums one edge at a time, each lane CHUNKS = SLOTS / 32
//     vectors of its row, 32 * VEC columns apart (D = 256: two float4 a lane; in bf16,
//     D = 128 is 16 lanes of 8 elements, two edges at once).
// W = 0 is the generic kernel for any D: slabs of 64 vectors, one pass over the edges each.
// D may be less than W (the lanes past D idle); the launcher never passes more. A lane
// keeps its accumulators, its columns and their heads in registers, and has INFLIGHT
// rows in flight, their ids loaded first (whole steps unpredicated, then the last,
// partial one). Reads of a row are coalesced either way.
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
// MGG_WEIGHTED=2 (GCN's normalization where it factors: the plan's norm and halo_norm):
// no weight per edge is held. local_w is the norm [n] of this PE's rows, remote_w the
// halo's [H], remote_slot [Er] each remote edge's halo slot; edge u -> v weighs
// norm(u) * local_w[v]: a partition of node v sums norm(u) x_u, then scales its sum by
// local_w[v]. heads is 1; the other variants pass remote_slot null.
//
// Compile-time options: MGG_WEIGHTED (edge weights), MGG_REMOTE_GET (see above), MGG_BF16
// (bf16 rows), MGG_VEC and MGG_WIDTH (the width class; by default 1 and 0: the generic
// scalar kernel), and MGG_EVERY_CLASS (the compile tests: X(vec, W) ... instantiates each
// class's kernel).

#ifndef MGG_WEIGHTED
#define MGG_WEIGHTED 0
#endif
#ifndef MGG_REMOTE_GET
#define MGG_REMOTE_GET 0
#endif
#ifndef MGG_VEC
#define MGG_VEC 1
#endif
#ifndef MGG_WIDTH
#define MGG_WIDTH 0
#endif
#ifndef MGG_BF16
#define MGG_BF16 0
#endif
#if MGG_BF16 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "MGG_BF16: bfloat16 rows need compute capability 8.0 or newer"
#endif

#if MGG_REMOTE_GET
#include <nvshmem.h>
#include <nvshmemx.h>
#endif

typedef long long i64;

#define FULL_MASK 0xffffffffu

// ---- row elements: float, or bf16 by its bits ----------------------------------------------
struct __align__(2) bf16 {  // one bfloat16
    unsigned short bits;
};
struct __align__(4) bf16x2 {  // two, element 0 in the low half (little-endian)
    unsigned int bits;
};
struct __align__(16) bf16x8 {  // eight: one 16-byte load
    uint4 bits;
};

#if MGG_BF16
typedef bf16 row_t;
#else
typedef float row_t;
#endif

// bf16 -> float is exact: the bits of the float's upper half
__device__ __forceinline__ float lo_half(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_half(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return lo_half(v.bits); }

#if MGG_BF16
// float -> bf16, rounded to nearest even (NaN stays NaN, overflow becomes inf)
__device__ __forceinline__ unsigned short round_bf16(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

extern "C" __global__ void mgg_init(const row_t* __restrict__ x, float* __restrict__ out,
                                    i64 count, float self_scale) {
    // out[i] = self_scale * x[i] over the first `count` elements (self_scale 0: zeros),
    // in float32 (bf16: into the accumulator)
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        out[i] = self_scale == 0.0f ? 0.0f : self_scale * to_float(x[i]);
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

#if MGG_BF16
// out[i] = acc[i] rounded once to bf16, over n * dim elements; mean (non-zero): divided by
// the in-degree first, in float32
extern "C" __global__ void mgg_round(const float* __restrict__ acc, bf16* __restrict__ out,
                                     const i64* __restrict__ local_indptr,
                                     const i64* __restrict__ remote_indptr, i64 n, int dim,
                                     int mean) {
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n * dim; i += stride) {
        float v = acc[i];
        if (mean) {
            i64 u = i / dim;
            i64 deg = local_indptr[u + 1] - local_indptr[u] + remote_indptr[u + 1] -
                      remote_indptr[u];
            if (deg > 0) v /= (float)deg;
        }
        out[i].bits = round_bf16(v);
    }
}
#endif

// ---- one lane's VEC elements: what it loads (raw) and sums them in (acc) --------------------
struct float8 {
    float4 lo, hi;
};
template <int V>
struct AccOf {  // float, float2, float4, float8
    typedef float4 T;
};
template <>
struct AccOf<1> {
    typedef float T;
};
template <>
struct AccOf<2> {
    typedef float2 T;
};
template <>
struct AccOf<8> {
    typedef float8 T;
};
template <typename E, int V>
struct RawOf {  // float rows: the accumulator's type; bf16 rows: their words
    typedef typename AccOf<V>::T T;
};
template <>
struct RawOf<bf16, 1> {
    typedef bf16 T;
};
template <>
struct RawOf<bf16, 2> {
    typedef bf16x2 T;
};
template <>
struct RawOf<bf16, 8> {
    typedef bf16x8 T;
};

__device__ __forceinline__ void zero(float& a) { a = 0.0f; }
__device__ __forceinline__ void zero(float2& a) { a = make_float2(0.0f, 0.0f); }
__device__ __forceinline__ void zero(float4& a) { a = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
__device__ __forceinline__ void zero(float8& a) {
    zero(a.lo);
    zero(a.hi);
}
__device__ __forceinline__ void zero(bf16& a) { a.bits = 0; }
__device__ __forceinline__ void zero(bf16x2& a) { a.bits = 0u; }
__device__ __forceinline__ void zero(bf16x8& a) { a.bits = make_uint4(0u, 0u, 0u, 0u); }

__device__ __forceinline__ void fma_to(float& acc, float s, float v) { acc += s * v; }
__device__ __forceinline__ void fma_to(float4& acc, float s, float4 v) {
    acc.x += s * v.x;
    acc.y += s * v.y;
    acc.z += s * v.z;
    acc.w += s * v.w;
}

// bf16 words, widened
__device__ __forceinline__ void fma_to(float& acc, float s, bf16 v) { acc += s * to_float(v); }
__device__ __forceinline__ void fma_to(float2& acc, float s, bf16x2 v) {
    acc.x += s * lo_half(v.bits);
    acc.y += s * hi_half(v.bits);
}
__device__ __forceinline__ void fma_to(float4& acc, float s, unsigned int w0, unsigned int w1) {
    acc.x += s * lo_half(w0);
    acc.y += s * hi_half(w0);
    acc.z += s * lo_half(w1);
    acc.w += s * hi_half(w1);
}
__device__ __forceinline__ void fma_to(float8& acc, float s, bf16x8 v) {
    fma_to(acc.lo, s, v.bits.x, v.bits.y);
    fma_to(acc.hi, s, v.bits.z, v.bits.w);
}

__device__ __forceinline__ void add_to(float& acc, float v) { acc += v; }
__device__ __forceinline__ void add_to(float4& acc, float4 v) { fma_to(acc, 1.0f, v); }
__device__ __forceinline__ void add_to(float& acc, bf16 v) { acc += to_float(v); }
__device__ __forceinline__ void add_to(float2& acc, bf16x2 v) { fma_to(acc, 1.0f, v); }
__device__ __forceinline__ void add_to(float8& acc, bf16x8 v) { fma_to(acc, 1.0f, v); }

__device__ __forceinline__ void scale_by(float& a, float s) { a *= s; }
__device__ __forceinline__ void scale_by(float2& a, float s) {
    a.x *= s;
    a.y *= s;
}
__device__ __forceinline__ void scale_by(float4& a, float s) {
    a.x *= s;
    a.y *= s;
    a.z *= s;
    a.w *= s;
}
__device__ __forceinline__ void scale_by(float8& a, float s) {
    scale_by(a.lo, s);
    scale_by(a.hi, s);
}

__device__ __forceinline__ void add_shfl_down(float& a, int off) {
    a += __shfl_down_sync(FULL_MASK, a, off);
}
__device__ __forceinline__ void add_shfl_down(float4& a, int off) {
    a.x += __shfl_down_sync(FULL_MASK, a.x, off);
    a.y += __shfl_down_sync(FULL_MASK, a.y, off);
    a.z += __shfl_down_sync(FULL_MASK, a.z, off);
    a.w += __shfl_down_sync(FULL_MASK, a.w, off);
}
__device__ __forceinline__ void add_shfl_down(float2& a, int off) {
    a.x += __shfl_down_sync(FULL_MASK, a.x, off);
    a.y += __shfl_down_sync(FULL_MASK, a.y, off);
}
__device__ __forceinline__ void add_shfl_down(float8& a, int off) {
    add_shfl_down(a.lo, off);
    add_shfl_down(a.hi, off);
}

// GLOBAL: p is in global memory the kernel does not write (rows of x, of peers): the
// read-only path; else anywhere (the get mode's staging in shared memory)
template <bool GLOBAL, typename U>
__device__ __forceinline__ U ld(const U* p) {
    if constexpr (GLOBAL)
        return __ldg(p);
    else
        return *p;
}

template <bool GLOBAL>
__device__ __forceinline__ void load(float& v, const float* p, bool) {
    v = ld<GLOBAL>(p);
}
// aligned: p is 16-byte aligned (each of a lane's columns is where its row's start is)
template <bool GLOBAL>
__device__ __forceinline__ void load(float4& v, const float* p, bool aligned) {
    if (aligned) {
        const float4* q = reinterpret_cast<const float4*>(p);
        if constexpr (GLOBAL)
            v = __ldg(q);
        else
            v = *q;
    } else {
        v = make_float4(ld<GLOBAL>(p), ld<GLOBAL>(p + 1), ld<GLOBAL>(p + 2), ld<GLOBAL>(p + 3));
    }
}
// bf16: aligned, p is 4-byte (bf16x2) or 16-byte (bf16x8) aligned
template <bool GLOBAL>
__device__ __forceinline__ void load(bf16& v, const bf16* p, bool) {
    v.bits = ld<GLOBAL>(&p->bits);
}
template <bool GLOBAL>
__device__ __forceinline__ unsigned int ld_pair(const bf16* p) {  // p[0], p[1] in one word
    return (unsigned int)ld<GLOBAL>(&p[0].bits) | (unsigned int)ld<GLOBAL>(&p[1].bits) << 16;
}
template <bool GLOBAL>
__device__ __forceinline__ void load(bf16x2& v, const bf16* p, bool aligned) {
    v.bits = aligned ? ld<GLOBAL>(reinterpret_cast<const unsigned int*>(p)) : ld_pair<GLOBAL>(p);
}
template <bool GLOBAL>
__device__ __forceinline__ void load(bf16x8& v, const bf16* p, bool aligned) {
    if (aligned)
        v.bits = ld<GLOBAL>(reinterpret_cast<const uint4*>(p));
    else
        v.bits = make_uint4(ld_pair<GLOBAL>(p), ld_pair<GLOBAL>(p + 2), ld_pair<GLOBAL>(p + 4),
                            ld_pair<GLOBAL>(p + 6));
}

__device__ __forceinline__ void emit(float* __restrict__ out, i64 idx, float v, bool excl) {
    if (excl)
        out[idx] += v;
    else
        atomicAdd(out + idx, v);
}

__device__ __forceinline__ void emit(float* __restrict__ out, i64 idx, float4 v, bool excl) {
    float* p = out + idx;
    const bool aligned = ((unsigned long long)p & 15) == 0;
    if (excl && aligned) {  // one 16-byte store, not four 4-byte ones a sector apart
        float4 o = *reinterpret_cast<float4*>(p);
        add_to(o, v);
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

__device__ __forceinline__ void emit(float* __restrict__ out, i64 idx, float2 v, bool excl) {
    float* p = out + idx;
    const bool aligned = ((unsigned long long)p & 7) == 0;
    if (excl && aligned) {
        float2 o = *reinterpret_cast<float2*>(p);
        o.x += v.x;
        o.y += v.y;
        *reinterpret_cast<float2*>(p) = o;
        return;
    }
    if (excl) {
        p[0] += v.x;
        p[1] += v.y;
        return;
    }
#if __CUDA_ARCH__ >= 900
    if (aligned) {
        atomicAdd(reinterpret_cast<float2*>(p), v);
        return;
    }
#endif
    atomicAdd(p, v.x);
    atomicAdd(p + 1, v.y);
}

__device__ __forceinline__ void emit(float* __restrict__ out, i64 idx, float8 v, bool excl) {
    emit(out, idx, v.lo, excl);
    emit(out, idx + 4, v.hi, excl);
}

// ---- a width class -------------------------------------------------------------------------
template <typename T, int V, int W>
struct Layout {
    static constexpr int VEC = V;
    static constexpr int WIDTH = W;
    static constexpr int SLOTS = W ? W / V : 64;  // vectors of a row (W = 0: of a slab)
    static constexpr int LANES = SLOTS < 32 ? SLOTS : 32;  // lanes on one edge's row
    static constexpr int GROUPS = 32 / LANES;              // edges a warp sums at once
    static constexpr int CHUNKS = SLOTS / LANES;           // vectors a lane sums of a row
    static constexpr int CHUNK_COLS = 32 * V;              // columns between them
    static constexpr int BYTES = V * (int)sizeof(T);       // of a vector
    // rows a lane has in flight: 16 registers of them at most (float: 16 floats)
    static constexpr int WORDS = (BYTES + 3) / 4 * CHUNKS;  // registers a row's loads fill
    static constexpr int INFLIGHT = WORDS <= 4 ? 4 : 16 / WORDS;
    typedef T row;
    typedef typename AccOf<V>::T acc;
    typedef typename RawOf<T, V>::T raw;
    static_assert(sizeof(T) == 4 ? V == 1 || V == 4 : V == 1 || V == 2 || V == 8,
                  "MGG_VEC must be 1 or 4 (float rows), or 1, 2 or 8 (MGG_BF16 rows)");
    static_assert(W >= 0 && W % V == 0 && SLOTS >= 1 && (SLOTS <= 32 ? 32 % SLOTS == 0
                                                                     : SLOTS == 64),
                  "MGG_WIDTH must be a width class: VEC times a power of two up to 64, or 0");
};

// A lane's columns in one slab (the whole row but for W = 0)
template <class C>
struct Cols {
    int col;  // the first of the lane's VEC columns; chunk k's is col + k * CHUNK_COLS
    int on;   // chunks k < on are within D
#if MGG_WEIGHTED
    int head[C::CHUNKS];  // the head of chunk k's columns (a head's width a multiple of VEC)
#endif
};

template <class C>
__device__ __forceinline__ Cols<C> lane_cols(int lane, int j0, int dim, int heads) {
    Cols<C> c;
    c.col = j0 + lane % C::LANES * C::VEC;
    c.on = 0;
#pragma unroll
    for (int k = 0; k < C::CHUNKS; ++k) c.on += c.col + k * C::CHUNK_COLS < dim;
#if MGG_WEIGHTED
    const int width = dim / heads;
#pragma unroll
    for (int k = 0; k < C::CHUNKS; ++k)
        c.head[k] = k < c.on ? (c.col + k * C::CHUNK_COLS) / width : 0;
#endif
    return c;
}

// Add the rows of the INFLIGHT edges t, t + GROUPS, ... of a partition of n edges to acc
// at the lane's columns c (FULL: all of them < n, else those that are), with
// MGG_WEIGHTED scaled by wt(t, h), h the head of the column; every row's address first,
// so that their ids load at once.
template <class C, bool GLOBAL, bool FULL, typename RowFn, typename WeightFn>
__device__ __forceinline__ void add_rows(typename C::acc (&acc)[C::CHUNKS], RowFn row,
                                         WeightFn wt, int t, int n, const Cols<C>& c) {
    typename C::raw v[C::INFLIGHT][C::CHUNKS];
#if MGG_WEIGHTED
    float s[C::INFLIGHT][C::CHUNKS];
#endif
    const typename C::row* r[C::INFLIGHT];
#pragma unroll
    for (int u = 0; u < C::INFLIGHT; ++u) {
        const int tu = FULL ? t + u * C::GROUPS : min(t + u * C::GROUPS, n - 1);
        r[u] = row(tu);  // clamped past n: a row not read
#if MGG_WEIGHTED == 1
#pragma unroll
        for (int k = 0; k < C::CHUNKS; ++k) s[u][k] = wt(tu, c.head[k]);
#endif
    }
#pragma unroll
    for (int u = 0; u < C::INFLIGHT; ++u) {
        const bool live = FULL || t + u * C::GROUPS < n;
#if MGG_WEIGHTED == 2
        const float su = wt(FULL ? t + u * C::GROUPS : min(t + u * C::GROUPS, n - 1), 0);
#pragma unroll
        for (int k = 0; k < C::CHUNKS; ++k) s[u][k] = su;
#endif
        const bool aligned = C::VEC == 1 || ((unsigned long long)r[u] & (C::BYTES - 1)) == 0;
#pragma unroll
        for (int k = 0; k < C::CHUNKS; ++k) {
            zero(v[u][k]);
            if (live && k < c.on)
                load<GLOBAL>(v[u][k], r[u] + c.col + k * C::CHUNK_COLS, aligned);
#if MGG_WEIGHTED
            if (!live) s[u][k] = 0.0f;
#endif
        }
    }
#pragma unroll
    for (int u = 0; u < C::INFLIGHT; ++u)
#pragma unroll
        for (int k = 0; k < C::CHUNKS; ++k)
#if MGG_WEIGHTED
            fma_to(acc[k], s[u][k], v[u][k]);
#else
            add_to(acc[k], v[u][k]);
#endif
}

// Sum the n edges' rows of one partition into out[node] at the lane's columns c; row(t)
// gives the address of the source row of the partition's edge t, wt(t, h) its weight
// at head h (MGG_WEIGHTED), and the sum is scaled by post (MGG_WEIGHTED 2: the node's
// norm). The lane's group sums edges group, group + GROUPS, ...
template <class C, bool GLOBAL, typename RowFn, typename WeightFn>
__device__ __forceinline__ void reduce_cols(RowFn row, WeightFn wt, int n,
                                            float* __restrict__ out, i64 node, int dim,
                                            bool excl, const Cols<C>& c, int group,
                                            float post) {
    typename C::acc acc[C::CHUNKS];
#pragma unroll
    for (int k = 0; k < C::CHUNKS; ++k) zero(acc[k]);
    if (c.on) {
        constexpr int STEP = C::INFLIGHT * C::GROUPS;
        int t = group;
        for (; t + STEP - C::GROUPS < n; t += STEP)  // every edge of the step exists
            add_rows<C, GLOBAL, true>(acc, row, wt, t, n, c);
        if (t < n) add_rows<C, GLOBAL, false>(acc, row, wt, t, n, c);
    }
    // the groups' sums meet in group 0 (CHUNKS = 1 where GROUPS > 1)
#pragma unroll
    for (int off = C::LANES; off < 32; off <<= 1) add_shfl_down(acc[0], off);
    if (group == 0) {
        float* o = out + node * dim + c.col;
#pragma unroll
        for (int k = 0; k < C::CHUNKS; ++k) {
            if (MGG_WEIGHTED == 2) scale_by(acc[k], post);
            if (k < c.on) emit(o, k * C::CHUNK_COLS, acc[k], excl);
        }
    }
}

// The weights of a partition's edges, from edge e0 of w [E, heads]: wt(t, h) is edge
// e0 + t's at head h (MGG_WEIGHTED; never called otherwise)
struct EdgeWeights {
    const float* __restrict__ w;
    int heads;
    __device__ __forceinline__ float operator()(int t, int h) const {
        return __ldg(w + (i64)t * heads + h);
    }
};
__device__ __forceinline__ EdgeWeights edge_weights(const float* w, i64 e0, int heads) {
    return EdgeWeights{MGG_WEIGHTED ? w + e0 * heads : w, heads};
}
// MGG_WEIGHTED 2: the norm of edge t's source, norm[idx[t]]: a local edge's from the
// PE's norm by its row (idx in global or shared memory), a remote one's from halo_norm by
// its halo slot (one type for both kinds: ptxas spills registers where two differ)
struct SourceNorms {
    const float* __restrict__ norm;
    const int* idx;
    __device__ __forceinline__ float operator()(int t, int) const { return __ldg(norm + idx[t]); }
};

// A partition's weights from edge e0 (w: the local or remote ones; src: its edges' source
// rows or halo slots) and the factor of its sum for node v (norm: the PE's rows' norm):
// MGG_WEIGHTED 2, the sources' norms and norm[v]; else w's per edge, and 1
#if MGG_WEIGHTED == 2
typedef SourceNorms PartWeights;
__device__ __forceinline__ PartWeights part_weights(const float* w, const int* src, i64, int) {
    return SourceNorms{w, src};
}
__device__ __forceinline__ float node_factor(const float* norm, i64 v) { return __ldg(norm + v); }
#else
typedef EdgeWeights PartWeights;
__device__ __forceinline__ PartWeights part_weights(const float* w, const int*, i64 e0,
                                                    int heads) {
    return edge_weights(w, e0, heads);
}
__device__ __forceinline__ float node_factor(const float*, i64) { return 1.0f; }
#endif

// The partition of edges [e0, e1): at the lane's columns c, or (W = 0) at every slab's in
// turn; row(t), wt(t, h) and post as for reduce_cols
template <class C, bool GLOBAL, typename RowFn, typename WeightFn>
__device__ __forceinline__ void reduce_partition(RowFn row, WeightFn wt, i64 e0, i64 e1,
                                                 float* __restrict__ out, i64 node, int dim,
                                                 bool excl, const Cols<C>& c, int lane,
                                                 int heads, float post) {
    const int n = (int)(e1 - e0);  // at most ps
    if constexpr (C::WIDTH != 0) {
        reduce_cols<C, GLOBAL>(row, wt, n, out, node, dim, excl, c, lane / C::LANES, post);
    } else {
        for (int j0 = 0; j0 < dim; j0 += C::SLOTS * C::VEC)
            reduce_cols<C, GLOBAL>(row, wt, n, out, node, dim, excl,
                                   lane_cols<C>(lane, j0, dim, heads), 0, post);
    }
}

// ---- the kernel ------------------------------------------------------------------------------
#if MGG_REMOTE_GET
#define MGG_PS_PARAM int ps,
#define MGG_PS_ARG ps,
#else
#define MGG_PS_PARAM
#define MGG_PS_ARG
#endif

// mgg_aggregate's parameters, the same in both modes but for ps (get: before heads).
// x: this PE's rows [n, dim] (get: in the symmetric heap); peer_ptrs: the base address
// of each PE's rows (p2p; unused by get, whose peers are reached by gets); out: the
// float32 sums of the destination rows row0.. (bf16 rows: the accumulator mgg_round
// rounds); heads: edge weights per edge (MGG_WEIGHTED; ignored otherwise).
#define MGG_AGGREGATE_PARAMS                                                                 \
    const row_t *__restrict__ x, const i64 *__restrict__ lnp_ptr,                            \
        const int *__restrict__ lnp_node, const unsigned char *__restrict__ lnp_excl,       \
        i64 n_lnp, const int *__restrict__ local_idx, const float *__restrict__ local_w,    \
        const i64 *__restrict__ rnp_ptr, const int *__restrict__ rnp_node,                 \
        const unsigned char *__restrict__ rnp_excl, i64 n_rnp,                              \
        const int *__restrict__ remote_pe, const int *__restrict__ remote_row,             \
        const float *__restrict__ remote_w, const int *__restrict__ remote_slot,            \
        const unsigned long long *__restrict__ peer_ptrs, float *__restrict__ out, int row0, \
        int dim, int dist, MGG_PS_PARAM int heads
#define MGG_AGGREGATE_ARGS                                                                    \
    x, lnp_ptr, lnp_node, lnp_excl, n_lnp, local_idx, local_w, rnp_ptr, rnp_node, rnp_excl,   \
        n_rnp, remote_pe, remote_row, remote_w, remote_slot, peer_ptrs, out, row0, dim, dist, \
        MGG_PS_ARG heads

#if !MGG_REMOTE_GET

template <class C>
__device__ __forceinline__ void aggregate(MGG_AGGREGATE_PARAMS) {
    const int lane = threadIdx.x & 31;
    const Cols<C> cols = lane_cols<C>(lane, 0, dim, heads);
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 k0 = warp * dist;
    for (int i = 0; i < dist; ++i) {
        const i64 k = k0 + i;
        if (k < n_lnp) {
            const i64 e0 = lnp_ptr[k];
            const int* idx = local_idx + e0;
            auto row = [&](int t) { return x + (i64)__ldg(idx + t) * dim; };
            reduce_partition<C, true>(row, part_weights(local_w, idx, e0, heads), e0,
                                      lnp_ptr[k + 1], out, lnp_node[k] - row0, dim,
                                      lnp_excl[k], cols, lane, heads,
                                      node_factor(local_w, lnp_node[k]));
        }
        if (k < n_rnp) {
            const i64 e0 = rnp_ptr[k];
            const int *pe = remote_pe + e0, *rr = remote_row + e0;
            auto row = [&](int t) {
                const row_t* base = (const row_t*)__ldg(peer_ptrs + __ldg(pe + t));
                return base + (i64)__ldg(rr + t) * dim;
            };
            reduce_partition<C, true>(row, part_weights(remote_w, remote_slot + e0, e0, heads),
                                      e0, rnp_ptr[k + 1], out, rnp_node[k] - row0, dim,
                                      rnp_excl[k], cols, lane, heads,
                                      node_factor(local_w, rnp_node[k]));
        }
    }
}

#else  // MGG_REMOTE_GET

// Start fetching the rows of RNP k into staging (rows in edge order); one
// non-blocking warp-collective get per edge.
__device__ __forceinline__ void fetch_partition(const row_t* sym_x, const i64* rnp_ptr,
                                                const int* remote_pe,
                                                const int* remote_row, i64 k,
                                                row_t* staging, int dim) {
    for (i64 e = rnp_ptr[k]; e < rnp_ptr[k + 1]; ++e)
#if MGG_BF16
        nvshmemx_getmem_nbi_warp(staging + (e - rnp_ptr[k]) * dim,
                                 sym_x + (i64)remote_row[e] * dim, (size_t)dim * sizeof(bf16),
                                 remote_pe[e]);
#else
        nvshmemx_float_get_nbi_warp(staging + (e - rnp_ptr[k]) * dim,
                                    sym_x + (i64)remote_row[e] * dim, dim, remote_pe[e]);
#endif
}

template <class C>
__device__ __forceinline__ void aggregate(MGG_AGGREGATE_PARAMS) {
    // Listing 2: ps ids per warp (all warps' rounded up to 4, so that staged rows are
    // 16-byte aligned where a row's bytes are a multiple of 16), then 2 * ps * dim staging
    // elements (float or bf16) per warp
    extern __shared__ __align__(16) int part_meta[];
    const int warps_per_block = blockDim.x >> 5;
    const int wib = threadIdx.x >> 5;
    int* ids = part_meta + wib * ps;  // the neighbor ids of the current LNP
    row_t* staging =
        (row_t*)&part_meta[(ps * warps_per_block + 3) & ~3] + (i64)wib * 2 * ps * dim;
    const int lane = threadIdx.x & 31;
    const Cols<C> cols = lane_cols<C>(lane, 0, dim, heads);
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
            auto row = [&](int t) { return x + (i64)ids[t] * dim; };
            reduce_partition<C, true>(row, part_weights(local_w, ids, e0, heads), e0, e1, out,
                                      lnp_node[k] - row0, dim, lnp_excl[k], cols, lane, heads,
                                      node_factor(local_w, lnp_node[k]));
            __syncwarp();
        }
        if (k < k_end) {
            nvshmem_quiet();  // the rows of RNP k (and anything older) have landed
            __syncwarp();
            row_t* cur = staging + (i64)(i & 1) * ps * dim;
            if (k + 1 < k_end)  // overlaps with aggregating RNP k and LNP k+1
                fetch_partition(x, rnp_ptr, remote_pe, remote_row, k + 1,
                                staging + (i64)((i + 1) & 1) * ps * dim, dim);
            const i64 e0 = rnp_ptr[k];
            auto row = [&](int t) { return (const row_t*)cur + (i64)t * dim; };
            reduce_partition<C, false>(row, part_weights(remote_w, remote_slot + e0, e0, heads),
                                       e0, rnp_ptr[k + 1], out, rnp_node[k] - row0, dim,
                                       rnp_excl[k], cols, lane, heads,
                                       node_factor(local_w, rnp_node[k]));
            __syncwarp();
        }
    }
}

#endif

// 1024 threads (wpb = 32) always launch: at most 64 registers
extern "C" __global__ void __launch_bounds__(1024) mgg_aggregate(MGG_AGGREGATE_PARAMS) {
    aggregate<Layout<row_t, MGG_VEC, MGG_WIDTH>>(MGG_AGGREGATE_ARGS);
}

#ifdef MGG_EVERY_CLASS  // X(vec, W) ...: each class's kernel, mgg_aggregate_class<vec, W>
template <int V, int W>
__global__ void __launch_bounds__(1024) mgg_aggregate_class(MGG_AGGREGATE_PARAMS) {
    aggregate<Layout<row_t, V, W>>(MGG_AGGREGATE_ARGS);
}
#define X(v, w) template __global__ void mgg_aggregate_class<v, w>(MGG_AGGREGATE_PARAMS);
MGG_EVERY_CLASS
#undef X
#endif
