/* test_ops.c - the CPU op table against independent fp64 references.

   Every forward is compared with a naive double-precision version written here (plain loops,
   no blocking); every backward with central finite differences of that fp64 forward, for the
   scalar loss L = sum_i w_i out_i with random weights w (so dout = w). Shapes are small and
   deliberately odd: S not a multiple of anything, B > 1, NH > 1, GEMM sizes that cross the
   block edges. The dropout masks are checked against the RNG section's functions, the
   cross-entropy pieces by composing the vocab-parallel loss over two uneven vocab shards. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "test_util.h"

TestSuite(ops, .timeout = 60);

/* ---------------------------------------------------------------------------------------------
   helpers */

/* A small deterministic generator for test inputs (independent of the library's Philox). */
static uint64_t g_state = 88172645463325252ULL;
static void seed_inputs(uint64_t s) { g_state = s * 2654435761ULL + 1; }
static double urand(void) {   /* [0, 1) */
    g_state ^= g_state << 13;
    g_state ^= g_state >> 7;
    g_state ^= g_state << 17;
    return (double)(g_state >> 11) * (1.0 / 9007199254740992.0);
}
static void fill_rand(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
}
static double *to_double(const float *x, size_t n) {
    double *d = (double *)malloc(n * sizeof(double) + 1);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static float *falloc(size_t n) { return (float *)calloc(n + 1, sizeof(float)); }
static double *dalloc(size_t n) { return (double *)calloc(n + 1, sizeof(double)); }

/* |got - want| <= atol + rtol |want| everywhere; reports the worst element. */
static int expect_close(const char *what, const float *got, const double *want, size_t n,
                        double atol, double rtol) {
    size_t bad = 0, worst = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]);
        double tol = atol + rtol * fabs(want[i]);
        if (!(diff <= tol)) bad++;
        if (diff - tol > worst_excess || isnan(diff)) {
            worst_excess = isnan(diff) ? INFINITY : diff - tol;
            worst = i;
        }
    }
    cr_expect(bad == 0, "%s: %zu of %zu elements off; worst [%zu] got %.9g want %.9g", what, bad,
              n, worst, n ? (double)got[worst] : 0.0, n ? want[worst] : 0.0);
    return (int)bad;
}

/* Central differences of a scalar fp64 function f(x, ctx) at x (x is restored). */
typedef double (*scalar_fn)(const double *x, void *ctx);
static void finite_diff(double *grad, double *x, size_t n, scalar_fn f, void *ctx, double h) {
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double up = f(x, ctx);
        x[i] = keep - h;
        double down = f(x, ctx);
        x[i] = keep;
        grad[i] = (up - down) / (2.0 * h);
    }
}

static double weighted_sum(const double *out, const double *w, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += out[i] * w[i];
    return s;
}

#define FD_H 1e-5
#define FD_ATOL 2e-4
#define FD_RTOL 2e-3

/* ---------------------------------------------------------------------------------------------
   element-wise and vector ops */

Test(ops, table_is_complete) {
    const mc_ops *ops = mc_ops_cpu();
    cr_assert_not_null(ops);
    cr_expect_str_eq(ops->name, "cpu");
    cr_expect_eq(ops->device, MC_DEVICE_CPU);
    /* every slot from alloc to the account is a function; the shared table counts nothing */
    const void *const *slot = (const void *const *)&ops->alloc;
    size_t n = (offsetof(mc_ops, account) - offsetof(mc_ops, alloc)) / sizeof(void *);
    for (size_t i = 0; i < n; i++) cr_expect_not_null(slot[i], "op slot %zu is NULL", i);
    cr_expect_null(ops->account);
}

Test(ops, alloc_fill_copy_axpy_scale_sum_squares) {
    const mc_ops *ops = mc_ops_cpu();
    size_t n = 1001;
    float *x = NULL;
    cr_assert_eq(ops->alloc(ops, (void **)&x, n * sizeof(float)), MC_OK);
    float *y = falloc(n);
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++) cr_expect_eq(x[i], 0.0f, "alloc is not zero-filled at %zu", i);
    cr_expect_eq(ops->fill(ops, x, 2.5f, n, MC_F32), MC_OK);
    for (size_t i = 0; i < n; i++) cr_expect_eq(x[i], 2.5f);
    seed_inputs(1);
    fill_rand(y, n, -1, 1);
    cr_expect_eq(ops->copy(ops, x, y, n, MC_F32, MC_F32), MC_OK);
    cr_expect(memcmp(x, y, n * sizeof(float)) == 0, "copy");
    double *want = dalloc(n);
    for (size_t i = 0; i < n; i++) want[i] = (double)x[i] + (double)-0.75f * y[i];
    ops->axpy(ops, x, -0.75f, y, n, MC_F32);
    expect_close("axpy", x, want, n, 1e-7, 1e-6);
    for (size_t i = 0; i < n; i++) want[i] = (double)x[i] * 3.0;
    ops->scale(ops, x, 3.0f, n, MC_F32);
    expect_close("scale", x, want, n, 1e-7, 1e-6);
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    /* spans [0, 400) and [400, n) as one sum, then an empty list */
    size_t spans[4] = {0, 400, 400, n};
    double got = -1.0;
    cr_expect_eq(ops->sum_squares(ops, &got, x, spans, 2), MC_OK);
    cr_expect(fabs(got - ss) <= 1e-12 * ss, "sum_squares %.17g vs %.17g", got, ss);
    cr_expect_eq(ops->sum_squares(ops, &got, x, spans, 0), MC_OK);
    cr_expect_eq(got, 0.0);
    /* only the second span */
    double tail = 0.0;
    for (size_t i = 400; i < n; i++) tail += (double)x[i] * x[i];
    cr_expect_eq(ops->sum_squares(ops, &got, x, spans + 2, 1), MC_OK);
    cr_expect(fabs(got - tail) <= 1e-12 * tail, "sum_squares of one span %.17g vs %.17g", got,
              tail);
    ops->free(ops, x);
    free(y);
    free(want);
}

Test(ops, bias_forward_and_backward) {
    const mc_ops *ops = mc_ops_cpu();
    int N = 7, C = 5;
    float *out = falloc(N * C), *bias = falloc(C), *dbias = falloc(C), *dout = falloc(N * C);
    seed_inputs(2);
    fill_rand(out, N * C, -1, 1);
    fill_rand(bias, C, -1, 1);
    fill_rand(dout, N * C, -1, 1);
    fill_rand(dbias, C, -1, 1);
    double *want = dalloc(N * C), *want_db = dalloc(C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) want[n * C + c] = (double)out[n * C + c] + bias[c];
    for (int c = 0; c < C; c++) {
        want_db[c] = dbias[c];
        for (int n = 0; n < N; n++) want_db[c] += dout[n * C + c];
    }
    /* the bias alone: a GEMM with K = 0 is beta * C + bias */
    ops->gemm(ops, out, NULL, NULL, bias, N, C, 0, 0, 0, 1.0f, 1.0f, MC_F32, MC_F32);
    expect_close("gemm K=0 + bias", out, want, N * C, 1e-7, 1e-6);
    double *before = to_double(out, N * C);
    ops->gemm(ops, out, NULL, NULL, NULL, N, C, 0, 0, 0, 1.0f, 1.0f, MC_F32, MC_F32);
    expect_close("gemm K=0 without bias", out, before, N * C, 0, 0);
    free(before);
    ops->bias_backward(ops, dbias, dout, N, C, MC_F32);
    expect_close("bias_backward accumulates", dbias, want_db, C, 1e-6, 1e-6);
    free(out), free(bias), free(dbias), free(dout), free(want), free(want_db);
}

/* ---------------------------------------------------------------------------------------------
   GEMM */

static void ref_gemm(double *C, const float *A, const float *B, int M, int N, int K, int ta,
                     int tb, double alpha, double beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
                double b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                s += a * b;
            }
            C[(size_t)i * N + j] = alpha * s + beta * C[(size_t)i * N + j];
        }
}

typedef void (*gemm_fn)(float *, const float *, const float *, int, int, int, int, int, float,
                        float);

