/* comm_cases - multi-rank checks of megatron_c's communicator layer.

       mpirun -np N build/tests/comm_cases <case> [--backend auto|self|mpi]

   Cases: allreduce allgather reduce_scatter broadcast ring batch async barrier
          create_collective create_local timeout mismatch positional agree
          watchdog_deadlock watchdog_stop watchdog_slow
   Each case counts its checks; a failed check prints a line naming the rank and what went
   wrong, and rank 0 ends with "N passed, N failed". The exit status is 0 iff every rank
   passed. Every case works for 1..8 ranks; those that need a peer print
   "skipped: needs 2 ranks" at np = 1 and exit 0.

   The expected values are closed forms of the rank-dependent inputs, so a check can only
   pass when the data really travelled. Experiments that leave a collective unfinished on
   purpose (timeout, positional) run on a child communicator, which keeps the world usable
   for the final count. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define DEFAULT_TIMEOUT_S 20.0   /* a broken collective fails the case instead of hanging */

static mc_comm *world;
static int me, np;   /* world rank and size */

/* ---------------------------------------------------------------------------------------------
   element access by dtype (values are small integers or halves: exact in every dtype) */

static void elem_set(void *buf, mc_dtype dt, size_t i, double v) {
    switch (dt) {
    case MC_F32: ((float *)buf)[i] = (float)v; break;
    case MC_F64: ((double *)buf)[i] = v; break;
    case MC_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case MC_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
    }
}

static double elem_get(const void *buf, mc_dtype dt, size_t i) {
    switch (dt) {
    case MC_F32: return ((const float *)buf)[i];
    case MC_F64: return ((const double *)buf)[i];
    case MC_I32: return ((const int32_t *)buf)[i];
    case MC_I64: return (double)((const int64_t *)buf)[i];
    default: return 0.0;
    }
}

static int is_float(mc_dtype dt) { return dt == MC_F32 || dt == MC_F64; }

/* Floats may round in the last place (an average computed as a product with 1/size);
   integers must be exact. */
static int value_matches(mc_dtype dt, double got, double want) {
    if (!is_float(dt)) return got == want;
    double tol = (dt == MC_F32 ? 1e-6 : 1e-12) * (fabs(want) + 1.0);
    return fabs(got - want) <= tol;
}

static const char *dtype_name(mc_dtype dt) {
    static const char *names[] = {"f32", "f64", "i32", "i64", "u8", "bf16"};
    return dt < MC_DTYPE_COUNT ? names[dt] : "?";
}

static const char *op_name(mc_reduce_op op) {
    static const char *names[] = {"sum", "max", "min", "avg"};
    return op <= MC_AVG ? names[op] : "?";
}

/* Compares `n` received elements with want(i); reports only the first mismatch. */
static void check_elements(const char *label, const void *got, mc_dtype dt, size_t n,
                           double (*want)(size_t i, const void *ctx), const void *ctx) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        if (!value_matches(dt, elem_get(got, dt, i), want(i, ctx))) {
            if (bad++ == 0) first = i;
        }
    }
    MC_CASE_CHECK(bad == 0, "%s: %zu of %zu elements wrong; first [%zu] = %.17g, want %.17g",
                  label, bad, n, first, bad ? elem_get(got, dt, first) : 0.0,
                  bad ? want(first, ctx) : 0.0);
}

static int *range(int first, int count) {   /* {first, first+1, ...}; caller frees */
    int *r = (int *)malloc(sizeof(int) * (size_t)(count > 0 ? count : 1));
    for (int i = 0; i < count; i++) r[i] = first + i;
    return r;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------------------------------------
   allreduce: rank r contributes v(r, i) = (r + 1) * a(i) + b(i), so with P ranks
     sum = a P (P + 1) / 2 + P b,   max = P a + b,   min = a + b,   avg = a (P + 1) / 2 + b.
   a is even for integer types so the average is exact; i64 adds 2^40 to test all 64 bits. */

typedef struct reduce_ctx {
    mc_dtype dt;
    mc_reduce_op op;
} reduce_ctx;

static double coef_a(mc_dtype dt, size_t i) {
    return (double)(i % 5 + 1) * (is_float(dt) ? 1.0 : 2.0);
}

static double coef_b(mc_dtype dt, size_t i) {
    double b = is_float(dt) ? -0.5 * (double)(i % 7) : -(double)(i % 7);
    return dt == MC_I64 ? b + 1099511627776.0 : b;   /* 2^40 */
}

static double contribution(mc_dtype dt, int rank, size_t i) {
    return (rank + 1) * coef_a(dt, i) + coef_b(dt, i);
}

static double reduced_value(size_t i, const void *vctx) {
    const reduce_ctx *ctx = (const reduce_ctx *)vctx;
    double a = coef_a(ctx->dt, i), b = coef_b(ctx->dt, i), p = np;
    switch (ctx->op) {
    case MC_SUM: return a * p * (p + 1) / 2 + p * b;
    case MC_MAX: return p * a + b;
    case MC_MIN: return a + b;
    case MC_AVG: return a * (p + 1) / 2 + b;
    }
    return 0.0;
}

static void allreduce_one(mc_dtype dt, mc_reduce_op op, size_t n, int in_place) {
    size_t bytes = n * mc_dtype_size(dt);
    void *send = malloc(bytes), *recv = malloc(bytes);
    for (size_t i = 0; i < n; i++) elem_set(send, dt, i, contribution(dt, me, i));
    memset(recv, 0xff, bytes);
    if (in_place) memcpy(recv, send, bytes);
    char label[96];
    snprintf(label, sizeof label, "all_reduce %s %s n=%zu%s", dtype_name(dt), op_name(op), n,
             in_place ? " in place" : "");
    int rc = mc_all_reduce(world, in_place ? recv : send, recv, n, dt, op);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, label)) {
        reduce_ctx ctx = {dt, op};
        check_elements(label, recv, dt, n, reduced_value, &ctx);
    }
    free(send);
    free(recv);
}

