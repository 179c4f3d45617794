/* test_model.c - the transformer layer, block and GPTModel on one rank (the @model block).

   In process, with no parallel state (one rank): the parameter table (names, order, shapes,
   flags), the initialisation (every tensor equals mc_init_normal_shard's global tensor), the
   layers-per-stage rule of Megatron's docstrings, and the whole model against an independent
   fp64 GPT written below with naive loops: the loss must agree (1e-5 relative) and the
   model's gradients must agree with central finite differences of the fp64 loss on a sample of
   elements of EVERY parameter. Dropout masks must be reproducible, and every recompute mode
   must give bit-identical losses and gradients, and the tensor taps must see every module once
   per direction in call order without changing a bit. The multi-rank equivalence runs in
   tests/mpi_cases/model_cases.c, launched from the end of this file. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "test_util.h"

TestSuite(model, .timeout = 120);

/* A tiny GPT: 2 layers, H 16, 2 heads of 8, F 32, S 6, B 2, vocab 40 (padded to 40 with
   make_vocab_size_divisible_by 8). */
static mc_gpt_config tiny_config(void) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = 2;
    c.hidden_size = 16;
    c.num_attention_heads = 2;
    c.ffn_hidden_size = 32;
    c.vocab_size = 40;
    c.make_vocab_size_divisible_by = 8;
    c.seq_length = 6;
    c.max_position_embeddings = 8;
    c.micro_batch_size = 2;
    c.hidden_dropout = MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    c.init_method_std = 0.2f;   /* large enough that attention is far from uniform */
    c.seed = 1234;
    return c;
}

static void make_batch(int *tokens, int *labels, int n, int vocab, unsigned seed) {
    unsigned x = seed * 2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        tokens[i] = (int)((x >> 8) % (unsigned)vocab);
        x = x * 1103515245u + 12345u;
        labels[i] = (int)((x >> 8) % (unsigned)vocab);
    }
}

static void init_model(mc_gpt *g, const mc_gpt_config *cfg, int n_slots) {
    mc_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.config = *cfg;
    d.n_slots = n_slots;
    int rc = mc_gpt_init(g, &d);
    cr_assert_eq(rc, MC_OK, "mc_gpt_init: %s: %s", mc_err_name(rc), mc_last_error());
}

/* forward + backward of one micro-batch (mean loss); returns the loss sum */
static double run_step(mc_gpt *g, int slot, const int *tokens, const int *labels) {
    float *out = NULL, *dinp = NULL;
    double loss = 0.0;
    int rc = mc_gpt_forward(g, 0, slot, tokens, labels, NULL, &out, &loss);
    cr_assert_eq(rc, MC_OK, "forward: %s", mc_last_error());
    rc = mc_gpt_backward(g, 0, slot, NULL, 1.0f / (float)g->N, &dinp);
    cr_assert_eq(rc, MC_OK, "backward: %s", mc_last_error());
    return loss;
}

/* ---------------------------------------------------------------------------------------------
   parameter table and initialisation */

Test(model, parameter_names_order_shapes_and_flags) {
    mc_gpt_config cfg = tiny_config();
    mc_gpt g;
    init_model(&g, &cfg, 1);
    static const char *const layer_names[] = {
        "input_layernorm.weight",           "input_layernorm.bias",
        "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
        "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
        "pre_mlp_layernorm.weight",         "pre_mlp_layernorm.bias",
        "mlp.linear_fc1.weight",            "mlp.linear_fc1.bias",
        "mlp.linear_fc2.weight",            "mlp.linear_fc2.bias",
    };
    /* tied (default): no output_layer.weight on PP = 1; 2 + 12 L + 2 tensors */
    cr_assert_eq(g.table.count, 2 + 12 * 2 + 2, "count %d", g.table.count);
    cr_expect_str_eq(g.table.info[0].name, "embedding.word_embeddings.weight");
    cr_expect_str_eq(g.table.info[1].name, "embedding.position_embeddings.weight");
    for (int l = 0; l < 2; l++)
        for (int t = 0; t < 12; t++) {
            char want[128];
            snprintf(want, sizeof want, "decoder.layers.%d.%s", l, layer_names[t]);
            const mc_param_info *p = &g.table.info[2 + 12 * l + t];
            cr_expect_str_eq(p->name, want);
            cr_expect_eq(p->layer, l, "%s layer %d", p->name, p->layer);
            int is_bias_or_norm = strstr(p->name, "bias") || strstr(p->name, "layernorm");
            cr_expect_eq(p->no_weight_decay, is_bias_or_norm, "%s no_weight_decay", p->name);
        }
    cr_expect_str_eq(g.table.info[26].name, "decoder.final_layernorm.weight");
    cr_expect_str_eq(g.table.info[27].name, "decoder.final_layernorm.bias");
    cr_expect_eq(mc_param_table_find(&g.table, "output_layer.weight"), -1);

    /* shapes and partition dims (TP = 1: local == global) */
    struct { const char *name; int ndim, r, c, pdim; } want[] = {
        {"embedding.word_embeddings.weight", 2, 40, 16, 0},
        {"embedding.position_embeddings.weight", 2, 8, 16, -1},
        {"decoder.layers.1.self_attention.linear_qkv.weight", 2, 48, 16, 0},
        {"decoder.layers.1.self_attention.linear_qkv.bias", 1, 48, 1, 0},
        {"decoder.layers.1.self_attention.linear_proj.weight", 2, 16, 16, 1},
        {"decoder.layers.1.self_attention.linear_proj.bias", 1, 16, 1, -1},
        {"decoder.layers.0.mlp.linear_fc1.weight", 2, 32, 16, 0},
        {"decoder.layers.0.mlp.linear_fc1.bias", 1, 32, 1, 0},
        {"decoder.layers.0.mlp.linear_fc2.weight", 2, 16, 32, 1},
        {"decoder.layers.0.input_layernorm.weight", 1, 16, 1, -1},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int k = mc_param_table_find(&g.table, want[i].name);
        cr_assert_geq(k, 0, "%s missing", want[i].name);
        const mc_param_info *p = &g.table.info[k];
        cr_expect_eq(p->ndim, want[i].ndim, "%s ndim %d", p->name, p->ndim);
        cr_expect_eq(p->global_shape[0], want[i].r, "%s rows %d", p->name, p->global_shape[0]);
        if (want[i].ndim == 2)
            cr_expect_eq(p->global_shape[1], want[i].c, "%s cols %d", p->name, p->global_shape[1]);
        cr_expect_eq(p->partition_dim, want[i].pdim, "%s partition_dim", p->name);
        cr_expect_eq(p->tensor_model_parallel, want[i].pdim >= 0, "%s tp flag", p->name);
        cr_expect_eq(p->sequence_parallel, 0, "%s: no SP in this config", p->name);
        cr_expect_eq(p->shared, 0);
    }
    for (int i = 0; i < g.table.count; i++) total += g.table.info[i].numel;
    /* 40*16 + 8*16 + 2 * (4*16 + 48*16 + 48 + 16*16 + 16 + 32*16 + 32 + 16*32 + 16) + 32 */
    cr_expect_eq(total, (size_t)(640 + 128 + 2 * (64 + 768 + 48 + 256 + 16 + 512 + 32 + 512 + 16) + 32),
                 "numel total %zu", total);
    cr_expect_geq(g.table.total, total);
    mc_gpt_destroy(&g);
}

