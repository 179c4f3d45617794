/* tests/gpu/gpu_check.c - the CUDA op table against the CPU reference, op by op and for the
   whole model, on one GPU. A plain program (no Criterion, no MPI launcher):

       make gpu-check && ./build/tests/gpu_check [--section ops|attention|dropout|model|curve|
                                                            determinism]
                                                 [--curve-steps N] [--verbose]

   Every check prints one line: what ran, the largest absolute and relative error against the
   CPU, the tolerance, PASS or FAIL. fp32 ops must agree to 1e-5 relative (errors are measured
   against atol + rtol |want| with atol = rtol * max |want|, llm.c's rule, so that values near 0
   do not count as relative noise); bf16 ops to 2e-2; dropout masks bit for bit. The last line
   is exactly "N passed, N failed" (the case programs' convention); the exit status is 1 when
   a check failed, 0 when all passed. Without a GPU (or built without MC_ENABLE_CUDA) it prints
   "SKIP: ..." and exits 77, which tests/test_cuda.c reports as a skip, never as a pass.
   MC_CUDA_SYNC_CHECK=1 makes every CUDA op synchronise and check its own error. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megatron_c.h"

#define EXIT_SKIP 77

#if !defined(MC_ENABLE_CUDA)
int main(void) {
    printf("SKIP: built without MC_ENABLE_CUDA (make gpu-check builds the CUDA table)\n");
    return EXIT_SKIP;
}
#else

static int g_passed, g_failed, g_verbose;
static const mc_ops *g_cpu;
static mc_ops g_gpu;        /* auto attention */
static mc_ops g_gpu_own;    /* own kernels (flash where it applies) */
static mc_ops g_gpu_ref;    /* the reference attention kernel */
static mc_ops g_gpu_dnn;    /* cuDNN forced (may not start: then skipped with a line) */
static mc_ops g_gpu_unfused; /* auto attention, GELU never fused (mc_cuda_desc.unfused) */
static mc_ops g_gpu_det;    /* mc_cuda_desc.deterministic: every sum in one fixed order */
static int g_fuse_on;       /* the auto table fuses (MC_CUDA_FUSE is not 0) */
static int g_have_dnn;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void verdict(int ok, const char *fmt, ...) {
    char line[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    printf("  %-4s %s\n", ok ? "PASS" : "FAIL", line);
    fflush(stdout);
    if (ok)
        g_passed++;
    else
        g_failed++;
}

/* A call that must succeed; a failure is one failed check with the library's message. */
#define MUST(call)                                                                             \
    do {                                                                                       \
        int must_rc_ = (call);                                                                 \
        if (must_rc_ != MC_OK) {                                                               \
            verdict(0, "%s -> %s: %s (line %d)", #call, mc_err_name(must_rc_), mc_last_error(), \
                    __LINE__);                                                                 \
            return;                                                                            \
        }                                                                                      \
    } while (0)

// ---------------------------------------------------------------------------------------------
// inputs, buffers, comparison

static uint64_t g_state = 88172645463325252ULL;
static void seed_inputs(uint64_t s) { g_state = s * 2654435761ULL + 1; }
static double urand(void) {
    g_state ^= g_state << 13;
    g_state ^= g_state >> 7;
    g_state ^= g_state << 17;
    return (double)(g_state >> 11) * (1.0 / 9007199254740992.0);
}
static float *frand(size_t n, double lo, double hi) {
    float *x = (float *)calloc(n + 1, sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}

/* host values in dt (bf16 rounds); the returned block is malloc'd */
static void *as_dt(const float *x, size_t n, mc_dtype dt) {
    void *out = malloc(mc_dtype_bytes(dt, n) + 2);
    if (dt == MC_F32)
        memcpy(out, x, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++) ((mc_bf16 *)out)[i] = mc_bf16_from_float(x[i]);
    return out;
}

static float get(const void *p, size_t i, mc_dtype dt) {
    return dt == MC_F32 ? ((const float *)p)[i] : mc_bf16_to_float(((const mc_bf16 *)p)[i]);
}

static void *dev_of(const void *host, size_t bytes) {
    void *d = NULL;
    if (g_gpu.alloc(&g_gpu, &d, bytes ? bytes : 1) != MC_OK) return NULL;
    if (bytes && g_gpu.upload(&g_gpu, d, host, bytes) != MC_OK) return NULL;
    return d;
}

static void *back(const void *dev, size_t bytes) {
    void *h = malloc(bytes + 8);
    if (g_gpu.download(&g_gpu, h, dev, bytes) != MC_OK) memset(h, 0xff, bytes);
    return h;
}

static void dfree(void *d) { g_gpu.free(&g_gpu, d); }

/* got vs want (n values of dt each): passes when |got - want| <= atol + rtol |want| everywhere,
   atol = rtol * max |want|. Prints the largest absolute and relative (to max |want|) error. */
static int compare(const char *what, const void *got, const void *want, size_t n, mc_dtype dt,
                   double rtol) {
    double max_abs = 0.0, max_want = 0.0, worst = 0.0;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; i++) max_want = fmax(max_want, fabs(get(want, i, dt)));
    double atol = rtol * max_want;
    for (size_t i = 0; i < n; i++) {
        double g = get(got, i, dt), w = get(want, i, dt), e = fabs(g - w);
        double ratio = e / (atol + rtol * fabs(w) + 1e-30);
        if (!(e == e) || !(g == g)) ratio = INFINITY;
        if (ratio > 1.0) bad++;
        if (ratio > worst || (ratio != ratio)) worst = ratio, at = i;
        if (e > max_abs) max_abs = e;
    }
    int ok = bad == 0 && n > 0;
    verdict(ok, "%-46s n %-8zu max_abs %.3e max_rel %.3e (rtol %.0e)%s", what, n, max_abs,
            max_want > 0 ? max_abs / max_want : max_abs, rtol,
            ok ? "" : "  <- worst element below");
    if (!ok && n > 0)
        printf("       [%zu] got %.9g want %.9g; %zu of %zu elements off\n", at,
               (double)get(got, at, dt), (double)get(want, at, dt), bad, n);
    return ok;
}

static double tol_of(mc_dtype dt) { return dt == MC_F32 ? 1e-5 : 2e-2; }
static const char *dt_name(mc_dtype dt) { return dt == MC_F32 ? "f32" : "bf16"; }

// ---------------------------------------------------------------------------------------------
// ops

static void check_elementwise(mc_dtype dt) {
    const size_t n = 100003;   /* odd: the scalar tail path */
    char what[96];
    seed_inputs(1 + dt);
    float *x = frand(n, -3, 3), *y = frand(n, -1, 1);
    void *hx = as_dt(x, n, dt), *hy = as_dt(y, n, dt), *hc = as_dt(y, n, dt);
    void *dx = dev_of(hx, mc_dtype_bytes(dt, n)), *dy = dev_of(hy, mc_dtype_bytes(dt, n));
    /* axpy, scale, gelu forward and backward; the same on the CPU's copies */
    MUST(g_gpu.axpy(&g_gpu, dy, -0.75f, dx, n, dt));
    MUST(g_cpu->axpy(g_cpu, hc, -0.75f, hx, n, dt));
    void *got = back(dy, mc_dtype_bytes(dt, n));
    snprintf(what, sizeof what, "axpy %s", dt_name(dt));
    compare(what, got, hc, n, dt, tol_of(dt));
    free(got);
    MUST(g_gpu.scale(&g_gpu, dy, 3.0f, n, dt));
    MUST(g_cpu->scale(g_cpu, hc, 3.0f, n, dt));
    got = back(dy, mc_dtype_bytes(dt, n));
    snprintf(what, sizeof what, "scale %s", dt_name(dt));
    compare(what, got, hc, n, dt, tol_of(dt));
    free(got);
    MUST(g_gpu.gelu_forward(&g_gpu, dy, dx, n, dt));
    MUST(g_cpu->gelu_forward(g_cpu, hc, hx, n, dt));
    got = back(dy, mc_dtype_bytes(dt, n));
    snprintf(what, sizeof what, "gelu_forward %s", dt_name(dt));
    compare(what, got, hc, n, dt, tol_of(dt));
    free(got);
    void *hd = as_dt(y, n, dt), *dd = dev_of(hd, mc_dtype_bytes(dt, n));
    MUST(g_gpu.gelu_backward(&g_gpu, dy, dx, dd, n, dt));
    MUST(g_cpu->gelu_backward(g_cpu, hc, hx, hd, n, dt));
    got = back(dy, mc_dtype_bytes(dt, n));
    snprintf(what, sizeof what, "gelu_backward %s", dt_name(dt));
    compare(what, got, hc, n, dt, tol_of(dt));
    free(got);
    /* fill and the converting copy */
    MUST(g_gpu.fill(&g_gpu, dy, 0.3f, n, dt));
    MUST(g_cpu->fill(g_cpu, hc, 0.3f, n, dt));
    got = back(dy, mc_dtype_bytes(dt, n));
    snprintf(what, sizeof what, "fill %s", dt_name(dt));
    compare(what, got, hc, n, dt, 0.0);
    free(got);
    mc_dtype other = dt == MC_F32 ? MC_BF16 : MC_F32;
    void *dconv = NULL, *hconv = malloc(mc_dtype_bytes(other, n) + 2);
    MUST(g_gpu.alloc(&g_gpu, &dconv, mc_dtype_bytes(other, n)));
    MUST(g_gpu.copy(&g_gpu, dconv, dx, n, other, dt));
    MUST(g_cpu->copy(g_cpu, hconv, hx, n, other, dt));
    got = back(dconv, mc_dtype_bytes(other, n));
    snprintf(what, sizeof what, "copy %s -> %s", dt_name(dt), dt_name(other));
    compare(what, got, hconv, n, other, 0.0);
    free(got);
    free(hconv);
    dfree(dconv);
    dfree(dx), dfree(dy), dfree(dd);
    free(x), free(y), free(hx), free(hy), free(hc), free(hd);
}

static void check_sum_squares(void) {
    const size_t n = 1 << 20;
    seed_inputs(3);
    float *x = frand(n, -1, 1);
    size_t spans[6] = {0, 1000, 1000, 500000, 600000, n};
    double want = 0.0, got = -1.0;
    MUST(g_cpu->sum_squares(g_cpu, &want, x, spans, 3));
    float *dx = (float *)dev_of(x, n * sizeof(float));
    size_t *ds = (size_t *)dev_of(spans, sizeof spans);
    double *dout = (double *)dev_of(&got, sizeof got);
    MUST(g_gpu.sum_squares(&g_gpu, dout, dx, ds, 3));
    MUST(g_gpu.download(&g_gpu, &got, dout, sizeof got));
    verdict(fabs(got - want) <= 1e-9 * want, "%-46s got %.12g want %.12g", "sum_squares (3 spans)",
            got, want);
    dfree(dx), dfree(ds), dfree(dout);
    free(x);
}

static void check_gemm_case(int M, int N, int K, int ta, int tb, float beta, int with_bias,
                            mc_dtype c_dt, mc_dtype ab_dt) {
    char what[128];
    seed_inputs((uint64_t)(M * 7 + N * 13 + K + ta * 3 + tb * 5 + (int)c_dt * 11));
    float *a = frand((size_t)M * K, -1, 1), *b = frand((size_t)K * N, -1, 1);
    float *c = frand((size_t)M * N, -1, 1), *bias = frand((size_t)N, -1, 1);
    void *ha = as_dt(a, (size_t)M * K, ab_dt), *hb = as_dt(b, (size_t)K * N, ab_dt);
    void *hbias = as_dt(bias, (size_t)N, ab_dt), *hc = as_dt(c, (size_t)M * N, c_dt);
    void *da = dev_of(ha, mc_dtype_bytes(ab_dt, (size_t)M * K));
    void *db = dev_of(hb, mc_dtype_bytes(ab_dt, (size_t)K * N));
    void *dbias = dev_of(hbias, mc_dtype_bytes(ab_dt, (size_t)N));
    void *dc = dev_of(hc, mc_dtype_bytes(c_dt, (size_t)M * N));
    MUST(g_gpu.gemm(&g_gpu, dc, da, db, with_bias ? dbias : NULL, M, N, K, ta, tb, 0.5f, beta,
                    c_dt, ab_dt));
    MUST(g_cpu->gemm(g_cpu, hc, ha, hb, with_bias ? hbias : NULL, M, N, K, ta, tb, 0.5f, beta,
                     c_dt, ab_dt));
    void *got = back(dc, mc_dtype_bytes(c_dt, (size_t)M * N));
    snprintf(what, sizeof what, "gemm %s<-%s M%d N%d K%d ta%d tb%d beta%g%s", dt_name(c_dt),
             dt_name(ab_dt), M, N, K, ta, tb, (double)beta, with_bias ? " bias" : "");
    compare(what, got, hc, (size_t)M * N, c_dt, c_dt == MC_F32 && ab_dt == MC_F32 ? 1e-5 : 2e-2);
    free(got);
    dfree(da), dfree(db), dfree(dbias), dfree(dc);
    free(a), free(b), free(c), free(bias), free(ha), free(hb), free(hbias), free(hc);
}

static void check_gemm(void) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) check_gemm_case(37, 133, 259, ta, tb, 0.0f, 0, MC_F32, MC_F32);
    check_gemm_case(64, 256, 128, 0, 1, 1.0f, 1, MC_F32, MC_F32);
    check_gemm_case(256, 2304, 768, 0, 1, 0.0f, 1, MC_BF16, MC_BF16);   /* qkv forward */
    check_gemm_case(256, 768, 3072, 0, 0, 0.0f, 0, MC_BF16, MC_BF16);   /* dgrad */
    check_gemm_case(768, 3072, 256, 1, 0, 1.0f, 0, MC_F32, MC_BF16);    /* wgrad into fp32 */
    check_gemm_case(33, 17, 0, 0, 0, 1.0f, 1, MC_F32, MC_F32);          /* K = 0: bias add */
    check_gemm_case(9, 24, 0, 0, 0, 1.0f, 1, MC_BF16, MC_BF16);
}