static void case_allreduce(void) {
    const mc_dtype types[] = {MC_F32, MC_F64, MC_I32, MC_I64};
    const mc_reduce_op ops[] = {MC_SUM, MC_MAX, MC_MIN, MC_AVG};
    for (int t = 0; t < 4; t++)
        for (int o = 0; o < 4; o++) allreduce_one(types[t], ops[o], 37, 0);
    allreduce_one(MC_I32, MC_SUM, 37, 1);
    allreduce_one(MC_F64, MC_MAX, 11, 1);
    allreduce_one(MC_F32, MC_SUM, (size_t)1 << 18, 0);   /* 1 MiB: more than one eager message */
}

/* ---------------------------------------------------------------------------------------------
   allgather: rank r sends {100 r + i}; the result must be in rank order. */

static double gathered_value(size_t j, const void *vcount) {
    size_t count = *(const size_t *)vcount;
    return 100.0 * (double)(j / count) + (double)(j % count);
}

static void allgather_one(mc_dtype dt, size_t count) {
    size_t es = mc_dtype_size(dt);
    void *send = malloc(count * es), *recv = malloc(count * es * (size_t)np);
    for (size_t i = 0; i < count; i++) elem_set(send, dt, i, 100.0 * me + (double)i);
    memset(recv, 0xff, count * es * (size_t)np);
    char label[64];
    snprintf(label, sizeof label, "all_gather %s count=%zu", dtype_name(dt), count);
    int rc = mc_all_gather(world, send, recv, count, dt);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, label))
        check_elements(label, recv, dt, count * (size_t)np, gathered_value, &count);
    free(send);
    free(recv);
}

static void case_allgather(void) {
    allgather_one(MC_I32, 5);
    allgather_one(MC_F64, 3);
    allgather_one(MC_I64, 1);
    allgather_one(MC_F32, 4096);
}

/* ---------------------------------------------------------------------------------------------
   reduce_scatter: rank r sends s_r[j] = (r + 1)(j + 1) for j < P * count and receives the
   reduction of chunk r: sum (j + 1) P (P + 1) / 2, max (j + 1) P, avg (j + 1)(P + 1) / 2. */

typedef struct scatter_ctx {
    mc_reduce_op op;
    size_t count;
} scatter_ctx;

static double scattered_value(size_t i, const void *vctx) {
    const scatter_ctx *ctx = (const scatter_ctx *)vctx;
    double j1 = (double)((size_t)me * ctx->count + i + 1), p = np;
    switch (ctx->op) {
    case MC_SUM: return j1 * p * (p + 1) / 2;
    case MC_MAX: return j1 * p;
    case MC_MIN: return j1;
    case MC_AVG: return j1 * (p + 1) / 2;
    }
    return 0.0;
}

static void reduce_scatter_one(mc_dtype dt, mc_reduce_op op, size_t count) {
    size_t es = mc_dtype_size(dt), total = count * (size_t)np;
    void *send = malloc(total * es), *recv = malloc(count * es);
    for (size_t j = 0; j < total; j++) elem_set(send, dt, j, (double)(me + 1) * (double)(j + 1));
    memset(recv, 0xff, count * es);
    char label[80];
    snprintf(label, sizeof label, "reduce_scatter %s %s count=%zu", dtype_name(dt), op_name(op),
             count);
    int rc = mc_reduce_scatter(world, send, recv, count, dt, op);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, label)) {
        scatter_ctx ctx = {op, count};
        check_elements(label, recv, dt, count, scattered_value, &ctx);
    }
    free(send);
    free(recv);
}

static void case_reduce_scatter(void) {
    reduce_scatter_one(MC_F32, MC_SUM, 4);
    reduce_scatter_one(MC_I64, MC_SUM, 3);
    reduce_scatter_one(MC_I32, MC_MAX, 2);
    reduce_scatter_one(MC_F64, MC_MIN, 5);
    reduce_scatter_one(MC_F64, MC_AVG, 1);
    reduce_scatter_one(MC_F32, MC_SUM, 10000);
}

/* ---------------------------------------------------------------------------------------------
   broadcast from every root, blocking and async: the root holds 1000 root + i, the others -1. */

static double broadcast_value(size_t i, const void *vroot) {
    return 1000.0 * *(const int *)vroot + (double)i;
}

static void broadcast_one(mc_dtype dt, int root, size_t n, int async) {
    size_t es = mc_dtype_size(dt);
    void *buf = malloc(n * es);
    for (size_t i = 0; i < n; i++) elem_set(buf, dt, i, me == root ? 1000.0 * root + i : -1.0);
    char label[80];
    snprintf(label, sizeof label, "broadcast%s %s from root %d", async ? "_async" : "",
             dtype_name(dt), root);
    int rc;
    if (async) {
        mc_request *req = NULL;
        rc = mc_broadcast_async(world, buf, n, dt, root, &req);
        if (rc == MC_OK) rc = mc_wait(req);
    } else {
        rc = mc_broadcast(world, buf, n, dt, root);
    }
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, label))
        check_elements(label, buf, dt, n, broadcast_value, &root);
    free(buf);
}

static void case_broadcast(void) {
    for (int root = 0; root < np; root++) {
        broadcast_one(MC_I64, root, 9, 0);
        broadcast_one(MC_F32, root, 1000, 1);
    }
}

/* ---------------------------------------------------------------------------------------------
   ring: every rank sends to next = r + 1 and receives from prev = r - 1 (cyclic). The
   blocking form orders send and receive by parity, so no rank waits on a rank that is
   itself waiting to send; the async form posts both and waits. */

static int next_rank(void) { return (me + 1) % np; }
static int prev_rank(void) { return (me + np - 1) % np; }

static void check_ring_payload(const char *label, const int64_t *got, size_t n, int from) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != 10000LL * from + (int64_t)i && bad++ == 0) first = i;
    MC_CASE_CHECK(bad == 0, "%s: %zu of %zu wrong; first [%zu] = %lld, want %lld (from %d)",
                  label, bad, n, first, bad ? (long long)got[first] : 0LL,
                  10000LL * from + (long long)first, from);
}