/* the table's gemm in the blocked gemm's shape */
static void table_gemm(float *C, const float *A, const float *B, int M, int N, int K, int ta,
                       int tb, float alpha, float beta) {
    const mc_ops *ops = mc_ops_cpu();
    cr_expect_eq(ops->gemm(ops, C, A, B, NULL, M, N, K, ta, tb, alpha, beta, MC_F32, MC_F32),
                 MC_OK);
}

static void check_gemm(gemm_fn gemm, const char *name, int M, int N, int K) {
    float *A = falloc((size_t)M * K), *B = falloc((size_t)K * N), *C = falloc((size_t)M * N);
    double *want = dalloc((size_t)M * N);
    static const float alphas[] = {1.0f, -0.5f};
    static const float betas[] = {0.0f, 1.0f, 0.25f};
    seed_inputs((uint64_t)(M * 131 + N * 7 + K));
    fill_rand(A, (size_t)M * K, -1, 1);
    fill_rand(B, (size_t)K * N, -1, 1);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int ia = 0; ia < 2; ia++)
                for (int ib = 0; ib < 3; ib++) {
                    char what[128];
                    fill_rand(C, (size_t)M * N, -1, 1);
                    for (size_t i = 0; i < (size_t)M * N; i++) want[i] = C[i];
                    if (betas[ib] == 0.0f)   /* beta = 0 must not read C */
                        for (size_t i = 0; i < (size_t)M * N; i++) C[i] = NAN;
                    ref_gemm(want, A, B, M, N, K, ta, tb, alphas[ia], betas[ib]);
                    gemm(C, A, B, M, N, K, ta, tb, alphas[ia], betas[ib]);
                    snprintf(what, sizeof what, "%s M%d N%d K%d ta%d tb%d alpha %g beta %g",
                             name, M, N, K, ta, tb, (double)alphas[ia], (double)betas[ib]);
                    expect_close(what, C, want, (size_t)M * N, 1e-5, 1e-5 * (K > 64 ? 4 : 1));
                }
    free(A), free(B), free(C), free(want);
}

Test(ops, gemm_all_transposes_and_betas) {
    /* one block; the k-unroll remainder; every block edge crossed (32 x 128 x 128 blocks) */
    check_gemm(table_gemm, "table gemm", 3, 5, 7);
    check_gemm(table_gemm, "table gemm", 1, 1, 1);
    check_gemm(table_gemm, "table gemm", 37, 133, 259);
    check_gemm(mc_cpu_gemm_blocked, "blocked gemm", 65, 129, 130);
    check_gemm(mc_cpu_gemm_blocked, "blocked gemm", 33, 4, 3);
}

Test(ops, gemm_k_zero_scales_c) {
    float C[6] = {1, 2, 3, 4, 5, 6}, A[1] = {0}, B[1] = {0};
    mc_cpu_gemm_blocked(C, A, B, 2, 3, 0, 0, 0, 1.0f, 0.5f);
    for (int i = 0; i < 6; i++) cr_expect_eq(C[i], 0.5f * (float)(i + 1));
}

/* A column-parallel shard (a slice of the columns of op(B)) gives the same columns of C bit
   for bit, whatever the transposes; so does a block of rows. */
Test(ops, gemm_column_and_row_shards_are_bitwise_equal) {
    const int M = 45, N = 300, K = 150, lo = 77, width = 140, rlo = 9, rows = 30;
    float *A = falloc(M * K), *B = falloc(K * N), *C = falloc(M * N);
    float *Bs = falloc(K * width), *Cs = falloc(M * width), *Cr = falloc(rows * N);
    seed_inputs(5);
    fill_rand(A, M * K, -1, 1);
    fill_rand(B, K * N, -1, 1);
    for (int tb = 0; tb < 2; tb++) {
        /* shard of op(B) columns lo .. lo + width */
        for (int k = 0; k < K; k++)
            for (int j = 0; j < width; j++) {
                if (!tb) Bs[k * width + j] = B[k * N + lo + j];
                else Bs[j * K + k] = B[(lo + j) * K + k];   /* B^T stored [N, K] */
            }
        mc_cpu_gemm_blocked(C, A, B, M, N, K, 0, tb, 1.0f, 0.0f);
        mc_cpu_gemm_blocked(Cs, A, Bs, M, width, K, 0, tb, 1.0f, 0.0f);
        int diff = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < width; j++) diff += C[i * N + lo + j] != Cs[i * width + j];
        cr_expect_eq(diff, 0, "tb %d: %d elements of the column shard differ", tb, diff);
        mc_cpu_gemm_blocked(Cr, A + rlo * K, B, rows, N, K, 0, tb, 1.0f, 0.0f);
        cr_expect(memcmp(Cr, C + rlo * N, sizeof(float) * rows * N) == 0, "row block differs");
    }
    free(A), free(B), free(C), free(Bs), free(Cs), free(Cr);
}

/* ---------------------------------------------------------------------------------------------
   LayerNorm */

typedef struct ln_ctx {
    int N, C, which;       /* which input the FD varies: 0 inp, 1 weight, 2 bias */
    double *x, *w, *b, *dout, eps;
} ln_ctx;

