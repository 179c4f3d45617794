/* test_ops_cblas.c - mc_ops_cpu_cblas: the CPU op table with its GEMM through cblas_sgemm.

   Built against the library compiled with MC_WITH_CBLAS (the Makefile's TEST_IMPL_ops_cblas).
   The table must be the reference table with one slot swapped: the same memory, every other op
   the reference function, and a gemm with the same contract (both transposes, alpha, beta = 0
   never reading C, beta = 1 accumulating, K = 0, the bias on every row, bf16 operands), checked
   against a naive fp64 GEMM written here. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"

TestSuite(ops_cblas, .timeout = 60);

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float uniform(void) {   /* [-1, 1) */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 4503599627370496.0 - 1.0);
}

/* C = alpha op(A) op(B) + beta C (+ bias), in double. */
static void naive_gemm(double *C, const float *A, const float *B, const float *bias, int M, int N,
                       int K, int ta, int tb, double alpha, double beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? A[k * M + i] : A[i * K + k]) *
                     (double)(tb ? B[j * K + k] : B[k * N + j]);
            C[i * N + j] = alpha * s + beta * C[i * N + j] + (bias ? bias[j] : 0.0);
        }
}

static const mc_ops *table(void) {
    const mc_ops *t = mc_ops_cpu_cblas();
#if defined(MC_WITH_CBLAS)
    cr_assert_not_null(t, "the library was built with MC_WITH_CBLAS: the table exists");
#else
    cr_expect_null(t, "a library built without MC_WITH_CBLAS has no table");
    cr_skip_test("built with WITH_CBLAS=0: no CBLAS table to test");
#endif
    return t;
}

Test(ops_cblas, is_the_reference_table_with_gemm_swapped) {
    const mc_ops *ref = mc_ops_cpu_reference(), *t = table();
    cr_expect_str_eq(t->name, "cpu-cblas");
    cr_expect_eq(t->device, MC_DEVICE_CPU);
    cr_expect(mc_ops_same_memory(ref, t) && mc_ops_same_memory(t, ref), "one memory");
    cr_expect(t->gemm != ref->gemm, "its gemm is another function");
    cr_expect(t->alloc == ref->alloc && t->free == ref->free && t->upload == ref->upload &&
                  t->download == ref->download && t->copy_2d == ref->copy_2d,
              "the memory ops are the reference ones");
    cr_expect(t->layernorm_forward == ref->layernorm_forward &&
                  t->attention_forward == ref->attention_forward &&
                  t->attention_backward == ref->attention_backward &&
                  t->cross_entropy_backward == ref->cross_entropy_backward &&
                  t->adamw == ref->adamw,
              "every other compute op is the reference one");
}

Test(ops_cblas, gemm_matches_fp64_for_every_transpose_and_beta) {
    const mc_ops *t = table();
    static const int shapes[][3] = {{3, 5, 7}, {1, 1, 1}, {37, 133, 259}, {64, 48, 1}};
    static const float alphas[] = {1.0f, -0.5f}, betas[] = {0.0f, 1.0f, 0.25f};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
        float *C = malloc(sizeof(float) * M * N), *bias = malloc(sizeof(float) * N);
        double *want = malloc(sizeof(double) * M * N);
        for (int i = 0; i < M * K; i++) A[i] = uniform();
        for (int i = 0; i < K * N; i++) B[i] = uniform();
        for (int i = 0; i < N; i++) bias[i] = uniform();
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 3; b++) {
                        const float *bs = (a + b) % 2 ? bias : NULL;
                        for (int i = 0; i < M * N; i++) want[i] = C[i] = uniform();
                        if (betas[b] == 0.0f)   /* beta = 0 must not read C */
                            for (int i = 0; i < M * N; i++) C[i] = NAN;
                        naive_gemm(want, A, B, bs, M, N, K, ta, tb, alphas[a], betas[b]);
                        cr_assert_eq(t->gemm(t, C, A, B, bs, M, N, K, ta, tb, alphas[a],
                                             betas[b], MC_F32, MC_F32),
                                     MC_OK);
                        double worst = 0.0;
                        for (int i = 0; i < M * N; i++)
                            worst = fmax(worst, fabs((double)C[i] - want[i]) /
                                                    (1.0 + fabs(want[i])));
                        cr_expect(worst < 1e-5 * (K > 64 ? 4 : 1), "M%d N%d K%d ta%d tb%d alpha "
                                  "%g beta %g bias %d: worst relative error %g", M, N, K, ta, tb,
                                  (double)alphas[a], (double)betas[b], bs != NULL, worst);
                    }
        free(A), free(B), free(C), free(bias), free(want);
    }
}

Test(ops_cblas, gemm_k_zero_and_bf16_operands) {
    const mc_ops *t = table(), *ref = mc_ops_cpu_reference();
    /* K = 0: beta C + bias, A and B never read */
    float C[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {10, 20, 30};
    cr_assert_eq(t->gemm(t, C, NULL, NULL, bias, 2, 3, 0, 0, 0, 1.0f, 0.5f, MC_F32, MC_F32), MC_OK);
    for (int i = 0; i < 6; i++) cr_expect_eq(C[i], 0.5f * (float)(i + 1) + bias[i % 3]);
    /* bf16 operands and result: the same bf16 values as the reference table (fp32 math, one
       rounding on store; the sums differ only in order, far below one bf16 ulp here) */
    enum { M = 4, N = 6, K = 8 };
    mc_bf16 A[M * K], B[K * N], Cb[M * N], Cr[M * N];
    for (int i = 0; i < M * K; i++) A[i] = mc_bf16_from_float((float)(i % 5) * 0.25f);
    for (int i = 0; i < K * N; i++) B[i] = mc_bf16_from_float((float)(i % 3) * 0.5f);
    cr_assert_eq(t->gemm(t, Cb, A, B, NULL, M, N, K, 0, 0, 1.0f, 0.0f, MC_BF16, MC_BF16), MC_OK);
    cr_assert_eq(ref->gemm(ref, Cr, A, B, NULL, M, N, K, 0, 0, 1.0f, 0.0f, MC_BF16, MC_BF16),
                 MC_OK);
    cr_expect(memcmp(Cb, Cr, sizeof Cb) == 0, "bf16 results equal the reference table's");
    /* bad shapes are refused with the reference table's message */
    cr_expect_eq(t->gemm(t, C, NULL, NULL, NULL, -1, 3, 0, 0, 0, 1.0f, 0.0f, MC_F32, MC_F32),
                 MC_ERR_INVALID_ARG);
    cr_expect(strstr(mc_last_error(), "cpu gemm: M (-1)") != NULL, "%s", mc_last_error());
}