Test(model, untied_output_layer_is_registered_last) {
    mc_gpt_config cfg = tiny_config();
    cfg.untie_embeddings_and_output_weights = 1;
    mc_gpt g;
    init_model(&g, &cfg, 1);
    cr_assert_eq(g.table.count, 29);
    const mc_param_info *p = &g.table.info[28];
    cr_expect_str_eq(p->name, "output_layer.weight");
    cr_expect_eq(p->global_shape[0], 40);
    cr_expect_eq(p->partition_dim, 0);
    cr_expect_eq(p->shared, 0);
    cr_expect_eq(p->shared_embedding, 0);
    mc_gpt_destroy(&g);
}

Test(model, init_matches_the_cpu_initialisation) {
    mc_gpt_config cfg = tiny_config();
    mc_gpt g;
    init_model(&g, &cfg, 1);
    float *want = calloc(4096, sizeof(float));
    float out_std = 0.2f / sqrtf(4.0f);   /* std / sqrt(2 L) */
    for (int i = 0; i < g.table.count; i++) {
        const mc_param_info *p = &g.table.info[i];
        const float *got = (const float *)g.params + p->offset;
        int scaled = strstr(p->name, "linear_proj.weight") || strstr(p->name, "linear_fc2.weight");
        if (strstr(p->name, "layernorm.weight")) {
            for (size_t k = 0; k < p->numel; k++) cr_expect_eq(got[k], 1.0f, "%s[%zu]", p->name, k);
        } else if (p->ndim == 1) {
            for (size_t k = 0; k < p->numel; k++) cr_expect_eq(got[k], 0.0f, "%s[%zu]", p->name, k);
        } else {
            mc_init_normal_shard(want, p->name, p->global_shape[0], p->global_shape[1],
                                 p->partition_dim, 1, 0, 1, scaled ? out_std : 0.2f, 1234);
            cr_expect(memcmp(got, want, p->numel * sizeof(float)) == 0, "%s differs", p->name);
            double ss = 0;
            for (size_t k = 0; k < p->numel; k++) ss += (double)got[k] * got[k];
            double sd = sqrt(ss / (double)p->numel);
            double target = scaled ? out_std : 0.2;
            cr_expect(sd > 0.6 * target && sd < 1.4 * target, "%s std %g, want about %g", p->name,
                      sd, target);
        }
    }
    free(want);
    mc_gpt_destroy(&g);
}

Test(model, layers_per_stage_follow_megatron) {
    mc_gpt_config c = tiny_config();
    /* L = 16, PP = 4, VPP = 2: GPU0 [1,2][9,10] ... GPU3 [7,8][15,16] (1-based) */
    c.num_layers = 16;
    c.pipeline_model_parallel_size = 4;
    c.virtual_pipeline_model_parallel_size = 2;
    cr_expect_eq(mc_gpt_num_layers_to_build(&c), 2);
    int want16[4][2] = {{0, 8}, {2, 10}, {4, 12}, {6, 14}};
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < 2; v++)
            cr_expect_eq(mc_gpt_layer_offset(&c, r, v), want16[r][v], "rank %d chunk %d", r, v);
    /* L = 8, PP = 2, VPP = 4: stage 0 [0][2][4][6], stage 1 [1][3][5][7] */
    c.num_layers = 8;
    c.pipeline_model_parallel_size = 2;
    c.virtual_pipeline_model_parallel_size = 4;
    cr_expect_eq(mc_gpt_num_layers_to_build(&c), 1);
    for (int v = 0; v < 4; v++) {
        cr_expect_eq(mc_gpt_layer_offset(&c, 0, v), 2 * v);
        cr_expect_eq(mc_gpt_layer_offset(&c, 1, v), 2 * v + 1);
    }
    /* not interleaved: L / PP each */
    c.virtual_pipeline_model_parallel_size = 0;
    cr_expect_eq(mc_gpt_num_layers_to_build(&c), 4);
    cr_expect_eq(mc_gpt_layer_offset(&c, 1, 0), 4);
    c.num_layers = 7;
    cr_expect_lt(mc_gpt_num_layers_to_build(&c), 0);
    cr_expect(mc_test_contains(mc_last_error(), "num_layers (7)"), "%s", mc_last_error());
}

Test(model, invalid_configs_are_refused_with_the_rule) {
    mc_gpt_config cfg = tiny_config();
    cfg.tensor_model_parallel_size = 2;   /* a valid config, but TP needs a parallel state */
    mc_gpt g;
    mc_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.config = cfg;
    int rc = mc_gpt_init(&g, &d);
    cr_expect_eq(rc, MC_ERR_INVALID_DESC, "%s", mc_err_name(rc));
    cr_expect(mc_test_contains(mc_last_error(), "tensor_model_parallel_size"), "%s",
              mc_last_error());
    cfg = tiny_config();
    d.config = cfg;
    d.n_slots = -1;
    rc = mc_gpt_init(&g, &d);
    cr_expect_eq(rc, MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "n_slots (-1)"), "%s", mc_last_error());
}

Test(model, call_errors_name_the_problem) {
    mc_gpt_config cfg = tiny_config();
    mc_gpt g;
    init_model(&g, &cfg, 2);
    int tokens[12], labels[12];
    make_batch(tokens, labels, 12, 40, 1);
    float *out, *dinp;
    double loss;
    cr_expect_eq(mc_gpt_forward(&g, 0, 2, tokens, labels, NULL, &out, &loss), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "slot (2)"), "%s", mc_last_error());
    cr_expect_eq(mc_gpt_forward(&g, 0, 0, NULL, labels, NULL, &out, &loss), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_gpt_backward(&g, 0, 1, NULL, 1.0f, &dinp), MC_ERR_STATE);
    tokens[3] = 40;
    cr_expect_eq(mc_gpt_forward(&g, 0, 0, tokens, labels, NULL, &out, &loss), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "tokens[3] = 40"), "%s", mc_last_error());
    tokens[3] = 1;
    /* forward_step / backward_step: more micro-batches in flight than slots */
    double nt;
    cr_expect_eq(mc_gpt_forward_step(&g, 0, 0, tokens, labels, NULL, &out, &loss, &nt), MC_OK);
    cr_expect_eq(nt, 12.0);
    cr_expect_eq(mc_gpt_forward_step(&g, 0, 2, tokens, labels, NULL, &out, &loss, &nt), MC_OK);
    cr_expect_eq(mc_gpt_backward_step(&g, 0, 0, NULL, 1.0f, &dinp), MC_ERR_STATE);
    cr_expect(mc_test_contains(mc_last_error(), "holds micro-batch 2"), "%s", mc_last_error());
    cr_expect_eq(mc_gpt_backward_step(&g, 0, 2, NULL, 1.0f, &dinp), MC_OK);
    mc_gpt_destroy(&g);
}

/* ---------------------------------------------------------------------------------------------
   an independent fp64 GPT (naive loops) */

typedef struct ref_gpt {
    int L, H, NH, HD, F, V, S, B, P, tied;
    double eps;
    double *wte, *wpe, *lnf_w, *lnf_b, *out_w;
    double *ln1_w[4], *ln1_b[4], *qkv_w[4], *qkv_b[4], *proj_w[4], *proj_b[4];
    double *ln2_w[4], *ln2_b[4], *fc1_w[4], *fc1_b[4], *fc2_w[4], *fc2_b[4];
} ref_gpt;

static double *copy_param(const mc_gpt *g, const char *name) {
    int k = mc_param_table_find(&g->table, name);
    cr_assert_geq(k, 0, "%s missing", name);
    const mc_param_info *p = &g->table.info[k];
    double *d = malloc(p->numel * sizeof(double));
    for (size_t i = 0; i < p->numel; i++) d[i] = ((const float *)g->params)[p->offset + i];
    return d;
}