static void check_norm_and_bias(mc_dtype dt) {
    enum { N = 300, C = 768 };
    char what[96];
    seed_inputs(5 + dt);
    float *x = frand(N * C, -2, 2), *w = frand(C, 0.5, 1.5), *b = frand(C, -0.5, 0.5);
    float *dy = frand(N * C, -1, 1), *di = frand(N * C, -1, 1);
    void *hx = as_dt(x, N * C, dt), *hw = as_dt(w, C, dt), *hb = as_dt(b, C, dt);
    void *hdy = as_dt(dy, N * C, dt), *hdi = as_dt(di, N * C, dt), *hy = as_dt(x, N * C, dt);
    float hmean[N], hrstd[N], hdw[C] = {0}, hdb[C] = {0};
    void *dx = dev_of(hx, mc_dtype_bytes(dt, N * C)), *dw = dev_of(hw, mc_dtype_bytes(dt, C));
    void *dbb = dev_of(hb, mc_dtype_bytes(dt, C)), *ddy = dev_of(hdy, mc_dtype_bytes(dt, N * C));
    void *ddi = dev_of(hdi, mc_dtype_bytes(dt, N * C)), *dy_out = dev_of(hy, mc_dtype_bytes(dt, N * C));
    float *dmean = (float *)dev_of(hmean, sizeof hmean), *drstd = (float *)dev_of(hrstd, sizeof hrstd);
    float *ddw = (float *)dev_of(hdw, sizeof hdw), *ddb = (float *)dev_of(hdb, sizeof hdb);
    MUST(g_gpu.layernorm_forward(&g_gpu, dy_out, dmean, drstd, dx, dw, dbb, N, C, 1e-5f, dt));
    MUST(g_cpu->layernorm_forward(g_cpu, hy, hmean, hrstd, hx, hw, hb, N, C, 1e-5f, dt));
    void *got = back(dy_out, mc_dtype_bytes(dt, N * C));
    snprintf(what, sizeof what, "layernorm_forward %s N%d C%d", dt_name(dt), N, C);
    compare(what, got, hy, N * C, dt, tol_of(dt));
    free(got);
    got = back(drstd, sizeof hrstd);
    snprintf(what, sizeof what, "layernorm_forward rstd (fp32) %s", dt_name(dt));
    compare(what, got, hrstd, N, MC_F32, dt == MC_F32 ? 1e-5 : 1e-4);
    free(got);
    MUST(g_gpu.layernorm_backward(&g_gpu, ddi, ddw, ddb, ddy, dx, dw, dmean, drstd, N, C, dt));
    MUST(g_cpu->layernorm_backward(g_cpu, hdi, hdw, hdb, hdy, hx, hw, hmean, hrstd, N, C, dt));
    got = back(ddi, mc_dtype_bytes(dt, N * C));
    snprintf(what, sizeof what, "layernorm_backward dinp (+=) %s", dt_name(dt));
    compare(what, got, hdi, N * C, dt, tol_of(dt));
    free(got);
    got = back(ddw, sizeof hdw);
    snprintf(what, sizeof what, "layernorm_backward dweight (fp32) %s", dt_name(dt));
    compare(what, got, hdw, C, MC_F32, dt == MC_F32 ? 1e-5 : 1e-3);
    free(got);
    got = back(ddb, sizeof hdb);
    snprintf(what, sizeof what, "layernorm_backward dbias (fp32) %s", dt_name(dt));
    compare(what, got, hdb, C, MC_F32, dt == MC_F32 ? 1e-5 : 1e-3);
    free(got);
    /* bias_backward adds column sums into fp32 */
    MUST(g_gpu.bias_backward(&g_gpu, ddb, ddy, N, C, dt));
    MUST(g_cpu->bias_backward(g_cpu, hdb, hdy, N, C, dt));
    got = back(ddb, sizeof hdb);
    snprintf(what, sizeof what, "bias_backward (+=, fp32) %s", dt_name(dt));
    compare(what, got, hdb, C, MC_F32, dt == MC_F32 ? 1e-5 : 1e-3);
    free(got);
    dfree(dx), dfree(dw), dfree(dbb), dfree(ddy), dfree(ddi), dfree(dy_out), dfree(dmean);
    dfree(drstd), dfree(ddw), dfree(ddb);
    free(x), free(w), free(b), free(dy), free(di), free(hx), free(hw), free(hb), free(hdy);
    free(hdi), free(hy);
}