static void ring_blocking(size_t n) {
    int64_t *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);
    for (size_t i = 0; i < n; i++) out[i] = 10000LL * me + (int64_t)i, in[i] = -1;
    int rc_send, rc_recv;
    if (me % 2 == 0) {
        rc_send = mc_send(world, out, n, MC_I64, next_rank(), 7);
        rc_recv = mc_recv(world, in, n, MC_I64, prev_rank(), 7);
    } else {
        rc_recv = mc_recv(world, in, n, MC_I64, prev_rank(), 7);
        rc_send = mc_send(world, out, n, MC_I64, next_rank(), 7);
    }
    MC_CASE_CHECK_STATUS(rc_send, MC_OK, "mc_send to next");
    if (MC_CASE_CHECK_STATUS(rc_recv, MC_OK, "mc_recv from prev"))
        check_ring_payload("ring blocking", in, n, prev_rank());
    free(out);
    free(in);
}

static void ring_async(size_t n) {
    int64_t *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);
    for (size_t i = 0; i < n; i++) out[i] = 10000LL * me + (int64_t)i, in[i] = -1;
    mc_request *recv_req = NULL, *send_req = NULL;
    int rc = mc_recv_async(world, in, n, MC_I64, prev_rank(), 8, &recv_req);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_recv_async from prev");
    int rc2 = mc_send_async(world, out, n, MC_I64, next_rank(), 8, &send_req);
    MC_CASE_CHECK_STATUS(rc2, MC_OK, "mc_send_async to next");
    if (rc2 == MC_OK) MC_CASE_CHECK_STATUS(mc_wait(send_req), MC_OK, "mc_wait(send)");
    if (rc == MC_OK && MC_CASE_CHECK_STATUS(mc_wait(recv_req), MC_OK, "mc_wait(recv)"))
        check_ring_payload("ring async", in, n, prev_rank());
    free(out);
    free(in);
}

static void case_ring(void) {
    ring_blocking(16);
    ring_blocking(200000);   /* 1.6 MB: too large to be sent eagerly */
    ring_async(16);
    ring_async(200000);
}

/* ---------------------------------------------------------------------------------------------
   batch: one batch sends to both neighbours and receives from both (what a pipeline stage
   does in 1F1B). Tags tell the two directions apart, which matters when next == prev. */

enum { TAG_FORWARD = 1, TAG_BACKWARD = 2 };

static void batch_one(int async, size_t n) {
    int64_t *to_next = malloc(n * 8), *to_prev = malloc(n * 8);
    int64_t *from_prev = malloc(n * 8), *from_next = malloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        to_next[i] = 10000LL * me + (int64_t)i;
        to_prev[i] = -(10000LL * me + (int64_t)i) - 1;
        from_prev[i] = from_next[i] = 0;
    }
    mc_p2p_op ops[4] = {
        {.is_send = 1, .buf = to_next, .count = n, .dtype = MC_I64, .peer = next_rank(),
         .tag = TAG_FORWARD},
        {.is_send = 1, .buf = to_prev, .count = n, .dtype = MC_I64, .peer = prev_rank(),
         .tag = TAG_BACKWARD},
        {.is_send = 0, .buf = from_prev, .count = n, .dtype = MC_I64, .peer = prev_rank(),
         .tag = TAG_FORWARD},
        {.is_send = 0, .buf = from_next, .count = n, .dtype = MC_I64, .peer = next_rank(),
         .tag = TAG_BACKWARD},
    };
    int rc;
    if (async) {
        mc_request *req = NULL;
        rc = mc_batch_send_recv_async(world, ops, 4, &req);
        if (rc == MC_OK) rc = mc_wait(req);
    } else {
        rc = mc_batch_send_recv(world, ops, 4);
    }
    const char *label = async ? "mc_batch_send_recv_async" : "mc_batch_send_recv";
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, label)) {
        check_ring_payload(async ? "batch async, from prev" : "batch, from prev", from_prev, n,
                           prev_rank());
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += from_next[i] != -(10000LL * next_rank() + (int64_t)i) - 1;
        MC_CASE_CHECK(bad == 0, "%s: %zu of %zu elements from next (%d) wrong", label, bad, n,
                      next_rank());
    }
    free(to_next);
    free(to_prev);
    free(from_prev);
    free(from_next);
}

static void case_batch(void) {
    batch_one(0, 8);
    batch_one(1, 8);
    batch_one(0, 100000);
    batch_one(1, 100000);
}

/* ---------------------------------------------------------------------------------------------
   async: five collectives in flight at once, waited in reverse order; then one polled with
   mc_test until done (which also frees it); then two tagged sends received in the opposite
   order. */