static void ref_layernorm(double *out, const double *x, const double *w, const double *b, int N,
                          int C, double eps) {
    for (int n = 0; n < N; n++) {
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x[n * C + c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
        v /= C;
        for (int c = 0; c < C; c++)
            out[n * C + c] = (x[n * C + c] - m) / sqrt(v + eps) * w[c] + b[c];
    }
}

static double ln_loss(const double *p, void *vctx) {
    ln_ctx *c = (ln_ctx *)vctx;
    double *out = dalloc((size_t)c->N * c->C);
    ref_layernorm(out, c->which == 0 ? p : c->x, c->which == 1 ? p : c->w,
                  c->which == 2 ? p : c->b, c->N, c->C, c->eps);
    double s = weighted_sum(out, c->dout, (size_t)c->N * c->C);
    free(out);
    return s;
}

static void check_layernorm(int N, int C) {
    const mc_ops *ops = mc_ops_cpu();
    size_t nc = (size_t)N * C;
    float *x = falloc(nc), *w = falloc(C), *b = falloc(C), *out = falloc(nc), *dout = falloc(nc);
    float *mean = falloc(N), *rstd = falloc(N), *dx = falloc(nc), *dw = falloc(C), *db = falloc(C);
    float eps = 1e-5f;
    char what[96];
    seed_inputs((uint64_t)(N * 100 + C));
    fill_rand(x, nc, -2, 3);
    fill_rand(w, C, 0.5, 1.5);
    fill_rand(b, C, -0.5, 0.5);
    fill_rand(dout, nc, -1, 1);
    /* gradients accumulate: start from known non-zero values */
    fill_rand(dx, nc, -1, 1);
    fill_rand(dw, C, -1, 1);
    fill_rand(db, C, -1, 1);
    double *dx0 = to_double(dx, nc), *dw0 = to_double(dw, C), *db0 = to_double(db, C);
    ln_ctx ctx = {N, C, 0, to_double(x, nc), to_double(w, C), to_double(b, C),
                  to_double(dout, nc), (double)eps};
    double *want = dalloc(nc);
    ref_layernorm(want, ctx.x, ctx.w, ctx.b, N, C, ctx.eps);
    ops->layernorm_forward(ops, out, mean, rstd, x, w, b, N, C, eps, MC_F32);
    snprintf(what, sizeof what, "layernorm forward N%d C%d", N, C);
    expect_close(what, out, want, nc, 1e-5, 1e-5);

    ops->layernorm_backward(ops, dx, dw, db, dout, x, w, mean, rstd, N, C, MC_F32);
    double *fd = dalloc(nc);
    finite_diff(fd, ctx.x, nc, ln_loss, &ctx, FD_H);
    for (size_t i = 0; i < nc; i++) fd[i] += dx0[i];
    snprintf(what, sizeof what, "layernorm dinp N%d C%d", N, C);
    expect_close(what, dx, fd, nc, FD_ATOL, FD_RTOL);
    ctx.which = 1;
    finite_diff(fd, ctx.w, C, ln_loss, &ctx, FD_H);
    for (int i = 0; i < C; i++) fd[i] += dw0[i];
    snprintf(what, sizeof what, "layernorm dweight N%d C%d", N, C);
    expect_close(what, dw, fd, C, FD_ATOL, FD_RTOL);
    ctx.which = 2;
    finite_diff(fd, ctx.b, C, ln_loss, &ctx, FD_H);
    for (int i = 0; i < C; i++) fd[i] += db0[i];
    snprintf(what, sizeof what, "layernorm dbias N%d C%d", N, C);
    expect_close(what, db, fd, C, FD_ATOL, FD_RTOL);

    free(x), free(w), free(b), free(out), free(dout), free(mean), free(rstd), free(dx);
    free(dw), free(db), free(dx0), free(dw0), free(db0), free(ctx.x), free(ctx.w), free(ctx.b);
    free(ctx.dout), free(want), free(fd);
}

Test(ops, layernorm_forward_backward_vs_fp64) {
    check_layernorm(1, 1 + 7);
    check_layernorm(6, 13);
    check_layernorm(11, 32);
}

/* ---------------------------------------------------------------------------------------------
   GELU */

static double ref_gelu1(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
typedef struct vec_ctx {
    size_t n;
    double *dout;
} vec_ctx;
static double gelu_loss(const double *x, void *vctx) {
    vec_ctx *c = (vec_ctx *)vctx;
    double s = 0.0;
    for (size_t i = 0; i < c->n; i++) s += ref_gelu1(x[i]) * c->dout[i];
    return s;
}

Test(ops, gelu_forward_backward_vs_fp64) {
    const mc_ops *ops = mc_ops_cpu();
    size_t n = 203;
    float *x = falloc(n), *out = falloc(n), *dout = falloc(n), *dx = falloc(n);
    seed_inputs(7);
    fill_rand(x, n, -6, 6);
    x[0] = 0.0f, x[1] = 30.0f, x[2] = -30.0f;   /* saturated tanh */
    fill_rand(dout, n, -1, 1);
    double *want = dalloc(n), *xd = to_double(x, n), *fd = dalloc(n);
    for (size_t i = 0; i < n; i++) want[i] = ref_gelu1(xd[i]);
    ops->gelu_forward(ops, out, x, n, MC_F32);
    expect_close("gelu forward", out, want, n, 1e-6, 1e-5);
    fill_rand(dx, n, 100, 200);   /* overwritten, not accumulated */
    ops->gelu_backward(ops, dx, x, dout, n, MC_F32);
    vec_ctx ctx = {n, to_double(dout, n)};
    finite_diff(fd, xd, n, gelu_loss, &ctx, FD_H);
    expect_close("gelu backward", dx, fd, n, FD_ATOL, FD_RTOL);
    /* in place */
    ops->gelu_forward(ops, x, x, n, MC_F32);
    expect_close("gelu forward in place", x, want, n, 1e-6, 1e-5);
    free(x), free(out), free(dout), free(dx), free(want), free(xd), free(fd), free(ctx.dout);
}

/* The fused MLP ops (gemm_gelu_forward / _backward) against fp64, and bit for bit against
   their composition from gemm and gelu (the CPU table's contract: the unfused numbers). */
static void check_gemm_gelu(mc_dtype dt, int with_bias) {
    const mc_ops *ops = mc_ops_cpu();
    enum { M = 13, N = 24, K = 37 };
    float a[M * K], b[K * N], bias[N], pre_in[M * N];
    seed_inputs(11 + (uint64_t)dt + 2u * (uint64_t)with_bias);
    fill_rand(a, M * K, -0.4, 0.4);
    fill_rand(b, K * N, -0.4, 0.4);
    fill_rand(bias, N, -1, 1);
    fill_rand(pre_in, M * N, -4, 4);
    size_t es = mc_dtype_size(dt);
    char *ha = malloc(M * K * es), *hb = malloc(K * N * es), *hbias = malloc(N * es);
    char *hpre_in = malloc(M * N * es);
    cr_assert_eq(ops->copy(ops, ha, a, M * K, dt, MC_F32), MC_OK);
    cr_assert_eq(ops->copy(ops, hb, b, K * N, dt, MC_F32), MC_OK);
    cr_assert_eq(ops->copy(ops, hbias, bias, N, dt, MC_F32), MC_OK);
    cr_assert_eq(ops->copy(ops, hpre_in, pre_in, M * N, dt, MC_F32), MC_OK);
    char *out = malloc(M * N * es), *pre = malloc(M * N * es), *dpre = malloc(M * N * es);
    char *out2 = malloc(M * N * es), *pre2 = malloc(M * N * es), *dpre2 = malloc(M * N * es);
    const void *bp = with_bias ? hbias : NULL;
    /* A [M, K] row-major, B stored [N, K] (trans_b): the fc1 forward; the backward as fc2's
       dgrad, B stored [K, N] */
    cr_assert_eq(ops->gemm_gelu_forward(ops, out, pre, ha, hb, bp, M, N, K, 0, 1, dt), MC_OK);
    cr_assert_eq(ops->gemm(ops, pre2, ha, hb, bp, M, N, K, 0, 1, 1.0f, 0.0f, dt, dt), MC_OK);
    cr_assert_eq(ops->gelu_forward(ops, out2, pre2, M * N, dt), MC_OK);
    cr_expect_eq(memcmp(pre, pre2, M * N * es), 0, "pre differs from gemm's (dt %d)", (int)dt);
    cr_expect_eq(memcmp(out, out2, M * N * es), 0, "out differs from gemm + gelu (dt %d)",
                 (int)dt);
    cr_assert_eq(ops->gemm_gelu_backward(ops, dpre, hpre_in, ha, hb, M, N, K, 0, 0, dt), MC_OK);
    cr_assert_eq(ops->gemm(ops, dpre2, ha, hb, NULL, M, N, K, 0, 0, 1.0f, 0.0f, dt, dt), MC_OK);
    cr_assert_eq(ops->gelu_backward(ops, out2, hpre_in, dpre2, M * N, dt), MC_OK);
    cr_expect_eq(memcmp(dpre, out2, M * N * es), 0, "dpre differs from gemm + gelu_backward "
                 "(dt %d)", (int)dt);
    if (dt == MC_F32) {   /* the numbers themselves, against fp64 */
        double want_out[M * N], want_d[M * N];
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double y = with_bias ? bias[n] : 0.0, g = 0.0;
                for (int k = 0; k < K; k++) {
                    y += (double)a[m * K + k] * b[n * K + k];
                    g += (double)a[m * K + k] * b[k * N + n];
                }
                double x = pre_in[m * N + n], h = 1e-4;
                want_out[m * N + n] = ref_gelu1(y);
                want_d[m * N + n] = g * (ref_gelu1(x + h) - ref_gelu1(x - h)) / (2 * h);
            }
        expect_close("gemm_gelu_forward out", (const float *)out, want_out, M * N, 1e-5, 1e-4);
        expect_close("gemm_gelu_backward dpre", (const float *)dpre, want_d, M * N, 1e-4, 1e-3);
    }
    free(ha), free(hb), free(hbias), free(hpre_in);
    free(out), free(pre), free(dpre), free(out2), free(pre2), free(dpre2);
}

Test(ops, gemm_gelu_is_gemm_then_gelu) {
    check_gemm_gelu(MC_F32, 1);
    check_gemm_gelu(MC_F32, 0);
    check_gemm_gelu(MC_BF16, 1);
    check_gemm_gelu(MC_BF16, 0);
}

/* ---------------------------------------------------------------------------------------------
   dropout */

Test(ops, dropout_mask_is_philox_and_keeps_one_minus_p) {
    const mc_ops *ops = mc_ops_cpu();
    size_t n = 200003;
    float p = 0.3f;
    uint64_t seed = 4321, offset = 1000;   /* a multiple of 4: equals a fresh stream draw */
    float *x = falloc(n), *out = falloc(n), *again = falloc(n);
    uint8_t *mask = (uint8_t *)malloc(n);
    seed_inputs(8);
    fill_rand(x, n, 0.5, 1.5);   /* never 0, so a 0 output means dropped */
    ops->dropout_forward(ops, out, x, n, p, seed, offset, MC_F32);
    mc_rng rng = {seed, offset};
    cr_assert_eq(mc_rng_dropout_mask(&rng, mask, n, p), MC_OK);
    size_t kept = 0, mismatch = 0;
    for (size_t i = 0; i < n; i++) {
        int k = out[i] != 0.0f;
        kept += (size_t)k;
        mismatch += (size_t)(k != mask[i]);
        if (k) cr_expect_eq(out[i], x[i] * (1.0f / (1.0f - p)), "scale at %zu", i);
    }
    cr_expect_eq(mismatch, 0, "%zu elements differ from mc_rng_dropout_mask", mismatch);
    double frac = (double)kept / (double)n;   /* sd = sqrt(p(1-p)/n) ~ 0.001 */
    cr_expect(fabs(frac - (1.0 - p)) < 0.006, "kept fraction %.4f, want ~%.2f", frac, 1.0 - p);
    /* reproducible; a different offset or seed gives a different mask */
    ops->dropout_forward(ops, again, x, n, p, seed, offset, MC_F32);
    cr_expect(memcmp(out, again, n * sizeof(float)) == 0, "same (seed, offset), other mask");
    ops->dropout_forward(ops, again, x, n, p, seed, offset + 4, MC_F32);
    cr_expect(memcmp(out, again, n * sizeof(float)) != 0, "offset ignored");
    ops->dropout_forward(ops, again, x, n, p, seed + 1, offset, MC_F32);
    cr_expect(memcmp(out, again, n * sizeof(float)) != 0, "seed ignored");
    /* any offset (not a multiple of 4): element i follows mc_rng_uniform_at(seed, offset + i) */
    ops->dropout_forward(ops, again, x, 1000, p, seed, 7, MC_F32);
    for (size_t i = 0; i < 1000; i++)
        cr_expect_eq(again[i] != 0.0f, mc_rng_uniform_at(seed, 7 + i) >= p, "offset 7, %zu", i);
    free(x), free(out), free(again), free(mask);
}

Test(ops, dropout_backward_uses_the_same_mask_and_edge_probabilities) {
    const mc_ops *ops = mc_ops_cpu();
    size_t n = 517;
    float *x = falloc(n), *out = falloc(n), *dout = falloc(n), *dx = falloc(n);
    seed_inputs(9);
    fill_rand(x, n, 0.5, 1.5);
    fill_rand(dout, n, 0.5, 1.5);
    ops->dropout_forward(ops, out, x, n, 0.5f, 99, 13, MC_F32);
    ops->dropout_backward(ops, dx, dout, n, 0.5f, 99, 13, MC_F32);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(out[i] != 0.0f, dx[i] != 0.0f, "mask differs at %zu", i);
        if (dx[i] != 0.0f) cr_expect_eq(dx[i], dout[i] * 2.0f);
    }
    ops->dropout_forward(ops, out, x, n, 0.0f, 99, 13, MC_F32);   /* p = 0: identity */
    cr_expect(memcmp(out, x, n * sizeof(float)) == 0, "p = 0 is not the identity");
    ops->dropout_forward(ops, out, x, n, 1.0f, 99, 13,
                         MC_F32);   /* p = 1: all dropped, no inf/NaN */
    for (size_t i = 0; i < n; i++) cr_expect_eq(out[i], 0.0f, "p = 1 at %zu: %g", i, out[i]);
    ops->dropout_forward(ops, x, x, n, 0.5f, 99, 13, MC_F32);     /* in place */
    ops->dropout_forward(ops, out, dout, n, 0.5f, 99, 13, MC_F32);
    for (size_t i = 0; i < n; i++) cr_expect_eq(x[i] != 0.0f, out[i] != 0.0f);
    free(x), free(out), free(dout), free(dx);
}

