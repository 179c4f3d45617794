/* labs/lab06.c - M006: what ModuleSpec solves, shown by plugging attention modules into one
   GPT through its layer spec and running each through an integration matrix.

   The model (mc_gpt) is the same code in every run; only the spec's self-attention module
   changes (labs/lab06_attention.h says what a module is):
     local           the library's attention (the reference, and the matrix's control row);
     builtin         an online-softmax attention that keeps the log-sum-exp, not the
                     probabilities (labs/lab06_builtin.c);
     yours           labs/lab06_attention.c, the learner's to edit;
     five broken copies of builtin, one integration mistake each (no_causal_mask,
                     global_heads, default_rng, shared_cache, renamed_param).

   The matrix, per module, on 2 ranks (a GPT of 4 layers, 4 heads of 8, S 16, B 2, 4
   micro-batches of one training step; dropout off unless the cell says otherwise):
     tp1       TP=1, the weights of the local reference copied in by module position (layer,
               tensor): the mean loss and every gradient against the local attention's run.
     tp2       TP=2 over both ranks (heads, QKV rows and the projection's columns sharded):
               loss and every rank's gradient shards against the TP=1 reference's slices.
     rng       TP=2 with attention dropout: (a) which tracker streams one forward advanced,
               against the local attention's (model-parallel-rng only); (b) hidden and
               attention dropout with full recompute of every layer: loss and gradients bit
               for bit against the same module without recompute.
     pp2       PP=2 over both ranks with the 1F1B schedule (stage 0 keeps two micro-batches
               in flight): loss and each stage's gradients against the reference.
     ckpt      TP=2: the parameter keys against the local model's; a checkpoint saved by the
               local model loaded into the module's model (old-checkpoint migration), and one
               saved by the module's model loaded into a fresh local one (round trip); the
               loaded values against the saved ones, exactly.
     fallback  TP=1 with 4 heads of 9 (a head_dim the built-in kernel refuses): whether the
               model ran the module or fell back to the local attention (and said why), how
               often the module ran, and loss and gradients against the local model's.
   Then (timing) tokens/s of one training step for local, builtin and yours side by side in
   the same run (median of 5), and the activation bytes each model holds (mc_gpt_memory).
   Every comparison's reference is computed in the same run: the local attention's TP=1 model,
   or the module's own run without recompute. The follow-up (variant from the nonce) is one
   broken copy's row of the matrix. */
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lab06_attention.h"
#include "lab_driver.h"

/* ---------------------------------------------------------------------------------------------
   sizes */

#define L06_LAYERS 4
#define L06_HIDDEN 32
#define L06_HEADS 4
#define L06_FFN 64
#define L06_VOCAB 64               /* padded vocabulary 64 at TP 1 and TP 2 */
#define L06_SEQ 16
#define L06_MBS 2
#define L06_M 4                    /* micro-batches of the training step */
#define L06_N (L06_SEQ * L06_MBS)  /* tokens per micro-batch */
#define L06_STD 0.2f               /* large enough that attention is far from uniform */
#define L06_SEED 1234
#define L06_DATA_SEED 6006ull
#define L06_DROPOUT 0.1f
#define L06_FALLBACK_HIDDEN 36     /* 4 heads of 9 */
#define L06_RTOL 1e-4              /* |x - ref| / max|ref| per tensor, and the loss */
#define L06_TIMING_REPS 7            /* timed samples per module, of L06_TIMING_STEPS steps */
#define L06_TIMING_STEPS 3

enum { L06_TP1, L06_TP2, L06_RNG, L06_PP2, L06_CKPT, L06_FALLBACK, L06_N_CELLS };
static const char *const l06_cell_name[L06_N_CELLS] = {"tp1", "tp2", "rng",
                                                       "pp2", "ckpt", "fallback"};

enum { L06_ROW_LOCAL, L06_ROW_BUILTIN, L06_ROW_YOURS, L06_ROW_BROKEN };
#define L06_N_ROWS (L06_ROW_BROKEN + LAB06_N_VARIANTS - 1)

/* the cell each broken copy is built to fail first */
static const int l06_expected_catch[LAB06_N_VARIANTS] = {
    [LAB06_NO_CAUSAL_MASK] = L06_TP1, [LAB06_GLOBAL_HEADS] = L06_TP2,
    [LAB06_DEFAULT_RNG] = L06_RNG,    [LAB06_SHARED_CACHE] = L06_PP2,
    [LAB06_RENAMED_PARAM] = L06_CKPT,
};

/* tracker streams, as bits of l06_cell.streams */
#define L06_STREAM_DEFAULT 1
#define L06_STREAM_MODEL_PARALLEL 2
#define L06_STREAM_OTHER 4

/* ---------------------------------------------------------------------------------------------
   what the matrix records */

typedef struct l06_cell {
    int pass;
    double loss_err, grad_err;     /* relative to the reference */
    char worst[MC_PARAM_NAME_MAX]; /* the tensor with the largest gradient error */
    char note[320];
} l06_cell;

typedef struct l06_row {
    const char *name, *what;
    l06_cell cell[L06_N_CELLS];
    int first_failure;             /* a cell, or -1 */
    /* rng */
    int streams, streams_recompute_identical, calls_recompute;
    /* tp1 */
    int calls_step;
    /* ckpt */
    int keys_unchanged, n_missing, n_extra;
    char missing[MC_PARAM_NAME_MAX], extra[MC_PARAM_NAME_MAX];
    int load_old_rc, round_trip_rc;
    char load_old_msg[320], round_trip_msg[320];
    /* fallback */
    int fell_back, fallback_calls, fallback_identical;
    char fallback_why[256];
    /* timing */
    double tokens_per_s;
    size_t activation_bytes;
} l06_row;

typedef struct l06_state {
    mc_comm *self_world;
    mc_parallel_state self_ps, tp2_ps, pp2_ps;
    mc_parallel_state dp2_ps;      /* TP = PP = 1 on the world's memory: the timing's */
    mc_gpt ref;                    /* the local attention at TP=1 (this rank alone) */
    float *ref_params, *ref_grads; /* host copies of its weights and of one step's grads */
    double ref_loss;
    int tokens[L06_M][L06_N], labels[L06_M][L06_N];
    l06_row rows[L06_N_ROWS];
    int param_table_identical;     /* builtin vs local at TP=1: names, shapes, order */
    int n_params;
    int local_streams;             /* what the local attention's forward advanced */
    int timing_ran;
    char ckpt_dir[512];
} l06_state;

/* ---------------------------------------------------------------------------------------------
   the module contract's helpers (labs/lab06_attention.h) */

int lab06_draw_dropout(mc_gpt *g, const char *stream, size_t n, lab06_draw *d) {
    int forked = strcmp(stream, MC_RNG_DEFAULT) != 0, rc;
    memset(d, 0, sizeof *d);
    if (!g->training || !(g->config.attention_dropout > 0.0f)) return MC_OK;
    if (forked && (rc = mc_rng_tracker_fork(&g->rng, stream)) != MC_OK) return rc;
    mc_rng *r = mc_rng_tracker_current(&g->rng);
    d->seed = r->seed;
    d->offset = r->offset;
    d->p = g->config.attention_dropout;
    r->offset += ((uint64_t)n + 3u) & ~(uint64_t)3u;
    return forked ? mc_rng_tracker_unfork(&g->rng, stream) : MC_OK;
}

