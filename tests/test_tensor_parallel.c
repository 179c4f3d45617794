/* test_tensor_parallel.c - the tensor-parallel block: multi-rank equality with TP = 1 through
   build/tests/tp_cases under mpirun (TP = 1, 2, 4), and in this process the parts that need no
   peers: CPU initialisation and the stride rule (§3.1), the layers at TP = 1 against plain fp64
   loops and fp64 finite differences, the identity of every mapping on a group of one, error
   messages and scratch sizes. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define RUN_LIMIT_S 120.0
#define OUT_CAP (1 << 16)
#define SEED 1234u

TestSuite(tensor_parallel, .timeout = 180);

static const mc_ops *ops(void) {
    return mc_ops_cpu();
}

/* ---------------------------------------------------------------------------------------------
   multi-rank cases */

typedef struct tp_run {
    char case_name[24];
    int np;
} tp_run;

static tp_run tp_runs[] = {
    {"mappings", 1},      {"mappings", 2},      {"mappings", 4},      {"column", 1},
    {"column", 2},        {"column", 4},        {"row", 1},           {"row", 2},
    {"row", 4},           {"embedding", 1},     {"embedding", 2},     {"embedding", 4},
    {"cross_entropy", 1}, {"cross_entropy", 2}, {"cross_entropy", 4},
};

ParameterizedTestParameters(tensor_parallel, cases) {
    return cr_make_param_array(tp_run, tp_runs, sizeof tp_runs / sizeof tp_runs[0]);
}

ParameterizedTest(tp_run *run, tensor_parallel, cases) {
    char prog[4096], cmd[4400];
    mc_test_sibling("tp_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s %s", prog, run->case_name);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    int rc = mc_test_mpirun(run->np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect_eq(rc, 0, "tp_cases %s on %d ranks exited %d\n%s", run->case_name, run->np, rc, out);
    cr_expect(found && failed == 0 && passed > 0,
              "tp_cases %s on %d ranks: %d passed, %d failed\n%s", run->case_name, run->np, passed,
              failed, out);
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   CPU initialisation (§3.1) */

static float *init_full(const char *name, int rows, int cols, float std) {
    float *t = calloc((size_t)rows * cols, sizeof(float));
    cr_assert_not_null(t);
    mc_init_normal_shard(t, name, rows, cols, -1, 1, 0, 1, std, SEED);
    return t;
}

/* Megatron's test_initialization: TP = 4, 16 x 16; the column shard of rank r is rows
   [4r, 4r+4) of the TP = 1 weight, the row shard columns [4r, 4r+4), the embedding shard
   vocab rows [4r, 4r+4). */
Test(tensor_parallel, init_shards_are_slices_of_tp1) {
    float *full = init_full("w", 16, 16, 0.02f);
    float shard[64];
    for (int r = 0; r < 4; r++) {
        mc_init_normal_shard(shard, "w", 16, 16, 0, 1, r, 4, 0.02f, SEED); /* column */
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 16; j++)
                cr_expect_eq(shard[i * 16 + j], full[(4 * r + i) * 16 + j],
                             "column rank %d [%d,%d]", r, i, j);
        mc_init_normal_shard(shard, "w", 16, 16, 1, 1, r, 4, 0.02f, SEED); /* row */
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 4; j++)
                cr_expect_eq(shard[i * 4 + j], full[i * 16 + 4 * r + j], "row rank %d [%d,%d]", r,
                             i, j);
    }
    /* the same master at TP = 2: invariant in the TP size */
    float half[128];
    mc_init_normal_shard(half, "w", 16, 16, 0, 1, 1, 2, 0.02f, SEED);
    cr_expect(memcmp(half, full + 8 * 16, sizeof half) == 0, "TP 2 rank 1 != rows 8..15");
    free(full);
}