/* ---------------------------------------------------------------------------------------------
   causal attention */

typedef struct attn_ctx {
    int S, B, NH, HD;
    double p;
    uint64_t seed, offset;
    double *dout;
} attn_ctx;

/* out[S,B,NH*HD], probs[B,NH,S,S] (may be NULL) from qkv[S,B,NH*3*HD], naive fp64 */
static void ref_attention(double *out, double *probs, const double *qkv, const attn_ctx *c) {
    int S = c->S, B = c->B, NH = c->NH, HD = c->HD;
    double *row = dalloc(S);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < S; t++) {
                double mx = -INFINITY, sum = 0.0;
                for (int u = 0; u <= t; u++) {
                    double s = 0.0;
                    for (int d = 0; d < HD; d++)
                        s += qkv[((size_t)t * B + b) * NH * 3 * HD + h * 3 * HD + d] *
                             qkv[((size_t)u * B + b) * NH * 3 * HD + h * 3 * HD + HD + d];
                    row[u] = s / sqrt((double)HD);
                    if (row[u] > mx) mx = row[u];
                }
                for (int u = 0; u <= t; u++) sum += (row[u] = exp(row[u] - mx));
                size_t prow = (((size_t)b * NH + h) * S + t) * S;
                for (int u = 0; u < S; u++) {
                    double pr = u <= t ? row[u] / sum : 0.0;
                    if (probs) probs[prow + u] = pr;
                    row[u] = pr;
                }
                for (int d = 0; d < HD; d++) {
                    double o = 0.0;
                    for (int u = 0; u <= t; u++) {
                        double w = row[u];
                        if (c->p > 0.0)
                            w = mc_rng_uniform_at(c->seed, c->offset + prow + u) >= (float)c->p
                                    ? w / (1.0 - c->p)
                                    : 0.0;
                        o += w * qkv[((size_t)u * B + b) * NH * 3 * HD + h * 3 * HD + 2 * HD + d];
                    }
                    out[((size_t)t * B + b) * NH * HD + h * HD + d] = o;
                }
            }
    free(row);
}

static double attn_loss(const double *qkv, void *vctx) {
    attn_ctx *c = (attn_ctx *)vctx;
    size_t n = (size_t)c->S * c->B * c->NH * c->HD;
    double *out = dalloc(n);
    ref_attention(out, NULL, qkv, c);
    double s = weighted_sum(out, c->dout, n);
    free(out);
    return s;
}

static void check_attention(int S, int B, int NH, int HD, float p) {
    const mc_ops *ops = mc_ops_cpu();
    size_t nqkv = (size_t)S * B * NH * 3 * HD, nout = (size_t)S * B * NH * HD;
    size_t nprobs = (size_t)B * NH * S * S;
    float *qkv = falloc(nqkv), *out = falloc(nout), *probs = falloc(nprobs);
    float *dout = falloc(nout), *dqkv = falloc(nqkv);
    char what[128];
    attn_ctx ctx = {S, B, NH, HD, (double)p, 2024, 36, NULL};
    seed_inputs((uint64_t)(S * 1000 + B * 100 + NH * 10 + HD));
    fill_rand(qkv, nqkv, -1.5, 1.5);
    fill_rand(dout, nout, -1, 1);
    fill_rand(probs, nprobs, 5, 6);   /* garbage that the forward must overwrite */
    ctx.dout = to_double(dout, nout);
    double *qd = to_double(qkv, nqkv), *want = dalloc(nout), *want_p = dalloc(nprobs);
    ref_attention(want, want_p, qd, &ctx);
    ops->attention_forward(ops, out, probs, qkv, S, B, NH, HD, p, ctx.seed, ctx.offset, MC_F32);
    snprintf(what, sizeof what, "attention forward S%d B%d NH%d HD%d p%g", S, B, NH, HD, (double)p);
    expect_close(what, out, want, nout, 1e-5, 1e-5);
    snprintf(what, sizeof what, "attention probs S%d B%d NH%d HD%d", S, B, NH, HD);
    expect_close(what, probs, want_p, nprobs, 1e-6, 1e-5);

    fill_rand(dqkv, nqkv, 7, 8);      /* overwritten */
    ops->attention_backward(ops, dqkv, dout, qkv, out, probs, S, B, NH, HD, p, ctx.seed, ctx.offset,
                            MC_F32);
    double *fd = dalloc(nqkv);
    finite_diff(fd, qd, nqkv, attn_loss, &ctx, FD_H);
    snprintf(what, sizeof what, "attention dqkv S%d B%d NH%d HD%d p%g", S, B, NH, HD, (double)p);
    expect_close(what, dqkv, fd, nqkv, FD_ATOL, FD_RTOL);
    free(qkv), free(out), free(probs), free(dout), free(dqkv), free(ctx.dout), free(qd);
    free(want), free(want_p), free(fd);
}

Test(ops, attention_forward_backward_vs_fp64) {
    check_attention(1, 1, 1, 2, 0.0f);
    check_attention(5, 2, 3, 4, 0.0f);
    check_attention(7, 3, 2, 3, 0.0f);
    check_attention(9, 1, 1, 8, 0.0f);
}