static void async_in_flight(void) {
    enum { N_AR = 6, N_RS = 2 };
    float ar_in[N_AR], ar_out[N_AR];
    int32_t ag_in = 3 * me + 1, *ag_out = calloc((size_t)np, sizeof *ag_out);
    double bc[4];
    int64_t *rs_in = malloc(sizeof(int64_t) * N_RS * (size_t)np), rs_out[N_RS] = {0, 0};
    for (int i = 0; i < N_AR; i++) ar_in[i] = (float)(me + i), ar_out[i] = -1.0f;
    for (int i = 0; i < 4; i++) bc[i] = me == np - 1 ? 0.25 * i : -1.0;
    for (int j = 0; j < N_RS * np; j++) rs_in[j] = (int64_t)j * (me + 1);

    mc_request *req[5] = {NULL};
    const char *what[5] = {"all_reduce_async", "all_gather_async", "broadcast_async",
                           "reduce_scatter_async", "barrier_async"};
    int rc[5];
    rc[0] = mc_all_reduce_async(world, ar_in, ar_out, N_AR, MC_F32, MC_SUM, &req[0]);
    rc[1] = mc_all_gather_async(world, &ag_in, ag_out, 1, MC_I32, &req[1]);
    rc[2] = mc_broadcast_async(world, bc, 4, MC_F64, np - 1, &req[2]);
    rc[3] = mc_reduce_scatter_async(world, rs_in, rs_out, N_RS, MC_I64, MC_SUM, &req[3]);
    rc[4] = mc_barrier_async(world, &req[4]);
    for (int k = 4; k >= 0; k--) {
        if (!MC_CASE_CHECK_STATUS(rc[k], MC_OK, what[k])) continue;
        char label[64];
        snprintf(label, sizeof label, "mc_wait(%s), waited in reverse order", what[k]);
        rc[k] = mc_wait(req[k]);
        MC_CASE_CHECK_STATUS(rc[k], MC_OK, label);
    }
    double ranks_sum = np * (np - 1) / 2.0;
    if (rc[0] == MC_OK)
        for (int i = 0; i < N_AR; i++)
            MC_CASE_CHECK(ar_out[i] == (float)(ranks_sum + (double)np * i),
                          "all_reduce_async [%d] = %g, want %g", i, ar_out[i],
                          ranks_sum + (double)np * i);
    if (rc[1] == MC_OK)
        for (int r = 0; r < np; r++)
            MC_CASE_CHECK(ag_out[r] == 3 * r + 1, "all_gather_async [%d] = %d, want %d", r,
                          ag_out[r], 3 * r + 1);
    if (rc[2] == MC_OK)
        for (int i = 0; i < 4; i++)
            MC_CASE_CHECK(bc[i] == 0.25 * i, "broadcast_async [%d] = %g, want %g", i, bc[i],
                          0.25 * i);
    if (rc[3] == MC_OK)
        for (int i = 0; i < N_RS; i++) {
            int64_t want = (int64_t)(me * N_RS + i) * (int64_t)(np * (np + 1) / 2);
            MC_CASE_CHECK(rs_out[i] == want, "reduce_scatter_async [%d] = %lld, want %lld", i,
                          (long long)rs_out[i], (long long)want);
        }
    free(ag_out);
    free(rs_in);
}

static void async_polled(void) {
    int64_t in = me + 1, out = 0;
    mc_request *req = NULL;
    int rc = mc_all_reduce_async(world, &in, &out, 1, MC_I64, MC_SUM, &req);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_all_reduce_async (polled)")) return;
    int done = 0, polls = 0;
    double deadline = mc_test_now() + DEFAULT_TIMEOUT_S;
    while (!done && mc_test_now() < deadline) {
        rc = mc_test(req, &done);
        polls++;
        if (rc != MC_OK) break;
    }
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_test");
    MC_CASE_CHECK(done == 1, "mc_test never reported completion (%d polls)", polls);
    /* done = 1 means the request is finished and already freed: no mc_wait after it */
    if (done && rc == MC_OK)
        MC_CASE_CHECK(out == (int64_t)np * (np + 1) / 2, "polled all_reduce = %lld, want %lld",
                      (long long)out, (long long)np * (np + 1) / 2);
}

static void async_tags_out_of_order(void) {
    if (np < 2) return;
    int32_t first = 100 + me, second = 200 + me, got_first = -1, got_second = -1;
    mc_request *s1 = NULL, *s2 = NULL, *r1 = NULL, *r2 = NULL;
    int rc = mc_send_async(world, &first, 1, MC_I32, next_rank(), 11, &s1);
    rc |= mc_send_async(world, &second, 1, MC_I32, next_rank(), 12, &s2);
    /* receive the later tag first: matching goes by tag, not by arrival */
    rc |= mc_recv_async(world, &got_second, 1, MC_I32, prev_rank(), 12, &r2);
    rc |= mc_recv_async(world, &got_first, 1, MC_I32, prev_rank(), 11, &r1);
    if (!MC_CASE_CHECK(rc == MC_OK, "starting tagged async p2p failed: %s", mc_last_error()))
        return;
    MC_CASE_CHECK_STATUS(mc_wait(r2), MC_OK, "mc_wait(recv tag 12)");
    MC_CASE_CHECK_STATUS(mc_wait(r1), MC_OK, "mc_wait(recv tag 11)");
    MC_CASE_CHECK_STATUS(mc_wait(s2), MC_OK, "mc_wait(send tag 12)");
    MC_CASE_CHECK_STATUS(mc_wait(s1), MC_OK, "mc_wait(send tag 11)");
    MC_CASE_CHECK(got_first == 100 + prev_rank() && got_second == 200 + prev_rank(),
                  "tagged receives got (%d, %d), want (%d, %d)", got_first, got_second,
                  100 + prev_rank(), 200 + prev_rank());
}

static void case_async(void) {
    async_in_flight();
    async_polled();
    async_tags_out_of_order();
}

/* ---------------------------------------------------------------------------------------------
   barrier: rank 0 arrives 0.3 s late, so nobody may leave before it came. */

static void case_barrier(void) {
    const double late = 0.3;
    double t0 = mc_test_now();
    if (me == 0) sleep_s(late);
    int rc = mc_barrier(world);
    double waited = mc_test_now() - t0;
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_barrier");
    if (np > 1)
        MC_CASE_CHECK(waited >= late * 0.8, "left the barrier after %.3f s, before rank 0 came "
                      "(%.1f s)", waited, late);
    mc_request *req = NULL;
    rc = mc_barrier_async(world, &req);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_barrier_async"))
        MC_CASE_CHECK_STATUS(mc_wait(req), MC_OK, "mc_wait(barrier)");
}

/* ---------------------------------------------------------------------------------------------
   create_collective: every rank creates every group of a partition, in the same order, and
   keeps the one it is in. */

typedef struct partition {
    const char *name;
    int n_groups;
    int *sizes;      /* (n_groups) */
    int **members;   /* (n_groups) member lists, ranks of the parent */
} partition;

static void partition_free(partition *p) {
    for (int g = 0; g < p->n_groups; g++) free(p->members[g]);
    free(p->members);
    free(p->sizes);
}

static partition partition_alloc(const char *name, int n_groups) {
    partition p = {name, n_groups, calloc((size_t)n_groups, sizeof(int)),
                   calloc((size_t)n_groups, sizeof(int *))};
    return p;
}