/* out = 8, TP = 2, stride = 2: pieces of two rows; rank 0 gets {0,1,4,5}, rank 1 {2,3,6,7}. */
Test(tensor_parallel, init_partition_stride) {
    const int want[2][4] = {{0, 1, 4, 5}, {2, 3, 6, 7}};
    float *full = init_full("fc1", 8, 3, 1.0f);
    float shard[12];
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 4; k++)
            cr_expect_eq(mc_shard_global_index(k, 8, 2, r, 2), want[r][k],
                         "rank %d local %d -> %d, want %d", r, k,
                         mc_shard_global_index(k, 8, 2, r, 2), want[r][k]);
        mc_init_normal_shard(shard, "fc1", 8, 3, 0, 2, r, 2, 1.0f, SEED);
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 3; j++)
                cr_expect_eq(shard[k * 3 + j], full[want[r][k] * 3 + j], "rank %d row %d", r, k);
    }
    cr_expect_eq(mc_shard_global_index(0, 8, 3, 0, 2), -1, "4 rows per rank in 3 pieces");
    cr_expect_eq(mc_shard_global_index(4, 8, 1, 0, 2), -1, "local index past the shard");
    free(full);
}

/* normal(0, std): the moments of 40000 draws, and distinct streams per name and seed. */
Test(tensor_parallel, init_is_normal_and_keyed_by_name_and_seed) {
    const int rows = 200, cols = 200;
    float *a = init_full("decoder.layers.0.mlp.linear_fc1.weight", rows, cols, 0.02f);
    float *b = init_full("decoder.layers.1.mlp.linear_fc1.weight", rows, cols, 0.02f);
    float *c = calloc((size_t)rows * cols, sizeof(float));
    mc_init_normal_shard(c, "decoder.layers.0.mlp.linear_fc1.weight", rows, cols, -1, 1, 0, 1,
                         0.02f, SEED + 1);
    double sum = 0, sq = 0, kurt = 0;
    size_t n = (size_t)rows * cols, same_b = 0, same_c = 0, beyond3 = 0;
    for (size_t i = 0; i < n; i++) {
        double z = a[i] / 0.02;
        sum += z;
        sq += z * z;
        kurt += z * z * z * z;
        beyond3 += fabs(z) > 3.0;
        same_b += a[i] == b[i];
        same_c += a[i] == c[i];
    }
    double mean = sum / n, var = sq / n - mean * mean;
    cr_expect(fabs(mean) < 0.02, "mean %g (4 sigma = 0.02)", mean);
    cr_expect(fabs(var - 1.0) < 0.03, "variance %g", var);
    cr_expect(fabs(kurt / n - 3.0) < 0.15, "fourth moment %g, normal 3", kurt / n);
    cr_expect(beyond3 > 60 && beyond3 < 160, "%zu beyond 3 sigma, expect about 108", beyond3);
    cr_expect(same_b < 5 && same_c < 5, "streams overlap: %zu (name) %zu (seed)", same_b, same_c);
    free(a), free(b), free(c);
}

/* A regression pin: the numbers the header documents (they must never change silently, or
   checkpoints initialised elsewhere would differ). Recomputed here from Philox and Box-Muller
   by hand, then compared with the library. */