Test(ops, attention_with_probability_dropout_vs_fp64) {
    check_attention(5, 2, 3, 4, 0.25f);
    check_attention(7, 3, 2, 3, 0.5f);
}

/* The mask index is the position in probs [B,NH,S,S] plus the offset: shifting the offset by
   the size of one head's block equals moving to the next head. */
Test(ops, attention_dropout_mask_follows_probs_index) {
    const mc_ops *ops = mc_ops_cpu();
    int S = 6, B = 1, NH = 2, HD = 4;
    size_t nqkv = (size_t)S * B * NH * 3 * HD, nout = (size_t)S * B * NH * HD;
    float *qkv = falloc(nqkv), *out = falloc(nout), *probs = falloc((size_t)NH * S * S);
    float *qkv1 = falloc(nqkv / 2), *out1 = falloc(nout / 2), *probs1 = falloc((size_t)S * S);
    seed_inputs(77);
    fill_rand(qkv, nqkv, -1, 1);
    ops->attention_forward(ops, out, probs, qkv, S, B, NH, HD, 0.4f, 5, 0, MC_F32);
    /* head 1 alone (NH = 1) with offset S*S reproduces head 1 of the two-head call */
    for (int s = 0; s < S; s++) memcpy(qkv1 + s * 3 * HD, qkv + s * 6 * HD + 3 * HD, 3 * HD * 4);
    ops->attention_forward(ops, out1, probs1, qkv1, S, B, 1, HD, 0.4f, 5, (uint64_t)S * S, MC_F32);
    for (int s = 0; s < S; s++)
        for (int d = 0; d < HD; d++)
            cr_expect_eq(out1[s * HD + d], out[s * 2 * HD + HD + d], "s %d d %d", s, d);
    free(qkv), free(out), free(probs), free(qkv1), free(out1), free(probs1);
}

/* ---------------------------------------------------------------------------------------------
   embedding */

Test(ops, embedding_forward_backward_with_vocab_range) {
    const mc_ops *ops = mc_ops_cpu();
    int N = 9, C = 5, start = 4, end = 10, Vl = end - start;
    int ids[9] = {0, 4, 9, 10, 5, 5, 13, 3, 4};
    float *table = falloc(Vl * C), *out = falloc(N * C), *dout = falloc(N * C);
    float *dtable = falloc(Vl * C);
    seed_inputs(10);
    fill_rand(table, Vl * C, -1, 1);
    fill_rand(out, N * C, 3, 4);   /* overwritten, rows outside the range too */
    fill_rand(dout, N * C, -1, 1);
    fill_rand(dtable, Vl * C, -1, 1);
    double *want = dalloc(N * C), *want_dt = to_double(dtable, Vl * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            int local = ids[n] >= start && ids[n] < end;
            want[n * C + c] = local ? table[(ids[n] - start) * C + c] : 0.0;
            if (local) want_dt[(ids[n] - start) * C + c] += dout[n * C + c];
        }
    ops->embedding_forward(ops, out, ids, table, N, C, start, end, MC_F32);
    expect_close("embedding forward", out, want, N * C, 0, 0);
    ops->embedding_backward(ops, dtable, dout, ids, N, C, start, end, MC_F32);
    expect_close("embedding backward accumulates", dtable, want_dt, Vl * C, 1e-6, 1e-6);
    free(table), free(out), free(dout), free(dtable), free(want), free(want_dt);
}

/* ---------------------------------------------------------------------------------------------
   cross entropy: the vocab-parallel composition over two uneven shards of V = 11 */

typedef struct ce_ctx {
    int N, V;
    const int *targets;
    double s;
    double *dloss;
} ce_ctx;

/* sum_n dloss[n] * loss_n, loss_n = (1-s)(lse - x_t) + s(lse - mean_j x_j) */
static double ref_ce_loss(const double *logits, void *vctx) {
    ce_ctx *c = (ce_ctx *)vctx;
    double total = 0.0;
    for (int n = 0; n < c->N; n++) {
        const double *l = logits + (size_t)n * c->V;
        double mx = -INFINITY, z = 0.0, mean = 0.0;
        for (int j = 0; j < c->V; j++) mx = l[j] > mx ? l[j] : mx;
        for (int j = 0; j < c->V; j++) z += exp(l[j] - mx), mean += l[j] / c->V;
        double lse = log(z) + mx;
        double loss = (1.0 - c->s) * (lse - l[c->targets[n]]) + c->s * (lse - mean);
        total += c->dloss[n] * loss;
    }
    return total;
}

static void check_cross_entropy(float smoothing) {
    const mc_ops *ops = mc_ops_cpu();
    enum { N = 6, V = 11, V0 = 6, V1 = 5 };
    int targets[N] = {0, 5, 6, 10, 3, 7};
    float logits[N * V], sh[2][N * V0], dl[N * V], dsh[2][N * V0], dloss[N];
    float mx[2][N], xt[2][N], z[2][N], rs[2][N], gmax[N], gz[N], loss[N];
    const int starts[2] = {0, V0}, widths[2] = {V0, V1};
    char what[96];
    seed_inputs(11);
    fill_rand(logits, N * V, -4, 4);
    logits[1 * V + 5] = 9.0f;   /* a dominant target */
    fill_rand(dloss, N, 0.2, 1.2);
    for (int r = 0; r < 2; r++)
        for (int n = 0; n < N; n++)
            memcpy(sh[r] + n * widths[r], logits + n * V + starts[r], sizeof(float) * widths[r]);
    /* forward pieces on each shard, combined as the three TP all-reduces would */
    for (int r = 0; r < 2; r++) ops->row_max(ops, mx[r], sh[r], N, widths[r], MC_F32);
    for (int n = 0; n < N; n++) gmax[n] = mx[0][n] > mx[1][n] ? mx[0][n] : mx[1][n];
    for (int r = 0; r < 2; r++) {
        ops->target_logit(ops, xt[r], sh[r], targets, N, widths[r], starts[r], MC_F32);
        ops->sum_exp(ops, z[r], sh[r], gmax, N, widths[r], MC_F32);
        ops->row_sum(ops, rs[r], sh[r], N, widths[r], MC_F32);
    }
    ce_ctx ctx = {N, V, targets, (double)smoothing, to_double(dloss, N)};
    double *ld = to_double(logits, N * V), want_loss[N];
    for (int n = 0; n < N; n++) {
        double one = 1.0;
        ce_ctx row = {1, V, targets + n, (double)smoothing, &one};   /* row n alone */
        want_loss[n] = ref_ce_loss(ld + n * V, &row);
        gz[n] = z[0][n] + z[1][n];
        float lse = logf(gz[n]) + gmax[n], x_t = xt[0][n] + xt[1][n];
        float mean_logp = (rs[0][n] + rs[1][n]) / (float)V - lse;
        loss[n] = (1.0f - smoothing) * (lse - x_t) - smoothing * mean_logp;
        /* exactly one shard owns the target */
        cr_expect_eq((xt[0][n] != 0.0f) + (xt[1][n] != 0.0f), 1, "target logit row %d", n);
    }
    snprintf(what, sizeof what, "cross entropy loss from pieces, s %g", (double)smoothing);
    expect_close(what, loss, want_loss, N, 1e-5, 1e-5);
    /* the combine op: the same losses from the reduced pieces, and their sum */
    float xt_all[N], rs_all[N], op_loss[N];
    double op_sum = -1.0, want_sum = 0.0;
    for (int n = 0; n < N; n++) {
        xt_all[n] = xt[0][n] + xt[1][n];
        rs_all[n] = rs[0][n] + rs[1][n];
        want_sum += want_loss[n];
    }
    cr_expect_eq(ops->cross_entropy_loss(ops, op_loss, &op_sum, gmax, gz, xt_all,
                                         smoothing > 0.0f ? rs_all : NULL, N, V, smoothing),
                 MC_OK);
    snprintf(what, sizeof what, "cross_entropy_loss op, s %g", (double)smoothing);
    expect_close(what, op_loss, want_loss, N, 1e-5, 1e-5);
    cr_expect(fabs(op_sum - want_sum) <= 1e-5 * fabs(want_sum), "loss sum %.9g, want %.9g",
              op_sum, want_sum);

    for (int r = 0; r < 2; r++)
        ops->cross_entropy_backward(ops, dsh[r], sh[r], gmax, gz, targets, dloss, N, widths[r],
                                    starts[r], smoothing, V, MC_F32);
    for (int r = 0; r < 2; r++)
        for (int n = 0; n < N; n++)
            memcpy(dl + n * V + starts[r], dsh[r] + n * widths[r], sizeof(float) * widths[r]);
    double fd[N * V];
    finite_diff(fd, ld, N * V, ref_ce_loss, &ctx, FD_H);
    snprintf(what, sizeof what, "cross entropy backward over 2 shards, s %g", (double)smoothing);
    expect_close(what, dl, fd, N * V, 1e-5, 1e-4);
    /* one shard holding the whole vocabulary gives the same gradient */
    float dfull[N * V];
    ops->cross_entropy_backward(ops, dfull, logits, gmax, gz, targets, dloss, N, V, 0, smoothing, V,
                                MC_F32);
    expect_close("cross entropy backward unsharded", dfull, fd, N * V, 1e-5, 1e-4);
    free(ctx.dloss), free(ld);
}