/* {0,1} {2,3} ... (the last one a singleton when n is odd) */
static partition partition_pairs(int n) {
    partition p = partition_alloc("pairs", (n + 1) / 2);
    for (int g = 0; g < p.n_groups; g++) {
        p.sizes[g] = 2 * g + 1 < n ? 2 : 1;
        p.members[g] = range(2 * g, p.sizes[g]);
    }
    return p;
}

/* {0,2,4,...} {1,3,...} (a single group when n == 1) */
static partition partition_parity(int n) {
    partition p = partition_alloc("parity", n < 2 ? 1 : 2);
    for (int g = 0; g < p.n_groups; g++) {
        p.sizes[g] = (n - g + 1) / 2;
        p.members[g] = malloc(sizeof(int) * (size_t)p.sizes[g]);
        for (int j = 0; j < p.sizes[g]; j++) p.members[g][j] = g + 2 * j;
    }
    return p;
}

static partition partition_whole(int n) {
    partition p = partition_alloc("whole", 1);
    p.sizes[0] = n;
    p.members[0] = range(0, n);
    return p;
}

static int find_member(const int *members, int n, int rank) {
    for (int j = 0; j < n; j++)
        if (members[j] == rank) return j;
    return -1;
}

/* Creates every group of `p` over `parent` and returns the one holding this rank (checked). */
static mc_comm *create_partition(mc_comm *parent, const partition *p) {
    mc_comm *mine = NULL;
    int mine_index = -1;
    for (int g = 0; g < p->n_groups; g++) {
        mc_comm *out = (mc_comm *)&out;   /* poison: the call must overwrite it */
        char label[96];
        snprintf(label, sizeof label, "mc_comm_create_group(%s group %d over %s)", p->name, g,
                 parent->name);
        int rc = mc_comm_create_group(parent, p->members[g], p->sizes[g], &out);
        if (!MC_CASE_CHECK_STATUS(rc, MC_OK, label)) continue;
        int member = find_member(p->members[g], p->sizes[g], parent->rank) >= 0;
        if (member) {
            mine = out;
            mine_index = g;
        } else {
            MC_CASE_CHECK(out == NULL, "%s: a non-member got a communicator", label);
        }
    }
    if (!MC_CASE_CHECK(mine != NULL, "%s over %s: no group holds parent rank %d", p->name,
                       parent->name, parent->rank))
        return NULL;
    int n = p->sizes[mine_index];
    int *world_members = malloc(sizeof(int) * (size_t)n);
    for (int j = 0; j < n; j++) world_members[j] = parent->world_ranks[p->members[mine_index][j]];
    char label[96];
    snprintf(label, sizeof label, "%s group %d over %s", p->name, mine_index, parent->name);
    mc_case_check_group(mine, world_members, n, label);
    free(world_members);
    return mine;
}

static void invalid_member_lists(void) {
    int dup[2] = {0, 0}, outside[1] = {np}, negative[1] = {-1};
    struct {
        const char *what;
        const int *members;
        int n;
    } bad[] = {{"a duplicate member", dup, 2}, {"a member outside the parent", outside, 1},
               {"a negative member", negative, 1}, {"no member", dup, 0}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mc_comm *out = NULL;
        char label[96];
        snprintf(label, sizeof label, "mc_comm_create_group with %s", bad[k].what);
        int rc = mc_comm_create_group(world, bad[k].members, bad[k].n, &out);
        MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_ARG, label);
        MC_CASE_CHECK(out == NULL, "%s: got a communicator", label);
        MC_CASE_CHECK(strlen(mc_last_error()) > 0, "%s: mc_last_error() is empty", label);
    }
}

static void case_create_collective(void) {
    partition parts[3] = {partition_pairs(np), partition_parity(np), partition_whole(np)};
    mc_comm *kept[3] = {NULL};
    for (int k = 0; k < 3; k++) kept[k] = create_partition(world, &parts[k]);

    /* nested: halve the parity group again; member lists are ranks of that parent */
    if (kept[1] != NULL) {
        partition sub = partition_pairs(kept[1]->size);
        sub.name = "pairs-of-parity";
        mc_comm *inner = create_partition(kept[1], &sub);
        if (inner != NULL) mc_comm_destroy(inner);
        partition_free(&sub);
    }

    /* bad member lists fail on every rank alike, and leave the sequence usable */
    invalid_member_lists();
    partition again = partition_whole(np);
    again.name = "whole-after-invalid";
    mc_comm *after = create_partition(world, &again);
    if (after != NULL) mc_comm_destroy(after);
    partition_free(&again);

    for (int k = 0; k < 3; k++) {
        if (kept[k] != NULL) mc_comm_destroy(kept[k]);
        partition_free(&parts[k]);
    }
}

/* ---------------------------------------------------------------------------------------------
   create_local: only the members call mc_comm_create_group_local. All pairs are created at
   the same time under distinct tags, then the two parity groups. */

static mc_comm *create_local_mine(const partition *p, int tag_base) {
    for (int g = 0; g < p->n_groups; g++) {
        if (find_member(p->members[g], p->sizes[g], me) < 0) continue;
        mc_comm *out = NULL;
        char label[96];
        snprintf(label, sizeof label, "mc_comm_create_group_local(%s group %d, tag %d)", p->name,
                 g, tag_base + g);
        int rc = mc_comm_create_group_local(world, p->members[g], p->sizes[g], tag_base + g, &out);
        if (!MC_CASE_CHECK_STATUS(rc, MC_OK, label)) return NULL;
        snprintf(label, sizeof label, "local %s group %d", p->name, g);
        mc_case_check_group(out, p->members[g], p->sizes[g], label);
        return out;
    }
    MC_CASE_CHECK(0, "%s: no group holds rank %d", p->name, me);
    return NULL;
}