/* VL 500: the generic row kernels; 504 (a multiple of 8): the vectorised bf16 ones */
static void check_embedding_and_ce(mc_dtype dt, int VL) {
    enum { N = 96, C = 64, V = 1000, VS = 250 };
    char what[96];
    int ids[N];
    seed_inputs(7 + dt);
    for (int i = 0; i < N; i++) ids[i] = (int)(urand() * V);
    ids[0] = VS, ids[1] = VS + VL - 1, ids[2] = VS - 1;   /* the shard's edges */
    float *table = frand((size_t)VL * C, -1, 1), *dout = frand((size_t)N * C, -1, 1);
    void *ht = as_dt(table, (size_t)VL * C, dt), *hdo = as_dt(dout, (size_t)N * C, dt);
    void *hout = as_dt(dout, (size_t)N * C, dt);
    float *hdt = (float *)calloc((size_t)VL * C, sizeof(float));
    int *dids = (int *)dev_of(ids, sizeof ids);
    void *dt_ = dev_of(ht, mc_dtype_bytes(dt, (size_t)VL * C));
    void *ddo = dev_of(hdo, mc_dtype_bytes(dt, (size_t)N * C));
    void *dout_d = dev_of(hout, mc_dtype_bytes(dt, (size_t)N * C));
    float *ddt = (float *)dev_of(hdt, (size_t)VL * C * sizeof(float));
    MUST(g_gpu.embedding_forward(&g_gpu, dout_d, dids, dt_, N, C, VS, VS + VL, dt));
    MUST(g_cpu->embedding_forward(g_cpu, hout, ids, ht, N, C, VS, VS + VL, dt));
    void *got = back(dout_d, mc_dtype_bytes(dt, (size_t)N * C));
    snprintf(what, sizeof what, "embedding_forward %s", dt_name(dt));
    compare(what, got, hout, (size_t)N * C, dt, 0.0);
    free(got);
    MUST(g_gpu.embedding_backward(&g_gpu, ddt, ddo, dids, N, C, VS, VS + VL, dt));
    MUST(g_cpu->embedding_backward(g_cpu, hdt, hdo, ids, N, C, VS, VS + VL, dt));
    got = back(ddt, (size_t)VL * C * sizeof(float));
    snprintf(what, sizeof what, "embedding_backward (+=, fp32) %s", dt_name(dt));
    compare(what, got, hdt, (size_t)VL * C, MC_F32, 1e-5);
    free(got);
    /* cross-entropy pieces on a [N, VL] shard */
    float *logits = frand((size_t)N * VL, -6, 6), *dloss = frand(N, 0.1, 1.1);
    void *hl = as_dt(logits, (size_t)N * VL, dt), *hdl = as_dt(logits, (size_t)N * VL, dt);
    void *dl = dev_of(hl, mc_dtype_bytes(dt, (size_t)N * VL));
    void *ddl = dev_of(hdl, mc_dtype_bytes(dt, (size_t)N * VL));
    float hmax[N], hsum[N], htl[N], hrs[N], hloss[N];
    double hls = 0.0, gls = -1.0;
    float *dmax = (float *)dev_of(hmax, sizeof hmax), *dsum = (float *)dev_of(hsum, sizeof hsum);
    float *dtl = (float *)dev_of(htl, sizeof htl), *drs = (float *)dev_of(hrs, sizeof hrs);
    float *dls = (float *)dev_of(hloss, sizeof hloss), *ddloss = (float *)dev_of(dloss, N * sizeof(float));
    double *dlsum = (double *)dev_of(&gls, sizeof gls);
    MUST(g_gpu.row_max(&g_gpu, dmax, dl, N, VL, dt));
    MUST(g_cpu->row_max(g_cpu, hmax, hl, N, VL, dt));
    got = back(dmax, sizeof hmax);
    snprintf(what, sizeof what, "row_max %s V%d", dt_name(dt), VL);
    compare(what, got, hmax, N, MC_F32, 0.0);
    free(got);
    MUST(g_gpu.target_logit(&g_gpu, dtl, dl, dids, N, VL, VS, dt));
    MUST(g_cpu->target_logit(g_cpu, htl, hl, ids, N, VL, VS, dt));
    got = back(dtl, sizeof htl);
    snprintf(what, sizeof what, "target_logit %s V%d", dt_name(dt), VL);
    compare(what, got, htl, N, MC_F32, 0.0);
    free(got);
    MUST(g_gpu.sum_exp(&g_gpu, dsum, dl, dmax, N, VL, dt));
    MUST(g_cpu->sum_exp(g_cpu, hsum, hl, hmax, N, VL, dt));
    got = back(dsum, sizeof hsum);
    snprintf(what, sizeof what, "sum_exp %s V%d", dt_name(dt), VL);
    compare(what, got, hsum, N, MC_F32, 1e-5);
    free(got);
    MUST(g_gpu.row_sum(&g_gpu, drs, dl, N, VL, dt));
    MUST(g_cpu->row_sum(g_cpu, hrs, hl, N, VL, dt));
    got = back(drs, sizeof hrs);
    snprintf(what, sizeof what, "row_sum %s V%d", dt_name(dt), VL);
    compare(what, got, hrs, N, MC_F32, 1e-5);
    free(got);
    MUST(g_gpu.cross_entropy_loss(&g_gpu, dls, dlsum, dmax, dsum, dtl, drs, N, VL, 0.1f));
    MUST(g_cpu->cross_entropy_loss(g_cpu, hloss, &hls, hmax, hsum, htl, hrs, N, VL, 0.1f));
    got = back(dls, sizeof hloss);
    snprintf(what, sizeof what, "cross_entropy_loss (smoothing) %s V%d", dt_name(dt), VL);
    compare(what, got, hloss, N, MC_F32, 1e-5);
    free(got);
    MUST(g_gpu.download(&g_gpu, &gls, dlsum, sizeof gls));
    verdict(fabs(gls - hls) <= 1e-6 * fabs(hls), "%-46s got %.10g want %.10g",
            "cross_entropy_loss sum", gls, hls);
    MUST(g_gpu.cross_entropy_backward(&g_gpu, ddl, dl, dmax, dsum, dids, ddloss, N, VL, VS, 0.1f,
                                      V, dt));
    MUST(g_cpu->cross_entropy_backward(g_cpu, hdl, hl, hmax, hsum, ids, dloss, N, VL, VS, 0.1f, V,
                                       dt));
    got = back(ddl, mc_dtype_bytes(dt, (size_t)N * VL));
    snprintf(what, sizeof what, "cross_entropy_backward %s V%d", dt_name(dt), VL);
    compare(what, got, hdl, (size_t)N * VL, dt, tol_of(dt));
    free(got);
    dfree(dids), dfree(dt_), dfree(ddo), dfree(dout_d), dfree(ddt), dfree(dl), dfree(ddl);
    dfree(dmax), dfree(dsum), dfree(dtl), dfree(drs), dfree(dls), dfree(ddloss), dfree(dlsum);
    free(table), free(dout), free(ht), free(hdo), free(hout), free(hdt), free(logits);
    free(dloss), free(hl), free(hdl);
}

