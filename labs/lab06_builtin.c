/* labs/lab06_builtin.c - lab06's built-in attention module and its five broken copies.

   The built-in module is an online-softmax ("flash") attention: its forward walks each query's
   keys once with a running maximum and sum, keeps only the row log-sum-exp [B, NHl, S] beside
   QKV and the output, and its backward recomputes the probabilities from it (FlashAttention's
   scheme, here on the host). It refuses what its kernel does not handle (fp32 only, head_dim a
   multiple of 8, like fused attention kernels' head-size rules), and the model then falls back
   to the local attention.

   Each broken copy makes one mistake that real integrations make (labs/lab06_attention.h):
     no_causal_mask   the key loop runs over all S positions;
     global_heads     heads = gpt->NH (the model's) and head_dim = Ql / NH on this rank's shard;
     default_rng      the probability dropout comes from the default generator, not a fork of
                      model-parallel-rng;
     shared_cache     QKV, output, log-sum-exp and the draw live in one host buffer per layer,
                      not in the per-micro-batch ctx->attention_cache;
     renamed_param    linear_qkv.weight / .bias are registered as the legacy
                      self_attention.query_key_value.weight / .bias.
   Everything else is the built-in module's code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab06_attention.h"

/* How a variant splits this rank's QKV shard. */
typedef struct fa_shape {
    int S, B, heads, hd;      /* heads of hd rows each: NHl x HD, or NH x Ql / NH */
    size_t n_qkv, n_out, n_lse;
    int causal;
} fa_shape;

static fa_shape fa_shape_of(const mc_gpt *g, int variant) {
    fa_shape s;
    s.S = g->S;
    s.B = g->B;
    s.heads = variant == LAB06_GLOBAL_HEADS ? g->NH : g->NHl;
    s.hd = g->Ql / s.heads;
    s.n_qkv = (size_t)g->N * 3 * (size_t)g->Ql;
    s.n_out = (size_t)g->N * (size_t)g->Ql;
    s.n_lse = (size_t)s.B * (size_t)s.heads * (size_t)s.S;
    s.causal = variant != LAB06_NO_CAUSAL_MASK;
    return s;
}

/* Cache of one layer and micro-batch, in floats: qkv, out, lse, then the draw. */
static size_t fa_cache_floats(const fa_shape *s) {
    return s->n_qkv + s->n_out + s->n_lse + sizeof(lab06_draw) / sizeof(float);
}

static float fa_keep(const lab06_draw *d, size_t i) {
    if (!(d->p > 0.0f)) return 1.0f;
    return mc_rng_uniform_at(d->seed, d->offset + i) >= d->p ? 1.0f / (1.0f - d->p) : 0.0f;
}

static const float *fa_head(const float *qkv, const fa_shape *s, int t, int b, int h) {
    return qkv + ((size_t)t * s->B + (size_t)b) * (size_t)s->heads * 3 * s->hd +
           (size_t)h * 3 * s->hd;
}

/* out [N, heads * hd] (=) and lse [B, heads, S] (=): one pass over the keys per query. */
static void fa_core_forward(float *out, float *lse, const float *qkv, const fa_shape *s,
                            const lab06_draw *d) {
    float scale = 1.0f / sqrtf((float)s->hd), acc[512];   /* hd <= 512 (fa_accepts) */
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->heads; h++)
            for (int t = 0; t < s->S; t++) {
                const float *q = fa_head(qkv, s, t, b, h);
                size_t row = (((size_t)b * s->heads + h) * s->S + t) * s->S;
                float m = -INFINITY, l = 0.0f;
                int end = s->causal ? t + 1 : s->S;
                for (int i = 0; i < s->hd; i++) acc[i] = 0.0f;
                for (int t2 = 0; t2 < end; t2++) {
                    const float *k = fa_head(qkv, s, t2, b, h) + s->hd, *v = k + s->hd;
                    float x = 0.0f;
                    for (int i = 0; i < s->hd; i++) x += q[i] * k[i];
                    x *= scale;
                    float m2 = x > m ? x : m, fix = expf(m - m2), e = expf(x - m2);
                    float z = e * fa_keep(d, row + (size_t)t2);   /* dropped, not renormalised */
                    l = l * fix + e;
                    for (int i = 0; i < s->hd; i++) acc[i] = acc[i] * fix + z * v[i];
                    m = m2;
                }
                float *o = out + ((size_t)t * s->B + b) * (size_t)s->heads * s->hd +
                           (size_t)h * s->hd;
                for (int i = 0; i < s->hd; i++) o[i] = acc[i] / l;
                lse[((size_t)b * s->heads + h) * s->S + t] = m + logf(l);
            }
}