static void ref_from_model(ref_gpt *r, const mc_gpt *g) {
    char name[128];
    memset(r, 0, sizeof *r);
    r->L = g->config.num_layers;
    r->H = g->H; r->NH = g->NH; r->HD = g->HD; r->F = g->F; r->V = g->vocab_padded;
    r->S = g->S; r->B = g->B; r->P = g->config.max_position_embeddings;
    r->tied = g->tied;
    r->eps = (double)g->config.layernorm_epsilon;
    r->wte = copy_param(g, "embedding.word_embeddings.weight");
    r->wpe = copy_param(g, "embedding.position_embeddings.weight");
    r->lnf_w = copy_param(g, "decoder.final_layernorm.weight");
    r->lnf_b = copy_param(g, "decoder.final_layernorm.bias");
    r->out_w = r->tied ? r->wte : copy_param(g, "output_layer.weight");
#define REF_P(field, suffix)                                                    \
    snprintf(name, sizeof name, "decoder.layers.%d.%s", l, suffix);             \
    r->field[l] = copy_param(g, name);
    for (int l = 0; l < r->L; l++) {
        REF_P(ln1_w, "input_layernorm.weight") REF_P(ln1_b, "input_layernorm.bias")
        REF_P(qkv_w, "self_attention.linear_qkv.weight") REF_P(qkv_b, "self_attention.linear_qkv.bias")
        REF_P(proj_w, "self_attention.linear_proj.weight") REF_P(proj_b, "self_attention.linear_proj.bias")
        REF_P(ln2_w, "pre_mlp_layernorm.weight") REF_P(ln2_b, "pre_mlp_layernorm.bias")
        REF_P(fc1_w, "mlp.linear_fc1.weight") REF_P(fc1_b, "mlp.linear_fc1.bias")
        REF_P(fc2_w, "mlp.linear_fc2.weight") REF_P(fc2_b, "mlp.linear_fc2.bias")
    }
#undef REF_P
}

/* The double array behind a model parameter name, to perturb for finite differences. */
static double *ref_lookup(ref_gpt *r, const char *name) {
    if (!strcmp(name, "embedding.word_embeddings.weight")) return r->wte;
    if (!strcmp(name, "embedding.position_embeddings.weight")) return r->wpe;
    if (!strcmp(name, "decoder.final_layernorm.weight")) return r->lnf_w;
    if (!strcmp(name, "decoder.final_layernorm.bias")) return r->lnf_b;
    if (!strcmp(name, "output_layer.weight")) return r->out_w;
    int l = -1, used = 0;
    if (sscanf(name, "decoder.layers.%d.%n", &l, &used) != 1 || used == 0) return NULL;
    const char *t = name + used;
    if (!strcmp(t, "input_layernorm.weight")) return r->ln1_w[l];
    if (!strcmp(t, "input_layernorm.bias")) return r->ln1_b[l];
    if (!strcmp(t, "self_attention.linear_qkv.weight")) return r->qkv_w[l];
    if (!strcmp(t, "self_attention.linear_qkv.bias")) return r->qkv_b[l];
    if (!strcmp(t, "self_attention.linear_proj.weight")) return r->proj_w[l];
    if (!strcmp(t, "self_attention.linear_proj.bias")) return r->proj_b[l];
    if (!strcmp(t, "pre_mlp_layernorm.weight")) return r->ln2_w[l];
    if (!strcmp(t, "pre_mlp_layernorm.bias")) return r->ln2_b[l];
    if (!strcmp(t, "mlp.linear_fc1.weight")) return r->fc1_w[l];
    if (!strcmp(t, "mlp.linear_fc1.bias")) return r->fc1_b[l];
    if (!strcmp(t, "mlp.linear_fc2.weight")) return r->fc2_w[l];
    if (!strcmp(t, "mlp.linear_fc2.bias")) return r->fc2_b[l];
    return NULL;
}

static void ref_layernorm(double *out, const double *x, const double *w, const double *b, int N,
                          int C, double eps) {
    for (int n = 0; n < N; n++) {
        double mean = 0, var = 0;
        for (int c = 0; c < C; c++) mean += x[n * C + c];
        mean /= C;
        for (int c = 0; c < C; c++) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
        var /= C;
        double rstd = 1.0 / sqrt(var + eps);
        for (int c = 0; c < C; c++) out[n * C + c] = (x[n * C + c] - mean) * rstd * w[c] + b[c];
    }
}

/* out[N,O] = x[N,K] W[O,K]^T + b */
static void ref_linear(double *out, const double *x, const double *w, const double *b, int N,
                       int K, int O) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = b ? b[o] : 0.0;
            for (int k = 0; k < K; k++) s += x[n * K + k] * w[o * K + k];
            out[n * O + o] = s;
        }
}

static double ref_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Sum over tokens of the cross-entropy loss; tokens and labels [S, B]. */
static double ref_loss(const ref_gpt *r, const int *tokens, const int *labels) {
    int S = r->S, B = r->B, N = S * B, H = r->H, NH = r->NH, HD = r->HD, Q = NH * HD, F = r->F;
    double *x = calloc((size_t)N * H, sizeof(double)), *ln = calloc((size_t)N * H, sizeof(double));
    double *qkv = calloc((size_t)N * 3 * Q, sizeof(double)), *y = calloc((size_t)N * Q, sizeof(double));
    double *t = calloc((size_t)N * (F > H ? F : H), sizeof(double));
    double *u = calloc((size_t)N * (F > H ? F : H), sizeof(double));
    double *logits = calloc((size_t)r->V, sizeof(double));
    for (int s = 0; s < S; s++)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                x[(s * B + b) * H + h] = r->wte[tokens[s * B + b] * H + h] + r->wpe[s * H + h];
    for (int l = 0; l < r->L; l++) {
        ref_layernorm(ln, x, r->ln1_w[l], r->ln1_b[l], N, H, r->eps);
        ref_linear(qkv, ln, r->qkv_w[l], r->qkv_b[l], N, H, 3 * Q);
        for (int b = 0; b < B; b++)
            for (int hh = 0; hh < NH; hh++)
                for (int s = 0; s < S; s++) {
                    const double *q = qkv + (s * B + b) * 3 * Q + hh * 3 * HD;
                    double sc[64], mx = -1e300, z = 0;
                    for (int s2 = 0; s2 <= s; s2++) {
                        const double *k = qkv + (s2 * B + b) * 3 * Q + hh * 3 * HD + HD;
                        double dot = 0;
                        for (int d = 0; d < HD; d++) dot += q[d] * k[d];
                        sc[s2] = dot / sqrt((double)HD);
                        if (sc[s2] > mx) mx = sc[s2];
                    }
                    for (int s2 = 0; s2 <= s; s2++) z += exp(sc[s2] - mx);
                    for (int d = 0; d < HD; d++) {
                        double acc = 0;
                        for (int s2 = 0; s2 <= s; s2++)
                            acc += exp(sc[s2] - mx) / z *
                                   qkv[(s2 * B + b) * 3 * Q + hh * 3 * HD + 2 * HD + d];
                        y[(s * B + b) * Q + hh * HD + d] = acc;
                    }
                }
        ref_linear(t, y, r->proj_w[l], r->proj_b[l], N, Q, H);
        for (int i = 0; i < N * H; i++) x[i] += t[i];
        ref_layernorm(ln, x, r->ln2_w[l], r->ln2_b[l], N, H, r->eps);
        ref_linear(t, ln, r->fc1_w[l], r->fc1_b[l], N, H, F);
        for (int i = 0; i < N * F; i++) u[i] = ref_gelu(t[i]);
        ref_linear(t, u, r->fc2_w[l], r->fc2_b[l], N, F, H);
        for (int i = 0; i < N * H; i++) x[i] += t[i];
    }
    ref_layernorm(ln, x, r->lnf_w, r->lnf_b, N, H, r->eps);
    double total = 0;
    for (int n = 0; n < N; n++) {
        double mx = -1e300, z = 0;
        ref_linear(logits, ln + n * H, r->out_w, NULL, 1, H, r->V);
        for (int v = 0; v < r->V; v++) if (logits[v] > mx) mx = logits[v];
        for (int v = 0; v < r->V; v++) z += exp(logits[v] - mx);
        total += log(z) + mx - logits[labels[n]];
    }
    free(x); free(ln); free(qkv); free(y); free(t); free(u); free(logits);
    return total;
}

