/* labs/lab06_attention.c - YOUR attention module for lab06. THIS FILE IS YOURS TO EDIT:
   change the module, `make lab06`, run `mpirun --oversubscribe -np 2 ./lab06` again. The lab
   runs it through the same integration matrix as the built-in module and its broken copies
   (TP=1 against the local attention, TP=2, dropout RNG under recompute, PP=2, checkpoint
   keys, a refused shape) and prints its row as "yours"; the model itself is not recompiled.

   As shipped it is the textbook attention: it keeps the probabilities [B, NHl, S, S] for the
   backward (what the local attention keeps on the CPU), draws their dropout from the
   model-parallel stream, and keeps everything per micro-batch in ctx->attention_cache.
   Things to try, one at a time, and the cell you expect to catch each:
     - drop the causal test `t2 <= t` in yours_core_forward;
     - split by gpt->NH (the model's heads) instead of gpt->NHl (this rank's);
     - draw from MC_RNG_DEFAULT instead of MC_RNG_MODEL_PARALLEL;
     - keep the probabilities in a static buffer instead of ctx->attention_cache;
     - rename a tensor in yours_names below;
     - refuse a shape in yours_accepts (the model then runs the local attention).
   Shapes and the dropout rule are in labs/lab06_attention.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab06_attention.h"

/* Where the cache of one layer and micro-batch keeps each tensor, in floats from the start of
   ctx->attention_cache (op memory: written with upload, read with download). */
typedef struct yours_layout {
    size_t qkv;     /* [N, 3 Ql] the QKV projection */
    size_t ctx;     /* [N, Ql] softmax(q k^T) v, the projection's input */
    size_t probs;   /* [B, NHl, S, S] the probabilities before dropout (0 above the diagonal) */
    size_t draw;    /* the dropout draw (lab06_draw) */
    size_t total;
} yours_layout;

static yours_layout yours_layout_of(const mc_gpt *g) {
    yours_layout L;
    size_t N = (size_t)g->N, Ql = (size_t)g->Ql;
    L.qkv = 0;
    L.ctx = L.qkv + N * 3 * Ql;
    L.probs = L.ctx + N * Ql;
    L.draw = L.probs + (size_t)g->B * (size_t)g->NHl * (size_t)g->S * (size_t)g->S;
    L.total = L.draw + sizeof(lab06_draw) / sizeof(float);
    return L;
}

/* Keep factor of probability element i: 0, or 1 / (1 - p) (1 without dropout). */
static float yours_keep(const lab06_draw *d, size_t i) {
    if (!(d->p > 0.0f)) return 1.0f;
    return mc_rng_uniform_at(d->seed, d->offset + i) >= d->p ? 1.0f / (1.0f - d->p) : 0.0f;
}

/* The core on host arrays: probs (=) and ctx (=) from qkv. */
static void yours_core_forward(float *ctx, float *probs, const float *qkv, int S, int B,
                               int NH, int HD, const lab06_draw *d) {
    float scale = 1.0f / sqrtf((float)HD);
    size_t row = (size_t)NH * 3 * HD;   /* floats per token in qkv */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < S; t++) {
                const float *q = qkv + (size_t)(t * B + b) * row + (size_t)h * 3 * HD;
                size_t at = (((size_t)b * NH + h) * S + t) * S;   /* probability row */
                float *p = probs + at, mx = -INFINITY, sum = 0.0f;
                for (int t2 = 0; t2 < S; t2++) {
                    p[t2] = 0.0f;
                    if (!(t2 <= t)) continue;   /* causal: only positions up to t */
                    const float *k = qkv + (size_t)(t2 * B + b) * row + (size_t)h * 3 * HD + HD;
                    float s = 0.0f;
                    for (int i = 0; i < HD; i++) s += q[i] * k[i];
                    p[t2] = s * scale;
                    if (p[t2] > mx) mx = p[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) sum += p[t2] = expf(p[t2] - mx);
                for (int t2 = 0; t2 <= t; t2++) p[t2] /= sum;
                float *c = ctx + (size_t)(t * B + b) * NH * HD + (size_t)h * HD;
                for (int i = 0; i < HD; i++) c[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v =
                        qkv + (size_t)(t2 * B + b) * row + (size_t)h * 3 * HD + 2 * HD;
                    float z = p[t2] * yours_keep(d, at + (size_t)t2);
                    for (int i = 0; i < HD; i++) c[i] += z * v[i];
                }
            }
}

