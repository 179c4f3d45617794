/* megatron_c_cuda.cu - the CUDA side of megatron_c: the NCCL communicator backend.

   Compiled by nvcc as C++ (make CUDA=1, which also defines MC_ENABLE_CUDA and MC_COMM_MPI) and
   linked next to the C translation unit that holds the megatron_c.h implementation. It only
   exports the extern "C" functions that megatron_c.h declares under MC_ENABLE_CUDA:

       mc__nccl_available(local_rank, local_size)   may this node run one rank per GPU?
       mc__nccl_init_world(world)                    lay NCCL over an MPI world communicator
       mc__nccl_ops()                                the mc_comm_ops table of the nccl backend

   How the backend is built, and why:
     - An nccl communicator is an MPI communicator with NCCL laid over it. c->mpi stays valid,
       because the generic layer agrees on group plans through MPI on the host, and the NCCL
       unique id of every new communicator travels over MPI too.
     - Buffers are device pointers. Every operation is queued on the communicator's own
       non-blocking stream (so it never serialises with the legacy default stream) and followed
       by a CUDA event. A blocking call is "start, then wait"; a wait polls the event against a
       deadline and checks ncclCommGetAsyncError, so a peer that never joins ends in
       MC_ERR_TIMEOUT and an aborted communicator, not a hang.
     - Communicators are created with ncclConfig_t.blocking = 0. NCCL then returns
       ncclInProgress instead of blocking inside init, connection setup, group end and
       finalize, so those steps are polled against the same deadline and can be given up on.
       The price is launch latency (NCCL runs each non-blocking launch as a background job):
       on two H200s an async start costs about 22 us instead of 9 us, and a blocking
       1-element all-reduce about 30 us instead of 20 us. Compiling this file with
       -DMC_NCCL_BLOCKING=1 trades the timeouts of init and connection setup (a missing peer
       then hangs there) for that latency; waits on running operations keep their timeout
       either way.
     - An async call returns once NCCL has queued the operation on the stream. NCCL sets up
       connections lazily, so the first operation that needs a new connection waits in the
       call for its peers to reach the same operation (up to the timeout), as blocking NCCL
       does; later calls return at once.
     - Point-to-point has no tags in NCCL: sends and receives between two ranks match in call
       order, and the tag argument is ignored. As with rendezvous MPI, a send only completes
       when the peer posts the matching receive; two ranks that both send first deadlock
       (until the timeout). Post opposite orders, or use batch_send_recv, which puts all its
       sends and receives in one NCCL group. */

// nvcc compiles this file as C++: keep mpi.h to its C API, so that linking with mpicc (C) needs
// no MPI C++ bindings library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#if !defined(MC_NO_CUDNN)
#include <cudnn.h>
#else   /* built without cuDNN (make CUDNN=0): the own attention kernels only */
typedef void *cudnnHandle_t;
typedef void *cudnnBackendDescriptor_t;
#endif
#include <mpi.h>
#include <nccl.h>

#include <math.h>

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megatron_c.h"

#ifndef MC_NCCL_BLOCKING
#define MC_NCCL_BLOCKING 0   // see the top of the file
#endif

// ---------------------------------------------------------------------------------------------
// >>cuda core: errors, the context, memory
//
// Every CUDA, cuBLASLt and cuDNN call goes through one of the check macros below, which turn a
// failure into MC_ERR_CUDA with a message naming the call, the op and its shapes, recorded in
// mc_last_error() (the library never exits). With the context's sync_check (or the environment
// MC_CUDA_SYNC_CHECK=1) every op is followed by a stream synchronisation and an error check,
// so an asynchronous fault is reported by the op that caused it.

struct mc__cuda_alloc {
    void *ptr;
    size_t bytes;
};

/* Timeline completion markers (megatron_c.h >>core.timeline): a marker is a timing event
   recorded on a stream; its time on the timeline's clock is the stream's reference event's
   host time plus the elapsed time between the two. The reference is recorded when the stream
   is made (idle, so its host time is its completion time); the GPU's clock and the host's are
   assumed not to drift apart over a run. */
typedef struct mc__mark_clock {
    cudaEvent_t ref;              // NULL: this stream records no markers
    double ref_t;                 // mc_timeline_now() when ref completed
} mc__mark_clock;

static void mc__mark_clock_init(mc__mark_clock *k, cudaStream_t stream) {
    k->ref = NULL;
    if (cudaEventCreate(&k->ref) != cudaSuccess || cudaEventRecord(k->ref, stream) != cudaSuccess ||
        cudaEventSynchronize(k->ref) != cudaSuccess) {
        if (k->ref != NULL) cudaEventDestroy(k->ref);
        k->ref = NULL;
        (void)cudaGetLastError();   // no markers: the timeline keeps the host's times
        return;
    }
    k->ref_t = mc_timeline_now();
}

static void mc__mark_clock_destroy(mc__mark_clock *k) {
    if (k->ref != NULL) cudaEventDestroy(k->ref);
    k->ref = NULL;
}

static int mc__mark_record(const mc__mark_clock *k, cudaStream_t stream, void **mark) {
    cudaEvent_t ev = NULL;
    if (k->ref == NULL) return MC_ERR_UNSUPPORTED;
    if (cudaEventCreate(&ev) != cudaSuccess || cudaEventRecord(ev, stream) != cudaSuccess) {
        if (ev != NULL) cudaEventDestroy(ev);
        (void)cudaGetLastError();
        return MC_ERR_CUDA;
    }
    *mark = (void *)ev;
    return MC_OK;
}

static int mc__mark_time(const mc__mark_clock *k, void *mark, double *t) {
    float ms = 0.0f;
    cudaError_t err = cudaEventSynchronize((cudaEvent_t)mark);
    if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, k->ref, (cudaEvent_t)mark);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return MC_ERR_CUDA;
    }
    *t = k->ref_t + 1e-3 * (double)ms;
    return MC_OK;
}

/* The context of one CUDA op table: what mc_ops.ctx points at. */
typedef struct mc__cuda_ctx {
    int device;
    cudaStream_t stream;          // every op runs here, in call order
    int sync_check;               // synchronise and check after every op
    int attention;                // 0 auto, 1 own kernel, 2 cuDNN
    int tf32;                     // fp32 GEMMs may use TF32
    int fuse;                     // GELU in the GEMM epilogues (MC_CUDA_FUSE=0 turns it off)
    int deterministic;            // no atomics in any sum: bit-identical runs (slower backward)
    void *workspace;              // cuBLASLt / cuDNN workspace
    size_t workspace_bytes;
    struct mc__cuda_alloc *allocs;   // live allocations (for the peak; a small linear table)
    int n_allocs, cap_allocs;
    size_t live_bytes, peak_bytes;
    char describe[256];
    void *compute;                // the compute half's handles (mc__cuda_compute), or NULL
    mc__mark_clock marks;         // the timeline's completion markers on `stream`
} mc__cuda_ctx;

static mc__cuda_ctx *mc__cuda_get(const mc_ops *o) { return (mc__cuda_ctx *)o->ctx; }

/* Records "<op>: <call> failed: <text> (<name>) [<detail>]" and returns MC_ERR_CUDA. */
static int mc__cuda_fail(cudaError_t err, const char *op, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int mc__cuda_fail(cudaError_t err, const char *op, const char *call, const char *fmt, ...) {
    char detail[384] = "";
    va_list args;
    if (fmt != NULL) {
        va_start(args, fmt);
        vsnprintf(detail, sizeof detail, fmt, args);
        va_end(args);
    }
    (void)cudaGetLastError();   // the next check must not see this error again
    return mc__set_error(MC_ERR_CUDA, "cuda %s: %s failed: %s (%s)%s%s%s", op, call,
                         cudaGetErrorString(err), cudaGetErrorName(err), detail[0] ? " [" : "",
                         detail, detail[0] ? "]" : "");
}

// Check one runtime call; `...` is the printf-style detail (shapes), which may be empty ("").
#define MC__CU(op, call, ...)                                                                  \
    do {                                                                                       \
        cudaError_t mc__e = (call);                                                            \
        if (mc__e != cudaSuccess) return mc__cuda_fail(mc__e, (op), #call, __VA_ARGS__);       \
    } while (0)

/* After a launch: the launch error, and with sync_check the kernel's own error. */
static int mc__cuda_after(const mc_ops *o, const char *op, const char *shapes) {
    mc__cuda_ctx *cx = mc__cuda_get(o);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return mc__cuda_fail(err, op, "kernel launch", "%s", shapes);
    if (cx->sync_check) {
        err = cudaStreamSynchronize(cx->stream);
        if (err != cudaSuccess)
            return mc__cuda_fail(err, op, "cudaStreamSynchronize (MC_CUDA_SYNC_CHECK)", "%s",
                                 shapes);
    }
    return MC_OK;
}

static int mc__cuda_use(const mc_ops *o, const char *op) {
    if (o == NULL || o->ctx == NULL)
        return mc__set_error(MC_ERR_INVALID_ARG, "cuda %s: the op table has no context (call "
                             "mc_ops_cuda_init)", op);
    MC__CU(op, cudaSetDevice(mc__cuda_get(o)->device), "device %d", mc__cuda_get(o)->device);
    return MC_OK;
}

// --- memory -----------------------------------------------------------------------------------

static int mc__cuda_track(mc__cuda_ctx *cx, void *ptr, size_t bytes) {
    if (cx->n_allocs == cx->cap_allocs) {
        int cap = cx->cap_allocs ? 2 * cx->cap_allocs : 256;
        struct mc__cuda_alloc *grown =
            (struct mc__cuda_alloc *)mc_malloc((size_t)cap * sizeof *grown);
        if (grown == NULL) return MC_ERR_NO_MEMORY;
        if (cx->n_allocs) memcpy(grown, cx->allocs, (size_t)cx->n_allocs * sizeof *grown);
        mc_free(cx->allocs);
        cx->allocs = grown;
        cx->cap_allocs = cap;
    }
    cx->allocs[cx->n_allocs].ptr = ptr;
    cx->allocs[cx->n_allocs].bytes = bytes;
    cx->n_allocs++;
    cx->live_bytes += bytes;
    if (cx->live_bytes > cx->peak_bytes) cx->peak_bytes = cx->live_bytes;
    return MC_OK;
}

static void mc__cuda_untrack(mc__cuda_ctx *cx, void *ptr) {
    for (int i = cx->n_allocs - 1; i >= 0; i--)
        if (cx->allocs[i].ptr == ptr) {
            cx->live_bytes -= cx->allocs[i].bytes;
            cx->allocs[i] = cx->allocs[--cx->n_allocs];
            return;
        }
}

/* Zero-filled like the CPU table's: the memset runs on the stream, so every later op sees it. */
static int mc__cuda_alloc_op(const mc_ops *o, void **ptr, size_t bytes) {
    int rc = mc__cuda_use(o, "alloc");
    if (rc != MC_OK) return rc;
    if (ptr == NULL) return mc__set_error(MC_ERR_INVALID_ARG, "cuda alloc: ptr is NULL");
    *ptr = NULL;
    mc__cuda_ctx *cx = mc__cuda_get(o);
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        return mc__cuda_fail(err, "alloc", "cudaMalloc", "%zu bytes on device %d; %zu of %zu "
                             "bytes free; %zu allocated through this table", bytes, cx->device,
                             free_b, total_b, cx->live_bytes);
    }
    err = cudaMemsetAsync(p, 0, bytes, cx->stream);
    if (err != cudaSuccess) {
        cudaFree(p);
        return mc__cuda_fail(err, "alloc", "cudaMemsetAsync", "%zu bytes", bytes);
    }
    if (mc__cuda_track(cx, p, bytes > 0 ? bytes : 1) != MC_OK) {
        cudaFree(p);
        return mc__set_error(MC_ERR_NO_MEMORY, "cuda alloc: no host memory for the allocation "
                             "table");
    }
    *ptr = p;
    return MC_OK;
}

/* cudaFree waits for the device, so no op still queued can touch freed memory. */
static int mc__cuda_free_op(const mc_ops *o, void *ptr) {
    if (ptr == NULL) return MC_OK;
    int rc = mc__cuda_use(o, "free");
    if (rc != MC_OK) return rc;
    mc__cuda_untrack(mc__cuda_get(o), ptr);
    MC__CU("free", cudaFree(ptr), "%p", ptr);
    return MC_OK;
}

static int mc__cuda_upload_op(const mc_ops *o, void *dst, const void *host_src, size_t bytes) {
    int rc = mc__cuda_use(o, "upload");
    if (rc != MC_OK || bytes == 0) return rc;
    // A pageable host buffer may be reused by the caller as soon as this returns: copy
    // synchronously with respect to the host (cudaMemcpyAsync from pageable memory stages
    // through a pinned buffer before it returns), ordered on the stream.
    MC__CU("upload", cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice,
                                     mc__cuda_get(o)->stream),
           "%zu bytes to %p", bytes, dst);
    return mc__cuda_after(o, "upload", "");
}

static int mc__cuda_download_op(const mc_ops *o, void *host_dst, const void *src, size_t bytes) {
    int rc = mc__cuda_use(o, "download");
    if (rc != MC_OK || bytes == 0) return rc;
    mc__cuda_ctx *cx = mc__cuda_get(o);
    MC__CU("download", cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cx->stream),
           "%zu bytes from %p", bytes, src);
    MC__CU("download", cudaStreamSynchronize(cx->stream), "%zu bytes from %p", bytes, src);
    return MC_OK;
}

static int mc__cuda_copy_2d_op(const mc_ops *o, void *dst, size_t dst_pitch, const void *src,
                               size_t src_pitch, size_t width, size_t rows) {
    int rc = mc__cuda_use(o, "copy_2d");
    if (rc != MC_OK || width == 0 || rows == 0 || dst == src) return rc;
    mc__cuda_ctx *cx = mc__cuda_get(o);
    if (rows == 1 || (dst_pitch == width && src_pitch == width))
        MC__CU("copy_2d", cudaMemcpyAsync(dst, src, width * rows, cudaMemcpyDeviceToDevice,
                                          cx->stream),
               "%zu bytes", width * rows);
    else
        MC__CU("copy_2d", cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                            cudaMemcpyDeviceToDevice, cx->stream),
               "%zu rows of %zu bytes, pitches %zu / %zu", rows, width, dst_pitch, src_pitch);
    return mc__cuda_after(o, "copy_2d", "");
}

static int mc__cuda_synchronize_op(const mc_ops *o) {
    int rc = mc__cuda_use(o, "synchronize");
    if (rc != MC_OK) return rc;
    MC__CU("synchronize", cudaStreamSynchronize(mc__cuda_get(o)->stream), "");
    return MC_OK;
}

/* The stream other components order themselves after (the NCCL backend waits on it before
   every collective, so a collective reads what the ops before it wrote). */
static cudaStream_t mc__cuda_stream_of(const mc_ops *o) {
    return o && o->device == MC_DEVICE_CUDA && o->ctx ? mc__cuda_get(o)->stream : NULL;
}

static int mc__cuda_device_of(const mc_ops *o) {
    return o && o->device == MC_DEVICE_CUDA && o->ctx ? mc__cuda_get(o)->device : -1;
}

// ---------------------------------------------------------------------------------------------
// >>cuda kernels  (element-wise, reductions, LayerNorm, embedding, cross entropy, AdamW)
//
// Storage is float or bf16 (the op's dt), math is fp32, bf16 results are rounded to nearest
// even once, on store, as on the CPU. Element-wise kernels move 16 bytes per load where every
// pointer is 16-byte aligned and n is a multiple of the vector width.

typedef __nv_bfloat16 mc__bf16;

__device__ __forceinline__ float mc__ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float mc__ld(const mc__bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void mc__st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void mc__st(mc__bf16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* V consecutive elements as floats (V = 1, or 16 bytes' worth: 4 fp32 / 8 bf16). */
template <typename T, int V>
__device__ __forceinline__ void mc__ldv(float (&f)[V], const T *p, size_t i) {
    if (V == 1) {
        f[0] = mc__ld(p, i);
    } else {
        union { uint4 u; T t[V]; } x;
        x.u = *(const uint4 *)(p + i);
#pragma unroll
        for (int k = 0; k < V; k++) f[k] = mc__ld(x.t, k);
    }
}

template <typename T, int V>
__device__ __forceinline__ void mc__stv(T *p, size_t i, const float (&f)[V]) {
    if (V == 1) {
        mc__st(p, i, f[0]);
    } else {
        union { uint4 u; T t[V]; } x;
#pragma unroll
        for (int k = 0; k < V; k++) mc__st(x.t, k, f[k]);
        *(uint4 *)(p + i) = x.u;
    }
}

#define MC__THREADS 256

/* Grid for n work items of one thread each (grid-stride loops cover the rest). */
static unsigned mc__blocks(size_t n) {
    size_t b = (n + MC__THREADS - 1) / MC__THREADS;
    if (b < 1) b = 1;
    if (b > 65535u * 4u) b = 65535u * 4u;
    return (unsigned)b;
}

#define MC__GRID_STRIDE(i, n)                                                                  \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
         i += (size_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float mc__warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double mc__warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float mc__warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of up to 1024 threads (every thread gets the result). */
__device__ double mc__block_sum_d(double v) {
    __shared__ double part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = mc__warp_sum_d(v);
    __syncthreads();   // part[] may still be read from a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.0;
    return mc__warp_sum_d(v);
}

__device__ float mc__block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = mc__warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return mc__warp_max(v);
}

// --- Philox4x32-10, the CPU's generator bit for bit (>>tensor_parallel.random in the header)

__device__ __forceinline__ void mc__philox(uint64_t seed, uint64_t block, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* keep rule of mc_rng_dropout_mask: uniform of the top 24 bits >= p */
__device__ __forceinline__ bool mc__keep_bits(uint32_t bits, float p) {
    return (float)(bits >> 8) * (1.0f / 16777216.0f) >= p;
}

__device__ __forceinline__ bool mc__keep_at(uint64_t seed, uint64_t index, float p) {
    uint32_t b[4];
    mc__philox(seed, index >> 2, b);
    return mc__keep_bits(b[index & 3], p);
}

// --- element-wise

template <typename T, int V>
__global__ void mc__k_fill(T *x, float value, size_t n) {
    float f[V];
#pragma unroll
    for (int k = 0; k < V; k++) f[k] = value;
    MC__GRID_STRIDE(i, n / V) mc__stv<T, V>(x, i * V, f);
}

template <typename D, typename S>
__global__ void mc__k_convert(D *dst, const S *src, size_t n) {
    MC__GRID_STRIDE(i, n) mc__st(dst, i, mc__ld(src, i));
}

template <typename T, int V>
__global__ void mc__k_axpy(T *y, float a, const T *x, size_t n) {
    MC__GRID_STRIDE(i, n / V) {
        float fy[V], fx[V];
        mc__ldv<T, V>(fy, y, i * V);
        mc__ldv<T, V>(fx, x, i * V);
#pragma unroll
        for (int k = 0; k < V; k++) fy[k] += a * fx[k];
        mc__stv<T, V>(y, i * V, fy);
    }
}

template <typename T, int V>
__global__ void mc__k_scale(T *x, float a, size_t n) {
    MC__GRID_STRIDE(i, n / V) {
        float f[V];
        mc__ldv<T, V>(f, x, i * V);
#pragma unroll
        for (int k = 0; k < V; k++) f[k] *= a;
        mc__stv<T, V>(x, i * V, f);
    }
}

#define MC__GELU_S 0.7978845608028654f
#define MC__GELU_C 0.044715f

template <typename T, int V>
__global__ void mc__k_gelu_fwd(T *out, const T *inp, size_t n) {
    MC__GRID_STRIDE(i, n / V) {
        float f[V];
        mc__ldv<T, V>(f, inp, i * V);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float x = f[k];
            f[k] = 0.5f * x * (1.0f + tanhf(MC__GELU_S * (x + MC__GELU_C * x * x * x)));
        }
        mc__stv<T, V>(out, i * V, f);
    }
}

template <typename T, int V>
__global__ void mc__k_gelu_bwd(T *dinp, const T *inp, const T *dout, size_t n) {
    MC__GRID_STRIDE(i, n / V) {
        float x[V], dy[V];
        mc__ldv<T, V>(x, inp, i * V);
        mc__ldv<T, V>(dy, dout, i * V);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float v = x[k];
            float t = tanhf(MC__GELU_S * (v + MC__GELU_C * v * v * v));
            float dt = (1.0f - t * t) * MC__GELU_S * (1.0f + 3.0f * MC__GELU_C * v * v);
            dy[k] = dy[k] * (0.5f * (1.0f + t) + 0.5f * v * dt);
        }
        mc__stv<T, V>(dinp, i * V, dy);
    }
}

/* One thread per Philox block of the stream: elements j with (offset + j) / 4 == blk. */
template <typename T>
__global__ void mc__k_dropout(T *out, const T *inp, size_t n, float p, float scale, uint64_t seed,
                              uint64_t offset) {
    uint64_t first = offset >> 2, last = (offset + n - 1) >> 2;
    MC__GRID_STRIDE(k, (size_t)(last - first + 1)) {
        uint64_t blk = first + k;
        uint32_t bits[4];
        mc__philox(seed, blk, bits);
#pragma unroll
        for (int lane = 0; lane < 4; lane++) {
            uint64_t g = blk * 4 + (uint64_t)lane;
            if (g < offset || g >= offset + n) continue;
            size_t j = (size_t)(g - offset);
            float x = mc__ld(inp, j);
            mc__st(out, j, mc__keep_bits(bits[lane], p) ? x * scale : 0.0f);
        }
    }
}

// --- reductions

/* out (one double) += sum of x^2 over span blockIdx.y */
__global__ void mc__k_sum_squares(double *out, const float *x, const size_t *spans) {
    size_t lo = spans[2 * blockIdx.y], hi = spans[2 * blockIdx.y + 1];
    double acc = 0.0;
    for (size_t i = lo + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < hi;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = x[i];
        acc += v * v;
    }
    acc = mc__block_sum_d(acc);
    if (threadIdx.x == 0 && acc != 0.0) atomicAdd(out, acc);
}

/* dbias[C] += column sums of dout[N, C]: 32 columns per block, rows split over y */
template <typename T>
__global__ void mc__k_bias_bwd(float *dbias, const T *dout, int N, int C) {
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int n = blockIdx.y * 8 + threadIdx.y; n < N; n += gridDim.y * 8)
            acc += mc__ld(dout, (size_t)n * C + c);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) s += part[k][threadIdx.x];
        atomicAdd(&dbias[c], s);
    }
}

/* 8 bf16 <-> 8 floats through one 16-byte register */
__device__ __forceinline__ void mc__unpack8(const uint4 &v, float (&f)[8]) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 t = __bfloat1622float2(h[j]);
        f[2 * j] = t.x;
        f[2 * j + 1] = t.y;
    }
}

__device__ __forceinline__ uint4 mc__pack8(const float (&f)[8]) {
    uint4 v;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&v;
#pragma unroll
    for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
    return v;
}

/* bf16, C % 8 == 0, 16-byte aligned: a warp reads 256 consecutive columns of a row (8 per lane,
   one 16-byte load), the block's 8 warps take interleaved rows and meet in shared memory. */
__global__ void __launch_bounds__(256) mc__k_bias_bwd_v(float *dbias, const mc__bf16 *dout,
                                                        int N, int C) {
    __shared__ float red[8][256];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int c0 = blockIdx.x * 256 + lane * 8;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, f[8];
    if (c0 < C)
#pragma unroll 4
        for (int n = blockIdx.y * 8 + warp; n < N; n += gridDim.y * 8) {
            mc__unpack8(*(const uint4 *)(dout + (size_t)n * C + c0), f);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] += f[j];
        }
#pragma unroll
    for (int j = 0; j < 8; j++) red[warp][lane * 8 + j] = acc[j];
    __syncthreads();
    int c = blockIdx.x * 256 + threadIdx.x;
    if (c < C) {
        float t = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; q++) t += red[q][threadIdx.x];
        atomicAdd(&dbias[c], t);
    }
}

/* C[M, N] = beta * C + bias[N] (the K = 0 GEMM) */
template <typename T, typename B>
__global__ void mc__k_bias_add(T *C, const B *bias, int M, int N, float beta) {
    MC__GRID_STRIDE(i, (size_t)M * N) {
        float v = beta != 0.0f ? beta * mc__ld(C, i) : 0.0f;
        if (bias) v += mc__ld(bias, i % (size_t)N);
        mc__st(C, i, v);
    }
}

// --- LayerNorm: one warp per row, the CPU's two-pass mean and variance

template <typename T>
__global__ void mc__k_ln_fwd(T *out, float *mean, float *rstd, const T *inp, const T *w,
                             const T *b, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    T *y = out + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += mc__ld(x, c);
    float m = mc__warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = mc__ld(x, c) - m;
        v += d * d;
    }
    v = mc__warp_sum(v) / (float)C;
    float r = 1.0f / sqrtf(v + eps);
    for (int c = lane; c < C; c += 32)
        mc__st(y, c, (mc__ld(x, c) - m) * r * mc__ld(w, c) + (b ? mc__ld(b, c) : 0.0f));
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

/* dinp += ..., dweight/dbias += ... through shared-memory accumulators (SHARED) or straight
   global atomics (large C) */