Test(ops, cross_entropy_pieces_and_backward_vs_fp64) {
    check_cross_entropy(0.0f);
    check_cross_entropy(0.1f);
}

Test(ops, cross_entropy_ignores_targets_outside_the_shard) {
    const mc_ops *ops = mc_ops_cpu();
    float logits[2 * 3] = {1, 2, 3, 0, 0, 0}, mx[2], xt[2], z[2], d[6], dloss[2] = {1, 0};
    int targets[2] = {7, -100};   /* not in [4, 7); an ignore id */
    ops->row_max(ops, mx, logits, 2, 3, MC_F32);
    ops->target_logit(ops, xt, logits, targets, 2, 3, 4, MC_F32);
    cr_expect_eq(xt[0], 0.0f);
    cr_expect_eq(xt[1], 0.0f);
    ops->sum_exp(ops, z, logits, mx, 2, 3, MC_F32);
    ops->cross_entropy_backward(ops, d, logits, mx, z, targets, dloss, 2, 3, 4, 0.0f, 3, MC_F32);
    double s = 0.0;
    for (int j = 0; j < 3; j++) s += d[j];
    cr_expect(fabs(s - 1.0) < 1e-6, "no one-hot: the row sums to 1 (softmax), got %g", s);
    for (int j = 3; j < 6; j++) cr_expect_eq(d[j], 0.0f, "dloss 0 row");
}

/* ---------------------------------------------------------------------------------------------
   AdamW */

Test(ops, adamw_one_and_several_steps_vs_fp64) {
    const mc_ops *ops = mc_ops_cpu();
    enum { n = 37, steps = 5 };
    float p[n], m[n], v[n], g[n];
    double pd[n], md[n], vd[n];
    const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    seed_inputs(12);
    fill_rand(p, n, -1, 1);
    for (int i = 0; i < n; i++) m[i] = v[i] = 0.0f, pd[i] = p[i], md[i] = vd[i] = 0.0;
    for (int step = 1; step <= steps; step++) {
        char what[64];
        fill_rand(g, n, -0.5, 0.5);
        if (step == 2) g[0] = 0.0f;   /* a zero gradient still decays */
        for (int i = 0; i < n; i++) {
            md[i] = b1 * md[i] + (1 - b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
            double mh = md[i] / (1 - pow(b1, step)), vh = vd[i] / (1 - pow(b2, step));
            pd[i] = pd[i] - lr * wd * pd[i] - lr * mh / (sqrt(vh) + eps);
        }
        mc_adamw_step h = {(float)lr, (float)b1, (float)b2, (float)eps, step};
        mc_adamw_span span = {0, 0, 0, n, (float)wd};
        ops->adamw(ops, p, g, m, v, NULL, &span, 1, &h, MC_F32);
        snprintf(what, sizeof what, "adamw param after step %d", step);
        expect_close(what, p, pd, n, 1e-6, 1e-5);
        snprintf(what, sizeof what, "adamw m after step %d", step);
        expect_close(what, m, md, n, 1e-7, 1e-5);
        snprintf(what, sizeof what, "adamw v after step %d", step);
        expect_close(what, v, vd, n, 1e-9, 1e-5);
    }
    /* the first step moves every parameter by about lr (|m_hat / sqrt(v_hat)| = 1) */
}

Test(ops, adamw_first_step_is_sign_times_lr) {
    const mc_ops *ops = mc_ops_cpu();
    float p[4] = {1, -1, 2, 0}, g[4] = {0.3f, -0.2f, -5.0f, 1e-3f}, m[4] = {0}, v[4] = {0};
    mc_adamw_step h = {0.01f, 0.9f, 0.999f, 1e-12f, 1};
    mc_adamw_span span = {0, 0, 0, 4, 0.0f};
    ops->adamw(ops, p, g, m, v, NULL, &span, 1, &h, MC_F32);
    double want[4] = {0.99, -0.99, 2.01, -0.01};
    expect_close("adamw step 1", p, want, 4, 1e-6, 1e-5);
}

/* ---------------------------------------------------------------------------------------------
   bf16 storage: round to nearest even, and the bf16 path of the ops is the fp32 math on the
   rounded values, rounded once at the end */

Test(ops, bf16_rounds_to_nearest_even) {
    cr_expect_eq(mc_bf16_from_float(1.0f), 0x3F80);
    cr_expect_eq(mc_bf16_from_float(1.0f + 1.0f / 256.0f), 0x3F80, "halfway: ties to even (down)");
    cr_expect_eq(mc_bf16_from_float(1.0f + 3.0f / 256.0f), 0x3F82, "halfway: ties to even (up)");
    cr_expect_eq(mc_bf16_from_float(1.0f + 1.5f / 256.0f), 0x3F81, "above halfway rounds up");
    cr_expect_eq(mc_bf16_from_float(-2.0f), 0xC000);
    cr_expect_eq(mc_bf16_from_float(INFINITY), 0x7F80);
    cr_expect_eq(mc_bf16_from_float(3.4e38f), 0x7F80, "overflow rounds to inf");
    mc_bf16 nan = mc_bf16_from_float(NAN);
    cr_expect((nan & 0x7F80) == 0x7F80 && (nan & 0x007F) != 0, "NaN stays NaN (0x%04x)", nan);
    for (int i = -300; i <= 300; i++) {   /* bf16 values convert back exactly */
        float x = (float)i * 0.37f;
        float r = mc_bf16_to_float(mc_bf16_from_float(x));
        cr_expect(fabsf(r - x) <= fabsf(x) / 256.0f, "%g -> %g", (double)x, (double)r);
        cr_expect_eq(mc_bf16_to_float(mc_bf16_from_float(r)), r);
    }
}

static void to_bf16(mc_bf16 *dst, float *src, size_t n) {   /* src becomes the rounded values */
    for (size_t i = 0; i < n; i++) {
        dst[i] = mc_bf16_from_float(src[i]);
        src[i] = mc_bf16_to_float(dst[i]);
    }
}

/* got (bf16) must be the fp32 result rounded once: within half a bf16 ulp */
static void expect_bf16_of(const char *what, const mc_bf16 *got, const float *want, size_t n) {
    size_t bad = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != mc_bf16_from_float(want[i])) {
            if (!bad) worst = i;
            bad++;
        }
    cr_expect(bad == 0, "%s: %zu of %zu values are not the rounded fp32 result; first [%zu] "
              "got %g want %g", what, bad, n, worst, n ? (double)mc_bf16_to_float(got[worst]) : 0.0,
              n ? (double)want[worst] : 0.0);
}