static void case_create_local(void) {
    partition pairs = partition_pairs(np), parity = partition_parity(np);
    mc_comm *pair = create_local_mine(&pairs, 100);
    mc_comm *half = create_local_mine(&parity, 200);

    /* A rank that is not in the list it passes cannot take part: it must be told so. */
    int others[1] = {(me + 1) % np};
    if (np > 1) {
        mc_comm *out = NULL;
        int rc = mc_comm_create_group_local(world, others, 1, 300 + me, &out);
        MC_CASE_CHECK_STATUS(rc, MC_ERR_NOT_MEMBER, "mc_comm_create_group_local without self");
        MC_CASE_CHECK(out == NULL, "a non-member got a local communicator");
    }

    /* both kinds of groups still work after the others were made */
    if (pair != NULL) {
        int64_t one = 1, count = 0;
        int rc = mc_all_reduce(pair, &one, &count, 1, MC_I64, MC_SUM);
        if (MC_CASE_CHECK_STATUS(rc, MC_OK, "all_reduce over the local pair"))
            MC_CASE_CHECK(count == pair->size, "pair counted %lld members, want %d",
                          (long long)count, pair->size);
        mc_comm_destroy(pair);
    }
    if (half != NULL) mc_comm_destroy(half);
    partition_free(&pairs);
    partition_free(&parity);
}

/* ---------------------------------------------------------------------------------------------
   timeout: the last rank skips a collective; everyone else must get MC_ERR_TIMEOUT after
   the communicator's timeout, never hang. Each experiment uses its own child of the world,
   since a collective left half-done poisons the communicator it ran on. Buffers are static:
   the unfinished operation may still refer to them. */

static void expect_timeout(const char *what, int rc, double elapsed, double timeout_s) {
    MC_CASE_CHECK_STATUS(rc, MC_ERR_TIMEOUT, what);
    MC_CASE_CHECK(elapsed >= 0.75 * timeout_s && elapsed < timeout_s + 5.0,
                  "%s: gave up after %.2f s, the timeout is %.1f s", what, elapsed, timeout_s);
    if (rc != MC_OK) MC_CASE_CHECK(strlen(mc_last_error()) > 0, "%s: empty mc_last_error()", what);
}

static mc_comm *child_with_timeout(double timeout_s) {
    int *all = range(0, np);
    mc_comm *child = NULL;
    int rc = mc_comm_create_group(world, all, np, &child);
    free(all);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "creating a child of the world") || child == NULL)
        return NULL;
    child->timeout_s = timeout_s;
    return child;
}

static void case_timeout(void) {
    const int skipper = np - 1;
    mc_comm *for_reduce = child_with_timeout(2.0);
    mc_comm *for_wait = child_with_timeout(1.0);
    mc_comm *for_create = child_with_timeout(1.0);
    if (!for_reduce || !for_wait || !for_create) return;
    if (me == skipper) {
        printf("[rank %d] skipping three calls on purpose\n", me);
        return;   /* goes straight to the final count, which waits for the others */
    }
    static float in[4], out[4];
    double t0 = mc_test_now();
    int rc = mc_all_reduce(for_reduce, in, out, 4, MC_F32, MC_SUM);
    expect_timeout("mc_all_reduce with a rank missing", rc, mc_test_now() - t0, 2.0);

    static int64_t ain, aout;
    mc_request *req = NULL;
    t0 = mc_test_now();
    rc = mc_all_reduce_async(for_wait, &ain, &aout, 1, MC_I64, MC_SUM, &req);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_all_reduce_async (start)")) {
        rc = mc_wait(req);
        expect_timeout("mc_wait on an all_reduce with a rank missing", rc, mc_test_now() - t0,
                       1.0);
    }

    int *members = range(0, np);
    mc_comm *out_comm = NULL;
    t0 = mc_test_now();
    rc = mc_comm_create_group(for_create, members, np, &out_comm);
    free(members);
    expect_timeout("mc_comm_create_group with a rank missing", rc, mc_test_now() - t0, 1.0);
    MC_CASE_CHECK(out_comm == NULL, "a timed-out creation returned a communicator");
    if (me == 0) printf("timeout: rank 0 got %s: %s\n", mc_err_name(rc), mc_last_error());
    /* the poisoned children are left alone: destroying them could wait on the lost call */
}

/* ---------------------------------------------------------------------------------------------
   mismatch: rank 0 asks for [0..P-1], the others for [1..P-1], at the same call, with
   verification on. Every rank must fail with MC_ERR_PLAN_MISMATCH naming both lists, and
   the next creation, agreed by all, must still work. */

static void case_mismatch(void) {
    int *whole = range(0, np), *tail = range(1, np - 1);
    const int *mine = me == 0 ? whole : tail;
    int n_mine = me == 0 ? np : np - 1;
    mc_comm *out = NULL;
    double t0 = mc_test_now();
    int rc = mc_comm_create_group_ex(world, mine, n_mine, 1, &out);
    double elapsed = mc_test_now() - t0;
    MC_CASE_CHECK_STATUS(rc, MC_ERR_PLAN_MISMATCH, "mc_comm_create_group_ex(verify=1)");
    MC_CASE_CHECK(out == NULL, "a mismatched creation returned a communicator");
    MC_CASE_CHECK(elapsed < DEFAULT_TIMEOUT_S / 2, "the mismatch took %.2f s to report",
                  elapsed);
    char whole_text[256], tail_text[256];
    mc_case_format_ranks(whole_text, sizeof whole_text, whole, np);
    mc_case_format_ranks(tail_text, sizeof tail_text, tail, np - 1);
    const char *msg = mc_last_error();
    MC_CASE_CHECK(strstr(msg, whole_text) && strstr(msg, tail_text),
                  "the message must name both lists %s and %s: \"%s\"", whole_text, tail_text,
                  msg);
    if (me == 0) printf("mismatch: rank 0 got %s: %s\n", mc_err_name(rc), msg);

    mc_comm *agreed = NULL;
    rc = mc_comm_create_group(world, whole, np, &agreed);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_comm_create_group after a mismatch")) {
        mc_case_check_group(agreed, whole, np, "whole world after a mismatch");
        mc_comm_destroy(agreed);
    }
    free(whole);
    free(tail);
}