template <typename T, bool SHARED>
__global__ void mc__k_ln_bwd(T *dinp, float *dw, float *db, const T *dout, const T *inp,
                             const T *w, const float *mean, const float *rstd, int N, int C) {
    extern __shared__ float sh[];
    float *sdw = SHARED ? sh : dw, *sdb = SHARED ? sh + C : db;
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    if (SHARED) {
        for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) sh[c] = 0.0f;
        __syncthreads();
    }
    for (int row = blockIdx.x * wpb + (threadIdx.x >> 5); row < N; row += gridDim.x * wpb) {
        const T *dy = dout + (size_t)row * C, *x = inp + (size_t)row * C;
        float m = mean[row], r = rstd[row], gm = 0.0f, gxm = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float xh = (mc__ld(x, c) - m) * r, g = mc__ld(w, c) * mc__ld(dy, c);
            gm += g;
            gxm += g * xh;
        }
        gm = mc__warp_sum(gm) / (float)C;
        gxm = mc__warp_sum(gxm) / (float)C;
        for (int c = lane; c < C; c += 32) {
            float d = mc__ld(dy, c), xh = (mc__ld(x, c) - m) * r, g = mc__ld(w, c) * d;
            if (db) atomicAdd(&sdb[c], d);
            if (dw) atomicAdd(&sdw[c], xh * d);
            if (dinp) {
                size_t at = (size_t)row * C + c;
                mc__st(dinp, at, mc__ld(dinp, at) + (g - gm - xh * gxm) * r);
            }
        }
    }
    if (SHARED) {
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            if (dw) atomicAdd(&dw[c], sdw[c]);
            if (db) atomicAdd(&db[c], sdb[c]);
        }
    }
}

/* Deterministic mode: dweight / dbias as column sums in row order, one thread per column (the
   row kernel then runs with dw = db = NULL and computes dinp only). */
template <typename T>
__global__ void mc__k_ln_bwd_params(float *dw, float *db, const T *dout, const T *inp,
                                    const float *mean, const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int n = 0; n < N; n++) {
        size_t at = (size_t)n * C + c;
        float d = mc__ld(dout, at), xh = (mc__ld(inp, at) - mean[n]) * rstd[n];
        sb += d;
        sw += xh * d;
    }
    if (dw) dw[c] += sw;
    if (db) db[c] += sb;
}

/* bf16 rows of C = NV * 256: every lane holds NV 16-byte vectors (8 values each) of its row in
   registers, so the row is read once; lane l owns vectors l, l + 32, ... (coalesced). The
   arithmetic is the generic kernels' (the CPU's two-pass statistics). */
template <int NV>
__global__ void __launch_bounds__(256) mc__k_ln_fwd_v(mc__bf16 *out, float *mean, float *rstd,
                                                      const mc__bf16 *inp, const mc__bf16 *w,
                                                      const mc__bf16 *b, int N, float eps) {
    const int C = NV * 256;
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const uint4 *x4 = (const uint4 *)(inp + (size_t)row * C);
    float x[NV][8], s = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        mc__unpack8(x4[lane + 32 * k], x[k]);
#pragma unroll
        for (int j = 0; j < 8; j++) s += x[k][j];
    }
    float m = mc__warp_sum(s) / (float)C, v = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float d = x[k][j] - m;
            v += d * d;
        }
    v = mc__warp_sum(v) / (float)C;
    float r = 1.0f / sqrtf(v + eps);
    uint4 *y4 = (uint4 *)(out + (size_t)row * C);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        float wf[8], bf[8], y[8];
        mc__unpack8(((const uint4 *)w)[lane + 32 * k], wf);
        if (b) mc__unpack8(((const uint4 *)b)[lane + 32 * k], bf);
#pragma unroll
        for (int j = 0; j < 8; j++) y[j] = (x[k][j] - m) * r * wf[j] + (b ? bf[j] : 0.0f);
        y4[lane + 32 * k] = mc__pack8(y);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

/* Backward: each warp sums dweight / dbias of its rows in registers, the block adds its 8 warps
   through shared memory (8 C floats) and then global memory, one atomic per column and block. */
template <int NV>
__global__ void __launch_bounds__(256) mc__k_ln_bwd_v(mc__bf16 *dinp, float *dw, float *db,
                                                      const mc__bf16 *dout, const mc__bf16 *inp,
                                                      const mc__bf16 *w, const float *mean,
                                                      const float *rstd, int N) {
    extern __shared__ float red[];   /* [8][C] */
    const int C = NV * 256;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float aw[NV][8], ab[NV][8], wf[NV][8];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        mc__unpack8(((const uint4 *)w)[lane + 32 * k], wf[k]);
#pragma unroll
        for (int j = 0; j < 8; j++) aw[k][j] = ab[k][j] = 0.0f;
    }
    for (int row = blockIdx.x * 8 + warp; row < N; row += gridDim.x * 8) {
        const uint4 *x4 = (const uint4 *)(inp + (size_t)row * C);
        const uint4 *d4 = (const uint4 *)(dout + (size_t)row * C);
        float m = mean[row], r = rstd[row], gm = 0.0f, gxm = 0.0f;
        float xh[NV][8], dy[NV][8];
#pragma unroll
        for (int k = 0; k < NV; k++) {
            mc__unpack8(x4[lane + 32 * k], xh[k]);
            mc__unpack8(d4[lane + 32 * k], dy[k]);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                xh[k][j] = (xh[k][j] - m) * r;
                float g = wf[k][j] * dy[k][j];
                gm += g;
                gxm += g * xh[k][j];
            }
        }
        gm = mc__warp_sum(gm) / (float)C;
        gxm = mc__warp_sum(gxm) / (float)C;
        uint4 *di4 = dinp ? (uint4 *)(dinp + (size_t)row * C) : NULL;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            float cur[8];
            if (di4) mc__unpack8(di4[lane + 32 * k], cur);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                ab[k][j] += dy[k][j];
                aw[k][j] += xh[k][j] * dy[k][j];
                if (di4) cur[j] = cur[j] + (wf[k][j] * dy[k][j] - gm - xh[k][j] * gxm) * r;
            }
            if (di4) di4[lane + 32 * k] = mc__pack8(cur);
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        float *dst = pass == 0 ? dw : db;
        if (dst == NULL) continue;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < NV; k++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                red[warp * C + (lane + 32 * k) * 8 + j] = pass == 0 ? aw[k][j] : ab[k][j];
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += 256) {
            float t = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) t += red[q * C + c];
            atomicAdd(&dst[c], t);
        }
    }
}

// --- embedding

template <typename T>
__global__ void mc__k_emb_fwd(T *out, const int *ids, const T *table, int N, int C, int vs,
                              int ve) {
    MC__GRID_STRIDE(i, (size_t)N * C) {
        int n = (int)(i / (size_t)C), c = (int)(i % (size_t)C), id = ids[n];
        out[i] = id >= vs && id < ve ? table[(size_t)(id - vs) * C + c] : T(0.0f);
    }
}

template <typename T>
__global__ void mc__k_emb_bwd(float *dtable, const T *dout, const int *ids, int N, int C, int vs,
                              int ve) {
    MC__GRID_STRIDE(i, (size_t)N * C) {
        int n = (int)(i / (size_t)C), c = (int)(i % (size_t)C), id = ids[n];
        if (id >= vs && id < ve) atomicAdd(&dtable[(size_t)(id - vs) * C + c], mc__ld(dout, i));
    }
}

/* Deterministic mode: one thread per column walks the tokens in order, so every row of the
   table receives its sums in one fixed order (no atomics; slower for many tokens). */
template <typename T>
__global__ void mc__k_emb_bwd_det(float *dtable, const T *dout, const int *ids, int N, int C,
                                  int vs, int ve) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int n = 0; n < N; n++) {
        int id = ids[n];
        if (id >= vs && id < ve) dtable[(size_t)(id - vs) * C + c] += mc__ld(dout, (size_t)n * C + c);
    }
}

// --- vocab-parallel cross entropy: a block per row for the row reductions

template <typename T>
__global__ void mc__k_row_max(float *max, const T *logits, int V) {
    const T *l = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, mc__ld(l, j));
    m = mc__block_max(m);
    if (threadIdx.x == 0) max[blockIdx.x] = m;
}

template <typename T>
__global__ void mc__k_target_logit(float *out, const T *logits, const int *targets, int N, int V,
                                   int vs) {
    MC__GRID_STRIDE(n, (size_t)N) {
        int local = targets[n] - vs;
        out[n] = targets[n] >= vs && local < V ? mc__ld(logits, n * (size_t)V + local) : 0.0f;
    }
}

template <typename T>
__global__ void mc__k_sum_exp(float *sum, const T *logits, const float *max, int V) {
    const T *l = logits + (size_t)blockIdx.x * V;
    float m = max[blockIdx.x];
    double s = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += (double)expf(mc__ld(l, j) - m);
    s = mc__block_sum_d(s);
    if (threadIdx.x == 0) sum[blockIdx.x] = (float)s;
}

template <typename T>
__global__ void mc__k_row_sum(float *sum, const T *logits, int V) {
    const T *l = logits + (size_t)blockIdx.x * V;
    double s = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += (double)mc__ld(l, j);
    s = mc__block_sum_d(s);
    if (threadIdx.x == 0) sum[blockIdx.x] = (float)s;
}

/* bf16 rows with V % 8 == 0 (Megatron pads the vocabulary to a multiple of 128) and 16-byte
   aligned logits: the same row reductions, 8 values per load. */
__global__ void mc__k_row_max_v(float *max, const mc__bf16 *logits, int V) {
    const uint4 *l = (const uint4 *)(logits + (size_t)blockIdx.x * V);
    float m = -INFINITY, f[8];
    for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
        mc__unpack8(l[j], f);
#pragma unroll
        for (int k = 0; k < 8; k++) m = fmaxf(m, f[k]);
    }
    m = mc__block_max(m);
    if (threadIdx.x == 0) max[blockIdx.x] = m;
}

__global__ void mc__k_sum_exp_v(float *sum, const mc__bf16 *logits, const float *max, int V) {
    const uint4 *l = (const uint4 *)(logits + (size_t)blockIdx.x * V);
    float m = max[blockIdx.x], f[8];
    double s = 0.0;
    for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
        mc__unpack8(l[j], f);
#pragma unroll
        for (int k = 0; k < 8; k++) s += (double)expf(f[k] - m);
    }
    s = mc__block_sum_d(s);
    if (threadIdx.x == 0) sum[blockIdx.x] = (float)s;
}

__global__ void mc__k_ce_bwd_v(mc__bf16 *dlogits, const mc__bf16 *logits, const float *max,
                               const float *sum, const int *targets, const float *dloss, int V,
                               int vs, float smoothing, float uniform) {
    size_t row = blockIdx.x;
    const uint4 *l = (const uint4 *)(logits + row * V);
    uint4 *dl = (uint4 *)(dlogits + row * V);
    float m = max[row], inv = 1.0f / sum[row], g = dloss[row], f[8];
    int local = targets[row] - vs;
    bool owned = targets[row] >= vs && local < V;
    for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
        mc__unpack8(l[j], f);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float d = expf(f[k] - m) * inv - uniform;
            if (owned && j * 8 + k == local) d -= 1.0f - smoothing;
            f[k] = d * g;
        }
        dl[j] = mc__pack8(f);
    }
}

static bool mc__rows_v(mc_dtype dt, int V, const void *a, const void *b) {
    return dt == MC_BF16 && V % 8 == 0 && (((uintptr_t)a | (uintptr_t)b) & 15u) == 0;
}

__global__ void mc__k_ce_loss(float *losses, double *loss_sum, const float *max,
                              const float *sum_exp, const float *target, const float *logit_sum,
                              int N, int K, float smoothing) {
    double mine = 0.0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        double log_z = log((double)sum_exp[i]) + (double)max[i];
        double nll = log_z - (double)target[i], loss = nll;
        if (logit_sum) loss = (1.0 - smoothing) * nll - smoothing * ((double)logit_sum[i] / K - log_z);
        losses[i] = (float)loss;
        mine += (double)(float)loss;
    }
    if (loss_sum) {
        mine = mc__block_sum_d(mine);
        if (threadIdx.x == 0 && mine != 0.0) atomicAdd(loss_sum, mine);
    }
}

template <typename T>
__global__ void mc__k_ce_bwd(T *dlogits, const T *logits, const float *max, const float *sum,
                             const int *targets, const float *dloss, int V, int vs,
                             float smoothing, float uniform) {
    size_t row = blockIdx.x;
    const T *l = logits + row * V;
    T *dl = dlogits + row * V;
    float m = max[row], inv = 1.0f / sum[row], g = dloss[row];
    int local = targets[row] - vs;
    bool owned = targets[row] >= vs && local < V;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float d = expf(mc__ld(l, j) - m) * inv - uniform;
        if (owned && j == local) d -= 1.0f - smoothing;
        mc__st(dl, j, d * g);
    }
}

// --- AdamW over the span table (blockIdx.y = span)

template <typename T>
__global__ void mc__k_adamw(float *main, const float *grad, float *m, float *v, T *model,
                            const mc_adamw_span *spans, float lr, float b1, float b2, float eps,
                            float bc1, float bc2) {
    mc_adamw_span sp = spans[blockIdx.y];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < sp.n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[sp.grad_at + i];
        float mi = b1 * m[sp.state_at + i] + (1.0f - b1) * g;
        float vi = b2 * v[sp.state_at + i] + (1.0f - b2) * g * g;
        float mh = mi / bc1, vh = vi / bc2;
        float p = main[sp.main_at + i];
        m[sp.state_at + i] = mi;
        v[sp.state_at + i] = vi;
        p -= lr * (mh / (sqrtf(vh) + eps) + sp.weight_decay * p);
        main[sp.main_at + i] = p;
        if (model) mc__st(model, sp.grad_at + i, p);
    }
}

// --- attention, the reference kernels: one warp per row, any dtype, dropout with the CPU's masks
//
// Layout (Megatron's): token (s, b) is row s*B + b of qkv [S*B, NH*3*HD]; head h's q, k, v
// start at columns h*3*HD, h*3*HD + HD, h*3*HD + 2*HD; out [S*B, NH*HD]. The statistics are the
// row log-sum-exp of the scaled scores, lse[(b*NH + h)*S + t] (what flash attention keeps).
// Dropout element index: ((b*NH + h)*S + t)*S + t2 + offset, as on the CPU.

#define MC__ATT_MAXD 8   /* HD <= 256: up to 8 dims per lane */

struct mc__att_dims {
    int S, B, NH, HD;
    float scale;         /* 1 / sqrt(HD) */
    float p, keep_scale; /* dropout */
    uint64_t seed, offset;
};

__device__ __forceinline__ size_t mc__att_row(const mc__att_dims &d, int s, int b) {
    return (size_t)s * d.B + b;
}

template <typename T>
__device__ __forceinline__ void mc__att_load(float (&r)[MC__ATT_MAXD], const T *p, int HD,
                                             int lane) {
#pragma unroll
    for (int j = 0; j < MC__ATT_MAXD; j++) {
        int c = lane + 32 * j;
        r[j] = c < HD ? mc__ld(p, c) : 0.0f;
    }
}

template <typename T>
__device__ __forceinline__ float mc__att_dot(const float (&a)[MC__ATT_MAXD], const T *p, int HD,
                                             int lane) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < MC__ATT_MAXD; j++) {
        int c = lane + 32 * j;
        if (c < HD) s += a[j] * mc__ld(p, c);
    }
    return mc__warp_sum(s);
}

/* weight of element (row_index + t2): kept and scaled, or dropped */
__device__ __forceinline__ float mc__att_drop(const mc__att_dims &d, uint64_t index, float w) {
    if (d.p <= 0.0f) return w;
    return mc__keep_at(d.seed, d.offset + index, d.p) ? w * d.keep_scale : 0.0f;
}

template <typename T>
__global__ void mc__k_att_ref_fwd(T *out, float *lse, const T *qkv, mc__att_dims d) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= d.B * d.NH * d.S) return;
    int t = r % d.S, h = (r / d.S) % d.NH, b = r / (d.S * d.NH);
    size_t C3 = (size_t)d.NH * 3 * d.HD, head = (size_t)h * 3 * d.HD;
    const T *q = qkv + mc__att_row(d, t, b) * C3 + head;
    uint64_t row_index = (uint64_t)r * d.S;   /* ((b*NH + h)*S + t)*S */
    float qr[MC__ATT_MAXD], o[MC__ATT_MAXD], m = -INFINITY, l = 0.0f;
    mc__att_load(qr, q, d.HD, lane);
#pragma unroll
    for (int j = 0; j < MC__ATT_MAXD; j++) o[j] = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        const T *k = qkv + mc__att_row(d, t2, b) * C3 + head + d.HD;
        float s = mc__att_dot(qr, k, d.HD, lane) * d.scale;
        float mn = fmaxf(m, s), corr = expf(m - mn), e = expf(s - mn);
        float w = mc__att_drop(d, row_index + (uint64_t)t2, e);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < MC__ATT_MAXD; j++) {
            int c = lane + 32 * j;
            o[j] = o[j] * corr + (c < d.HD ? w * mc__ld(k + d.HD, c) : 0.0f);
        }
        m = mn;
    }
    T *y = out + mc__att_row(d, t, b) * ((size_t)d.NH * d.HD) + (size_t)h * d.HD;
#pragma unroll
    for (int j = 0; j < MC__ATT_MAXD; j++) {
        int c = lane + 32 * j;
        if (c < d.HD) mc__st(y, c, o[j] / l);
    }
    if (lane == 0) lse[r] = m + logf(l);
}

/* delta[r] = dout_t . out_t (= sum_t2 P dP, the softmax backward's row term) */
template <typename T>
__global__ void mc__k_att_delta(float *delta, const T *dout, const T *out, mc__att_dims d) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= d.B * d.NH * d.S) return;
    int t = r % d.S, h = (r / d.S) % d.NH, b = r / (d.S * d.NH);
    size_t at = mc__att_row(d, t, b) * ((size_t)d.NH * d.HD) + (size_t)h * d.HD;
    float s = 0.0f;
    for (int c = lane; c < d.HD; c += 32) s += mc__ld(dout + at, c) * mc__ld(out + at, c);
    s = mc__warp_sum(s);
    if (lane == 0) delta[r] = s;
}

/* dq of query row t (=) */
template <typename T>
__global__ void mc__k_att_ref_dq(T *dqkv, const T *dout, const T *qkv, const float *lse,
                                 const float *delta, mc__att_dims d) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= d.B * d.NH * d.S) return;
    int t = r % d.S, h = (r / d.S) % d.NH, b = r / (d.S * d.NH);
    size_t C3 = (size_t)d.NH * 3 * d.HD, head = (size_t)h * 3 * d.HD;
    const T *q = qkv + mc__att_row(d, t, b) * C3 + head;
    const T *dy = dout + mc__att_row(d, t, b) * ((size_t)d.NH * d.HD) + (size_t)h * d.HD;
    uint64_t row_index = (uint64_t)r * d.S;
    float qr[MC__ATT_MAXD], dyr[MC__ATT_MAXD], dq[MC__ATT_MAXD], L = lse[r], D = delta[r];
    mc__att_load(qr, q, d.HD, lane);
    mc__att_load(dyr, dy, d.HD, lane);
#pragma unroll
    for (int j = 0; j < MC__ATT_MAXD; j++) dq[j] = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        const T *k = qkv + mc__att_row(d, t2, b) * C3 + head + d.HD;
        float P = expf(mc__att_dot(qr, k, d.HD, lane) * d.scale - L);
        float dP = mc__att_drop(d, row_index + (uint64_t)t2, mc__att_dot(dyr, k + d.HD, d.HD, lane));
        float ds = P * (dP - D) * d.scale;
#pragma unroll
        for (int j = 0; j < MC__ATT_MAXD; j++) {
            int c = lane + 32 * j;
            if (c < d.HD) dq[j] += ds * mc__ld(k, c);
        }
    }
    T *g = dqkv + mc__att_row(d, t, b) * C3 + head;
#pragma unroll
    for (int j = 0; j < MC__ATT_MAXD; j++) {
        int c = lane + 32 * j;
        if (c < d.HD) mc__st(g, c, dq[j]);
    }
}

/* dk and dv of key row t2 (=) */
template <typename T>
__global__ void mc__k_att_ref_dkdv(T *dqkv, const T *dout, const T *qkv, const float *lse,
                                   const float *delta, mc__att_dims d) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= d.B * d.NH * d.S) return;
    int t2 = r % d.S, h = (r / d.S) % d.NH, b = r / (d.S * d.NH);
    int bh = b * d.NH + h;
    size_t C3 = (size_t)d.NH * 3 * d.HD, head = (size_t)h * 3 * d.HD;
    const T *k = qkv + mc__att_row(d, t2, b) * C3 + head + d.HD;
    float kr[MC__ATT_MAXD], vr[MC__ATT_MAXD], dk[MC__ATT_MAXD], dv[MC__ATT_MAXD];
    mc__att_load(kr, k, d.HD, lane);
    mc__att_load(vr, k + d.HD, d.HD, lane);
#pragma unroll
    for (int j = 0; j < MC__ATT_MAXD; j++) dk[j] = dv[j] = 0.0f;
    for (int t = t2; t < d.S; t++) {
        int rq = bh * d.S + t;
        const T *q = qkv + mc__att_row(d, t, b) * C3 + head;
        const T *dy = dout + mc__att_row(d, t, b) * ((size_t)d.NH * d.HD) + (size_t)h * d.HD;
        uint64_t index = (uint64_t)rq * d.S + (uint64_t)t2;
        float P = expf(mc__att_dot(kr, q, d.HD, lane) * d.scale - lse[rq]);
        float w = mc__att_drop(d, index, P);
        float dP = mc__att_drop(d, index, mc__att_dot(vr, dy, d.HD, lane));
        float ds = P * (dP - delta[rq]) * d.scale;
#pragma unroll
        for (int j = 0; j < MC__ATT_MAXD; j++) {
            int c = lane + 32 * j;
            if (c < d.HD) {
                dv[j] += w * mc__ld(dy, c);
                dk[j] += ds * mc__ld(q, c);
            }
        }
    }
    T *g = dqkv + mc__att_row(d, t2, b) * C3 + head;
#pragma unroll
    for (int j = 0; j < MC__ATT_MAXD; j++) {
        int c = lane + 32 * j;
        if (c < d.HD) {
            mc__st(g + d.HD, c, dk[j]);
            mc__st(g + 2 * d.HD, c, dv[j]);
        }
    }
}

// --- attention, the flash kernels: bf16 tensor cores (mma.sync m16n8k16), no dropout
//
// FlashAttention-2's plan (Dao, 2023): a block of 4 warps owns 64 rows of one (b, h); warp w
// owns rows 16w .. 16w + 15 and walks 64-row tiles of the other operand through shared memory.
// The forward keeps the online softmax in registers (the accumulator layout of one mma is the
// A-operand layout of the next, so P never leaves registers). The backward is two kernels that
// recompute P: one per key tile (dK, dV), one per query tile (dQ), so nothing is accumulated
// with atomics. Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): with g = lane / 4, t = lane % 4,
//   A (16x16, row):  a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8, col):   b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8, fp32):  c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
// where each a / b register holds two bf16, the lower index in the lower half.

#define MC__FT 64          /* rows per tile */
#define MC__FPAD 8         /* row padding of shared tiles (bank conflicts) */

__device__ __forceinline__ void mc__mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t mc__pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ uint32_t mc__ld32(const mc__bf16 *p) { return *(const uint32_t *)p; }

/* A fragment of rows r0 .. r0 + 15, columns k0 .. k0 + 15 of a row-major shared tile. */
__device__ __forceinline__ void mc__frag_a(uint32_t (&a)[4], const mc__bf16 *tile, int ld, int r0,
                                           int k0, int g, int t) {
    a[0] = mc__ld32(tile + (r0 + g) * ld + k0 + 2 * t);
    a[1] = mc__ld32(tile + (r0 + g + 8) * ld + k0 + 2 * t);
    a[2] = mc__ld32(tile + (r0 + g) * ld + k0 + 2 * t + 8);
    a[3] = mc__ld32(tile + (r0 + g + 8) * ld + k0 + 2 * t + 8);
}

/* B fragment (k0 .. k0 + 15) x (n0 .. n0 + 7) from a tile stored n-major: tile[n][k]. */
__device__ __forceinline__ void mc__frag_b(uint32_t &b0, uint32_t &b1, const mc__bf16 *tile, int ld,
                                           int n0, int k0, int g, int t) {
    b0 = mc__ld32(tile + (n0 + g) * ld + k0 + 2 * t);
    b1 = mc__ld32(tile + (n0 + g) * ld + k0 + 2 * t + 8);
}

/* The accumulators of two neighbouring n8 blocks (16 columns) as the A fragment of the next
   product: the P = softmax tile, or dS. */
__device__ __forceinline__ void mc__acc_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                             const float (&c1)[4]) {
    a[0] = mc__pack(c0[0], c0[1]);
    a[1] = mc__pack(c0[2], c0[3]);
    a[2] = mc__pack(c1[0], c1[1]);
    a[3] = mc__pack(c1[2], c1[3]);
}

/* Copies 64 rows x HD of one head's q, k or v (part 0, 1, 2) starting at sequence row s0 into a
   shared tile, row-major [64][HD + pad], or transposed [HD][64 + pad]; rows past S are 0. */
template <int HD>
__device__ __forceinline__ void mc__tile_load(mc__bf16 *tile, const mc__bf16 *base, size_t rstride,
                                              int s0, int S, bool transposed) {
    for (int i = threadIdx.x; i < MC__FT * (HD / 2); i += blockDim.x) {
        int r = i / (HD / 2), c = (i % (HD / 2)) * 2;
        uint32_t v = 0;
        if (s0 + r < S) v = mc__ld32(base + (size_t)(s0 + r) * rstride + c);
        mc__bf16 lo = *(mc__bf16 *)&v, hi = ((mc__bf16 *)&v)[1];
        if (!transposed) {
            *(uint32_t *)(tile + r * (HD + MC__FPAD) + c) = v;
        } else {
            tile[c * (MC__FT + MC__FPAD) + r] = lo;
            tile[(c + 1) * (MC__FT + MC__FPAD) + r] = hi;
        }
    }
}

#define MC__LOG2E 1.4426950408889634f
#define MC__LN2 0.6931471805599453f