mc_comm *lab06_tp(const mc_gpt *g) {
    mc_comm *c = g->ps ? mc_parallel_group(g->ps, MC_GROUP_TP) : NULL;
    return c && c->size > 1 ? c : NULL;
}

int lab06_tp_flags(const mc_gpt *g) { return g->sequence_parallel ? MC_TP_SEQUENCE_PARALLEL : 0; }

/* ---------------------------------------------------------------------------------------------
   the rows: their specs, wrapped to count the module's forward calls */

static const mc_transformer_spec *l06_row_spec(int row) {
    if (row == L06_ROW_LOCAL) return mc_transformer_spec_local();
    if (row == L06_ROW_BUILTIN) return lab06_builtin_spec(LAB06_BUILTIN);
    if (row == L06_ROW_YOURS) return lab06_yours_spec();
    return lab06_builtin_spec(row - L06_ROW_BROKEN + 1);
}

static int l06_row_variant(int row) { return row >= L06_ROW_BROKEN ? row - L06_ROW_BROKEN + 1 : 0; }

static const mc_transformer_spec *l06_inner;   /* the module the counting spec runs */
static int l06_calls;

static int l06_count_forward(const mc_layer_ctx *ctx, void *out, const void *inp) {
    l06_calls++;
    return l06_inner->attention_forward(ctx, out, inp);
}

/* The spec a run builds: the local one as it is, a module's with its forward counted (the
   wrapper is the module to the model: same fields, one more call on the way in). */
static const mc_transformer_spec *l06_spec_for(int row) {
    static mc_transformer_spec counting;
    const mc_transformer_spec *sp = l06_row_spec(row);
    if (row == L06_ROW_LOCAL) return sp;
    l06_inner = sp;
    counting = *sp;
    counting.attention_forward = l06_count_forward;
    return &counting;
}

/* ---------------------------------------------------------------------------------------------
   models and data */

static mc_gpt_config l06_config(int tp, int pp, int hidden, float dropout, int recompute) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = L06_LAYERS;
    c.hidden_size = hidden;
    c.num_attention_heads = L06_HEADS;
    c.ffn_hidden_size = L06_FFN;
    c.vocab_size = L06_VOCAB;
    c.make_vocab_size_divisible_by = 8;
    c.seq_length = L06_SEQ;
    c.max_position_embeddings = L06_SEQ;
    c.micro_batch_size = L06_MBS;
    c.init_method_std = L06_STD;
    c.hidden_dropout = dropout > 0.0f ? dropout : MC_DROPOUT_OFF;
    c.attention_dropout = dropout > 0.0f ? dropout : MC_DROPOUT_OFF;
    c.untie_embeddings_and_output_weights = 1;
    c.tensor_model_parallel_size = tp;
    c.pipeline_model_parallel_size = pp;
    if (recompute) {
        c.recompute_granularity = MC_RECOMPUTE_FULL;
        c.recompute_method = MC_RECOMPUTE_UNIFORM;
        c.recompute_num_layers = 1;   /* every layer replays its forward before its backward */
    }
    c.seed = L06_SEED;
    return c;
}

static void l06_model(mc_gpt *g, mc_parallel_state *ps, const mc_gpt_config *cfg,
                      const mc_transformer_spec *spec) {
    mc_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.config = *cfg;
    d.ps = ps;
    d.ops = mc_comm_memory(ps->world);   /* the CPU table, or the CUDA one on nccl */
    d.spec = spec;
    d.n_slots = L06_M;
    MC_CHECK(mc_gpt_init(g, &d));
}

/* Token chains a model can learn (next = 3 * prev + 1 mod V, one in eight random). */
static void l06_make_data(l06_state *st) {
    for (int m = 0; m < L06_M; m++)
        for (int n = 0; n < L06_N; n++) {
            uint32_t r = mc_rng_bits_at(L06_DATA_SEED, (uint64_t)(m * L06_N + n));
            int prev = n >= L06_MBS ? st->tokens[m][n - L06_MBS] : (int)(r % L06_VOCAB);
            st->tokens[m][n] = r % 8 == 0 ? (int)(r / 8 % L06_VOCAB) : (prev * 3 + 1) % L06_VOCAB;
        }
    for (int m = 0; m < L06_M; m++)
        for (int n = 0; n < L06_N; n++)
            st->labels[m][n] = n + L06_MBS < L06_N ? st->tokens[m][n + L06_MBS]
                                                   : (st->tokens[m][n] * 3 + 1) % L06_VOCAB;
}

/* Megatron's key of parameter p of a model built with `spec`: a layer tensor the spec renamed
   maps back to its Megatron name (weights are copied by module position, not by key). */
static void l06_canonical(const mc_transformer_spec *spec, const mc_param_info *p, char *out,
                          size_t cap) {
    snprintf(out, cap, "%s", p->name);
    if (p->layer < 0) return;
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "decoder.layers.%d.", p->layer);
    if (strncmp(p->name, prefix, (size_t)n) != 0) return;
    for (int t = 0; t < MC_GPT_LAYER_TENSORS; t++) {
        const char *mine = spec->tensor_names && spec->tensor_names[t]
                               ? spec->tensor_names[t]
                               : mc_gpt_layer_tensor_name(t);
        if (strcmp(p->name + n, mine) == 0) {
            snprintf(out, cap, "%s%s", prefix, mc_gpt_layer_tensor_name(t));
            return;
        }
    }
}

/* The local shard of p (tp_rank of tp) out of the full tensor `full` [rows, cols]. */
static void l06_slice(float *local, const float *full, const mc_param_info *p, int tp_rank) {
    int lr = p->local_shape[0], lc = p->local_shape[1], gc = p->global_shape[1];
    int r0 = p->partition_dim == 0 ? tp_rank * lr : 0;
    int c0 = p->partition_dim == 1 ? tp_rank * lc : 0;
    for (int r = 0; r < lr; r++)
        memcpy(local + (size_t)r * lc, full + (size_t)(r0 + r) * gc + c0, sizeof(float) * lc);
}

/* The reference parameter (local, TP = 1) behind parameter i of g. */
static const mc_param_info *l06_ref_of(const l06_state *st, const mc_gpt *g, int i) {
    char key[MC_PARAM_NAME_MAX];
    l06_canonical(g->spec, &g->table.info[i], key, sizeof key);
    int j = mc_param_table_find(&st->ref.table, key);
    if (j < 0) {
        fprintf(stderr, "lab06: no reference parameter %s for %s\n", key, g->table.info[i].name);
        lab_abort(1);
    }
    return &st->ref.table.info[j];
}

static float *l06_download(const mc_gpt *g, const void *src) {
    float *host = lab_xcalloc(g->table.total, sizeof(float));
    MC_CHECK(g->ops->download(g->ops, host, src, g->table.total * sizeof(float)));
    return host;
}