/* dqkv (=) from dctx, with the probabilities and qkv the forward kept. */
static void yours_core_backward(float *dqkv, const float *dctx, const float *qkv,
                                const float *probs, int S, int B, int NH, int HD,
                                const lab06_draw *d) {
    float scale = 1.0f / sqrtf((float)HD);
    size_t row = (size_t)NH * 3 * HD;
    memset(dqkv, 0, sizeof(float) * (size_t)S * B * row);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < S; t++) {
                size_t qt = (size_t)(t * B + b) * row + (size_t)h * 3 * HD;
                size_t at = (((size_t)b * NH + h) * S + t) * S;
                const float *p = probs + at;
                const float *dc = dctx + (size_t)(t * B + b) * NH * HD + (size_t)h * HD;
                float dp[1024], dot = 0.0f;   /* S <= 1024 (yours_accepts) */
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t kv = (size_t)(t2 * B + b) * row + (size_t)h * 3 * HD;
                    float keep = yours_keep(d, at + (size_t)t2), dz = 0.0f;
                    for (int i = 0; i < HD; i++) {
                        dz += dc[i] * qkv[kv + 2 * HD + i];        /* d z = dctx . v */
                        dqkv[kv + 2 * HD + i] += p[t2] * keep * dc[i];   /* dv += z dctx */
                    }
                    dp[t2] = dz * keep;
                    dot += p[t2] * dp[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t kv = (size_t)(t2 * B + b) * row + (size_t)h * 3 * HD;
                    float ds = p[t2] * (dp[t2] - dot) * scale;   /* softmax backward */
                    for (int i = 0; i < HD; i++) {
                        dqkv[qt + i] += ds * qkv[kv + HD + i];
                        dqkv[kv + HD + i] += ds * qkv[qt + i];
                    }
                }
            }
}

static int yours_forward(const mc_layer_ctx *ctx, void *out, const void *inp) {
    mc_gpt *g = ctx->gpt;
    const mc_ops *o = g->ops;
    yours_layout L = yours_layout_of(g);
    float *cache = (float *)ctx->attention_cache;
    size_t n_qkv = (size_t)g->N * 3 * g->Ql, n_ctx = (size_t)g->N * g->Ql;
    size_t n_probs = L.draw - L.probs;
    lab06_draw d;
    int rc = mc_column_parallel_linear_forward(cache + L.qkv, NULL, inp, ctx->w[MC_GPT_QKV_W],
                                               ctx->w[MC_GPT_QKV_B], g->S, g->B, g->H,
                                               3 * g->Q, lab06_tp_flags(g), g->dtype,
                                               lab06_tp(g), o);
    if (rc == MC_OK) rc = lab06_draw_dropout(g, MC_RNG_MODEL_PARALLEL, n_probs, &d);
    if (rc != MC_OK) return rc;
    float *qkv = malloc(sizeof(float) * n_qkv), *hctx = malloc(sizeof(float) * n_ctx);
    float *probs = malloc(sizeof(float) * n_probs);
    if (!qkv || !hctx || !probs) rc = MC_ERR_NO_MEMORY;
    if (rc == MC_OK) rc = o->download(o, qkv, cache + L.qkv, sizeof(float) * n_qkv);
    if (rc == MC_OK) {
        yours_core_forward(hctx, probs, qkv, g->S, g->B, g->NHl, g->HD, &d);
        rc = o->upload(o, cache + L.ctx, hctx, sizeof(float) * n_ctx);
    }
    if (rc == MC_OK) rc = o->upload(o, cache + L.probs, probs, sizeof(float) * n_probs);
    if (rc == MC_OK) rc = o->upload(o, cache + L.draw, &d, sizeof d);
    free(qkv);
    free(hctx);
    free(probs);
    if (rc != MC_OK) return rc;
    return mc_row_parallel_linear_forward(out, NULL, cache + L.ctx, ctx->w[MC_GPT_PROJ_W],
                                          ctx->w[MC_GPT_PROJ_B], g->S, g->B, g->Q, g->H,
                                          lab06_tp_flags(g) | MC_TP_INPUT_IS_PARALLEL,
                                          g->dtype, lab06_tp(g), o);
}