/* Forward: grid (ceil(S/64), B*NH), 128 threads. */
template <int HD>
__global__ void __launch_bounds__(128) mc__k_flash_fwd(mc__bf16 *out, float *lse,
                                                       const mc__bf16 *qkv, int S, int B, int NH,
                                                       float scale) {
    extern __shared__ __align__(16) unsigned char mc__smem[];
    const int LD = HD + MC__FPAD, LDT = MC__FT + MC__FPAD;
    mc__bf16 *Qs = (mc__bf16 *)mc__smem, *Ks = Qs + MC__FT * LD, *Vt = Ks + MC__FT * LD;
    int qt = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    size_t rs = (size_t)B * NH * 3 * HD;   /* sequence stride of qkv (row (s, b) = s*B + b) */
    const mc__bf16 *q0 = qkv + (size_t)b * NH * 3 * HD + (size_t)h * 3 * HD;
    mc__tile_load<HD>(Qs, q0, rs, qt * MC__FT, S, false);
    __syncthreads();
    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) mc__frag_a(qa[kk], Qs, LD, warp * 16, kk * 16, g, t);
    float o[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    const float sl2 = scale * MC__LOG2E;
    int qrow0 = qt * MC__FT + warp * 16 + g;   /* this thread's rows qrow0 and qrow0 + 8 */
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads();   /* the previous tile is consumed */
        mc__tile_load<HD>(Ks, q0 + HD, rs, kt * MC__FT, S, false);
        mc__tile_load<HD>(Vt, q0 + 2 * HD, rs, kt * MC__FT, S, true);
        __syncthreads();
        float s[8][4];
#pragma unroll
        for (int nb = 0; nb < 8; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
                uint32_t b0, b1;
                mc__frag_b(b0, b1, Ks, LD, nb * 8, kk * 16, g, t);
                mc__mma(s[nb], qa[kk], b0, b1);
            }
        /* scale into log2 units, mask the future and the rows past S, new row maxima */
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kt * MC__FT + nb * 8 + 2 * t + (e & 1), qr = qrow0 + (e >> 1) * 8;
                float v = s[nb][e] * sl2;
                if (key > qr || key >= S) v = -INFINITY;
                s[nb][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            corr[r] = mx[r] == -INFINITY ? 1.0f : exp2f(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= corr[r];
        }
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++) {
            o[nd][0] *= corr[0];
            o[nd][1] *= corr[0];
            o[nd][2] *= corr[1];
            o[nd][3] *= corr[1];
        }
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float mm = m[e >> 1];
                float p = mm == -INFINITY ? 0.0f : exp2f(s[nb][e] - mm);
                s[nb][e] = p;
                l[e >> 1] += p;
            }
        /* O += P V over the tile's 64 keys, 16 at a time */
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t pa[4];
            mc__acc_to_a(pa, s[2 * j], s[2 * j + 1]);
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) {
                uint32_t b0, b1;
                mc__frag_b(b0, b1, Vt, LDT, nd * 8, j * 16, g, t);
                mc__mma(o[nd], pa, b0, b1);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int qr = qrow0 + r * 8;
        if (qr >= S) continue;
        float inv = 1.0f / l[r];
        mc__bf16 *y = out + ((size_t)qr * B + b) * NH * HD + (size_t)h * HD;
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++)
            *(uint32_t *)(y + nd * 8 + 2 * t) = mc__pack(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
        if (t == 0) lse[(size_t)bh * S + qr] = (m[r] + log2f(l[r])) * MC__LN2;
    }
}

/* Backward, keys: grid (ceil(S/64), B*NH); warp w owns keys 16w.. of key tile blockIdx.x and
   walks the query tiles at or after it. Writes dK and dV (=). */
template <int HD>
__global__ void __launch_bounds__(128) mc__k_flash_dkdv(mc__bf16 *dqkv, const mc__bf16 *dout,
                                                        const mc__bf16 *qkv, const float *lse,
                                                        const float *delta, int S, int B, int NH,
                                                        float scale) {
    extern __shared__ __align__(16) unsigned char mc__smem[];
    const int LD = HD + MC__FPAD, LDT = MC__FT + MC__FPAD;
    mc__bf16 *T0 = (mc__bf16 *)mc__smem;               /* K, then Q */
    mc__bf16 *T1 = T0 + MC__FT * LD;                    /* V, then dO */
    mc__bf16 *Qt = T1 + MC__FT * LD, *dOt = Qt + HD * LDT;
    float *lse_s = (float *)(dOt + HD * LDT), *delta_s = lse_s + MC__FT;
    int kt = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH, nt = (S + MC__FT - 1) / MC__FT;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    size_t rs = (size_t)B * NH * 3 * HD, rso = (size_t)B * NH * HD;
    const mc__bf16 *q0 = qkv + (size_t)b * NH * 3 * HD + (size_t)h * 3 * HD;
    const mc__bf16 *do0 = dout + (size_t)b * NH * HD + (size_t)h * HD;
    mc__tile_load<HD>(T0, q0 + HD, rs, kt * MC__FT, S, false);
    mc__tile_load<HD>(T1, q0 + 2 * HD, rs, kt * MC__FT, S, false);
    __syncthreads();
    uint32_t ka[HD / 16][4], va[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        mc__frag_a(ka[kk], T0, LD, warp * 16, kk * 16, g, t);
        mc__frag_a(va[kk], T1, LD, warp * 16, kk * 16, g, t);
    }
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[nd][e] = dv[nd][e] = 0.0f;
    const float sl2 = scale * MC__LOG2E;
    int key0 = kt * MC__FT + warp * 16 + g;   /* this thread's keys key0 and key0 + 8 */
    for (int qt = kt; qt < nt; qt++) {
        __syncthreads();
        mc__tile_load<HD>(T0, q0, rs, qt * MC__FT, S, false);
        mc__tile_load<HD>(Qt, q0, rs, qt * MC__FT, S, true);
        mc__tile_load<HD>(T1, do0, rso, qt * MC__FT, S, false);
        mc__tile_load<HD>(dOt, do0, rso, qt * MC__FT, S, true);
        for (int i = threadIdx.x; i < MC__FT; i += blockDim.x) {
            int qr = qt * MC__FT + i;
            lse_s[i] = qr < S ? lse[(size_t)bh * S + qr] * MC__LOG2E : 0.0f;
            delta_s[i] = qr < S ? delta[(size_t)bh * S + qr] : 0.0f;
        }
        __syncthreads();
        float p[8][4], ds[8][4];
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) p[nb][e] = ds[nb][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
                uint32_t b0, b1;
                mc__frag_b(b0, b1, T0, LD, nb * 8, kk * 16, g, t);   /* S^T = K Q^T */
                mc__mma(p[nb], ka[kk], b0, b1);
                mc__frag_b(b0, b1, T1, LD, nb * 8, kk * 16, g, t);   /* dP^T = V dO^T */
                mc__mma(ds[nb], va[kk], b0, b1);
            }
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = nb * 8 + 2 * t + (e & 1), qr = qt * MC__FT + col;
                int key = key0 + (e >> 1) * 8;
                float pv = (qr < key || qr >= S || key >= S) ? 0.0f
                                                             : exp2f(p[nb][e] * sl2 - lse_s[col]);
                p[nb][e] = pv;
                ds[nb][e] = pv * (ds[nb][e] - delta_s[col]);
            }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t pa[4], da[4];
            mc__acc_to_a(pa, p[2 * j], p[2 * j + 1]);
            mc__acc_to_a(da, ds[2 * j], ds[2 * j + 1]);
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) {
                uint32_t b0, b1;
                mc__frag_b(b0, b1, dOt, LDT, nd * 8, j * 16, g, t);   /* dV += P^T dO */
                mc__mma(dv[nd], pa, b0, b1);
                mc__frag_b(b0, b1, Qt, LDT, nd * 8, j * 16, g, t);    /* dK += dS^T Q */
                mc__mma(dk[nd], da, b0, b1);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = key0 + r * 8;
        if (key >= S) continue;
        mc__bf16 *gk = dqkv + ((size_t)key * B + b) * NH * 3 * HD + (size_t)h * 3 * HD + HD;
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++) {
            *(uint32_t *)(gk + nd * 8 + 2 * t) =
                mc__pack(dk[nd][2 * r] * scale, dk[nd][2 * r + 1] * scale);
            *(uint32_t *)(gk + HD + nd * 8 + 2 * t) = mc__pack(dv[nd][2 * r], dv[nd][2 * r + 1]);
        }
    }
}

/* Backward, queries: warp w owns queries 16w.. of query tile blockIdx.x. Writes dQ (=). */
template <int HD>
__global__ void __launch_bounds__(128) mc__k_flash_dq(mc__bf16 *dqkv, const mc__bf16 *dout,
                                                      const mc__bf16 *qkv, const float *lse,
                                                      const float *delta, int S, int B, int NH,
                                                      float scale) {
    extern __shared__ __align__(16) unsigned char mc__smem[];
    const int LD = HD + MC__FPAD, LDT = MC__FT + MC__FPAD;
    mc__bf16 *T0 = (mc__bf16 *)mc__smem;   /* Q, then K */
    mc__bf16 *T1 = T0 + MC__FT * LD;        /* dO, then V */
    mc__bf16 *Kt = T1 + MC__FT * LD;
    int qt = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    size_t rs = (size_t)B * NH * 3 * HD, rso = (size_t)B * NH * HD;
    const mc__bf16 *q0 = qkv + (size_t)b * NH * 3 * HD + (size_t)h * 3 * HD;
    const mc__bf16 *do0 = dout + (size_t)b * NH * HD + (size_t)h * HD;
    mc__tile_load<HD>(T0, q0, rs, qt * MC__FT, S, false);
    mc__tile_load<HD>(T1, do0, rso, qt * MC__FT, S, false);
    __syncthreads();
    uint32_t qa[HD / 16][4], oa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        mc__frag_a(qa[kk], T0, LD, warp * 16, kk * 16, g, t);
        mc__frag_a(oa[kk], T1, LD, warp * 16, kk * 16, g, t);
    }
    int qrow0 = qt * MC__FT + warp * 16 + g;
    float L[2], D[2], dq[HD / 8][4];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int qr = qrow0 + r * 8;
        L[r] = qr < S ? lse[(size_t)bh * S + qr] * MC__LOG2E : 0.0f;
        D[r] = qr < S ? delta[(size_t)bh * S + qr] : 0.0f;
    }
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) dq[nd][e] = 0.0f;
    const float sl2 = scale * MC__LOG2E;
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads();
        mc__tile_load<HD>(T0, q0 + HD, rs, kt * MC__FT, S, false);
        mc__tile_load<HD>(Kt, q0 + HD, rs, kt * MC__FT, S, true);
        mc__tile_load<HD>(T1, q0 + 2 * HD, rs, kt * MC__FT, S, false);
        __syncthreads();
        float p[8][4], ds[8][4];
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) p[nb][e] = ds[nb][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
                uint32_t b0, b1;
                mc__frag_b(b0, b1, T0, LD, nb * 8, kk * 16, g, t);   /* S = Q K^T */
                mc__mma(p[nb], qa[kk], b0, b1);
                mc__frag_b(b0, b1, T1, LD, nb * 8, kk * 16, g, t);   /* dP = dO V^T */
                mc__mma(ds[nb], oa[kk], b0, b1);
            }
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kt * MC__FT + nb * 8 + 2 * t + (e & 1), qr = qrow0 + (e >> 1) * 8;
                float pv = (key > qr || key >= S || qr >= S)
                               ? 0.0f : exp2f(p[nb][e] * sl2 - L[e >> 1]);
                ds[nb][e] = pv * (ds[nb][e] - D[e >> 1]);
            }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t da[4];
            mc__acc_to_a(da, ds[2 * j], ds[2 * j + 1]);
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) {
                uint32_t b0, b1;
                mc__frag_b(b0, b1, Kt, LDT, nd * 8, j * 16, g, t);   /* dQ += dS K */
                mc__mma(dq[nd], da, b0, b1);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int qr = qrow0 + r * 8;
        if (qr >= S) continue;
        mc__bf16 *gq = dqkv + ((size_t)qr * B + b) * NH * 3 * HD + (size_t)h * 3 * HD;
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++)
            *(uint32_t *)(gq + nd * 8 + 2 * t) =
                mc__pack(dq[nd][2 * r] * scale, dq[nd][2 * r + 1] * scale);
    }
}

// ---------------------------------------------------------------------------------------------
// >>cuda cudnn  Fused flash attention through cuDNN 9's backend graph API (no frontend headers).
//
// The graphs are the ones cuDNN's frontend builds for causal SDPA, op by op: the runtime fusion
// engines recognise them and run one fused kernel. Forward:
//     S = (Q K^T) * scale; causal select (row >= col ? S : lowest); softmax with the row
//     statistics lse = max + log(sum exp) kept; O = P V
// backward (P recomputed from lse):
//     sums = rowsum(dO * O); P = exp(S - lse); dV = P^T dO; dS = P (dO V^T - sums) * scale;
//     dQ = dS K; dK = dS^T Q
// Q, K, V, O and their gradients are [b, h, s, d] views with Megatron's strides (no copies).
// A graph that cuDNN cannot build or plan makes the op fall back to the own kernels (auto mode,
// logged once) or fail naming the step (forced cuDNN).

/* Unique ids of the graphs' tensors (the variant pack binds them to memory). */
enum { MC__UID_Q = 1, MC__UID_K, MC__UID_V, MC__UID_O, MC__UID_DO, MC__UID_STATS, MC__UID_DQ,
       MC__UID_DK, MC__UID_DV, MC__UID_SCALE, MC__UID_NEGINF, MC__UID_SUMS, MC__UID_ONE,
       MC__UID_DQACC, MC__UID_VIRT = 100 };

typedef struct mc__dnn_plan {
    int S, B, NH, HD, backward;
    cudnnBackendDescriptor_t plan;   /* NULL: this shape failed (fall back) */
    int64_t workspace;
} mc__dnn_plan;

#define MC__DNN_PLANS 16

/* The compute half's state (mc__cuda_ctx.compute). */
typedef struct mc__cuda_compute {
    cublasLtHandle_t lt;
    cudnnHandle_t dnn;               /* NULL when cuDNN could not start */
    char dnn_error[256];             /* why, or the first graph that failed */
    mc__dnn_plan plans[MC__DNN_PLANS];
    int n_plans;
    struct mc__lt_plan *lt_plans;    /* cached cuBLASLt descriptors and algorithms */
    int n_lt, cap_lt;
    float *att_delta;                /* [B*NH*S] scratch of the attention backward */
    size_t att_delta_n;
    float *att_dq;                   /* [B*NH*S*HD] cuDNN's fp32 dQ accumulator */
    size_t att_dq_n;
    int att_last[2];                 /* last forward / backward: 0 none, 1 ref, 2 flash, 3 cuDNN */
    char kernels[400];
    char describe[160];
    long gelu_fused[2], gelu_unfused[2];   /* gemm_gelu_forward / _backward calls, each way */
    char fuse_why[200];              /* why the last call with fusion on ran unfused */
    char fusion[400];
    int warned_fallback;
    /* profiling (mc_ops_cuda_profile) */
    int prof_on;
    struct mc__prof_rec *prof;
    int n_prof, cap_prof;
} mc__cuda_compute;

static mc__cuda_compute *mc__comp(const mc_ops *o) {
    return (mc__cuda_compute *)mc__cuda_get(o)->compute;
}

#if !defined(MC_NO_CUDNN)
static int mc__dnn_fail(cudnnStatus_t st, const char *step, char *why, size_t cap) {
    char last[256] = "";
    cudnnGetLastErrorString(last, sizeof last);
    snprintf(why, cap, "%s: %s%s%s", step, cudnnGetErrorString(st), last[0] ? " - " : "", last);
    return MC_ERR_CUDA;
}

#define MC__DNN(step, call)                                                                    \
    do {                                                                                       \
        cudnnStatus_t mc__s = (call);                                                          \
        if (mc__s != CUDNN_STATUS_SUCCESS) return mc__dnn_fail(mc__s, (step), why, why_cap);   \
    } while (0)

/* The descriptors a graph is built from, destroyed together. */
typedef struct mc__dnn_build {
    cudnnBackendDescriptor_t d[192];
    int n;
    cudnnBackendDescriptor_t ops[64];
    int n_ops;
} mc__dnn_build;

static void mc__dnn_build_free(mc__dnn_build *g) {
    for (int i = g->n - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->d[i]);
    g->n = 0;
}

static int mc__dnn_new(mc__dnn_build *g, cudnnBackendDescriptorType_t type,
                       cudnnBackendDescriptor_t *out, char *why, size_t why_cap) {
    if (g->n >= 192 || g->n_ops >= 64) {
        snprintf(why, why_cap, "graph builder: too many descriptors");
        return MC_ERR_CUDA;
    }
    MC__DNN("cudnnBackendCreateDescriptor", cudnnBackendCreateDescriptor(type, out));
    g->d[g->n++] = *out;
    return MC_OK;
}

#define MC__DNN_TRY(x)                                                                         \
    do {                                                                                       \
        int mc__r = (x);                                                                       \
        if (mc__r != MC_OK) return mc__r;                                                      \
    } while (0)

/* A 4-D tensor [b, h, r, c] (virtual: an intermediate with no memory). */
static int mc__dnn_tensor(mc__dnn_build *g, cudnnBackendDescriptor_t *out, int64_t uid,
                          cudnnDataType_t dt, const int64_t dims[4], const int64_t strides[4],
                          bool is_virtual, bool by_value, char *why, size_t why_cap) {
    int64_t align = 16;
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, out, why, why_cap));
    MC__DNN("tensor dtype", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DATA_TYPE,
                                                     CUDNN_TYPE_DATA_TYPE, 1, &dt));
    MC__DNN("tensor dims", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DIMENSIONS,
                                                    CUDNN_TYPE_INT64, 4, dims));
    MC__DNN("tensor strides", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_STRIDES,
                                                       CUDNN_TYPE_INT64, 4, strides));
    MC__DNN("tensor uid", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_UNIQUE_ID,
                                                   CUDNN_TYPE_INT64, 1, &uid));
    MC__DNN("tensor alignment", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
                                                         CUDNN_TYPE_INT64, 1, &align));
    MC__DNN("tensor virtual", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_IS_VIRTUAL,
                                                       CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
    if (by_value)
        MC__DNN("tensor by value", cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                                                            CUDNN_TYPE_BOOLEAN, 1, &by_value));
    MC__DNN("tensor finalize", cudnnBackendFinalize(*out));
    return MC_OK;
}

/* y = mode(x [, b [, t]]) */
static int mc__dnn_pointwise(mc__dnn_build *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                             cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                             cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis,
                             char *why, size_t why_cap) {
    cudnnBackendDescriptor_t pw, op;
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw, why, why_cap));
    MC__DNN("pointwise mode", cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE,
                                                       CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    MC__DNN("pointwise precision", cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC,
                                                            CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
        MC__DNN("pointwise axis", cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_AXIS,
                                                           CUDNN_TYPE_INT64, 1, &axis));
    MC__DNN("pointwise finalize", cudnnBackendFinalize(pw));
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op, why, why_cap));
    MC__DNN("pointwise op", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
    MC__DNN("pointwise x", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (b)
        MC__DNN("pointwise b", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    if (t)
        MC__DNN("pointwise t", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t));
    MC__DNN("pointwise y", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    MC__DNN("pointwise op finalize", cudnnBackendFinalize(op));
    g->ops[g->n_ops++] = op;
    return MC_OK;
}

static int mc__dnn_matmul(mc__dnn_build *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                          cudnnBackendDescriptor_t c, char *why, size_t why_cap) {
    cudnnBackendDescriptor_t mm, op;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm, why, why_cap));
    MC__DNN("matmul precision", cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE,
                                                         CUDNN_TYPE_DATA_TYPE, 1, &prec));
    MC__DNN("matmul finalize", cudnnBackendFinalize(mm));
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op, why, why_cap));
    MC__DNN("matmul a", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    MC__DNN("matmul b", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    MC__DNN("matmul c", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    MC__DNN("matmul desc", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm));
    MC__DNN("matmul op finalize", cudnnBackendFinalize(op));
    g->ops[g->n_ops++] = op;
    return MC_OK;
}

static int mc__dnn_reduce(mc__dnn_build *g, cudnnReduceTensorOp_t kind,
                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, char *why,
                          size_t why_cap) {
    cudnnBackendDescriptor_t rd, op;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &rd, why, why_cap));
    MC__DNN("reduction operator", cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_OPERATOR,
                                                           CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
                                                           &kind));
    MC__DNN("reduction precision", cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE,
                                                            CUDNN_TYPE_DATA_TYPE, 1, &prec));
    MC__DNN("reduction finalize", cudnnBackendFinalize(rd));
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &op, why, why_cap));
    MC__DNN("reduction x", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    MC__DNN("reduction y", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    MC__DNN("reduction desc", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
                                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd));
    MC__DNN("reduction op finalize", cudnnBackendFinalize(op));
    g->ops[g->n_ops++] = op;
    return MC_OK;
}

static int mc__dnn_reshape(mc__dnn_build *g, cudnnBackendDescriptor_t x,
                           cudnnBackendDescriptor_t y, char *why, size_t why_cap) {
    cudnnBackendDescriptor_t op;
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, &op, why, why_cap));
    MC__DNN("reshape x", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    MC__DNN("reshape y", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    MC__DNN("reshape op finalize", cudnnBackendFinalize(op));
    g->ops[g->n_ops++] = op;
    return MC_OK;
}

/* The operation graph -> heuristics (mode A) -> the first engine config that plans. The plan
   outlives the build (its descriptors are destroyed by the caller). */
static int mc__dnn_plan_graph(cudnnHandle_t h, mc__dnn_build *g, cudnnBackendDescriptor_t *plan,
                              int64_t *workspace, char *why, size_t why_cap) {
    cudnnBackendDescriptor_t graph, heur, cfg[8];
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    int64_t n_cfg = 0;
    int made = 0;
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph, why, why_cap));
    MC__DNN("graph ops", cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops));
    MC__DNN("graph handle", cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                                     CUDNN_TYPE_HANDLE, 1, &h));
    MC__DNN("graph finalize", cudnnBackendFinalize(graph));
    MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur, why, why_cap));
    MC__DNN("heuristics graph", cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
    MC__DNN("heuristics mode", cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE,
                                                        CUDNN_TYPE_HEUR_MODE, 1, &mode));
    MC__DNN("heuristics finalize", cudnnBackendFinalize(heur));
    for (int i = 0; i < 8; i++)
        MC__DNN_TRY(mc__dnn_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[i], why, why_cap));
    MC__DNN("heuristics results", cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 8,
                                                           &n_cfg, cfg));
    if (n_cfg <= 0) {
        snprintf(why, why_cap, "heuristics: no engine supports the graph");
        return MC_ERR_CUDA;
    }
    cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
    for (int64_t i = 0; i < n_cfg && !made; i++) {
        cudnnBackendDescriptor_t p = NULL;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) !=
            CUDNN_STATUS_SUCCESS)
            continue;
        last = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        if (last == CUDNN_STATUS_SUCCESS)
            last = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (last == CUDNN_STATUS_SUCCESS) last = cudnnBackendFinalize(p);
        if (last == CUDNN_STATUS_SUCCESS) {
            int64_t n = 0;
            last = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                            CUDNN_TYPE_INT64, 1, &n, workspace);
        }
        if (last == CUDNN_STATUS_SUCCESS) {
            *plan = p;
            made = 1;
        } else {
            cudnnBackendDestroyDescriptor(p);
        }
    }
    if (!made) return mc__dnn_fail(last, "execution plan (every engine config)", why, why_cap);
    return MC_OK;
}

/* Megatron's [s, b, h, d] storage as the [b, h, s, d] tensor cuDNN reads; `row` is the
   elements per token (3 NH HD for q/k/v, NH HD for o). transposed: [b, h, d, s]. */
static void mc__dnn_bhsd(int64_t dims[4], int64_t strides[4], int S, int B, int NH, int HD,
                         int64_t row, int64_t head, int transposed) {
    dims[0] = B;
    dims[1] = NH;
    strides[0] = row;
    strides[1] = head;
    if (!transposed) {
        dims[2] = S;
        dims[3] = HD;
        strides[2] = row * B;
        strides[3] = 1;
    } else {
        dims[2] = HD;
        dims[3] = S;
        strides[2] = 1;
        strides[3] = row * B;
    }
}


/* S = (Q K^T) * scale as a float virtual [b, h, s, s]: the part both graphs share. K enters as
   the real tensor K^T (K's memory and unique id, transposed dims and strides), as the frontend
   maps it; the backward reshapes it back to K for dQ. */
