/* tests/ckpt_model.h - a synthetic parameter table shaped like a small GPT's, for the checkpoint
   tests (tests/test_checkpoint.c, tests/mpi_cases/ckpt_cases.c). Include "megatron_c.h" first.

   The table is built for a layout (TP, PP, VPP and this rank's tp / pp ranks) the way the GPT
   model registers its parameters (Megatron's names, GLOBAL layer indices, chunk c of pipeline
   rank r holding the layers from c * L/VPP + r * L/(PP*VPP)):
       embedding.word_embeddings.weight     [Vp, H]  dim 0       (first stage)
       embedding.position_embeddings.weight [S, H]   replicated  (first stage)
       decoder.layers.{l}.input_layernorm.weight / .bias            [H]   replicated
       decoder.layers.{l}.self_attention.linear_qkv.weight  [3H, H]  dim 0;  .bias [3H] dim 0
       decoder.layers.{l}.self_attention.linear_proj.weight [H, H]   dim 1, stride 2; .bias [H]
       decoder.layers.{l}.pre_mlp_layernorm.weight / .bias          [H]   replicated
       decoder.layers.{l}.mlp.linear_fc1.weight [F, H] dim 0, stride 2; .bias [F] dim 0, stride 2
       decoder.layers.{l}.mlp.linear_fc2.weight [H, F] dim 1;           .bias [H] replicated
       decoder.final_layernorm.weight / .bias [H]                       (last stage)
       output_layer.weight [Vp, H] dim 0, shared (the tied copy)        (last stage, PP > 1)
   The strides exercise Megatron's stride rule on both split dimensions (the real model uses
   stride 1). Offsets: either the registration order with a gap after every parameter, or the
   library's own layout (mc_param_table_add + mc_param_table_layout: reverse order, padding for
   the distributed optimizer). Either way the gaps are padding that a load must never touch.

   The values: element (i, j) of the GLOBAL tensor `name` of kind k (0 params, 1 exp_avg,
   2 exp_avg_sq) is ckpt_value(k, name, i, j), so a rank's expected shard can be computed
   without the library, through ckpt_global_index (the stride rule written element by
   element, independently of the library's run-based code). */
#ifndef CKPT_MODEL_H_INCLUDED
#define CKPT_MODEL_H_INCLUDED

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CKPT_H 16
#define CKPT_HEADS 4
#define CKPT_FFN 64
#define CKPT_SEQ 8
#define CKPT_DIV 8                 /* make_vocab_size_divisible_by */
#define CKPT_PAD_VALUE (-7777.0f)  /* what the padding of the flat buffers holds */

typedef struct ckpt_layout {
    int tp, pp, vpp;               /* vpp 0: not interleaved */
    int tp_rank, pp_rank;
    int layers;                    /* num_layers */
    int vocab;                     /* original vocabulary */
    int library_table;             /* 1: register with mc_param_table_add and place with
                                      mc_param_table_layout (reverse order, distributed-optimizer
                                      padding for dp); 0: offsets in registration order */
    int dp;                        /* for the library layout's padding; 0 means 1 */
} ckpt_layout;

typedef struct ckpt_model {
    mc_gpt_config cfg;
    mc_param_table table;
    float *data[3];                /* params, exp_avg, exp_avg_sq: [table.total] */
    int library_table;             /* the table came from mc_param_table_add */
} ckpt_model;

static inline int ckpt_padded_vocab(int vocab, int tp) {
    int m = CKPT_DIV * tp;
    return (vocab + m - 1) / m * m;
}