static void check_adamw(mc_dtype model_dt) {
    enum { n = 5000 };
    char what[96];
    seed_inputs(9);
    float *p = frand(n, -1, 1), *g = frand(n, -0.5, 0.5), *m = frand(n, -0.1, 0.1);
    float *v = frand(n, 0, 0.01);
    void *hmodel = as_dt(p, n, model_dt);
    mc_adamw_span spans[2] = {{0, 0, 0, 3000, 0.1f}, {3200, 3200, 3200, 1800, 0.0f}};
    mc_adamw_step h = {1e-3f, 0.9f, 0.95f, 1e-8f, 3};
    float *dp = (float *)dev_of(p, n * 4), *dg = (float *)dev_of(g, n * 4);
    float *dm = (float *)dev_of(m, n * 4), *dv = (float *)dev_of(v, n * 4);
    void *dmodel = dev_of(hmodel, mc_dtype_bytes(model_dt, n));
    mc_adamw_span *dspans = (mc_adamw_span *)dev_of(spans, sizeof spans);
    MUST(g_gpu.adamw(&g_gpu, dp, dg, dm, dv, dmodel, dspans, 2, &h, model_dt));
    MUST(g_cpu->adamw(g_cpu, p, g, m, v, hmodel, spans, 2, &h, model_dt));
    void *got = back(dp, n * 4);
    snprintf(what, sizeof what, "adamw main params (model %s)", dt_name(model_dt));
    compare(what, got, p, n, MC_F32, 1e-5);
    free(got);
    got = back(dv, n * 4);
    compare("adamw v", got, v, n, MC_F32, 1e-5);
    free(got);
    got = back(dmodel, mc_dtype_bytes(model_dt, n));
    snprintf(what, sizeof what, "adamw model copy %s", dt_name(model_dt));
    compare(what, got, hmodel, n, model_dt, model_dt == MC_F32 ? 1e-5 : 1e-2);
    free(got);
    dfree(dp), dfree(dg), dfree(dm), dfree(dv), dfree(dmodel), dfree(dspans);
    free(p), free(g), free(m), free(v), free(hmodel);
}

// the fused MLP ops: GELU in the GEMM's epilogue against the CPU and against the unfused table

/* The calls mc_ops_cuda_fusion counted: fused / unfused, forward [0] and backward [1]. */
static void fusion_counts(const mc_ops *o, long fused[2], long unfused[2]) {
    fused[0] = fused[1] = unfused[0] = unfused[1] = -1;
    sscanf(mc_ops_cuda_fusion(o), "%*[^,], forward %ld fused / %ld unfused, backward %ld fused / "
           "%ld unfused", &fused[0], &unfused[0], &fused[1], &unfused[1]);
}

/* One forward (pre = op(A) op(B) + bias, out = gelu(pre)) and one backward (dpre = gelu'(pre)
   op(A) op(B)) on the auto table, the unfused table and the CPU. expect_fused: the auto table
   must have run both in the epilogue (bf16, N % 8 == 0, fusion on), else both unfused. */
static void check_gemm_gelu_case(int M, int N, int K, int ta, int tb, int with_bias, mc_dtype dt,
                                 int expect_fused) {
    char what[160], shape[96];
    size_t mn = (size_t)M * N;
    snprintf(shape, sizeof shape, "%s M%d N%d K%d ta%d tb%d%s", dt_name(dt), M, N, K, ta, tb,
             with_bias ? " bias" : "");
    seed_inputs((uint64_t)(M * 3 + N * 5 + K * 7 + ta + 2 * tb + (int)dt * 17));
    float *a = frand((size_t)M * K, -0.3, 0.3), *b = frand((size_t)K * N, -0.3, 0.3);
    float *bias = frand((size_t)N, -1, 1), *pre = frand(mn, -3, 3);
    void *ha = as_dt(a, (size_t)M * K, dt), *hb = as_dt(b, (size_t)K * N, dt);
    void *hbias = as_dt(bias, (size_t)N, dt), *hpre_in = as_dt(pre, mn, dt);
    void *hout = as_dt(pre, mn, dt), *hpre = as_dt(pre, mn, dt), *hd = as_dt(pre, mn, dt);
    void *da = dev_of(ha, mc_dtype_bytes(dt, (size_t)M * K));
    void *db = dev_of(hb, mc_dtype_bytes(dt, (size_t)K * N));
    void *dbias = dev_of(hbias, mc_dtype_bytes(dt, (size_t)N));
    void *dpre_in = dev_of(hpre_in, mc_dtype_bytes(dt, mn));
    void *out[2], *pr[2], *dd[2];
    const mc_ops *tab[2] = {&g_gpu, &g_gpu_unfused};
    long f0[2], u0[2], f1[2], u1[2];
    for (int t = 0; t < 2; t++) {
        out[t] = dev_of(hout, mc_dtype_bytes(dt, mn));
        pr[t] = dev_of(hout, mc_dtype_bytes(dt, mn));
        dd[t] = dev_of(hout, mc_dtype_bytes(dt, mn));
    }
    MUST(g_gpu.synchronize(&g_gpu));
    fusion_counts(&g_gpu, f0, u0);
    for (int t = 0; t < 2; t++) {
        const mc_ops *o = tab[t];
        MUST(o->gemm_gelu_forward(o, out[t], pr[t], da, db, with_bias ? dbias : NULL, M, N, K, ta,
                                  tb, dt));
        MUST(o->gemm_gelu_backward(o, dd[t], dpre_in, da, db, M, N, K, ta, tb, dt));
        MUST(o->synchronize(o));
    }
    fusion_counts(&g_gpu, f1, u1);
    MUST(g_cpu->gemm_gelu_forward(g_cpu, hout, hpre, ha, hb, with_bias ? hbias : NULL, M, N, K,
                                  ta, tb, dt));
    MUST(g_cpu->gemm_gelu_backward(g_cpu, hd, hpre_in, ha, hb, M, N, K, ta, tb, dt));
    double tol = tol_of(dt);
    void *got[2][3];
    for (int t = 0; t < 2; t++) {
        got[t][0] = back(out[t], mc_dtype_bytes(dt, mn));
        got[t][1] = back(pr[t], mc_dtype_bytes(dt, mn));
        got[t][2] = back(dd[t], mc_dtype_bytes(dt, mn));
    }
    const char *names[3] = {"gelu out", "pre", "backward dpre"};
    const void *want[3] = {hout, hpre, hd};
    for (int k = 0; k < 3; k++) {
        snprintf(what, sizeof what, "gemm_gelu %s %s vs cpu", names[k], shape);
        compare(what, got[0][k], want[k], mn, dt, tol);
        snprintf(what, sizeof what, "gemm_gelu %s %s unfused vs cpu", names[k], shape);
        compare(what, got[1][k], want[k], mn, dt, tol);
        snprintf(what, sizeof what, "gemm_gelu %s %s fused vs unfused", names[k], shape);
        compare(what, got[0][k], got[1][k], mn, dt, tol);
    }
    int fused = f1[0] - f0[0] == 1 && f1[1] - f0[1] == 1;
    int unfused = f1[0] == f0[0] && f1[1] == f0[1] && u1[0] - u0[0] == 1 && u1[1] - u0[1] == 1;
    snprintf(what, sizeof what, "gemm_gelu %s ran %s", shape,
             expect_fused ? "fused (GELU epilogue)" : "unfused (gemm + gelu kernel)");
    verdict(expect_fused ? fused : unfused, "%-46s %s", what, mc_ops_cuda_fusion(&g_gpu));
    for (int t = 0; t < 2; t++) {
        for (int k = 0; k < 3; k++) free(got[t][k]);
        dfree(out[t]), dfree(pr[t]), dfree(dd[t]);
    }
    dfree(da), dfree(db), dfree(dbias), dfree(dpre_in);
    free(a), free(b), free(bias), free(pre);
    free(ha), free(hb), free(hbias), free(hpre_in), free(hout), free(hpre), free(hd);
}