/* g's weights := the reference's (its shard of each, by module position). */
static void l06_load_reference(const l06_state *st, mc_gpt *g) {
    float *host = lab_xcalloc(g->table.total, sizeof(float));
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i], *r = l06_ref_of(st, g, i);
        l06_slice(host + p->offset, st->ref_params + r->offset, p, g->tp_rank);
    }
    MC_CHECK(g->ops->upload(g->ops, g->params, host, g->table.total * sizeof(float)));
    free(host);
}

/* Worst |grad - reference slice| / max |reference slice| over g's parameters (host grads). */
static double l06_grad_err(const l06_state *st, const mc_gpt *g, const float *grads,
                           char *worst, size_t cap) {
    double err = 0.0;
    worst[0] = '\0';
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i], *r = l06_ref_of(st, g, i);
        float *want = lab_xcalloc(p->numel, sizeof(float));
        l06_slice(want, st->ref_grads + r->offset, p, g->tp_rank);
        double scale = 1e-12, diff = 0.0;
        for (size_t k = 0; k < p->numel; k++) {
            double a = fabs((double)want[k]), d = fabs((double)grads[p->offset + k] - want[k]);
            if (a > scale) scale = a;
            if (d > diff || d != d) diff = d != d ? INFINITY : d;
        }
        if (diff / scale > err || (diff != diff)) {
            err = diff / scale;
            snprintf(worst, cap, "%s", p->name);
        }
        free(want);
    }
    return err;
}

/* ---------------------------------------------------------------------------------------------
   one training step's forward and backward through the library's schedule */

typedef struct l06_app {
    mc_gpt *g;
    const l06_state *st;
} l06_app;

static int l06_forward_hook(void *user, int chunk, int mb, const float *input, float **output,
                            double *loss_sum, double *num_tokens) {
    l06_app *a = (l06_app *)user;
    return mc_gpt_forward_step(a->g, chunk, mb, a->st->tokens[mb], a->st->labels[mb], input,
                               output, loss_sum, num_tokens);
}

static int l06_backward_hook(void *user, int chunk, int mb, const float *output_grad,
                             float loss_scale, float **input_grad) {
    l06_app *a = (l06_app *)user;
    return mc_gpt_backward_step(a->g, chunk, mb, output_grad, loss_scale, input_grad);
}

/* The mean loss of the step on every rank of ps (grads accumulate from zero into g->grads). */
static double l06_step(const l06_state *st, mc_gpt *g, mc_parallel_state *ps) {
    static mc_schedule_result res;
    l06_app app = {g, st};
    mc_schedule_hooks h;
    memset(&h, 0, sizeof h);
    h.app = &app;
    h.forward_step = l06_forward_hook;
    h.backward_step = l06_backward_hook;
    h.tensor_elems = g->p2p_elems;
    MC_CHECK(mc_gpt_zero_grad(g));
    MC_CHECK(mc_get_forward_backward_func(ps)(ps, &h, L06_M, 0, &res));
    double mine[2] = {0.0, 0.0}, all[2];
    if (mc_gpt_is_post_process(g, g->n_chunks - 1) && g->tp_rank == 0)
        mine[0] = res.loss_sum, mine[1] = res.num_tokens;
    MC_CHECK(lab_all_reduce_f64(ps->world, mine, all, 2, MC_SUM));
    return all[1] > 0 ? all[0] / all[1] : NAN;
}

static double l06_max_over(mc_comm *c, double v) {
    double out;
    if (v != v) v = INFINITY;
    MC_CHECK(lab_all_reduce_f64(c, &v, &out, 1, MC_MAX));
    return out;
}

/* The step of g against the reference: loss and gradient errors into the cell. */
static void l06_compare_step(const l06_state *st, mc_gpt *g, mc_parallel_state *ps,
                             l06_cell *c) {
    double loss = l06_step(st, g, ps);
    float *grads = l06_download(g, g->grads);
    char worst[MC_PARAM_NAME_MAX];
    double mine = l06_grad_err(st, g, grads, worst, sizeof worst);
    c->grad_err = l06_max_over(ps->world, mine);
    c->loss_err = fabs(loss - st->ref_loss) / fabs(st->ref_loss);
    if (c->loss_err != c->loss_err) c->loss_err = INFINITY;
    /* the worst tensor's name from the rank that saw the worst error */
    int who = mine >= c->grad_err ? ps->world->rank : 1 << 20, first;
    MC_CHECK(lab_all_reduce_i32(ps->world, &who, &first, 1, MC_MIN));
    if (first >= (1 << 20)) first = 0;
    MC_CHECK(lab_broadcast_bytes(ps->world, worst, sizeof worst, first));
    snprintf(c->worst, sizeof c->worst, "%s", c->grad_err > 0.0 ? worst : "-");
    c->pass = c->grad_err <= L06_RTOL && c->loss_err <= L06_RTOL;
    free(grads);
}

/* ---------------------------------------------------------------------------------------------
   the cells */

static void l06_cell_tp1(l06_state *st, l06_row *row, int r) {
    l06_cell *c = &row->cell[L06_TP1];
    mc_gpt_config cfg = l06_config(1, 1, L06_HIDDEN, 0.0f, 0);
    mc_gpt g;
    l06_model(&g, &st->self_ps, &cfg, l06_spec_for(r));
    l06_load_reference(st, &g);
    l06_calls = 0;
    l06_compare_step(st, &g, &st->self_ps, c);
    row->calls_step = l06_calls;
    snprintf(c->note, sizeof c->note, "loss %.2e, grads %.2e (worst %s)", c->loss_err,
             c->grad_err, c->worst);
    mc_gpt_destroy(&g);
}

static void l06_cell_tp2(l06_state *st, l06_row *row, int r) {
    l06_cell *c = &row->cell[L06_TP2];
    mc_gpt_config cfg = l06_config(2, 1, L06_HIDDEN, 0.0f, 0);
    mc_gpt g;
    l06_model(&g, &st->tp2_ps, &cfg, l06_spec_for(r));
    l06_load_reference(st, &g);
    l06_compare_step(st, &g, &st->tp2_ps, c);
    snprintf(c->note, sizeof c->note, "loss %.2e, grad shards %.2e (worst %s)", c->loss_err,
             c->grad_err, c->worst);
    mc_gpt_destroy(&g);
}

static int l06_stream_bits(const mc_rng_tracker *t, const mc_rng_states *before) {
    int bits = 0;
    if (t->s.current.offset != before->current.offset) bits |= L06_STREAM_DEFAULT;
    for (int i = 0; i < t->s.n_streams; i++)
        if (t->s.streams[i].offset != before->streams[i].offset)
            bits |= strcmp(t->s.names[i], MC_RNG_MODEL_PARALLEL) == 0 ? L06_STREAM_MODEL_PARALLEL
                                                                       : L06_STREAM_OTHER;
    return bits;
}

static void l06_streams_text(int bits, char *out, size_t cap) {
    snprintf(out, cap, "%.4s%.19s%.12s%.5s", bits == 0 ? "none" : "",
             bits & L06_STREAM_MODEL_PARALLEL ? "model-parallel-rng " : "",
             bits & L06_STREAM_DEFAULT ? "default-rng " : "",
             bits & L06_STREAM_OTHER ? "other" : "");
    size_t n = strlen(out);
    if (n > 0 && out[n - 1] == ' ') out[n - 1] = '\0';
}