Test(ops, bf16_path_is_fp32_math_rounded_once) {
    const mc_ops *ops = mc_ops_cpu();
    enum { M = 9, K = 37, N = 13, S = 5, B = 2, NH = 2, HD = 4 };
    float a[M * K], b[N * K], bias[N], c[M * N];
    mc_bf16 ab[M * K], bb[N * K], biasb[N], cb[M * N];
    seed_inputs(31);
    fill_rand(a, M * K, -1, 1);
    fill_rand(b, N * K, -1, 1);
    fill_rand(bias, N, -1, 1);
    to_bf16(ab, a, M * K);
    to_bf16(bb, b, N * K);
    to_bf16(biasb, bias, N);
    cr_assert_eq(ops->gemm(ops, c, a, b, bias, M, N, K, 0, 1, 1.0f, 0.0f, MC_F32, MC_F32), MC_OK);
    cr_assert_eq(ops->gemm(ops, cb, ab, bb, biasb, M, N, K, 0, 1, 1.0f, 0.0f, MC_BF16, MC_BF16),
                 MC_OK);
    expect_bf16_of("gemm bf16", cb, c, M * N);
    /* bf16 inputs into an fp32 accumulator (the weight gradient): exactly the fp32 product */
    float cf[M * N];
    memset(cf, 0, sizeof cf);
    cr_assert_eq(ops->gemm(ops, cf, ab, bb, NULL, M, N, K, 0, 1, 1.0f, 1.0f, MC_F32, MC_BF16),
                 MC_OK);
    cr_assert_eq(ops->gemm(ops, c, a, b, NULL, M, N, K, 0, 1, 1.0f, 0.0f, MC_F32, MC_F32), MC_OK);
    expect_close("gemm bf16 -> fp32", cf, to_double(c, M * N), M * N, 0, 0);

    /* layernorm, gelu and attention: the same contract */
    float x[S * B * NH * 3 * HD], w[K], y[S * B * NH * 3 * HD], mean[S * B], rstd[S * B];
    mc_bf16 xb[S * B * NH * 3 * HD], wb[K], yb[S * B * NH * 3 * HD];
    float mb[S * B], rb[S * B];
    fill_rand(x, sizeof x / sizeof x[0], -2, 2);
    fill_rand(w, K, 0.5, 1.5);
    to_bf16(xb, x, sizeof x / sizeof x[0]);
    to_bf16(wb, w, K);
    ops->layernorm_forward(ops, y, mean, rstd, x, w, NULL, 2, K, 1e-5f, MC_F32);
    ops->layernorm_forward(ops, yb, mb, rb, xb, wb, NULL, 2, K, 1e-5f, MC_BF16);
    expect_bf16_of("layernorm bf16", yb, y, 2 * K);
    cr_expect(mean[0] == mb[0] && rstd[1] == rb[1], "the statistics stay fp32");
    ops->gelu_forward(ops, y, x, 40, MC_F32);
    ops->gelu_forward(ops, yb, xb, 40, MC_BF16);
    expect_bf16_of("gelu bf16", yb, y, 40);
    size_t ns = ops->attention_stats(ops, S, B, NH, HD);
    float *pf = falloc(ns), *pb = falloc(ns);
    float att[S * B * NH * HD];
    mc_bf16 attb[S * B * NH * HD];
    ops->attention_forward(ops, att, pf, x, S, B, NH, HD, 0.25f, 77, 4, MC_F32);
    ops->attention_forward(ops, attb, pb, xb, S, B, NH, HD, 0.25f, 77, 4, MC_BF16);
    expect_bf16_of("attention bf16", attb, att, S * B * NH * HD);
    free(pf), free(pb);
    /* dtypes other than f32 / bf16 are refused with a message */
    cr_expect_eq(ops->gelu_forward(ops, y, x, 4, MC_I32), MC_ERR_INVALID_ARG);
    cr_expect(strstr(mc_last_error(), "MC_F32 or MC_BF16") != NULL, "%s", mc_last_error());
}

Test(ops, memory_upload_download_and_strided_copy) {
    const mc_ops *ops = mc_ops_cpu();
    float host[12], back[12];
    float *dev = NULL, *dst = NULL;
    for (int i = 0; i < 12; i++) host[i] = (float)i;
    cr_assert_eq(ops->alloc(ops, (void **)&dev, sizeof host), MC_OK);
    cr_assert_eq(ops->alloc(ops, (void **)&dst, sizeof host), MC_OK);
    cr_expect_eq(ops->upload(ops, dev, host, sizeof host), MC_OK);
    /* columns 1..2 of the [4, 3] matrix into a [4, 2] one: 4 rows of 8 bytes */
    cr_expect_eq(ops->copy_2d(ops, dst, 2 * sizeof(float), dev + 1, 3 * sizeof(float),
                              2 * sizeof(float), 4), MC_OK);
    cr_expect_eq(ops->download(ops, back, dst, 8 * sizeof(float)), MC_OK);
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 2; j++)
            cr_expect_eq(back[r * 2 + j], host[r * 3 + 1 + j], "row %d col %d", r, j);
    cr_expect_eq(ops->synchronize(ops), MC_OK);
    cr_expect(mc_ops_same_memory(ops, mc_ops_cpu()), "one CPU memory");
    ops->free(ops, dev);
    ops->free(ops, dst);
}

Test(ops, check_ids_names_the_bad_id) {
    const mc_ops *ops = mc_ops_cpu();
    int ids[4] = {0, 3, 8, 1};
    cr_expect_eq(ops->check_ids(ops, ids, 4, 8, "embedding", "ids"), MC_ERR_INVALID_ARG);
    cr_expect(strstr(mc_last_error(), "embedding: ids[2] = 8 is outside the vocabulary [0, 8)"),
              "%s", mc_last_error());
    cr_expect_eq(ops->check_ids(ops, ids, 2, 8, "embedding", "ids"), MC_OK);
}

/* ---------------------------------------------------------------------------------------------
   the fast table (mc_ops_cpu's default) against the reference table

   Shapes large enough that every op splits its work across the threads. Each op runs on the
   reference table, then on the fast table with 1, 2 and 3 threads. The documented contract:
   every op but gemm and sum_squares gives the reference's bits; gemm (a BLAS's summation
   order) is within GEMM_TOL * sum_k |a_ik b_kj| of it, sum_squares within 1e-12 relative; and
   whatever the thread count, the fast table gives the same bits as with 1 thread, except a
   BLAS gemm, which stays within the same tolerance of the reference at every thread count. */

#define GEMM_TOL 1e-5

static const int fast_threads[] = {1, 2, 3};
#define N_FAST ((int)(sizeof fast_threads / sizeof fast_threads[0]))

/* a[i] and b[i] have the same bits for every i < n; names the first that does not */
static int expect_same_bits(const char *what, int threads, const float *a, const float *b,
                            size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            cr_expect(0, "%s (fast, %d threads): element %zu is %.9g, the reference %.9g", what,
                      threads, i, (double)a[i], (double)b[i]);
            return 1;
        }
    return 0;
}