static void check_gemm_gelu(void) {
    int on = g_fuse_on;
    check_gemm_gelu_case(256, 3072, 768, 0, 1, 1, MC_BF16, on);   /* fc1 forward, fc2 dgrad */
    check_gemm_gelu_case(256, 3072, 768, 0, 0, 1, MC_BF16, on);   /* fc2's dgrad layout */
    check_gemm_gelu_case(64, 512, 128, 0, 1, 0, MC_BF16, on);     /* no bias: GELU_AUX */
    check_gemm_gelu_case(37, 100, 64, 0, 1, 1, MC_BF16, 0);       /* N % 8 != 0: unfused */
    check_gemm_gelu_case(64, 256, 128, 0, 1, 1, MC_F32, 0);       /* fp32 stays unfused */
    printf("  gelu fusion: %s\n", mc_ops_cuda_fusion(&g_gpu));
}

static void section_ops(void) {
    printf("== ops: CUDA against the CPU table\n");
    check_elementwise(MC_F32);
    check_elementwise(MC_BF16);
    check_sum_squares();
    check_gemm();
    check_gemm_gelu();
    check_norm_and_bias(MC_F32);
    check_norm_and_bias(MC_BF16);
    check_embedding_and_ce(MC_F32, 500);
    check_embedding_and_ce(MC_BF16, 500);
    check_embedding_and_ce(MC_BF16, 504);
    check_adamw(MC_F32);
    check_adamw(MC_BF16);
}

// ---------------------------------------------------------------------------------------------
// attention: every kernel against the CPU, forward and backward

/* out, dqkv of one attention forward + backward on `o` (NULL results on failure). */
static int attention_run(const mc_ops *o, const void *qkv, const void *dout, void *out,
                         void *dqkv, int S, int B, int NH, int HD, float p, mc_dtype dt) {
    size_t ns = o->attention_stats(o, S, B, NH, HD);
    float *stats = NULL;
    int rc = o->alloc(o, (void **)&stats, (ns ? ns : 1) * sizeof(float));
    if (rc == MC_OK)
        rc = o->attention_forward(o, out, stats, qkv, S, B, NH, HD, p, 4242, 12, dt);
    if (rc == MC_OK)
        rc = o->attention_backward(o, dqkv, dout, qkv, out, stats, S, B, NH, HD, p, 4242, 12, dt);
    if (rc == MC_OK) rc = o->synchronize(o);
    o->free(o, stats);
    return rc;
}

static void check_attention_case(const mc_ops *gpu, const char *kernel, int S, int B, int NH,
                                 int HD, float p, mc_dtype dt) {
    size_t nq = (size_t)S * B * NH * 3 * HD, no = (size_t)S * B * NH * HD;
    char what[128];
    seed_inputs((uint64_t)(S * 31 + HD + (int)dt));
    float *qkv = frand(nq, -1.5, 1.5), *dout = frand(no, -1, 1);
    void *hq = as_dt(qkv, nq, dt), *hdo = as_dt(dout, no, dt);
    void *ho = malloc(mc_dtype_bytes(dt, no)), *hdq = malloc(mc_dtype_bytes(dt, nq));
    int rc = attention_run(g_cpu, hq, hdo, ho, hdq, S, B, NH, HD, p, dt);
    if (rc != MC_OK) {
        verdict(0, "attention on the CPU: %s", mc_last_error());
        return;
    }
    void *dq = NULL, *ddo = NULL, *dout_ = NULL, *ddq = NULL;
    gpu->alloc(gpu, &dq, mc_dtype_bytes(dt, nq));
    gpu->alloc(gpu, &ddo, mc_dtype_bytes(dt, no));
    gpu->alloc(gpu, &dout_, mc_dtype_bytes(dt, no));
    gpu->alloc(gpu, &ddq, mc_dtype_bytes(dt, nq));
    gpu->upload(gpu, dq, hq, mc_dtype_bytes(dt, nq));
    gpu->upload(gpu, ddo, hdo, mc_dtype_bytes(dt, no));
    double t0 = now_s();
    rc = attention_run(gpu, dq, ddo, dout_, ddq, S, B, NH, HD, p, dt);
    double ms = (now_s() - t0) * 1e3;
    snprintf(what, sizeof what, "attention %s %s S%d B%d NH%d HD%d p%g", kernel, dt_name(dt), S,
             B, NH, HD, (double)p);
    printf("    (%s: %s)\n", what, mc_ops_cuda_attention_kernels(gpu));
    if (rc != MC_OK) {
        verdict(0, "%s: %s", what, mc_last_error());
    } else {
        void *go = malloc(mc_dtype_bytes(dt, no)), *gq = malloc(mc_dtype_bytes(dt, nq));
        gpu->download(gpu, go, dout_, mc_dtype_bytes(dt, no));
        gpu->download(gpu, gq, ddq, mc_dtype_bytes(dt, nq));
        char w2[160];
        snprintf(w2, sizeof w2, "%s out", what);
        compare(w2, go, ho, no, dt, dt == MC_F32 ? 1e-5 : 3e-2);
        snprintf(w2, sizeof w2, "%s dqkv (%.1f ms)", what, ms);
        compare(w2, gq, hdq, nq, dt, dt == MC_F32 ? 1e-5 : 3e-2);
        free(go), free(gq);
    }
    gpu->free(gpu, dq), gpu->free(gpu, ddo), gpu->free(gpu, dout_), gpu->free(gpu, ddq);
    free(qkv), free(dout), free(hq), free(hdo), free(ho), free(hdq);
}

static void section_attention(void) {
    printf("== attention: reference, flash and cuDNN kernels against the CPU\n");
    /* the reference kernel: fp32 at 1e-5, with and without dropout, odd sizes */
    check_attention_case(&g_gpu_ref, "reference", 37, 2, 3, 16, 0.0f, MC_F32);
    check_attention_case(&g_gpu_ref, "reference", 37, 2, 3, 16, 0.3f, MC_F32);
    check_attention_case(&g_gpu_ref, "reference", 64, 2, 2, 64, 0.1f, MC_BF16);
    /* flash: bf16, head dims 64 and 32, S not a multiple of the 64-row tile */
    check_attention_case(&g_gpu_own, "flash", 64, 2, 2, 64, 0.0f, MC_BF16);
    check_attention_case(&g_gpu_own, "flash", 200, 2, 3, 64, 0.0f, MC_BF16);
    check_attention_case(&g_gpu_own, "flash", 130, 1, 2, 32, 0.0f, MC_BF16);
    /* whole tiles, more heads, the curve's and a long sequence's shapes */
    check_attention_case(&g_gpu_own, "flash", 256, 2, 4, 64, 0.0f, MC_BF16);
    check_attention_case(&g_gpu_own, "flash", 128, 8, 4, 64, 0.0f, MC_BF16);
    check_attention_case(&g_gpu_own, "flash", 1024, 1, 2, 64, 0.0f, MC_BF16);
    if (g_have_dnn) {
        check_attention_case(&g_gpu_dnn, "cudnn", 128, 2, 2, 64, 0.0f, MC_BF16);
        check_attention_case(&g_gpu_dnn, "cudnn", 256, 2, 4, 64, 0.0f, MC_BF16);
        check_attention_case(&g_gpu_dnn, "cudnn", 1024, 1, 2, 64, 0.0f, MC_BF16);
    } else {
        printf("  SKIP cuDNN attention: the forced-cuDNN table did not start (%s)\n",
               mc_last_error());
    }
    check_attention_case(&g_gpu, "auto", 256, 2, 4, 64, 0.0f, MC_BF16);
}

// ---------------------------------------------------------------------------------------------
// dropout: the GPU draws the CPU's masks, bit for bit