static void l06_cell_rng(l06_state *st, l06_row *row, int r) {
    l06_cell *c = &row->cell[L06_RNG];
    mc_gpt g, nr, rc;
    /* (a) one forward with attention dropout only: which streams moved */
    mc_gpt_config cfg = l06_config(2, 1, L06_HIDDEN, 0.0f, 0);
    cfg.attention_dropout = L06_DROPOUT;
    l06_model(&g, &st->tp2_ps, &cfg, l06_spec_for(r));
    l06_load_reference(st, &g);
    mc_rng_states before;
    MC_CHECK(mc_rng_tracker_get_states(&g.rng, &before));
    float *out = NULL;
    MC_CHECK(mc_gpt_forward(&g, 0, 0, st->tokens[0], st->labels[0], NULL, &out, NULL));
    int mine = l06_stream_bits(&g.rng, &before), any[3], all = 0;
    int bit[3] = {mine & 1, (mine >> 1) & 1, (mine >> 2) & 1};   /* OR over the ranks */
    MC_CHECK(lab_all_reduce_i32(st->tp2_ps.world, bit, any, 3, MC_MAX));
    for (int b = 0; b < 3; b++) all |= any[b] << b;
    row->streams = all;
    mc_gpt_destroy(&g);
    if (r == L06_ROW_LOCAL) st->local_streams = all;
    /* (b) every dropout on, with and without recompute */
    mc_gpt_config plain = l06_config(2, 1, L06_HIDDEN, L06_DROPOUT, 0);
    mc_gpt_config again = l06_config(2, 1, L06_HIDDEN, L06_DROPOUT, 1);
    l06_model(&nr, &st->tp2_ps, &plain, l06_spec_for(r));
    l06_load_reference(st, &nr);
    double l0 = l06_step(st, &nr, &st->tp2_ps);
    float *g0 = l06_download(&nr, nr.grads);
    mc_gpt_destroy(&nr);
    l06_model(&rc, &st->tp2_ps, &again, l06_spec_for(r));
    l06_load_reference(st, &rc);
    l06_calls = 0;
    double l1 = l06_step(st, &rc, &st->tp2_ps);
    row->calls_recompute = l06_calls;
    float *g1 = l06_download(&rc, rc.grads);
    size_t differ = 0;
    for (size_t k = 0; k < rc.table.total; k++)
        differ += memcmp(&g0[k], &g1[k], sizeof(float)) != 0;
    int same = l0 == l1 && differ == 0, both;
    MC_CHECK(lab_all_reduce_i32(st->tp2_ps.world, &same, &both, 1, MC_MIN));
    row->streams_recompute_identical = both;
    c->loss_err = fabs(l1 - l0) / fabs(l0);
    mc_gpt_destroy(&rc);
    free(g0);
    free(g1);
    char streams[48], want[48]; /* "model-parallel-rng default-rng other" and its NUL, with room */
    l06_streams_text(row->streams, streams, sizeof streams);
    l06_streams_text(st->local_streams, want, sizeof want);
    c->pass = row->streams == st->local_streams && both;
    snprintf(c->note, sizeof c->note, "attention drew from %s (local: %s); recompute %s "
             "(loss %.9g vs %.9g, %zu of rank 0's grad elements differ)", streams, want,
             both ? "bit-identical" : "DIFFERS", l1, l0, differ);
}

static void l06_cell_pp2(l06_state *st, l06_row *row, int r) {
    l06_cell *c = &row->cell[L06_PP2];
    mc_gpt_config cfg = l06_config(1, 2, L06_HIDDEN, 0.0f, 0);
    mc_gpt g;
    l06_model(&g, &st->pp2_ps, &cfg, l06_spec_for(r));
    l06_load_reference(st, &g);
    l06_compare_step(st, &g, &st->pp2_ps, c);
    snprintf(c->note, sizeof c->note, "1F1B, loss %.2e, stage grads %.2e (worst %s)",
             c->loss_err, c->grad_err, c->worst);
    mc_gpt_destroy(&g);
}

/* rm -rf of the checkpoint directory (rank 0, after everyone is done with it) */
static int l06_unlink_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void l06_remove_dir(lab_ctx *cx, const char *dir) {
    MC_CHECK(mc_barrier(cx->world));
    if (cx->me == 0) nftw(dir, l06_unlink_one, 16, FTW_DEPTH | FTW_PHYS);
    MC_CHECK(mc_barrier(cx->world));
}

static mc_checkpoint_desc l06_ckpt_desc(mc_gpt *g, const char *dir) {
    mc_checkpoint_desc d;
    memset(&d, 0, sizeof d);
    d.dir = dir;
    d.ps = g->ps;
    d.config = &g->config;
    d.params = &g->table;
    d.param_data = (float *)g->params;
    d.ops = g->ops;
    d.iteration = 1;
    return d;
}

/* 1 when every parameter of a equals b's parameter at the same module position, exactly. */
static int l06_same_weights(const mc_gpt *a, const mc_gpt *b) {
    float *pa = l06_download(a, a->params), *pb = l06_download(b, b->params);
    int same = a->table.count == b->table.count;
    for (int i = 0; same && i < a->table.count; i++) {
        char ka[MC_PARAM_NAME_MAX], kb[MC_PARAM_NAME_MAX];
        l06_canonical(a->spec, &a->table.info[i], ka, sizeof ka);
        l06_canonical(b->spec, &b->table.info[i], kb, sizeof kb);
        const mc_param_info *x = &a->table.info[i], *y = &b->table.info[i];
        same = strcmp(ka, kb) == 0 && x->numel == y->numel &&
               memcmp(pa + x->offset, pb + y->offset, x->numel * sizeof(float)) == 0;
    }
    free(pa);
    free(pb);
    return same;
}

static int l06_all_min(mc_comm *c, int v) {
    int out;
    MC_CHECK(lab_all_reduce_i32(c, &v, &out, 1, MC_MIN));
    return out;
}