/* dqkv (=) from dout, recomputing each probability as exp(score - lse). With Z = dropout(P),
   sum_j P_j dP_j = dout . out, so one dot product per query replaces the row sums. */
static void fa_core_backward(float *dqkv, const float *dout, const float *qkv,
                             const float *out, const float *lse, const fa_shape *s,
                             const lab06_draw *d) {
    float scale = 1.0f / sqrtf((float)s->hd);
    memset(dqkv, 0, sizeof(float) * s->n_qkv);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->heads; h++)
            for (int t = 0; t < s->S; t++) {
                const float *q = fa_head(qkv, s, t, b, h);
                float *dq = dqkv + (q - qkv);
                size_t at = ((size_t)t * s->B + b) * (size_t)s->heads * s->hd +
                            (size_t)h * s->hd;
                size_t row = (((size_t)b * s->heads + h) * s->S + t) * s->S;
                float Dt = 0.0f, L = lse[((size_t)b * s->heads + h) * s->S + t];
                int end = s->causal ? t + 1 : s->S;
                for (int i = 0; i < s->hd; i++) Dt += dout[at + i] * out[at + i];
                for (int t2 = 0; t2 < end; t2++) {
                    const float *k = fa_head(qkv, s, t2, b, h) + s->hd, *v = k + s->hd;
                    float *dk = dqkv + (k - qkv), *dv = dk + s->hd;
                    float x = 0.0f, dz = 0.0f;
                    for (int i = 0; i < s->hd; i++) x += q[i] * k[i];
                    float p = expf(x * scale - L), keep = fa_keep(d, row + (size_t)t2);
                    for (int i = 0; i < s->hd; i++) {
                        dz += dout[at + i] * v[i];
                        dv[i] += p * keep * dout[at + i];
                    }
                    float ds = p * (dz * keep - Dt) * scale;
                    for (int i = 0; i < s->hd; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                    }
                }
            }
}

/* shared_cache's mistake: one host buffer per (local) layer index, whatever the micro-batch. */
#define FA_SHARED_LAYERS 64
static struct fa_shared {
    float *qkv, *out, *lse;
    size_t cap;
    lab06_draw draw;
} fa_shared[FA_SHARED_LAYERS];

static struct fa_shared *fa_shared_of(int layer, size_t floats) {
    struct fa_shared *sh = &fa_shared[layer % FA_SHARED_LAYERS];
    if (sh->cap < floats) {
        free(sh->qkv);
        sh->qkv = calloc(floats, sizeof(float));
        sh->out = calloc(floats, sizeof(float));
        sh->lse = calloc(floats, sizeof(float));
        sh->cap = sh->qkv && sh->out && sh->lse ? floats : 0;
    }
    return sh->cap ? sh : NULL;
}

/* The host copies the core works on. */
typedef struct fa_host {
    float *qkv, *out, *lse, *dq;
} fa_host;

static int fa_host_alloc(fa_host *h, const fa_shape *s) {
    h->qkv = malloc(sizeof(float) * s->n_qkv);
    h->out = malloc(sizeof(float) * s->n_out);
    h->lse = malloc(sizeof(float) * s->n_lse);
    h->dq = malloc(sizeof(float) * s->n_qkv);
    return h->qkv && h->out && h->lse && h->dq ? MC_OK : MC_ERR_NO_MEMORY;
}

static void fa_host_free(fa_host *h) {
    free(h->qkv);
    free(h->out);
    free(h->lse);
    free(h->dq);
}