static inline mc_gpt_config ckpt_config(const ckpt_layout *l) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = l->layers;
    c.hidden_size = CKPT_H;
    c.num_attention_heads = CKPT_HEADS;
    c.ffn_hidden_size = CKPT_FFN;
    c.kv_channels = CKPT_H / CKPT_HEADS;
    c.num_query_groups = CKPT_HEADS;
    c.vocab_size = l->vocab;
    c.make_vocab_size_divisible_by = CKPT_DIV;
    c.max_position_embeddings = CKPT_SEQ;
    c.seq_length = CKPT_SEQ;
    c.layernorm_epsilon = 1e-5f;
    c.init_method_std = 0.02f;
    c.hidden_dropout = 0.1f;
    c.attention_dropout = 0.1f;
    c.tensor_model_parallel_size = l->tp;
    c.pipeline_model_parallel_size = l->pp;
    c.virtual_pipeline_model_parallel_size = l->vpp;
    c.micro_batch_size = 2;
    c.seed = 1234;
    mc_gpt_config_resolve(&c, &c);
    return c;
}

static inline uint32_t ckpt_hash(const char *s, uint32_t salt) {
    uint32_t h = 2166136261u ^ salt;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* Distinct, exactly representable values: multiples of 1/256 in [-128, 128). */
static inline float ckpt_value(int kind, const char *name, long long i, long long j) {
    uint32_t x = ckpt_hash(name, (uint32_t)kind * 0x9e3779b9u);
    x ^= (uint32_t)(i * 2654435761u) + (uint32_t)(j * 40503u) + (uint32_t)(i >> 7);
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    return (float)((int)(x >> 16) - 32768) / 256.0f;
}

/* Appends one parameter; `rows`, `cols` are global (cols 0: 1-D). */
static inline void ckpt__add(mc_param_table *t, const ckpt_layout *l, const char *name, int rows,
                             int cols, int pdim, int stride, int shared, int layer, int chunk,
                             size_t *offset) {
    mc_param_info proto, *p = l->library_table ? &proto : &t->info[t->count];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = cols > 0 ? 2 : 1;
    p->global_shape[0] = p->local_shape[0] = rows;
    p->global_shape[1] = p->local_shape[1] = cols > 0 ? cols : 1;
    if (pdim >= 0) p->local_shape[pdim] /= l->tp;
    p->partition_dim = pdim;
    p->partition_stride = stride;
    p->tensor_model_parallel = pdim >= 0;
    p->shared = shared;
    p->shared_embedding = shared || strcmp(name, "embedding.word_embeddings.weight") == 0;
    p->layer = layer;
    p->chunk = chunk;
    p->numel = (size_t)p->local_shape[0] * (size_t)p->local_shape[1];
    if (l->library_table) {
        mc_param_table_add(t, name, p);   /* a failure shows as a short table */
        return;
    }
    p->offset = *offset;
    *offset += (p->numel + 63) / 64 * 64 + 64;   /* a gap after every parameter */
    t->count++;
}

/* The table of layout l (registration order; offsets in that order). */
static inline int ckpt_build_table(mc_param_table *t, const ckpt_layout *l) {
    static const char *const names[12] = {
        "input_layernorm.weight",           "input_layernorm.bias",
        "self_attention.linear_qkv.weight",  "self_attention.linear_qkv.bias",
        "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
        "pre_mlp_layernorm.weight",         "pre_mlp_layernorm.bias",
        "mlp.linear_fc1.weight",            "mlp.linear_fc1.bias",
        "mlp.linear_fc2.weight",            "mlp.linear_fc2.bias"};
    /* rows, cols, partition dim, stride */
    static const int shape[12][4] = {
        {CKPT_H, 0, -1, 1},         {CKPT_H, 0, -1, 1},
        {3 * CKPT_H, CKPT_H, 0, 1}, {3 * CKPT_H, 0, 0, 1},
        {CKPT_H, CKPT_H, 1, 2},     {CKPT_H, 0, -1, 1},
        {CKPT_H, 0, -1, 1},         {CKPT_H, 0, -1, 1},
        {CKPT_FFN, CKPT_H, 0, 2},   {CKPT_FFN, 0, 0, 2},
        {CKPT_H, CKPT_FFN, 1, 1},   {CKPT_H, 0, -1, 1}};
    int chunks = l->vpp > 0 ? l->vpp : 1, per_chunk = l->layers / (l->pp * chunks), c, k, s;
    int vp = ckpt_padded_vocab(l->vocab, l->tp);
    size_t offset = 32;   /* the buffer starts with padding too */
    char name[MC_PARAM_NAME_MAX];
    memset(t, 0, sizeof *t);
    if (!l->library_table) {
        t->capacity = 8 + l->layers * 12;
        t->info = (mc_param_info *)calloc((size_t)t->capacity, sizeof *t->info);
        if (!t->info) return -1;
    }
    for (c = 0; c < chunks; c++) {
        int first = l->pp_rank == 0 && c == 0, last = l->pp_rank == l->pp - 1 && c == chunks - 1;
        int layer0 = c * (l->layers / chunks) + l->pp_rank * per_chunk;
        if (first) {
            ckpt__add(t, l, "embedding.word_embeddings.weight", vp, CKPT_H, 0, 1, 0, -1, c, &offset);
            ckpt__add(t, l, "embedding.position_embeddings.weight", CKPT_SEQ, CKPT_H, -1, 1, 0, -1,
                      c, &offset);
        }
        for (s = 0; s < per_chunk; s++)
            for (k = 0; k < 12; k++) {
                snprintf(name, sizeof name, "decoder.layers.%d.%s", layer0 + s, names[k]);
                ckpt__add(t, l, name, shape[k][0], shape[k][1], shape[k][2], shape[k][3], 0,
                          layer0 + s, c, &offset);
            }
        if (last) {
            ckpt__add(t, l, "decoder.final_layernorm.weight", CKPT_H, 0, -1, 1, 0, -1, c, &offset);
            ckpt__add(t, l, "decoder.final_layernorm.bias", CKPT_H, 0, -1, 1, 0, -1, c, &offset);
            if (l->pp > 1)   /* the tied copy of the word embedding */
                ckpt__add(t, l, "output_layer.weight", vp, CKPT_H, 0, 1, 1, -1, c, &offset);
        }
    }
    if (l->library_table) {
        mc_param_layout_desc ld;
        int want = (chunks * per_chunk * 12) + (l->pp_rank == 0 ? 2 : 0) +
                   (l->pp_rank == l->pp - 1 ? (l->pp > 1 ? 3 : 2) : 0);
        if (t->count != want) return -1;
        memset(&ld, 0, sizeof ld);
        ld.dp_size = l->dp > 0 ? l->dp : 1;
        ld.distributed_optimizer = 1;
        ld.pp_rank = l->pp_rank;
        return mc_param_table_layout(t, &ld) == MC_OK ? 0 : -1;
    }
    t->total = offset;
    return 0;
}

/* The global (row, col) of local element (li, lj) of parameter p on tp rank r of tp:
   Megatron's stride rule, element by element. */
static inline void ckpt_global_index(const mc_param_info *p, int tp, int r, int li, int lj,
                                     long long *gi, long long *gj) {
    int a, piece, k;
    *gi = li;
    *gj = lj;
    if (p->partition_dim < 0) return;
    if (p->ndim == 1 || p->partition_dim == 1) {
        a = p->ndim == 1 ? li : lj;
        piece = (p->ndim == 1 ? p->local_shape[0] : p->local_shape[1]) / p->partition_stride;
    } else {
        a = li;
        piece = p->local_shape[0] / p->partition_stride;
    }
    k = a / piece;
    a = (k * tp + r) * piece + a % piece;
    if (p->ndim == 1) *gi = a;
    else if (p->partition_dim == 1) *gj = a;
    else *gi = a;
}

static inline int ckpt_find(const mc_param_table *t, const char *name) {
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->info[i].name, name) == 0) return i;
    return -1;
}