static int yours_backward(const mc_layer_ctx *ctx, void *dinp, const void *dout,
                          const void *inp) {
    mc_gpt *g = ctx->gpt;
    const mc_ops *o = g->ops;
    yours_layout L = yours_layout_of(g);
    float *cache = (float *)ctx->attention_cache, *scratch = (float *)ctx->attention_scratch;
    size_t n_qkv = (size_t)g->N * 3 * g->Ql, n_ctx = (size_t)g->N * g->Ql;
    size_t n_probs = L.draw - L.probs;
    float *d_ctx = scratch, *d_qkv = scratch + n_ctx;   /* op memory */
    lab06_draw d;
    int rc = mc_row_parallel_linear_backward(d_ctx, ctx->g[MC_GPT_PROJ_W], ctx->g[MC_GPT_PROJ_B],
                                             NULL, dout, cache + L.ctx, ctx->w[MC_GPT_PROJ_W],
                                             g->S, g->B, g->Q, g->H,
                                             lab06_tp_flags(g) | MC_TP_INPUT_IS_PARALLEL,
                                             g->dtype, lab06_tp(g), o);
    if (rc != MC_OK) return rc;
    float *qkv = malloc(sizeof(float) * n_qkv), *dq = malloc(sizeof(float) * n_qkv);
    float *hdc = malloc(sizeof(float) * n_ctx), *probs = malloc(sizeof(float) * n_probs);
    if (!qkv || !dq || !hdc || !probs) rc = MC_ERR_NO_MEMORY;
    if (rc == MC_OK) rc = o->download(o, qkv, cache + L.qkv, sizeof(float) * n_qkv);
    if (rc == MC_OK) rc = o->download(o, probs, cache + L.probs, sizeof(float) * n_probs);
    if (rc == MC_OK) rc = o->download(o, &d, cache + L.draw, sizeof d);
    if (rc == MC_OK) rc = o->download(o, hdc, d_ctx, sizeof(float) * n_ctx);
    if (rc == MC_OK) {
        yours_core_backward(dq, hdc, qkv, probs, g->S, g->B, g->NHl, g->HD, &d);
        rc = o->upload(o, d_qkv, dq, sizeof(float) * n_qkv);
    }
    free(qkv);
    free(dq);
    free(hdc);
    free(probs);
    if (rc != MC_OK) return rc;
    return mc_column_parallel_linear_backward(dinp, ctx->g[MC_GPT_QKV_W], ctx->g[MC_GPT_QKV_B],
                                              NULL, d_qkv, inp, ctx->w[MC_GPT_QKV_W], g->S,
                                              g->B, g->H, 3 * g->Q, lab06_tp_flags(g),
                                              g->dtype, lab06_tp(g), o);
}

/* The shapes this module takes: 0, or non-zero with the reason (the model then falls back to
   the local attention and says why). */
static int yours_accepts(const mc_gpt *g, char *why, size_t cap) {
    if (g->dtype != MC_F32) {
        snprintf(why, cap, "yours computes fp32 tensors on the host (dtype %d)", (int)g->dtype);
        return 1;
    }
    if (g->S > 1024) {
        snprintf(why, cap, "yours handles seq_length <= 1024 (got %d)", g->S);
        return 1;
    }
    return 0;
}

static size_t yours_cache_bytes(const mc_gpt *g) {
    return sizeof(float) * yours_layout_of(g).total;
}

static size_t yours_scratch_bytes(const mc_gpt *g) {
    return sizeof(float) * (size_t)g->N * 4 * (size_t)g->Ql;   /* d_ctx [N, Ql], d_qkv [N, 3 Ql] */
}

/* The parameter keys below decoder.layers.{L}. (NULL: Megatron's, which the checkpoints of
   the local spec use). To rename one, point tensor_names at a table like this. */
static const char *const yours_names[MC_GPT_LAYER_TENSORS] = {NULL};

const mc_transformer_spec *lab06_yours_spec(void) {
    static mc_transformer_spec spec;
    if (spec.name == NULL) {
        spec = *mc_transformer_spec_local();   /* norms and MLP stay the local ones */
        spec.name = "yours";
        spec.attention_forward = yours_forward;
        spec.attention_backward = yours_backward;
        spec.attention_accepts = yours_accepts;
        spec.attention_cache_bytes = yours_cache_bytes;
        spec.attention_scratch_bytes = yours_scratch_bytes;
        spec.tensor_names = yours_names;
    }
    return &spec;
}