/* The model's loss equals the fp64 loss, and its gradients (of the mean loss) equal central
   differences of the fp64 mean loss on a sample of every tensor's elements. */
static void check_gradients(int untied) {
    mc_gpt_config cfg = tiny_config();
    cfg.untie_embeddings_and_output_weights = untied;
    mc_gpt g;
    init_model(&g, &cfg, 1);
    int tokens[12], labels[12];
    make_batch(tokens, labels, 12, 40, 7);
    mc_gpt_zero_grad(&g);
    double loss = run_step(&g, 0, tokens, labels);
    ref_gpt r;
    ref_from_model(&r, &g);
    double want = ref_loss(&r, tokens, labels);
    cr_expect(fabs(loss - want) <= 1e-5 * fabs(want), "loss %.9g, fp64 reference %.9g", loss, want);
    cr_expect(want / 12 > 2.5 && want / 12 < 5.0, "mean loss %g should be near log(40)", want / 12);

    int checked = 0, bad = 0;
    double worst = 0;
    for (int i = 0; i < g.table.count; i++) {
        const mc_param_info *p = &g.table.info[i];
        double *arr = ref_lookup(&r, p->name);
        cr_assert_not_null(arr, "no reference tensor for %s", p->name);
        /* 5 elements spread over the tensor, plus (for the embedding) a used row */
        for (int k = 0; k < 6; k++) {
            size_t e = k < 5 ? (size_t)((p->numel - 1) * (size_t)k / 4) : (size_t)tokens[0] * 16 + 3;
            if (e >= p->numel) continue;
            double keep = arr[e], h = 1e-5;
            arr[e] = keep + h;
            double lp = ref_loss(&r, tokens, labels);
            arr[e] = keep - h;
            double lm = ref_loss(&r, tokens, labels);
            arr[e] = keep;
            double fd = (lp - lm) / (2 * h) / 12.0;
            double got = g.grads[p->offset + e];
            double diff = fabs(got - fd), tol = 2e-5 + 2e-3 * fabs(fd);
            if (diff > worst) worst = diff;
            checked++;
            if (!(diff <= tol)) {
                bad++;
                cr_expect(0, "%s[%zu]: grad %.8g, finite difference %.8g", p->name, e, got, fd);
            }
        }
    }
    cr_expect(checked > 100, "only %d elements checked", checked);
    cr_expect_eq(bad, 0, "%d of %d gradient elements off (worst |diff| %g)", bad, checked, worst);
    mc_gpt_destroy(&g);
}

Test(model, gradients_match_fp64_finite_differences_tied) { check_gradients(0); }
Test(model, gradients_match_fp64_finite_differences_untied) { check_gradients(1); }

/* ---------------------------------------------------------------------------------------------
   dropout, recompute */

static mc_gpt_config dropout_config(void) {
    mc_gpt_config c = tiny_config();
    c.num_layers = 4;
    c.hidden_dropout = 0.2f;
    c.attention_dropout = 0.3f;
    return c;
}

/* Three micro-batches forward and backward: every loss and the final grads. */
static void run_three(const mc_gpt_config *cfg, double *losses, float **grads, size_t *n_grads) {
    mc_gpt g;
    init_model(&g, cfg, 3);
    int tokens[3][12], labels[3][12];
    for (int m = 0; m < 3; m++) make_batch(tokens[m], labels[m], 12, 40, 11 + (unsigned)m);
    mc_gpt_zero_grad(&g);
    /* all forwards first, then the backwards in reverse (several slots in flight) */
    for (int m = 0; m < 3; m++) {
        float *out;
        cr_assert_eq(mc_gpt_forward(&g, 0, m, tokens[m], labels[m], NULL, &out, &losses[m]), MC_OK,
                     "%s", mc_last_error());
    }
    for (int m = 2; m >= 0; m--) {
        float *dinp;
        cr_assert_eq(mc_gpt_backward(&g, 0, m, NULL, 1.0f / 36.0f, &dinp), MC_OK, "%s",
                     mc_last_error());
    }
    *n_grads = g.table.total;
    *grads = malloc(g.table.total * sizeof(float));
    memcpy(*grads, g.grads, g.table.total * sizeof(float));
    mc_gpt_destroy(&g);
}

Test(model, dropout_masks_are_reproducible_and_matter) {
    mc_gpt_config cfg = dropout_config();
    double l1[3], l2[3], l0[3];
    float *g1, *g2, *g0;
    size_t n1, n2, n0;
    run_three(&cfg, l1, &g1, &n1);
    run_three(&cfg, l2, &g2, &n2);
    for (int m = 0; m < 3; m++) cr_expect_eq(l1[m], l2[m], "micro-batch %d: %.9g vs %.9g", m, l1[m], l2[m]);
    cr_expect(n1 == n2 && memcmp(g1, g2, n1 * sizeof(float)) == 0, "grads differ between runs");
    /* the micro-batches draw different masks: the same batch twice gives different losses */
    cfg.hidden_dropout = MC_DROPOUT_OFF;
    cfg.attention_dropout = MC_DROPOUT_OFF;
    run_three(&cfg, l0, &g0, &n0);
    for (int m = 0; m < 3; m++) cr_expect_neq(l0[m], l1[m], "dropout changed nothing in micro-batch %d", m);
    /* another seed, other masks */
    cfg = dropout_config();
    cfg.seed = 99;
    run_three(&cfg, l2, &g2, &n2);
    cr_expect_neq(l1[0], l2[0]);
    free(g0); free(g1); free(g2);
}

Test(model, eval_mode_switches_dropout_off) {
    mc_gpt_config cfg = dropout_config();
    mc_gpt a, b;
    init_model(&a, &cfg, 1);
    cfg.hidden_dropout = MC_DROPOUT_OFF;
    cfg.attention_dropout = MC_DROPOUT_OFF;
    init_model(&b, &cfg, 1);
    int tokens[12], labels[12];
    make_batch(tokens, labels, 12, 40, 5);
    float *out;
    double la, lb;
    a.training = 0;
    cr_assert_eq(mc_gpt_forward(&a, 0, 0, tokens, labels, NULL, &out, &la), MC_OK);
    cr_assert_eq(mc_gpt_forward(&b, 0, 0, tokens, labels, NULL, &out, &lb), MC_OK);
    cr_expect_eq(la, lb, "eval loss %.9g vs no-dropout loss %.9g", la, lb);
    mc_gpt_destroy(&a);
    mc_gpt_destroy(&b);
}