static void l06_cell_ckpt(lab_ctx *cx, l06_state *st, l06_row *row, int r) {
    l06_cell *c = &row->cell[L06_CKPT];
    mc_gpt_config cfg = l06_config(2, 1, L06_HIDDEN, 0.0f, 0);
    mc_gpt local, mod, fresh;
    char old_dir[600], rt_dir[600];
    snprintf(old_dir, sizeof old_dir, "%s/saved_by_local", st->ckpt_dir);
    snprintf(rt_dir, sizeof rt_dir, "%s/saved_by_module", st->ckpt_dir);
    l06_model(&local, &st->tp2_ps, &cfg, mc_transformer_spec_local());
    l06_model(&mod, &st->tp2_ps, &cfg, l06_spec_for(r));
    l06_load_reference(st, &local);
    l06_load_reference(st, &mod);
    /* the keys: the module's table against the local one's */
    row->n_missing = row->n_extra = 0;
    row->missing[0] = row->extra[0] = '\0';
    for (int i = 0; i < local.table.count; i++)
        if (mc_param_table_find(&mod.table, local.table.info[i].name) < 0 && row->n_missing++ == 0)
            snprintf(row->missing, sizeof row->missing, "%s", local.table.info[i].name);
    for (int i = 0; i < mod.table.count; i++)
        if (mc_param_table_find(&local.table, mod.table.info[i].name) < 0 && row->n_extra++ == 0)
            snprintf(row->extra, sizeof row->extra, "%s", mod.table.info[i].name);
    row->keys_unchanged = row->n_missing == 0 && row->n_extra == 0;
    /* an old checkpoint (saved by the local spec) into the module's model */
    mc_checkpoint_desc save_local = l06_ckpt_desc(&local, old_dir);
    MC_CHECK(mc_checkpoint_save(&save_local));
    MC_CHECK(mc_gpt_zero_grad(&mod));
    mc_checkpoint_desc load_mod = l06_ckpt_desc(&mod, old_dir);
    mc_checkpoint_result res;
    row->load_old_rc = mc_checkpoint_load(&load_mod, 0, &res);
    snprintf(row->load_old_msg, sizeof row->load_old_msg, "%s",
             row->load_old_rc == MC_OK ? "ok" : mc_last_error());
    int old_same = row->load_old_rc == MC_OK && l06_same_weights(&mod, &local);
    /* the round trip: saved by the module's model, loaded by a fresh local one */
    l06_load_reference(st, &mod);
    mc_checkpoint_desc save_mod = l06_ckpt_desc(&mod, rt_dir);
    MC_CHECK(mc_checkpoint_save(&save_mod));
    l06_model(&fresh, &st->tp2_ps, &cfg, mc_transformer_spec_local());
    mc_checkpoint_desc load_fresh = l06_ckpt_desc(&fresh, rt_dir);
    row->round_trip_rc = mc_checkpoint_load(&load_fresh, 0, &res);
    snprintf(row->round_trip_msg, sizeof row->round_trip_msg, "%s",
             row->round_trip_rc == MC_OK ? "ok" : mc_last_error());
    int rt_same = row->round_trip_rc == MC_OK && l06_same_weights(&fresh, &mod);
    old_same = l06_all_min(cx->world, old_same);
    rt_same = l06_all_min(cx->world, rt_same);
    c->pass = row->keys_unchanged && old_same && rt_same;
    snprintf(c->note, sizeof c->note, "keys %s; local checkpoint -> module: %s; module "
             "checkpoint -> local: %s",
             row->keys_unchanged ? "unchanged" : "CHANGED",
             row->load_old_rc != MC_OK ? mc_err_name(row->load_old_rc)
             : old_same             ? "ok, values equal" : "ok, VALUES DIFFER",
             row->round_trip_rc != MC_OK ? mc_err_name(row->round_trip_rc)
             : rt_same                 ? "ok, values equal" : "ok, VALUES DIFFER");
    mc_gpt_destroy(&fresh);
    mc_gpt_destroy(&mod);
    mc_gpt_destroy(&local);
    l06_remove_dir(cx, st->ckpt_dir);
}

static void l06_cell_fallback(l06_state *st, l06_row *row, int r) {
    l06_cell *c = &row->cell[L06_FALLBACK];
    mc_gpt_config cfg = l06_config(1, 1, L06_FALLBACK_HIDDEN, 0.0f, 0);
    mc_gpt local, mod;
    l06_model(&local, &st->self_ps, &cfg, mc_transformer_spec_local());
    l06_model(&mod, &st->self_ps, &cfg, l06_spec_for(r));
    row->fell_back = mod.attention_fallback;
    snprintf(row->fallback_why, sizeof row->fallback_why, "%s", mod.attention_fallback_why);
    /* the same weights, by module position */
    float *w = l06_download(&local, local.params), *into = lab_xcalloc(mod.table.total, 4);
    for (int i = 0; i < mod.table.count; i++) {
        char key[MC_PARAM_NAME_MAX];
        l06_canonical(mod.spec, &mod.table.info[i], key, sizeof key);
        int j = mc_param_table_find(&local.table, key);
        if (j >= 0)
            memcpy(into + mod.table.info[i].offset, w + local.table.info[j].offset,
                   mod.table.info[i].numel * sizeof(float));
    }
    MC_CHECK(mod.ops->upload(mod.ops, mod.params, into, mod.table.total * sizeof(float)));
    double l_local = l06_step(st, &local, &st->self_ps);
    l06_calls = 0;
    double l_mod = l06_step(st, &mod, &st->self_ps);
    row->fallback_calls = r == L06_ROW_LOCAL ? 0 : l06_calls;
    float *g_local = l06_download(&local, local.grads), *g_mod = l06_download(&mod, mod.grads);
    double scale = 1e-12, diff = 0.0;
    int identical = l_local == l_mod;
    for (int i = 0; i < mod.table.count; i++) {
        char key[MC_PARAM_NAME_MAX];
        l06_canonical(mod.spec, &mod.table.info[i], key, sizeof key);
        int j = mc_param_table_find(&local.table, key);
        const float *a = g_mod + mod.table.info[i].offset;
        const float *b = j >= 0 ? g_local + local.table.info[j].offset : NULL;
        for (size_t k = 0; b && k < mod.table.info[i].numel; k++) {
            double d = fabs((double)a[k] - b[k]);
            if (fabs((double)b[k]) > scale) scale = fabs((double)b[k]);
            if (d > diff || d != d) diff = d != d ? INFINITY : d;
            identical &= memcmp(&a[k], &b[k], sizeof(float)) == 0;
        }
        identical &= b != NULL;
    }
    row->fallback_identical = identical;
    c->grad_err = diff / scale;
    c->loss_err = fabs(l_mod - l_local) / fabs(l_local);
    /* fell back: the local attention ran, so the run is the local one bit for bit, and the
       model said why; accepted: the module must match the local attention like in tp1 */
    if (row->fell_back)
        c->pass = identical && row->fallback_calls == 0 && row->fallback_why[0] != '\0';
    else
        c->pass = c->grad_err <= L06_RTOL && c->loss_err <= L06_RTOL;
    if (row->fell_back)
        snprintf(c->note, sizeof c->note, "fell back to the local attention (\"%.200s\"); "
                 "module calls %d; %s the local model", row->fallback_why, row->fallback_calls,
                 identical ? "bit-identical to" : "DIFFERS from");
    else
        snprintf(c->note, sizeof c->note, "accepted head_dim %d; module calls %d; loss %.2e, "
                 "grads %.2e against the local model", mod.HD, row->fallback_calls, c->loss_err,
                 c->grad_err);
    free(w);
    free(into);
    free(g_local);
    free(g_mod);
    mc_gpt_destroy(&mod);
    mc_gpt_destroy(&local);
}

/* ---------------------------------------------------------------------------------------------
   experiments */

