/* tests/mpi_cases/nccl_cases.c - the nccl communicator on real GPUs, one rank per GPU.

       make cuda && mpirun -np 2 ./build/tests/nccl_cases

   The world is initialised with MC_BACKEND_AUTO and must come out as nccl. Every case runs on
   every rank with device buffers (mc_comm_alloc / upload / download) and passes only when it
   passed on all ranks. Failures are printed by the rank that saw them; rank 0 prints the
   last line, exactly "N passed, N failed", and the exit status is 1 when a case failed.

   With 2 or more ranks it runs 14 cases (12 with one rank: no ring, no timeout case).
   Built without MC_ENABLE_CUDA, or run where no GPU is visible, it prints
   "skipped: no CUDA devices" and exits 0 (with fewer GPUs than ranks on a node it prints a
   "skipped:" line naming both counts). */
#include <mpi.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megatron_c.h"

#if defined(MC_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#endif

static int g_rank, g_size;

#if defined(MC_ENABLE_CUDA)   /* everything up to main runs only in a CUDA build */

static int g_passed, g_failed;
static int g_case_ok;            /* this rank's verdict on the running case */
static const char *g_case_name;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void note_failure(int line, const char *fmt, ...) {
    char message[768];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    printf("FAIL rank %d: %s (line %d): %s\n", g_rank, g_case_name, line, message);
    fflush(stdout);
    g_case_ok = 0;
}

#define EXPECT(cond, ...)                                   \
    do {                                                    \
        if (!(cond)) note_failure(__LINE__, __VA_ARGS__);   \
    } while (0)

/* Evaluates an mc_* call; on an error records it with the library's message and returns
   from the case function (every case returns void). */
#define CHECK_MC(expr)                                                                      \
    do {                                                                                    \
        int check_rc_ = (expr);                                                             \
        if (check_rc_ != MC_OK) {                                                           \
            note_failure(__LINE__, "%s -> %s: %s", #expr, mc_err_name(check_rc_),           \
                         mc_last_error());                                                  \
            return;                                                                         \
        }                                                                                   \
    } while (0)