static void expect_same_run(const char *what, const mc_gpt_config *cfg) {
    mc_gpt_config base = *cfg;
    base.recompute_granularity = MC_RECOMPUTE_NONE;
    base.recompute_method = MC_RECOMPUTE_METHOD_NONE;
    base.recompute_num_layers = 0;
    double l0[3], l1[3];
    float *g0, *g1;
    size_t n0, n1;
    run_three(&base, l0, &g0, &n0);
    run_three(cfg, l1, &g1, &n1);
    for (int m = 0; m < 3; m++)
        cr_expect_eq(l0[m], l1[m], "%s: micro-batch %d loss %.9g vs %.9g", what, m, l1[m], l0[m]);
    cr_assert_eq(n0, n1);
    size_t bad = 0;
    for (size_t i = 0; i < n0; i++) bad += memcmp(&g0[i], &g1[i], sizeof(float)) != 0;
    cr_expect_eq(bad, 0, "%s: %zu of %zu grad elements differ from no recompute", what, bad, n0);
    free(g0);
    free(g1);
}

Test(model, full_uniform_recompute_is_bit_identical) {
    mc_gpt_config cfg = dropout_config();
    cfg.recompute_granularity = MC_RECOMPUTE_FULL;
    cfg.recompute_method = MC_RECOMPUTE_UNIFORM;
    cfg.recompute_num_layers = 3;   /* groups [0,3) and [3,4) */
    expect_same_run("full uniform 3", &cfg);
    cfg.recompute_num_layers = 1;
    expect_same_run("full uniform 1", &cfg);
}

Test(model, full_block_recompute_is_bit_identical) {
    mc_gpt_config cfg = dropout_config();
    cfg.recompute_granularity = MC_RECOMPUTE_FULL;
    cfg.recompute_method = MC_RECOMPUTE_BLOCK;
    cfg.recompute_num_layers = 2;   /* layers 0 and 1 alone, 2 and 3 kept */
    expect_same_run("full block 2", &cfg);
}

Test(model, selective_recompute_is_bit_identical) {
    mc_gpt_config cfg = dropout_config();
    cfg.recompute_granularity = MC_RECOMPUTE_SELECTIVE;
    expect_same_run("selective", &cfg);
}

/* Without the stream snapshot a recomputed layer would draw fresh masks: a model whose
   tracker is disturbed between forward and backward must still give the same grads under
   recompute (the snapshot is restored), which fails if the snapshot is not used. */
Test(model, recompute_replays_the_forward_streams) {
    mc_gpt_config cfg = dropout_config();
    cfg.recompute_granularity = MC_RECOMPUTE_FULL;
    cfg.recompute_method = MC_RECOMPUTE_UNIFORM;
    cfg.recompute_num_layers = 2;
    mc_gpt g;
    int tokens[12], labels[12];
    make_batch(tokens, labels, 12, 40, 3);
    float *ref = NULL;
    for (int pass = 0; pass < 2; pass++) {
        init_model(&g, &cfg, 1);
        float *out, *dinp;
        double loss;
        cr_assert_eq(mc_gpt_forward(&g, 0, 0, tokens, labels, NULL, &out, &loss), MC_OK);
        if (pass == 1) {   /* other draws between forward and backward move every stream */
            float junk[64];
            mc_rng_uniform(mc_rng_tracker_current(&g.rng), junk, 64);
            mc_rng_tracker_fork(&g.rng, MC_RNG_MODEL_PARALLEL);
            mc_rng_uniform(mc_rng_tracker_current(&g.rng), junk, 64);
            mc_rng_tracker_unfork(&g.rng, MC_RNG_MODEL_PARALLEL);
        }
        cr_assert_eq(mc_gpt_backward(&g, 0, 0, NULL, 1.0f / 12, &dinp), MC_OK);
        if (pass == 0) {
            ref = malloc(g.table.total * sizeof(float));
            memcpy(ref, g.grads, g.table.total * sizeof(float));
        } else {
            cr_expect(memcmp(ref, g.grads, g.table.total * sizeof(float)) == 0,
                      "recompute drew other masks than the forward");
        }
        mc_gpt_destroy(&g);
    }
    free(ref);
}

static int ready_seen[64], ready_order[64], ready_n;

static void on_ready(void *user, int param) {
    (void)user;
    if (param >= 0 && param < 64) ready_seen[param]++;
    if (ready_n < 64) ready_order[ready_n++] = param;
}

Test(model, grad_ready_reports_every_parameter_once_in_backward_order) {
    mc_gpt_config cfg = tiny_config();
    mc_gpt g;
    init_model(&g, &cfg, 1);
    g.grad_ready = on_ready;
    int tokens[12], labels[12];
    make_batch(tokens, labels, 12, 40, 2);
    ready_n = 0;
    memset(ready_seen, 0, sizeof ready_seen);
    run_step(&g, 0, tokens, labels);
    cr_expect_eq(ready_n, g.table.count, "%d reports for %d params", ready_n, g.table.count);
    for (int i = 0; i < g.table.count; i++)
        cr_expect_eq(ready_seen[i], 1, "%s reported %d times", g.table.info[i].name, ready_seen[i]);
    /* the final norm first, the last layer before the first, the embedding last */
    cr_expect(mc_test_contains(g.table.info[ready_order[0]].name, "final_layernorm"));
    cr_expect(mc_test_contains(g.table.info[ready_order[2]].name, "decoder.layers.1."),
              "%s", g.table.info[ready_order[2]].name);
    cr_expect_str_eq(g.table.info[ready_order[ready_n - 2]].name, "embedding.word_embeddings.weight");
    /* grad sync off: nothing reported */
    mc_gpt_set_grad_sync(&g, 0, 0);
    ready_n = 0;
    run_step(&g, 0, tokens, labels);
    cr_expect_eq(ready_n, 0);
    mc_gpt_destroy(&g);
}

/* ---------------------------------------------------------------------------------------------
   tensor taps (>>models.gpt.taps) */

typedef struct tap_log {
    int n;
    char names[128][64];
    int backward[128];
    int out_rows[128], out_cols[128];
    float losses[12];
} tap_log;

static void on_tap(void *user, const mc_gpt_tap *t) {
    tap_log *log = user;
    if (log->n < 128) {
        snprintf(log->names[log->n], 64, "%s", t->module);
        log->backward[log->n] = t->backward;
        log->out_rows[log->n] = t->out.rows;
        log->out_cols[log->n] = t->out.cols;
        log->n++;
    }
    if (!t->backward && strcmp(t->module, "loss") == 0)
        memcpy(log->losses, t->out.data, sizeof log->losses);   /* CPU table: host memory */
}

static int tap_index(const tap_log *log, const char *name, int backward) {
    for (int i = 0; i < log->n; i++)
        if (log->backward[i] == backward && strcmp(log->names[i], name) == 0) return i;
    return -1;
}