static void l06_setup(lab_ctx *cx, l06_state *st) {
    MC_CHECK(mc_comm_init_world(&st->self_world, &(mc_comm_desc){.backend = MC_BACKEND_SELF}));
    MC_CHECK(mc_parallel_init(&st->self_ps, &(mc_parallel_desc){.world = st->self_world}));
    MC_CHECK(mc_parallel_init(&st->tp2_ps,
                              &(mc_parallel_desc){.world = cx->world, .grid = {.tp = 2}}));
    MC_CHECK(mc_parallel_init(&st->pp2_ps,
                              &(mc_parallel_desc){.world = cx->world, .grid = {.pp = 2}}));
    MC_CHECK(mc_parallel_init(&st->dp2_ps, &(mc_parallel_desc){.world = cx->world}));
    l06_make_data(st);
    /* the reference: the local attention at TP = 1 on this rank alone */
    mc_gpt_config cfg = l06_config(1, 1, L06_HIDDEN, 0.0f, 0);
    l06_model(&st->ref, &st->self_ps, &cfg, mc_transformer_spec_local());
    st->ref_params = l06_download(&st->ref, st->ref.params);
    st->ref_loss = l06_step(st, &st->ref, &st->self_ps);
    st->ref_grads = l06_download(&st->ref, st->ref.grads);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", cx->args->results_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    snprintf(st->ckpt_dir, sizeof st->ckpt_dir, "%.480s/lab06.ckpt", dir);
    for (int r = 0; r < L06_N_ROWS; r++) {
        st->rows[r].name = r == L06_ROW_LOCAL ? "local" : l06_row_spec(r)->name;
        st->rows[r].what = r == L06_ROW_LOCAL     ? "the library's attention (the reference)"
                           : r == L06_ROW_BUILTIN ? "the built-in online-softmax attention "
                                                    "(labs/lab06_builtin.c)"
                           : r == L06_ROW_YOURS   ? "labs/lab06_attention.c (yours to edit)"
                                                  : lab06_variant_mistake(l06_row_variant(r));
        st->rows[r].first_failure = -1;
    }
}

static int l06_exp_spec(lab_ctx *cx) {
    l06_state *st = cx->state;
    l06_setup(cx, st);
    lab_heading(cx, "A. One model, three attention modules through the layer spec");
    mc_gpt_config cfg = l06_config(1, 1, L06_HIDDEN, 0.0f, 0);
    mc_gpt b;
    l06_model(&b, &st->self_ps, &cfg, lab06_builtin_spec(LAB06_BUILTIN));
    const mc_param_table *tl = &st->ref.table, *tb = &b.table;
    int same = tl->count == tb->count && tl->total == tb->total;
    for (int i = 0; same && i < tl->count; i++)
        same = strcmp(tl->info[i].name, tb->info[i].name) == 0 &&
               tl->info[i].numel == tb->info[i].numel && tl->info[i].offset == tb->info[i].offset;
    st->param_table_identical = same;
    st->n_params = tl->count;
    mc_gpt_destroy(&b);
    /* what each module's model keeps for backward: mc_gpt_memory's activation arenas */
    for (int r = 0; r <= L06_ROW_YOURS; r++) {
        mc_gpt m;
        l06_model(&m, &st->self_ps, &cfg, l06_row_spec(r));
        mc_gpt_memory(&m, &st->rows[r].activation_bytes);
        mc_gpt_destroy(&m);
    }
    size_t act_local = st->rows[L06_ROW_LOCAL].activation_bytes;
    lab_printf0("GPT: %d layers, hidden %d, %d heads of %d, ffn %d, vocab %d, seq %d, %d "
                "samples per micro-batch, %d micro-batches per step; %d parameter tensors\n",
                L06_LAYERS, L06_HIDDEN, L06_HEADS, L06_HIDDEN / L06_HEADS, L06_FFN, L06_VOCAB,
                L06_SEQ, L06_MBS, L06_M, st->n_params);
    for (int r = 0; r <= L06_ROW_YOURS; r++) {
        const mc_transformer_spec *sp = l06_row_spec(r);
        lab_printf0("  spec %-8s attention %s; norms and MLP: the local ones; %s\n",
                    r == L06_ROW_LOCAL ? "local" : sp->name, st->rows[r].what,
                    sp->attention_accepts ? "refuses some shapes (attention_accepts)"
                                          : "accepts every shape");
    }
    lab_printf0("builtin's parameter table against local's (names, shapes, offsets): %s\n",
                same ? "identical" : "DIFFERENT");
    lab_printf0("activation bytes of the model (TP=1, %d micro-batch slots): local %zu, "
                "builtin %zu, yours %zu\n", L06_M, act_local,
                st->rows[L06_ROW_BUILTIN].activation_bytes,
                st->rows[L06_ROW_YOURS].activation_bytes);
    lab_check(cx, st->rows[L06_ROW_BUILTIN].activation_bytes < act_local,
              "the built-in module's model keeps fewer activation bytes than the local one (the "
              "row log-sum-exp [B, NHl, S] instead of the probabilities [B, NHl, S, S])");
    lab_check(cx, same, "the built-in module's model registers the same parameters as the "
              "local one (the spec swaps the module, not the model's parameters)");
    lab_printf0("reference: the local attention at TP=1, mean loss of the step %.6f\n",
                st->ref_loss);
    lab_printf0("\ncompared with: the local spec's parameter table and activation bytes\n");
    return LAB_RAN;
}

static void l06_print_matrix(const l06_state *st) {
    lab_printf0("\n%-15s", "module");
    for (int k = 0; k < L06_N_CELLS; k++) lab_printf0(" %-8s", l06_cell_name[k]);
    lab_printf0(" first failure\n");
    for (int r = 0; r < L06_N_ROWS; r++) {
        const l06_row *row = &st->rows[r];
        lab_printf0("%-15s", row->name);
        for (int k = 0; k < L06_N_CELLS; k++)
            lab_printf0(" %-8s", row->cell[k].pass ? "pass" : "FAIL");
        lab_printf0(" %s\n", row->first_failure < 0 ? "-" : l06_cell_name[row->first_failure]);
    }
}