/* The value a checkpoint holds for a `shared` parameter comes from the word embedding. */
static inline const char *ckpt_source_name(const mc_param_info *p) {
    return p->shared ? "embedding.word_embeddings.weight" : p->name;
}

/* Allocates the three buffers (padding = CKPT_PAD_VALUE, parameters = fill, or the global
   values of the layout when fill is NAN). */
static inline int ckpt_model_init(ckpt_model *m, const ckpt_layout *l, float fill) {
    int k, i, li, lj;
    memset(m, 0, sizeof *m);
    m->cfg = ckpt_config(l);
    m->library_table = l->library_table;
    if (ckpt_build_table(&m->table, l) != 0) return -1;
    for (k = 0; k < 3; k++) {
        m->data[k] = (float *)malloc(m->table.total * sizeof(float));
        if (!m->data[k]) return -1;
        for (size_t e = 0; e < m->table.total; e++) m->data[k][e] = CKPT_PAD_VALUE;
        for (i = 0; i < m->table.count; i++) {
            const mc_param_info *p = &m->table.info[i];
            for (li = 0; li < p->local_shape[0]; li++)
                for (lj = 0; lj < p->local_shape[1]; lj++) {
                    long long gi, gj;
                    ckpt_global_index(p, l->tp, l->tp_rank, li, lj, &gi, &gj);
                    m->data[k][p->offset + (size_t)li * (size_t)p->local_shape[1] + (size_t)lj] =
                        isnan(fill) ? ckpt_value(k, ckpt_source_name(p), gi, gj) : fill;
                }
        }
    }
    return 0;
}