Test(model, tensor_taps_see_every_module_in_call_order_and_change_nothing) {
    static const char *const in_layer[] = {"input_layernorm", "self_attention.linear_qkv",
                                           "self_attention.core_attention",
                                           "self_attention.linear_proj", "self_attention",
                                           "pre_mlp_layernorm", "mlp.linear_fc1",
                                           "mlp.linear_fc2", "mlp"};
    mc_gpt_config cfg = tiny_config();
    mc_gpt plain, tapped;
    init_model(&plain, &cfg, 1);
    init_model(&tapped, &cfg, 1);
    static tap_log log;
    memset(&log, 0, sizeof log);
    tapped.tap = on_tap;
    tapped.tap_user = &log;
    int tokens[12], labels[12];
    make_batch(tokens, labels, 12, 40, 3);
    double a = run_step(&plain, 0, tokens, labels), b = run_step(&tapped, 0, tokens, labels);
    cr_expect_eq(a, b, "a tap changed the loss: %.9g vs %.9g", a, b);
    cr_expect_eq(memcmp(plain.grads, tapped.grads, plain.table.total * sizeof(float)), 0,
                 "a tap changed the gradients");
    /* every module once per direction: embedding, 2 x (9 in the layer + the layer), head 3 */
    int per_direction = 1 + 2 * 10 + 3;
    cr_expect_eq(log.n, 2 * per_direction, "%d taps", log.n);
    int prev = -1;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 9; i++) {
            char name[64];
            snprintf(name, sizeof name, "decoder.layers.%d.%s", l, in_layer[i]);
            int at = tap_index(&log, name, 0);
            cr_expect_gt(at, prev, "%s out of forward order", name);
            cr_expect_geq(tap_index(&log, name, 1), 0, "no backward tap for %s", name);
            prev = at;
        }
    cr_expect_eq(tap_index(&log, "embedding", 0), 0);
    cr_expect_eq(tap_index(&log, "loss", 1), per_direction, "backward starts at the loss");
    cr_expect_eq(tap_index(&log, "embedding", 1), log.n - 1, "backward ends at the embedding");
    int out = tap_index(&log, "output_layer", 0), loss = tap_index(&log, "loss", 0);
    cr_expect(out >= 0 && log.out_rows[out] == 12 && log.out_cols[out] == 40);
    cr_expect(loss >= 0 && log.out_rows[loss] == 12 && log.out_cols[loss] == 1);
    const float *losses = mc_gpt_losses(&tapped, 0);
    for (int n = 0; n < 12; n++) cr_expect_eq(log.losses[n], losses[n]);
    /* a recomputed forward is a replay: no second forward tap */
    mc_gpt_destroy(&tapped);
    mc_gpt_config rc_cfg = cfg;
    rc_cfg.recompute_granularity = MC_RECOMPUTE_FULL;
    rc_cfg.recompute_method = MC_RECOMPUTE_UNIFORM;
    rc_cfg.recompute_num_layers = 2;
    init_model(&tapped, &rc_cfg, 1);
    memset(&log, 0, sizeof log);
    tapped.tap = on_tap;
    tapped.tap_user = &log;
    run_step(&tapped, 0, tokens, labels);
    cr_expect_eq(log.n, 2 * per_direction, "%d taps under full recompute", log.n);
    mc_gpt_destroy(&tapped);
    mc_gpt_destroy(&plain);
}

/* ---------------------------------------------------------------------------------------------
   the spec: a spec's own attention, its fallback on a refused shape, renamed tensors

   own_attention re-assembles the local attention from public calls only (column-parallel QKV,
   the op table's core attention with a model-parallel draw, row-parallel projection), keeping
   what its backward needs in ctx->attention_cache and its gradients in ctx->attention_scratch.
   Running the same ops in the same order, it must give the local model's losses and gradients
   bit for bit, with dropout and with full recompute (the replay gets its own cache block). */

typedef struct own_layout {
    size_t qkv, atty, stats, draw, total;   /* bytes from the start of the cache block */
} own_layout;

static own_layout own_layout_of(const mc_gpt *g) {
    own_layout L;
    size_t n = (size_t)g->N;
    L.qkv = 0;
    L.atty = L.qkv + n * 3 * (size_t)g->Ql * sizeof(float);
    L.stats = L.atty + n * (size_t)g->Ql * sizeof(float);
    L.draw = L.stats + g->ops->attention_stats(g->ops, g->S, g->B, g->NHl, g->HD) * sizeof(float);
    L.total = L.draw + 3 * sizeof(uint64_t);
    return L;
}

static int own_calls, own_blocks_n;
static void *own_blocks[64];

static int own_forward(const mc_layer_ctx *ctx, void *out, const void *inp) {
    mc_gpt *g = ctx->gpt;
    own_layout L = own_layout_of(g);
    char *c = (char *)ctx->attention_cache;
    uint64_t draw[3] = {0, 0, 0};   /* seed, offset, p as bits */
    float p = g->config.attention_dropout;
    int rc;
    own_calls++;
    int seen = 0;
    for (int i = 0; i < own_blocks_n; i++) seen |= own_blocks[i] == c;
    if (!seen && own_blocks_n < 64) own_blocks[own_blocks_n++] = c;
    if ((rc = mc_column_parallel_linear_forward(c + L.qkv, NULL, inp, ctx->w[MC_GPT_QKV_W],
                                                ctx->w[MC_GPT_QKV_B], g->S, g->B, g->H, 3 * g->Q,
                                                0, g->dtype, NULL, g->ops)) != MC_OK)
        return rc;
    if (g->training && p > 0.0f) {
        size_t n = (size_t)g->B * g->NHl * g->S * g->S;
        cr_assert_eq(mc_rng_tracker_fork(&g->rng, MC_RNG_MODEL_PARALLEL), MC_OK);
        mc_rng *r = mc_rng_tracker_current(&g->rng);
        draw[0] = r->seed;
        draw[1] = r->offset;
        r->offset += (n + 3u) & ~(uint64_t)3u;
        cr_assert_eq(mc_rng_tracker_unfork(&g->rng, MC_RNG_MODEL_PARALLEL), MC_OK);
        memcpy(&draw[2], &p, sizeof p);
    }
    memcpy(c + L.draw, draw, sizeof draw);   /* the CPU table: op memory is host memory */
    if ((rc = g->ops->attention_forward(g->ops, c + L.atty, (float *)(c + L.stats), c + L.qkv,
                                        g->S, g->B, g->NHl, g->HD, draw[2] ? p : 0.0f, draw[0],
                                        draw[1], g->dtype)) != MC_OK)
        return rc;
    return mc_row_parallel_linear_forward(out, NULL, c + L.atty, ctx->w[MC_GPT_PROJ_W],
                                          ctx->w[MC_GPT_PROJ_B], g->S, g->B, g->Q, g->H,
                                          MC_TP_INPUT_IS_PARALLEL, g->dtype, NULL, g->ops);
}

static int own_backward(const mc_layer_ctx *ctx, void *dinp, const void *dout, const void *inp) {
    mc_gpt *g = ctx->gpt;
    own_layout L = own_layout_of(g);
    char *c = (char *)ctx->attention_cache;
    float *d_atty = (float *)ctx->attention_scratch, *d_qkv = d_atty + (size_t)g->N * g->Ql;
    uint64_t draw[3];
    float p;
    int rc;
    memcpy(draw, c + L.draw, sizeof draw);
    memcpy(&p, &draw[2], sizeof p);
    if ((rc = mc_row_parallel_linear_backward(d_atty, ctx->g[MC_GPT_PROJ_W], ctx->g[MC_GPT_PROJ_B],
                                              NULL, dout, c + L.atty, ctx->w[MC_GPT_PROJ_W],
                                              g->S, g->B, g->Q, g->H, MC_TP_INPUT_IS_PARALLEL,
                                              g->dtype, NULL, g->ops)) != MC_OK)
        return rc;
    if ((rc = g->ops->attention_backward(g->ops, d_qkv, d_atty, c + L.qkv, c + L.atty,
                                         (const float *)(c + L.stats), g->S, g->B, g->NHl, g->HD,
                                         draw[2] ? p : 0.0f, draw[0], draw[1], g->dtype)) != MC_OK)
        return rc;
    return mc_column_parallel_linear_backward(dinp, ctx->g[MC_GPT_QKV_W], ctx->g[MC_GPT_QKV_B],
                                              NULL, d_qkv, inp, ctx->w[MC_GPT_QKV_W], g->S, g->B,
                                              g->H, 3 * g->Q, 0, g->dtype, NULL, g->ops);
}

