/* gemm_bench.c - GFLOP/s of the CPU GEMMs, side by side in one run:

     reference   mc_cpu_gemm_blocked, the reference table's kernel (one thread)
     fast 1t/2t  the default table's gemm (mc_ops_cpu_fast) at 1 and 2 threads: the BLAS it
                 was built with (make: OpenBLAS when installed), or the blocked kernel split
                 across the threads
     blas 1t/2t  the machine's cblas_sgemm called directly, OpenBLAS at 1 and 2 of its own
                 threads (only when built with a BLAS)

       make bench && ./build/bench/gemm_bench [MIN_SECONDS | --describe]

   Each cell repeats its GEMM for at least MIN_SECONDS (default 0.3; 2*M*N*K flops per call)
   after one warm-up call; the columns of a row run one after another, so they see the same
   machine load. The shapes are the GEMMs of the two bench-cpu models (per micro-batch of
   B*T = 512 and 256 tokens): QKV forward (NT: activations x weight^T), its weight gradient
   (TN) and input gradient (NN), the MLP and the output layer. */
#define MEGATRON_C_IMPLEMENTATION
#include "megatron_c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct shape {
    const char *name;
    int M, N, K, ta, tb;
} shape;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double min_seconds = 0.3;

/* which: 0 the reference kernel, 1 the fast table, 2 cblas_sgemm */
static void run(int which, const shape *s, float *C, const float *A, const float *B) {
    if (which == 0) {
        mc_cpu_gemm_blocked(C, A, B, s->M, s->N, s->K, s->ta, s->tb, 1.0f, 0.0f);
    } else if (which == 1) {
        const mc_ops *o = mc_ops_cpu_fast();
        o->gemm(o, C, A, B, NULL, s->M, s->N, s->K, s->ta, s->tb, 1.0f, 0.0f, MC_F32, MC_F32);
    } else {
#if defined(MC_USE_CBLAS)
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K, 1.0f, A,
                    s->ta ? s->M : s->K, B, s->tb ? s->K : s->N, 0.0f, C, s->N);
#endif
    }
}

static double gflops(int which, const shape *s, float *C, const float *A, const float *B) {
    double t0, elapsed;
    long calls = 0;
    run(which, s, C, A, B);   /* warm up */
    t0 = now();
    do {
        run(which, s, C, A, B);
        calls++;
        elapsed = now() - t0;
    } while (elapsed < min_seconds || calls < 2);
    return 2.0 * s->M * s->N * (double)s->K * (double)calls / elapsed * 1e-9;
}

static void set_blas_threads(int n) {
#if defined(MC_USE_CBLAS) && defined(OPENBLAS_VERSION)
    openblas_set_num_threads(n);
#else
    (void)n;
#endif
}

int main(int argc, char **argv) {
    static const shape shapes[] = {
        {"L4 qkv fwd NT", 512, 384, 128, 0, 1},
        {"L4 qkv dW  TN", 384, 128, 512, 1, 0},
        {"L4 mlp dX  NN", 512, 128, 512, 0, 0},
        {"L4 logits  NT", 512, 512, 128, 0, 1},
        {"124M qkv   NT", 256, 2304, 768, 0, 1},
        {"124M qkv dW TN", 2304, 768, 256, 1, 0},
        {"124M fc2 dX NN", 256, 768, 3072, 0, 0},
        {"124M logits NT", 256, 50304, 768, 0, 1},
    };
    const int have_blas = mc_cpu_blas() != NULL;
    size_t i, j;
    printf("gemm_bench: fast table %s, %d threads by default; GFLOP/s (2*M*N*K per call)\n",
           have_blas ? mc_cpu_blas() : "blocked kernel (no BLAS)", mc_cpu_threads());
    if (argc > 1 && strcmp(argv[1], "--describe") == 0) return 0;
    if (argc > 1) min_seconds = atof(argv[1]);
    printf("%-15s %5s %5s %5s  %9s %8s %8s", "shape", "M", "N", "K", "reference", "fast 1t",
           "fast 2t");
    if (have_blas) printf(" %8s %8s %11s", "blas 1t", "blas 2t", "fast/blas1");
    printf("  %10s\n", "max|f-r|");
    for (i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
        float *A = (float *)malloc(na * sizeof(float)), *B = (float *)malloc(nb * sizeof(float));
        float *C = (float *)malloc(nc * sizeof(float)), *C2 = (float *)malloc(nc * sizeof(float));
        mc_rng rng = {42, 0};
        double g_ref, g_f1, g_f2, g_b1 = 0, g_b2 = 0, maxdiff = 0.0;
        if (!A || !B || !C || !C2) {
            fprintf(stderr, "gemm_bench: out of memory for %s\n", s->name);
            return 1;
        }
        mc_rng_uniform(&rng, A, na);
        mc_rng_uniform(&rng, B, nb);
        g_ref = gflops(0, s, C, A, B);
        mc_cpu_set_threads(1);
        g_f1 = gflops(1, s, C2, A, B);
        mc_cpu_set_threads(2);
        g_f2 = gflops(1, s, C2, A, B);
        mc_cpu_set_threads(0);
        if (have_blas) {
            set_blas_threads(1);
            g_b1 = gflops(2, s, C2, A, B);
            set_blas_threads(2);
            g_b2 = gflops(2, s, C2, A, B);
            set_blas_threads(1);   /* the fast table's setting */
        }
        run(0, s, C, A, B);
        run(1, s, C2, A, B);
        for (j = 0; j < nc; j++) {
            double d = fabs((double)C[j] - (double)C2[j]);
            if (d > maxdiff) maxdiff = d;
        }
        printf("%-15s %5d %5d %5d  %9.1f %8.1f %8.1f", s->name, s->M, s->N, s->K, g_ref, g_f1,
               g_f2);
        if (have_blas) printf(" %8.1f %8.1f %10.2fx", g_b1, g_b2, g_f1 / g_b1);
        printf("  %10.2e\n", maxdiff);
        fflush(stdout);
        free(A), free(B), free(C), free(C2);
    }
    return 0;
}