static int mc__dnn_scores(mc__dnn_build *g, int S, int B, int NH, int HD,
                          cudnnBackendDescriptor_t *scores, cudnnBackendDescriptor_t *q_out,
                          cudnnBackendDescriptor_t *kt_out, cudnnBackendDescriptor_t *scale_out,
                          int64_t *vuid, char *why, size_t why_cap) {
    int64_t dq[4], sq[4], dk[4], sk[4], ds[4], ss[4], d1[4] = {1, 1, 1, 1}, s1[4] = {1, 1, 1, 1};
    int64_t row = 3LL * NH * HD, head = 3LL * HD;
    cudnnBackendDescriptor_t tq, tkt, s0, scale, s1v;
    mc__dnn_bhsd(dq, sq, S, B, NH, HD, row, head, 0);
    mc__dnn_bhsd(dk, sk, S, B, NH, HD, row, head, 1);
    ds[0] = B, ds[1] = NH, ds[2] = S, ds[3] = S;
    ss[0] = (int64_t)NH * S * S, ss[1] = (int64_t)S * S, ss[2] = S, ss[3] = 1;
    MC__DNN_TRY(mc__dnn_tensor(g, &tq, MC__UID_Q, CUDNN_DATA_BFLOAT16, dq, sq, false, false, why, why_cap));
    MC__DNN_TRY(mc__dnn_tensor(g, &tkt, MC__UID_K, CUDNN_DATA_BFLOAT16, dk, sk, false, false, why, why_cap));
    MC__DNN_TRY(mc__dnn_tensor(g, &s0, (*vuid)++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__DNN_TRY(mc__dnn_matmul(g, tq, tkt, s0, why, why_cap));
    MC__DNN_TRY(mc__dnn_tensor(g, &scale, MC__UID_SCALE, CUDNN_DATA_FLOAT, d1, s1, false, true, why, why_cap));
    MC__DNN_TRY(mc__dnn_tensor(g, &s1v, (*vuid)++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__DNN_TRY(mc__dnn_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s0, scale, NULL, s1v, 0, why, why_cap));
    *scores = s1v;
    *q_out = tq;
    *kt_out = tkt;
    *scale_out = scale;
    return MC_OK;
}

/* The causal mask on a float virtual [b, h, s, s]: row >= col ? x : -inf (the frontend's
   composite diagonal band with right bound 0). */
static int mc__dnn_causal(mc__dnn_build *g, int S, int B, int NH, cudnnBackendDescriptor_t x,
                          cudnnBackendDescriptor_t *out, int64_t *vuid, char *why,
                          size_t why_cap) {
    int64_t ds[4], ss[4], d1[4] = {1, 1, 1, 1}, s1[4] = {1, 1, 1, 1};
    cudnnBackendDescriptor_t ri, ci, mask, neg, y;
    ds[0] = B, ds[1] = NH, ds[2] = S, ds[3] = S;
    ss[0] = (int64_t)NH * S * S, ss[1] = (int64_t)S * S, ss[2] = S, ss[3] = 1;
    MC__DNN_TRY(mc__dnn_tensor(g, &ri, (*vuid)++, CUDNN_DATA_INT32, ds, ss, true, false, why, why_cap));
    MC__DNN_TRY(mc__dnn_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, NULL, NULL, ri, 2, why, why_cap));
    MC__DNN_TRY(mc__dnn_tensor(g, &ci, (*vuid)++, CUDNN_DATA_INT32, ds, ss, true, false, why, why_cap));
    MC__DNN_TRY(mc__dnn_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, NULL, NULL, ci, 3, why, why_cap));
    MC__DNN_TRY(mc__dnn_tensor(g, &mask, (*vuid)++, CUDNN_DATA_BOOLEAN, ds, ss, true, false, why, why_cap));
    MC__DNN_TRY(mc__dnn_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, ri, ci, NULL, mask, 0, why, why_cap));
    MC__DNN_TRY(mc__dnn_tensor(g, &neg, MC__UID_NEGINF, CUDNN_DATA_FLOAT, d1, s1, false, true, why, why_cap));
    MC__DNN_TRY(mc__dnn_tensor(g, &y, (*vuid)++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__DNN_TRY(mc__dnn_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg, mask, y, 0, why, why_cap));
    *out = y;
    return MC_OK;
}


static int mc__dnn_build_fwd(cudnnHandle_t h, int S, int B, int NH, int HD,
                             cudnnBackendDescriptor_t *plan, int64_t *ws, char *why,
                             size_t why_cap) {
    mc__dnn_build g;
    memset(&g, 0, sizeof g);
    int64_t vuid = MC__UID_VIRT, dv[4], sv[4], dout[4], sout[4], dr[4], sr[4], ds[4], ss[4];
    cudnnBackendDescriptor_t s0, s, tq, tkt, scale, mx, sub, ex, sum, lg, stats, p, tv, to;
    int rc = mc__dnn_scores(&g, S, B, NH, HD, &s0, &tq, &tkt, &scale, &vuid, why, why_cap);
    mc__dnn_bhsd(dv, sv, S, B, NH, HD, 3LL * NH * HD, 3LL * HD, 0);
    mc__dnn_bhsd(dout, sout, S, B, NH, HD, (int64_t)NH * HD, HD, 0);
    ds[0] = B, ds[1] = NH, ds[2] = S, ds[3] = S;
    ss[0] = (int64_t)NH * S * S, ss[1] = (int64_t)S * S, ss[2] = S, ss[3] = 1;
    dr[0] = B, dr[1] = NH, dr[2] = S, dr[3] = 1;
    sr[0] = (int64_t)NH * S, sr[1] = S, sr[2] = 1, sr[3] = 1;
#define MC__B(x) if (rc == MC_OK) rc = (x)
    MC__B(mc__dnn_causal(&g, S, B, NH, s0, &s, &vuid, why, why_cap));
    /* softmax with the statistics: lse = max + log(sum exp(s - max)), P = exp(s - max) / sum */
    MC__B(mc__dnn_tensor(&g, &mx, vuid++, CUDNN_DATA_FLOAT, dr, sr, true, false, why, why_cap));
    MC__B(mc__dnn_reduce(&g, CUDNN_REDUCE_TENSOR_MAX, s, mx, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &sub, vuid++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s, mx, NULL, sub, 0, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &ex, vuid++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, ex, 0, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &sum, vuid++, CUDNN_DATA_FLOAT, dr, sr, true, false, why, why_cap));
    MC__B(mc__dnn_reduce(&g, CUDNN_REDUCE_TENSOR_ADD, ex, sum, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &lg, vuid++, CUDNN_DATA_FLOAT, dr, sr, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, NULL, NULL, lg, 0, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &stats, MC__UID_STATS, CUDNN_DATA_FLOAT, dr, sr, false, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, lg, NULL, stats, 0, why, why_cap));
    /* P enters the second matmul in the i/o type (bf16), as the fused engine requires */
    MC__B(mc__dnn_tensor(&g, &p, vuid++, CUDNN_DATA_BFLOAT16, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, ex, sum, NULL, p, 0, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &tv, MC__UID_V, CUDNN_DATA_BFLOAT16, dv, sv, false, false, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &to, MC__UID_O, CUDNN_DATA_BFLOAT16, dout, sout, false, false, why, why_cap));
    MC__B(mc__dnn_matmul(&g, p, tv, to, why, why_cap));
    MC__B(mc__dnn_plan_graph(h, &g, plan, ws, why, why_cap));
    mc__dnn_build_free(&g);
    return rc;
}

/* The backward in the frontend's composite order (cuDNN >= 9: dQ accumulates in an fp32
   [b, h, s, d] tensor, then an identity writes the bf16 dQ). */
static int mc__dnn_build_bwd(cudnnHandle_t h, int S, int B, int NH, int HD,
                             cudnnBackendDescriptor_t *plan, int64_t *ws, char *why,
                             size_t why_cap) {
    mc__dnn_build g;
    memset(&g, 0, sizeof g);
    int64_t vuid = MC__UID_VIRT, dqkv[4], sqkv[4], dvt[4], svt[4], dout[4], sout[4];
    int64_t dr[4], sr[4], ds[4], ss[4], dst[4], sst[4], dbig[4], sbig[4], dacc[4], sacc[4];
    int64_t d1[4] = {1, 1, 1, 1}, s1[4] = {1, 1, 1, 1};
    cudnnBackendDescriptor_t s0, tq, tkt, scale, tdo, to, doo, red, one, sums, stats, sub, msk, p,
        pt, tdv, tvt, dp, ds1, ds2, dS, dst_, tdk, kv, acc, tdq;
    int rc = mc__dnn_scores(&g, S, B, NH, HD, &s0, &tq, &tkt, &scale, &vuid, why, why_cap);
    mc__dnn_bhsd(dqkv, sqkv, S, B, NH, HD, 3LL * NH * HD, 3LL * HD, 0);
    mc__dnn_bhsd(dvt, svt, S, B, NH, HD, 3LL * NH * HD, 3LL * HD, 1);
    mc__dnn_bhsd(dout, sout, S, B, NH, HD, (int64_t)NH * HD, HD, 0);
    dbig[0] = B, dbig[1] = NH, dbig[2] = S, dbig[3] = HD;   /* dO * O, as the frontend strides it */
    sbig[0] = (int64_t)NH * S * HD, sbig[1] = (int64_t)S * HD, sbig[2] = (int64_t)NH * HD, sbig[3] = 1;
    dacc[0] = B, dacc[1] = NH, dacc[2] = S, dacc[3] = HD;   /* the fp32 dQ accumulator, packed */
    sacc[0] = (int64_t)NH * S * HD, sacc[1] = (int64_t)S * HD, sacc[2] = HD, sacc[3] = 1;
    ds[0] = B, ds[1] = NH, ds[2] = S, ds[3] = S;
    ss[0] = (int64_t)NH * S * S, ss[1] = (int64_t)S * S, ss[2] = S, ss[3] = 1;
    dst[0] = B, dst[1] = NH, dst[2] = S, dst[3] = S;         /* the transposed view */
    sst[0] = (int64_t)NH * S * S, sst[1] = (int64_t)S * S, sst[2] = 1, sst[3] = S;
    dr[0] = B, dr[1] = NH, dr[2] = S, dr[3] = 1;
    sr[0] = (int64_t)NH * S, sr[1] = S, sr[2] = 1, sr[3] = 1;
    /* sums = rowsum(dO * O) * 1 (the frontend's dropout-free scale), kept in fp32 memory */
    MC__B(mc__dnn_tensor(&g, &tdo, MC__UID_DO, CUDNN_DATA_BFLOAT16, dout, sout, false, false, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &to, MC__UID_O, CUDNN_DATA_BFLOAT16, dout, sout, false, false, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &doo, vuid++, CUDNN_DATA_FLOAT, dbig, sbig, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, tdo, to, NULL, doo, 0, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &red, vuid++, CUDNN_DATA_FLOAT, dr, sr, true, false, why, why_cap));
    MC__B(mc__dnn_reduce(&g, CUDNN_REDUCE_TENSOR_ADD, doo, red, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &one, MC__UID_ONE, CUDNN_DATA_FLOAT, d1, s1, false, true, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &sums, MC__UID_SUMS, CUDNN_DATA_FLOAT, dr, sr, false, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, red, one, NULL, sums, 0, why, why_cap));
    /* P = exp(mask(S - lse)); dV = P^T dO */
    MC__B(mc__dnn_tensor(&g, &stats, MC__UID_STATS, CUDNN_DATA_FLOAT, dr, sr, false, false, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &sub, vuid++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s0, stats, NULL, sub, 0, why, why_cap));
    MC__B(mc__dnn_causal(&g, S, B, NH, sub, &msk, &vuid, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &p, vuid++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, msk, NULL, NULL, p, 0, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &pt, vuid++, CUDNN_DATA_BFLOAT16, dst, sst, true, false, why, why_cap));
    MC__B(mc__dnn_reshape(&g, p, pt, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &tdv, MC__UID_DV, CUDNN_DATA_BFLOAT16, dqkv, sqkv, false, false, why, why_cap));
    MC__B(mc__dnn_matmul(&g, pt, tdo, tdv, why, why_cap));
    /* dS = P (dO V^T - sums) * scale */
    MC__B(mc__dnn_tensor(&g, &tvt, MC__UID_V, CUDNN_DATA_BFLOAT16, dvt, svt, false, false, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &dp, vuid++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_matmul(&g, tdo, tvt, dp, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &ds1, vuid++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, sums, NULL, ds1, 0, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &ds2, vuid++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, ds1, p, NULL, ds2, 0, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &dS, vuid++, CUDNN_DATA_FLOAT, ds, ss, true, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, ds2, scale, NULL, dS, 0, why, why_cap));
    /* dK = dS^T Q */
    MC__B(mc__dnn_tensor(&g, &dst_, vuid++, CUDNN_DATA_BFLOAT16, dst, sst, true, false, why, why_cap));
    MC__B(mc__dnn_reshape(&g, dS, dst_, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &tdk, MC__UID_DK, CUDNN_DATA_BFLOAT16, dqkv, sqkv, false, false, why, why_cap));
    MC__B(mc__dnn_matmul(&g, dst_, tq, tdk, why, why_cap));
    /* dQ = dS K: K from K^T by a reshape, into the fp32 accumulator, then to bf16 */
    MC__B(mc__dnn_tensor(&g, &kv, vuid++, CUDNN_DATA_BFLOAT16, dqkv, sqkv, true, false, why, why_cap));
    MC__B(mc__dnn_reshape(&g, tkt, kv, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &acc, MC__UID_DQACC, CUDNN_DATA_FLOAT, dacc, sacc, false, false, why, why_cap));
    MC__B(mc__dnn_matmul(&g, dS, kv, acc, why, why_cap));
    MC__B(mc__dnn_tensor(&g, &tdq, MC__UID_DQ, CUDNN_DATA_BFLOAT16, dqkv, sqkv, false, false, why, why_cap));
    MC__B(mc__dnn_pointwise(&g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, NULL, NULL, tdq, 0, why, why_cap));
#undef MC__B
    if (rc == MC_OK) rc = mc__dnn_plan_graph(h, &g, plan, ws, why, why_cap);
    mc__dnn_build_free(&g);
    return rc;
}

#endif /* !MC_NO_CUDNN */

// ---------------------------------------------------------------------------------------------
// >>cuda gemm  cuBLASLt: row-major C[M,N] = alpha op(A) op(B) + beta C (+ bias) as the
// column-major product C^T[N,M] = op(B)^T op(A)^T, so B is cuBLAS's first operand. fp32
// accumulation always; fp32 inputs use full fp32 (no TF32 unless the context allows it); the
// bias rides in the epilogue. Descriptors, layouts and the heuristic's algorithm are made once
// per (shape, transposes, types, bias, alignment) and cached.

struct mc__lt_plan {
    int M, N, K, ta, tb, bias, align;
    int epi;                         /* 0 none / bias, 1 GELU_AUX(_BIAS), 2 DGELU */
    int unsupported;                 /* an epilogue plan cuBLASLt refused: run unfused */
    mc_dtype c_dt, ab_dt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

static cudaDataType_t mc__cuda_type(mc_dtype dt) {
    return dt == MC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static const char *mc__lt_status(cublasStatus_t st) {
    switch (st) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "cublasStatus_t (other)";
    }
}

#define MC__LT(call, ...)                                                                      \
    do {                                                                                       \
        cublasStatus_t mc__st = (call);                                                        \
        if (mc__st != CUBLAS_STATUS_SUCCESS) {                                                 \
            char mc__d[256];                                                                   \
            snprintf(mc__d, sizeof mc__d, __VA_ARGS__);                                        \
            return mc__set_error(MC_ERR_CUDA, "cuda gemm: %s failed: %s [%s]", #call,          \
                                 mc__lt_status(mc__st), mc__d);                                \
        }                                                                                      \
    } while (0)

/* The largest power of two (<= 16) dividing every address: cuBLASLt's alignment classes. */
static int mc__align_of(const void *a, const void *b, const void *c, const void *bias) {
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)bias | 16u;
    return (int)(x & (~x + 1));
}

static int mc__lt_make(mc__cuda_ctx *cx, mc__cuda_compute *cc, struct mc__lt_plan *p) {
    const char *shape = "";
    char sh[160];
    snprintf(sh, sizeof sh, "M %d N %d K %d ta %d tb %d c %s ab %s bias %d align %d", p->M, p->N,
             p->K, p->ta, p->tb, p->c_dt == MC_BF16 ? "bf16" : "f32",
             p->ab_dt == MC_BF16 ? "bf16" : "f32", p->bias, p->align);
    shape = sh;
    cublasComputeType_t compute = (p->ab_dt == MC_F32 && cx->tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                     : CUBLAS_COMPUTE_32F;
    MC__LT(cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F), "%s", shape);
    cublasOperation_t opa = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;   /* cuBLAS A = our B */
    cublasOperation_t opb = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;   /* cuBLAS B = our A */
    MC__LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
           "%s", shape);
    MC__LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
           "%s", shape);
    if (p->epi) {
        /* GELU's forward keeps its input (the pre-activation) in the aux matrix, laid out as
           D (ld N); the backward reads it. A refusal here is not an error: the op runs
           unfused. */
        cublasLtEpilogue_t epi = p->epi == 2 ? CUBLASLT_EPILOGUE_DGELU
                                 : p->bias   ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                             : CUBLASLT_EPILOGUE_GELU_AUX;
        cudaDataType_t bt = mc__cuda_type(p->ab_dt);
        int64_t ld = p->N;
        /* the heuristic reads the aux pointer's value for its alignment: a stand-in aligned
           exactly as the plan's class, so that every call of the class (aux checked to it)
           fits the algorithm; the real pointer is set per call */
        void *aux_hint = (void *)(uintptr_t)p->align;
        if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                           sizeof epi) != CUBLAS_STATUS_SUCCESS ||
            (p->bias && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                       &bt, sizeof bt) != CUBLAS_STATUS_SUCCESS) ||
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                           sizeof ld) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                           &aux_hint, sizeof aux_hint) != CUBLAS_STATUS_SUCCESS) {
            p->unsupported = 1;
            return MC_OK;
        }
    } else if (p->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = mc__cuda_type(p->ab_dt);
        MC__LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                              sizeof epi), "%s", shape);
        MC__LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                              sizeof bt), "%s", shape);
    }
    /* the stored matrices, column-major: B [N, K] (ld N) or [K, N] (ld K); A [K, M] (ld K)
       or [M, K] (ld M); C [N, M] (ld N) */
    MC__LT(cublasLtMatrixLayoutCreate(&p->a, mc__cuda_type(p->ab_dt), p->tb ? p->K : p->N,
                                      p->tb ? p->N : p->K, p->tb ? p->K : p->N), "%s", shape);
    MC__LT(cublasLtMatrixLayoutCreate(&p->b, mc__cuda_type(p->ab_dt), p->ta ? p->M : p->K,
                                      p->ta ? p->K : p->M, p->ta ? p->M : p->K), "%s", shape);
    MC__LT(cublasLtMatrixLayoutCreate(&p->c, mc__cuda_type(p->c_dt), p->N, p->M, p->N), "%s",
           shape);
    cublasLtMatmulPreference_t pref;
    MC__LT(cublasLtMatmulPreferenceCreate(&pref), "%s", shape);
    uint64_t ws = cx->workspace_bytes;
    uint32_t al = (uint32_t)p->align;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
                                         sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
                                         sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                         sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                         sizeof al);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cc->lt, p->op, p->a, p->b, p->c, p->c, pref,
                                                       1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if ((st != CUBLAS_STATUS_SUCCESS || found == 0) && p->epi) {
        p->unsupported = 1;
        return MC_OK;
    }
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
        return mc__set_error(MC_ERR_CUDA, "cuda gemm: no cuBLASLt algorithm (%s) for %s",
                             mc__lt_status(st), shape);
    p->algo = res.algo;
    return MC_OK;
}

static int mc__lt_find(mc__cuda_ctx *cx, mc__cuda_compute *cc, const struct mc__lt_plan *key,
                       struct mc__lt_plan **out) {
    for (int i = 0; i < cc->n_lt; i++) {
        struct mc__lt_plan *p = &cc->lt_plans[i];
        if (p->M == key->M && p->N == key->N && p->K == key->K && p->ta == key->ta &&
            p->tb == key->tb && p->bias == key->bias && p->align == key->align &&
            p->epi == key->epi &&
            p->c_dt == key->c_dt && p->ab_dt == key->ab_dt) {
            *out = p;
            return MC_OK;
        }
    }
    if (cc->n_lt == cc->cap_lt) {
        int cap = cc->cap_lt ? 2 * cc->cap_lt : 64;
        struct mc__lt_plan *grown = (struct mc__lt_plan *)mc_calloc((size_t)cap, sizeof *grown);
        if (!grown) return mc__set_error(MC_ERR_NO_MEMORY, "cuda gemm: out of memory");
        if (cc->n_lt) memcpy(grown, cc->lt_plans, (size_t)cc->n_lt * sizeof *grown);
        mc_free(cc->lt_plans);
        cc->lt_plans = grown;
        cc->cap_lt = cap;
    }
    struct mc__lt_plan *p = &cc->lt_plans[cc->n_lt];
    memset(p, 0, sizeof *p);
    *p = *key;
    p->op = NULL;
    p->a = p->b = p->c = NULL;
    int rc = mc__lt_make(cx, cc, p);
    if (rc != MC_OK) {
        if (p->op) cublasLtMatmulDescDestroy(p->op);
        if (p->a) cublasLtMatrixLayoutDestroy(p->a);
        if (p->b) cublasLtMatrixLayoutDestroy(p->b);
        if (p->c) cublasLtMatrixLayoutDestroy(p->c);
        return rc;
    }
    cc->n_lt++;
    *out = p;
    return MC_OK;
}

static void mc__lt_free(mc__cuda_compute *cc) {
    for (int i = 0; i < cc->n_lt; i++) {   /* a refused epilogue plan may lack its layouts */
        if (cc->lt_plans[i].op) cublasLtMatmulDescDestroy(cc->lt_plans[i].op);
        if (cc->lt_plans[i].a) cublasLtMatrixLayoutDestroy(cc->lt_plans[i].a);
        if (cc->lt_plans[i].b) cublasLtMatrixLayoutDestroy(cc->lt_plans[i].b);
        if (cc->lt_plans[i].c) cublasLtMatrixLayoutDestroy(cc->lt_plans[i].c);
    }
    mc_free(cc->lt_plans);
    cc->lt_plans = NULL;
    cc->n_lt = cc->cap_lt = 0;
}

// ---------------------------------------------------------------------------------------------
// >>cuda launchers  The table's numeric ops: checks, the kernel or library call, the error check
// (with the op's shapes), optional profiling events.

struct mc__prof_rec {
    int cat;
    cudaEvent_t a, b;
};

/* Starts timing an op of category `cat` on `stream`; -1 when profiling is off. */
static int mc__prof_begin(const mc_ops *o, int cat, cudaStream_t stream) {
    mc__cuda_compute *cc = mc__comp(o);
    if (cc == NULL || !cc->prof_on) return -1;
    if (cc->n_prof == cc->cap_prof) {
        int cap = cc->cap_prof ? 2 * cc->cap_prof : 512;
        struct mc__prof_rec *grown = (struct mc__prof_rec *)mc_calloc((size_t)cap, sizeof *grown);
        if (grown == NULL) return -1;
        if (cc->n_prof) memcpy(grown, cc->prof, (size_t)cc->cap_prof * sizeof *grown);
        mc_free(cc->prof);
        cc->prof = grown;
        cc->cap_prof = cap;
    }
    struct mc__prof_rec *r = &cc->prof[cc->n_prof];
    if (r->a == NULL && (cudaEventCreate(&r->a) != cudaSuccess ||
                         cudaEventCreate(&r->b) != cudaSuccess)) {
        (void)cudaGetLastError();
        return -1;
    }
    r->cat = cat;
    if (cudaEventRecord(r->a, stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return cc->n_prof++;
}

static void mc__prof_end(const mc_ops *o, int idx, cudaStream_t stream) {
    if (idx < 0) return;
    if (cudaEventRecord(mc__comp(o)->prof[idx].b, stream) != cudaSuccess) (void)cudaGetLastError();
}

/* After an op: the launch error, and with sync_check the kernel's own error; the shapes are
   formatted only for the message. */
static int mc__cuda_afterf(const mc_ops *o, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int mc__cuda_afterf(const mc_ops *o, const char *op, const char *fmt, ...) {
    mc__cuda_ctx *cx = mc__cuda_get(o);
    cudaError_t err = cudaGetLastError();
    const char *what = "kernel launch";
    if (err == cudaSuccess && cx->sync_check) {
        err = cudaStreamSynchronize(cx->stream);
        what = "cudaStreamSynchronize (MC_CUDA_SYNC_CHECK)";
    }
    if (err == cudaSuccess) return MC_OK;
    char shapes[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(shapes, sizeof shapes, fmt, args);
    va_end(args);
    return mc__cuda_fail(err, op, what, "%s", shapes);
}

#define MC__OP_BEGIN(name, cat)                                                                \
    const char *const mc__op = (name);                                                         \
    int mc__rc = mc__cuda_use(o, mc__op);                                                      \
    if (mc__rc != MC_OK) return mc__rc;                                                        \
    mc__cuda_ctx *cx = mc__cuda_get(o);                                                        \
    int mc__pi = mc__prof_begin(o, (cat), cx->stream)

#define MC__OP_END(...)                                                                        \
    do {                                                                                       \
        mc__prof_end(o, mc__pi, cx->stream);                                                   \
        return mc__cuda_afterf(o, mc__op, __VA_ARGS__);                                        \
    } while (0)

#define MC__OP_FAIL(rc)                                                                        \
    do {                                                                                       \
        mc__prof_end(o, mc__pi, cx->stream);                                                   \
        return (rc);                                                                           \
    } while (0)

#define MC__BAD_DT(dt)                                                                         \
    MC__OP_FAIL(mc__set_error(MC_ERR_INVALID_ARG, "cuda %s: dtype (%d) must be MC_F32 or "    \
                              "MC_BF16", mc__op, (int)(dt)))

/* `...` with T the storage type of dt */
#define MC__BY_DT(dt, T, ...)                                                                  \
    do {                                                                                       \
        if ((dt) == MC_F32) {                                                                  \
            typedef float T;                                                                   \
            __VA_ARGS__;                                                                       \
        } else if ((dt) == MC_BF16) {                                                          \
            typedef mc__bf16 T;                                                                \
            __VA_ARGS__;                                                                       \
        } else {                                                                               \
            MC__BAD_DT(dt);                                                                    \
        }                                                                                      \
    } while (0)

static bool mc__al16(const void *a, const void *b = NULL, const void *c = NULL) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15u) == 0;
}

/* Element-wise kernels in 16-byte vectors when the pointers and n allow it. */
#define MC__EW(kernel, T, n, aligned, ...)                                                     \
    do {                                                                                       \
        const int mc__v = 16 / (int)sizeof(T);                                                 \
        if ((aligned) && (n) % (size_t)mc__v == 0)                                             \
            kernel<T, 16 / sizeof(T)><<<mc__blocks((n) / mc__v), MC__THREADS, 0, cx->stream>>>( \
                __VA_ARGS__);                                                                  \
        else                                                                                   \
            kernel<T, 1><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(__VA_ARGS__);          \
    } while (0)

static int mc__cu_fill(const mc_ops *o, void *x, float value, size_t n, mc_dtype dt) {
    MC__OP_BEGIN("fill", MC_PROF_OTHER);
    if (n == 0) MC__OP_END("");
    MC__BY_DT(dt, T, MC__EW(mc__k_fill, T, n, mc__al16(x), (T *)x, value, n));
    MC__OP_END("n %zu dt %d", n, (int)dt);
}

static int mc__cu_copy(const mc_ops *o, void *dst, const void *src, size_t n, mc_dtype dst_dt,
                       mc_dtype src_dt) {
    MC__OP_BEGIN("copy", MC_PROF_OTHER);
    if (n == 0 || (dst == src && dst_dt == src_dt)) MC__OP_END("");
    if ((dst_dt != MC_F32 && dst_dt != MC_BF16)) MC__BAD_DT(dst_dt);
    if ((src_dt != MC_F32 && src_dt != MC_BF16)) MC__BAD_DT(src_dt);
    if (dst_dt == src_dt) {
        cudaError_t e = cudaMemcpyAsync(dst, src, mc_dtype_bytes(dst_dt, n),
                                        cudaMemcpyDeviceToDevice, cx->stream);
        if (e != cudaSuccess)
            MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaMemcpyAsync", "n %zu", n));
    } else if (dst_dt == MC_BF16) {
        mc__k_convert<mc__bf16, float><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(
            (mc__bf16 *)dst, (const float *)src, n);
    } else {
        mc__k_convert<float, mc__bf16><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(
            (float *)dst, (const mc__bf16 *)src, n);
    }
    MC__OP_END("n %zu dst dt %d src dt %d", n, (int)dst_dt, (int)src_dt);
}

static int mc__cu_axpy(const mc_ops *o, void *y, float a, const void *x, size_t n, mc_dtype dt) {
    MC__OP_BEGIN("axpy", MC_PROF_OTHER);
    if (n == 0) MC__OP_END("");
    MC__BY_DT(dt, T, MC__EW(mc__k_axpy, T, n, mc__al16(y, x), (T *)y, a, (const T *)x, n));
    MC__OP_END("n %zu dt %d", n, (int)dt);
}

static int mc__cu_scale(const mc_ops *o, void *x, float a, size_t n, mc_dtype dt) {
    MC__OP_BEGIN("scale", MC_PROF_OTHER);
    if (n == 0) MC__OP_END("");
    MC__BY_DT(dt, T, MC__EW(mc__k_scale, T, n, mc__al16(x), (T *)x, a, n));
    MC__OP_END("n %zu dt %d", n, (int)dt);
}

static int mc__cu_sum_squares(const mc_ops *o, double *out, const float *x, const size_t *spans,
                              int n_spans) {
    MC__OP_BEGIN("sum_squares", MC_PROF_OPTIMIZER);
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof(double), cx->stream);
    if (e != cudaSuccess) MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaMemsetAsync", ""));
    if (cx->deterministic) {   /* one block per span, the spans in order: a fixed sum order */
        for (int k = 0; k < n_spans; k++)
            mc__k_sum_squares<<<dim3(1, 1), MC__THREADS, 0, cx->stream>>>(out, x, spans + 2 * k);
        MC__OP_END("%d spans (deterministic)", n_spans);
    }
    for (int first = 0; first < n_spans; first += 65535) {   /* gridDim.y limit */
        int count = n_spans - first < 65535 ? n_spans - first : 65535;
        mc__k_sum_squares<<<dim3(256, count), MC__THREADS, 0, cx->stream>>>(out, x,
                                                                          spans + 2 * first);
    }
    MC__OP_END("%d spans", n_spans);
}

static int mc__cu_bias_backward(const mc_ops *o, float *dbias, const void *dout, int N, int C,
                                mc_dtype dt) {
    MC__OP_BEGIN("bias_backward", MC_PROF_GEMM);
    if (N <= 0 || C <= 0) MC__OP_END("");
    if (dt == MC_BF16 && C % 8 == 0 && ((uintptr_t)dout & 15u) == 0) {
        int gx = (C + 255) / 256, sms = 132;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cx->device);
        int gy = (4 * sms + gx - 1) / gx, rows = (N + 7) / 8;
        if (gy > rows) gy = rows;
        if (cx->deterministic) gy = 1;   /* one block owns its columns: one add each */
        mc__k_bias_bwd_v<<<dim3(gx, gy), 256, 0, cx->stream>>>(dbias, (const mc__bf16 *)dout, N,
                                                               C);
        MC__OP_END("N %d C %d dt %d (vectorised)", N, C, (int)dt);
    }
    int gy = (N + 63) / 64;
    if (gy > 256) gy = 256;
    if (cx->deterministic) gy = 1;
    MC__BY_DT(dt, T, mc__k_bias_bwd<T><<<dim3((C + 31) / 32, gy), dim3(32, 8), 0, cx->stream>>>(
                         dbias, (const T *)dout, N, C));
    MC__OP_END("N %d C %d dt %d", N, C, (int)dt);
}