Test(tensor_parallel, init_matches_documented_derivation) {
    const char *name = "output_layer.weight";
    uint64_t h = 14695981039346656037ULL;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    for (int i = 0; i < 8; i++)
        h = (h ^ (unsigned char)((uint64_t)SEED >> (8 * i))) * 1099511628211ULL;
    float got[6];
    mc_init_normal_shard(got, name, 2, 3, -1, 1, 0, 1, 0.5f, SEED);
    for (uint32_t g = 0; g < 6; g++) {
        uint32_t counter[4] = {g, 0, 0, 0}, key[2] = {(uint32_t)h, (uint32_t)(h >> 32)}, o[4];
        mc_philox4x32_10(counter, key, o);
        double u1 = ((double)o[0] + 1.0) / 4294967296.0, u2 = (double)o[1] / 4294967296.0;
        float want = (float)(0.5 * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
        cr_expect(fabsf(got[g] - want) <= 1e-7f * fabsf(want) + 1e-9f, "element %u: %.9g vs %.9g",
                  g, (double)got[g], (double)want);
    }
}

/* The example printed in the header's >>tensor_parallel notes. */
Test(tensor_parallel, init_header_example) {
    const char *name = "decoder.layers.0.mlp.linear_fc1.weight";
    const float row0[4] = {-0.034442f, 0.034814f, -0.007775f, -0.029111f};
    const float row4[4] = {-0.012309f, 0.016442f, -0.027588f, 0.013217f};
    const float row2[4] = {-0.010136f, -0.020999f, 0.032555f, 0.010440f};
    float full[32], shard[16], strided[16];
    mc_init_normal_shard(full, name, 8, 4, -1, 1, 0, 1, 0.02f, 1234);
    mc_init_normal_shard(shard, name, 8, 4, 0, 1, 1, 2, 0.02f, 1234);
    mc_init_normal_shard(strided, name, 8, 4, 0, 2, 1, 2, 0.02f, 1234);
    for (int j = 0; j < 4; j++) {
        cr_expect(fabsf(full[j] - row0[j]) < 1e-6f, "row 0 [%d] = %.6f", j, (double)full[j]);
        cr_expect(fabsf(shard[j] - row4[j]) < 1e-6f, "shard row 0 [%d] = %.6f", j,
                  (double)shard[j]);
        cr_expect(fabsf(strided[j] - row2[j]) < 1e-6f, "strided row 0 [%d] = %.6f", j,
                  (double)strided[j]);
    }
}

Test(tensor_parallel, init_rejects_indivisible_shapes) {
    float shard[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    mc_init_normal_shard(shard, "w", 6, 1, 0, 1, 0, 4, 1.0f, SEED);
    cr_expect(mc_test_contains(mc_last_error(), "does not split into tp_size (4)"), "%s",
              mc_last_error());
    for (int i = 0; i < 8; i++) cr_expect_eq(shard[i], 7.0f, "written despite the error");
    /* a 1-D tensor splits along its only dim: bias [8] at TP 2 rank 1 = elements 4..7 */
    float *full = init_full("b", 1, 8, 1.0f), half[4];
    mc_init_normal_shard(half, "b", 1, 8, 0, 1, 1, 2, 1.0f, SEED);
    cr_expect(memcmp(half, full + 4, sizeof half) == 0);
    free(full);
}

/* ---------------------------------------------------------------------------------------------
   the layers at TP = 1 against fp64 loops and finite differences */

static double *to_f64(const float *x, size_t n) {
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* L = sum dY * (X W^T + b): the scalar whose gradients the linear backward computes. */
static double linear_loss64(const double *X, const double *W, const double *b, const double *dY,
                            int N, int IN, int OUT) {
    double L = 0;
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OUT; o++) {
            double y = b ? b[o] : 0.0;
            for (int k = 0; k < IN; k++) y += X[i * IN + k] * W[o * IN + k];
            L += dY[i * OUT + o] * y;
        }
    return L;
}

/* Central differences in fp64 of f over every element of x; compared with the analytic grad. */
typedef double (*loss_fn)(void *ctx);
static void fd_check(const char *what, double *x, size_t n, const float *grad, loss_fn f,
                     void *ctx) {
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double up = f(ctx);
        x[i] = keep - h;
        double down = f(ctx);
        x[i] = keep;
        double fd = (up - down) / (2 * h);
        cr_expect(fabs(fd - grad[i]) <= 1e-4 + 1e-4 * fabs(fd), "%s[%zu]: analytic %.8g, fd %.8g",
                  what, i, (double)grad[i], fd);
    }
}

typedef struct lin_ctx {
    double *X, *W, *b, *dY;
    int N, IN, OUT;
} lin_ctx;

static double lin_f(void *p) {
    lin_ctx *c = p;
    return linear_loss64(c->X, c->W, c->b, c->dY, c->N, c->IN, c->OUT);
}

static void check_linear_tp1(int row) {
    const int S = 3, B = 2, C = 5, OC = 4, N = S * B;
    float *X = init_full("x", N, C, 1.0f), *W = init_full("w", OC, C, 0.5f);
    float *b = init_full("b", 1, OC, 0.5f), *dY = init_full("dy", N, OC, 1.0f);
    float Y[24], dX[30], dW[20], db[4];
    memset(dW, 0, sizeof dW);
    memset(db, 0, sizeof db);
    int flags = row ? MC_TP_INPUT_IS_PARALLEL : 0;
    if (row) {
        cr_assert_eq(
            mc_row_parallel_linear_forward(Y, NULL, X, W, b, S, B, C, OC, flags, MC_F32, NULL,
                                           ops()),
            MC_OK, "%s", mc_last_error());
        cr_assert_eq(mc_row_parallel_linear_backward(dX, dW, db, NULL, dY, X, W, S, B, C, OC,
                                                     flags, MC_F32,
                                                     NULL, ops()),
                     MC_OK, "%s", mc_last_error());
    } else {
        cr_assert_eq(
            mc_column_parallel_linear_forward(Y, NULL, X, W, b, S, B, C, OC, flags, MC_F32, NULL,
                                              ops()),
            MC_OK, "%s", mc_last_error());
        cr_assert_eq(mc_column_parallel_linear_backward(dX, dW, db, NULL, dY, X, W, S, B, C, OC,
                                                        flags, MC_F32, NULL, ops()),
                     MC_OK, "%s", mc_last_error());
    }
    lin_ctx c = {to_f64(X, N * C), to_f64(W, OC * C), to_f64(b, OC), to_f64(dY, N * OC), N, C, OC};
    for (int i = 0; i < N; i++) /* forward against the fp64 loop */
        for (int o = 0; o < OC; o++) {
            double y = c.b[o];
            for (int k = 0; k < C; k++) y += c.X[i * C + k] * c.W[o * C + k];
            cr_expect(fabs(Y[i * OC + o] - y) < 1e-5, "Y[%d,%d] = %g, want %g", i, o,
                      (double)Y[i * OC + o], y);
        }
    fd_check("dX", c.X, (size_t)N * C, dX, lin_f, &c);
    fd_check("dW", c.W, (size_t)OC * C, dW, lin_f, &c);
    fd_check("db", c.b, (size_t)OC, db, lin_f, &c);
    /* a second backward accumulates into dW and db */
    float dW1[20], db1[4];
    memcpy(dW1, dW, sizeof dW);
    memcpy(db1, db, sizeof db);
    if (row)
        mc_row_parallel_linear_backward(dX, dW, db, NULL, dY, X, W, S, B, C, OC, flags, MC_F32,
                                        NULL,
                                        ops());
    else
        mc_column_parallel_linear_backward(dX, dW, db, NULL, dY, X, W, S, B, C, OC, flags, MC_F32,
                                           NULL,
                                           ops());
    for (int i = 0; i < 20; i++)
        cr_expect(fabsf(dW[i] - 2 * dW1[i]) < 1e-5f, "dW[%d] not accumulated", i);
    for (int i = 0; i < 4; i++)
        cr_expect(fabsf(db[i] - 2 * db1[i]) < 1e-5f, "db[%d] not accumulated", i);
    free(X), free(W), free(b), free(dY), free(c.X), free(c.W), free(c.b), free(c.dY);
}

Test(tensor_parallel, column_tp1_matches_fp64_and_finite_differences) {
    check_linear_tp1(0);
}
Test(tensor_parallel, row_tp1_matches_fp64_and_finite_differences) {
    check_linear_tp1(1);
}

/* Cross entropy written as -sum_j q_j log p_j with the smoothed target distribution spelt out
   (q_t = 1 - a, q_j = a / (K - 1)): independent of the library's closed form. */
static double ce_loss64(const double *logits, const int *targets, const double *w, int N, int V,
                        double a) {
    double L = 0;
    for (int i = 0; i < N; i++) {
        const double *z = logits + (size_t)i * V;
        double m = z[0], s = 0;
        for (int j = 1; j < V; j++) m = z[j] > m ? z[j] : m;
        for (int j = 0; j < V; j++) s += exp(z[j] - m);
        double log_z = m + log(s), loss = 0;
        for (int j = 0; j < V; j++) {
            double q = j == targets[i] ? 1.0 - a : a / (V - 1);
            loss -= q * (z[j] - log_z);
        }
        L += w[i] * loss;
    }
    return L;
}

typedef struct ce_ctx {
    double *logits, *w;
    const int *targets;
    int N, V;
    double a;
} ce_ctx;

static double ce_f(void *p) {
    ce_ctx *c = p;
    return ce_loss64(c->logits, c->targets, c->w, c->N, c->V, c->a);
}

static void check_cross_entropy_tp1(float a) {
    const int N = 4, V = 7;
    const int targets[4] = {0, 6, 3, 3};
    float *logits = init_full("ce", N, V, 2.0f), *w = init_full("ce.w", 1, N, 1.0f);
    float loss[4], max[4], sum[4], dlogits[28];
    cr_assert_eq(mc_vocab_parallel_cross_entropy_forward(loss, NULL, max, sum, NULL, logits,
                                                         targets, N,
                                                         V, a, MC_F32, NULL, ops()),
                 MC_OK, "%s", mc_last_error());
    cr_assert_eq(mc_vocab_parallel_cross_entropy_backward(dlogits, w, logits, max, sum, targets, N,
                                                          V, a, MC_F32, NULL, ops()),
                 MC_OK, "%s", mc_last_error());
    ce_ctx c = {to_f64(logits, N * V), to_f64(w, N), targets, N, V, a};
    for (int i = 0; i < N; i++) { /* one token at a time: weight 1 on token i */
        double *one = calloc(N, sizeof(double));
        one[i] = 1.0;
        double want = ce_loss64(c.logits, targets, one, N, V, a);
        cr_expect(fabs(loss[i] - want) < 1e-5 * (1 + fabs(want)), "loss[%d] = %.8g, want %.8g", i,
                  (double)loss[i], want);
        free(one);
    }
    fd_check("dlogits", c.logits, (size_t)N * V, dlogits, ce_f, &c);
    free(logits), free(w), free(c.logits), free(c.w);
}

Test(tensor_parallel, cross_entropy_tp1_matches_fp64_and_finite_differences) {
    check_cross_entropy_tp1(0.0f);
}

Test(tensor_parallel, cross_entropy_label_smoothing_tp1_matches_fp64) {
    check_cross_entropy_tp1(0.2f);
}

Test(tensor_parallel, embedding_tp1_lookup_and_accumulating_backward) {
    const int V = 5, C = 3, N = 4, ids[4] = {4, 0, 4, 2};
    float *T = init_full("emb", V, C, 1.0f), *dY = init_full("emb.dy", N, C, 1.0f);
    float out[12], dT[15];
    memset(dT, 0, sizeof dT);
    cr_assert_eq(mc_vocab_parallel_embedding_forward(out, ids, T, N, C, V, MC_F32, NULL, ops()),
                 MC_OK);
    cr_assert_eq(mc_vocab_parallel_embedding_backward(dT, dY, ids, N, C, V, MC_F32, NULL, ops()),
                 MC_OK);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++) cr_expect_eq(out[i * C + j], T[ids[i] * C + j]);
    for (int v = 0; v < V; v++)
        for (int j = 0; j < C; j++) {
            double want = 0;
            for (int i = 0; i < N; i++) want += ids[i] == v ? dY[i * C + j] : 0.0;
            cr_expect(fabs(dT[v * C + j] - want) < 1e-6, "dT[%d,%d]", v, j);
        }
    free(T), free(dY);
}