static size_t own_cache_bytes(const mc_gpt *g) { return own_layout_of(g).total; }
static size_t own_scratch_bytes(const mc_gpt *g) {
    return (size_t)g->N * 4 * (size_t)g->Ql * sizeof(float);
}
static int own_refuse_reason_given;
static int own_refuses_odd_heads(const mc_gpt *g, char *why, size_t cap) {
    if (g->HD % 2 == 0) return 0;
    own_refuse_reason_given = snprintf(why, cap, "head_dim %d is odd", g->HD) > 0;
    return 1;
}

static mc_transformer_spec own_spec(void) {
    mc_transformer_spec s = *mc_transformer_spec_local();
    s.name = "own";
    s.attention_forward = own_forward;
    s.attention_backward = own_backward;
    s.attention_cache_bytes = own_cache_bytes;
    s.attention_scratch_bytes = own_scratch_bytes;
    s.attention_accepts = own_refuses_odd_heads;
    return s;
}

static void init_with_spec(mc_gpt *g, const mc_gpt_config *cfg, int n_slots,
                           const mc_transformer_spec *spec) {
    mc_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.config = *cfg;
    d.n_slots = n_slots;
    d.spec = spec;
    int rc = mc_gpt_init(g, &d);
    cr_assert_eq(rc, MC_OK, "mc_gpt_init: %s: %s", mc_err_name(rc), mc_last_error());
}

/* run_three's steps on a model built with `spec` */
static void run_three_with(const mc_gpt_config *cfg, const mc_transformer_spec *spec,
                           double *losses, float **grads, size_t *n_grads) {
    mc_gpt g;
    init_with_spec(&g, cfg, 3, spec);
    int tokens[3][12], labels[3][12];
    for (int m = 0; m < 3; m++) make_batch(tokens[m], labels[m], 12, 40, 11 + (unsigned)m);
    mc_gpt_zero_grad(&g);
    for (int m = 0; m < 3; m++) {
        float *out;
        cr_assert_eq(mc_gpt_forward(&g, 0, m, tokens[m], labels[m], NULL, &out, &losses[m]), MC_OK,
                     "%s", mc_last_error());
    }
    for (int m = 2; m >= 0; m--) {
        float *dinp;
        cr_assert_eq(mc_gpt_backward(&g, 0, m, NULL, 1.0f / 36.0f, &dinp), MC_OK, "%s",
                     mc_last_error());
    }
    *n_grads = g.table.total;
    *grads = malloc(g.table.total * sizeof(float));
    memcpy(*grads, g.grads, g.table.total * sizeof(float));
    mc_gpt_destroy(&g);
}

static void expect_own_equals_local(const char *what, const mc_gpt_config *cfg) {
    mc_transformer_spec own = own_spec();
    double l0[3], l1[3];
    float *g0, *g1;
    size_t n0, n1;
    run_three(cfg, l0, &g0, &n0);
    own_calls = own_blocks_n = 0;
    run_three_with(cfg, &own, l1, &g1, &n1);
    cr_expect_gt(own_calls, 0, "%s: the spec's attention never ran", what);
    for (int m = 0; m < 3; m++)
        cr_expect_eq(l0[m], l1[m], "%s: micro-batch %d loss %.9g vs local %.9g", what, m, l1[m],
                     l0[m]);
    cr_assert_eq(n0, n1);
    size_t bad = 0;
    for (size_t i = 0; i < n0; i++) bad += memcmp(&g0[i], &g1[i], sizeof(float)) != 0;
    cr_expect_eq(bad, 0, "%s: %zu of %zu grad elements differ from the local spec", what, bad, n0);
    free(g0);
    free(g1);
}

Test(model, spec_own_attention_equals_the_local_one_bit_for_bit) {
    mc_gpt_config cfg = dropout_config();
    expect_own_equals_local("dropout, no recompute", &cfg);
    /* 4 layers x 3 slots, each with its own cache block */
    cr_expect_eq(own_calls, 12);
    cr_expect_eq(own_blocks_n, 12, "cache blocks seen: %d (one per layer and slot)", own_blocks_n);
    cfg.recompute_granularity = MC_RECOMPUTE_FULL;
    cfg.recompute_method = MC_RECOMPUTE_UNIFORM;
    cfg.recompute_num_layers = 2;
    expect_own_equals_local("dropout, full recompute", &cfg);
    cr_expect_eq(own_calls, 24, "every layer's forward ran twice under full recompute");
}

Test(model, spec_own_attention_keeps_its_bytes_instead_of_the_local_ones) {
    mc_gpt_config cfg = tiny_config();
    mc_transformer_spec own = own_spec();
    mc_gpt a, b;
    size_t act_a, act_b;
    init_model(&a, &cfg, 2);
    init_with_spec(&b, &cfg, 2, &own);
    mc_gpt_memory(&a, &act_a);
    mc_gpt_memory(&b, &act_b);
    /* the local attention keeps qkv, atty and stats as three 256-aligned tensors; own keeps one
       block of the same bytes plus 24 for the draw, and a scratch of 4 N Ql floats */
    size_t per_local = 0, per_own = 0, align = 256;
    size_t sizes[3] = {(size_t)a.N * 3 * a.Ql * 4, (size_t)a.N * a.Ql * 4,
                       a.ops->attention_stats(a.ops, a.S, a.B, a.NHl, a.HD) * 4};
    for (int i = 0; i < 3; i++) per_local += (sizes[i] + align - 1) / align * align;
    per_own = (own_cache_bytes(&b) + align - 1) / align * align;
    size_t layers_slots = (size_t)cfg.num_layers * 2;
    long long want = (long long)layers_slots * ((long long)per_own - (long long)per_local);
    long long got = (long long)act_b - (long long)act_a;
    long long scratch = (long long)own_scratch_bytes(&b);
    /* the scratch block is the last one of the scratch arena: its start is aligned */
    cr_expect(got >= want + scratch && got < want + scratch + (long long)align,
              "activation bytes: own %zu - local %zu = %lld, want %lld + scratch %lld (+ < 256)",
              act_b, act_a, got, want, scratch);
    mc_gpt_destroy(&a);
    mc_gpt_destroy(&b);
}

Test(model, spec_that_refuses_the_shape_falls_back_to_the_local_attention) {
    mc_gpt_config cfg = dropout_config();
    cfg.hidden_size = 18;   /* 2 heads of 9: own refuses an odd head_dim */
    mc_transformer_spec own = own_spec();
    mc_gpt g;
    own_refuse_reason_given = 0;
    init_with_spec(&g, &cfg, 3, &own);
    cr_expect_eq(g.attention_fallback, 1);
    cr_expect(strstr(g.attention_fallback_why, "head_dim 9 is odd") != NULL, "why: \"%s\"",
              g.attention_fallback_why);
    cr_expect(own_refuse_reason_given);
    cr_expect_eq(g.spec, &own, "the model keeps the spec it was given");
    mc_gpt_destroy(&g);
    double l0[3], l1[3];
    float *g0, *g1;
    size_t n0, n1;
    run_three(&cfg, l0, &g0, &n0);
    own_calls = 0;
    run_three_with(&cfg, &own, l1, &g1, &n1);
    cr_expect_eq(own_calls, 0, "the refused attention ran %d times", own_calls);
    for (int m = 0; m < 3; m++) cr_expect_eq(l0[m], l1[m], "micro-batch %d", m);
    cr_expect(n0 == n1 && memcmp(g0, g1, n0 * sizeof(float)) == 0, "grads differ from local");
    free(g0);
    free(g1);
    /* an accepted shape: no fallback, the own attention runs */
    cfg = tiny_config();
    init_with_spec(&g, &cfg, 1, &own);
    cr_expect_eq(g.attention_fallback, 0);
    cr_expect_str_eq(g.attention_fallback_why, "");
    mc_gpt_destroy(&g);
}