static int mc__cu_gemm(const mc_ops *o, void *C, const void *A, const void *B, const void *bias,
                       int M, int N, int K, int trans_a, int trans_b, float alpha, float beta,
                       mc_dtype c_dt, mc_dtype ab_dt) {
    MC__OP_BEGIN("gemm", MC_PROF_GEMM);
    if (M < 0 || N < 0 || K < 0)
        MC__OP_FAIL(mc__set_error(MC_ERR_INVALID_ARG, "cuda gemm: M (%d), N (%d), K (%d) must be "
                                  ">= 0", M, N, K));
    if ((c_dt != MC_F32 && c_dt != MC_BF16)) MC__BAD_DT(c_dt);
    if ((ab_dt != MC_F32 && ab_dt != MC_BF16)) MC__BAD_DT(ab_dt);
    if (M == 0 || N == 0) MC__OP_END("");
    if (K == 0) {   /* beta C + bias: no product to compute */
        size_t n = (size_t)M * N;
        if (c_dt == MC_F32 && ab_dt == MC_F32)
            mc__k_bias_add<float, float><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(
                (float *)C, (const float *)bias, M, N, beta);
        else if (c_dt == MC_BF16 && ab_dt == MC_BF16)
            mc__k_bias_add<mc__bf16, mc__bf16><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(
                (mc__bf16 *)C, (const mc__bf16 *)bias, M, N, beta);
        else if (c_dt == MC_F32)
            mc__k_bias_add<float, mc__bf16><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(
                (float *)C, (const mc__bf16 *)bias, M, N, beta);
        else
            mc__k_bias_add<mc__bf16, float><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(
                (mc__bf16 *)C, (const float *)bias, M, N, beta);
        MC__OP_END("bias add M %d N %d", M, N);
    }
    if (bias && c_dt != ab_dt)
        MC__OP_FAIL(mc__set_error(MC_ERR_UNSUPPORTED, "cuda gemm: a bias with C of another dtype "
                                  "than A and B (M %d N %d K %d)", M, N, K));
    mc__cuda_compute *cc = mc__comp(o);
    struct mc__lt_plan key, *p = NULL;
    memset(&key, 0, sizeof key);
    key.M = M, key.N = N, key.K = K, key.ta = trans_a ? 1 : 0, key.tb = trans_b ? 1 : 0;
    key.bias = bias != NULL, key.c_dt = c_dt, key.ab_dt = ab_dt;
    key.align = mc__align_of(A, B, C, bias);
    int rc = mc__lt_find(cx, cc, &key, &p);
    if (rc != MC_OK) MC__OP_FAIL(rc);
    if (bias &&
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                       sizeof bias) != CUBLAS_STATUS_SUCCESS)
        MC__OP_FAIL(mc__set_error(MC_ERR_CUDA, "cuda gemm: setting the bias pointer failed"));
    cublasStatus_t st = cublasLtMatmul(cc->lt, p->op, &alpha, B, p->a, A, p->b, &beta, C, p->c,
                                       C, p->c, &p->algo, cx->workspace, cx->workspace_bytes,
                                       cx->stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        MC__OP_FAIL(mc__set_error(MC_ERR_CUDA, "cuda gemm: cublasLtMatmul failed: %s [M %d N %d "
                                  "K %d ta %d tb %d c %d ab %d bias %d]", mc__lt_status(st), M, N,
                                  K, trans_a, trans_b, (int)c_dt, (int)ab_dt, bias != NULL));
    MC__OP_END("M %d N %d K %d ta %d tb %d alpha %g beta %g c_dt %d ab_dt %d", M, N, K, trans_a,
               trans_b, (double)alpha, (double)beta, (int)c_dt, (int)ab_dt);
}

/* gemm_gelu_forward (bwd 0: D = gelu(pre), aux = pre written) and gemm_gelu_backward (bwd 1:
   D = dpre, aux = pre read): one cuBLASLt call with the GELU epilogue when the switch, the
   shape (N % 8 == 0: the aux matrix's leading dimension), 16-byte alignment and the heuristic
   allow it, under bf16 (fp32 stays the 1e-5 reference path); otherwise the composition of gemm
   and the GELU kernels, which is the unfused path exactly. cuBLASLt's GELU is the tanh
   approximation of gelu_forward, taken of the fp32 accumulator (the unfused path takes it of
   the bf16-rounded pre). */
static int mc__cu_gemm_gelu(const mc_ops *o, int bwd, void *D, const void *aux_in, const void *A,
                            const void *B, const void *bias, int M, int N, int K, int trans_a,
                            int trans_b, mc_dtype dt) {
    const char *name = bwd ? "gemm_gelu_backward" : "gemm_gelu_forward";
    int rc = mc__cuda_use(o, name);
    if (rc != MC_OK) return rc;
    mc__cuda_ctx *ctx = mc__cuda_get(o);
    mc__cuda_compute *cc = mc__comp(o);
    void *aux = (void *)(uintptr_t)aux_in;
    if (M < 0 || N < 0 || K < 0)
        return mc__set_error(MC_ERR_INVALID_ARG, "cuda %s: M (%d), N (%d), K (%d) must be >= 0",
                             name, M, N, K);
    if (dt != MC_F32 && dt != MC_BF16)
        return mc__set_error(MC_ERR_INVALID_ARG, "cuda %s: dtype (%d) must be MC_F32 or MC_BF16",
                             name, (int)dt);
    if (D == NULL || aux == NULL || D == aux)
        return mc__set_error(MC_ERR_INVALID_ARG, "cuda %s: the output (%p) and pre (%p) must be "
                             "two buffers", name, D, aux);
    const char *why = NULL;
    struct mc__lt_plan key, *p = NULL;
    memset(&key, 0, sizeof key);
    key.M = M, key.N = N, key.K = K, key.ta = trans_a ? 1 : 0, key.tb = trans_b ? 1 : 0;
    key.bias = bias != NULL, key.c_dt = dt, key.ab_dt = dt, key.epi = bwd ? 2 : 1;
    key.align = mc__align_of(A, B, D, bias);
    int aux_align = mc__align_of(aux, NULL, NULL, NULL);
    if (aux_align < key.align) key.align = aux_align;
    if (!ctx->fuse) why = "off";
    else if (dt != MC_BF16) why = "fp32 (fused under bf16 only: fp32 stays the 1e-5 path)";
    else if (M == 0 || N == 0 || K == 0) why = "an empty product";
    else if (N % 8 != 0) why = "N not a multiple of 8 (the aux leading dimension)";
    else if (key.align < 16) why = "a pointer not 16-byte aligned";
    else if ((rc = mc__lt_find(ctx, cc, &key, &p)) != MC_OK) return rc;
    else if (p->unsupported) why = "no cuBLASLt algorithm with the GELU epilogue";
    if (why != NULL) {
        size_t n = (size_t)M * (size_t)N;
        cc->gelu_unfused[bwd]++;
        if (ctx->fuse)
            snprintf(cc->fuse_why, sizeof cc->fuse_why, "%s M %d N %d K %d %s: %s", name, M, N,
                     K, dt == MC_BF16 ? "bf16" : "f32", why);
        if (!bwd) {   /* pre = op(A) op(B) + bias, out = gelu(pre) */
            rc = o->gemm(o, aux, A, B, bias, M, N, K, trans_a, trans_b, 1.0f, 0.0f, dt, dt);
            return rc == MC_OK ? o->gelu_forward(o, D, aux, n, dt) : rc;
        }
        rc = o->gemm(o, D, A, B, NULL, M, N, K, trans_a, trans_b, 1.0f, 0.0f, dt, dt);
        return rc == MC_OK ? o->gelu_backward(o, D, aux, D, n, dt) : rc;
    }
    cc->gelu_fused[bwd]++;
    MC__OP_BEGIN(name, MC_PROF_GEMM);
    (void)mc__rc;
    const float alpha = 1.0f, beta = 0.0f;
    if (bias && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof bias) != CUBLAS_STATUS_SUCCESS)
        MC__OP_FAIL(mc__set_error(MC_ERR_CUDA, "cuda %s: setting the bias pointer failed", name));
    if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                       sizeof aux) != CUBLAS_STATUS_SUCCESS)
        MC__OP_FAIL(mc__set_error(MC_ERR_CUDA, "cuda %s: setting the aux pointer failed", name));
    cublasStatus_t st = cublasLtMatmul(cc->lt, p->op, &alpha, B, p->a, A, p->b, &beta, D, p->c, D,
                                       p->c, &p->algo, cx->workspace, cx->workspace_bytes,
                                       cx->stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        MC__OP_FAIL(mc__set_error(MC_ERR_CUDA, "cuda %s: cublasLtMatmul failed: %s [M %d N %d K "
                                  "%d ta %d tb %d dt %d bias %d]", name, mc__lt_status(st), M, N,
                                  K, trans_a, trans_b, (int)dt, bias != NULL));
    MC__OP_END("M %d N %d K %d ta %d tb %d dt %d bias %d (GELU epilogue)", M, N, K, trans_a,
               trans_b, (int)dt, bias != NULL);
}

static int mc__cu_gemm_gelu_forward(const mc_ops *o, void *out, void *pre, const void *A,
                                    const void *B, const void *bias, int M, int N, int K,
                                    int trans_a, int trans_b, mc_dtype dt) {
    return mc__cu_gemm_gelu(o, 0, out, pre, A, B, bias, M, N, K, trans_a, trans_b, dt);
}

static int mc__cu_gemm_gelu_backward(const mc_ops *o, void *dpre, const void *pre, const void *A,
                                     const void *B, int M, int N, int K, int trans_a, int trans_b,
                                     mc_dtype dt) {
    return mc__cu_gemm_gelu(o, 1, dpre, pre, A, B, NULL, M, N, K, trans_a, trans_b, dt);
}

/* The vectorised LayerNorm kernels: bf16, C a multiple of 256 up to 1024, 16-byte aligned rows. */
static bool mc__ln_fast(mc_dtype dt, int C, const void *a, const void *b, const void *c,
                        const void *d) {
    static int generic = -1;   /* MC_CUDA_GENERIC_NORM=1 forces the generic kernels */
    if (generic < 0) generic = getenv("MC_CUDA_GENERIC_NORM") != NULL;
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    return !generic && dt == MC_BF16 && C % 256 == 0 && C <= 1024 && (x & 15u) == 0;
}

static int mc__cu_layernorm_forward(const mc_ops *o, void *out, float *mean, float *rstd,
                                    const void *inp, const void *weight, const void *bias, int N,
                                    int C, float eps, mc_dtype dt) {
    MC__OP_BEGIN("layernorm_forward", MC_PROF_NORM);
    if (N <= 0 || C <= 0) MC__OP_END("");
    if (mc__ln_fast(dt, C, out, inp, weight, bias)) {
        switch (C / 256) {
            case 1: mc__k_ln_fwd_v<1><<<(N + 7) / 8, 256, 0, cx->stream>>>((mc__bf16 *)out, mean, rstd, (const mc__bf16 *)inp, (const mc__bf16 *)weight, (const mc__bf16 *)bias, N, eps); break;
            case 2: mc__k_ln_fwd_v<2><<<(N + 7) / 8, 256, 0, cx->stream>>>((mc__bf16 *)out, mean, rstd, (const mc__bf16 *)inp, (const mc__bf16 *)weight, (const mc__bf16 *)bias, N, eps); break;
            case 3: mc__k_ln_fwd_v<3><<<(N + 7) / 8, 256, 0, cx->stream>>>((mc__bf16 *)out, mean, rstd, (const mc__bf16 *)inp, (const mc__bf16 *)weight, (const mc__bf16 *)bias, N, eps); break;
            default: mc__k_ln_fwd_v<4><<<(N + 7) / 8, 256, 0, cx->stream>>>((mc__bf16 *)out, mean, rstd, (const mc__bf16 *)inp, (const mc__bf16 *)weight, (const mc__bf16 *)bias, N, eps); break;
        }
        MC__OP_END("N %d C %d dt %d (vectorised)", N, C, (int)dt);
    }
    MC__BY_DT(dt, T, mc__k_ln_fwd<T><<<(N + 7) / 8, 256, 0, cx->stream>>>(
                         (T *)out, mean, rstd, (const T *)inp, (const T *)weight,
                         (const T *)bias, N, C, eps));
    MC__OP_END("N %d C %d dt %d", N, C, (int)dt);
}

static int mc__cu_layernorm_backward(const mc_ops *o, void *dinp, float *dweight, float *dbias,
                                     const void *dout, const void *inp, const void *weight,
                                     const float *mean, const float *rstd, int N, int C,
                                     mc_dtype dt) {
    MC__OP_BEGIN("layernorm_backward", MC_PROF_NORM);
    if (N <= 0 || C <= 0) MC__OP_END("");
    int sms = 132, blocks = (N + 7) / 8;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cx->device);
    if (blocks > 2 * sms) blocks = 2 * sms;
    if (cx->deterministic) {   /* dinp by rows (no sums across rows), then the column sums */
        MC__BY_DT(dt, T, mc__k_ln_bwd<T, false><<<blocks, 256, 0, cx->stream>>>(
                             (T *)dinp, NULL, NULL, (const T *)dout, (const T *)inp,
                             (const T *)weight, mean, rstd, N, C));
        if (dweight || dbias)
            MC__BY_DT(dt, T, mc__k_ln_bwd_params<T><<<(C + 255) / 256, 256, 0, cx->stream>>>(
                                 dweight, dbias, (const T *)dout, (const T *)inp, mean, rstd, N,
                                 C));
        MC__OP_END("N %d C %d dt %d (deterministic)", N, C, (int)dt);
    }
    if (mc__ln_fast(dt, C, dinp, dout, inp, weight)) {
        size_t sh = 8 * (size_t)C * sizeof(float);
        switch (C / 256) {
            case 1: mc__k_ln_bwd_v<1><<<blocks, 256, sh, cx->stream>>>((mc__bf16 *)dinp, dweight, dbias, (const mc__bf16 *)dout, (const mc__bf16 *)inp, (const mc__bf16 *)weight, mean, rstd, N); break;
            case 2: mc__k_ln_bwd_v<2><<<blocks, 256, sh, cx->stream>>>((mc__bf16 *)dinp, dweight, dbias, (const mc__bf16 *)dout, (const mc__bf16 *)inp, (const mc__bf16 *)weight, mean, rstd, N); break;
            case 3: mc__k_ln_bwd_v<3><<<blocks, 256, sh, cx->stream>>>((mc__bf16 *)dinp, dweight, dbias, (const mc__bf16 *)dout, (const mc__bf16 *)inp, (const mc__bf16 *)weight, mean, rstd, N); break;
            default: mc__k_ln_bwd_v<4><<<blocks, 256, sh, cx->stream>>>((mc__bf16 *)dinp, dweight, dbias, (const mc__bf16 *)dout, (const mc__bf16 *)inp, (const mc__bf16 *)weight, mean, rstd, N); break;
        }
        MC__OP_END("N %d C %d dt %d (vectorised)", N, C, (int)dt);
    }
    size_t shmem = 2 * (size_t)C * sizeof(float);
    if (shmem <= 48 * 1024) {
        MC__BY_DT(dt, T, mc__k_ln_bwd<T, true><<<blocks, 256, shmem, cx->stream>>>(
                             (T *)dinp, dweight, dbias, (const T *)dout, (const T *)inp,
                             (const T *)weight, mean, rstd, N, C));
    } else {
        MC__BY_DT(dt, T, mc__k_ln_bwd<T, false><<<blocks, 256, 0, cx->stream>>>(
                             (T *)dinp, dweight, dbias, (const T *)dout, (const T *)inp,
                             (const T *)weight, mean, rstd, N, C));
    }
    MC__OP_END("N %d C %d dt %d", N, C, (int)dt);
}

static int mc__cu_gelu_forward(const mc_ops *o, void *out, const void *inp, size_t n,
                               mc_dtype dt) {
    MC__OP_BEGIN("gelu_forward", MC_PROF_OTHER);
    if (n == 0) MC__OP_END("");
    MC__BY_DT(dt, T, MC__EW(mc__k_gelu_fwd, T, n, mc__al16(out, inp), (T *)out, (const T *)inp, n));
    MC__OP_END("n %zu dt %d", n, (int)dt);
}

static int mc__cu_gelu_backward(const mc_ops *o, void *dinp, const void *inp, const void *dout,
                                size_t n, mc_dtype dt) {
    MC__OP_BEGIN("gelu_backward", MC_PROF_OTHER);
    if (n == 0) MC__OP_END("");
    MC__BY_DT(dt, T, MC__EW(mc__k_gelu_bwd, T, n, mc__al16(dinp, inp, dout), (T *)dinp,
                            (const T *)inp, (const T *)dout, n));
    MC__OP_END("n %zu dt %d", n, (int)dt);
}

static int mc__cu_dropout(const mc_ops *o, const char *name, void *out, const void *inp,
                          size_t n, float p, uint64_t seed, uint64_t offset, mc_dtype dt) {
    MC__OP_BEGIN(name, MC_PROF_OTHER);
    if (n == 0) MC__OP_END("");
    if (!(p > 0.0f)) {
        if (out != inp) {
            cudaError_t e = cudaMemcpyAsync(out, inp, mc_dtype_bytes(dt, n),
                                            cudaMemcpyDeviceToDevice, cx->stream);
            if (e != cudaSuccess) MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaMemcpyAsync", ""));
        }
        MC__OP_END("");
    }
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    size_t blocks = (size_t)(((offset + n - 1) >> 2) - (offset >> 2) + 1);
    MC__BY_DT(dt, T, mc__k_dropout<T><<<mc__blocks(blocks), MC__THREADS, 0, cx->stream>>>(
                         (T *)out, (const T *)inp, n, p, scale, seed, offset));
    MC__OP_END("n %zu p %g offset %llu dt %d", n, (double)p, (unsigned long long)offset, (int)dt);
}

static int mc__cu_dropout_forward(const mc_ops *o, void *out, const void *inp, size_t n, float p,
                                  uint64_t seed, uint64_t offset, mc_dtype dt) {
    return mc__cu_dropout(o, "dropout_forward", out, inp, n, p, seed, offset, dt);
}

static int mc__cu_dropout_backward(const mc_ops *o, void *dinp, const void *dout, size_t n,
                                   float p, uint64_t seed, uint64_t offset, mc_dtype dt) {
    return mc__cu_dropout(o, "dropout_backward", dinp, dout, n, p, seed, offset, dt);
}

/* Reads ids back only with sync_check (the embedding kernels write zero rows otherwise). */
static int mc__cu_check_ids(const mc_ops *o, const int *ids, int N, int V, const char *fn,
                            const char *what) {
    mc__cuda_ctx *cx = mc__cuda_get(o);
    if (!cx->sync_check || N <= 0) return MC_OK;
    int *host = (int *)mc_malloc((size_t)N * sizeof(int));
    if (host == NULL) return MC_OK;
    int rc = mc__cuda_download_op(o, host, ids, (size_t)N * sizeof(int));
    for (int i = 0; rc == MC_OK && i < N; i++)
        if (host[i] < 0 || host[i] >= V)
            rc = mc__set_error(MC_ERR_INVALID_ARG, "%s: %s[%d] = %d is outside the vocabulary "
                               "[0, %d) (checked by MC_CUDA_SYNC_CHECK)", fn, what, i, host[i], V);
    mc_free(host);
    return rc;
}

static int mc__cu_embedding_forward(const mc_ops *o, void *out, const int *ids, const void *table,
                                    int N, int C, int vs, int ve, mc_dtype dt) {
    MC__OP_BEGIN("embedding_forward", MC_PROF_LOSS);
    if (N <= 0 || C <= 0) MC__OP_END("");
    size_t n = (size_t)N * C;
    MC__BY_DT(dt, T, mc__k_emb_fwd<T><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(
                         (T *)out, ids, (const T *)table, N, C, vs, ve));
    MC__OP_END("N %d C %d vocab [%d, %d) dt %d", N, C, vs, ve, (int)dt);
}

static int mc__cu_embedding_backward(const mc_ops *o, float *dtable, const void *dout,
                                     const int *ids, int N, int C, int vs, int ve, mc_dtype dt) {
    MC__OP_BEGIN("embedding_backward", MC_PROF_LOSS);
    if (N <= 0 || C <= 0) MC__OP_END("");
    size_t n = (size_t)N * C;
    if (cx->deterministic) {
        MC__BY_DT(dt, T, mc__k_emb_bwd_det<T><<<(C + 255) / 256, 256, 0, cx->stream>>>(
                             dtable, (const T *)dout, ids, N, C, vs, ve));
        MC__OP_END("N %d C %d vocab [%d, %d) dt %d (deterministic)", N, C, vs, ve, (int)dt);
    }
    MC__BY_DT(dt, T, mc__k_emb_bwd<T><<<mc__blocks(n), MC__THREADS, 0, cx->stream>>>(
                         dtable, (const T *)dout, ids, N, C, vs, ve));
    MC__OP_END("N %d C %d vocab [%d, %d) dt %d", N, C, vs, ve, (int)dt);
}