/* ---------------------------------------------------------------------------------------------
   a group of one: every mapping is the identity */

Test(tensor_parallel, mappings_are_identity_on_a_group_of_one) {
    mc_comm *self = NULL;
    cr_assert_eq(mc_comm_init_world(&self, &(mc_comm_desc){.backend = MC_BACKEND_SELF}), MC_OK);
    float *x = init_full("id", 4, 6, 1.0f), out[24];
    mc_comm *groups[2] = {NULL, self};
    for (int g = 0; g < 2; g++) {
        mc_comm *tp = groups[g];
#define SAME(call)                                                                   \
    do {                                                                             \
        memset(out, 0, sizeof out);                                                  \
        cr_expect_eq((call), MC_OK, "%s: %s", #call, mc_last_error());               \
        cr_expect(memcmp(out, x, sizeof out) == 0, "%s is not the identity", #call); \
    } while (0)
        SAME(mc_copy_to_tp_region_forward(out, x, 24, MC_F32, tp, ops()));
        SAME(mc_copy_to_tp_region_backward(out, x, 24, MC_F32, tp, ops()));
        SAME(mc_reduce_from_tp_region_forward(out, x, 24, MC_F32, tp, ops()));
        SAME(mc_reduce_from_tp_region_backward(out, x, 24, MC_F32, tp, ops()));
        SAME(mc_scatter_to_tp_region_forward(out, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_scatter_to_tp_region_backward(out, NULL, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_gather_from_tp_region_forward(out, NULL, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_gather_from_tp_region_backward(out, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_scatter_to_sp_region_forward(out, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_scatter_to_sp_region_backward(out, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_gather_from_sp_region_forward(out, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_gather_from_sp_region_backward(out, x, 4, 6, 1, MC_F32, tp, ops()));
        SAME(mc_gather_from_sp_region_backward(out, x, 4, 6, 0, MC_F32, tp, ops()));
        SAME(mc_reduce_scatter_to_sp_region_forward(out, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_reduce_scatter_to_sp_region_backward(out, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_all_gather_last_dim_forward(out, NULL, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_all_gather_last_dim_backward(out, NULL, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_reduce_scatter_last_dim_forward(out, NULL, x, 4, 6, MC_F32, tp, ops()));
        SAME(mc_reduce_scatter_last_dim_backward(out, NULL, x, 4, 6, MC_F32, tp, ops()));
#undef SAME
    }
    /* SP on a group of one is ignored, as Megatron's layers do: no scratch, same result */
    cr_expect_eq(mc_column_parallel_linear_scratch(4, 1, 6, 6, MC_TP_SEQUENCE_PARALLEL, 1), 0);
    cr_expect_eq(mc_row_parallel_linear_scratch(
                     4, 1, 6, 6, MC_TP_SEQUENCE_PARALLEL | MC_TP_INPUT_IS_PARALLEL, 1),
                 0);
    free(x);
    mc_comm_destroy(self);
}

/* The MLP's fused pair on one rank: column forward + GELU and the row backward through GELU
   equal the plain layers with gelu_forward / gelu_backward between them, bit for bit; a table
   without the fused ops (NULL slots) gives the same numbers. */
Test(tensor_parallel, gelu_fused_layers_equal_the_composition) {
    enum { S = 5, B = 2, C = 8, F = 12, N = S * B };
    float X[N * C], W1[F * C], b1[F], W2[C * F], dY[N * C];
    uint32_t r = 77u;
#define TP_RAND() ((float)((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f)
    for (int i = 0; i < N * C; i++) X[i] = 2.0f * TP_RAND(), dY[i] = TP_RAND();
    for (int i = 0; i < F * C; i++) W1[i] = TP_RAND(), W2[i] = TP_RAND();
    for (int i = 0; i < F; i++) b1[i] = TP_RAND();
#undef TP_RAND
    mc_ops bare = *ops();
    bare.gemm_gelu_forward = NULL;
    bare.gemm_gelu_backward = NULL;
    const mc_ops *tables[2] = {ops(), &bare};
    float pre0[N * F], act0[N * F], dact0[N * F], dpre0[N * F];
    float dW0[C * F] = {0}, db0[C] = {0};
    int flags = MC_TP_INPUT_IS_PARALLEL;
    cr_assert_eq(mc_column_parallel_linear_forward(pre0, NULL, X, W1, b1, S, B, C, F, 0, MC_F32,
                                                   NULL, ops()), MC_OK);
    cr_assert_eq(ops()->gelu_forward(ops(), act0, pre0, N * F, MC_F32), MC_OK);
    cr_assert_eq(mc_row_parallel_linear_backward(dact0, dW0, db0, NULL, dY, act0, W2, S, B, F, C,
                                                 flags, MC_F32, NULL, ops()), MC_OK);
    cr_assert_eq(ops()->gelu_backward(ops(), dpre0, pre0, dact0, N * F, MC_F32), MC_OK);
    for (int t = 0; t < 2; t++) {
        float pre[N * F], act[N * F], dpre[N * F], dW[C * F] = {0}, db[C] = {0};
        cr_assert_eq(mc_column_parallel_linear_gelu_forward(act, pre, NULL, X, W1, b1, S, B, C, F,
                                                            0, MC_F32, NULL, tables[t]), MC_OK,
                     "%s", mc_last_error());
        cr_expect_eq(memcmp(pre, pre0, sizeof pre), 0, "table %d: pre", t);
        cr_expect_eq(memcmp(act, act0, sizeof act), 0, "table %d: gelu(pre)", t);
        cr_assert_eq(mc_row_parallel_linear_gelu_backward(dpre, dW, db, NULL, dY, act, pre, W2, S,
                                                          B, F, C, flags, MC_F32, NULL,
                                                          tables[t]), MC_OK,
                     "%s", mc_last_error());
        cr_expect_eq(memcmp(dpre, dpre0, sizeof dpre), 0, "table %d: dpre", t);
        cr_expect_eq(memcmp(dW, dW0, sizeof dW), 0, "table %d: dW", t);
        cr_expect_eq(memcmp(db, db0, sizeof db), 0, "table %d: db", t);
    }
}

/* ---------------------------------------------------------------------------------------------
   errors and sizes */

static void expect_error(int rc, const char *needle) {
    cr_expect_eq(rc, MC_ERR_INVALID_ARG, "got %s (%s)", mc_err_name(rc), mc_last_error());
    cr_expect(mc_test_contains(mc_last_error(), needle), "message '%s' lacks '%s'", mc_last_error(),
              needle);
}

Test(tensor_parallel, error_messages_name_the_rule) {
    float buf[64] = {0};
    int ids[2] = {0, 9};
    expect_error(mc_row_parallel_linear_forward(buf, NULL, buf, buf, NULL, 2, 1, 4, 2,
                                                MC_TP_SEQUENCE_PARALLEL, MC_F32, NULL, ops()),
                 "`input_is_parallel` must be `True`");
    expect_error(mc_column_parallel_linear_forward(buf, NULL, buf, buf, NULL, 2, 1, 4, 2,
                                                   MC_TP_SEQUENCE_PARALLEL | MC_TP_GATHER_OUTPUT, MC_F32,
                                                   NULL, ops()),
                 "not sequence_parallel when gather_output");
    expect_error(mc_column_parallel_linear_forward(buf, NULL, buf, buf, NULL, 2, 1, 4, 2,
                                                   MC_TP_INPUT_IS_PARALLEL, MC_F32, NULL, ops()),
                 "row-parallel option");
    expect_error(mc_vocab_range(10, 1, 4, NULL, NULL),
                 "vocabulary size (10) is not divisible by tensor_model_parallel_size (4)");
    expect_error(mc_vocab_range(8, 4, 4, NULL, NULL), "tp_rank (4) is not in [0, tp_size = 4)");
    expect_error(mc_vocab_parallel_embedding_forward(buf, ids, buf, 2, 2, 8, MC_F32, NULL, ops()),
                 "ids[1] = 9 is outside the vocabulary [0, 8)");
    expect_error(mc_vocab_parallel_cross_entropy_forward(buf, NULL, buf, buf, NULL, buf, ids, 2, 8,
                                                         0.0f, MC_F32,
                                                         NULL, ops()),
                 "targets[1] = 9 is outside the vocabulary [0, 8)");
    ids[1] = 1;
    expect_error(mc_vocab_parallel_cross_entropy_forward(buf, NULL, buf, buf, NULL, buf, ids, 2, 8,
                                                         1.0f, MC_F32,
                                                         NULL, ops()),
                 "label_smoothing (1) must be in [0, 1)");
    expect_error(mc_copy_to_tp_region_forward(buf, buf, 4, MC_F32, NULL, NULL), "ops is NULL");
    expect_error(mc_column_parallel_linear_gelu_forward(buf, buf + 32, NULL, buf, buf, NULL, 2, 1,
                                                        4, 2, MC_TP_GATHER_OUTPUT, MC_F32, NULL,
                                                        ops()),
                 "must not hold MC_TP_GATHER_OUTPUT");
    expect_error(mc_column_parallel_linear_gelu_forward(buf, buf, NULL, buf, buf, NULL, 2, 1, 4, 2,
                                                        0, MC_F32, NULL, ops()),
                 "must be two buffers");
    expect_error(mc_row_parallel_linear_gelu_backward(buf, buf, NULL, NULL, buf, buf, buf + 32, buf,
                                                      2, 1, 4, 2, 0, MC_F32, NULL, ops()),
                 "must hold MC_TP_INPUT_IS_PARALLEL");
    int start = -1, end = -1;
    cr_expect_eq(mc_vocab_range(16, 2, 4, &start, &end), MC_OK);
    cr_expect(start == 8 && end == 12, "rank 2 of 4 owns [%d, %d), want [8, 12)", start, end);
}

/* §4: the padded vocabulary (from @config) splits evenly, and each rank's range follows. */
Test(tensor_parallel, padded_vocabulary_splits_over_tp) {
    const int tps[3] = {1, 2, 8}, want[3] = {50304, 50432, 51200};
    for (int k = 0; k < 3; k++) {
        int V = mc_gpt_padded_vocab_size(50257, 128, tps[k]), start = -1, end = -1;
        cr_expect_eq(V, want[k], "50257 at TP %d -> %d, want %d", tps[k], V, want[k]);
        cr_expect_eq(mc_vocab_range(V, tps[k] - 1, tps[k], &start, &end), MC_OK, "%s",
                     mc_last_error());
        cr_expect(end == V && end - start == V / tps[k], "last rank of %d: [%d, %d)", tps[k],
                  start, end);
    }
    cr_expect_eq(mc_gpt_padded_vocab_size(32000, 128, 4), 32256);
}

/* Scratch: column SP needs the gathered input in forward and input + full dX in backward;
   gather_output the local output and the [TP, N, OC/TP] buffer; row without
   input_is_parallel the split input, the local dX and the gather buffer. */
Test(tensor_parallel, scratch_sizes) {
    const int S = 8, B = 2, C = 16, OC = 12, N = S * B;
    cr_expect_eq(mc_column_parallel_linear_scratch(S, B, C, OC, 0, 4), 0);
    cr_expect_eq(mc_column_parallel_linear_scratch(S, B, C, OC, MC_TP_SEQUENCE_PARALLEL, 4),
                 (size_t)2 * N * C);
    cr_expect_eq(mc_column_parallel_linear_scratch(S, B, C, OC, MC_TP_GATHER_OUTPUT, 4),
                 (size_t)N * OC / 4 + (size_t)N * OC);
    cr_expect_eq(mc_row_parallel_linear_scratch(S, B, C, OC, MC_TP_INPUT_IS_PARALLEL, 4), 0);
    cr_expect_eq(mc_row_parallel_linear_scratch(S, B, C, OC, 0, 4),
                 (size_t)2 * N * C / 4 + (size_t)N * C);
    cr_expect_eq(mc_row_parallel_linear_scratch(
                     S, B, C, OC, MC_TP_INPUT_IS_PARALLEL | MC_TP_SEQUENCE_PARALLEL, 4),
                 (size_t)N * OC);
    cr_expect_eq(mc_vocab_parallel_cross_entropy_scratch(N, 64, 0.0f, 4), (size_t)N);
    cr_expect_eq(mc_vocab_parallel_cross_entropy_scratch(N, 64, 0.1f, 4), (size_t)3 * N);
}