/* Runs one case on every rank; the verdict is agreed over MPI so all ranks count alike. */
static void run_case(const char *name, void (*fn)(mc_comm *), mc_comm *world) {
    g_case_name = name;
    g_case_ok = 1;
    fn(world);
    int all_ok = 0;
    MPI_Allreduce(&g_case_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all_ok) {
        g_passed++;
    } else {
        g_failed++;
        if (g_rank == 0) printf("case failed: %s\n", name);
    }
    fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------
   typed host buffers: values are written and read as doubles, whatever the element type */

static uint16_t bf16_from_float(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u);   /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

static float float_from_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void put_value(mc_dtype dt, void *buf, size_t i, double v) {
    switch (dt) {
    case MC_F32: ((float *)buf)[i] = (float)v; break;
    case MC_F64: ((double *)buf)[i] = v; break;
    case MC_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case MC_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case MC_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case MC_BF16: ((uint16_t *)buf)[i] = bf16_from_float((float)v); break;
    default: break;
    }
}

static double get_value(mc_dtype dt, const void *buf, size_t i) {
    switch (dt) {
    case MC_F32: return ((const float *)buf)[i];
    case MC_F64: return ((const double *)buf)[i];
    case MC_I32: return ((const int32_t *)buf)[i];
    case MC_I64: return (double)((const int64_t *)buf)[i];
    case MC_U8: return ((const uint8_t *)buf)[i];
    case MC_BF16: return float_from_bf16(((const uint16_t *)buf)[i]);
    default: return 0.0;
    }
}

static const char *dtype_name(mc_dtype dt) {
    static const char *names[] = {"f32", "f64", "i32", "i64", "u8", "bf16"};
    return (int)dt >= 0 && dt < MC_DTYPE_COUNT ? names[dt] : "?";
}

/* A device buffer of n elements holding value(rank, i), and its host twin for read-back. */
typedef struct dev_buf {
    mc_comm *comm;
    mc_dtype dt;
    size_t n;
    void *dev;
    void *host;
} dev_buf;

static int dev_buf_init(dev_buf *b, mc_comm *c, mc_dtype dt, size_t n) {
    memset(b, 0, sizeof *b);
    b->comm = c;
    b->dt = dt;
    b->n = n;
    b->host = calloc(n > 0 ? n : 1, mc_dtype_size(dt));
    b->dev = mc_comm_alloc(c, n * mc_dtype_size(dt));
    return b->host != NULL && b->dev != NULL ? MC_OK : MC_ERR_NO_MEMORY;
}

static void dev_buf_free(dev_buf *b) {
    if (b->dev != NULL) mc_comm_free(b->comm, b->dev);
    free(b->host);
    memset(b, 0, sizeof *b);
}

static int dev_buf_fill(dev_buf *b, double (*value)(int rank, size_t i), int rank) {
    for (size_t i = 0; i < b->n; i++) put_value(b->dt, b->host, i, value(rank, i));
    return mc_comm_upload(b->comm, b->dev, b->host, b->n * mc_dtype_size(b->dt));
}

static int dev_buf_read(dev_buf *b) {
    memset(b->host, 0, b->n * mc_dtype_size(b->dt));
    return mc_comm_download(b->comm, b->host, b->dev, b->n * mc_dtype_size(b->dt));
}

/* Compares the read-back buffer with want(i); reports the first mismatch only. */
static void expect_values(int line, const dev_buf *b, double (*want)(size_t i), const char *what) {
    for (size_t i = 0; i < b->n; i++) {
        double got = get_value(b->dt, b->host, i), expected = want(i);
        if (got != expected) {
            note_failure(line, "%s (%s): element %zu is %.9g, expected %.9g", what,
                         dtype_name(b->dt), i, got, expected);
            return;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
   the cases. Values are small integers, exact in every dtype (bf16 included), and chosen so
   that the average over the ranks is an integer too: value(r, i) = i + P * r. */

static double v_ring(int rank, size_t i) { return (double)i + (double)g_size * rank; }
static double want_sum(size_t i) { return g_size * (double)i + (double)g_size * g_size * (g_size - 1) / 2.0; }
static double want_max(size_t i) { return (double)i + (double)g_size * (g_size - 1); }
static double want_min(size_t i) { return (double)i; }
static double want_avg(size_t i) { return (double)i + (double)g_size * (g_size - 1) / 2.0; }

static void case_backend_is_nccl(mc_comm *world) {
    int mpi_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    EXPECT(world->backend == MC_BACKEND_NCCL, "MC_BACKEND_AUTO chose '%s', expected nccl",
           mc_backend_name(world->backend));
    EXPECT(world->ops != NULL && strcmp(world->ops->name, "nccl") == 0, "ops table is '%s'",
           world->ops != NULL ? world->ops->name : "(null)");
    EXPECT(world->size == mpi_size && world->rank == g_rank, "world is rank %d of %d, MPI says "
           "%d of %d", world->rank, world->size, g_rank, mpi_size);
    EXPECT(world->mpi != NULL, "the nccl world lost its MPI communicator");
}

/* All four reductions over every dtype: 24 checks, reported per (op, dtype) on failure. */
static void case_all_reduce_ops_dtypes(mc_comm *world) {
    static const mc_reduce_op ops[] = {MC_SUM, MC_MAX, MC_MIN, MC_AVG};
    static const char *op_names[] = {"sum", "max", "min", "avg"};
    double (*wants[])(size_t) = {want_sum, want_max, want_min, want_avg};
    const size_t n = 5;
    for (int o = 0; o < 4; o++) {
        for (int d = 0; d < MC_DTYPE_COUNT; d++) {
            dev_buf send, recv;
            char what[64];
            snprintf(what, sizeof what, "all_reduce %s", op_names[o]);
            CHECK_MC(dev_buf_init(&send, world, (mc_dtype)d, n));
            CHECK_MC(dev_buf_init(&recv, world, (mc_dtype)d, n));
            CHECK_MC(dev_buf_fill(&send, v_ring, g_rank));
            CHECK_MC(mc_all_reduce(world, send.dev, recv.dev, n, (mc_dtype)d, ops[o]));
            CHECK_MC(dev_buf_read(&recv));
            expect_values(__LINE__, &recv, wants[o], what);
            dev_buf_free(&send);
            dev_buf_free(&recv);
        }
    }
}

static void case_all_reduce_in_place_large(mc_comm *world) {
    const size_t n = (size_t)1 << 22;   /* 16 MiB of f32: past NCCL's small-message paths */
    dev_buf b;
    CHECK_MC(dev_buf_init(&b, world, MC_F32, n));
    for (size_t i = 0; i < n; i++) ((float *)b.host)[i] = (float)(g_rank + 1) * (float)(i % 7);
    CHECK_MC(mc_comm_upload(world, b.dev, b.host, n * sizeof(float)));
    CHECK_MC(mc_all_reduce(world, b.dev, b.dev, n, MC_F32, MC_SUM));
    CHECK_MC(dev_buf_read(&b));
    float ranks_sum = (float)g_size * (g_size + 1) / 2.0f;
    for (size_t i = 0; i < n; i++) {
        float want = ranks_sum * (float)(i % 7);
        if (((float *)b.host)[i] != want) {
            note_failure(__LINE__, "in-place all_reduce: element %zu is %g, expected %g", i,
                         ((float *)b.host)[i], want);
            break;
        }
    }
    dev_buf_free(&b);
}

static double v_gather(int rank, size_t i) { return 10.0 * rank + (double)i; }
static double want_gather(size_t j) { return 10.0 * (double)(j / 3) + (double)(j % 3); }

static void case_all_gather(mc_comm *world) {
    static const mc_dtype dts[] = {MC_I32, MC_BF16, MC_F64};
    for (int d = 0; d < 3; d++) {
        dev_buf send, recv;
        CHECK_MC(dev_buf_init(&send, world, dts[d], 3));
        CHECK_MC(dev_buf_init(&recv, world, dts[d], 3 * (size_t)g_size));
        CHECK_MC(dev_buf_fill(&send, v_gather, g_rank));
        CHECK_MC(mc_all_gather(world, send.dev, recv.dev, 3, dts[d]));
        CHECK_MC(dev_buf_read(&recv));
        expect_values(__LINE__, &recv, want_gather, "all_gather");
        dev_buf_free(&send);
        dev_buf_free(&recv);
    }
}

/* send[j] = rank + j on every rank; rank r receives chunk r (4 elements), summed or maxed. */
enum { RS_CHUNK = 4 };
static double v_rs(int rank, size_t j) { return (double)rank + (double)j; }
static double want_rs_sum(size_t i) {
    double j = (double)g_rank * RS_CHUNK + (double)i;
    return (double)g_size * (g_size - 1) / 2.0 + g_size * j;
}
static double want_rs_max(size_t i) { return (double)(g_size - 1) + g_rank * RS_CHUNK + (double)i; }

static void case_reduce_scatter(mc_comm *world) {
    static const mc_dtype dts[] = {MC_F32, MC_I64};
    static const mc_reduce_op ops[] = {MC_SUM, MC_MAX};
    double (*wants[])(size_t) = {want_rs_sum, want_rs_max};
    for (int k = 0; k < 2; k++) {
        dev_buf send, recv;
        CHECK_MC(dev_buf_init(&send, world, dts[k], RS_CHUNK * (size_t)g_size));
        CHECK_MC(dev_buf_init(&recv, world, dts[k], RS_CHUNK));
        CHECK_MC(dev_buf_fill(&send, v_rs, g_rank));
        CHECK_MC(mc_reduce_scatter(world, send.dev, recv.dev, RS_CHUNK, dts[k], ops[k]));
        CHECK_MC(dev_buf_read(&recv));
        expect_values(__LINE__, &recv, wants[k], k == 0 ? "reduce_scatter sum"
                                                        : "reduce_scatter max");
        dev_buf_free(&send);
        dev_buf_free(&recv);
    }
}

static double v_bcast(int rank, size_t i) { return rank == g_size - 1 ? 7.0 + (double)i : -1.0; }
static double want_bcast(size_t i) { return 7.0 + (double)i; }

static void case_broadcast(mc_comm *world) {
    dev_buf b;
    CHECK_MC(dev_buf_init(&b, world, MC_F64, 9));
    CHECK_MC(dev_buf_fill(&b, v_bcast, g_rank));
    CHECK_MC(mc_broadcast(world, b.dev, 9, MC_F64, g_size - 1));
    CHECK_MC(dev_buf_read(&b));
    expect_values(__LINE__, &b, want_bcast, "broadcast from the last rank");
    dev_buf_free(&b);
}

/* Ring with blocking send/recv: even ranks send first, odd ranks receive first, so every
   send meets a posted receive (NCCL sends are rendezvous). */
static int g_ring_from;
static double v_p2p(int rank, size_t i) { return 1000.0 * rank + (double)i; }
static double want_p2p(size_t i) { return 1000.0 * g_ring_from + (double)i; }

static void case_send_recv_ring(mc_comm *world) {
    const size_t n = 1000;
    int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    dev_buf out, in;
    CHECK_MC(dev_buf_init(&out, world, MC_F32, n));
    CHECK_MC(dev_buf_init(&in, world, MC_F32, n));
    CHECK_MC(dev_buf_fill(&out, v_p2p, g_rank));
    if (g_rank % 2 == 0) {
        CHECK_MC(mc_send(world, out.dev, n, MC_F32, next, 0));
        CHECK_MC(mc_recv(world, in.dev, n, MC_F32, prev, 0));
    } else {
        CHECK_MC(mc_recv(world, in.dev, n, MC_F32, prev, 0));
        CHECK_MC(mc_send(world, out.dev, n, MC_F32, next, 0));
    }
    CHECK_MC(dev_buf_read(&in));
    g_ring_from = prev;
    expect_values(__LINE__, &in, want_p2p, "ring send/recv");
    dev_buf_free(&out);
    dev_buf_free(&in);
}

/* Both directions of the ring in one batch: every rank sends first, which only works because
   the batch is one NCCL group. */
static void case_batch_both_directions(mc_comm *world) {
    const size_t n = 257;
    int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    dev_buf out, from_prev, from_next;
    CHECK_MC(dev_buf_init(&out, world, MC_I32, n));
    CHECK_MC(dev_buf_init(&from_prev, world, MC_I32, n));
    CHECK_MC(dev_buf_init(&from_next, world, MC_I32, n));
    CHECK_MC(dev_buf_fill(&out, v_p2p, g_rank));
    /* One tag for all four: with 2 ranks next == prev, and NCCL (which has no tags) refuses
       two messages to one peer that only a tag would tell apart (see case_batch_ambiguous). */
    mc_p2p_op ops[4] = {
        {.is_send = 1, .buf = out.dev, .count = n, .dtype = MC_I32, .peer = next, .tag = 1},
        {.is_send = 1, .buf = out.dev, .count = n, .dtype = MC_I32, .peer = prev, .tag = 1},
        {.is_send = 0, .buf = from_prev.dev, .count = n, .dtype = MC_I32, .peer = prev, .tag = 1},
        {.is_send = 0, .buf = from_next.dev, .count = n, .dtype = MC_I32, .peer = next, .tag = 1},
    };
    CHECK_MC(mc_batch_send_recv(world, ops, 4));
    CHECK_MC(dev_buf_read(&from_prev));
    CHECK_MC(dev_buf_read(&from_next));
    g_ring_from = prev;
    expect_values(__LINE__, &from_prev, want_p2p, "batch: from the previous rank");
    g_ring_from = next;
    expect_values(__LINE__, &from_next, want_p2p, "batch: from the next rank");
    dev_buf_free(&out);
    dev_buf_free(&from_prev);
    dev_buf_free(&from_next);
}

/* Two sends to the same peer with different tags (a 2-stage pipeline sending an activation and
   a gradient to its only neighbour): NCCL cannot keep them apart, so the batch is refused with
   MC_ERR_UNSUPPORTED before anything is posted - and the communicator stays usable. */
static void case_batch_ambiguous(mc_comm *world) {
    const size_t n = 8;
    int peer = (g_rank + 1) % g_size;
    dev_buf a, b, r1, r2;
    CHECK_MC(dev_buf_init(&a, world, MC_I32, n));
    CHECK_MC(dev_buf_init(&b, world, MC_I32, n));
    CHECK_MC(dev_buf_init(&r1, world, MC_I32, n));
    CHECK_MC(dev_buf_init(&r2, world, MC_I32, n));
    mc_p2p_op ops[4] = {
        {.is_send = 1, .buf = a.dev, .count = n, .dtype = MC_I32, .peer = peer, .tag = 1001},
        {.is_send = 0, .buf = r1.dev, .count = n, .dtype = MC_I32, .peer = peer, .tag = 1001},
        {.is_send = 1, .buf = b.dev, .count = n, .dtype = MC_I32, .peer = peer, .tag = 1002},
        {.is_send = 0, .buf = r2.dev, .count = n, .dtype = MC_I32, .peer = peer, .tag = 1002},
    };
    int rc = mc_batch_send_recv(world, ops, 4);
    EXPECT(rc == MC_ERR_UNSUPPORTED, "ambiguous batch: got %s, want MC_ERR_UNSUPPORTED (%s)",
           mc_err_name(rc), mc_last_error());
    EXPECT(strstr(mc_last_error(), "no tags") != NULL, "message: %s", mc_last_error());
    CHECK_MC(mc_barrier(world));   /* still usable */
    dev_buf_free(&a);
    dev_buf_free(&b);
    dev_buf_free(&r1);
    dev_buf_free(&r2);
}

/* Three operations in flight at once: one polled with mc_test until done (which frees it),
   the others waited for; and a download issued before any wait, which the communicator's
   stream orders after the collective. */
static void case_async_wait(mc_comm *world) {
    const size_t n = 5;
    dev_buf a_send, a_recv, g_send, g_recv;
    CHECK_MC(dev_buf_init(&a_send, world, MC_F32, n));
    CHECK_MC(dev_buf_init(&a_recv, world, MC_F32, n));
    CHECK_MC(dev_buf_init(&g_send, world, MC_I32, 3));
    CHECK_MC(dev_buf_init(&g_recv, world, MC_I32, 3 * (size_t)g_size));
    CHECK_MC(dev_buf_fill(&a_send, v_ring, g_rank));
    CHECK_MC(dev_buf_fill(&g_send, v_gather, g_rank));
    mc_request *reqs[3] = {NULL, NULL, NULL};
    CHECK_MC(mc_all_reduce_async(world, a_send.dev, a_recv.dev, n, MC_F32, MC_MAX, &reqs[0]));
    CHECK_MC(mc_all_gather_async(world, g_send.dev, g_recv.dev, 3, MC_I32, &reqs[1]));
    CHECK_MC(mc_barrier_async(world, &reqs[2]));
    EXPECT(reqs[0] != NULL && reqs[1] != NULL && reqs[2] != NULL, "an async call gave no request");
    CHECK_MC(dev_buf_read(&a_recv));   /* ordered after the all_reduce on the comm's stream */
    expect_values(__LINE__, &a_recv, want_max, "download after async all_reduce, before wait");
    double deadline = now_s() + 20.0;
    int done = 0;
    while (!done && now_s() < deadline) CHECK_MC(mc_test(reqs[1], &done));
    EXPECT(done, "mc_test never reported the async all_gather done");
    if (done) reqs[1] = NULL;   /* done = 1: finished and freed */
    for (int i = 0; i < 3; i++)
        if (reqs[i] != NULL) CHECK_MC(mc_wait(reqs[i]));
    CHECK_MC(dev_buf_read(&g_recv));
    expect_values(__LINE__, &g_recv, want_gather, "async all_gather");
    dev_buf_free(&a_send);
    dev_buf_free(&a_recv);
    dev_buf_free(&g_send);
    dev_buf_free(&g_recv);
}

static void case_barrier(mc_comm *world) {
    CHECK_MC(mc_barrier(world));
    CHECK_MC(mc_barrier(world));
}

/* Arguments the backend must refuse before anything is queued (no rank communicates). */
static void case_invalid_arguments(mc_comm *world) {
    dev_buf b;
    CHECK_MC(dev_buf_init(&b, world, MC_F32, 4));
    int rc = mc_all_reduce(world, b.dev, b.dev, 4, (mc_dtype)99, MC_SUM);
    EXPECT(rc == MC_ERR_INVALID_ARG, "dtype 99 gave %s, expected MC_ERR_INVALID_ARG",
           mc_err_name(rc));
    rc = mc_all_reduce(world, b.dev, b.dev, 4, MC_F32, (mc_reduce_op)42);
    EXPECT(rc == MC_ERR_INVALID_ARG, "reduce op 42 gave %s", mc_err_name(rc));
    rc = mc_broadcast(world, b.dev, 4, MC_F32, g_size);
    EXPECT(rc == MC_ERR_INVALID_ARG, "broadcast root %d gave %s", g_size, mc_err_name(rc));
    rc = mc_send(world, b.dev, 4, MC_F32, -1, 0);
    EXPECT(rc == MC_ERR_INVALID_ARG, "send to peer -1 gave %s", mc_err_name(rc));
    EXPECT(mc_last_error()[0] != '\0', "no message in mc_last_error() after an invalid argument");
    /* A host buffer would be an illegal access on the GPU: refused with a message instead. */
    float host[4] = {0, 0, 0, 0};
    rc = mc_all_reduce(world, host, host, 4, MC_F32, MC_SUM);
    EXPECT(rc == MC_ERR_INVALID_ARG, "host buffer gave %s", mc_err_name(rc));
    EXPECT(strstr(mc_last_error(), "host memory") != NULL, "message: %s", mc_last_error());
    dev_buf_free(&b);
    CHECK_MC(mc_barrier(world));   /* the communicator is still usable */
}

/* Sum over the members of a group of (world rank + 1). */
static void expect_group_sum(int line, mc_comm *g, const int *members, int n) {
    dev_buf b;
    int rc = dev_buf_init(&b, g, MC_I64, 1);
    if (rc == MC_OK) {
        put_value(MC_I64, b.host, 0, (double)(g_rank + 1));
        rc = mc_comm_upload(g, b.dev, b.host, sizeof(int64_t));
    }
    if (rc == MC_OK) rc = mc_all_reduce(g, b.dev, b.dev, 1, MC_I64, MC_SUM);
    if (rc == MC_OK) rc = dev_buf_read(&b);
    if (rc != MC_OK) {
        note_failure(line, "all_reduce on group '%s': %s: %s", g->name, mc_err_name(rc),
                     mc_last_error());
    } else {
        int64_t want = 0;
        for (int i = 0; i < n; i++) want += members[i] + 1;
        EXPECT(((int64_t *)b.host)[0] == want, "group '%s' sum is %lld, expected %lld",
               g->name, (long long)((int64_t *)b.host)[0], (long long)want);
    }
    dev_buf_free(&b);
}

static void expect_group_shape(int line, mc_comm *g, const int *members, int n) {
    int me = -1;
    for (int i = 0; i < n; i++)
        if (members[i] == g_rank) me = i;
    if (g == NULL) {
        if (me >= 0) note_failure(line, "member rank %d got no communicator", g_rank);
        return;
    }
    if (me < 0) {
        note_failure(line, "non-member rank %d got communicator '%s'", g_rank, g->name);
        return;
    }
    if (g->backend != MC_BACKEND_NCCL || g->size != n || g->rank != me) {
        note_failure(line, "group '%s' is %s rank %d of %d, expected nccl rank %d of %d",
                     g->name, mc_backend_name(g->backend), g->rank, g->size, me, n);
        return;
    }
    for (int i = 0; i < n; i++)
        EXPECT(g->world_ranks[i] == members[i], "group '%s' world_ranks[%d] = %d, expected %d",
               g->name, i, g->world_ranks[i], members[i]);
    expect_group_sum(line, g, members, n);
}

/* Collective creation: the whole world, then one singleton per rank (every rank calls every
   creation; non-members get NULL), then a child of the whole-world group. */
static void case_create_group_collective(mc_comm *world) {
    int all[64] = {0};
    int n = g_size < 64 ? g_size : 64;
    for (int i = 0; i < n; i++) all[i] = i;
    mc_comm *whole = NULL;
    CHECK_MC(mc_comm_create_group(world, all, n, &whole));
    expect_group_shape(__LINE__, whole, all, n);
    for (int r = 0; r < n; r++) {
        mc_comm *single = NULL;
        CHECK_MC(mc_comm_create_group(world, &r, 1, &single));
        expect_group_shape(__LINE__, single, &r, 1);
        if (single != NULL) mc_comm_destroy(single);
    }
    if (whole != NULL && n >= 2) {
        int pair[2] = {0, n - 1};   /* ranks of `whole`, which equal world ranks here */
        mc_comm *child = NULL;
        CHECK_MC(mc_comm_create_group(whole, pair, 2, &child));
        expect_group_shape(__LINE__, child, pair, 2);
        if (child != NULL) mc_comm_destroy(child);
    }
    if (whole != NULL) mc_comm_destroy(whole);
}

/* Member-local creation: only the members call, with a tag they agree on. */
static void case_create_group_local(mc_comm *world) {
    int pair[2] = {0, g_size - 1};
    int n_pair = g_size >= 2 ? 2 : 1;   /* the first and the last rank */
    mc_comm *g = NULL;
    if (g_rank == pair[0] || g_rank == pair[n_pair - 1]) {
        CHECK_MC(mc_comm_create_group_local(world, pair, n_pair, 7, &g));
        expect_group_shape(__LINE__, g, pair, n_pair);
    }
    if (g != NULL) mc_comm_destroy(g);
    /* every rank alone, concurrently, each under its own tag */
    int me = g_rank;
    mc_comm *single = NULL;
    CHECK_MC(mc_comm_create_group_local(world, &me, 1, 100 + g_rank, &single));
    expect_group_shape(__LINE__, single, &me, 1);
    if (single != NULL) mc_comm_destroy(single);
}

/* Rank 0 starts an all_reduce on a fresh group that no other rank joins: it must come back
   with MC_ERR_TIMEOUT near the group's timeout, leave the group aborted (later calls fail),
   and leave the world working. */
static void case_timeout(mc_comm *world) {
    int all[64] = {0};
    int n = g_size < 64 ? g_size : 64;
    for (int i = 0; i < n; i++) all[i] = i;
    mc_comm *victim = NULL;
    CHECK_MC(mc_comm_create_group(world, all, n, &victim));
    if (victim == NULL) {
        note_failure(__LINE__, "no communicator for the timeout group");
        return;
    }
    const double timeout = 2.0;
    victim->timeout_s = timeout;
    dev_buf b;
    CHECK_MC(dev_buf_init(&b, world, MC_F32, 16));
    if (g_rank == 0) {
        double t0 = now_s();
        int rc = mc_all_reduce(victim, b.dev, b.dev, 16, MC_F32, MC_SUM);
        double took = now_s() - t0;
        EXPECT(rc == MC_ERR_TIMEOUT, "all_reduce without peers gave %s, expected "
               "MC_ERR_TIMEOUT", mc_err_name(rc));
        EXPECT(took >= timeout * 0.9 && took < timeout + 15.0, "timed out after %.2f s, the "
               "timeout is %.1f s", took, timeout);
        EXPECT(strstr(mc_last_error(), victim->name) != NULL, "mc_last_error() does not name "
               "the communicator '%s' after the timeout: \"%s\"", victim->name, mc_last_error());
        rc = mc_all_reduce(victim, b.dev, b.dev, 16, MC_F32, MC_SUM);
        EXPECT(rc != MC_OK, "an aborted communicator accepted another all_reduce");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    mc_comm_destroy(victim);
    dev_buf_free(&b);
    dev_buf s;
    CHECK_MC(dev_buf_init(&s, world, MC_F32, 5));
    CHECK_MC(dev_buf_fill(&s, v_ring, g_rank));
    CHECK_MC(mc_all_reduce(world, s.dev, s.dev, 5, MC_F32, MC_SUM));
    CHECK_MC(dev_buf_read(&s));
    expect_values(__LINE__, &s, want_sum, "world all_reduce after the timeout");
    dev_buf_free(&s);
}

static int cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    return count;
}

static int local_size(void) {
    MPI_Comm node;
    int size = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &size);
    MPI_Comm_free(&node);
    return size;
}

#endif /* MC_ENABLE_CUDA */

/* ---------------------------------------------------------------------------------------------
   main */

static int skip(const char *why) {
    if (g_rank == 0) printf("skipped: %s\n", why);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
#if !defined(MC_ENABLE_CUDA)
    return skip("no CUDA devices");
#else
    int devices = cuda_device_count(), per_node = local_size();
    int fewest = devices;
    MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (fewest == 0) return skip("no CUDA devices");
    if (fewest < per_node) {
        char why[128];
        snprintf(why, sizeof why, "%d CUDA devices for %d ranks on a node", fewest, per_node);
        return skip(why);
    }

    mc_comm *world = NULL;
    int rc = mc_comm_init_world(&world, &(mc_comm_desc){.backend = MC_BACKEND_AUTO,
                                                        .timeout_s = 30.0});
    if (rc != MC_OK) {
        printf("rank %d: mc_comm_init_world: %s: %s\n", g_rank, mc_err_name(rc), mc_last_error());
        if (g_rank == 0) printf("0 passed, 1 failed\n");
        MPI_Finalize();
        return 1;
    }
    run_case("backend is nccl", case_backend_is_nccl, world);
    if (world->backend == MC_BACKEND_NCCL) {
        run_case("all_reduce sum/max/min/avg x 6 dtypes", case_all_reduce_ops_dtypes, world);
        run_case("all_reduce in place, 16 MiB", case_all_reduce_in_place_large, world);
        run_case("all_gather", case_all_gather, world);
        run_case("reduce_scatter", case_reduce_scatter, world);
        run_case("broadcast", case_broadcast, world);
        /* A blocking send to itself is invalid in NCCL, and a one-rank group cannot miss a
           peer: these two need a second rank. */
        if (g_size >= 2) run_case("send/recv ring", case_send_recv_ring, world);
        run_case("batch_send_recv both directions", case_batch_both_directions, world);
        run_case("batch with one peer and two tags refused", case_batch_ambiguous, world);
        run_case("async + test + wait", case_async_wait, world);
        run_case("barrier", case_barrier, world);
        run_case("invalid arguments", case_invalid_arguments, world);
        run_case("collective group creation", case_create_group_collective, world);
        run_case("member-local group creation", case_create_group_local, world);
        if (g_size >= 2) run_case("timeout aborts the communicator", case_timeout, world);
    }
    mc_comm_destroy(world);
    if (g_rank == 0) printf("%d passed, %d failed\n", g_passed, g_failed);
    fflush(stdout);
    MPI_Finalize();
    return g_failed == 0 ? 0 : 1;
#endif
}
