/* tests/tp_ref_ops.h - a small CPU op table for the tensor-parallel tests: the ops the
   tensor_parallel block calls (fill, copy, gemm, add_bias, bias_backward, embedding, cross-entropy
   pieces), as plain loops. Temporary: the suites switch to mc_ops_cpu() once the op table's
   implementation is merged. Include after megatron_c.h. */
#ifndef TP_REF_OPS_H_INCLUDED
#define TP_REF_OPS_H_INCLUDED

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void *tp_ref_alloc(size_t bytes) {
    return calloc(1, bytes ? bytes : 1);
}
static void tp_ref_free(void *p) {
    free(p);
}

static void tp_ref_fill(float *x, float value, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = value;
}

static void tp_ref_copy(float *dst, const float *src, size_t n) {
    memmove(dst, src, n * sizeof *dst);
}

static void tp_ref_gemm(float *C, const float *A, const float *B, int M, int N, int K, int trans_a,
                        int trans_b, float alpha, float beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) {
                double a = trans_a ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
                double b = trans_b ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                acc += a * b;
            }
            float *c = &C[(size_t)i * N + j];
            *c = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
}

static void tp_ref_add_bias(float *out, const float *bias, int N, int C) {
    if (!bias) return;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++) out[(size_t)i * C + j] += bias[j];
}

static void tp_ref_bias_backward(float *dbias, const float *dout, int N, int C) {
    for (int j = 0; j < C; j++) {
        double acc = 0.0;
        for (int i = 0; i < N; i++) acc += dout[(size_t)i * C + j];
        dbias[j] += (float)acc;
    }
}

static void tp_ref_embedding_forward(float *out, const int *ids, const float *table, int N, int C,
                                     int vocab_start, int vocab_end) {
    for (int i = 0; i < N; i++) {
        int local = ids[i] >= vocab_start && ids[i] < vocab_end;
        for (int j = 0; j < C; j++)
            out[(size_t)i * C + j] = local ? table[(size_t)(ids[i] - vocab_start) * C + j] : 0.0f;
    }
}

static void tp_ref_embedding_backward(float *dtable, const float *dout, const int *ids, int N,
                                      int C, int vocab_start, int vocab_end) {
    for (int i = 0; i < N; i++) {
        if (ids[i] < vocab_start || ids[i] >= vocab_end) continue;
        for (int j = 0; j < C; j++)
            dtable[(size_t)(ids[i] - vocab_start) * C + j] += dout[(size_t)i * C + j];
    }
}

static void tp_ref_row_max(float *max, const float *logits, int N, int V) {
    for (int i = 0; i < N; i++) {
        float m = logits[(size_t)i * V];
        for (int j = 1; j < V; j++)
            m = logits[(size_t)i * V + j] > m ? logits[(size_t)i * V + j] : m;
        max[i] = m;
    }
}

static void tp_ref_target_logit(float *out, const float *logits, const int *targets, int N, int V,
                                int vocab_start) {
    for (int i = 0; i < N; i++) {
        int t = targets[i] - vocab_start;
        out[i] = t >= 0 && t < V ? logits[(size_t)i * V + t] : 0.0f;
    }
}

static void tp_ref_sum_exp(float *sum, const float *logits, const float *max, int N, int V) {
    for (int i = 0; i < N; i++) {
        double acc = 0.0;
        for (int j = 0; j < V; j++) acc += exp((double)logits[(size_t)i * V + j] - max[i]);
        sum[i] = (float)acc;
    }
}

/* (softmax - (1 - s) onehot - s / K) * dloss, K = vocab_global, s as given */
static void tp_ref_cross_entropy_backward(float *dlogits, const float *logits, const float *max,
                                          const float *sum, const int *targets, const float *dloss,
                                          int N, int V, int vocab_start, float smoothing,
                                          int vocab_global) {
    double K = vocab_global;
    double s = smoothing;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < V; j++) {
            double p = exp((double)logits[(size_t)i * V + j] - max[i]) / sum[i];
            double g = p - s / K - (targets[i] - vocab_start == j ? 1.0 - s : 0.0);
            dlogits[(size_t)i * V + j] = (float)(g * dloss[i]);
        }
}

static const mc_ops *tp_ref_ops(void) {
    static mc_ops ops;
    static int ready = 0;
    if (!ready) {
        memset(&ops, 0, sizeof ops);
        ops.name = "tp-test-cpu";
        ops.device = MC_DEVICE_CPU;
        ops.alloc = tp_ref_alloc;
        ops.free = tp_ref_free;
        ops.fill = tp_ref_fill;
        ops.copy = tp_ref_copy;
        ops.gemm = tp_ref_gemm;
        ops.add_bias = tp_ref_add_bias;
        ops.bias_backward = tp_ref_bias_backward;
        ops.embedding_forward = tp_ref_embedding_forward;
        ops.embedding_backward = tp_ref_embedding_backward;
        ops.row_max = tp_ref_row_max;
        ops.target_logit = tp_ref_target_logit;
        ops.sum_exp = tp_ref_sum_exp;
        ops.cross_entropy_backward = tp_ref_cross_entropy_backward;
        ready = 1;
    }
    return &ops;
}

#endif /* TP_REF_OPS_H_INCLUDED */