static int l06_exp_matrix(lab_ctx *cx) {
    l06_state *st = cx->state;
    lab_heading(cx, "B. The integration matrix (TP=2 and PP=2 over the 2 ranks)");
    for (int r = 0; r < L06_N_ROWS; r++) {
        l06_row *row = &st->rows[r];
        l06_cell_tp1(st, row, r);
        l06_cell_tp2(st, row, r);
        l06_cell_rng(st, row, r);
        l06_cell_pp2(st, row, r);
        l06_cell_ckpt(cx, st, row, r);
        l06_cell_fallback(st, row, r);
        for (int k = 0; k < L06_N_CELLS && row->first_failure < 0; k++)
            if (!row->cell[k].pass) row->first_failure = k;
        lab_printf0("\n%s: %s\n", row->name, row->what);
        for (int k = 0; k < L06_N_CELLS; k++)
            lab_printf0("  %-8s %s  %s\n", l06_cell_name[k], row->cell[k].pass ? "pass" : "FAIL",
                        row->cell[k].note);
    }
    l06_print_matrix(st);
    const l06_row *loc = &st->rows[L06_ROW_LOCAL], *bi = &st->rows[L06_ROW_BUILTIN];
    lab_check(cx, loc->first_failure < 0, "the local attention passes every cell (the matrix "
              "holds for the reference itself)");
    lab_check(cx, st->local_streams == L06_STREAM_MODEL_PARALLEL,
              "the local attention draws its dropout from model-parallel-rng only");
    lab_check(cx, bi->first_failure < 0, "the built-in module passes every cell");
    lab_check(cx, bi->fell_back && bi->fallback_calls == 0 && bi->fallback_identical,
              "on head_dim 9 the built-in module is refused, the model runs the local "
              "attention (module calls %d) and equals the local model bit for bit",
              bi->fallback_calls);
    lab_check(cx, bi->calls_step == L06_LAYERS * L06_M, "the model called the module once per "
              "layer and micro-batch: %d = %d x %d", bi->calls_step, L06_LAYERS, L06_M);
    lab_check(cx, bi->calls_recompute == 2 * L06_LAYERS * L06_M, "under full recompute every "
              "layer's forward ran twice: %d = 2 x %d x %d", bi->calls_recompute, L06_LAYERS,
              L06_M);
    for (int v = 1; v < LAB06_N_VARIANTS; v++) {
        const l06_row *row = &st->rows[L06_ROW_BROKEN + v - 1];
        int want = l06_expected_catch[v];
        lab_check(cx, row->first_failure == want, "%s is caught first by %s (its mistake: %s); "
                  "measured %s", row->name, l06_cell_name[want], row->what,
                  row->first_failure < 0 ? "no failing cell" : l06_cell_name[row->first_failure]);
    }
    const l06_row *yo = &st->rows[L06_ROW_YOURS];
    lab_printf0("\nyours (labs/lab06_attention.c): %s\n",
                yo->first_failure < 0 ? "passes every cell"
                                      : "fails a cell: see its row above");
    lab_printf0("\ncompared with: the local attention's TP=1 run of the same weights and data "
                "(tp1, tp2, pp2), the local attention's streams and the module's own run "
                "without recompute (rng), the saved values (ckpt), the local model on the "
                "refused shape (fallback)\n");
    return LAB_RAN;
}