static int mc__cu_row_max(const mc_ops *o, float *max, const void *logits, int N, int V,
                          mc_dtype dt) {
    MC__OP_BEGIN("row_max", MC_PROF_LOSS);
    if (N <= 0) MC__OP_END("");
    if (mc__rows_v(dt, V, logits, NULL)) {
        mc__k_row_max_v<<<N, 512, 0, cx->stream>>>(max, (const mc__bf16 *)logits, V);
        MC__OP_END("N %d V %d dt %d (vectorised)", N, V, (int)dt);
    }
    MC__BY_DT(dt, T, mc__k_row_max<T><<<N, 512, 0, cx->stream>>>(max, (const T *)logits, V));
    MC__OP_END("N %d V %d dt %d", N, V, (int)dt);
}

static int mc__cu_target_logit(const mc_ops *o, float *out, const void *logits,
                               const int *targets, int N, int V, int vs, mc_dtype dt) {
    MC__OP_BEGIN("target_logit", MC_PROF_LOSS);
    if (N <= 0) MC__OP_END("");
    MC__BY_DT(dt, T, mc__k_target_logit<T><<<mc__blocks((size_t)N), MC__THREADS, 0, cx->stream>>>(
                         out, (const T *)logits, targets, N, V, vs));
    MC__OP_END("N %d V %d dt %d", N, V, (int)dt);
}

static int mc__cu_sum_exp(const mc_ops *o, float *sum, const void *logits, const float *max,
                          int N, int V, mc_dtype dt) {
    MC__OP_BEGIN("sum_exp", MC_PROF_LOSS);
    if (N <= 0) MC__OP_END("");
    if (mc__rows_v(dt, V, logits, NULL)) {
        mc__k_sum_exp_v<<<N, 512, 0, cx->stream>>>(sum, (const mc__bf16 *)logits, max, V);
        MC__OP_END("N %d V %d dt %d (vectorised)", N, V, (int)dt);
    }
    MC__BY_DT(dt, T, mc__k_sum_exp<T><<<N, 512, 0, cx->stream>>>(sum, (const T *)logits, max, V));
    MC__OP_END("N %d V %d dt %d", N, V, (int)dt);
}

static int mc__cu_row_sum(const mc_ops *o, float *sum, const void *logits, int N, int V,
                          mc_dtype dt) {
    MC__OP_BEGIN("row_sum", MC_PROF_LOSS);
    if (N <= 0) MC__OP_END("");
    MC__BY_DT(dt, T, mc__k_row_sum<T><<<N, 512, 0, cx->stream>>>(sum, (const T *)logits, V));
    MC__OP_END("N %d V %d dt %d", N, V, (int)dt);
}

static int mc__cu_cross_entropy_loss(const mc_ops *o, float *losses, double *loss_sum,
                                     const float *max, const float *sum_exp,
                                     const float *target_logit, const float *logit_sum, int N,
                                     int K, float smoothing) {
    MC__OP_BEGIN("cross_entropy_loss", MC_PROF_LOSS);
    if (loss_sum) {
        cudaError_t e = cudaMemsetAsync(loss_sum, 0, sizeof(double), cx->stream);
        if (e != cudaSuccess) MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaMemsetAsync", ""));
    }
    if (N <= 0) MC__OP_END("");
    unsigned blocks = (unsigned)((N + 255) / 256);
    if (blocks > 1024) blocks = 1024;
    if (cx->deterministic && loss_sum) blocks = 1;   /* one block: one fixed sum order */
    mc__k_ce_loss<<<blocks, 256, 0, cx->stream>>>(losses, loss_sum, max, sum_exp, target_logit,
                                                  logit_sum, N, K, smoothing);
    MC__OP_END("N %d K %d", N, K);
}

static int mc__cu_cross_entropy_backward(const mc_ops *o, void *dlogits, const void *logits,
                                         const float *max, const float *sum, const int *targets,
                                         const float *dloss, int N, int V, int vs,
                                         float smoothing, int vocab_global, mc_dtype dt) {
    MC__OP_BEGIN("cross_entropy_backward", MC_PROF_LOSS);
    if (N <= 0) MC__OP_END("");
    float uniform = vocab_global > 0 ? smoothing / (float)vocab_global : 0.0f;
    if (mc__rows_v(dt, V, logits, dlogits)) {
        mc__k_ce_bwd_v<<<N, 512, 0, cx->stream>>>((mc__bf16 *)dlogits, (const mc__bf16 *)logits,
                                                  max, sum, targets, dloss, V, vs, smoothing,
                                                  uniform);
        MC__OP_END("N %d V %d dt %d (vectorised)", N, V, (int)dt);
    }
    MC__BY_DT(dt, T, mc__k_ce_bwd<T><<<N, 512, 0, cx->stream>>>(
                         (T *)dlogits, (const T *)logits, max, sum, targets, dloss, V, vs,
                         smoothing, uniform));
    MC__OP_END("N %d V %d dt %d", N, V, (int)dt);
}

static int mc__cu_adamw(const mc_ops *o, float *main, const float *grad, float *m, float *v,
                        void *model, const mc_adamw_span *spans, int n_spans,
                        const mc_adamw_step *h, mc_dtype model_dt) {
    MC__OP_BEGIN("adamw", MC_PROF_OPTIMIZER);
    if (n_spans <= 0) MC__OP_END("");
    float bc1 = (float)(1.0 - pow((double)h->beta1, (double)h->step));
    float bc2 = (float)(1.0 - pow((double)h->beta2, (double)h->step));
    for (int first = 0; first < n_spans; first += 65535) {
        int count = n_spans - first < 65535 ? n_spans - first : 65535;
        dim3 grid(512, count);
        if (model == NULL || model == (void *)main)
            mc__k_adamw<float><<<grid, MC__THREADS, 0, cx->stream>>>(
                main, grad, m, v, (float *)NULL, spans + first, h->lr, h->beta1, h->beta2,
                h->eps, bc1, bc2);
        else if (model_dt == MC_BF16)
            mc__k_adamw<mc__bf16><<<grid, MC__THREADS, 0, cx->stream>>>(
                main, grad, m, v, (mc__bf16 *)model, spans + first, h->lr, h->beta1, h->beta2,
                h->eps, bc1, bc2);
        else if (model_dt == MC_F32)
            mc__k_adamw<float><<<grid, MC__THREADS, 0, cx->stream>>>(
                main, grad, m, v, (float *)model, spans + first, h->lr, h->beta1, h->beta2,
                h->eps, bc1, bc2);
        else
            MC__BAD_DT(model_dt);
    }
    MC__OP_END("%d spans step %d", n_spans, h->step);
}

// --- attention: the reference kernels, the flash kernels, cuDNN

#if !defined(MC_NO_CUDNN)
static int mc__dnn_get(const mc_ops *o, int S, int B, int NH, int HD, int backward,
                       mc__dnn_plan **out) {
    mc__cuda_ctx *cx = mc__cuda_get(o);
    mc__cuda_compute *cc = mc__comp(o);
    *out = NULL;
    if (cc->dnn == NULL) return MC_ERR_UNSUPPORTED;
    for (int i = 0; i < cc->n_plans; i++) {
        mc__dnn_plan *p = &cc->plans[i];
        if (p->S == S && p->B == B && p->NH == NH && p->HD == HD && p->backward == backward) {
            *out = p;
            return p->plan ? MC_OK : MC_ERR_UNSUPPORTED;
        }
    }
    if (cc->n_plans == MC__DNN_PLANS) return MC_ERR_UNSUPPORTED;
    mc__dnn_plan *p = &cc->plans[cc->n_plans++];
    memset(p, 0, sizeof *p);
    p->S = S, p->B = B, p->NH = NH, p->HD = HD, p->backward = backward;
    char why[256] = "";
    int rc = backward ? mc__dnn_build_bwd(cc->dnn, S, B, NH, HD, &p->plan, &p->workspace, why,
                                          sizeof why)
                      : mc__dnn_build_fwd(cc->dnn, S, B, NH, HD, &p->plan, &p->workspace, why,
                                          sizeof why);
    if (rc != MC_OK) {
        p->plan = NULL;
        snprintf(cc->dnn_error, sizeof cc->dnn_error, "cuDNN SDPA %s (S %d B %d NH %d HD %d): %s",
                 backward ? "backward" : "forward", S, B, NH, HD, why);
        return MC_ERR_UNSUPPORTED;
    }
    if ((size_t)p->workspace > cx->workspace_bytes) {   /* grow once, at plan time */
        cudaStreamSynchronize(cx->stream);
        cudaFree(cx->workspace);
        cx->workspace = NULL;
        if (cudaMalloc(&cx->workspace, (size_t)p->workspace) != cudaSuccess) {
            (void)cudaGetLastError();
            cx->workspace_bytes = 0;
            return mc__set_error(MC_ERR_NO_MEMORY, "cuda attention: no %lld bytes of cuDNN "
                                 "workspace", (long long)p->workspace);
        }
        cx->workspace_bytes = (size_t)p->workspace;
    }
    *out = p;
    return MC_OK;
}

static int mc__dnn_run(const mc_ops *o, mc__dnn_plan *p, const int64_t *uids, void *const *ptrs,
                       int n) {
    mc__cuda_ctx *cx = mc__cuda_get(o);
    mc__cuda_compute *cc = mc__comp(o);
    cudnnBackendDescriptor_t vp = NULL;
    char why[256] = "";
    const size_t why_cap = sizeof why;
    void *ws = cx->workspace;
    int rc = MC_OK;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                      uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                      CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                      1, &ws);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(cc->dnn, p->plan, vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        mc__dnn_fail(st, "cudnnBackendExecute", why, why_cap);
        rc = mc__set_error(MC_ERR_CUDA, "cuda attention (cuDNN SDPA %s, S %d B %d NH %d HD %d): "
                           "%s", p->backward ? "backward" : "forward", p->S, p->B, p->NH, p->HD,
                           why);
    }
    if (vp) cudnnBackendDestroyDescriptor(vp);
    return rc;
}

#else   /* MC_NO_CUDNN */
static int mc__dnn_get(const mc_ops *o, int S, int B, int NH, int HD, int backward,
                       mc__dnn_plan **out) {
    (void)o, (void)S, (void)B, (void)NH, (void)HD, (void)backward;
    *out = NULL;
    return MC_ERR_UNSUPPORTED;
}

static int mc__dnn_run(const mc_ops *o, mc__dnn_plan *p, const int64_t *uids, void *const *ptrs,
                       int n) {
    (void)o, (void)p, (void)uids, (void)ptrs, (void)n;
    return mc__set_error(MC_ERR_UNSUPPORTED, "cuda attention: built without cuDNN");
}
#endif

#if !defined(MC_NO_CUDNN)
static size_t mc__dnn_version(void) { return cudnnGetVersion(); }
#else
static size_t mc__dnn_version(void) { return 0; }
#endif

/* The causal fill: -inf from cuDNN 9.10 on, the lowest float before (as the frontend). */
static float mc__dnn_neg_inf(void) {
    return mc__dnn_version() >= 91000 ? -INFINITY : -3.4028234663852886e38f;
}

/* Which kernel: 2 cuDNN, 1 flash, 0 reference. */
static int mc__att_choice(const mc_ops *o, int S, int B, int NH, int HD, float p, mc_dtype dt,
                          int backward, mc__dnn_plan **plan) {
    mc__cuda_ctx *cx = mc__cuda_get(o);
    mc__cuda_compute *cc = mc__comp(o);
    int fast = dt == MC_BF16 && !(p > 0.0f);
    int flash_ok = fast && (HD == 64 || HD == 32);
    *plan = NULL;
    if (cx->attention == 3 || !fast) return 0;
    if (cx->attention == 0 || cx->attention == 2) {
        if (mc__dnn_get(o, S, B, NH, HD, backward, plan) == MC_OK) return 2;
        if (cx->attention == 2) return -1;
        if (!cc->warned_fallback) {
            cc->warned_fallback = 1;
            fprintf(stderr, "megatron_c cuda: %s; using the own attention kernels\n",
                    cc->dnn_error[0] ? cc->dnn_error : "cuDNN is not available");
        }
    }
    return flash_ok ? 1 : 0;
}

static size_t mc__cu_attention_stats(const mc_ops *o, int S, int B, int NH, int HD) {
    (void)o;
    (void)HD;
    return (size_t)B * (size_t)NH * (size_t)S;
}

template <int HD>
static size_t mc__flash_smem(int kind) {   /* 0 fwd, 1 dkdv, 2 dq */
    size_t tile = (size_t)MC__FT * (HD + MC__FPAD) * 2, tt = (size_t)HD * (MC__FT + MC__FPAD) * 2;
    if (kind == 0) return 2 * tile + tt;
    if (kind == 1) return 2 * tile + 2 * tt + 2 * MC__FT * sizeof(float);
    return 2 * tile + tt;
}

template <int HD>
static cudaError_t mc__flash_prepare(void) {
    static int done = 0;
    if (done) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(mc__k_flash_fwd<HD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)mc__flash_smem<HD>(0));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(mc__k_flash_dkdv<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)mc__flash_smem<HD>(1));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(mc__k_flash_dq<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)mc__flash_smem<HD>(2));
    if (e == cudaSuccess) done = 1;
    return e;
}

static int mc__cu_attention_forward(const mc_ops *o, void *out, float *stats, const void *qkv,
                                    int S, int B, int NH, int HD, float dropout_p, uint64_t seed,
                                    uint64_t offset, mc_dtype dt) {
    MC__OP_BEGIN("attention_forward", MC_PROF_ATTENTION);
    if (S <= 0 || B <= 0 || NH <= 0) MC__OP_END("");
    if (HD > 32 * MC__ATT_MAXD || HD <= 0)
        MC__OP_FAIL(mc__set_error(MC_ERR_UNSUPPORTED, "cuda attention: head dim %d (1 .. %d)", HD,
                                  32 * MC__ATT_MAXD));
    mc__dnn_plan *plan = NULL;
    int which = mc__att_choice(o, S, B, NH, HD, dropout_p, dt, 0, &plan);
    if (which < 0)
        MC__OP_FAIL(mc__set_error(MC_ERR_UNSUPPORTED, "cuda attention: cuDNN was forced "
                                  "(MC_CUDA_ATTENTION=cudnn) but %s", mc__comp(o)->dnn_error));
    float scale = 1.0f / sqrtf((float)HD);
    mc__comp(o)->att_last[0] = which + 1;
    if (which == 2) {
        float neg = mc__dnn_neg_inf();
        const mc__bf16 *q = (const mc__bf16 *)qkv;
        int64_t uids[7] = {MC__UID_Q, MC__UID_K, MC__UID_V, MC__UID_O, MC__UID_STATS,
                           MC__UID_SCALE, MC__UID_NEGINF};
        void *ptrs[7] = {(void *)q, (void *)(q + HD), (void *)(q + 2 * HD), out, stats, &scale,
                         &neg};
        int rc = mc__dnn_run(o, plan, uids, ptrs, 7);
        if (rc != MC_OK) MC__OP_FAIL(rc);
    } else if (which == 1) {
        dim3 grid((S + MC__FT - 1) / MC__FT, B * NH);
        cudaError_t e = HD == 64 ? mc__flash_prepare<64>() : mc__flash_prepare<32>();
        if (e != cudaSuccess)
            MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaFuncSetAttribute", "HD %d", HD));
        if (HD == 64)
            mc__k_flash_fwd<64><<<grid, 128, mc__flash_smem<64>(0), cx->stream>>>(
                (mc__bf16 *)out, stats, (const mc__bf16 *)qkv, S, B, NH, scale);
        else
            mc__k_flash_fwd<32><<<grid, 128, mc__flash_smem<32>(0), cx->stream>>>(
                (mc__bf16 *)out, stats, (const mc__bf16 *)qkv, S, B, NH, scale);
    } else {
        mc__att_dims d = {S, B, NH, HD, scale, dropout_p,
                          dropout_p < 1.0f ? 1.0f / (1.0f - dropout_p) : 0.0f, seed, offset};
        size_t rows = (size_t)B * NH * S;
        MC__BY_DT(dt, T, mc__k_att_ref_fwd<T><<<(unsigned)((rows + 7) / 8), 256, 0, cx->stream>>>(
                             (T *)out, stats, (const T *)qkv, d));
    }
    MC__OP_END("S %d B %d NH %d HD %d p %g dt %d kernel %s", S, B, NH, HD, (double)dropout_p,
               (int)dt, which == 2 ? "cudnn" : which == 1 ? "flash" : "reference");
}

static int mc__cu_attention_backward(const mc_ops *o, void *dqkv, const void *dout,
                                     const void *qkv, const void *out, const float *stats, int S,
                                     int B, int NH, int HD, float dropout_p, uint64_t seed,
                                     uint64_t offset, mc_dtype dt) {
    MC__OP_BEGIN("attention_backward", MC_PROF_ATTENTION);
    if (S <= 0 || B <= 0 || NH <= 0) MC__OP_END("");
    if (HD > 32 * MC__ATT_MAXD || HD <= 0)
        MC__OP_FAIL(mc__set_error(MC_ERR_UNSUPPORTED, "cuda attention: head dim %d (1 .. %d)", HD,
                                  32 * MC__ATT_MAXD));
    mc__cuda_compute *cc = mc__comp(o);
    size_t rows = (size_t)B * NH * S;
    if (cc->att_delta_n < rows) {   /* [B*NH*S] row sums; grows once */
        if (cc->att_delta) cudaFree(cc->att_delta);
        cc->att_delta = NULL;
        cc->att_delta_n = 0;
        cudaError_t e = cudaMalloc((void **)&cc->att_delta, rows * sizeof(float));
        if (e != cudaSuccess)
            MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaMalloc", "%zu floats of row sums", rows));
        cc->att_delta_n = rows;
    }
    mc__dnn_plan *plan = NULL;
    int which = mc__att_choice(o, S, B, NH, HD, dropout_p, dt, 1, &plan);
    if (which < 0)
        MC__OP_FAIL(mc__set_error(MC_ERR_UNSUPPORTED, "cuda attention: cuDNN was forced "
                                  "(MC_CUDA_ATTENTION=cudnn) but %s", cc->dnn_error));
    float scale = 1.0f / sqrtf((float)HD);
    mc__att_dims d = {S, B, NH, HD, scale, dropout_p,
                      dropout_p < 1.0f ? 1.0f / (1.0f - dropout_p) : 0.0f, seed, offset};
    cc->att_last[1] = which + 1;
    if (which == 2) {
        float neg = mc__dnn_neg_inf(), one = 1.0f;
        const mc__bf16 *q = (const mc__bf16 *)qkv;
        mc__bf16 *g = (mc__bf16 *)dqkv;
        size_t nacc = rows * (size_t)HD;   /* the fp32 dQ accumulator [b, h, s, d] */
        if (cc->att_dq_n < nacc) {
            if (cc->att_dq) cudaFree(cc->att_dq);
            cc->att_dq = NULL;
            cc->att_dq_n = 0;
            cudaError_t e = cudaMalloc((void **)&cc->att_dq, nacc * sizeof(float));
            if (e != cudaSuccess)
                MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaMalloc", "%zu floats of dQ accumulator",
                                          nacc));
            cc->att_dq_n = nacc;
        }
        if (mc__dnn_version() < 90600) {   /* before 9.6 the caller zeroes the accumulator */
            cudaError_t e = cudaMemsetAsync(cc->att_dq, 0, nacc * sizeof(float), cx->stream);
            if (e != cudaSuccess)
                MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaMemsetAsync", "%zu floats", nacc));
        }
        int64_t uids[14] = {MC__UID_Q, MC__UID_K, MC__UID_V, MC__UID_O, MC__UID_DO,
                            MC__UID_STATS, MC__UID_DQ, MC__UID_DK, MC__UID_DV, MC__UID_SCALE,
                            MC__UID_NEGINF, MC__UID_SUMS, MC__UID_ONE, MC__UID_DQACC};
        void *ptrs[14] = {(void *)q, (void *)(q + HD), (void *)(q + 2 * HD), (void *)out,
                          (void *)dout, (void *)stats, g, g + HD, g + 2 * HD, &scale, &neg,
                          cc->att_delta, &one, cc->att_dq};
        int rc = mc__dnn_run(o, plan, uids, ptrs, 14);
        if (rc != MC_OK) MC__OP_FAIL(rc);
        MC__OP_END("S %d B %d NH %d HD %d kernel cudnn", S, B, NH, HD);
    }
    unsigned rblocks = (unsigned)((rows + 7) / 8);
    MC__BY_DT(dt, T, mc__k_att_delta<T><<<rblocks, 256, 0, cx->stream>>>(
                         cc->att_delta, (const T *)dout, (const T *)out, d));
    if (which == 1) {
        dim3 grid((S + MC__FT - 1) / MC__FT, B * NH);
        cudaError_t e = HD == 64 ? mc__flash_prepare<64>() : mc__flash_prepare<32>();
        if (e != cudaSuccess)
            MC__OP_FAIL(mc__cuda_fail(e, mc__op, "cudaFuncSetAttribute", "HD %d", HD));
        const mc__bf16 *x = (const mc__bf16 *)qkv, *dy = (const mc__bf16 *)dout;
        mc__bf16 *g = (mc__bf16 *)dqkv;
        if (HD == 64) {
            mc__k_flash_dkdv<64><<<grid, 128, mc__flash_smem<64>(1), cx->stream>>>(
                g, dy, x, stats, cc->att_delta, S, B, NH, scale);
            mc__k_flash_dq<64><<<grid, 128, mc__flash_smem<64>(2), cx->stream>>>(
                g, dy, x, stats, cc->att_delta, S, B, NH, scale);
        } else {
            mc__k_flash_dkdv<32><<<grid, 128, mc__flash_smem<32>(1), cx->stream>>>(
                g, dy, x, stats, cc->att_delta, S, B, NH, scale);
            mc__k_flash_dq<32><<<grid, 128, mc__flash_smem<32>(2), cx->stream>>>(
                g, dy, x, stats, cc->att_delta, S, B, NH, scale);
        }
    } else {
        MC__BY_DT(dt, T, mc__k_att_ref_dq<T><<<rblocks, 256, 0, cx->stream>>>(
                             (T *)dqkv, (const T *)dout, (const T *)qkv, stats, cc->att_delta, d));
        MC__BY_DT(dt, T, mc__k_att_ref_dkdv<T><<<rblocks, 256, 0, cx->stream>>>(
                             (T *)dqkv, (const T *)dout, (const T *)qkv, stats, cc->att_delta,
                             d));
    }
    MC__OP_END("S %d B %d NH %d HD %d p %g dt %d kernel %s", S, B, NH, HD, (double)dropout_p,
               (int)dt, which == 1 ? "flash" : "reference");
}

// --- the compute half's lifecycle and the table

static int mc__cuda_compute_init(mc__cuda_ctx *cx) {
    mc__cuda_compute *cc = (mc__cuda_compute *)mc_calloc(1, sizeof *cc);
    if (cc == NULL) return mc__set_error(MC_ERR_NO_MEMORY, "mc_ops_cuda_init: out of memory");
    cx->compute = cc;
    cublasStatus_t st = cublasLtCreate(&cc->lt);
    if (st != CUBLAS_STATUS_SUCCESS)
        return mc__set_error(MC_ERR_CUDA, "mc_ops_cuda_init: cublasLtCreate failed: %s",
                             mc__lt_status(st));
#if !defined(MC_NO_CUDNN)
    cudnnStatus_t ds = cudnnCreate(&cc->dnn);
    if (ds == CUDNN_STATUS_SUCCESS) ds = cudnnSetStream(cc->dnn, cx->stream);
    if (ds != CUDNN_STATUS_SUCCESS) {
        snprintf(cc->dnn_error, sizeof cc->dnn_error, "cuDNN did not start: %s",
                 cudnnGetErrorString(ds));
        if (cc->dnn) cudnnDestroy(cc->dnn);
        cc->dnn = NULL;
    }
#else
    snprintf(cc->dnn_error, sizeof cc->dnn_error, "built without cuDNN (make CUDNN=0)");
#endif
    if (cc->dnn == NULL && cx->attention == 2)
        return mc__set_error(MC_ERR_CUDA, "mc_ops_cuda_init: attention forced to cuDNN, but %s",
                             cc->dnn_error);
    return MC_OK;
}

static void mc__cuda_compute_destroy(mc__cuda_ctx *cx) {
    mc__cuda_compute *cc = (mc__cuda_compute *)cx->compute;
    if (cc == NULL) return;
    mc__lt_free(cc);
#if !defined(MC_NO_CUDNN)
    for (int i = 0; i < cc->n_plans; i++)
        if (cc->plans[i].plan) cudnnBackendDestroyDescriptor(cc->plans[i].plan);
    if (cc->dnn) cudnnDestroy(cc->dnn);
#endif
    if (cc->lt) cublasLtDestroy(cc->lt);
    if (cc->att_delta) cudaFree(cc->att_delta);
    if (cc->att_dq) cudaFree(cc->att_dq);
    for (int i = 0; i < cc->cap_prof; i++) {
        if (cc->prof[i].a) cudaEventDestroy(cc->prof[i].a);
        if (cc->prof[i].b) cudaEventDestroy(cc->prof[i].b);
    }
    mc_free(cc->prof);
    mc_free(cc);
    cx->compute = NULL;
}

static const char *mc__cuda_compute_describe(mc__cuda_ctx *cx) {
    mc__cuda_compute *cc = (mc__cuda_compute *)cx->compute;
    if (cc == NULL) return "no compute";
#if !defined(MC_NO_CUDNN)
    size_t dv = cudnnGetVersion();
#else
    size_t dv = 0;
#endif
    int lv = (int)cublasLtGetVersion();
    snprintf(cc->describe, sizeof cc->describe, "cuBLASLt %d.%d.%d, cuDNN %s", lv / 10000,
             (lv / 100) % 100, lv % 100,
             cc->dnn ? "" : "unavailable");
    if (cc->dnn) {
        size_t len = strlen(cc->describe);
        snprintf(cc->describe + len, sizeof cc->describe - len, "%zu.%zu.%zu", dv / 10000,
                 (dv / 100) % 100, dv % 100);
    }
    return cc->describe;
}