static void check_dropout_bits(mc_dtype dt, uint64_t offset, size_t n) {
    char what[96];
    float *ones = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f + (float)(i % 7) * 0.125f;
    void *h = as_dt(ones, n, dt), *hw = as_dt(ones, n, dt);
    void *d = dev_of(h, mc_dtype_bytes(dt, n));
    MUST(g_gpu.dropout_forward(&g_gpu, d, d, n, 0.37f, 987654321ULL, offset, dt));
    MUST(g_cpu->dropout_forward(g_cpu, hw, h, n, 0.37f, 987654321ULL, offset, dt));
    void *got = back(d, mc_dtype_bytes(dt, n));
    size_t diff = 0, kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp((char *)got + mc_dtype_bytes(dt, i), (char *)hw + mc_dtype_bytes(dt, i),
                   mc_dtype_size(dt)) != 0)
            diff++;
        kept += get(hw, i, dt) != 0.0f;
    }
    snprintf(what, sizeof what, "dropout mask %s offset %llu n %zu", dt_name(dt),
             (unsigned long long)offset, n);
    verdict(diff == 0 && kept > 0 && kept < n, "%-46s %zu of %zu values differ (kept %.3f)", what,
            diff, n, (double)kept / (double)n);
    free(got), free(ones), free(h), free(hw);
    dfree(d);
}

static void section_dropout(void) {
    printf("== dropout: bit-identical masks\n");
    check_dropout_bits(MC_F32, 0, 1 << 20);
    check_dropout_bits(MC_F32, 13, 100001);    /* an offset that is not a block boundary */
    check_dropout_bits(MC_BF16, 4096 + 2, 77777);
    /* attention-probability dropout: the reference kernel against the CPU (masks inside) */
    check_attention_case(&g_gpu_ref, "reference+dropout", 48, 2, 2, 32, 0.5f, MC_F32);
}

// ---------------------------------------------------------------------------------------------
// the whole model

static mc_gpt_config tiny_config(int L, int H, int NH, int S, int B, int V, float dropout) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = L, c.hidden_size = H, c.num_attention_heads = NH, c.seq_length = S;
    c.vocab_size = V, c.micro_batch_size = B, c.seed = 1234;
    c.hidden_dropout = c.attention_dropout = dropout > 0.0f ? dropout : MC_DROPOUT_OFF;
    return c;
}

typedef struct trainer {
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int ok;
} trainer;

static int trainer_init(trainer *t, const mc_gpt_config *cfg, const mc_ops *o, mc_dtype dt,
                        mc_parallel_state *ps, float eps) {
    memset(t, 0, sizeof *t);
    mc_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.config = *cfg, gd.ops = o, gd.dtype = dt, gd.ps = ps;
    int rc = mc_gpt_init(&t->gpt, &gd);
    if (rc != MC_OK) return rc;
    mc_ddp_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.table = &t->gpt.table, dd.grads = t->gpt.grads, dd.ops = o;
    dd.dp = ps ? mc_parallel_group(ps, MC_GROUP_DP_CP) : NULL;
    if ((rc = mc_ddp_init(&t->ddp, &dd)) != MC_OK) return rc;
    mc_optimizer_desc od;
    memset(&od, 0, sizeof od);
    od.ddp = &t->ddp, od.params = t->gpt.params, od.params_dtype = dt, od.ps = ps;
    od.lr = 1e-3f, od.weight_decay = 0.1f, od.clip_grad = 1.0f;
    od.eps = eps;   /* 0: Megatron's 1e-8 */
    if ((rc = mc_optimizer_init(&t->opt, &od)) != MC_OK) return rc;
    t->ok = 1;
    return MC_OK;
}

static void trainer_destroy(trainer *t) {
    if (t->opt.m) mc_optimizer_destroy(&t->opt);
    mc_ddp_destroy(&t->ddp);
    mc_gpt_destroy(&t->gpt);
}

/* A learnable stream: token n+1 = (3 token n + 1 + noise) mod V. */
static void make_batch(int *tokens, int *labels, int S, int B, int V, uint64_t seed) {
    seed_inputs(seed);
    for (int b = 0; b < B; b++) {
        int x = (int)(urand() * V);
        for (int s = 0; s < S; s++) {
            tokens[s * B + b] = x;
            x = (3 * x + 1 + (urand() < 0.1 ? (int)(urand() * 5) : 0)) % V;
            labels[s * B + b] = x;
        }
    }
}

/* One training step: forward, backward from the mean loss, the optimizer. */
static int train_step(trainer *t, const int *tokens, const int *labels, double *loss) {
    int rc = mc_ddp_zero_grad(&t->ddp);
    double sum = 0.0;
    if (rc == MC_OK) rc = mc_gpt_forward(&t->gpt, 0, 0, tokens, labels, NULL, NULL, &sum);
    if (rc == MC_OK)
        rc = mc_gpt_backward(&t->gpt, 0, 0, NULL, 1.0f / (float)t->gpt.N, NULL);
    if (rc == MC_OK) rc = mc_finalize_model_grads(NULL, &t->ddp, NULL, NULL, 0, NULL);
    if (rc == MC_OK) rc = mc_optimizer_step(&t->opt);
    *loss = sum / t->gpt.N;
    return rc;
}

static void *download_all(const mc_ops *o, const void *dev, size_t bytes) {
    void *h = malloc(bytes + 8);
    if (o->download(o, h, dev, bytes) != MC_OK) memset(h, 0xff, bytes);
    return h;
}

/* Adam divides by sqrt(v) + eps: with Megatron's 1e-8 a gradient element within rounding of
   zero (a sum that cancels) moves its weight by up to lr either way, so two correct backends
   that round differently drift apart by ~lr in such elements (seen on the GPU: one weight of
   110336 off by 0.15 lr after 3 steps, the next step's grads off by 1e-4). eps 1e-4 keeps those
   updates proportional to the gradient and the comparison meaningful at 1e-5. */
#define MODEL_EPS 1e-4f

/* A reference model (the CPU, or another CUDA table) and a CUDA model from the same config and
   data: losses, grads, params after steps. */
static void check_model_vs(const mc_ops *ref, const char *name, mc_gpt_config cfg, mc_dtype dt,
                           mc_parallel_state *ps, const mc_ops *gpu) {
    trainer c, g;
    char what[128];
    const char *ref_name = ref == g_cpu ? "cpu" : "ref";
    int rc = trainer_init(&c, &cfg, ref, dt, NULL, MODEL_EPS);
    if (rc != MC_OK) {
        verdict(0, "%s: reference model: %s", name, mc_last_error());
        return;
    }
    rc = trainer_init(&g, &cfg, gpu, dt, ps, MODEL_EPS);
    if (rc != MC_OK) {
        verdict(0, "%s: CUDA model: %s", name, mc_last_error());
        trainer_destroy(&c);
        return;
    }
    int N = c.gpt.N, V = cfg.vocab_size;
    int *tokens = (int *)malloc(N * sizeof(int)), *labels = (int *)malloc(N * sizeof(int));
    double rtol = dt == MC_F32 ? 1e-5 : 3e-2;
    size_t total = c.gpt.table.total;
    for (int step = 0; step < 3; step++) {
        double lc = 0.0, lg = 0.0;
        make_batch(tokens, labels, cfg.seq_length, cfg.micro_batch_size, V, 100 + step);
        int rc1 = mc_ddp_zero_grad(&c.ddp), rc2 = mc_ddp_zero_grad(&g.ddp);
        if (rc1 == MC_OK) rc1 = mc_gpt_forward(&c.gpt, 0, 0, tokens, labels, NULL, NULL, &lc);
        if (rc2 == MC_OK) rc2 = mc_gpt_forward(&g.gpt, 0, 0, tokens, labels, NULL, NULL, &lg);
        if (rc1 != MC_OK || rc2 != MC_OK) {
            verdict(0, "%s step %d forward: %s", name, step, mc_last_error());
            break;
        }
        const float *lcd = mc_gpt_losses(&c.gpt, 0), *lgd = mc_gpt_losses(&g.gpt, 0);
        float *lgh = (float *)download_all(gpu, lgd, N * sizeof(float));
        float *lch = (float *)download_all(ref, lcd, N * sizeof(float));
        snprintf(what, sizeof what, "%s step %d per-token losses", name, step);
        compare(what, lgh, lch, N, MC_F32, rtol);
        free(lgh), free(lch);
        verdict(fabs(lg - lc) <= rtol * fabs(lc), "%-46s cuda %.9g %s %.9g",
                "  loss sum", lg, ref_name, lc);
        rc1 = mc_gpt_backward(&c.gpt, 0, 0, NULL, 1.0f / (float)N, NULL);
        rc2 = mc_gpt_backward(&g.gpt, 0, 0, NULL, 1.0f / (float)N, NULL);
        if (rc1 != MC_OK || rc2 != MC_OK) {
            verdict(0, "%s step %d backward: %s", name, step, mc_last_error());
            break;
        }
        float *gg = (float *)download_all(gpu, g.gpt.grads, total * sizeof(float));
        float *gc = (float *)download_all(ref, c.gpt.grads, total * sizeof(float));
        snprintf(what, sizeof what, "%s step %d grads (flat, fp32)", name, step);
        compare(what, gg, gc, total, MC_F32, dt == MC_F32 ? 1e-5 : 5e-2);
        free(gg), free(gc);
        rc1 = mc_finalize_model_grads(NULL, &c.ddp, NULL, NULL, 0, NULL);
        rc2 = mc_finalize_model_grads(ps, &g.ddp, NULL, NULL, 0, NULL);
        if (rc1 == MC_OK) rc1 = mc_optimizer_step(&c.opt);
        if (rc2 == MC_OK) rc2 = mc_optimizer_step(&g.opt);
        if (rc1 != MC_OK || rc2 != MC_OK) {
            verdict(0, "%s step %d optimizer: %s", name, step, mc_last_error());
            break;
        }
        verdict(fabs(g.opt.last_grad_norm - c.opt.last_grad_norm) <=
                    (dt == MC_F32 ? 1e-5 : 5e-2) * c.opt.last_grad_norm,
                "%-46s cuda %.9g %s %.9g", "  grad norm", g.opt.last_grad_norm, ref_name,
                c.opt.last_grad_norm);
    }
    void *pg = download_all(gpu, g.gpt.params, mc_dtype_bytes(dt, total));
    void *pc = download_all(ref, c.gpt.params, mc_dtype_bytes(dt, total));
    snprintf(what, sizeof what, "%s params after 3 steps", name);
    compare(what, pg, pc, total, dt, dt == MC_F32 ? 1e-5 : 3e-2);
    free(pg), free(pc);
    free(tokens), free(labels);
    trainer_destroy(&g);
    trainer_destroy(&c);
}