/* Device tensors of one call: the cache block's (or, for shared_cache, the scratch's). */
typedef struct fa_dev {
    float *qkv, *out, *lse, *draw;   /* forward tensors */
    float *d_out, *d_qkv;            /* backward scratch */
} fa_dev;

static fa_dev fa_dev_of(const mc_layer_ctx *ctx, const fa_shape *s, int variant) {
    fa_dev v;
    float *c = (float *)ctx->attention_cache, *sc = (float *)ctx->attention_scratch;
    v.d_out = sc;
    v.d_qkv = sc + s->n_out;
    if (variant == LAB06_SHARED_CACHE) c = sc + s->n_out + s->n_qkv;   /* overwritten per call */
    v.qkv = c;
    v.out = c + s->n_qkv;
    v.lse = v.out + s->n_out;
    v.draw = v.lse + s->n_lse;
    return v;
}

static int fa_forward(const mc_layer_ctx *ctx, void *out, const void *inp, int variant) {
    mc_gpt *g = ctx->gpt;
    const mc_ops *o = g->ops;
    fa_shape s = fa_shape_of(g, variant);
    fa_dev dv = fa_dev_of(ctx, &s, variant);
    const char *stream = variant == LAB06_DEFAULT_RNG ? MC_RNG_DEFAULT : MC_RNG_MODEL_PARALLEL;
    lab06_draw d;
    fa_host h;
    int rc = mc_column_parallel_linear_forward(dv.qkv, NULL, inp, ctx->w[MC_GPT_QKV_W],
                                               ctx->w[MC_GPT_QKV_B], g->S, g->B, g->H,
                                               3 * g->Q, lab06_tp_flags(g), g->dtype,
                                               lab06_tp(g), o);
    if (rc == MC_OK) rc = lab06_draw_dropout(g, stream, s.n_lse * (size_t)s.S, &d);
    if (rc != MC_OK) return rc;
    rc = fa_host_alloc(&h, &s);
    if (rc == MC_OK) rc = o->download(o, h.qkv, dv.qkv, sizeof(float) * s.n_qkv);
    if (rc == MC_OK) {
        fa_core_forward(h.out, h.lse, h.qkv, &s, &d);
        rc = o->upload(o, dv.out, h.out, sizeof(float) * s.n_out);
    }
    if (rc == MC_OK && variant == LAB06_SHARED_CACHE) {
        struct fa_shared *sh = fa_shared_of(ctx->layer, s.n_qkv);
        if (!sh) rc = MC_ERR_NO_MEMORY;
        if (sh) {
            memcpy(sh->qkv, h.qkv, sizeof(float) * s.n_qkv);
            memcpy(sh->out, h.out, sizeof(float) * s.n_out);
            memcpy(sh->lse, h.lse, sizeof(float) * s.n_lse);
            sh->draw = d;
        }
    } else if (rc == MC_OK) {
        rc = o->upload(o, dv.lse, h.lse, sizeof(float) * s.n_lse);
        if (rc == MC_OK) rc = o->upload(o, dv.draw, &d, sizeof d);
    }
    fa_host_free(&h);
    if (rc != MC_OK) return rc;
    return mc_row_parallel_linear_forward(out, NULL, dv.out, ctx->w[MC_GPT_PROJ_W],
                                          ctx->w[MC_GPT_PROJ_B], g->S, g->B, g->Q, g->H,
                                          lab06_tp_flags(g) | MC_TP_INPUT_IS_PARALLEL,
                                          g->dtype, lab06_tp(g), o);
}