static int l06_exp_timing(lab_ctx *cx) {
    l06_state *st = cx->state;
    if (cx->args->timing == 0) return LAB_SKIPPED;
    lab_heading(cx, "C. tokens/s side by side (TP=1 on every rank)");
    const int rows[3] = {L06_ROW_LOCAL, L06_ROW_BUILTIN, L06_ROW_YOURS};
    mc_gpt g[3];
    double t[3][L06_TIMING_REPS];
    mc_gpt_config cfg = l06_config(1, 1, L06_HIDDEN, 0.0f, 0);
    for (int i = 0; i < 3; i++) {
        l06_model(&g[i], &st->dp2_ps, &cfg, l06_spec_for(rows[i]));
        l06_load_reference(st, &g[i]);
        l06_step(st, &g[i], &st->dp2_ps);   /* warm-up */
    }
    for (int k = 0; k < L06_TIMING_REPS; k++)   /* interleaved, so drift hits all three */
        for (int i = 0; i < 3; i++) {
            if (rows[i] != L06_ROW_LOCAL) l06_spec_for(rows[i]);
            MC_CHECK(g[i].ops->synchronize(g[i].ops));
            double t0 = lab_now();
            for (int n = 0; n < L06_TIMING_STEPS; n++) l06_step(st, &g[i], &st->dp2_ps);
            MC_CHECK(g[i].ops->synchronize(g[i].ops));
            t[i][k] = lab_now() - t0;
        }
    for (int i = 0; i < 3; i++) {
        double med = lab_median(t[i], L06_TIMING_REPS);
        st->rows[rows[i]].tokens_per_s = (double)L06_TIMING_STEPS * L06_M * L06_N / med;
        mc_gpt_destroy(&g[i]);
    }
    double base = st->rows[L06_ROW_LOCAL].tokens_per_s;
    lab_printf0("%-8s %12s %14s\n", "module", "tokens/s", "ratio to local");
    for (int i = 0; i < 3; i++) {
        const l06_row *row = &st->rows[rows[i]];
        lab_printf0("%-8s %12.0f %14.2f\n", row->name, row->tokens_per_s,
                    row->tokens_per_s / base);
    }
    lab_printf0("(median of %d samples of %d steps of %d tokens on rank 0, the world's op "
                "table; the modules' attention core runs on the host)\n", L06_TIMING_REPS,
                L06_TIMING_STEPS, L06_M * L06_N);
    st->timing_ran = 1;
    lab_printf0("\ncompared with: the local attention in the same run\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   facts */

static cJSON *l06_row_json(const l06_state *st, const l06_row *row) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mistake", row->what);
    cJSON *cells = cJSON_AddObjectToObject(o, "cells");
    for (int k = 0; k < L06_N_CELLS; k++)
        cJSON_AddStringToObject(cells, l06_cell_name[k], row->cell[k].pass ? "pass" : "fail");
    cJSON_AddStringToObject(o, "first_failure",
                            row->first_failure < 0 ? "none" : l06_cell_name[row->first_failure]);
    cJSON *det = cJSON_AddObjectToObject(o, "detail");
    for (int k = 0; k < L06_N_CELLS; k++) {
        cJSON *c = cJSON_AddObjectToObject(det, l06_cell_name[k]);
        cJSON_AddNumberToObject(c, "loss_rel_err", isfinite(row->cell[k].loss_err)
                                                       ? row->cell[k].loss_err : 1e300);
        cJSON_AddNumberToObject(c, "grad_rel_err", isfinite(row->cell[k].grad_err)
                                                       ? row->cell[k].grad_err : 1e300);
        if (row->cell[k].worst[0]) cJSON_AddStringToObject(c, "worst_tensor", row->cell[k].worst);
        cJSON_AddStringToObject(c, "note", row->cell[k].note);
    }
    char streams[64];
    l06_streams_text(row->streams, streams, sizeof streams);
    cJSON_AddStringToObject(o, "dropout_streams", streams);
    cJSON_AddBoolToObject(o, "recompute_bit_identical", row->streams_recompute_identical);
    cJSON_AddBoolToObject(o, "keys_unchanged", row->keys_unchanged);
    cJSON_AddNumberToObject(o, "keys_missing", row->n_missing);
    if (row->missing[0]) cJSON_AddStringToObject(o, "first_missing_key", row->missing);
    if (row->extra[0]) cJSON_AddStringToObject(o, "first_new_key", row->extra);
    cJSON_AddStringToObject(o, "load_local_checkpoint", row->load_old_rc == MC_OK ? "ok" : "error");
    cJSON_AddStringToObject(o, "load_local_checkpoint_message", row->load_old_msg);
    cJSON_AddStringToObject(o, "round_trip", row->round_trip_rc == MC_OK ? "ok" : "error");
    cJSON_AddStringToObject(o, "fallback_runs", row->fell_back ? "local" : "module");
    if (row->fell_back) cJSON_AddStringToObject(o, "fallback_reason", row->fallback_why);
    cJSON_AddNumberToObject(o, "fallback_module_calls", row->fallback_calls);
    cJSON_AddBoolToObject(o, "fallback_identical", row->fallback_identical);
    (void)st;
    return o;
}

static cJSON *l06_facts(lab_ctx *cx) {
    l06_state *st = cx->state;
    cJSON *f = cJSON_CreateObject();
    cJSON *m = cJSON_AddObjectToObject(f, "model");
    cJSON_AddNumberToObject(m, "layers", L06_LAYERS);
    cJSON_AddNumberToObject(m, "hidden", L06_HIDDEN);
    cJSON_AddNumberToObject(m, "heads", L06_HEADS);
    cJSON_AddNumberToObject(m, "head_dim", L06_HIDDEN / L06_HEADS);
    cJSON_AddNumberToObject(m, "seq_length", L06_SEQ);
    cJSON_AddNumberToObject(m, "micro_batch_size", L06_MBS);
    cJSON_AddNumberToObject(m, "microbatches", L06_M);
    cJSON_AddNumberToObject(m, "fallback_head_dim", L06_FALLBACK_HIDDEN / L06_HEADS);
    cJSON_AddNumberToObject(m, "tolerance", L06_RTOL);
    cJSON_AddNumberToObject(m, "reference_loss", round(st->ref_loss * 1e6) / 1e6);

    const l06_row *bi = &st->rows[L06_ROW_BUILTIN];
    cJSON *sp = cJSON_AddObjectToObject(f, "spec");
    cJSON_AddBoolToObject(sp, "param_table_identical", st->param_table_identical);
    cJSON_AddNumberToObject(sp, "parameter_tensors", st->n_params);
    cJSON_AddNumberToObject(sp, "attention_calls_per_step", bi->calls_step);
    cJSON_AddNumberToObject(sp, "attention_calls_with_recompute", bi->calls_recompute);
    cJSON_AddStringToObject(sp, "fallback_runs", bi->fell_back ? "local" : "module");
    cJSON_AddStringToObject(sp, "fallback_reason", bi->fallback_why);
    cJSON_AddBoolToObject(sp, "fallback_identical", bi->fallback_identical);
    cJSON_AddNumberToObject(sp, "fallback_module_calls", bi->fallback_calls);
    size_t act = st->rows[L06_ROW_LOCAL].activation_bytes, b = bi->activation_bytes;
    cJSON *bytes = cJSON_AddObjectToObject(sp, "activation_bytes");
    for (int r = 0; r <= L06_ROW_YOURS; r++)
        cJSON_AddNumberToObject(bytes, st->rows[r].name, (double)st->rows[r].activation_bytes);
    cJSON_AddStringToObject(sp, "builtin_cache_vs_local",
                            b < act ? "smaller" : b == act ? "same" : "larger");

    cJSON_AddItemToObject(f, "cells", cJSON_CreateStringArray(l06_cell_name, L06_N_CELLS));
    cJSON *rows = cJSON_AddObjectToObject(f, "rows");
    for (int r = 0; r < L06_N_ROWS; r++)
        cJSON_AddItemToObject(rows, st->rows[r].name, l06_row_json(st, &st->rows[r]));
    cJSON *catches = cJSON_AddObjectToObject(f, "catches");
    cJSON *keys = cJSON_AddObjectToObject(f, "keys_unchanged");
    for (int r = 0; r < L06_N_ROWS; r++) {
        const l06_row *row = &st->rows[r];
        if (r >= L06_ROW_BROKEN)
            cJSON_AddStringToObject(catches, row->name, row->first_failure < 0
                                                            ? "none"
                                                            : l06_cell_name[row->first_failure]);
        cJSON_AddBoolToObject(keys, row->name, row->keys_unchanged);
    }
    const l06_row *ren = &st->rows[L06_ROW_BROKEN + LAB06_RENAMED_PARAM - 1];
    cJSON_AddStringToObject(f, "renamed_load", ren->load_old_rc == MC_OK ? "ok" : "error");
    cJSON_AddStringToObject(f, "renamed_load_message", ren->load_old_msg);

    if (st->timing_ran) {
        cJSON *perf = cJSON_AddObjectToObject(f, "perf");
        double base = st->rows[L06_ROW_LOCAL].tokens_per_s;
        const int rs[3] = {L06_ROW_LOCAL, L06_ROW_BUILTIN, L06_ROW_YOURS};
        cJSON *tps = cJSON_AddObjectToObject(perf, "tokens_per_s");
        cJSON *ratio = cJSON_AddObjectToObject(perf, "ratio_to_local");
        for (int i = 0; i < 3; i++) {
            const l06_row *row = &st->rows[rs[i]];
            cJSON_AddNumberToObject(tps, row->name, round(row->tokens_per_s));
            cJSON_AddNumberToObject(ratio, row->name, round(row->tokens_per_s / base * 100) / 100);
        }
        cJSON_AddNumberToObject(perf, "samples", L06_TIMING_REPS);
        cJSON_AddNumberToObject(perf, "steps_per_sample", L06_TIMING_STEPS);
    }

    /* the follow-up: one broken copy's row */
    int v = cx->variant, row_i = L06_ROW_BROKEN + v - 1;
    const l06_row *row = &st->rows[row_i];
    cJSON *fu = cJSON_AddObjectToObject(f, "followup");
    cJSON_AddStringToObject(fu, "variant", cx->variant_name);
    cJSON_AddStringToObject(fu, "module", row->name);
    cJSON_AddStringToObject(fu, "mistake", row->what);
    for (int k = 0; k < L06_N_CELLS; k++)
        cJSON_AddStringToObject(fu, l06_cell_name[k], row->cell[k].pass ? "pass" : "fail");
    cJSON_AddStringToObject(fu, "first_failure",
                            row->first_failure < 0 ? "none" : l06_cell_name[row->first_failure]);
    return f;
}

static void l06_cleanup(lab_ctx *cx) {
    l06_state *st = cx->state;
    if (st->ref.impl) mc_gpt_destroy(&st->ref);
    free(st->ref_params);
    free(st->ref_grads);
    if (st->dp2_ps.initialized) mc_parallel_destroy(&st->dp2_ps);
    if (st->pp2_ps.initialized) mc_parallel_destroy(&st->pp2_ps);
    if (st->tp2_ps.initialized) mc_parallel_destroy(&st->tp2_ps);
    if (st->self_ps.initialized) mc_parallel_destroy(&st->self_ps);
    if (st->self_world) mc_comm_destroy(st->self_world);
}

static const lab_experiment l06_experiments[] = {
    {"A", l06_exp_spec}, {"B", l06_exp_matrix}, {"timing", l06_exp_timing}};

static const lab_spec lab06_spec = {
    .name = "lab06",
    .question = "M006",
    .title = "ModuleSpec: what problem it solves",
    .summary = "Plugs attention modules into one GPT through its layer spec (the library's, a "
               "built-in online-softmax one, yours in labs/lab06_attention.c, and five broken "
               "copies) and runs each through the integration matrix on 2 ranks: TP=1 against "
               "the local attention, TP=2 heads and grads, dropout RNG under recompute, PP=2, "
               "checkpoint keys and round trip, fallback on a refused shape; then tokens/s "
               "and activation memory side by side.",
    .default_world = 2,
    .sizes = {.tp = 2},
    .min_world = 2,
    .max_world = 2,
    .call_timeout_s = 30.0,
    .n_variants = LAB06_N_VARIANTS - 1,
    .experiments = l06_experiments,
    .n_experiments = 3,
    .state_size = sizeof(l06_state),
    .facts = l06_facts,
    .cleanup = l06_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab06_spec); }