static void mc__cuda_fill_compute(mc_ops *t) {
    t->fill = mc__cu_fill;
    t->copy = mc__cu_copy;
    t->axpy = mc__cu_axpy;
    t->scale = mc__cu_scale;
    t->sum_squares = mc__cu_sum_squares;
    t->gemm = mc__cu_gemm;
    t->bias_backward = mc__cu_bias_backward;
    t->layernorm_forward = mc__cu_layernorm_forward;
    t->layernorm_backward = mc__cu_layernorm_backward;
    t->gelu_forward = mc__cu_gelu_forward;
    t->gelu_backward = mc__cu_gelu_backward;
    t->gemm_gelu_forward = mc__cu_gemm_gelu_forward;
    t->gemm_gelu_backward = mc__cu_gemm_gelu_backward;
    t->attention_stats = mc__cu_attention_stats;
    t->attention_forward = mc__cu_attention_forward;
    t->attention_backward = mc__cu_attention_backward;
    t->dropout_forward = mc__cu_dropout_forward;
    t->dropout_backward = mc__cu_dropout_backward;
    t->check_ids = mc__cu_check_ids;
    t->embedding_forward = mc__cu_embedding_forward;
    t->embedding_backward = mc__cu_embedding_backward;
    t->row_max = mc__cu_row_max;
    t->target_logit = mc__cu_target_logit;
    t->sum_exp = mc__cu_sum_exp;
    t->row_sum = mc__cu_row_sum;
    t->cross_entropy_loss = mc__cu_cross_entropy_loss;
    t->cross_entropy_backward = mc__cu_cross_entropy_backward;
    t->adamw = mc__cu_adamw;
}

// --- profiling: CUDA events around every op, summed per category on read

extern "C" int mc_ops_cuda_profile(const mc_ops *ops, int enable) {
    if (ops == NULL || ops->device != MC_DEVICE_CUDA || ops->ctx == NULL)
        return mc__set_error(MC_ERR_INVALID_ARG, "mc_ops_cuda_profile: not a CUDA op table");
    mc__cuda_compute *cc = mc__comp(ops);
    cc->prof_on = enable ? 1 : 0;
    cc->n_prof = 0;
    return MC_OK;
}

extern "C" int mc_ops_cuda_profile_read(const mc_ops *ops, double ms[MC_PROF_COUNT]) {
    if (ops == NULL || ops->device != MC_DEVICE_CUDA || ops->ctx == NULL || ms == NULL)
        return mc__set_error(MC_ERR_INVALID_ARG, "mc_ops_cuda_profile_read: not a CUDA op table");
    mc__cuda_ctx *cx = mc__cuda_get(ops);
    mc__cuda_compute *cc = mc__comp(ops);
    for (int k = 0; k < MC_PROF_COUNT; k++) ms[k] = 0.0;
    MC__CU("profile_read", cudaSetDevice(cx->device), "");
    MC__CU("profile_read", cudaDeviceSynchronize(), "");   /* the communicator's events too */
    for (int i = 0; i < cc->n_prof; i++) {
        float t = 0.0f;
        if (cudaEventElapsedTime(&t, cc->prof[i].a, cc->prof[i].b) == cudaSuccess &&
            cc->prof[i].cat >= 0 && cc->prof[i].cat < MC_PROF_COUNT)
            ms[cc->prof[i].cat] += t;
        else
            (void)cudaGetLastError();
    }
    cc->n_prof = 0;
    return MC_OK;
}

/* The communicator's hook: time an NCCL operation on its own stream in the memory owner's
   profile (category communication). */
static int mc__cuda_prof_comm_begin(const mc_ops *mem, cudaStream_t stream) {
    if (mem == NULL || mem->device != MC_DEVICE_CUDA || mem->ctx == NULL) return -1;
    return mc__prof_begin(mem, MC_PROF_COMM, stream);
}

static void mc__cuda_prof_comm_end(const mc_ops *mem, int idx, cudaStream_t stream) {
    if (idx >= 0) mc__prof_end(mem, idx, stream);
}

// ---------------------------------------------------------------------------------------------
// >>cuda table: mc_ops_cuda_init / mc_ops_cuda_destroy

/* The timeline's markers on the table's stream (see mc__mark_clock). */
static int mc__cuda_mark_record_op(const mc_ops *o, void **mark) {
    int rc = mc__cuda_use(o, "mark_record");
    return rc != MC_OK ? rc : mc__mark_record(&mc__cuda_get(o)->marks, mc__cuda_get(o)->stream, mark);
}
static int mc__cuda_mark_time_op(const mc_ops *o, void *mark, double *t) {
    int rc = mc__cuda_use(o, "mark_time");
    return rc != MC_OK ? rc : mc__mark_time(&mc__cuda_get(o)->marks, mark, t);
}
static void mc__cuda_mark_release_op(const mc_ops *o, void *mark) {
    if (mc__cuda_use(o, "mark_release") == MC_OK && mark != NULL) cudaEventDestroy((cudaEvent_t)mark);
    (void)cudaGetLastError();
}

static void mc__cuda_fill_table(mc_ops *t) {
    memset(t, 0, sizeof *t);
    t->name = "cuda";
    t->device = MC_DEVICE_CUDA;
    t->alloc = mc__cuda_alloc_op;
    t->free = mc__cuda_free_op;
    t->upload = mc__cuda_upload_op;
    t->download = mc__cuda_download_op;
    t->copy_2d = mc__cuda_copy_2d_op;
    t->synchronize = mc__cuda_synchronize_op;
    t->mark_record = mc__cuda_mark_record_op;
    t->mark_time = mc__cuda_mark_time_op;
    t->mark_release = mc__cuda_mark_release_op;
    mc__cuda_fill_compute(t);
}

static int mc__cuda_env_flag(const char *name) {
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

static void mc__cuda_release(mc__cuda_ctx *cx) {
    if (cx == NULL) return;
    cudaSetDevice(cx->device);
    mc__cuda_compute_destroy(cx);
    mc__mark_clock_destroy(&cx->marks);
    if (cx->workspace != NULL) cudaFree(cx->workspace);
    if (cx->stream != NULL) cudaStreamDestroy(cx->stream);
    for (int i = 0; i < cx->n_allocs; i++) cudaFree(cx->allocs[i].ptr);   // leaked by the user
    mc_free(cx->allocs);
    (void)cudaGetLastError();
    mc_free(cx);
}

static int mc__cuda_open(mc__cuda_ctx *cx, const mc_cuda_desc *d) {
    int count = 0;
    MC__CU("init", cudaGetDeviceCount(&count), "");
    if (d->device == -1) MC__CU("init", cudaGetDevice(&cx->device), "");
    else cx->device = d->device;
    if (cx->device < 0 || cx->device >= count)
        return mc__set_error(MC_ERR_INVALID_DESC, "mc_cuda_desc.device (%d) must be in [0, %d) "
                             "(the visible CUDA devices) or -1 (the current one)", cx->device,
                             count);
    MC__CU("init", cudaSetDevice(cx->device), "device %d", cx->device);
    MC__CU("init", cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking), "");
    mc__mark_clock_init(&cx->marks, cx->stream);
    cx->workspace_bytes = d->workspace_bytes ? d->workspace_bytes : (size_t)32 << 20;
    MC__CU("init", cudaMalloc(&cx->workspace, cx->workspace_bytes), "workspace %zu bytes",
           cx->workspace_bytes);
    cx->sync_check = d->sync_check || mc__cuda_env_flag("MC_CUDA_SYNC_CHECK");
    cx->tf32 = d->tf32;
    cx->deterministic = d->deterministic || mc__cuda_env_flag("MC_CUDA_DETERMINISTIC");
    const char *fz = getenv("MC_CUDA_FUSE");   /* 0 / off: the switch without a rebuild */
    cx->fuse = !d->unfused && !(fz != NULL && (strcmp(fz, "0") == 0 || strcmp(fz, "off") == 0));
    cx->attention = d->attention;
    const char *att = getenv("MC_CUDA_ATTENTION");
    if (att != NULL && strcmp(att, "auto") == 0) cx->attention = 0;
    if (att != NULL && strcmp(att, "own") == 0) cx->attention = 1;
    if (att != NULL && strcmp(att, "cudnn") == 0) cx->attention = 2;
    if (att != NULL && strcmp(att, "ref") == 0) cx->attention = 3;
    if (cx->attention < 0 || cx->attention > 3)
        return mc__set_error(MC_ERR_INVALID_DESC, "mc_cuda_desc.attention (%d) must be 0 (auto), "
                             "1 (own kernels), 2 (cuDNN) or 3 (reference kernel)", cx->attention);
    if (cx->deterministic && cx->attention == 0) cx->attention = 1;   /* no cuDNN backward */
    return mc__cuda_compute_init(cx);
}

extern "C" int mc_ops_cuda_init(mc_ops *ops, const mc_cuda_desc *desc) {
    mc_cuda_desc d;
    memset(&d, 0, sizeof d);
    if (desc != NULL) d = *desc;
    if (ops == NULL) return mc__set_error(MC_ERR_INVALID_ARG, "mc_ops_cuda_init: ops is NULL");
    mc__cuda_ctx *cx = (mc__cuda_ctx *)mc_calloc(1, sizeof *cx);
    if (cx == NULL) return mc__set_error(MC_ERR_NO_MEMORY, "mc_ops_cuda_init: out of memory");
    int rc = mc__cuda_open(cx, &d);
    if (rc != MC_OK) {
        mc__cuda_release(cx);
        return rc;
    }
    mc_ops table;
    mc__cuda_fill_table(&table);
    table.ctx = cx;
    *ops = table;   // written only on success
    return MC_OK;
}

extern "C" void mc_ops_cuda_destroy(mc_ops *ops) {
    if (ops == NULL || ops->device != MC_DEVICE_CUDA || ops->ctx == NULL) return;
    mc__cuda_release(mc__cuda_get(ops));
    ops->ctx = NULL;
}

extern "C" int mc_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

extern "C" size_t mc_ops_cuda_peak_bytes(const mc_ops *ops, int reset) {
    if (ops == NULL || ops->device != MC_DEVICE_CUDA || ops->ctx == NULL) return 0;
    mc__cuda_ctx *cx = mc__cuda_get(ops);
    size_t peak = cx->peak_bytes;
    if (reset) cx->peak_bytes = cx->live_bytes;
    return peak;
}

extern "C" const char *mc_ops_cuda_attention_kernels(const mc_ops *ops) {
    if (ops == NULL || ops->device != MC_DEVICE_CUDA || ops->ctx == NULL) return "";
    mc__cuda_compute *cc = mc__comp(ops);
    static const char *names[4] = {"none yet", "reference", "flash", "cudnn"};
    snprintf(cc->kernels, sizeof cc->kernels, "forward %s, backward %s%s%s",
             names[cc->att_last[0]], names[cc->att_last[1]], cc->dnn_error[0] ? "; " : "",
             cc->dnn_error);
    return cc->kernels;
}

extern "C" const char *mc_ops_cuda_fusion(const mc_ops *ops) {
    if (ops == NULL || ops->device != MC_DEVICE_CUDA || ops->ctx == NULL) return "";
    mc__cuda_ctx *cx = mc__cuda_get(ops);
    mc__cuda_compute *cc = mc__comp(ops);
    snprintf(cc->fusion, sizeof cc->fusion, "%s: GELU in the GEMM epilogue, forward %ld fused / "
             "%ld unfused, backward %ld fused / %ld unfused%s%s", cx->fuse ? "on" : "off",
             cc->gelu_fused[0], cc->gelu_unfused[0], cc->gelu_fused[1], cc->gelu_unfused[1],
             cc->fuse_why[0] ? "; last unfused: " : "", cc->fuse_why);
    return cc->fusion;
}

extern "C" const char *mc_ops_cuda_describe(const mc_ops *ops) {
    if (ops == NULL || ops->device != MC_DEVICE_CUDA || ops->ctx == NULL) return "";
    mc__cuda_ctx *cx = mc__cuda_get(ops);
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDeviceProperties(&prop, cx->device) != cudaSuccess) (void)cudaGetLastError();
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    snprintf(cx->describe, sizeof cx->describe, "%s, sm_%d%d, %.1f GiB, CUDA runtime %d.%d, %s, "
             "attention %s, GELU %s%s%s", prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), rt / 1000,
             (rt % 1000) / 10, mc__cuda_compute_describe(cx),
             cx->attention == 0 ? "auto" : cx->attention == 1 ? "own kernels"
                                 : cx->attention == 2 ? "cuDNN" : "reference kernel",
             cx->fuse ? "fused into the GEMMs" : "unfused (MC_CUDA_FUSE=0)",
             cx->deterministic ? ", deterministic" : "", cx->sync_check ? ", sync check on" : "");
    return cx->describe;
}

// ---------------------------------------------------------------------------------------------
// NCCL backend

/* --- error reporting ---------------------------------------------------------------------
   Messages go to mc_last_error() and the logger through mc__set_error, which the header
   implementation exports for this file (its own error helpers are static to its translation
   unit). */

static int mc__nccl_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int mc__nccl_fail(int status, const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return mc__set_error(status, "%s", message);
}

static int mc__nccl_fail_cuda(cudaError_t err, const char *call, const char *comm_name) {
    (void)cudaGetLastError();   // reset the runtime's last-error slot for the next check
    return mc__nccl_fail(MC_ERR_CUDA, "%s failed on communicator '%s': %s (%s)", call,
                         comm_name, cudaGetErrorString(err), cudaGetErrorName(err));
}

static int mc__nccl_fail_nccl(ncclResult_t res, ncclComm_t comm, const char *call,
                              const char *comm_name) {
    const char *detail = comm != NULL ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    return mc__nccl_fail(MC_ERR_NCCL, "%s failed on communicator '%s': %s%s%s", call, comm_name,
                         ncclGetErrorString(res), detail && detail[0] ? " - " : "",
                         detail ? detail : "");
}

static int mc__nccl_fail_mpi(int mpi_rc, const char *call, const char *comm_name) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(mpi_rc, text, &len);
    return mc__nccl_fail(MC_ERR_COMM, "%s failed on communicator '%s': %s", call, comm_name,
                         text);
}

/* --- clocks and polling ------------------------------------------------------------------ */

static double mc__nccl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A deadline of 0 means "no deadline" (timeout_s <= 0 waits forever, as mc_comm documents). */
static double mc__nccl_deadline(double timeout_s) {
    return timeout_s > 0 ? mc__nccl_now() + timeout_s : 0.0;
}

static int mc__nccl_past(double deadline) {
    return deadline > 0 && mc__nccl_now() > deadline;
}

/* Spin briefly (collectives on NVLink finish in microseconds), then back off so that a long
   wait does not take a whole core from the other ranks on the node. */
static void mc__nccl_pause(long polls) {
    if (polls < 2000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, polls < 20000 ? 20000L : 200000L};
    nanosleep(&ts, NULL);
}

/* --- communicator state ------------------------------------------------------------------ */

typedef struct mc__nccl_state {
    ncclComm_t nccl;          // NULL once aborted or destroyed
    cudaStream_t stream;      // non-blocking; every operation of this communicator runs here
    int device;               // the GPU of this rank (its rank on the node)
    int aborted;              // 1 after a timeout or an NCCL error: only destroy is allowed
    double op_deadline;       // deadline of the operation being started (0: none)
    float *barrier_scratch;   // one device float that barrier() all-reduces
    cudaEvent_t follow;       // recorded on the memory owner's stream before every operation
    int prof_idx;             // the profile record of the operation being started (-1: none)
    mc__mark_clock marks;     // the timeline's completion markers on `stream`
    /* The MPI backend this communicator was built on: destroy hands the communicator back to
       it, and children get their MPI side from its create_child. */
    const mc_comm_ops *mpi_ops;
    void *mpi_impl;
} mc__nccl_state;

static mc__nccl_state *mc__nccl_get(mc_comm *c) {
    return (mc__nccl_state *)c->impl;
}

static MPI_Comm mc__nccl_mpi(const mc_comm *c) {
    return *(MPI_Comm *)c->mpi;
}

/* Selects this communicator's GPU on the calling thread. Cheap, and it keeps the backend
   correct when the application switched devices between calls. */
static int mc__nccl_use_device(mc_comm *c) {
    cudaError_t err = cudaSetDevice(mc__nccl_get(c)->device);
    return err == cudaSuccess ? MC_OK : mc__nccl_fail_cuda(err, "cudaSetDevice", c->name);
}

/* The collectives run on the communicator's stream, the ops that produce their buffers on the
   memory owner's: the communicator's stream waits for everything queued there so far (an
   event, no host wait). The other direction needs nothing: blocking calls and mc_wait return
   only once the collective is done, and the next op is queued after that. */
static int mc__nccl_follow_memory(mc_comm *c, const char *what) {
    mc__nccl_state *st = mc__nccl_get(c);
    cudaStream_t mem = mc__cuda_stream_of(c->mem);
    st->prof_idx = -1;
    if (mem == NULL || st->follow == NULL) return MC_OK;
    cudaError_t err = cudaEventRecord(st->follow, mem);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(st->stream, st->follow, 0);
    if (err != cudaSuccess) return mc__nccl_fail_cuda(err, what, c->name);
    st->prof_idx = mc__cuda_prof_comm_begin(c->mem, st->stream);
    return MC_OK;
}

/* Entry check of every operation: a live nccl communicator with its device selected. It also
   starts the operation's clock: one deadline covers queuing (which may wait for peers to set
   up connections) and, for blocking calls, completion. */
static int mc__nccl_ready(mc_comm *c, const char *what) {
    if (c == NULL || c->impl == NULL)
        return mc__nccl_fail(MC_ERR_INVALID_ARG, "%s: communicator is NULL or not an nccl "
                             "communicator", what);
    if (mc__nccl_get(c)->aborted)
        return mc__nccl_fail(MC_ERR_STATE, "%s: nccl communicator '%s' was aborted after an "
                             "earlier timeout or NCCL error; destroy it and create a new one",
                             what, c->name);
    mc__nccl_get(c)->op_deadline = mc__nccl_deadline(c->timeout_s);
    int status = mc__nccl_use_device(c);
    return status == MC_OK ? mc__nccl_follow_memory(c, what) : status;
}

/* Tears the NCCL communicator down at once, also when peers are gone or kernels are stuck
   waiting for them: NCCL's kernels watch an abort flag and return. */
static void mc__nccl_abort(mc__nccl_state *st) {
    if (st->nccl != NULL) ncclCommAbort(st->nccl);
    st->nccl = NULL;
    st->aborted = 1;
}

/* In non-blocking mode an NCCL call may return ncclInProgress: the work (init, connection
   setup, enqueue, finalize) continues in the background and ncclCommGetAsyncError reports
   when it is done. This polls until then or until the deadline, and aborts the communicator
   on an error or a timeout (a half-set-up communicator is of no use). */
static int mc__nccl_settle(mc_comm *c, mc__nccl_state *st, ncclResult_t res, const char *call,
                           double deadline, double timeout_s) {
    for (long polls = 0; res == ncclInProgress; polls++) {
        if (mc__nccl_past(deadline)) {
            mc__nccl_abort(st);
            return mc__nccl_fail(MC_ERR_TIMEOUT, "%s on nccl communicator '%s' (rank %d of %d) "
                                 "did not complete within %.1f s (a peer did not take part); "
                                 "the communicator was aborted", call, c->name, c->rank,
                                 c->size, timeout_s);
        }
        mc__nccl_pause(polls);
        ncclResult_t query = ncclCommGetAsyncError(st->nccl, &res);
        if (query != ncclSuccess) res = query;
    }
    if (res != ncclSuccess) {
        int status = mc__nccl_fail_nccl(res, st->nccl, call, c->name);
        mc__nccl_abort(st);
        return status;
    }
    return MC_OK;
}

/* --- requests ------------------------------------------------------------------------------
   The handle of an async operation: the event recorded after it on the communicator's stream.
   It begins with mc_request_head, through which mc_wait and mc_test find the communicator. */
typedef struct mc__nccl_request {
    mc_request_head head;
    cudaEvent_t done;
} mc__nccl_request;

static void mc__nccl_request_free(mc__nccl_request *r) {
    cudaEventDestroy(r->done);
    mc_free(r);
}

/* The state of a request that is still running: MC_OK while it may finish, or the error
   (NCCL failure, aborted communicator) that ends it. */
static int mc__nccl_op_health(mc_comm *c, const char *what) {
    mc__nccl_state *st = mc__nccl_get(c);
    if (st->aborted)
        return mc__nccl_fail(MC_ERR_STATE, "%s: nccl communicator '%s' was aborted while the "
                             "operation was in flight", what, c->name);
    ncclResult_t async = ncclSuccess;
    ncclResult_t query = ncclCommGetAsyncError(st->nccl, &async);
    if (query != ncclSuccess) async = query;
    if (async == ncclSuccess || async == ncclInProgress) return MC_OK;
    int status = mc__nccl_fail_nccl(async, st->nccl, what, c->name);
    mc__nccl_abort(st);
    return status;
}

/* Waits for `done` (an event on c's stream) until the deadline, watching for asynchronous
   NCCL errors. A timeout or an NCCL error aborts the communicator: the stuck kernels must be
   released before the stream or the device can be used again. timeout_s is for the message. */
static int mc__nccl_wait_event(mc_comm *c, cudaEvent_t done, const char *what, double deadline,
                               double timeout_s) {
    mc__nccl_state *st = mc__nccl_get(c);
    for (long polls = 0;; polls++) {
        // Checked first: after an abort the kernels return early, so the event completes
        // although the data never arrived.
        int status = mc__nccl_op_health(c, what);
        if (status != MC_OK) return status;
        cudaError_t err = cudaEventQuery(done);
        if (err == cudaSuccess) return MC_OK;
        if (err != cudaErrorNotReady) return mc__nccl_fail_cuda(err, "cudaEventQuery", c->name);
        if (mc__nccl_past(deadline)) {
            mc__nccl_abort(st);
            return mc__nccl_fail(MC_ERR_TIMEOUT, "%s on nccl communicator '%s' (rank %d of %d) "
                                 "did not complete within %.1f s (a peer did not take part); the "
                                 "communicator was aborted", what, c->name, c->rank, c->size,
                                 timeout_s);
        }
        mc__nccl_pause(polls);
    }
}

/* Marks the end of the work just queued on c's stream. With req == NULL (blocking call) it
   waits for it until the operation's deadline; otherwise it hands out a request. */
static int mc__nccl_finish(mc_comm *c, const char *what, mc_request **req) {
    mc__nccl_state *st = mc__nccl_get(c);
    cudaEvent_t done;
    mc__cuda_prof_comm_end(c->mem, st->prof_idx, st->stream);
    st->prof_idx = -1;
    cudaError_t err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (err != cudaSuccess) return mc__nccl_fail_cuda(err, "cudaEventCreateWithFlags", c->name);
    err = cudaEventRecord(done, st->stream);
    if (err != cudaSuccess) {
        cudaEventDestroy(done);
        return mc__nccl_fail_cuda(err, "cudaEventRecord", c->name);
    }
    if (req == NULL) {
        int status = mc__nccl_wait_event(c, done, what, st->op_deadline, c->timeout_s);
        cudaEventDestroy(done);
        return status;
    }
    mc__nccl_request *r = (mc__nccl_request *)mc_calloc(1, sizeof *r);
    if (r == NULL) {
        // Nobody could wait on the operation any more, so finish it here.
        int status = mc__nccl_wait_event(c, done, what, st->op_deadline, c->timeout_s);
        cudaEventDestroy(done);
        return status != MC_OK ? status
                               : mc__nccl_fail(MC_ERR_NO_MEMORY, "%s: no memory for a request "
                                               "(operation completed blocking)", what);
    }
    r->head.comm = c;
    r->head.op = what;
    r->done = done;
    *req = (mc_request *)r;
    return MC_OK;
}

/* Frees the request on success and on error, as mc_wait promises. */
static int mc__nccl_op_wait(mc_request *req, double timeout_s) {
    if (req == NULL) return mc__nccl_fail(MC_ERR_INVALID_ARG, "wait: request is NULL");
    mc__nccl_request *r = (mc__nccl_request *)req;
    mc_comm *c = r->head.comm;
    int status = mc__nccl_use_device(c);
    if (status == MC_OK)
        status = mc__nccl_wait_event(c, r->done, r->head.op, mc__nccl_deadline(timeout_s),
                                     timeout_s);
    mc__nccl_request_free(r);
    return status;
}

/* *done = 1 when the operation is over, successfully or not; the request is then freed (as
   by mc_wait) and the status says how it ended. */
static int mc__nccl_op_test(mc_request *req, int *done) {
    if (req == NULL || done == NULL)
        return mc__nccl_fail(MC_ERR_INVALID_ARG, "test: request (%p) and done (%p) must not be "
                             "NULL", (void *)req, (void *)done);
    mc__nccl_request *r = (mc__nccl_request *)req;
    mc_comm *c = r->head.comm;
    int status = mc__nccl_op_health(c, r->head.op);
    if (status == MC_OK) {
        cudaError_t err = cudaEventQuery(r->done);
        if (err == cudaErrorNotReady) {
            *done = 0;
            return MC_OK;
        }
        if (err != cudaSuccess) status = mc__nccl_fail_cuda(err, "cudaEventQuery", c->name);
    }
    *done = 1;
    mc__nccl_request_free(r);
    return status;
}

/* --- argument translation ----------------------------------------------------------------- */

static int mc__nccl_dtype(mc_dtype dt, ncclDataType_t *out, const char *what) {
    switch (dt) {
    case MC_F32: *out = ncclFloat32; return MC_OK;
    case MC_F64: *out = ncclFloat64; return MC_OK;
    case MC_I32: *out = ncclInt32; return MC_OK;
    case MC_I64: *out = ncclInt64; return MC_OK;
    case MC_U8: *out = ncclUint8; return MC_OK;
    case MC_BF16: *out = ncclBfloat16; return MC_OK;
    default:
        return mc__nccl_fail(MC_ERR_INVALID_ARG, "%s: dtype (%d) is not an mc_dtype "
                             "(0..%d)", what, (int)dt, (int)MC_DTYPE_COUNT - 1);
    }
}