static int fa_backward(const mc_layer_ctx *ctx, void *dinp, const void *dout, const void *inp,
                       int variant) {
    mc_gpt *g = ctx->gpt;
    const mc_ops *o = g->ops;
    fa_shape s = fa_shape_of(g, variant);
    fa_dev dv = fa_dev_of(ctx, &s, variant);
    lab06_draw d;
    fa_host h;
    int rc = fa_host_alloc(&h, &s);
    if (rc == MC_OK && variant == LAB06_SHARED_CACHE) {
        /* whatever the last forward of this layer index left there */
        struct fa_shared *sh = fa_shared_of(ctx->layer, s.n_qkv);
        if (!sh) rc = MC_ERR_NO_MEMORY;
        if (sh) {
            memcpy(h.qkv, sh->qkv, sizeof(float) * s.n_qkv);
            memcpy(h.out, sh->out, sizeof(float) * s.n_out);
            memcpy(h.lse, sh->lse, sizeof(float) * s.n_lse);
            d = sh->draw;
            rc = o->upload(o, dv.out, h.out, sizeof(float) * s.n_out);
        }
    } else if (rc == MC_OK) {
        rc = o->download(o, h.qkv, dv.qkv, sizeof(float) * s.n_qkv);
        if (rc == MC_OK) rc = o->download(o, h.out, dv.out, sizeof(float) * s.n_out);
        if (rc == MC_OK) rc = o->download(o, h.lse, dv.lse, sizeof(float) * s.n_lse);
        if (rc == MC_OK) rc = o->download(o, &d, dv.draw, sizeof d);
    }
    /* through the projection: d_out [N, Ql] (=), its weight and bias grads (+=) */
    if (rc == MC_OK)
        rc = mc_row_parallel_linear_backward(dv.d_out, ctx->g[MC_GPT_PROJ_W],
                                             ctx->g[MC_GPT_PROJ_B], NULL, dout, dv.out,
                                             ctx->w[MC_GPT_PROJ_W], g->S, g->B, g->Q, g->H,
                                             lab06_tp_flags(g) | MC_TP_INPUT_IS_PARALLEL,
                                             g->dtype, lab06_tp(g), o);
    float *hd = rc == MC_OK ? malloc(sizeof(float) * s.n_out) : NULL;
    if (rc == MC_OK && !hd) rc = MC_ERR_NO_MEMORY;
    if (rc == MC_OK) rc = o->download(o, hd, dv.d_out, sizeof(float) * s.n_out);
    if (rc == MC_OK) {
        fa_core_backward(h.dq, hd, h.qkv, h.out, h.lse, &s, &d);
        rc = o->upload(o, dv.d_qkv, h.dq, sizeof(float) * s.n_qkv);
    }
    free(hd);
    fa_host_free(&h);
    if (rc != MC_OK) return rc;
    return mc_column_parallel_linear_backward(dinp, ctx->g[MC_GPT_QKV_W], ctx->g[MC_GPT_QKV_B],
                                              NULL, dv.d_qkv, inp, ctx->w[MC_GPT_QKV_W], g->S,
                                              g->B, g->H, 3 * g->Q, lab06_tp_flags(g),
                                              g->dtype, lab06_tp(g), o);
}

/* The kernel's limits: a refused shape runs the local attention instead. */
static int fa_accepts(const mc_gpt *g, char *why, size_t cap) {
    if (g->dtype != MC_F32) {
        snprintf(why, cap, "flash: fp32 only (dtype %d)", (int)g->dtype);
        return 1;
    }
    if (g->HD % 8 != 0 || g->HD > 512) {
        snprintf(why, cap, "flash: head_dim %d is not a multiple of 8 up to 512", g->HD);
        return 1;
    }
    return 0;
}

static size_t fa_cache_bytes_v(const mc_gpt *g, int variant) {
    fa_shape s = fa_shape_of(g, variant);
    return variant == LAB06_SHARED_CACHE ? 0 : sizeof(float) * fa_cache_floats(&s);
}

static size_t fa_scratch_bytes_v(const mc_gpt *g, int variant) {
    fa_shape s = fa_shape_of(g, variant);
    size_t n = s.n_out + s.n_qkv;   /* d_out, d_qkv */
    if (variant == LAB06_SHARED_CACHE) n += fa_cache_floats(&s);
    return sizeof(float) * n;
}

/* One set of spec functions per variant (the spec's slots take no user pointer). */
#define FA_VARIANT(V, id)                                                                     \
    static int fa_fwd_##id(const mc_layer_ctx *c, void *out, const void *inp) {              \
        return fa_forward(c, out, inp, V);                                                    \
    }                                                                                         \
    static int fa_bwd_##id(const mc_layer_ctx *c, void *dinp, const void *dout,              \
                           const void *inp) {                                                 \
        return fa_backward(c, dinp, dout, inp, V);                                            \
    }                                                                                         \
    static size_t fa_cache_##id(const mc_gpt *g) { return fa_cache_bytes_v(g, V); }          \
    static size_t fa_scratch_##id(const mc_gpt *g) { return fa_scratch_bytes_v(g, V); }