static inline void ckpt_model_free(ckpt_model *m) {
    for (int k = 0; k < 3; k++) free(m->data[k]);
    if (m->library_table) mc_param_table_destroy(&m->table);
    else free(m->table.info);
    memset(m, 0, sizeof *m);
}

/* Compares buffer k with the global values: every parameter element with the slice of the
   global tensor (rows at or past `stored_rows` of a vocabulary tensor must be 0; -1: no
   limit), every padding element untouched. Returns the mismatch count; describes the first. */
static inline long long ckpt_model_compare(const ckpt_model *m, const ckpt_layout *l, int k,
                                           long long stored_vocab_rows, char *why, size_t cap) {
    long long bad = 0;
    size_t e;
    unsigned char *is_param = (unsigned char *)calloc(m->table.total, 1);
    if (why && cap) why[0] = '\0';
    if (!is_param) return -1;
    for (int i = 0; i < m->table.count; i++) {
        const mc_param_info *p = &m->table.info[i];
        int vocab_tensor = strcmp(ckpt_source_name(p), "embedding.word_embeddings.weight") == 0;
        for (int li = 0; li < p->local_shape[0]; li++)
            for (int lj = 0; lj < p->local_shape[1]; lj++) {
                long long gi, gj;
                size_t at = p->offset + (size_t)li * (size_t)p->local_shape[1] + (size_t)lj;
                float want, got = m->data[k][at];
                ckpt_global_index(p, l->tp, l->tp_rank, li, lj, &gi, &gj);
                want = ckpt_value(k, ckpt_source_name(p), gi, gj);
                if (vocab_tensor && stored_vocab_rows >= 0 && gi >= stored_vocab_rows) want = 0.0f;
                is_param[at] = 1;
                if (got != want && bad++ == 0 && why)
                    snprintf(why, cap, "buffer %d: %s local (%d, %d) = global (%lld, %lld): got "
                             "%g, want %g", k, p->name, li, lj, gi, gj, (double)got, (double)want);
            }
    }
    for (e = 0; e < m->table.total; e++)
        if (!is_param[e] && m->data[k][e] != CKPT_PAD_VALUE && bad++ == 0 && why)
            snprintf(why, cap, "buffer %d: padding element %zu = %g was written", k, e,
                     (double)m->data[k][e]);
    free(is_param);
    return bad;
}

#endif /* CKPT_MODEL_H_INCLUDED */