/* ---------------------------------------------------------------------------------------------
   positional: the "only members create the group" bug. The plan is A = [1..P-1], then
   B = [0..P-1]; with verification off and rank 0 skipping A (it is not a member), calls are
   paired by position, so rank 0's B meets the others' A. What comes out is recorded per
   call: ok, wrong_membership, timeout or error. The check: it is never silently all ok. */

enum { OUT_OK, OUT_WRONG, OUT_TIMEOUT, OUT_ERROR, OUT_NONE };
static const char *outcome_name[] = {"ok", "wrong_membership", "timeout", "error", "-"};

static int classify(int rc, const mc_comm *c, const int *members, int n) {
    if (rc == MC_ERR_TIMEOUT) return OUT_TIMEOUT;
    if (rc != MC_OK) return OUT_ERROR;
    if (c == NULL || c->size != n) return OUT_WRONG;
    for (int j = 0; j < n; j++)
        if (c->world_ranks[j] != members[j]) return OUT_WRONG;
    return OUT_OK;
}

static void case_positional(void) {
    mc_comm *arena = child_with_timeout(2.0);
    if (arena == NULL) return;
    int *plan_a = range(1, np - 1), *plan_b = range(0, np);
    int32_t outcome[2] = {OUT_NONE, OUT_NONE};   /* this rank's call for A, for B */
    int32_t got_size[2] = {0, 0};
    double t0 = mc_test_now();
    if (me != 0) {
        mc_comm *a = NULL;
        int rc = mc_comm_create_group_ex(arena, plan_a, np - 1, 0, &a);
        outcome[0] = classify(rc, a, plan_a, np - 1);
        got_size[0] = a ? a->size : 0;
    }
    mc_comm *b = NULL;
    int rc = mc_comm_create_group_ex(arena, plan_b, np, 0, &b);
    outcome[1] = classify(rc, b, plan_b, np);
    got_size[1] = b ? b->size : 0;
    double elapsed = mc_test_now() - t0;
    MC_CASE_CHECK(elapsed < 2 * 2.0 + 5.0, "the positional experiment took %.2f s", elapsed);

    /* gather every rank's outcomes over the (healthy) world and judge them on rank 0 */
    int32_t mine[4] = {outcome[0], outcome[1], got_size[0], got_size[1]};
    int32_t *all = calloc((size_t)np * 4, sizeof *all);
    rc = mc_all_gather(world, mine, all, 4, MC_I32);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "gathering the outcomes")) {
        free(all);
        return;
    }
    if (me == 0) {
        int all_ok = 1;
        for (int r = 0; r < np; r++) {
            printf("positional: rank %d: A -> %s (size %d), B -> %s (size %d)\n", r,
                   outcome_name[all[4 * r]], all[4 * r + 2], outcome_name[all[4 * r + 1]],
                   all[4 * r + 3]);
            for (int k = 0; k < 2; k++)
                all_ok = all_ok && (all[4 * r + k] == OUT_OK || all[4 * r + k] == OUT_NONE);
        }
        MC_CASE_CHECK(!all_ok, "skipping a non-member creation with verify=0 was reported as "
                      "ok on every rank; the bug went unnoticed");
    }
    free(all);
    free(plan_a);
    free(plan_b);
}

/* ---------------------------------------------------------------------------------------------
   agree: mc_comm_agree names the first item whose value differs, on every rank, and lets
   agreeing ranks through with one collective; a different item list is refused as such. */

static void case_agree(void) {
    char mine[32];
    snprintf(mine, sizeof mine, "%s", me == np - 1 ? "4" : "2");
    mc_agree_item same[] = {{"--seed", "1234"}, {"--lr", "0.001"}};
    int rc = mc_comm_agree(world, same, 2);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_comm_agree with equal items");
    rc = mc_comm_agree(world, NULL, 0);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_comm_agree with no items");

    mc_agree_item differ[] = {{"--seed", "1234"}, {"--num-layers", mine}, {"--lr", mine}};
    rc = mc_comm_agree(world, differ, 3);
    MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_DESC, "mc_comm_agree with one rank's --num-layers");
    char want[128];
    snprintf(want, sizeof want, "--num-layers is \"4\" on rank %d but \"2\" on rank", np - 1);
    MC_CASE_CHECK(strstr(mc_last_error(), want) != NULL, "the message must name the first "
                  "differing item and its values (%s): \"%s\"", want, mc_last_error());
    MC_CASE_CHECK(strstr(mc_last_error(), "--lr") == NULL, "only the first differing item is "
                  "named: \"%s\"", mc_last_error());
    if (me == 0) printf("agree: rank 0 got %s: %s\n", mc_err_name(rc), mc_last_error());

    /* A longer list on the last rank: it runs another program; still one step, no hang. */
    rc = mc_comm_agree(world, differ, me == np - 1 ? 3 : 2);
    MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_DESC, "mc_comm_agree with different item counts");
    MC_CASE_CHECK(strstr(mc_last_error(), "different programs") != NULL, "\"%s\"",
                  mc_last_error());

    /* The world is still in step afterwards. */
    rc = mc_comm_agree(world, same, 2);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_comm_agree after disagreements");
}

/* ---------------------------------------------------------------------------------------------
   watchdog_deadlock: every rank waits for a message nobody sends. The watchdog (3 s on this
   world) must end every rank's wait within its limit with one verdict that calls it a
   deadlock and names each rank's call; later calls fail at once. */

#define WATCHDOG_S 3.0