static void check_model(const char *name, mc_gpt_config cfg, mc_dtype dt, mc_parallel_state *ps,
                        const mc_ops *gpu) {
    check_model_vs(g_cpu, name, cfg, dt, ps, gpu);
}

static void section_model(void) {
    printf("== model: CUDA against the CPU, the same config, weights and data\n");
    /* fp32 with dropout (the reference attention kernel, the CPU's masks) */
    check_model("gpt L2 H64 NH4 S32 B2 V100 f32 dropout 0.1",
                tiny_config(2, 64, 4, 32, 2, 100, 0.1f), MC_F32, NULL, &g_gpu);
    check_model("gpt L2 H64 NH4 S32 B2 V100 f32 no dropout",
                tiny_config(2, 64, 4, 32, 2, 100, 0.0f), MC_F32, NULL, &g_gpu);
    /* bf16: the CPU's bf16 emulation against the GPU (flash / cuDNN attention, HD 64) */
    long f0[2], u0[2], f1[2], u1[2];
    fusion_counts(&g_gpu, f0, u0);
    check_model("gpt L2 H128 NH2 S64 B2 V256 bf16",
                tiny_config(2, 128, 2, 64, 2, 256, 0.0f), MC_BF16, NULL, &g_gpu);
    fusion_counts(&g_gpu, f1, u1);
    /* 2 layers x 3 steps: every MLP forward and backward through the GELU epilogue (or none) */
    verdict(g_fuse_on ? f1[0] - f0[0] == 6 && f1[1] - f0[1] == 6 && u1[0] == u0[0]
                      : f1[0] == f0[0] && f1[1] == f0[1] && u1[0] - u0[0] == 6,
            "%-46s %s", g_fuse_on ? "  bf16 model MLPs ran fused" : "  bf16 model MLPs ran unfused",
            mc_ops_cuda_fusion(&g_gpu));
    /* the fused table against the unfused one (GELU's epilogue vs gemm + gelu kernel) */
    check_model_vs(&g_gpu_unfused, "gpt L2 H128 bf16 fused vs unfused CUDA",
                   tiny_config(2, 128, 2, 64, 2, 256, 0.0f), MC_BF16, NULL, &g_gpu);
    /* the same through a parallel state on a size-1 world whose memory is the CUDA table */
    mc_comm *world = NULL;
    mc_comm_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.backend = MC_BACKEND_SELF, cd.memory = &g_gpu;
    if (mc_comm_init_world(&world, &cd) != MC_OK) {
        verdict(0, "self world on CUDA memory: %s", mc_last_error());
        return;
    }
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    mc_parallel_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.world = world;
    if (mc_parallel_init(&ps, &pd) != MC_OK) {
        verdict(0, "parallel state on a CUDA world: %s", mc_last_error());
    } else {
        check_model("gpt L2 H64 NH4 f32 with a parallel state (self)",
                    tiny_config(2, 64, 4, 32, 2, 100, 0.1f), MC_F32, &ps, &g_gpu);
        mc_parallel_destroy(&ps);
    }
    mc_comm_destroy(world);
    /* a CPU table handed a CUDA world is refused with a message, not a crash */
    trainer bad;
    mc_comm *w2 = NULL;
    if (mc_comm_init_world(&w2, &cd) == MC_OK) {
        memset(&ps, 0, sizeof ps);
        pd.world = w2;
        if (mc_parallel_init(&ps, &pd) == MC_OK) {
            mc_gpt_config cfg = tiny_config(1, 32, 2, 8, 1, 50, 0.0f);
            int rc = trainer_init(&bad, &cfg, g_cpu, MC_F32, &ps, 0.0f);
            verdict(rc == MC_ERR_INVALID_DESC && strstr(mc_last_error(), "same memory"),
                    "%-46s %s", "mixed memory refused", mc_last_error());
            trainer_destroy(&bad);
            mc_parallel_destroy(&ps);
        }
        mc_comm_destroy(w2);
    }
}

// ---------------------------------------------------------------------------------------------
// determinism: the deterministic table against the CPU, and against itself run twice

/* Trains a fresh model 3 steps on `o`; returns its grads and params (host copies). */
static int train_copy(const mc_ops *o, mc_gpt_config cfg, mc_dtype dt, void **grads,
                      void **params, size_t *total) {
    trainer t;
    int rc = trainer_init(&t, &cfg, o, dt, NULL, MODEL_EPS);
    int N = cfg.seq_length * cfg.micro_batch_size;
    int *tokens = (int *)malloc(N * sizeof(int)), *labels = (int *)malloc(N * sizeof(int));
    for (int step = 0; rc == MC_OK && step < 3; step++) {
        double loss = 0.0;
        make_batch(tokens, labels, cfg.seq_length, cfg.micro_batch_size, cfg.vocab_size,
                   300 + step);
        rc = train_step(&t, tokens, labels, &loss);
    }
    if (rc == MC_OK) rc = o->synchronize(o);
    if (rc == MC_OK) {
        *total = t.gpt.table.total;
        *grads = download_all(o, t.gpt.grads, *total * sizeof(float));
        *params = download_all(o, t.gpt.params, mc_dtype_bytes(dt, *total));
    }
    free(tokens), free(labels);
    trainer_destroy(&t);
    return rc;
}

/* Two runs of one table from the same weights and data: do grads and params agree bit for
   bit? Returns 1 if they do, 0 if not, -1 on an error (reported). */
static int runs_identical(const mc_ops *o, const char *name, mc_gpt_config cfg, mc_dtype dt,
                          size_t *differing) {
    void *g1 = NULL, *p1 = NULL, *g2 = NULL, *p2 = NULL;
    size_t n1 = 0, n2 = 0;
    int rc = train_copy(o, cfg, dt, &g1, &p1, &n1);
    if (rc == MC_OK) rc = train_copy(o, cfg, dt, &g2, &p2, &n2);
    if (rc != MC_OK || n1 != n2) {
        verdict(0, "%s: %s", name, mc_last_error());
        free(g1), free(p1), free(g2), free(p2);
        return -1;
    }
    size_t bad = 0;
    for (size_t i = 0; i < n1; i++) bad += ((uint32_t *)g1)[i] != ((uint32_t *)g2)[i];
    int same = bad == 0 && memcmp(p1, p2, mc_dtype_bytes(dt, n1)) == 0;
    *differing = bad;
    free(g1), free(p1), free(g2), free(p2);
    return same;
}