FA_VARIANT(LAB06_BUILTIN, builtin)
FA_VARIANT(LAB06_NO_CAUSAL_MASK, no_causal_mask)
FA_VARIANT(LAB06_GLOBAL_HEADS, global_heads)
FA_VARIANT(LAB06_DEFAULT_RNG, default_rng)
FA_VARIANT(LAB06_SHARED_CACHE, shared_cache)
FA_VARIANT(LAB06_RENAMED_PARAM, renamed_param)
#undef FA_VARIANT

static const char *const fa_legacy_names[MC_GPT_LAYER_TENSORS] = {
    [MC_GPT_QKV_W] = "self_attention.query_key_value.weight",
    [MC_GPT_QKV_B] = "self_attention.query_key_value.bias",
};

static const struct {
    const char *name, *mistake;
    int (*fwd)(const mc_layer_ctx *, void *, const void *);
    int (*bwd)(const mc_layer_ctx *, void *, const void *, const void *);
    size_t (*cache)(const mc_gpt *), (*scratch)(const mc_gpt *);
} fa_variants[LAB06_N_VARIANTS] = {
    {"builtin", "none: the built-in online-softmax attention", fa_fwd_builtin, fa_bwd_builtin,
     fa_cache_builtin, fa_scratch_builtin},
    {"no_causal_mask", "every query attends to all S positions, later tokens included",
     fa_fwd_no_causal_mask, fa_bwd_no_causal_mask, fa_cache_no_causal_mask,
     fa_scratch_no_causal_mask},
    {"global_heads", "splits this rank's QKV shard into the model's NH heads (head_dim Ql/NH) "
                     "instead of its NH/TP local heads",
     fa_fwd_global_heads, fa_bwd_global_heads, fa_cache_global_heads, fa_scratch_global_heads},
    {"default_rng", "draws the attention dropout from the default generator instead of a fork "
                    "of model-parallel-rng",
     fa_fwd_default_rng, fa_bwd_default_rng, fa_cache_default_rng, fa_scratch_default_rng},
    {"shared_cache", "keeps its saved tensors in one buffer per layer instead of the "
                     "per-micro-batch attention cache",
     fa_fwd_shared_cache, fa_bwd_shared_cache, fa_cache_shared_cache, fa_scratch_shared_cache},
    {"renamed_param", "registers linear_qkv under the legacy key self_attention.query_key_value",
     fa_fwd_renamed_param, fa_bwd_renamed_param, fa_cache_renamed_param,
     fa_scratch_renamed_param},
};

const mc_transformer_spec *lab06_builtin_spec(int variant) {
    static mc_transformer_spec specs[LAB06_N_VARIANTS];
    if (variant < 0 || variant >= LAB06_N_VARIANTS) return NULL;
    mc_transformer_spec *sp = &specs[variant];
    if (sp->name == NULL) {
        *sp = *mc_transformer_spec_local();   /* norms and MLP stay the local ones */
        sp->name = fa_variants[variant].name;
        sp->attention_forward = fa_variants[variant].fwd;
        sp->attention_backward = fa_variants[variant].bwd;
        sp->attention_accepts = fa_accepts;
        sp->attention_cache_bytes = fa_variants[variant].cache;
        sp->attention_scratch_bytes = fa_variants[variant].scratch;
        sp->tensor_names = variant == LAB06_RENAMED_PARAM ? fa_legacy_names : NULL;
    }
    return sp;
}

const char *lab06_variant_name(int variant) {
    return variant >= 0 && variant < LAB06_N_VARIANTS ? fa_variants[variant].name : "?";
}

const char *lab06_variant_mistake(int variant) {
    return variant >= 0 && variant < LAB06_N_VARIANTS ? fa_variants[variant].mistake : "?";
}