static const char *const renamed[MC_GPT_LAYER_TENSORS] = {
    [MC_GPT_LN1_W] = "ln_1.weight",
    [MC_GPT_QKV_W] = "attn.c_attn.weight",
    [MC_GPT_PROJ_W] = "attn.c_proj.weight",
};

Test(model, spec_tensor_names_rename_the_keys_and_keep_the_roles) {
    mc_gpt_config cfg = tiny_config();
    mc_transformer_spec s = *mc_transformer_spec_local();
    s.tensor_names = renamed;
    mc_gpt g, ref;
    init_with_spec(&g, &cfg, 1, &s);
    init_model(&ref, &cfg, 1);
    cr_expect_eq(g.table.count, ref.table.count);
    cr_expect_geq(mc_param_table_find(&g.table, "decoder.layers.1.ln_1.weight"), 0);
    cr_expect_lt(mc_param_table_find(&g.table, "decoder.layers.1.input_layernorm.weight"), 0);
    cr_expect_geq(mc_param_table_find(&g.table, "decoder.layers.0.self_attention.linear_qkv.bias"),
                  0, "an entry left NULL keeps Megatron's name");
    cr_expect_str_eq(mc_gpt_layer_tensor_name(MC_GPT_QKV_W), "self_attention.linear_qkv.weight");
    cr_expect_null(mc_gpt_layer_tensor_name(MC_GPT_LAYER_TENSORS));
    /* roles: the renamed norm weight starts at 1, the renamed projection has the scaled std */
    const float *ln = (const float *)mc_gpt_param(&g, "decoder.layers.1.ln_1.weight");
    cr_assert_not_null(ln);
    for (int i = 0; i < cfg.hidden_size; i++) cr_expect_eq(ln[i], 1.0f, "ln_1.weight[%d]", i);
    int i = mc_param_table_find(&g.table, "decoder.layers.0.attn.c_proj.weight");
    cr_assert_geq(i, 0);
    const float *w = (const float *)g.params + g.table.info[i].offset;
    double ss = 0.0;
    for (size_t k = 0; k < g.table.info[i].numel; k++) ss += (double)w[k] * w[k];
    double std = sqrt(ss / (double)g.table.info[i].numel);
    double want = 0.2 / sqrt(2.0 * cfg.num_layers);   /* init_method_std / sqrt(2 L) */
    cr_expect(std > 0.6 * want && std < 1.4 * want, "c_proj std %.4f, scaled std %.4f", std, want);
    mc_gpt_destroy(&g);
    mc_gpt_destroy(&ref);
}

Test(model, spec_errors_name_the_field) {
    mc_gpt_config cfg = tiny_config();
    mc_transformer_spec s = *mc_transformer_spec_local();
    mc_gpt g;
    mc_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.config = cfg;
    d.spec = &s;
    s.name = "half";
    s.attention_backward = NULL;
    cr_expect_eq(mc_gpt_init(&g, &d), MC_ERR_INVALID_DESC);
    cr_expect(strstr(mc_last_error(), "spec 'half' must set all six") != NULL, "%s",
              mc_last_error());
    s = *mc_transformer_spec_local();
    static const char *const spaced[MC_GPT_LAYER_TENSORS] = {[MC_GPT_FC1_W] = "mlp.fc 1.weight"};
    s.tensor_names = spaced;
    cr_expect_eq(mc_gpt_init(&g, &d), MC_ERR_INVALID_DESC);
    cr_expect(strstr(mc_last_error(), "tensor_names[8] (\"mlp.fc 1.weight\")") != NULL, "%s",
              mc_last_error());
    static const char *const twice[MC_GPT_LAYER_TENSORS] = {[MC_GPT_LN2_W] = "input_layernorm.weight"};
    s.tensor_names = twice;
    cr_expect_neq(mc_gpt_init(&g, &d), MC_OK, "two tensors under one key are refused");
}

/* ---------------------------------------------------------------------------------------------
   multi-rank: tests/mpi_cases/model_cases under mpirun (never this binary) */

#include <criterion/parameterized.h>

#define RUN_LIMIT_S 100.0
#define OUT_CAP (1 << 17)

typedef struct model_run {
    char case_name[16];
    int np;
    char args[96];
} model_run;

/* TP 1/2/4 with SP on and off, PP 2/4, VPP 2, tied and untied, DP 2; the same under the
   schedule module (no pipelining, 1F1B, interleaved); and recompute (full uniform, full block,
   selective) against no recompute under TP, SP, PP and VPP. */
static model_run model_runs[] = {
    {"equiv", 1, ""},
    {"equiv", 2, "--tp 2"},
    {"equiv", 2, "--tp 2 --sp"},
    {"equiv", 4, "--tp 4"},
    {"equiv", 4, "--tp 4 --sp"},
    {"equiv", 2, "--pp 2"},
    {"equiv", 2, "--pp 2 --untied"},
    {"equiv", 4, "--pp 4"},
    {"equiv", 2, "--pp 2 --vpp 2"},
    {"equiv", 4, "--pp 4 --vpp 2"},
    {"equiv", 4, "--tp 2 --pp 2 --sp"},
    {"equiv", 4, "--tp 2 --pp 2 --vpp 2 --sp --untied"},
    {"equiv", 4, "--tp 2"},   /* DP 2: replicas hold the same model */
    {"equiv", 2, "--tp 2 --hidden-dropout"},
    {"equiv", 4, "--tp 4 --hidden-dropout"},
    {"rng", 8, "--tp 2 --pp 2"},   /* dropout on: seeds and masks per rank */
    {"rng", 4, "--tp 2"},
    {"rng", 4, "--tp 4"},
    {"schedule", 1, "-M 3"},
    {"schedule", 2, "--pp 2 -M 4"},
    {"schedule", 4, "--pp 4 --vpp 2 -M 4"},
    {"schedule", 4, "--tp 2 --pp 2 --sp -M 3"},
    {"schedule", 2, "--pp 2 --vpp 2 -M 4 --recompute full-uniform"},
    {"schedule", 8, "--tp 2 --pp 4 --vpp 2 --sp -M 4"},
    {"recompute", 1, "--recompute full-uniform"},
    {"recompute", 2, "--tp 2 --sp --recompute full-uniform"},
    {"recompute", 2, "--pp 2 --vpp 2 --recompute full-block"},
    {"recompute", 4, "--tp 2 --pp 2 --recompute selective"},
    {"recompute", 4, "--tp 4 --sp --recompute full-block"},
};

ParameterizedTestParameters(model, cases) {
    return cr_make_param_array(model_run, model_runs, sizeof model_runs / sizeof model_runs[0]);
}

ParameterizedTest(model_run *run, model, cases) {
    char prog[4096], cmd[4400];
    mc_test_sibling("model_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s %s %s", prog, run->case_name, run->args);
    cr_log_info("model_cases %s on %d ranks %s", run->case_name, run->np, run->args);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    int rc = mc_test_mpirun(run->np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect_eq(rc, 0, "model_cases %s %s on %d ranks exited %d\n%s", run->case_name, run->args,
                 run->np, rc, out);
    cr_expect(found && failed == 0 && passed > 0, "model_cases %s %s on %d ranks: %d passed, %d "
              "failed\n%s", run->case_name, run->args, run->np, passed, failed, out);
    free(out);
}
