/* gemm_bench.c - GFLOP/s of the CPU op table's GEMM, side by side with cblas_sgemm.

       make bench && ./build/bench/gemm_bench                   the blocked reference only
       make bench CBLAS=1 && ./build/bench/gemm_bench           both, plus their largest
                                                                difference
   Single-threaded comparison: set OPENBLAS_NUM_THREADS=1 (the reference GEMM uses one core).
   Each size runs for at least MIN_SECONDS; 2*M*N*K flops per call. The shapes are square
   sizes plus the GEMMs of one transformer layer at hidden 768, 1024 tokens: QKV forward
   (NT: activations x weight^T), its weight gradient (TN) and input gradient (NN). */
#define MEGATRON_C_IMPLEMENTATION
#include "megatron_c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(MC_USE_CBLAS)
#include <cblas.h>
#endif

#define MIN_SECONDS 0.5

typedef void (*gemm_fn)(float *C, const float *A, const float *B, int M, int N, int K,
                        int trans_a, int trans_b, float alpha, float beta);

typedef struct shape {
    const char *name;
    int M, N, K, ta, tb;
} shape;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* GFLOP/s of gemm on this shape: repeats until MIN_SECONDS have passed (at least twice). */
static double gflops(gemm_fn gemm, const shape *s, float *C, const float *A, const float *B) {
    double t0, elapsed;
    long calls = 0;
    gemm(C, A, B, s->M, s->N, s->K, s->ta, s->tb, 1.0f, 0.0f);   /* warm up */
    t0 = now();
    do {
        gemm(C, A, B, s->M, s->N, s->K, s->ta, s->tb, 1.0f, 0.0f);
        calls++;
        elapsed = now() - t0;
    } while (elapsed < MIN_SECONDS || calls < 2);
    return 2.0 * s->M * s->N * (double)s->K * (double)calls / elapsed * 1e-9;
}

#if defined(MC_USE_CBLAS)
static void cblas_gemm(float *C, const float *A, const float *B, int M, int N, int K,
                       int trans_a, int trans_b, float alpha, float beta) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, trans_a ? M : K, B,
                trans_b ? K : N, beta, C, N);
}
#endif

int main(void) {
    static const shape shapes[] = {
        {"square 256", 256, 256, 256, 0, 0},
        {"square 512", 512, 512, 512, 0, 0},
        {"square 1024", 1024, 1024, 1024, 0, 0},
        {"qkv fwd  NT", 1024, 2304, 768, 0, 1},
        {"qkv dW   TN", 2304, 768, 1024, 1, 0},
        {"qkv dX   NN", 1024, 768, 2304, 0, 0},
    };
    size_t i, j;
    printf("%-12s %5s %5s %5s  %14s", "shape", "M", "N", "K", "blocked GF/s");
#if defined(MC_USE_CBLAS)
    printf("  %12s  %7s  %10s", "cblas GF/s", "ratio", "max |diff|");
#endif
    printf("\n");
    for (i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
        float *A = (float *)malloc(na * sizeof(float)), *B = (float *)malloc(nb * sizeof(float));
        float *C = (float *)malloc(nc * sizeof(float));
        mc_rng rng = {42, 0};
        double g;
        if (!A || !B || !C) {
            fprintf(stderr, "gemm_bench: out of memory for %s\n", s->name);
            return 1;
        }
        mc_rng_uniform(&rng, A, na);
        mc_rng_uniform(&rng, B, nb);
        g = gflops(mc_cpu_gemm_blocked, s, C, A, B);
        printf("%-12s %5d %5d %5d  %14.2f", s->name, s->M, s->N, s->K, g);
#if defined(MC_USE_CBLAS)
        {
            float *C2 = (float *)malloc(nc * sizeof(float));
            double g2, maxdiff = 0.0;
            if (!C2) return 1;
            g2 = gflops(cblas_gemm, s, C2, A, B);
            mc_cpu_gemm_blocked(C, A, B, s->M, s->N, s->K, s->ta, s->tb, 1.0f, 0.0f);
            for (j = 0; j < nc; j++) {
                double d = fabs((double)C[j] - (double)C2[j]);
                if (d > maxdiff) maxdiff = d;
            }
            printf("  %12.2f  %6.2fx  %10.2e", g2, g2 / g, maxdiff);
            free(C2);
        }
#else
        (void)j;
#endif
        printf("\n");
        fflush(stdout);
        free(A), free(B), free(C);
    }
    return 0;
}