static void section_determinism(void) {
    printf("== determinism: mc_cuda_desc.deterministic (no atomics in any sum)\n");
    check_model("deterministic: gpt L2 H64 NH4 S32 B2 V100 f32 dropout 0.1",
                tiny_config(2, 64, 4, 32, 2, 100, 0.1f), MC_F32, NULL, &g_gpu_det);
    check_model("deterministic: gpt L2 H128 NH2 S64 B2 V256 bf16",
                tiny_config(2, 128, 2, 64, 2, 256, 0.0f), MC_BF16, NULL, &g_gpu_det);
    static const struct { const char *name; int L, H, NH, S, B, V; float p; mc_dtype dt; } c[] = {
        {"f32 L2 H64 S32 B2 V100, dropout 0.1", 2, 64, 4, 32, 2, 100, 0.1f, MC_F32},
        {"bf16 L2 H128 S64 B8 V256", 2, 128, 2, 64, 8, 256, 0.0f, MC_BF16},
        {"f32 L4 H256 S128 B8 V1000", 4, 256, 4, 128, 8, 1000, 0.0f, MC_F32},
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        mc_gpt_config cfg = tiny_config(c[k].L, c[k].H, c[k].NH, c[k].S, c[k].B, c[k].V, c[k].p);
        size_t bad = 0;
        char what[160];
        snprintf(what, sizeof what, "deterministic table, twice: %s", c[k].name);
        int same = runs_identical(&g_gpu_det, what, cfg, c[k].dt, &bad);
        if (same >= 0)
            verdict(same == 1, "%-62s grads and params %s", what,
                    same ? "bit-identical" : "DIFFER");
        /* the default table, for the record: atomics may reorder its sums (not a check) */
        snprintf(what, sizeof what, "default table, twice: %s", c[k].name);
        same = runs_identical(&g_gpu, what, cfg, c[k].dt, &bad);
        if (same >= 0)
            printf("INFO %-62s %s (%zu of the grads differ)\n", what,
                   same ? "bit-identical" : "differ", bad);
    }
}

// ---------------------------------------------------------------------------------------------
// bf16 against fp32 over a training run

static void section_curve(int steps) {
    printf("== curve: bf16 against fp32 on the GPU, %d steps (tolerance: |bf16 - fp32| <= 0.05 + "
           "2%% of the fp32 loss at every logged step; both must fall by a third)\n", steps);
    mc_gpt_config cfg = tiny_config(4, 256, 4, 128, 8, 512, 0.0f);
    trainer f, b;
    if (trainer_init(&f, &cfg, &g_gpu, MC_F32, NULL, 0.0f) != MC_OK ||
        trainer_init(&b, &cfg, &g_gpu, MC_BF16, NULL, 0.0f) != MC_OK) {
        verdict(0, "curve models: %s", mc_last_error());
        return;
    }
    int N = f.gpt.N, ok = 1;
    int *tokens = (int *)malloc(N * sizeof(int)), *labels = (int *)malloc(N * sizeof(int));
    double first_f = 0, first_b = 0, lf = 0, lb = 0, worst = 0;
    printf("  %6s %12s %12s %10s\n", "step", "fp32", "bf16", "diff");
    double t0 = now_s();
    for (int s = 1; s <= steps; s++) {
        make_batch(tokens, labels, cfg.seq_length, cfg.micro_batch_size, cfg.vocab_size,
                   1000 + s);
        if (train_step(&f, tokens, labels, &lf) != MC_OK ||
            train_step(&b, tokens, labels, &lb) != MC_OK) {
            verdict(0, "curve step %d: %s", s, mc_last_error());
            ok = 0;
            break;
        }
        if (s == 1) first_f = lf, first_b = lb;
        double diff = lb - lf, tol = 0.05 + 0.02 * lf;
        if (fabs(diff) > tol) ok = 0;
        if (fabs(diff) > worst) worst = fabs(diff);
        if (s == 1 || s % 20 == 0 || s == steps)
            printf("  %6d %12.6f %12.6f %+10.6f%s\n", s, lf, lb, diff,
                   fabs(diff) > tol ? "  <- over tolerance" : "");
    }
    double secs = now_s() - t0;
    verdict(ok && lf < first_f * 2.0 / 3.0 && lb < first_b * 2.0 / 3.0,
            "%-46s fp32 %.4f -> %.4f, bf16 %.4f -> %.4f, worst |diff| %.4f (%.1f s)",
            "bf16 loss curve within tolerance of fp32", first_f, lf, first_b, lb, worst, secs);
    free(tokens), free(labels);
    trainer_destroy(&f);
    trainer_destroy(&b);
}

// ---------------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    int run[6] = {1, 1, 1, 1, 1, 1}, any = 0, curve_steps = 200;
    const char *names[6] = {"ops", "attention", "dropout", "model", "curve", "determinism"};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--section") == 0 && i + 1 < argc) {
            if (!any) memset(run, 0, sizeof run);
            any = 1;
            int k;
            for (k = 0; k < 6 && strcmp(argv[i + 1], names[k]) != 0; k++) {
            }
            if (k == 6) {
                fprintf(stderr, "gpu_check: unknown section %s\n", argv[i + 1]);
                return 2;
            }
            run[k] = 1;
            i++;
        } else if (strcmp(argv[i], "--curve-steps") == 0 && i + 1 < argc) {
            curve_steps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--verbose") == 0) {
            g_verbose = 1;
        } else {
            fprintf(stderr, "usage: gpu_check [--section ops|attention|dropout|model|curve|"
                    "determinism]... "
                    "[--curve-steps N] [--verbose]\n");
            return 2;
        }
    }
    if (mc_cuda_device_count() == 0) {
        printf("SKIP: no CUDA device (gpu_check needs a GPU)\n");
        return EXIT_SKIP;
    }
    g_cpu = mc_ops_cpu();
    mc_cuda_desc d;
    memset(&d, 0, sizeof d);
    if (mc_ops_cuda_init(&g_gpu, &d) != MC_OK) {
        printf("FAIL: mc_ops_cuda_init: %s\n0 passed, 1 failed\n", mc_last_error());
        return 1;
    }
    d.attention = 1;
    int rc1 = mc_ops_cuda_init(&g_gpu_own, &d);
    d.attention = 3;
    int rc2 = mc_ops_cuda_init(&g_gpu_ref, &d);
    d.attention = 2;
    g_have_dnn = mc_ops_cuda_init(&g_gpu_dnn, &d) == MC_OK;
    d.attention = 0;
    d.unfused = 1;
    int rc3 = mc_ops_cuda_init(&g_gpu_unfused, &d);
    d.unfused = 0;
    d.deterministic = 1;
    if (rc3 == MC_OK) rc3 = mc_ops_cuda_init(&g_gpu_det, &d);
    g_fuse_on = strncmp(mc_ops_cuda_fusion(&g_gpu), "on", 2) == 0;
    if (rc1 != MC_OK || rc2 != MC_OK || rc3 != MC_OK) {
        printf("FAIL: mc_ops_cuda_init (attention tables): %s\n0 passed, 1 failed\n",
               mc_last_error());
        return 1;
    }
    printf("gpu_check: %s\n", mc_ops_cuda_describe(&g_gpu));
    printf("gpu_check: gelu fusion %s (MC_CUDA_FUSE=0 turns it off)\n", g_fuse_on ? "on" : "off");
    double t0 = now_s();
    if (run[0]) section_ops();
    if (run[1]) section_attention();
    if (run[2]) section_dropout();
    if (run[3]) section_model();
    if (run[4]) section_curve(curve_steps);
    if (run[5]) section_determinism();
    printf("gpu_check: %.1f s, peak %.1f MiB through the auto table\n", now_s() - t0,
           (double)mc_ops_cuda_peak_bytes(&g_gpu, 0) / 1048576.0);
    printf("gpu_check: gelu fusion of the auto table: %s\n", mc_ops_cuda_fusion(&g_gpu));
    printf("%d passed, %d failed\n", g_passed, g_failed);
    mc_ops_cuda_destroy(&g_gpu_unfused);
    mc_ops_cuda_destroy(&g_gpu_det);
    mc_ops_cuda_destroy(&g_gpu_own);
    mc_ops_cuda_destroy(&g_gpu_ref);
    if (g_have_dnn) mc_ops_cuda_destroy(&g_gpu_dnn);
    mc_ops_cuda_destroy(&g_gpu);
    return g_failed ? 1 : 0;
}
#endif