static void case_watchdog_deadlock(void) {
    static float buf[4];
    double t0 = mc_test_now();
    int rc = mc_recv(world, buf, 4, MC_F32, (me + 1) % np, 77);
    double elapsed = mc_test_now() - t0;
    MC_CASE_CHECK_STATUS(rc, MC_ERR_TIMEOUT, "mc_recv that no rank answers");
    MC_CASE_CHECK(elapsed > 0.5 * WATCHDOG_S && elapsed < WATCHDOG_S + 3.0,
                  "the verdict came after %.2f s; the watchdog is %.1f s", elapsed, WATCHDOG_S);
    const char *msg = mc_last_error();
    MC_CASE_CHECK(strstr(msg, "watchdog:") && strstr(msg, "deadlock"), "\"%s\"", msg);
    MC_CASE_CHECK(strstr(msg, "recv #"), "the message names the call: \"%s\"", msg);
    MC_CASE_CHECK(mc_comm_watchdog_verdict(world) != NULL, "no verdict recorded");
    if (me == 0) printf("watchdog_deadlock: rank 0 after %.2f s: %s\n", elapsed, msg);
    t0 = mc_test_now();
    rc = mc_barrier(world);
    MC_CASE_CHECK_STATUS(rc, MC_ERR_TIMEOUT, "mc_barrier after the verdict");
    MC_CASE_CHECK(mc_test_now() - t0 < 0.5, "a call after the verdict took %.2f s",
                  mc_test_now() - t0);
}

/* watchdog_slow: the last rank is busy outside megatron_c for 85% of the watchdog's limit
   before it joins an all-reduce. The others start asking around meanwhile; the late rank's
   answer (or the all-reduce finishing) is progress, so there is no verdict and the result is
   right. */
static void case_watchdog_slow(void) {
    int32_t mine = me + 1, sum = 0;
    if (me == np - 1) {
        struct timespec nap = {0, (long)(0.85 * WATCHDOG_S * 1e9) % 1000000000L};
        nap.tv_sec = (time_t)(0.85 * WATCHDOG_S);
        nanosleep(&nap, NULL);
    }
    int rc = mc_all_reduce(world, &mine, &sum, 1, MC_I32, MC_SUM);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_all_reduce with a late rank");
    MC_CASE_CHECK(sum == np * (np + 1) / 2, "sum %d, want %d", sum, np * (np + 1) / 2);
    MC_CASE_CHECK(mc_comm_watchdog_verdict(world) == NULL, "a late rank was judged stuck: %s",
                  mc_comm_watchdog_verdict(world));
}

/* watchdog_stop: the last rank stops itself (SIGSTOP) after a barrier; the others' all-reduce
   must end within the watchdog's limit, naming that rank and the call. The stopped rank
   never gets here; mpirun ends it once the others exit. */
static void case_watchdog_stop(void) {
    static float in[4], out[4];
    int rc = mc_barrier(world);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_barrier before the stop");
    if (me == np - 1) {
        fflush(stdout);
        raise(SIGSTOP);
        return;
    }
    double t0 = mc_test_now();
    rc = mc_all_reduce(world, in, out, 4, MC_F32, MC_SUM);
    double elapsed = mc_test_now() - t0;
    MC_CASE_CHECK_STATUS(rc, MC_ERR_TIMEOUT, "mc_all_reduce with a stopped rank");
    MC_CASE_CHECK(elapsed < WATCHDOG_S + 3.0, "the verdict came after %.2f s", elapsed);
    char want[64];
    snprintf(want, sizeof want, "watchdog: rank %d made no progress", np - 1);
    const char *msg = mc_last_error();
    MC_CASE_CHECK(strstr(msg, want) && strstr(msg, "all_reduce #"), "want \"%s\" and the call "
                  "in \"%s\"", want, msg);
    printf("[rank %d] watchdog_stop after %.2f s: %s\n", me, elapsed, msg);
}

/* ---------------------------------------------------------------------------------------------
   dispatch */

typedef struct comm_case {
    const char *name;
    int min_ranks;
    void (*run)(void);
} comm_case;

static const comm_case cases[] = {
    {"allreduce", 1, case_allreduce},
    {"allgather", 1, case_allgather},
    {"reduce_scatter", 1, case_reduce_scatter},
    {"broadcast", 1, case_broadcast},
    {"ring", 2, case_ring},
    {"batch", 2, case_batch},
    {"async", 1, case_async},
    {"barrier", 1, case_barrier},
    {"create_collective", 1, case_create_collective},
    {"create_local", 1, case_create_local},
    {"timeout", 2, case_timeout},
    {"mismatch", 2, case_mismatch},
    {"positional", 2, case_positional},
    {"agree", 2, case_agree},
    {"watchdog_deadlock", 2, case_watchdog_deadlock},
    {"watchdog_stop", 2, case_watchdog_stop},
    {"watchdog_slow", 2, case_watchdog_slow},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

static void usage(const char *prog) {
    fprintf(stderr, "usage: %s <case> [--backend auto|self|mpi]\ncases:", prog);
    for (int i = 0; i < N_CASES; i++) fprintf(stderr, " %s", cases[i].name);
    fprintf(stderr, "\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(argv[0]);
        return 2;
    }
    const comm_case *chosen = NULL;
    for (int i = 0; i < N_CASES; i++)
        if (strcmp(argv[1], cases[i].name) == 0) chosen = &cases[i];
    mc_comm_backend backend = MC_BACKEND_AUTO;
    for (int i = 2; i < argc; i++) {
        int is_backend = strcmp(argv[i], "--backend") == 0 && i + 1 < argc;
        if (is_backend && mc_case_backend_option(argv[i + 1], &backend))
            i++;
        else
            chosen = NULL;
    }
    if (chosen == NULL) {
        usage(argv[0]);
        return 2;
    }

    /* the watchdog cases run with the job-wide watchdog on the world */
    double watchdog_s = strncmp(chosen->name, "watchdog", 8) == 0 ? WATCHDOG_S : 0.0;
    int rc = mc_case_init_world(&world, &(mc_comm_desc){.backend = backend,
                                                         .timeout_s = DEFAULT_TIMEOUT_S,
                                                         .watchdog_s = watchdog_s,
                                                         .argc = &argc, .argv = &argv});
    if (rc != MC_OK) return 1;
    me = world->rank;
    np = world->size;
    return mc_case_run(world, chosen->name, chosen->run,
                       np < chosen->min_ranks ? "needs 2 ranks" : NULL);
}