static int mc__nccl_redop(mc_reduce_op op, ncclRedOp_t *out, const char *what) {
    switch (op) {
    case MC_SUM: *out = ncclSum; return MC_OK;
    case MC_MAX: *out = ncclMax; return MC_OK;
    case MC_MIN: *out = ncclMin; return MC_OK;
    case MC_AVG: *out = ncclAvg; return MC_OK;
    default:
        return mc__nccl_fail(MC_ERR_INVALID_ARG, "%s: reduce op (%d) is not an mc_reduce_op "
                             "(MC_SUM, MC_MAX, MC_MIN, MC_AVG)", what, (int)op);
    }
}

static int mc__nccl_check_rank(const mc_comm *c, int rank, const char *field,
                               const char *what) {
    if (rank >= 0 && rank < c->size) return MC_OK;
    return mc__nccl_fail(MC_ERR_INVALID_ARG, "%s: %s (%d) is not a rank of communicator '%s' "
                         "(0..%d)", what, field, rank, c->name, c->size - 1);
}

/* Queues one NCCL call (already made: `res` is its result) and finishes it. */
static int mc__nccl_issued(mc_comm *c, ncclResult_t res, const char *what, mc_request **req) {
    mc__nccl_state *st = mc__nccl_get(c);
    int status = mc__nccl_settle(c, st, res, what, st->op_deadline, c->timeout_s);
    return status != MC_OK ? status : mc__nccl_finish(c, what, req);
}

/* --- collectives --------------------------------------------------------------------------- */

/* NCCL reads and writes device memory only; a host pointer would be an illegal access on the
   GPU (the stream, then the communicator, dies). Check first and name the buffer. */
static int mc__nccl_buffer(const mc_comm *c, const void *p, const char *field, const char *what) {
    cudaPointerAttributes attr;
    if (p == NULL) return MC_OK;   /* counted elsewhere: count 0 or a missing operand */
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();   /* clear the error so that later CUDA calls do not report it */
        attr.type = cudaMemoryTypeUnregistered;
    }
    if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return MC_OK;
    return mc__nccl_fail(MC_ERR_INVALID_ARG,
                         "%s on nccl communicator '%s': %s (%p) is host memory, but an nccl "
                         "communicator works on device buffers (allocate them with "
                         "mc_comm_alloc and copy with mc_comm_upload / mc_comm_download)",
                         what, c->name, field, p);
}

static int mc__nccl_all_reduce(mc_comm *c, const void *send, void *recv, size_t count,
                               mc_dtype dt, mc_reduce_op op, mc_request **req) {
    ncclDataType_t type = ncclFloat32;
    ncclRedOp_t red = ncclSum;
    int status = mc__nccl_ready(c, "all_reduce");
    if (status == MC_OK) status = mc__nccl_buffer(c, send, "send", "all_reduce");
    if (status == MC_OK) status = mc__nccl_buffer(c, recv, "recv", "all_reduce");
    if (status == MC_OK) status = mc__nccl_dtype(dt, &type, "all_reduce");
    if (status == MC_OK) status = mc__nccl_redop(op, &red, "all_reduce");
    if (status != MC_OK) return status;
    mc__nccl_state *st = mc__nccl_get(c);
    return mc__nccl_issued(c, ncclAllReduce(send, recv, count, type, red, st->nccl, st->stream),
                           "all_reduce", req);
}

static int mc__nccl_all_gather(mc_comm *c, const void *send, void *recv, size_t count,
                               mc_dtype dt, mc_request **req) {
    ncclDataType_t type = ncclFloat32;
    int status = mc__nccl_ready(c, "all_gather");
    if (status == MC_OK) status = mc__nccl_buffer(c, send, "send", "all_gather");
    if (status == MC_OK) status = mc__nccl_buffer(c, recv, "recv", "all_gather");
    if (status == MC_OK) status = mc__nccl_dtype(dt, &type, "all_gather");
    if (status != MC_OK) return status;
    mc__nccl_state *st = mc__nccl_get(c);
    return mc__nccl_issued(c, ncclAllGather(send, recv, count, type, st->nccl, st->stream),
                           "all_gather", req);
}

static int mc__nccl_reduce_scatter(mc_comm *c, const void *send, void *recv, size_t recv_count,
                                   mc_dtype dt, mc_reduce_op op, mc_request **req) {
    ncclDataType_t type = ncclFloat32;
    ncclRedOp_t red = ncclSum;
    int status = mc__nccl_ready(c, "reduce_scatter");
    if (status == MC_OK) status = mc__nccl_buffer(c, send, "send", "reduce_scatter");
    if (status == MC_OK) status = mc__nccl_buffer(c, recv, "recv", "reduce_scatter");
    if (status == MC_OK) status = mc__nccl_dtype(dt, &type, "reduce_scatter");
    if (status == MC_OK) status = mc__nccl_redop(op, &red, "reduce_scatter");
    if (status != MC_OK) return status;
    mc__nccl_state *st = mc__nccl_get(c);
    return mc__nccl_issued(c, ncclReduceScatter(send, recv, recv_count, type, red, st->nccl,
                                                st->stream),
                           "reduce_scatter", req);
}

static int mc__nccl_broadcast(mc_comm *c, void *buf, size_t count, mc_dtype dt, int root,
                              mc_request **req) {
    ncclDataType_t type = ncclFloat32;
    int status = mc__nccl_ready(c, "broadcast");
    if (status == MC_OK) status = mc__nccl_buffer(c, buf, "buf", "broadcast");
    if (status == MC_OK) status = mc__nccl_dtype(dt, &type, "broadcast");
    if (status == MC_OK) status = mc__nccl_check_rank(c, root, "root", "broadcast");
    if (status != MC_OK) return status;
    mc__nccl_state *st = mc__nccl_get(c);
    return mc__nccl_issued(c, ncclBroadcast(buf, buf, count, type, root, st->nccl, st->stream),
                           "broadcast", req);
}

/* A one-element all-reduce: it cannot complete before every rank has issued it, and the
   event wait makes the host wait for it too (with the timeout, unlike a stream sync). */
static int mc__nccl_barrier(mc_comm *c, mc_request **req) {
    int status = mc__nccl_ready(c, "barrier");
    if (status != MC_OK) return status;
    mc__nccl_state *st = mc__nccl_get(c);
    return mc__nccl_issued(c, ncclAllReduce(st->barrier_scratch, st->barrier_scratch, 1,
                                            ncclFloat32, ncclSum, st->nccl, st->stream),
                           "barrier", req);
}

/* --- point to point ------------------------------------------------------------------------ */

static int mc__nccl_p2p_args(mc_comm *c, mc_dtype dt, int peer, ncclDataType_t *type,
                             const char *what) {
    int status = mc__nccl_dtype(dt, type, what);
    return status != MC_OK ? status : mc__nccl_check_rank(c, peer, "peer", what);
}

static int mc__nccl_send(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer,
                         int tag, mc_request **req) {
    (void)tag;   // NCCL matches point-to-point messages by order, not by tag
    ncclDataType_t type = ncclFloat32;
    int status = mc__nccl_ready(c, "send");
    if (status == MC_OK) status = mc__nccl_buffer(c, buf, "buf", "send");
    if (status == MC_OK) status = mc__nccl_p2p_args(c, dt, peer, &type, "send");
    if (status != MC_OK) return status;
    mc__nccl_state *st = mc__nccl_get(c);
    return mc__nccl_issued(c, ncclSend(buf, count, type, peer, st->nccl, st->stream), "send",
                           req);
}

static int mc__nccl_recv(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag,
                         mc_request **req) {
    (void)tag;
    ncclDataType_t type = ncclFloat32;
    int status = mc__nccl_ready(c, "recv");
    if (status == MC_OK) status = mc__nccl_buffer(c, buf, "buf", "recv");
    if (status == MC_OK) status = mc__nccl_p2p_args(c, dt, peer, &type, "recv");
    if (status != MC_OK) return status;
    mc__nccl_state *st = mc__nccl_get(c);
    return mc__nccl_issued(c, ncclRecv(buf, count, type, peer, st->nccl, st->stream), "recv",
                           req);
}

/* All sends and receives in one NCCL group: NCCL schedules them together, so a ring where
   every rank sends to the next and receives from the previous cannot deadlock. Every
   argument is checked before the group opens, so an invalid op never leaves a group half
   built. */
static int mc__nccl_batch_send_recv(mc_comm *c, const mc_p2p_op *ops, int n_ops,
                                    mc_request **req) {
    int status = mc__nccl_ready(c, "batch_send_recv");
    if (status != MC_OK) return status;
    if (n_ops < 0 || (n_ops > 0 && ops == NULL))
        return mc__nccl_fail(MC_ERR_INVALID_ARG, "batch_send_recv: n_ops (%d) must be >= 0 and "
                             "ops must not be NULL when n_ops > 0", n_ops);
    for (int i = 0; i < n_ops; i++) {
        ncclDataType_t type = ncclFloat32;
        status = mc__nccl_p2p_args(c, ops[i].dtype, ops[i].peer, &type, "batch_send_recv");
        if (status == MC_OK) status = mc__nccl_buffer(c, ops[i].buf, "ops[i].buf", "batch_send_recv");
        if (status != MC_OK) return status;
    }
    /* NCCL matches a pair's messages by order alone. Two sends to (or receives from) one peer
       with different tags are two different messages the other side tells apart by tag - on
       NCCL they could cross silently (e.g. a pipeline of 2 stages sending an activation and a
       gradient to the same neighbour in one batch), so refuse them. */
    for (int i = 0; i < n_ops; i++)
        for (int j = i + 1; j < n_ops; j++)
            if (ops[i].is_send == ops[j].is_send && ops[i].peer == ops[j].peer &&
                ops[i].tag != ops[j].tag)
                return mc__nccl_fail(MC_ERR_UNSUPPORTED,
                                     "batch_send_recv: ops %d and %d both %s peer %d, with tags %d "
                                     "and %d; NCCL has no tags, so the two messages could be "
                                     "swapped (split the batch so each holds one of them)",
                                     i, j, ops[i].is_send ? "send to" : "receive from",
                                     ops[i].peer, ops[i].tag, ops[j].tag);
    mc__nccl_state *st = mc__nccl_get(c);
    ncclResult_t res = ncclGroupStart();
    for (int i = 0; i < n_ops && res == ncclSuccess; i++) {
        ncclDataType_t type = ncclFloat32;
        mc__nccl_dtype(ops[i].dtype, &type, "batch_send_recv");
        res = ops[i].is_send
                  ? ncclSend(ops[i].buf, ops[i].count, type, ops[i].peer, st->nccl, st->stream)
                  : ncclRecv(ops[i].buf, ops[i].count, type, ops[i].peer, st->nccl, st->stream);
    }
    // The group must be closed even after a failed member call, or NCCL stays inside it.
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess) res = end;
    return mc__nccl_issued(c, res, "batch_send_recv", req);
}

/* --- creating the NCCL side of a communicator ---------------------------------------------- */

/* Rank 0 of c draws the unique id and MPI carries it to the others. Every rank first learns
   whether all ranks are ready, so one failing rank makes all of them fail instead of leaving
   the others blocked in MPI_Bcast. */
static int mc__nccl_agree_on(MPI_Comm comm, const char *name, int local_status,
                             const char *step) {
    int worst = local_status;
    int mrc = MPI_Allreduce(&local_status, &worst, 1, MPI_INT, MPI_MIN, comm);
    if (mrc != MPI_SUCCESS) return mc__nccl_fail_mpi(mrc, "MPI_Allreduce", name);
    if (local_status != MC_OK) return local_status;   // keep this rank's own message
    if (worst != MC_OK)
        return mc__nccl_fail(worst, "%s of nccl communicator '%s' failed on another rank "
                             "(%s); see that rank's error", step, name, mc_err_name(worst));
    return MC_OK;
}

static int mc__nccl_agree(mc_comm *c, int local_status, const char *step) {
    return mc__nccl_agree_on(mc__nccl_mpi(c), c->name, local_status, step);
}

static int mc__nccl_share_id(mc_comm *c, ncclUniqueId *id) {
    int status = MC_OK;
    if (c->rank == 0) {
        ncclResult_t res = ncclGetUniqueId(id);
        if (res != ncclSuccess) status = mc__nccl_fail_nccl(res, NULL, "ncclGetUniqueId", c->name);
    }
    status = mc__nccl_agree(c, status, "drawing the NCCL unique id");
    if (status != MC_OK) return status;
    int mrc = MPI_Bcast(id, (int)sizeof *id, MPI_BYTE, 0, mc__nccl_mpi(c));
    return mrc == MPI_SUCCESS ? MC_OK : mc__nccl_fail_mpi(mrc, "MPI_Bcast", c->name);
}

/* Creates the NCCL communicator (non-blocking, polled with c's timeout), the stream and the
   barrier scratch for c, on `device`. */
static int mc__nccl_open(mc_comm *c, mc__nccl_state *st, const ncclUniqueId *id) {
    cudaError_t err = cudaSetDevice(st->device);
    if (err != cudaSuccess) return mc__nccl_fail_cuda(err, "cudaSetDevice", c->name);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = MC_NCCL_BLOCKING ? 1 : 0;
    double deadline = mc__nccl_deadline(c->timeout_s);
    ncclResult_t res = ncclCommInitRankConfig(&st->nccl, c->size, *id, c->rank, &config);
    if (res != ncclSuccess && res != ncclInProgress) {
        int status = mc__nccl_fail_nccl(res, NULL, "ncclCommInitRankConfig", c->name);
        if (st->nccl != NULL) mc__nccl_abort(st);
        return status;
    }
    int status = mc__nccl_settle(c, st, res, "ncclCommInitRankConfig", deadline, c->timeout_s);
    if (status != MC_OK) return status;
    err = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return mc__nccl_fail_cuda(err, "cudaStreamCreateWithFlags", c->name);
    mc__mark_clock_init(&st->marks, st->stream);
    err = cudaMalloc((void **)&st->barrier_scratch, sizeof(float));
    if (err != cudaSuccess) return mc__nccl_fail_cuda(err, "cudaMalloc (barrier)", c->name);
    err = cudaEventCreateWithFlags(&st->follow, cudaEventDisableTiming);
    if (err != cudaSuccess) return mc__nccl_fail_cuda(err, "cudaEventCreateWithFlags", c->name);
    return MC_OK;
}

/* Frees whatever mc__nccl_open made. Finalize flushes outstanding work and is polled with the
   timeout; when a peer is gone it cannot finish, and the communicator is aborted instead. */
static void mc__nccl_close(mc_comm *c, mc__nccl_state *st) {
    cudaSetDevice(st->device);
    if (st->nccl != NULL && !st->aborted) {
        double deadline = mc__nccl_deadline(c->timeout_s);
        // settle aborts (and clears st->nccl) when finalize fails or runs out of time
        mc__nccl_settle(c, st, ncclCommFinalize(st->nccl), "ncclCommFinalize", deadline,
                        c->timeout_s);
        if (st->nccl != NULL) {
            ncclCommDestroy(st->nccl);
            st->nccl = NULL;
        }
    }
    if (st->nccl != NULL) mc__nccl_abort(st);
    mc__mark_clock_destroy(&st->marks);
    if (st->stream != NULL) cudaStreamDestroy(st->stream);
    if (st->barrier_scratch != NULL) cudaFree(st->barrier_scratch);
    if (st->follow != NULL) cudaEventDestroy(st->follow);
    st->stream = NULL;
    st->barrier_scratch = NULL;
    st->follow = NULL;
    (void)cudaGetLastError();
}

/* Opens NCCL on c (an MPI-filled communicator) on every rank of c, or on none: the outcome is
   agreed through MPI, and ranks that succeeded tear down again when another rank failed.
   On success c becomes an nccl communicator whose state remembers the MPI backend. */
static int mc__nccl_attach(mc_comm *c, int device) {
    mc__nccl_state *st = (mc__nccl_state *)mc_calloc(1, sizeof *st);
    int status = st != NULL ? MC_OK
                            : mc__nccl_fail(MC_ERR_NO_MEMORY, "no memory for the nccl state "
                                            "of communicator '%s'", c->name);
    status = mc__nccl_agree(c, status, "allocating the nccl state");
    if (status != MC_OK) {
        mc_free(st);
        return status;
    }
    st->device = device;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    status = mc__nccl_share_id(c, &id);
    if (status == MC_OK) {
        status = mc__nccl_open(c, st, &id);
        status = mc__nccl_agree(c, status, "ncclCommInitRank");
    }
    if (status != MC_OK) {
        mc__nccl_close(c, st);
        mc_free(st);
        return status;
    }
    st->mpi_ops = c->ops;
    st->mpi_impl = c->impl;
    c->ops = mc__nccl_ops();
    c->impl = st;
    c->backend = MC_BACKEND_NCCL;
    return MC_OK;
}

/* --- children ------------------------------------------------------------------------------
   Called on the member ranks only, after the generic layer agreed on `members` through MPI.
   The MPI backend makes the MPI side: MPI_Comm_create_group over the parent's MPI
   communicator, collective over the members alone (not the whole parent, which is what makes
   member-local creation possible), with `seq` as its tag so that concurrent creations over
   one parent do not mix. NCCL is then laid over it on the parent's GPU. */
static int mc__nccl_create_child(mc_comm *c, const int *members, int n_members, int seq,
                                 mc_comm **out) {
    if (out == NULL) return mc__nccl_fail(MC_ERR_INVALID_ARG, "create_child: out is NULL");
    *out = NULL;
    int status = mc__nccl_ready(c, "create_child");
    if (status != MC_OK) return status;
    mc__nccl_state *st = mc__nccl_get(c);
    mc_comm *child = NULL;
    // The MPI backend's create_child only reads c->mpi, the name, rank, size and timeout.
    status = st->mpi_ops->create_child(c, members, n_members, seq, &child);
    if (status != MC_OK) return status;
    snprintf(child->name, sizeof child->name, "%.30s/child", c->name);
    status = mc__nccl_attach(child, st->device);
    if (status != MC_OK) {
        mc_comm_destroy(child);   // still a plain MPI communicator
        return status;
    }
    *out = child;
    return MC_OK;
}

/* --- destroy --------------------------------------------------------------------------------
   Releases the NCCL side and hands the communicator back to the MPI backend it was built on;
   mc_comm_destroy then frees the MPI communicator, world_ranks and the struct. */
static void mc__nccl_destroy(mc_comm *c) {
    if (c == NULL || c->impl == NULL) return;
    mc__nccl_state *st = mc__nccl_get(c);
    mc__nccl_close(c, st);
    if (c->owns_mem) {   // the world's own CUDA table (mc__nccl_init_world)
        mc_ops *mem = (mc_ops *)(uintptr_t)c->mem;
        mc_ops_cuda_destroy(mem);
        mc_free(mem);
        c->mem = mc_ops_cpu();
        c->owns_mem = 0;
    }
    c->ops = st->mpi_ops;
    c->impl = st->mpi_impl;
    c->backend = MC_BACKEND_MPI;
    mc_free(st);
    if (c->ops != NULL && c->ops->destroy != NULL) c->ops->destroy(c);
}

/* The timeline's markers on the communicator's stream (see mc__mark_clock). */
static int mc__nccl_mark_record(mc_comm *c, void **mark) {
    int rc = mc__nccl_use_device(c);
    return rc != MC_OK ? rc : mc__mark_record(&mc__nccl_get(c)->marks, mc__nccl_get(c)->stream, mark);
}
static int mc__nccl_mark_time(mc_comm *c, void *mark, double *t) {
    int rc = mc__nccl_use_device(c);
    return rc != MC_OK ? rc : mc__mark_time(&mc__nccl_get(c)->marks, mark, t);
}
static void mc__nccl_mark_release(mc_comm *c, void *mark) {
    if (mc__nccl_use_device(c) == MC_OK && mark != NULL) cudaEventDestroy((cudaEvent_t)mark);
    (void)cudaGetLastError();
}

/* --- the table and the entry points -------------------------------------------------------- */

static const mc_comm_ops mc__nccl_table = {
    /* name            */ "nccl",
    /* all_reduce      */ mc__nccl_all_reduce,
    /* all_gather      */ mc__nccl_all_gather,
    /* reduce_scatter  */ mc__nccl_reduce_scatter,
    /* broadcast       */ mc__nccl_broadcast,
    /* send            */ mc__nccl_send,
    /* recv            */ mc__nccl_recv,
    /* batch_send_recv */ mc__nccl_batch_send_recv,
    /* barrier         */ mc__nccl_barrier,
    /* wait            */ mc__nccl_op_wait,
    /* test            */ mc__nccl_op_test,
    /* create_child    */ mc__nccl_create_child,
    /* destroy         */ mc__nccl_destroy,
    /* mark_record     */ mc__nccl_mark_record,
    /* mark_time       */ mc__nccl_mark_time,
    /* mark_release    */ mc__nccl_mark_release,
};

extern "C" const mc_comm_ops *mc__nccl_ops(void) {
    return &mc__nccl_table;
}

/* Only asks the runtime for the device count; with no driver or no device the call fails
   quietly and the answer is 0. */
extern "C" int mc__nccl_available(int local_rank, int local_size) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return local_size >= 1 && local_rank >= 0 && local_rank < local_size && count >= local_size;
}

/* The rank's index among the ranks of its node: its GPU. */
static int mc__nccl_local_rank(mc_comm *c, int *local_rank, int *local_size) {
    MPI_Comm node;
    int mrc = MPI_Comm_split_type(mc__nccl_mpi(c), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                                  &node);
    if (mrc != MPI_SUCCESS) return mc__nccl_fail_mpi(mrc, "MPI_Comm_split_type", c->name);
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    return MC_OK;
}

/* `world` is an MPI communicator (its ops are still the MPI backend's; the generic layer may
   already have set backend to MC_BACKEND_NCCL). On failure it is left an MPI communicator. */
/* The world's memory owner: the caller's CUDA table (on this rank's GPU), or a new one. */
static int mc__nccl_take_memory(mc_comm *world, const mc_ops *memory, int device) {
    if (memory != NULL) {
        if (memory->device != MC_DEVICE_CUDA || mc__cuda_device_of(memory) != device)
            return mc__nccl_fail(MC_ERR_INVALID_DESC, "mc_comm_desc.memory: the nccl world "
                                 "needs a CUDA table on this rank's GPU %d, got '%s' (device %d)",
                                 device, memory->name ? memory->name : "?",
                                 mc__cuda_device_of(memory));
        world->mem = memory;
        return MC_OK;
    }
    mc_ops *own = (mc_ops *)mc_calloc(1, sizeof *own);
    if (own == NULL) return mc__nccl_fail(MC_ERR_NO_MEMORY, "nccl world: out of memory");
    mc_cuda_desc d;
    memset(&d, 0, sizeof d);
    d.device = device;
    int status = mc_ops_cuda_init(own, &d);
    if (status != MC_OK) {
        mc_free(own);
        return status;
    }
    world->mem = own;
    world->owns_mem = 1;
    return MC_OK;
}

extern "C" int mc__nccl_init_world(mc_comm *world, const mc_ops *memory) {
    if (world == NULL || world->mpi == NULL || world->ops == NULL ||
        world->ops == mc__nccl_ops())
        return mc__nccl_fail(MC_ERR_INVALID_ARG, "mc__nccl_init_world: needs a world "
                             "communicator filled by the MPI backend (got %s)",
                             world == NULL ? "NULL"
                             : world->mpi == NULL ? "one without an MPI communicator"
                             : world->ops == NULL ? "one without ops"
                             : "one that already is nccl");
    int local_rank = 0, local_size = 1;
    int status = mc__nccl_local_rank(world, &local_rank, &local_size);
    if (status == MC_OK && !mc__nccl_available(local_rank, local_size)) {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
        (void)cudaGetLastError();
        status = mc__nccl_fail(MC_ERR_CUDA, "nccl needs one GPU per rank: rank %d is local rank "
                               "%d of %d on its node, which has %d CUDA device(s)",
                               world->rank, local_rank, local_size, count);
    }
    if (status == MC_OK) status = mc__nccl_take_memory(world, memory, local_rank);
    status = mc__nccl_agree(world, status, "selecting the GPUs and their op tables");
    if (status == MC_OK) status = mc__nccl_attach(world, local_rank);
    if (status != MC_OK && world->owns_mem) {   // left an MPI world with host memory
        mc_ops *mem = (mc_ops *)(uintptr_t)world->mem;
        mc_ops_cuda_destroy(mem);
        mc_free(mem);
        world->mem = mc_ops_cpu();
        world->owns_mem = 0;
    } else if (status != MC_OK) {
        world->mem = mc_ops_cpu();
    }
    return status;
}

// ---------------------------------------------------------------------------------------------
// Backend facts for mc_backend_query: the CUDA fields. Nothing here creates a context; a
// machine without a GPU (or without a driver) reports gpu_count 0 and empty versions.

static void mc__cuda_version_text(int v, char *out, size_t cap) {
    if (v > 0) snprintf(out, cap, "%d.%d", v / 1000, (v % 1000) / 10);
}

extern "C" void mc__cuda_backend_info(mc_backend_info *out) {
    int count = 0, device = 0, runtime = 0, driver = 0, nccl = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    out->gpu_count = count;
    if (count > 0 && cudaGetDevice(&device) == cudaSuccess) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
            snprintf(out->gpu_name, sizeof out->gpu_name, "%s", prop.name);
    }
    if (cudaRuntimeGetVersion(&runtime) == cudaSuccess)
        mc__cuda_version_text(runtime, out->cuda_runtime, sizeof out->cuda_runtime);
    if (cudaDriverGetVersion(&driver) == cudaSuccess)
        mc__cuda_version_text(driver, out->cuda_driver, sizeof out->cuda_driver);
    if (ncclGetVersion(&nccl) == ncclSuccess && nccl > 0)
        snprintf(out->nccl_version, sizeof out->nccl_version, "%d.%d.%d", nccl / 10000,
                 (nccl % 10000) / 100, nccl % 100);
    (void)cudaGetLastError();   // a failed query must not leave an error for the next check
}