Test(ops, fast_elementwise_rows_and_attention_give_the_reference_bits) {
    enum { N = 300, C = 200, S = 33, B = 3, NH = 4, HD = 16, V = 700 };
    const size_t nc = (size_t)N * C, nqkv = (size_t)S * B * NH * 3 * HD;
    const mc_ops *ref = mc_ops_cpu_reference(), *fast = mc_ops_cpu_fast();
    float *x = falloc(nc), *dy = falloc(nc), *w = falloc(C), *bias = falloc(C);
    float *qkv = falloc(nqkv), *dout = falloc((size_t)S * B * NH * HD);
    float *logits = falloc((size_t)N * V);
    int ids[N], targets[N];
    seed_inputs(77);
    fill_rand(x, nc, -3, 3);
    fill_rand(dy, nc, -1, 1);
    fill_rand(w, C, 0.5, 1.5);
    fill_rand(bias, C, -0.5, 0.5);
    fill_rand(qkv, nqkv, -1, 1);
    fill_rand(dout, (size_t)S * B * NH * HD, -1, 1);
    fill_rand(logits, (size_t)N * V, -4, 4);
    for (int i = 0; i < N; i++) ids[i] = (int)(urand() * 50), targets[i] = (int)(urand() * V);
    /* outputs per table: [0] the reference, [1 + k] fast with fast_threads[k] */
#define N_OUT 16
    float *out[1 + N_FAST][N_OUT];
    size_t len[N_OUT];
    for (int t = 0; t <= N_FAST; t++) {
        const mc_ops *o = t == 0 ? ref : fast;
        if (t > 0) mc_cpu_set_threads(fast_threads[t - 1]);
        int k = 0;
        float *y;
#define OUT(n_) (len[k] = (n_), y = out[t][k++] = falloc(n_))
        OUT(nc); o->copy(o, y, x, nc, MC_F32, MC_F32); o->axpy(o, y, -0.5f, dy, nc, MC_F32);
        o->scale(o, y, 1.25f, nc, MC_F32);
        OUT(nc); o->gelu_forward(o, y, x, nc, MC_F32);
        OUT(nc); o->gelu_backward(o, y, x, dy, nc, MC_F32);
        OUT(nc); o->dropout_forward(o, y, x, nc, 0.3f, 99, 12345, MC_F32);
        OUT(nc + 2 * N); o->layernorm_forward(o, y, y + nc, y + nc + N, x, w, bias, N, C, 1e-5f,
                                              MC_F32);
        float *stats = y + nc;
        OUT(nc + 2 * C);
        o->layernorm_backward(o, y, y + nc, y + nc + C, dy, x, w, stats, stats + N, N, C, MC_F32);
        OUT(C); o->bias_backward(o, y, dy, N, C, MC_F32);
        size_t ns = o->attention_stats(o, S, B, NH, HD);
        OUT((size_t)S * B * NH * HD + ns);
        o->attention_forward(o, y, y + (size_t)S * B * NH * HD, qkv, S, B, NH, HD, 0.1f, 5, 7,
                             MC_F32);
        float *att = y;
        OUT(nqkv);
        o->attention_backward(o, y, dout, qkv, att, att + (size_t)S * B * NH * HD, S, B, NH, HD,
                              0.1f, 5, 7, MC_F32);
        OUT((size_t)50 * C); o->embedding_backward(o, y, dy, ids, N, C, 0, 50, MC_F32);
        OUT(3 * N);
        o->row_max(o, y, logits, N, V, MC_F32);
        o->sum_exp(o, y + N, logits, y, N, V, MC_F32);
        o->row_sum(o, y + 2 * N, logits, N, V, MC_F32);
        float *ce = y;
        OUT((size_t)N * V);
        o->cross_entropy_backward(o, y, logits, ce, ce + N, targets, dy, N, V, 0, 0.1f, V, MC_F32);
        OUT(3 * nc);   /* AdamW: params, m, v over two spans */
        memcpy(y, x, nc * sizeof(float));
        mc_adamw_span spans[2] = {{0, 0, 0, nc / 2, 0.1f}, {nc / 2, nc / 2, nc / 2, nc / 2, 0.0f}};
        mc_adamw_step h = {1e-3f, 0.9f, 0.95f, 1e-8f, 3};
        o->adamw(o, y, dy, y + nc, y + 2 * nc, NULL, spans, 2, &h, MC_F32);
        o->fill(o, y + nc, 0.0f, nc / 3, MC_F32);
#undef OUT
        cr_assert_leq(k, N_OUT);
    }
    mc_cpu_set_threads(0);
    static const char *const names[] = {"copy/axpy/scale", "gelu_forward", "gelu_backward",
        "dropout", "layernorm_forward", "layernorm_backward", "bias_backward",
        "attention_forward", "attention_backward", "embedding_backward", "cross-entropy rows",
        "cross_entropy_backward", "adamw/fill"};
    for (int k = 0; k < (int)(sizeof names / sizeof names[0]); k++)
        for (int t = 1; t <= N_FAST; t++)
            expect_same_bits(names[k], fast_threads[t - 1], out[t][k], out[0][k], len[k]);
    for (int t = 0; t <= N_FAST; t++)
        for (int k = 0; k < (int)(sizeof names / sizeof names[0]); k++) free(out[t][k]);
    free(x), free(dy), free(w), free(bias), free(qkv), free(dout), free(logits);
}

Test(ops, fast_gemm_and_sum_squares_within_tolerance_and_thread_independent) {
    /* the transformer's shapes (NT forward, TN weight grad, NN input grad) and odd ones */
    static const int shapes[][5] = {{256, 384, 128, 0, 1}, {384, 128, 256, 1, 0},
                                    {256, 128, 384, 0, 0}, {37, 301, 129, 1, 1},
                                    {300, 7, 513, 0, 1}};
    const mc_ops *ref = mc_ops_cpu_reference(), *fast = mc_ops_cpu_fast();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        const int ta = shapes[s][3], tb = shapes[s][4];
        float *A = falloc((size_t)M * K), *B = falloc((size_t)K * N), *bias = falloc(N);
        float *Cr = falloc((size_t)M * N), *C1 = falloc((size_t)M * N), *Ct = falloc((size_t)M * N);
        seed_inputs(100 + s);
        fill_rand(A, (size_t)M * K, -1, 1);
        fill_rand(B, (size_t)K * N, -1, 1);
        fill_rand(bias, N, -1, 1);
        fill_rand(Cr, (size_t)M * N, -1, 1);
        memcpy(C1, Cr, (size_t)M * N * sizeof(float));
        ref->gemm(ref, Cr, A, B, bias, M, N, K, ta, tb, 0.5f, 1.0f, MC_F32, MC_F32);
        double *bound = dalloc((size_t)M * N);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double b = 0.0;
                for (int k = 0; k < K; k++)
                    b += fabs((double)(ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k]) *
                              (double)(tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j]));
                bound[(size_t)i * N + j] = GEMM_TOL * b + 1e-6;
            }
        float *init = falloc((size_t)M * N);
        memcpy(init, C1, (size_t)M * N * sizeof(float));
        for (int t = 0; t < N_FAST; t++) {
            float *C = t == 0 ? C1 : Ct;
            memcpy(C, init, (size_t)M * N * sizeof(float));
            mc_cpu_set_threads(fast_threads[t]);
            fast->gemm(fast, C, A, B, bias, M, N, K, ta, tb, 0.5f, 1.0f, MC_F32, MC_F32);
            size_t bad = 0;
            for (size_t i = 0; i < (size_t)M * N; i++)
                bad += !(fabs((double)C[i] - (double)Cr[i]) <= bound[i]);
            cr_expect_eq(bad, 0, "gemm %dx%dx%d (%d%d), %d threads: %zu elements beyond the "
                         "tolerance", M, N, K, ta, tb, fast_threads[t], bad);
            /* without a BLAS the split changes no bit; a BLAS may pick another kernel for a
               narrower piece (still within the tolerance above) */
            if (t > 0 && !mc_cpu_blas())
                expect_same_bits("gemm against 1 thread", fast_threads[t], C, C1,
                                 (size_t)M * N);
        }
        mc_cpu_set_threads(0);
        free(A), free(B), free(bias), free(Cr), free(C1), free(Ct), free(bound), free(init);
    }
    /* sum_squares over 3 spans of a 300000-element buffer */
    const size_t n = 300000;
    float *x = falloc(n);
    fill_rand(x, n, -2, 2);
    size_t spans[6] = {0, 1000, 5000, 200001, 200001, n};
    double want, got1 = 0.0, got;
    ref->sum_squares(ref, &want, x, spans, 3);
    for (int t = 0; t < N_FAST; t++) {
        mc_cpu_set_threads(fast_threads[t]);
        fast->sum_squares(fast, t == 0 ? &got1 : &got, x, spans, 3);
        if (t == 0) got = got1;
        cr_expect(fabs(got - want) <= 1e-12 * want, "sum_squares %.17g vs %.17g", got, want);
        cr_expect(memcmp(&got, &got1, sizeof got) == 0, "sum_squares with %d threads %.17g, "
                  "with 1 thread %.17g", fast_threads[t], got, got1);
    }
    mc_cpu_set_threads(0);
    free(x);
}

Test(ops, default_table_is_the_fast_one_unless_reference_is_asked) {
    /* MC_CPU_REFERENCE=1 in the environment selects the reference for the whole process */
    const char *env = getenv("MC_CPU_REFERENCE");
    int want_ref = env && *env && strcmp(env, "0") != 0;
    cr_expect(mc_ops_cpu() == (want_ref ? mc_ops_cpu_reference() : mc_ops_cpu_fast()));
    cr_expect(mc_ops_same_memory(mc_ops_cpu_reference(), mc_ops_cpu_fast()));
    cr_expect_geq(mc_cpu_threads(), 1);
    mc_cpu_set_threads(3);
    cr_expect_eq(mc_cpu_threads(), 3);
    mc_cpu_set_threads(0);
    cr_expect_geq(mc_cpu_threads(), 1);
}
