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

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

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

/* The context of one CUDA op table: what mc_ops.ctx points at. */
typedef struct mc__cuda_ctx {
    int device;
    cudaStream_t stream;          // every op runs here, in call order
    int sync_check;               // synchronise and check after every op
    int attention;                // 0 auto, 1 own kernel, 2 cuDNN
    int tf32;                     // fp32 GEMMs may use TF32
    void *workspace;              // cuBLASLt / cuDNN workspace
    size_t workspace_bytes;
    struct mc__cuda_alloc *allocs;   // live allocations (for the peak; a small linear table)
    int n_allocs, cap_allocs;
    size_t live_bytes, peak_bytes;
    char describe[256];
    void *compute;                // the compute half's handles (mc__cuda_compute), or NULL
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
// >>cuda compute (the kernels and library calls behind the numeric ops)

static int mc__cuda_compute_init(mc__cuda_ctx *cx) {
    (void)cx;
    return MC_OK;
}

static void mc__cuda_compute_destroy(mc__cuda_ctx *cx) { (void)cx; }

static const char *mc__cuda_compute_describe(mc__cuda_ctx *cx) {
    (void)cx;
    return "memory only";
}

/* The numeric ops: not in this build yet (the slots stay NULL, which mc_gpt_init refuses). */
static void mc__cuda_fill_compute(mc_ops *t) { (void)t; }

// ---------------------------------------------------------------------------------------------
// >>cuda table: mc_ops_cuda_init / mc_ops_cuda_destroy

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
    cx->workspace_bytes = d->workspace_bytes ? d->workspace_bytes : (size_t)32 << 20;
    MC__CU("init", cudaMalloc(&cx->workspace, cx->workspace_bytes), "workspace %zu bytes",
           cx->workspace_bytes);
    cx->sync_check = d->sync_check || mc__cuda_env_flag("MC_CUDA_SYNC_CHECK");
    cx->tf32 = d->tf32;
    cx->attention = d->attention;
    const char *att = getenv("MC_CUDA_ATTENTION");
    if (att != NULL && strcmp(att, "own") == 0) cx->attention = 1;
    if (att != NULL && strcmp(att, "cudnn") == 0) cx->attention = 2;
    if (cx->attention < 0 || cx->attention > 2)
        return mc__set_error(MC_ERR_INVALID_DESC, "mc_cuda_desc.attention (%d) must be 0 (auto), "
                             "1 (own kernel) or 2 (cuDNN)", cx->attention);
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

extern "C" const char *mc_ops_cuda_describe(const mc_ops *ops) {
    if (ops == NULL || ops->device != MC_DEVICE_CUDA || ops->ctx == NULL) return "";
    mc__cuda_ctx *cx = mc__cuda_get(ops);
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDeviceProperties(&prop, cx->device) != cudaSuccess) (void)cudaGetLastError();
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    snprintf(cx->describe, sizeof cx->describe, "%s, sm_%d%d, %.1f GiB, CUDA runtime %d.%d, %s, "
             "attention %s%s", prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), rt / 1000,
             (rt % 1000) / 10, mc__cuda_compute_describe(cx),
             cx->attention == 0 ? "auto" : cx->attention == 1 ? "own kernel" : "cuDNN",
             cx->sync_check ? ", sync check on" : "");
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
    if (mem == NULL || st->follow == NULL) return MC_OK;
    cudaError_t err = cudaEventRecord(st->follow, mem);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(st->stream, st->follow, 0);
    if (err != cudaSuccess) return mc__nccl_fail_cuda(err, what, c->name);
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
