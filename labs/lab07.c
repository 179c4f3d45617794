/* labs/lab07.c - M007: pre_process, post_process and parallel_output of GPTModel, measured.

       make lab07 && mpirun --oversubscribe -np 8 ./lab07      (as root add --allow-run-as-root)

   One small tied-embedding GPT (2 layers per stage) on PP = 4 x TP = 2 (DP = world / 8). Each
   rank builds only its stage: mc_gpt sets pre_process (embedding) on the first pipeline stage
   and post_process (final norm, output layer, loss) on the last one, from the same predicates
   as Megatron's is_pipeline_first_stage / is_pipeline_last_stage. The experiments, in order
   (every rank takes part; rank 0 prints; the driver, lab_driver.h, does the answer sheet, the
   results and the grading):

     A  stage-local modules: every rank's parameter table (its modules, layers and element
        count), the flags, the embedding-group membership and the memory the model holds.
        Compared with: the count each stage must have from the config alone (a formula), the
        module rule (embedding on the first stage, final norm and output layer on the last,
        layers 2s and 2s+1 on stage s), the single-rank model (the sum of the stages' unsharded
        parameters, the last stage's tied copy left out, equals its count) and the rank grid's
        embedding groups.
     B  data flow: one training iteration through the 1F1B schedule. Per stage: which of
        tokens and labels the data loader handed in (only the first stage needs tokens and only
        the last one labels, as Megatron's get_batch), what forward_step received and returned,
        and the bytes the stage sent and received over its pipeline group (counted on the PP
        communicator). Compared with: M x Ns x H x 4 bytes per direction and stage boundary.
     C  parallel_output on the last stage: the logits one rank holds and the bytes that move
        for them, with the output left split over the vocabulary (Megatron's default for
        training) and gathered over TP (parallel_output = False; here mc_gpt_desc.gather_logits
        = 1), counted on the TP communicator. Compared with: N x V/TP x 4 and N x V x 4 bytes
        held, (TP - 1) x N x V/TP x 4 bytes moved by the gather and 3 x N x 4 by the loss; the
        gathered logits against the shards; the loss from the full logits (plain cross entropy
        in double on the host) against the vocab-parallel loss; what a sampler would draw if it
        took a shard's argmax as a token id; and label smoothing: the library's vocab-parallel
        loss against the unsharded formula, and Megatron's local-shard formula across TP ranks.
     D  tied embeddings across the first and last stage: K steps of AdamW (the distributed
        optimizer, so with DP > 1 the DP reduce-scatter runs before the embedding-group
        all-reduce, as in Megatron), once as the library does it and once with the
        embedding-group all-reduce of the gradients skipped
        (mc_fault_finalize_skip_embedding_sync, compiled into this lab only). After every step
        max |W_first - W_last| between the first stage's word embedding and the last stage's
        output-layer copy. Compared with: 0 for the synchronised run, and the single-rank run of
        the same data on world rank 0 (one tensor, no copy): its losses and final embedding.
     E  the "all flags on" mistake: every stage builds its layers with pre_process and
        post_process on (embedding, final norm, output layer and loss on every stage). Per
        stage: parameters, memory and the time of one micro-batch's forward and backward (one
        stage at a time, the others asleep; the fastest of several) against the correct stage;
        what the P2P interface gets (what forward_step returns to send, whether the received
        activation changes anything, what backward returns to send back); the schedule's
        answer on the first stage. Compared with: the formula for a stage with both flags, and
        the correct stage models of A and B.
     F  follow-up (variant from the nonce): another layout of the same ranks (TP x PP, tied or
        untied); the probe rank's flags, input, parameters and the mistake's extra parameters
        there, and every stage's parameters. Compared with: the same formulas.

   The model: hidden 64, 4 heads, FFN 256, vocabulary 1024 (pads to 1024 at TP 1, 2 and 4),
   32 positions, micro-batch 2, M = 4 micro-batches per step, dropout off. */
#include "lab_driver.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L07_HIDDEN 64
#define L07_HEADS 4
#define L07_FFN 256
#define L07_VOCAB 1024
#define L07_VOCAB_DIV 128
#define L07_SEQ 32
#define L07_MBS 2
#define L07_N (L07_SEQ * L07_MBS)      /* tokens per micro-batch */
#define L07_LAYERS_PER_STAGE 2
#define L07_M 4                        /* micro-batches per step and DP rank */
#define L07_STEPS 5                    /* K of Experiment D (--steps) */
#define L07_MAX_STEPS 16
#define L07_LR 1e-3f
#define L07_SEED 1234
#define L07_DATA_SEED 707070u
#define L07_MAX_PP 16
#define L07_MAX_WORLD 16
#define L07_TIME_REPS 7                /* forward+backward timings per stage (fastest) */
#define L07_SMOOTHING 0.1f             /* label smoothing of Experiment C */
#define L07_LOSS_RTOL 1e-5             /* losses against the single-rank run, relative */
/* Final embedding against the single-rank run, absolute: both runs add the same gradients in
   another order and Adam turns the rounding of a near-zero gradient into a step of up to lr,
   so the bound grows with the steps. */
#define L07_WEIGHT_ATOL_PER_STEP 5e-5
#define L07_N_VARIANTS 3

/* ---------------------------------------------------------------------------------------------
   model and data */

static mc_gpt_config l07_config(int tp, int pp, int untied) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = L07_LAYERS_PER_STAGE * pp;
    c.hidden_size = L07_HIDDEN;
    c.num_attention_heads = L07_HEADS;
    c.ffn_hidden_size = L07_FFN;
    c.vocab_size = L07_VOCAB;
    c.make_vocab_size_divisible_by = L07_VOCAB_DIV;
    c.seq_length = L07_SEQ;
    c.max_position_embeddings = L07_SEQ;
    c.hidden_dropout = MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    c.untie_embeddings_and_output_weights = untied;
    c.tensor_model_parallel_size = tp;
    c.pipeline_model_parallel_size = pp;
    c.micro_batch_size = L07_MBS;
    c.seed = L07_SEED;
    return c;
}

/* Parameters one rank of a stage holds, from the config alone (the independent side of every
   count): per layer two LayerNorms (weight and bias), QKV and fc1 split on their output rows,
   proj and fc2 on their input columns (biases whole); the first stage adds the word embedding
   (split over the vocabulary) and the position embedding; the last the final LayerNorm and
   the output layer, unless a stage with both flags reads the word embedding itself (tied). */
static long long l07_formula_params(int tp, int layers, int pre, int post, int untied) {
    long long H = L07_HIDDEN, F = L07_FFN, Q = L07_HIDDEN, P = L07_SEQ;
    long long Vp = mc_gpt_padded_vocab_size(L07_VOCAB, L07_VOCAB_DIV, tp);
    long long layer = 2 * H + (3 * Q / tp) * H + 3 * Q / tp + H * (Q / tp) + H + 2 * H +
                      (F / tp) * H + F / tp + H * (F / tp) + H;
    long long n = layers * layer;
    if (pre) n += (Vp / tp) * H + P * H;
    if (post) n += 2 * H + ((untied || !pre) ? (Vp / tp) * H : 0);
    return n;
}

/* Sample k of the data set: S + 1 tokens, a chain next = 7 prev + 3 (mod V) with one token in
   four drawn at random, from (seed, k) alone: every layout reads the same sample for the same
   k. */
static void l07_sample(long long k, int *text /* [S + 1] */) {
    uint64_t at = (uint64_t)k * (uint64_t)(2 * (L07_SEQ + 1));
    text[0] = (int)(mc_rng_bits_at(L07_DATA_SEED, at) % L07_VOCAB);
    for (int t = 1; t <= L07_SEQ; t++) {
        uint32_t r = mc_rng_bits_at(L07_DATA_SEED, at + (uint64_t)t);
        text[t] = r % 4 == 0 ? (int)((r >> 2) % L07_VOCAB) : (text[t - 1] * 7 + 3) % L07_VOCAB;
    }
}

/* A deterministic activation [n] in [-1, 1) (the synthetic input of a middle stage). */
static void l07_fill_host(float *x, size_t n, uint64_t stream) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(mc_rng_uniform_at(L07_DATA_SEED + stream, i) * 2.0 - 1.0);
}

/* ---------------------------------------------------------------------------------------------
   traffic taps: a communicator's op table swapped for one that counts bytes and calls, then
   calls the real one (the library never looks at the table's identity) */

typedef struct l07_traffic {
    long long all_reduce_calls, all_reduce_bytes;   /* bytes: the buffer each rank reduces */
    long long all_gather_calls, all_gather_bytes;   /* bytes: received from the other ranks */
    long long fwd_sent, fwd_recv, bwd_sent, bwd_recv;   /* P2P bytes by schedule tag */
    long long p2p_other;                            /* P2P bytes on other tags */
} l07_traffic;

typedef struct l07_tap {
    mc_comm *comm;
    const mc_comm_ops *real;
    mc_comm_ops ops;
    l07_traffic t;
} l07_tap;

#define L07_TAPS 2
static l07_tap l07_taps[L07_TAPS];

static l07_tap *l07_tap_of(mc_comm *c) {
    for (int i = 0; i < L07_TAPS; i++)
        if (l07_taps[i].comm == c) return &l07_taps[i];
    return NULL;   /* not reached: only tapped communicators call these */
}

static int l07_count_all_reduce(mc_comm *c, const void *send, void *recv, size_t count,
                                mc_dtype dt, mc_reduce_op op, mc_request **req) {
    l07_tap *t = l07_tap_of(c);
    t->t.all_reduce_calls++;
    t->t.all_reduce_bytes += (long long)mc_dtype_bytes(dt, count);
    return t->real->all_reduce(c, send, recv, count, dt, op, req);
}

static int l07_count_all_gather(mc_comm *c, const void *send, void *recv, size_t count,
                                mc_dtype dt, mc_request **req) {
    l07_tap *t = l07_tap_of(c);
    t->t.all_gather_calls++;
    t->t.all_gather_bytes += (long long)mc_dtype_bytes(dt, count) * (c->size - 1);
    return t->real->all_gather(c, send, recv, count, dt, req);
}

static void l07_count_p2p(l07_tap *t, int is_send, int tag, long long bytes) {
    if (tag == MC_SCHEDULE_TAG_FORWARD) *(is_send ? &t->t.fwd_sent : &t->t.fwd_recv) += bytes;
    else if (tag == MC_SCHEDULE_TAG_BACKWARD) *(is_send ? &t->t.bwd_sent : &t->t.bwd_recv) += bytes;
    else t->t.p2p_other += bytes;
}

static int l07_count_batch(mc_comm *c, const mc_p2p_op *ops, int n_ops, mc_request **req) {
    l07_tap *t = l07_tap_of(c);
    for (int i = 0; i < n_ops; i++)
        l07_count_p2p(t, ops[i].is_send, ops[i].tag,
                      (long long)mc_dtype_bytes(ops[i].dtype, ops[i].count));
    return t->real->batch_send_recv(c, ops, n_ops, req);
}

static int l07_count_send(mc_comm *c, const void *buf, size_t count, mc_dtype dt, int peer,
                          int tag, mc_request **req) {
    l07_tap *t = l07_tap_of(c);
    l07_count_p2p(t, 1, tag, (long long)mc_dtype_bytes(dt, count));
    return t->real->send(c, buf, count, dt, peer, tag, req);
}

static int l07_count_recv(mc_comm *c, void *buf, size_t count, mc_dtype dt, int peer, int tag,
                          mc_request **req) {
    l07_tap *t = l07_tap_of(c);
    l07_count_p2p(t, 0, tag, (long long)mc_dtype_bytes(dt, count));
    return t->real->recv(c, buf, count, dt, peer, tag, req);
}

/* Starts counting on c (NULL: nothing); slot 0 or 1. */
static void l07_tap_on(int slot, mc_comm *c) {
    l07_tap *t = &l07_taps[slot];
    memset(t, 0, sizeof *t);
    if (c == NULL) return;
    t->comm = c;
    t->real = c->ops;
    t->ops = *c->ops;
    t->ops.all_reduce = l07_count_all_reduce;
    t->ops.all_gather = l07_count_all_gather;
    t->ops.batch_send_recv = l07_count_batch;
    t->ops.send = l07_count_send;
    t->ops.recv = l07_count_recv;
    c->ops = &t->ops;
}

/* Stops counting; returns what was counted. */
static l07_traffic l07_tap_off(int slot) {
    l07_tap *t = &l07_taps[slot];
    l07_traffic got = t->t;
    if (t->comm != NULL) t->comm->ops = t->real;
    t->comm = NULL;
    return got;
}

/* ---------------------------------------------------------------------------------------------
   one model on a parallel state, with DDP, AdamW and the schedule hooks */

typedef struct l07_run {
    mc_parallel_state *ps;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int have_gpt, have_ddp, have_opt;
    mc_gpt *model;                 /* what the hooks run: &gpt, or the mistaken model of E */
    int m;                         /* micro-batches per step */
    int dp, dp_rank;
    long long step;                /* the step whose samples the loader hands out */
    int tokens[L07_N], labels[L07_N], text[L07_SEQ + 1];
    /* what the hooks saw in the current schedule run (this rank) */
    int fwd, fwd_with_input, fwd_with_output, fwd_tokens, fwd_labels, bwd, bwd_with_grad;
} l07_run;

/* Megatron's get_batch: only a stage that embeds needs tokens and only one that computes the
   loss needs labels; micro-batch mb of DP rank d takes samples ((step M + mb) DP + d) B + j. */
static void l07_load(l07_run *r, int mb, int need_tokens, int need_labels) {
    for (int j = 0; j < L07_MBS; j++) {
        long long k = ((r->step * r->m + mb) * r->dp + r->dp_rank) * L07_MBS + j;
        l07_sample(k, r->text);
        for (int s = 0; s < L07_SEQ; s++) {
            r->tokens[s * L07_MBS + j] = r->text[s];
            r->labels[s * L07_MBS + j] = r->text[s + 1];
        }
    }
    r->fwd_tokens += need_tokens;
    r->fwd_labels += need_labels;
}

static int l07_hook_forward(void *app, int chunk, int mb, const float *input, float **output,
                            double *loss_sum, double *num_tokens) {
    l07_run *r = (l07_run *)app;
    int pre = mc_gpt_is_pre_process(r->model, chunk);
    int post = mc_gpt_is_post_process(r->model, chunk);
    if (pre || post) l07_load(r, mb, pre, post);
    r->fwd++;
    r->fwd_with_input += input != NULL;
    int rc = mc_gpt_forward_step(r->model, chunk, mb, pre ? r->tokens : NULL,
                                 post ? r->labels : NULL, input, output, loss_sum, num_tokens);
    r->fwd_with_output += rc == MC_OK && *output != NULL;
    return rc;
}

static int l07_hook_backward(void *app, int chunk, int mb, const float *output_grad,
                             float loss_scale, float **input_grad) {
    l07_run *r = (l07_run *)app;
    int rc = mc_gpt_backward_step(r->model, chunk, mb, output_grad, loss_scale, input_grad);
    r->bwd++;
    r->bwd_with_grad += rc == MC_OK && *input_grad != NULL;
    return rc;
}

static void l07_hook_grad_sync(void *app, int chunk, int enable) {
    l07_run *r = (l07_run *)app;
    mc_gpt_set_grad_sync(r->model, chunk, enable);
    if (r->have_ddp) mc_ddp_set_grad_sync(&r->ddp, chunk, enable);
}

static int l07_hook_finalize(void *app) {
    l07_run *r = (l07_run *)app;
    return mc_finalize_model_grads(r->ps, &r->ddp, NULL, NULL, 0, NULL);
}

static mc_schedule_hooks l07_hooks(l07_run *r) {
    return (mc_schedule_hooks){.app = r,
                               .forward_step = l07_hook_forward,
                               .backward_step = l07_hook_backward,
                               .grad_sync = l07_hook_grad_sync,
                               .finalize = r->have_ddp ? l07_hook_finalize : NULL,
                               .tensor_elems = r->gpt.p2p_elems};
}

/* Builds the model on ps with `layers` layers (0: two per stage) and m activation slots;
   every rank of ps->world calls it (the tied copy is synchronised at init). With train also
   DDP and AdamW (constant lr, no weight decay, no clipping), with or without the distributed
   optimizer. */
static void l07_run_init(l07_run *r, mc_parallel_state *ps, int untied, int m, int gather,
                         int train, int layers, int distributed_optimizer) {
    memset(r, 0, sizeof *r);
    r->ps = ps;
    r->m = m;
    r->dp = mc_parallel_size(ps, MC_GROUP_DP);
    r->dp_rank = mc_parallel_rank(ps, MC_GROUP_DP);
    mc_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.config = l07_config(ps->grid.desc.tp, ps->grid.desc.pp, untied);
    if (layers > 0) gd.config.num_layers = layers;   /* else two per stage */
    gd.ps = ps;
    gd.ops = mc_comm_memory(ps->world);   /* the CPU table, or the CUDA one on nccl */
    gd.n_slots = m;
    gd.gather_logits = gather;
    gd.distributed_optimizer = distributed_optimizer;
    MC_CHECK(mc_gpt_init(&r->gpt, &gd));
    r->have_gpt = 1;
    r->model = &r->gpt;
    if (!train) return;
    MC_CHECK(mc_ddp_init(&r->ddp, &(mc_ddp_desc){.table = &r->gpt.table, .grads = r->gpt.grads,
                                                  .dp = mc_parallel_group(ps, MC_GROUP_DP_CP),
                                                  .distributed_optimizer = distributed_optimizer,
                                                  .ops = r->gpt.ops}));
    r->have_ddp = 1;
    MC_CHECK(mc_optimizer_init(&r->opt, &(mc_optimizer_desc){.ddp = &r->ddp,
                                                              .params = r->gpt.params,
                                                              .ps = ps,
                                                              .lr = L07_LR,
                                                              .min_lr = L07_LR,
                                                              .lr_decay_style = MC_LR_DECAY_CONSTANT,
                                                              .weight_decay = MC_WEIGHT_DECAY_OFF,
                                                              .clip_grad = MC_CLIP_GRAD_OFF}));
    r->have_opt = 1;
}

static void l07_run_free(l07_run *r) {
    if (r->have_opt) mc_optimizer_destroy(&r->opt);
    if (r->have_ddp) mc_ddp_destroy(&r->ddp);
    if (r->have_gpt) mc_gpt_destroy(&r->gpt);
    r->have_opt = r->have_ddp = r->have_gpt = 0;
}

static mc_schedule_result l07_result;   /* large trace: off the stack */

/* One iteration (forward and backward of M micro-batches, then the optimizer step when the
   run trains). Returns the global mean loss over the step's tokens (every rank). */
static double l07_iteration(l07_run *r) {
    mc_schedule_hooks h = l07_hooks(r);
    r->fwd = r->fwd_with_input = r->fwd_with_output = r->fwd_tokens = r->fwd_labels = 0;
    r->bwd = r->bwd_with_grad = 0;
    if (r->have_ddp) MC_CHECK(mc_ddp_zero_grad(&r->ddp));
    MC_CHECK(mc_gpt_zero_grad(&r->gpt));
    MC_CHECK(mc_get_forward_backward_func(r->ps)(r->ps, &h, r->m, 0, &l07_result));
    if (r->have_opt) MC_CHECK(mc_optimizer_step(&r->opt));
    double mine[2] = {0.0, 0.0}, all[2];
    if (mc_parallel_is_last_stage(r->ps, 1) && r->ps->coords.tp == 0)
        mine[0] = l07_result.loss_sum, mine[1] = l07_result.num_tokens;
    MC_CHECK(lab_all_reduce_f64(r->ps->world, mine, all, 2, MC_SUM));
    r->step++;
    return all[1] > 0 ? all[0] / all[1] : 0.0;
}

/* A parameter's local shard on the host (fp32 models), malloc'ed; NULL when not on this rank. */
static float *l07_download(const mc_gpt *g, const char *name, size_t *n) {
    int i = mc_param_table_find(&g->table, name);
    if (i < 0) return NULL;
    const mc_param_info *p = &g->table.info[i];
    float *host = lab_xcalloc(p->numel, sizeof(float));
    MC_CHECK(g->ops->download(g->ops, host, (const float *)g->params + p->offset,
                              p->numel * sizeof(float)));
    *n = p->numel;
    return host;
}

/* Op memory for the lab's own tensors (inputs, logits copies), counted as activations. */
static void *l07_op_alloc(const mc_ops *o, size_t bytes) {
    void *p = NULL;
    MC_CHECK(mc_ops_alloc(o, MC_MEMORY_ACTIVATIONS, &p, bytes > 0 ? bytes : 1));
    return p;
}

/* ---------------------------------------------------------------------------------------------
   per-rank records: a fixed array of numbers per rank, all-gathered to every rank */

enum {
    R_STAGE, R_TP, R_DP, R_PRE, R_POST, R_FIRST_STAGE, R_LAST_STAGE, R_EMB_GROUP, R_MODULES,
    R_FIRST_LAYER, R_LAST_LAYER, R_PARAMS, R_GLOBAL_PARAMS, R_SHARED_PARAMS, R_MEMORY,
    R_ACTIVATIONS, R_P2P_ELEMS, R_OWN_BUCKET,
    /* B */
    R_FWD, R_FWD_INPUT, R_FWD_OUTPUT, R_TOKENS, R_LABELS, R_BWD, R_BWD_GRAD, R_FWD_SENT,
    R_FWD_RECV, R_BWD_SENT, R_BWD_RECV,
    /* E */
    R_W_PARAMS, R_W_MEMORY, R_FB_MS, R_W_FB_MS, R_W_OUTPUT, R_W_INPUT_USED, R_INPUT_USED,
    R_W_GRAD,
    R_COUNT
};

/* module bits of R_MODULES */
enum { M_WORD = 1, M_POS = 2, M_LAYERS = 4, M_FINAL_NORM = 8, M_OUTPUT = 16, M_OUTPUT_COPY = 32 };

static int l07_module_mask(const mc_gpt *g, int *first_layer, int *last_layer) {
    int mask = 0;
    *first_layer = 1 << 30;
    *last_layer = -1;
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        if (strncmp(p->name, "embedding.word_embeddings.", 26) == 0) mask |= M_WORD;
        else if (strncmp(p->name, "embedding.position_embeddings.", 30) == 0) mask |= M_POS;
        else if (strncmp(p->name, "decoder.final_layernorm.", 24) == 0) mask |= M_FINAL_NORM;
        else if (strncmp(p->name, "output_layer.", 13) == 0)
            mask |= p->shared ? M_OUTPUT_COPY : M_OUTPUT;
        if (p->layer >= 0) {
            mask |= M_LAYERS;
            if (p->layer < *first_layer) *first_layer = p->layer;
            if (p->layer > *last_layer) *last_layer = p->layer;
        }
    }
    if (*last_layer < 0) *first_layer = -1;
    return mask;
}

static long long l07_numel(const mc_gpt *g, int global, int skip_shared, long long *shared) {
    long long n = 0;
    if (shared) *shared = 0;
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        long long rows = p->global_shape[0], cols = p->ndim == 2 ? p->global_shape[1] : 1;
        long long e = global ? rows * cols : (long long)p->numel;
        if (p->shared && shared) *shared += e;
        if (p->shared && skip_shared) continue;
        n += e;
    }
    return n;
}

/* 1 when the tied embedding (or its copy) is the only parameter of its DDP bucket (what keeps
   its reduce-scatter shards aligned on both stages, Megatron-LM #844); -1 without one. */
static int l07_embedding_own_bucket(const mc_gpt *g) {
    const mc_param_table *t = &g->table;
    for (int b = 0; b < t->n_buckets; b++)
        if (t->buckets[b].shared_embedding) return t->buckets[b].n_params == 1;
    return -1;
}

/* The world rank at (stage, tp rank, dp rank 0) of a grid. */
static int l07_rank_at(const mc_grid *g, int stage, int tp) {
    for (int r = 0; r < g->desc.world; r++) {
        mc_rank_coords c;
        MC_CHECK(mc_grid_coords(g, r, &c));
        if (c.pp == stage && c.tp == tp && c.dp == 0) return r;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   state */

typedef struct l07_state {
    int steps;
    int tp, pp, dp;
    mc_parallel_state ps;          /* the main layout */
    int have_ps;
    l07_run main;                  /* A's model, kept for B, C and E */
    double rec[R_COUNT];           /* this rank's record */
    double *all;                   /* [world x R_COUNT]: every rank's, after a gather */
    long long single_params;       /* the single-rank model's parameters (rank 0) */
    int embedding_groups[L07_MAX_WORLD][2];
    int n_embedding_groups, embedding_group_size;
    int n_checks, n_failed;        /* of the current experiment */
    /* B */
    long long p2p_bytes_per_mb;    /* Ns x H x 4 */
    /* C */
    cJSON *c_facts;                /* the last stage's measurements (rank 0) */
    /* D */
    double diff_sync[L07_MAX_STEPS], diff_nosync[L07_MAX_STEPS];
    double loss_sync[L07_MAX_STEPS], loss_nosync[L07_MAX_STEPS], loss_single[L07_MAX_STEPS];
    double sync_vs_single_loss, nosync_vs_single_loss;
    double sync_first_vs_single, sync_last_vs_single, nosync_first_vs_single, nosync_last_vs_single;
    int first_divergent_step;
    int own_bucket_first, own_bucket_last;
    /* E */
    cJSON *e_schedule;             /* the schedule's answer on stage 0 (rank 0) */
    /* F */
    int fu_tp, fu_pp, fu_untied, fu_dp;
    mc_grid fu_grid;
    double *fu_all;                /* [world x R_COUNT] of the variant's layout */
} l07_state;

static void l07_gather(lab_ctx *cx, double *all) {
    l07_state *st = cx->state;
    MC_CHECK(lab_all_gather_f64(cx->world, st->rec, all, R_COUNT));
}

/* lab_check that also counts, for the "compared with" line of each experiment. */
static void l07_check(lab_ctx *cx, int ok, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void l07_check(lab_ctx *cx, int ok, const char *fmt, ...) {
    l07_state *st = cx->state;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    st->n_checks++;
    st->n_failed += !ok;
    lab_check(cx, ok, "%s", buf);
}

static void l07_compared(lab_ctx *cx, const char *with) {
    l07_state *st = cx->state;
    lab_printf0("compared with %s: %d check%s, %s\n", with, st->n_checks,
                st->n_checks == 1 ? "" : "s",
                st->n_failed ? "SOME FAILED (see above)" : "all held");
    st->n_checks = st->n_failed = 0;
}

static const double *l07_at(const mc_grid *grid, const double *all, int stage, int tp) {
    return all + (size_t)l07_rank_at(grid, stage, tp) * R_COUNT;
}

/* The module names a record's mask stands for, Megatron's prefixes. */
static cJSON *l07_modules_json(const double *rec) {
    cJSON *a = cJSON_CreateArray();
    int mask = (int)rec[R_MODULES];
    char buf[64];
    if (mask & M_WORD) cJSON_AddItemToArray(a, cJSON_CreateString("embedding.word_embeddings"));
    if (mask & M_POS) cJSON_AddItemToArray(a, cJSON_CreateString("embedding.position_embeddings"));
    for (int l = (int)rec[R_FIRST_LAYER]; (mask & M_LAYERS) && l <= (int)rec[R_LAST_LAYER]; l++) {
        snprintf(buf, sizeof buf, "decoder.layers.%d", l);
        cJSON_AddItemToArray(a, cJSON_CreateString(buf));
    }
    if (mask & M_FINAL_NORM) cJSON_AddItemToArray(a, cJSON_CreateString("decoder.final_layernorm"));
    if (mask & M_OUTPUT) cJSON_AddItemToArray(a, cJSON_CreateString("output_layer"));
    if (mask & M_OUTPUT_COPY)
        cJSON_AddItemToArray(a, cJSON_CreateString("output_layer (tied copy of the word "
                                                   "embedding)"));
    return a;
}

/* The same, compact, for the printed tables: "embedding (word, position), layers 0-1". */
static void l07_modules_line(const double *rec, char *out, size_t cap) {
    int mask = (int)rec[R_MODULES];
    size_t n = 0;
    out[0] = '\0';
#define L07_ADD(...) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__)
    if (mask & (M_WORD | M_POS))
        L07_ADD("embedding (%s%s%s)", mask & M_WORD ? "word" : "",
                (mask & M_WORD) && (mask & M_POS) ? ", " : "", mask & M_POS ? "position" : "");
    if (mask & M_LAYERS)
        L07_ADD("%slayers %d-%d", n ? ", " : "", (int)rec[R_FIRST_LAYER], (int)rec[R_LAST_LAYER]);
    if (mask & M_FINAL_NORM) L07_ADD("%sfinal norm", n ? ", " : "");
    if (mask & M_OUTPUT) L07_ADD("%soutput layer", n ? ", " : "");
    if (mask & M_OUTPUT_COPY) L07_ADD("%soutput layer (tied copy)", n ? ", " : "");
#undef L07_ADD
}

static const char *l07_flags_word(int pre, int post) {
    return pre && post ? "both" : pre ? "pre" : post ? "post" : "none";
}

/* The modules a stage must build (the rule of pre_process / post_process). */
static int l07_rule_mask(int stage, int pp, int untied) {
    int mask = M_LAYERS;
    if (stage == 0) mask |= M_WORD | M_POS;
    if (stage == pp - 1) {
        mask |= M_FINAL_NORM;
        if (untied) mask |= M_OUTPUT;
        else if (pp > 1) mask |= M_OUTPUT_COPY;
    }
    return mask;
}

/* Fills the record fields of A from a model on ps. */
static void l07_record_model(double *rec, const mc_parallel_state *ps, const mc_gpt *g) {
    int first = 0, last = 0;
    long long shared = 0;
    size_t act = 0;
    rec[R_STAGE] = ps->coords.pp;
    rec[R_TP] = ps->coords.tp;
    rec[R_DP] = ps->coords.dp;
    rec[R_PRE] = mc_gpt_is_pre_process(g, 0);
    rec[R_POST] = mc_gpt_is_post_process(g, g->n_chunks - 1);
    rec[R_FIRST_STAGE] = mc_parallel_is_first_stage(ps, 1);
    rec[R_LAST_STAGE] = mc_parallel_is_last_stage(ps, 1);
    mc_comm *emb = mc_parallel_group(ps, MC_GROUP_EMBEDDING);
    rec[R_EMB_GROUP] = mc_parallel_in_embedding_group(ps, 1) && emb != NULL ? emb->size : 0;
    rec[R_MODULES] = l07_module_mask(g, &first, &last);
    rec[R_FIRST_LAYER] = first;
    rec[R_LAST_LAYER] = last;
    rec[R_PARAMS] = (double)l07_numel(g, 0, 0, NULL);
    rec[R_GLOBAL_PARAMS] = (double)l07_numel(g, 1, 1, &shared);
    rec[R_SHARED_PARAMS] = (double)shared;
    rec[R_MEMORY] = (double)mc_gpt_memory(g, &act);
    rec[R_ACTIVATIONS] = (double)act;
    rec[R_P2P_ELEMS] = (double)g->p2p_elems;
    rec[R_OWN_BUCKET] = l07_embedding_own_bucket(g);
}

/* ---------------------------------------------------------------------------------------------
   A. stage-local modules and parameter counts */

static int l07_run_a(lab_ctx *cx) {
    l07_state *st = cx->state;
    lab_heading(cx, "A. what each pipeline stage builds (PP = %d, TP = %d, DP = %d)", st->pp,
                st->tp, st->dp);
    MC_CHECK(mc_parallel_init(&st->ps, &(mc_parallel_desc){.world = cx->world,
                                                            .grid = cx->grid.desc}));
    st->have_ps = 1;
    l07_run_init(&st->main, &st->ps, 0, L07_M, 0, 0, 0, 0);
    l07_record_model(st->rec, &st->ps, &st->main.gpt);
    if (cx->me == 0) {   /* the single-rank model (no communication): its parameter count */
        mc_gpt one;
        mc_gpt_config c1 = l07_config(1, 1, 0);
        c1.num_layers = L07_LAYERS_PER_STAGE * st->pp;
        MC_CHECK(mc_gpt_init(&one, &(mc_gpt_desc){.config = c1, .ops = mc_comm_memory(cx->world)}));
        st->single_params = l07_numel(&one, 0, 0, NULL);
        mc_gpt_destroy(&one);
    }
    l07_gather(cx, st->all);
    /* the rank grid's embedding groups: what the lab expects them to be */
    const mc_grid *grid = &st->ps.grid;
    st->n_embedding_groups = mc_grid_num_groups(grid, MC_GROUP_EMBEDDING);
    for (int gi = 0; gi < st->n_embedding_groups && gi < L07_MAX_WORLD; gi++) {
        int members[L07_MAX_PP];
        int n = mc_grid_group_members(grid, MC_GROUP_EMBEDDING, gi, members, L07_MAX_PP);
        st->embedding_group_size = n;
        st->embedding_groups[gi][0] = members[0];
        st->embedding_groups[gi][1] = members[n - 1];
    }
    if (cx->me != 0) return LAB_RAN;

    int pp = st->pp, tp = st->tp;
    long long sum_global = 0, copy = 0;
    lab_printf0("stage  flags  modules (this stage only)                      params/rank"
                "   formula   memory/rank\n");
    for (int s = 0; s < pp; s++) {
        const double *r = l07_at(grid, st->all, s, 0);
        char line[160];
        l07_modules_line(r, line, sizeof line);
        long long want = l07_formula_params(tp, L07_LAYERS_PER_STAGE, s == 0, s == pp - 1, 0);
        lab_printf0("  %-4d %-5s  %-46s %10.0f %9lld %10.0f KiB\n", s,
                    l07_flags_word((int)r[R_PRE], (int)r[R_POST]), line, r[R_PARAMS], want,
                    r[R_MEMORY] / 1024.0);
        sum_global += (long long)r[R_GLOBAL_PARAMS];
        copy += (long long)r[R_SHARED_PARAMS];
    }
    /* checks over every rank's record */
    int flags_ok = 1, modules_ok = 1, counts_ok = 1, same_ok = 1, embg_ok = 1;
    for (int w = 0; w < cx->world_size; w++) {
        const double *r = st->all + (size_t)w * R_COUNT;
        int s = (int)r[R_STAGE];
        const double *ref = l07_at(grid, st->all, s, 0);
        flags_ok &= (int)r[R_PRE] == (s == 0) && (int)r[R_POST] == (s == pp - 1) &&
                    r[R_PRE] == r[R_FIRST_STAGE] && r[R_POST] == r[R_LAST_STAGE];
        modules_ok &= (int)r[R_MODULES] == l07_rule_mask(s, pp, 0) &&
                      (int)r[R_FIRST_LAYER] == L07_LAYERS_PER_STAGE * s &&
                      (int)r[R_LAST_LAYER] == L07_LAYERS_PER_STAGE * s + L07_LAYERS_PER_STAGE - 1;
        counts_ok &= (long long)r[R_PARAMS] ==
                     l07_formula_params(tp, L07_LAYERS_PER_STAGE, s == 0, s == pp - 1, 0);
        same_ok &= r[R_PARAMS] == ref[R_PARAMS] && r[R_MEMORY] == ref[R_MEMORY];
        int end = s == 0 || s == pp - 1;
        embg_ok &= (int)r[R_EMB_GROUP] == (end && pp > 1 ? 2 : 0);
    }
    l07_check(cx, flags_ok, "pre_process exactly on stage 0 and post_process exactly on stage %d, "
              "the same ranks as is_first_stage / is_last_stage", pp - 1);
    l07_check(cx, modules_ok, "embedding only on stage 0, final norm and output layer only on "
              "stage %d, layers 2s..2s+1 on stage s (every rank's parameter table)", pp - 1);
    l07_check(cx, counts_ok, "every rank's parameter count equals the formula for its stage");
    l07_check(cx, same_ok, "all TP and DP ranks of a stage hold the same count and memory");
    long long vp = mc_gpt_padded_vocab_size(L07_VOCAB, L07_VOCAB_DIV, tp);
    l07_check(cx, sum_global == st->single_params,
              "the stages' unsharded parameters without the tied copy (%lld) equal the "
              "single-rank model's %lld", sum_global, st->single_params);
    l07_check(cx, copy == vp * L07_HIDDEN, "the last stage's tied copy is one V x H = %lld x %d "
              "matrix (%lld elements)", vp, L07_HIDDEN, copy);
    int groups_ok = st->embedding_group_size == (pp > 1 ? 2 : 1);
    for (int gi = 0; gi < st->n_embedding_groups; gi++) {
        mc_rank_coords a, b;
        MC_CHECK(mc_grid_coords(grid, st->embedding_groups[gi][0], &a));
        MC_CHECK(mc_grid_coords(grid, st->embedding_groups[gi][1], &b));
        groups_ok &= a.pp == 0 && b.pp == pp - 1 && a.tp == b.tp && a.dp == b.dp;
    }
    l07_check(cx, groups_ok && embg_ok, "the embedding groups pair stage 0 with stage %d (same TP "
              "and DP rank); the middle stages are in none", pp - 1);
    int heavy = 0;
    for (int s = 1; s < pp; s++)
        if (l07_at(grid, st->all, s, 0)[R_PARAMS] > l07_at(grid, st->all, heavy, 0)[R_PARAMS])
            heavy = s;
    lab_printf0("heaviest stage: %d; embedding groups:", heavy);
    for (int gi = 0; gi < st->n_embedding_groups; gi++)
        lab_printf0(" [%d,%d]", st->embedding_groups[gi][0], st->embedding_groups[gi][1]);
    lab_printf0("\n");
    l07_compared(cx, "the per-stage formula, the module rule, the single-rank model and the rank "
                 "grid");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   B. data flow through the pipeline */

static int l07_run_b(lab_ctx *cx) {
    l07_state *st = cx->state;
    l07_run *r = &st->main;
    lab_heading(cx, "B. one training iteration (1F1B, M = %d): what each stage reads, receives "
                "and sends", L07_M);
    l07_tap_on(0, mc_parallel_group(&st->ps, MC_GROUP_PP));
    r->step = 0;
    double loss = l07_iteration(r);
    l07_traffic t = l07_tap_off(0);
    double *rec = st->rec;
    rec[R_FWD] = r->fwd;
    rec[R_FWD_INPUT] = r->fwd_with_input;
    rec[R_FWD_OUTPUT] = r->fwd_with_output;
    rec[R_TOKENS] = r->fwd_tokens;
    rec[R_LABELS] = r->fwd_labels;
    rec[R_BWD] = r->bwd;
    rec[R_BWD_GRAD] = r->bwd_with_grad;
    rec[R_FWD_SENT] = (double)t.fwd_sent;
    rec[R_FWD_RECV] = (double)t.fwd_recv;
    rec[R_BWD_SENT] = (double)t.bwd_sent;
    rec[R_BWD_RECV] = (double)t.bwd_recv;
    st->p2p_bytes_per_mb = (long long)mc_dtype_bytes(r->gpt.dtype, r->gpt.p2p_elems);
    l07_gather(cx, st->all);
    if (cx->me != 0) return LAB_RAN;

    int pp = st->pp, M = L07_M;
    long long b = st->p2p_bytes_per_mb;
    lab_printf0("one P2P tensor = Ns x H = %d x %d floats = %lld bytes; loss of the iteration "
                "%.4f\n", r->gpt.Ns, r->gpt.H, b, loss);
    lab_printf0("stage  reads          forward input      forward output      P2P bytes: sent "
                "fwd  recv fwd  sent bwd  recv bwd\n");
    int ok_data = 1, ok_io = 1, ok_bytes = 1;
    for (int w = 0; w < cx->world_size; w++) {
        const double *q = st->all + (size_t)w * R_COUNT;
        int s = (int)q[R_STAGE], first = s == 0, last = s == pp - 1;
        ok_data &= (int)q[R_TOKENS] == (first ? M : 0) && (int)q[R_LABELS] == (last ? M : 0);
        ok_io &= (int)q[R_FWD] == M && (int)q[R_FWD_INPUT] == (first ? 0 : M) &&
                 (int)q[R_FWD_OUTPUT] == (last ? 0 : M) && (int)q[R_BWD_GRAD] == (first ? 0 : M);
        ok_bytes &= (long long)q[R_FWD_SENT] == (last ? 0 : M * b) &&
                    (long long)q[R_FWD_RECV] == (first ? 0 : M * b) &&
                    (long long)q[R_BWD_SENT] == (first ? 0 : M * b) &&
                    (long long)q[R_BWD_RECV] == (last ? 0 : M * b);
    }
    for (int s = 0; s < pp; s++) {
        const double *q = l07_at(&st->ps.grid, st->all, s, 0);
        char reads[32];
        snprintf(reads, sizeof reads, "%s%s%s", q[R_TOKENS] > 0 ? "tokens" : "",
                 q[R_TOKENS] > 0 && q[R_LABELS] > 0 ? "+" : "", q[R_LABELS] > 0 ? "labels" :
                 q[R_TOKENS] > 0 ? "" : "nothing");
        lab_printf0("  %-4d %-14s %-18s %-19s %14.0f %9.0f %9.0f %9.0f\n", s, reads,
                    q[R_FWD_INPUT] > 0 ? "activation [Ns,H]" : "token ids [S,B]",
                    q[R_FWD_OUTPUT] > 0 ? "activation [Ns,H]" : "loss (nothing sent)",
                    q[R_FWD_SENT], q[R_FWD_RECV], q[R_BWD_SENT], q[R_BWD_RECV]);
    }
    l07_check(cx, ok_data, "the data loader gave tokens only to stage 0 and labels only to stage "
              "%d (Megatron's get_batch)", pp - 1);
    l07_check(cx, ok_io, "forward_step received an activation on every stage but the first, "
              "returned one to send on every stage but the last, and backward returned an input "
              "gradient on every stage but the first");
    l07_check(cx, ok_bytes, "every stage boundary carried M x %lld = %lld bytes forward and as "
              "many backward (the PP communicator's count)", b, M * b);
    l07_compared(cx, "M x Ns x H x 4 bytes per boundary and direction, and the flags");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   C. parallel_output: the last stage's logits split over the vocabulary or gathered */

static uint32_t l07_fnv(const void *data, size_t n, uint32_t h) {
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

/* Plain cross entropy of one row of full logits in double, optionally label-smoothed the way
   Megatron defines it (target 1 - a, the other K - 1 entries a / (K - 1), so s = a K / (K - 1)
   weighs the uniform part), with the mean of log p over entries [from, to) and K = to - from:
   the whole row for the unsharded loss, one TP shard for Megatron's vocab-parallel formula. */
static double l07_row_loss(const float *row, int V, int target, double alpha, int from, int to) {
    double m = row[0], z = 0.0, mean = 0.0;
    for (int j = 1; j < V; j++) m = row[j] > m ? row[j] : m;
    for (int j = 0; j < V; j++) z += exp((double)row[j] - m);
    double lse = m + log(z), ce = lse - row[target];
    if (alpha <= 0) return ce;
    int K = to - from;
    for (int j = from; j < to; j++) mean += (double)row[j] - lse;
    mean /= K;
    double s = alpha * K / (K - 1.0);
    return (1.0 - s) * ce - s * mean;
}

static int l07_argmax(const float *row, int n) {
    int best = 0;
    for (int j = 1; j < n; j++)
        if (row[j] > row[best]) best = j;
    return best;
}

/* The last-stage measurements; returns this rank's facts (TP rank 0 of DP rank 0 reports). */
static cJSON *l07_measure_logits(lab_ctx *cx, l07_run *on, l07_run *off) {
    l07_state *st = cx->state;
    mc_gpt *g = &on->gpt;
    const mc_ops *o = g->ops;
    mc_comm *tp = mc_parallel_group(&st->ps, MC_GROUP_TP);
    int N = g->N, Vl = g->vocab_local, Vp = g->vocab_padded, T = g->tp, tr = g->tp_rank;
    size_t ns_h = (size_t)g->Ns * (size_t)g->H;
    float *h_in = lab_xcalloc(ns_h, sizeof(float));
    l07_fill_host(h_in, ns_h, 1);
    int labels[L07_N], text[L07_SEQ + 1];
    for (int j = 0; j < L07_MBS; j++) {   /* a micro-batch of its own (sample 5000 on) */
        l07_sample(5000 + j, text);
        for (int s = 0; s < L07_SEQ; s++) labels[s * L07_MBS + j] = text[s + 1];
    }
    size_t scratch = mc_vocab_parallel_cross_entropy_scratch(N, Vp, L07_SMOOTHING, T);
    void *d_in = l07_op_alloc(o, ns_h * sizeof(float));
    void *d_local = l07_op_alloc(o, (size_t)N * Vl * sizeof(float));
    void *d_full = l07_op_alloc(o, (size_t)N * Vp * sizeof(float));
    void *d_loss = l07_op_alloc(o, (size_t)N * sizeof(float));
    void *d_max = l07_op_alloc(o, (size_t)N * sizeof(float));
    void *d_sum = l07_op_alloc(o, (size_t)N * sizeof(float));
    void *d_lab = l07_op_alloc(o, (size_t)N * sizeof(int));
    void *d_scratch = l07_op_alloc(o, scratch * sizeof(float));
    MC_CHECK(o->upload(o, d_in, h_in, ns_h * sizeof(float)));
    MC_CHECK(o->upload(o, d_lab, labels, (size_t)N * sizeof(int)));

    /* parallel_output on: the logits stay [N, V/TP]; the loss is vocab-parallel */
    float *out = NULL;
    double loss_sum = 0.0;
    l07_tap_on(1, tp);
    MC_CHECK(mc_gpt_forward(g, 0, 0, NULL, NULL, (const float *)d_in, &out, NULL));
    l07_traffic t_logits = l07_tap_off(1);
    l07_tap_on(1, tp);
    MC_CHECK(mc_gpt_forward(g, 0, 0, NULL, labels, (const float *)d_in, &out, &loss_sum));
    l07_traffic t_loss = l07_tap_off(1);
    int nv_on = 0, nv_off = 0;
    l07_tap_on(1, tp);
    MC_CHECK(mc_gpt_logits(g, 0, (float *)d_local, &nv_on));
    l07_traffic t_copy = l07_tap_off(1);
    float *local = lab_xcalloc((size_t)N * Vl, sizeof(float));
    float *losses = lab_xcalloc((size_t)N, sizeof(float));
    MC_CHECK(o->download(o, local, d_local, (size_t)N * Vl * sizeof(float)));
    MC_CHECK(o->download(o, losses, mc_gpt_losses(g, 0), (size_t)N * sizeof(float)));

    /* parallel_output off: the same forward, then the logits gathered over TP */
    MC_CHECK(mc_gpt_forward(&off->gpt, 0, 0, NULL, labels, (const float *)d_in, &out, NULL));
    l07_tap_on(1, tp);
    MC_CHECK(mc_gpt_logits(&off->gpt, 0, (float *)d_full, &nv_off));
    l07_traffic t_gather = l07_tap_off(1);
    float *full = lab_xcalloc((size_t)N * Vp, sizeof(float));
    MC_CHECK(o->download(o, full, d_full, (size_t)N * Vp * sizeof(float)));

    /* the gathered rows hold every shard: this rank's slice equals its own logits */
    int equal = 1;
    for (int n = 0; n < N && equal; n++)
        equal = memcmp(full + (size_t)n * Vp + (size_t)tr * Vl, local + (size_t)n * Vl,
                       (size_t)Vl * sizeof(float)) == 0;
    /* every TP rank holds the same full logits */
    int mine[2] = {(int)l07_fnv(full, (size_t)N * Vp * sizeof(float), 2166136261u), equal};
    int *all = lab_xcalloc((size_t)T * 2, sizeof(int));
    MC_CHECK(lab_all_gather_i32(tp, mine, all, 2));
    int same = 1, all_equal = 1;
    for (int r = 0; r < T; r++) same &= all[2 * r] == all[0], all_equal &= all[2 * r + 1];
    free(all);
    /* the loss from the full logits, plain cross entropy in double, against the model's */
    double worst = 0.0, agree = 0.0;
    for (int n = 0; n < N; n++) {
        double ce = l07_row_loss(full + (size_t)n * Vp, Vp, labels[n], 0.0, 0, Vp);
        double d = fabs(ce - losses[n]) / fmax(fabs(ce), 1e-30);
        if (!(d <= worst)) worst = d;
        /* a sampler that takes this shard's argmax as a token id */
        agree += l07_argmax(local + (size_t)n * Vl, Vl) == l07_argmax(full + (size_t)n * Vp, Vp);
    }
    agree /= N;
    /* label smoothing: the library's vocab-parallel loss against the unsharded formula, and
       Megatron's formula (K and the mean of log p over this rank's shard) */
    MC_CHECK(mc_vocab_parallel_cross_entropy_forward((float *)d_loss, NULL, (float *)d_max,
                                                     (float *)d_sum, (float *)d_scratch,
                                                     d_local, (const int *)d_lab, N, Vp,
                                                     L07_SMOOTHING, MC_F32, tp, o));
    float *smoothed = lab_xcalloc((size_t)N, sizeof(float));
    MC_CHECK(o->download(o, smoothed, d_loss, (size_t)N * sizeof(float)));
    double *megatron = lab_xcalloc((size_t)N * T, sizeof(double));
    double *mine_m = lab_xcalloc((size_t)N, sizeof(double));
    double lib_vs = 0.0, mean_unsharded = 0.0, mean_mine = 0.0;
    for (int n = 0; n < N; n++) {
        const float *row = full + (size_t)n * Vp;
        double u = l07_row_loss(row, Vp, labels[n], L07_SMOOTHING, 0, Vp);
        mine_m[n] = l07_row_loss(row, Vp, labels[n], L07_SMOOTHING, tr * Vl, (tr + 1) * Vl);
        double d = fabs(u - smoothed[n]);
        if (!(d <= lib_vs)) lib_vs = d;
        mean_unsharded += u / N;
        mean_mine += mine_m[n] / N;
    }
    MC_CHECK(lab_all_gather_f64(tp, mine_m, megatron, (size_t)N));
    double between = 0.0, vs_unsharded = 0.0;
    for (int n = 0; n < N; n++) {
        const float *row = full + (size_t)n * Vp;
        double u = l07_row_loss(row, Vp, labels[n], L07_SMOOTHING, 0, Vp);
        for (int r = 0; r < T; r++) {
            double a = megatron[(size_t)r * N + n];
            if (fabs(a - u) > vs_unsharded) vs_unsharded = fabs(a - u);
            if (fabs(a - megatron[n]) > between) between = fabs(a - megatron[n]);
        }
    }
    double agree_all[8] = {0}, means[8] = {0}, pair[2] = {agree, mean_mine}, *pairs;
    pairs = lab_xcalloc((size_t)T * 2, sizeof(double));
    MC_CHECK(lab_all_gather_f64(tp, pair, pairs, 2));
    for (int r = 0; r < T && r < 8; r++) agree_all[r] = pairs[2 * r], means[r] = pairs[2 * r + 1];
    free(pairs);

    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "tokens", N);
    cJSON_AddNumberToObject(f, "vocab_padded", Vp);
    cJSON_AddNumberToObject(f, "vocab_local", Vl);
    cJSON_AddNumberToObject(f, "tp", T);
    cJSON *fon = cJSON_AddObjectToObject(f, "on");
    cJSON_AddItemToObject(fon, "logits_shape", lab_json_int_array((int[]){N, nv_on}, 2));
    cJSON_AddNumberToObject(fon, "held_bytes", (double)N * nv_on * 4);
    cJSON_AddNumberToObject(fon, "logits_moved_bytes",
                            (double)(t_loss.all_gather_bytes + t_copy.all_gather_bytes +
                                     t_copy.all_reduce_bytes));
    cJSON_AddNumberToObject(fon, "loss_all_reduces",
                            (double)(t_loss.all_reduce_calls - t_logits.all_reduce_calls));
    cJSON_AddNumberToObject(fon, "loss_bytes",
                            (double)(t_loss.all_reduce_bytes - t_logits.all_reduce_bytes));
    cJSON *foff = cJSON_AddObjectToObject(f, "off");
    cJSON_AddItemToObject(foff, "logits_shape", lab_json_int_array((int[]){N, nv_off}, 2));
    cJSON_AddNumberToObject(foff, "held_bytes", (double)N * nv_off * 4);
    cJSON_AddNumberToObject(foff, "logits_moved_bytes", (double)t_gather.all_gather_bytes);
    cJSON_AddNumberToObject(foff, "all_gathers", (double)t_gather.all_gather_calls);
    cJSON_AddBoolToObject(f, "gathered_equals_shards", all_equal);
    cJSON_AddBoolToObject(f, "tp_ranks_hold_same_full_logits", same);
    cJSON_AddNumberToObject(f, "plain_ce_on_gathered_vs_vocab_parallel_max_rel", worst);
    cJSON_AddNumberToObject(f, "loss_mean", loss_sum / N);
    cJSON_AddItemToObject(f, "shard_argmax_as_token_id_agrees",
                          cJSON_CreateDoubleArray(agree_all, T < 8 ? T : 8));
    cJSON *ls = cJSON_AddObjectToObject(f, "label_smoothing");
    cJSON_AddNumberToObject(ls, "alpha", round((double)L07_SMOOTHING * 1e6) / 1e6);
    cJSON_AddNumberToObject(ls, "library_vs_unsharded_max_abs", lib_vs);
    cJSON_AddNumberToObject(ls, "megatron_shard_formula_between_tp_ranks_max_abs", between);
    cJSON_AddNumberToObject(ls, "megatron_shard_formula_vs_unsharded_max_abs", vs_unsharded);
    cJSON_AddNumberToObject(ls, "unsharded_mean_loss", mean_unsharded);
    cJSON_AddItemToObject(ls, "megatron_shard_formula_mean_loss_by_tp_rank",
                          cJSON_CreateDoubleArray(means, T < 8 ? T : 8));
    free(h_in); free(local); free(losses); free(full); free(smoothed); free(megatron);
    free(mine_m);
    void *bufs[] = {d_in, d_local, d_full, d_loss, d_max, d_sum, d_lab, d_scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) MC_CHECK(mc_ops_free(o, bufs[i]));
    return f;
}

static double l07_num(const cJSON *o, const char *dotted) {
    const cJSON *cur = o;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", dotted);
    char *save = NULL;
    for (char *k = strtok_r(buf, ".", &save); k && cur; k = strtok_r(NULL, ".", &save))
        cur = cJSON_GetObjectItemCaseSensitive(cur, k);
    if (cJSON_IsNumber(cur)) return cur->valuedouble;
    return cJSON_IsBool(cur) ? (double)cJSON_IsTrue(cur) : NAN;
}

static int l07_run_c(lab_ctx *cx) {
    l07_state *st = cx->state;
    lab_heading(cx, "C. parallel_output: the last stage's logits, split over TP or gathered");
    l07_run off;
    l07_run_init(&off, &st->ps, 0, 1, 1, 0, 0, 0);   /* gather_logits = 1: parallel_output off */
    int reporter = l07_rank_at(&st->ps.grid, st->pp - 1, 0);
    cJSON *mine = mc_parallel_is_last_stage(&st->ps, 1) ? l07_measure_logits(cx, &st->main, &off)
                                                         : NULL;
    if (cx->me != reporter) cJSON_Delete(mine), mine = NULL;
    cJSON *c = lab_json_from_rank(cx, mine, reporter);
    l07_run_free(&off);
    if (cx->me != 0) {
        cJSON_Delete(c);
        return LAB_RAN;
    }
    cJSON_Delete(st->c_facts);
    st->c_facts = c;
    long long N = (long long)l07_num(c, "tokens"), Vp = (long long)l07_num(c, "vocab_padded");
    long long Vl = (long long)l07_num(c, "vocab_local"), T = (long long)l07_num(c, "tp");
    lab_printf0("N = S x B = %lld tokens, vocabulary %lld, %lld per TP rank\n", N, Vp, Vl);
    lab_printf0("                          logits shape   held/rank   logits bytes moved   "
                "loss collectives\n");
    lab_printf0("  parallel_output on      [%lld, %lld]  %9.0f   %18.0f   %.0f all-reduces, "
                "%.0f bytes\n", N, Vl, l07_num(c, "on.held_bytes"),
                l07_num(c, "on.logits_moved_bytes"), l07_num(c, "on.loss_all_reduces"),
                l07_num(c, "on.loss_bytes"));
    lab_printf0("  parallel_output off     [%lld, %lld] %9.0f   %18.0f   (loss on the full "
                "rows: no collective)\n", N, Vp, l07_num(c, "off.held_bytes"),
                l07_num(c, "off.logits_moved_bytes"));
    l07_check(cx, l07_num(c, "on.held_bytes") == (double)(N * Vl * 4) &&
                      l07_num(c, "off.held_bytes") == (double)(N * Vp * 4),
              "held: N x V/TP x 4 = %lld bytes split, N x V x 4 = %lld gathered", N * Vl * 4,
              N * Vp * 4);
    l07_check(cx, l07_num(c, "on.logits_moved_bytes") == 0 &&
                      l07_num(c, "off.logits_moved_bytes") == (double)((T - 1) * N * Vl * 4),
              "moved: no logits with parallel_output on; (TP-1) x N x V/TP x 4 = %lld bytes "
              "received by the gather", (T - 1) * N * Vl * 4);
    l07_check(cx, T == 1 || (l07_num(c, "on.loss_all_reduces") == 3 &&
                             l07_num(c, "on.loss_bytes") == (double)(3 * N * 4)),
              "the vocab-parallel loss moved 3 all-reduces of N floats (max, target logit, sum "
              "of exp): %lld bytes", 3 * N * 4);
    l07_check(cx, l07_num(c, "gathered_equals_shards") == 1 &&
                      l07_num(c, "tp_ranks_hold_same_full_logits") == 1,
              "the gathered logits are the TP shards side by side, identical on every TP rank");
    l07_check(cx, l07_num(c, "plain_ce_on_gathered_vs_vocab_parallel_max_rel") <= L07_LOSS_RTOL,
              "plain cross entropy on the gathered logits equals the vocab-parallel loss "
              "(max rel diff %.1e)", l07_num(c, "plain_ce_on_gathered_vs_vocab_parallel_max_rel"));
    const cJSON *agree = cJSON_GetObjectItemCaseSensitive(c, "shard_argmax_as_token_id_agrees");
    double least = 1.0;
    const cJSON *e;
    cJSON_ArrayForEach(e, agree) least = fmin(least, e->valuedouble);
    lab_printf0("a sampler taking a shard's argmax as the token id agrees with the full-vocab "
                "argmax on:");
    cJSON_ArrayForEach(e, agree) lab_printf0(" %.2f", e->valuedouble);
    lab_printf0(" of the tokens (TP rank 0, 1, ...)\n");
    l07_check(cx, T == 1 || least < 1.0, "with TP > 1 some shard's local argmax is not the "
              "full-vocabulary token");
    double lib = l07_num(c, "label_smoothing.library_vs_unsharded_max_abs");
    double meg = l07_num(c, "label_smoothing.megatron_shard_formula_between_tp_ranks_max_abs");
    lab_printf0("label smoothing %.1f: this library's vocab-parallel loss vs the unsharded formula "
                "%.1e; Megatron's shard formula differs between TP ranks by up to %.1e\n",
                L07_SMOOTHING, lib, meg);
    l07_check(cx, lib <= 1e-5, "smoothed vocab-parallel loss equals the unsharded formula");
    l07_check(cx, T == 1 || meg > 10.0 * fmax(lib, 1e-7), "Megatron's shard-local smoothing "
              "gives TP ranks different losses (issues #737, #7464)");
    l07_compared(cx, "the byte formulas, the shards, plain cross entropy in double and the "
                 "unsharded smoothing formula");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   D. tied embeddings: the first stage's word embedding and the last stage's copy */

/* max |W_first - W_last| over every embedding group (every rank gets it). */
static double l07_tied_diff(l07_run *r) {
    mc_comm *emb = mc_parallel_group(r->ps, MC_GROUP_EMBEDDING);
    double mine = 0.0, worst = 0.0;
    if (mc_parallel_in_embedding_group(r->ps, 1) && emb != NULL && emb->size == 2) {
        int first = mc_parallel_is_first_stage(r->ps, 1);
        size_t n = 0;
        float *w = l07_download(&r->gpt, first ? "embedding.word_embeddings.weight"
                                               : "output_layer.weight", &n);
        double *mine_d = lab_xcalloc(n, sizeof(double)), *both = lab_xcalloc(2 * n, sizeof(double));
        for (size_t i = 0; i < n; i++) mine_d[i] = w[i];
        MC_CHECK(lab_all_gather_f64(emb, mine_d, both, n));
        for (size_t i = 0; i < n; i++) {
            double d = fabs(both[i] - both[n + i]);
            if (!(d <= mine)) mine = d;
        }
        free(w), free(mine_d), free(both);
    }
    MC_CHECK(lab_all_reduce_f64(r->ps->world, &mine, &worst, 1, MC_MAX));
    return worst;
}

/* max |shard - the single-rank embedding's rows| for the first stage's word embedding ([0])
   and the last stage's copy ([1]), over every rank. */
static void l07_vs_single(l07_run *r, const float *ref /* [Vp, H] */, double out[2]) {
    double mine[2] = {0.0, 0.0};
    int first = mc_parallel_is_first_stage(r->ps, 1), last = mc_parallel_is_last_stage(r->ps, 1);
    for (int which = 0; which < 2; which++) {
        if (!(which == 0 ? first : last)) continue;
        size_t n = 0;
        float *w = l07_download(&r->gpt, which == 0 ? "embedding.word_embeddings.weight"
                                                    : "output_layer.weight", &n);
        if (w == NULL) continue;
        const float *rows = ref + (size_t)r->gpt.tp_rank * n;   /* split on the vocabulary */
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)w[i] - rows[i]);
            if (!(d <= mine[which])) mine[which] = d;
        }
        free(w);
    }
    MC_CHECK(lab_all_reduce_f64(r->ps->world, mine, out, 2, MC_MAX));
}

/* K steps on the main layout from a fresh model, the embedding-group all-reduce of the grads
   skipped or not; compares with the single-rank embedding at the end. */
static void l07_train_tied(lab_ctx *cx, int skip, double *loss, double *diff, const float *ref,
                           double vs_single[2]) {
    l07_state *st = cx->state;
    l07_run r;
    l07_run_init(&r, &st->ps, 0, L07_M, 0, 1, 0, 1);
    if (skip == 0) {
        st->own_bucket_first = st->own_bucket_last = -1;
        int own = l07_embedding_own_bucket(&r.gpt);
        int mine[2] = {mc_parallel_is_first_stage(&st->ps, 1) ? own : -1,
                       mc_parallel_is_last_stage(&st->ps, 1) ? own : -1};
        int both[2];
        MC_CHECK(lab_all_reduce_i32(cx->world, mine, both, 2, MC_MAX));
        st->own_bucket_first = both[0], st->own_bucket_last = both[1];
    }
    mc_fault_finalize_skip_embedding_sync(skip);
    for (int k = 0; k < st->steps; k++) {
        loss[k] = l07_iteration(&r);
        diff[k] = l07_tied_diff(&r);
    }
    mc_fault_finalize_skip_embedding_sync(0);
    l07_vs_single(&r, ref, vs_single);
    l07_run_free(&r);
}

static double l07_max_rel(const double *a, const double *b, int n) {
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]) / fmax(fabs(b[i]), 1e-30);
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

static int l07_run_d(lab_ctx *cx) {
    l07_state *st = cx->state;
    int K = st->steps;
    lab_heading(cx, "D. tied embeddings: %d AdamW steps (lr %g), with and without the "
                "embedding-group all-reduce", K, (double)L07_LR);
    /* the single-rank run of the same samples on world rank 0 (one tensor, no copy) */
    long long vp = mc_gpt_padded_vocab_size(L07_VOCAB, L07_VOCAB_DIV, 1);
    size_t ref_n = (size_t)vp * L07_HIDDEN;
    float *ref = lab_xcalloc(ref_n, sizeof(float));
    int zero = 0;
    mc_comm *one = NULL;
    MC_CHECK(mc_comm_create_group(cx->world, &zero, 1, &one));
    if (one != NULL) {
        mc_parallel_state ps1;
        mc_grid_desc g1 = {.tp = 1, .pp = 1};
        MC_CHECK(mc_parallel_init(&ps1, &(mc_parallel_desc){.world = one, .grid = g1}));
        l07_run r;   /* the whole model on one rank: every layer, M x DP micro-batches */
        l07_run_init(&r, &ps1, 0, L07_M * st->dp, 0, 1, L07_LAYERS_PER_STAGE * st->pp, 0);
        for (int k = 0; k < K; k++) st->loss_single[k] = l07_iteration(&r);
        size_t n = 0;
        float *w = l07_download(&r.gpt, "embedding.word_embeddings.weight", &n);
        memcpy(ref, w, (n < ref_n ? n : ref_n) * sizeof(float));
        free(w);
        l07_run_free(&r);
        MC_CHECK(mc_parallel_destroy(&ps1));
        mc_comm_destroy(one);
    }
    lab_meet_idle(cx, 0);
    MC_CHECK(lab_broadcast_bytes(cx->world, ref, ref_n * sizeof(float), 0));
    MC_CHECK(lab_broadcast_bytes(cx->world, st->loss_single, sizeof st->loss_single, 0));

    double vs_sync[2], vs_nosync[2];
    l07_train_tied(cx, 0, st->loss_sync, st->diff_sync, ref, vs_sync);
    l07_train_tied(cx, 1, st->loss_nosync, st->diff_nosync, ref, vs_nosync);
    free(ref);
    st->sync_first_vs_single = vs_sync[0], st->sync_last_vs_single = vs_sync[1];
    st->nosync_first_vs_single = vs_nosync[0], st->nosync_last_vs_single = vs_nosync[1];
    st->sync_vs_single_loss = l07_max_rel(st->loss_sync, st->loss_single, K);
    st->nosync_vs_single_loss = l07_max_rel(st->loss_nosync, st->loss_single, K);
    st->first_divergent_step = 0;
    for (int k = 0; k < K && !st->first_divergent_step; k++)
        if (st->diff_nosync[k] > 0) st->first_divergent_step = k + 1;
    if (cx->me != 0) return LAB_RAN;

    lab_printf0("step   max|W_first - W_last|            loss\n"
                "       synced      all-reduce skipped   synced     skipped    single rank\n");
    for (int k = 0; k < K; k++)
        lab_printf0("  %-3d  %-10.3g  %-19.6g  %-9.6f  %-9.6f  %.6f\n", k + 1, st->diff_sync[k],
                    st->diff_nosync[k], st->loss_sync[k], st->loss_nosync[k], st->loss_single[k]);
    lab_printf0("after %d steps, against the single-rank embedding: synced first %.2g, last %.2g;"
                " skipped first %.2g, last %.2g\n", K, vs_sync[0], vs_sync[1], vs_nosync[0],
                vs_nosync[1]);
    int zero_all = 1;
    for (int k = 0; k < K; k++) zero_all &= st->diff_sync[k] == 0.0;
    double atol = L07_WEIGHT_ATOL_PER_STEP * K;
    l07_check(cx, zero_all, "with the all-reduce the two copies stay identical after every step");
    l07_check(cx, st->first_divergent_step == 1 && st->diff_nosync[K - 1] > 0,
              "without it they differ from step 1 on (%.3g after step 1, %.3g after step %d)",
              st->diff_nosync[0], st->diff_nosync[K - 1], K);
    l07_check(cx, st->sync_vs_single_loss <= L07_LOSS_RTOL,
              "synced losses equal the single-rank run's (max rel diff %.1e)",
              st->sync_vs_single_loss);
    l07_check(cx, vs_sync[0] <= atol && vs_sync[1] <= atol,
              "synced, both copies equal the single-rank embedding within %.0e", atol);
    l07_check(cx, vs_nosync[0] > atol || vs_nosync[1] > atol,
              "skipped, the copies leave the single-rank embedding (by %.2g and %.2g)",
              vs_nosync[0], vs_nosync[1]);
    l07_check(cx, st->own_bucket_first == 1 && st->own_bucket_last == 1,
              "the word embedding and its copy each sit alone in a DDP bucket (the reduce-scatter "
              "shards line up, Megatron-LM #844)");
    l07_compared(cx, "zero, the single-rank run (losses and final embedding) and the DDP layout");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   E. the "all flags on" mistake: every stage builds embedding, final norm, output layer, loss */

/* The mistaken stage: this rank's TP group as a world of its own (PP = 1), the stage's two
   layers with pre_process and post_process both on; tied, its output layer reads its own word
   embedding. Every rank of the TP group calls it. */
static void l07_wrong_init(l07_run *w, mc_parallel_state *wps, const mc_parallel_state *ps,
                           int untied) {
    mc_comm *tpc = mc_parallel_group(ps, MC_GROUP_TP);
    mc_grid_desc gd = {.tp = tpc->size, .pp = 1};
    MC_CHECK(mc_parallel_init(wps, &(mc_parallel_desc){.world = tpc, .grid = gd}));
    l07_run_init(w, wps, untied, L07_M, 0, 0, L07_LAYERS_PER_STAGE, 0);   /* A's slots */
}

static void l07_wrong_free(l07_run *w, mc_parallel_state *wps) {
    l07_run_free(w);
    MC_CHECK(mc_parallel_destroy(wps));
}

/* One micro-batch's forward and backward through chunk 0, slot 0: tokens on a stage that
   embeds, an activation otherwise; labels and the loss on a stage that has the head, an
   output gradient otherwise. Returns what forward returned to send and backward to send back
   (non-NULL counts). */
static void l07_forward_backward(mc_gpt *g, const int *tokens, const int *labels,
                                 const void *d_in, const void *d_grad, int *sent, int *sent_back) {
    int pre = mc_gpt_is_pre_process(g, 0), post = mc_gpt_is_post_process(g, 0);
    float *out = NULL, *ig = NULL;
    MC_CHECK(mc_gpt_forward(g, 0, 0, pre ? tokens : NULL, post ? labels : NULL,
                            (const float *)d_in, &out, NULL));
    MC_CHECK(mc_gpt_backward(g, 0, 0, post ? NULL : (const float *)d_grad, 1.0f / (float)g->N,
                             &ig));
    if (sent) *sent = out != NULL;
    if (sent_back) *sent_back = ig != NULL;
}

/* The fastest of L07_TIME_REPS forward+backward passes after a warm-up one, in ms: the
   least disturbed by whatever else runs on the cores. */
static double l07_time_fb(mc_gpt *g, const int *tokens, const int *labels, const void *d_in,
                          const void *d_grad) {
    double best = INFINITY;
    for (int k = 0; k <= L07_TIME_REPS; k++) {
        double t0 = lab_now();
        l07_forward_backward(g, tokens, labels, d_in, d_grad, NULL, NULL);
        MC_CHECK(g->ops->synchronize(g->ops));
        double ms = (lab_now() - t0) * 1e3;
        if (k > 0 && ms < best) best = ms;
    }
    return best;
}

/* Whether a forward's result depends on the activation it was given: the output it would send
   (or the per-token losses on a stage that computes the loss) for two different inputs. */
static int l07_input_used(mc_gpt *g, const int *tokens, const int *labels, const void *d_a,
                          const void *d_b) {
    int pre = mc_gpt_is_pre_process(g, 0), post = mc_gpt_is_post_process(g, 0);
    size_t n = post ? (size_t)g->N : g->p2p_elems;
    float *res[2] = {lab_xcalloc(n, sizeof(float)), lab_xcalloc(n, sizeof(float))};
    for (int i = 0; i < 2; i++) {
        float *out = NULL;
        MC_CHECK(mc_gpt_forward(g, 0, 0, pre ? tokens : NULL, post ? labels : NULL,
                                (const float *)(i ? d_b : d_a), &out, NULL));
        const void *src = post ? (const void *)mc_gpt_losses(g, 0) : (const void *)out;
        MC_CHECK(g->ops->download(g->ops, res[i], src, n * sizeof(float)));
    }
    int used = memcmp(res[0], res[1], n * sizeof(float)) != 0;
    free(res[0]), free(res[1]);
    return used;
}

static int l07_run_e(lab_ctx *cx) {
    l07_state *st = cx->state;
    mc_gpt *g = &st->main.gpt;
    const mc_ops *o = g->ops;
    lab_heading(cx, "E. the \"all flags on\" mistake: every stage builds embedding, final norm "
                "and output layer");
    l07_run w;
    mc_parallel_state wps;
    l07_wrong_init(&w, &wps, &st->ps, 0);
    /* a micro-batch, two activations and an output gradient */
    int tokens[L07_N], labels[L07_N], text[L07_SEQ + 1];
    for (int j = 0; j < L07_MBS; j++) {
        l07_sample(7000 + j, text);
        for (int s = 0; s < L07_SEQ; s++)
            tokens[s * L07_MBS + j] = text[s], labels[s * L07_MBS + j] = text[s + 1];
    }
    size_t n = g->p2p_elems;
    float *h = lab_xcalloc(n, sizeof(float));
    void *d_a = l07_op_alloc(o, n * sizeof(float)), *d_b = l07_op_alloc(o, n * sizeof(float));
    void *d_grad = l07_op_alloc(o, n * sizeof(float));
    l07_fill_host(h, n, 2);
    MC_CHECK(o->upload(o, d_a, h, n * sizeof(float)));
    l07_fill_host(h, n, 3);
    MC_CHECK(o->upload(o, d_b, h, n * sizeof(float)));
    for (size_t i = 0; i < n; i++) h[i] *= 1e-3f;
    MC_CHECK(o->upload(o, d_grad, h, n * sizeof(float)));
    free(h);

    double *rec = st->rec;
    int sent = 0, sent_back = 0;
    rec[R_W_PARAMS] = (double)l07_numel(&w.gpt, 0, 0, NULL);
    rec[R_W_MEMORY] = (double)mc_gpt_memory(&w.gpt, NULL);
    l07_forward_backward(&w.gpt, tokens, labels, d_a, d_grad, &sent, &sent_back);
    rec[R_W_OUTPUT] = sent;
    rec[R_W_GRAD] = sent_back;
    rec[R_W_INPUT_USED] = l07_input_used(&w.gpt, tokens, labels, d_a, d_b);
    rec[R_INPUT_USED] =
        mc_gpt_is_pre_process(g, 0) ? -1 : l07_input_used(g, tokens, labels, d_a, d_b);
    /* timings one stage at a time, the other stages asleep (they would share the cores); a
       first pass warms every stage up, the second is kept */
    for (int s = 0; s < 2 * st->pp; s++) {
        if (st->ps.coords.pp == s % st->pp) {
            rec[R_FB_MS] = l07_time_fb(g, tokens, labels, d_a, d_grad);
            rec[R_W_FB_MS] = l07_time_fb(&w.gpt, tokens, labels, d_a, d_grad);
        }
        lab_meet_idle(cx, 0);
    }

    /* the real schedule with the mistaken stage on the first stage's ranks: it fails before
       any pipeline communication, so the other stages need not take part */
    int reporter = l07_rank_at(&st->ps.grid, 0, 0);
    cJSON *sched = NULL;
    if (st->ps.coords.pp == 0) {
        l07_run app;
        memset(&app, 0, sizeof app);
        app.ps = &st->ps;
        app.model = &w.gpt;
        app.m = 1;
        app.dp = st->dp;
        app.dp_rank = st->ps.coords.dp;
        mc_schedule_hooks hk;
        memset(&hk, 0, sizeof hk);
        hk.app = &app;
        hk.forward_step = l07_hook_forward;
        hk.backward_step = l07_hook_backward;
        hk.grad_sync = l07_hook_grad_sync;
        hk.tensor_elems = g->p2p_elems;   /* what the next stage waits for */
        int rc = mc_get_forward_backward_func(&st->ps)(&st->ps, &hk, 1, 0, &l07_result);
        if (cx->me == reporter) {
            sched = cJSON_CreateObject();
            cJSON_AddStringToObject(sched, "status", mc_err_name(rc));
            cJSON_AddStringToObject(sched, "message", rc == MC_OK ? "" : mc_last_error());
            cJSON_AddNumberToObject(sched, "tensor_elems_expected", (double)g->p2p_elems);
        }
    }
    cJSON *sj = lab_json_from_rank(cx, sched, reporter);
    MC_CHECK(mc_ops_free(o, d_a));
    MC_CHECK(mc_ops_free(o, d_b));
    MC_CHECK(mc_ops_free(o, d_grad));
    l07_wrong_free(&w, &wps);
    l07_gather(cx, st->all);
    if (cx->me != 0) {
        cJSON_Delete(sj);
        return LAB_RAN;
    }
    cJSON_Delete(st->e_schedule);
    st->e_schedule = sj;

    int pp = st->pp, tp = st->tp;
    long long total_extra = 0;
    int ok_counts = 1, ok_p2p = 1, ok_mem = 1;
    lab_printf0("stage  params/rank: right  all on  extra   memory KiB: right  all on   fwd+bwd "
                "ms: right  all on   sends act.  uses input  sends grad\n");
    for (int s = 0; s < pp; s++) {
        const double *q = l07_at(&st->ps.grid, st->all, s, 0);
        long long right = (long long)q[R_PARAMS], wrong = (long long)q[R_W_PARAMS];
        total_extra += wrong - right;
        lab_printf0("  %-4d %19lld %7lld %6lld %18.0f %7.0f %17.2f %7.2f   %-3s -> %-3s  "
                    "%-4s -> %-3s  %-3s -> %s\n", s, right, wrong, wrong - right,
                    q[R_MEMORY] / 1024.0, q[R_W_MEMORY] / 1024.0, q[R_FB_MS], q[R_W_FB_MS],
                    q[R_FWD_OUTPUT] > 0 ? "yes" : "no", q[R_W_OUTPUT] > 0 ? "yes" : "no",
                    q[R_INPUT_USED] < 0 ? "n/a" : q[R_INPUT_USED] > 0 ? "yes" : "no",
                    q[R_W_INPUT_USED] > 0 ? "yes" : "no", q[R_BWD_GRAD] > 0 ? "yes" : "no",
                    q[R_W_GRAD] > 0 ? "yes" : "no");
    }
    for (int r = 0; r < cx->world_size; r++) {
        const double *q = st->all + (size_t)r * R_COUNT;
        int s = (int)q[R_STAGE];
        ok_counts &=
            (long long)q[R_W_PARAMS] == l07_formula_params(tp, L07_LAYERS_PER_STAGE, 1, 1, 0);
        ok_mem &= q[R_W_MEMORY] > q[R_MEMORY] || (s == 0 && q[R_W_MEMORY] >= q[R_MEMORY]);
        ok_p2p &= q[R_W_OUTPUT] == 0 && q[R_W_GRAD] == 0 && q[R_W_INPUT_USED] == 0 &&
                  (s == 0 || q[R_INPUT_USED] == 1);
    }
    lab_printf0("extra parameters per TP rank over all stages: %lld (x TP = %lld in the model)\n",
                total_extra, total_extra * tp);
    l07_check(cx, ok_counts, "every mistaken stage holds the formula's count for a stage with "
              "both flags (%lld)", l07_formula_params(tp, L07_LAYERS_PER_STAGE, 1, 1, 0));
    l07_check(cx, ok_mem, "every stage holds more memory with both flags on (the first stage at "
              "least as much)");
    l07_check(cx, ok_p2p, "with both flags on no stage has an activation to send or an input "
              "gradient to send back, and the received activation changes nothing");
    const char *status = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(sj, "status"));
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(sj, "message"));
    lab_printf0("the schedule on stage 0 with both flags on: %s: %s\n", status ? status : "?",
                msg ? msg : "?");
    l07_check(cx, status && strcmp(status, "MC_ERR_STATE") == 0 && msg &&
                      strstr(msg, "returned no output to send") != NULL,
              "the schedule refuses the first stage's forward: nothing to send to stage 1");
    l07_compared(cx, "the formula for a stage with both flags, A's correct stages and B's P2P "
                 "contract");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   F. follow-up: another layout of the same ranks */

typedef struct l07_variant {
    int tp, pp, untied;
    const char *title;
} l07_variant;

static const l07_variant l07_variants[L07_N_VARIANTS] = {
    {1, 8, 0, "TP 1 x PP 8, tied embeddings"},
    {4, 2, 0, "TP 4 x PP 2, tied embeddings"},
    {2, 4, 1, "TP 2 x PP 4, untied embeddings"},
};

static int l07_run_f(lab_ctx *cx) {
    l07_state *st = cx->state;
    const l07_variant *v = &l07_variants[cx->variant - 1];
    lab_heading(cx, "F. follow-up %s: %s on the same %d ranks, probe rank %d", cx->variant_name,
                v->title, cx->world_size, cx->probe);
    mc_parallel_state psf;
    mc_grid_desc gd = {.tp = v->tp, .pp = v->pp};
    MC_CHECK(mc_parallel_init(&psf, &(mc_parallel_desc){.world = cx->world, .grid = gd}));
    l07_run r, w;
    mc_parallel_state wps;
    l07_run_init(&r, &psf, v->untied, L07_M, 0, 0, 0, 0);
    memset(st->rec, 0, sizeof st->rec);
    l07_record_model(st->rec, &psf, &r.gpt);
    l07_wrong_init(&w, &wps, &psf, v->untied);
    st->rec[R_W_PARAMS] = (double)l07_numel(&w.gpt, 0, 0, NULL);
    st->rec[R_W_MEMORY] = (double)mc_gpt_memory(&w.gpt, NULL);
    l07_wrong_free(&w, &wps);
    l07_run_free(&r);
    st->fu_tp = v->tp, st->fu_pp = v->pp, st->fu_untied = v->untied;
    st->fu_grid = psf.grid;
    st->fu_dp = psf.grid.dp;
    MC_CHECK(mc_parallel_destroy(&psf));
    l07_gather(cx, st->fu_all);
    if (cx->me != 0) return LAB_RAN;

    lab_printf0("stage  flags  input              params/rank  all flags on  extra\n");
    int ok_counts = 1, ok_flags = 1;
    for (int s = 0; s < v->pp; s++) {
        const double *q = l07_at(&st->fu_grid, st->fu_all, s, 0);
        lab_printf0("  %-4d %-5s  %-18s %11.0f %13.0f %6.0f\n", s,
                    l07_flags_word((int)q[R_PRE], (int)q[R_POST]),
                    q[R_PRE] > 0 ? "token ids [S,B]" : "activation [Ns,H]", q[R_PARAMS],
                    q[R_W_PARAMS], q[R_W_PARAMS] - q[R_PARAMS]);
    }
    for (int rk = 0; rk < cx->world_size; rk++) {
        const double *q = st->fu_all + (size_t)rk * R_COUNT;
        int s = (int)q[R_STAGE], pre = s == 0, post = s == v->pp - 1;
        ok_counts &= (long long)q[R_PARAMS] ==
                         l07_formula_params(v->tp, L07_LAYERS_PER_STAGE, pre, post, v->untied) &&
                     (long long)q[R_W_PARAMS] ==
                         l07_formula_params(v->tp, L07_LAYERS_PER_STAGE, 1, 1, v->untied);
        ok_flags &= (int)q[R_PRE] == pre && (int)q[R_POST] == post &&
                    q[R_PRE] == q[R_FIRST_STAGE] && q[R_POST] == q[R_LAST_STAGE];
    }
    const double *p = st->fu_all + (size_t)cx->probe * R_COUNT;
    lab_printf0("probe rank %d: stage %.0f, pre_process %s, post_process %s, %.0f parameters, "
                "%.0f with all flags on\n", cx->probe, p[R_STAGE], p[R_PRE] > 0 ? "true" : "false",
                p[R_POST] > 0 ? "true" : "false", p[R_PARAMS], p[R_W_PARAMS]);
    l07_check(cx, ok_flags, "pre_process / post_process equal is_first_stage / is_last_stage on "
              "every rank");
    l07_check(cx, ok_counts, "every rank's count, right and mistaken, equals the formula");
    l07_compared(cx, "the stage predicates and the formulas");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   facts */

static cJSON *l07_stage_json(const double *q, int pp, int tp, int untied) {
    cJSON *o = cJSON_CreateObject();
    int s = (int)q[R_STAGE];
    cJSON_AddNumberToObject(o, "stage", s);
    cJSON_AddStringToObject(o, "flags", l07_flags_word((int)q[R_PRE], (int)q[R_POST]));
    cJSON_AddBoolToObject(o, "pre_process", q[R_PRE] > 0);
    cJSON_AddBoolToObject(o, "post_process", q[R_POST] > 0);
    cJSON_AddBoolToObject(o, "is_first_stage", q[R_FIRST_STAGE] > 0);
    cJSON_AddBoolToObject(o, "is_last_stage", q[R_LAST_STAGE] > 0);
    cJSON_AddItemToObject(o, "modules", l07_modules_json(q));
    int layers[2] = {(int)q[R_FIRST_LAYER], (int)q[R_LAST_LAYER]};
    cJSON_AddItemToObject(o, "layers", lab_json_int_array(layers, 2));
    cJSON_AddNumberToObject(o, "params", q[R_PARAMS]);
    cJSON_AddNumberToObject(o, "params_formula",
                            (double)l07_formula_params(tp, L07_LAYERS_PER_STAGE, s == 0,
                                                       s == pp - 1, untied));
    cJSON_AddNumberToObject(o, "unsharded_params_without_tied_copy", q[R_GLOBAL_PARAMS]);
    cJSON_AddNumberToObject(o, "memory_bytes", q[R_MEMORY]);
    cJSON_AddNumberToObject(o, "activation_bytes", q[R_ACTIVATIONS]);
    cJSON_AddNumberToObject(o, "embedding_group_size", q[R_EMB_GROUP]);
    cJSON_AddStringToObject(o, "input", q[R_PRE] > 0 ? "tokens" : "activation");
    cJSON_AddStringToObject(o, "output", q[R_POST] > 0 ? "loss" : "activation");
    cJSON_AddNumberToObject(o, "all_flags_on_params", q[R_W_PARAMS]);
    cJSON_AddNumberToObject(o, "all_flags_on_extra_params", q[R_W_PARAMS] - q[R_PARAMS]);
    cJSON_AddNumberToObject(o, "all_flags_on_memory_bytes", q[R_W_MEMORY]);
    return o;
}

static cJSON *l07_steps_json(const double *v, int n, double scale) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(round(v[i] * scale) / scale));
    return a;
}

static cJSON *l07_facts(lab_ctx *cx) {
    l07_state *st = cx->state;
    const mc_grid *grid = &st->ps.grid;
    int pp = st->pp, tp = st->tp, K = st->steps;
    char key[16];
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "world", cx->world_size);
    cJSON *lay = cJSON_AddObjectToObject(f, "layout");
    cJSON_AddNumberToObject(lay, "tp", tp);
    cJSON_AddNumberToObject(lay, "pp", pp);
    cJSON_AddNumberToObject(lay, "dp", st->dp);
    cJSON *m = cJSON_AddObjectToObject(f, "model");
    cJSON_AddNumberToObject(m, "layers", L07_LAYERS_PER_STAGE * pp);
    cJSON_AddNumberToObject(m, "layers_per_stage", L07_LAYERS_PER_STAGE);
    cJSON_AddNumberToObject(m, "hidden", L07_HIDDEN);
    cJSON_AddNumberToObject(m, "heads", L07_HEADS);
    cJSON_AddNumberToObject(m, "ffn", L07_FFN);
    cJSON_AddNumberToObject(m, "vocab", L07_VOCAB);
    cJSON_AddNumberToObject(m, "padded_vocab",
                            mc_gpt_padded_vocab_size(L07_VOCAB, L07_VOCAB_DIV, tp));
    cJSON_AddNumberToObject(m, "seq_length", L07_SEQ);
    cJSON_AddNumberToObject(m, "micro_batch_size", L07_MBS);
    cJSON_AddNumberToObject(m, "microbatches", L07_M);
    cJSON_AddBoolToObject(m, "tied_embeddings", 1);

    /* A, B */
    cJSON *stages = cJSON_AddArrayToObject(f, "stages");
    cJSON *sp = cJSON_AddObjectToObject(f, "stage_params");
    cJSON *fl = cJSON_AddObjectToObject(f, "flags");
    long long b = st->p2p_bytes_per_mb;
    int heavy = 0;
    long long sum = 0, copy = 0;
    for (int s = 0; s < pp; s++) {
        const double *q = l07_at(grid, st->all, s, 0);
        cJSON *o = l07_stage_json(q, pp, tp, 0);
        cJSON *p2p = cJSON_AddObjectToObject(o, "p2p");
        cJSON_AddNumberToObject(p2p, "forward_sent_bytes", q[R_FWD_SENT]);
        cJSON_AddNumberToObject(p2p, "forward_received_bytes", q[R_FWD_RECV]);
        cJSON_AddNumberToObject(p2p, "backward_sent_bytes", q[R_BWD_SENT]);
        cJSON_AddNumberToObject(p2p, "backward_received_bytes", q[R_BWD_RECV]);
        cJSON_AddNumberToObject(p2p, "tensor_bytes", (double)b);
        cJSON_AddNumberToObject(p2p, "tensor_elems", q[R_P2P_ELEMS]);
        cJSON_AddBoolToObject(o, "reads_tokens", q[R_TOKENS] > 0);
        cJSON_AddBoolToObject(o, "reads_labels", q[R_LABELS] > 0);
        cJSON_AddNumberToObject(o, "forwards_with_received_input", q[R_FWD_INPUT]);
        cJSON_AddNumberToObject(o, "forwards_returning_output", q[R_FWD_OUTPUT]);
        cJSON_AddNumberToObject(o, "backwards_returning_input_grad", q[R_BWD_GRAD]);
        cJSON *mk = cJSON_AddObjectToObject(o, "all_flags_on");
        cJSON_AddBoolToObject(mk, "returns_activation_to_send", q[R_W_OUTPUT] > 0);
        cJSON_AddBoolToObject(mk, "received_activation_changes_result", q[R_W_INPUT_USED] > 0);
        cJSON_AddBoolToObject(mk, "returns_input_grad_to_send", q[R_W_GRAD] > 0);
        cJSON_AddNumberToObject(mk, "forward_backward_ms", lab_round_ms(q[R_W_FB_MS]));
        cJSON_AddNumberToObject(o, "forward_backward_ms", lab_round_ms(q[R_FB_MS]));
        if (q[R_INPUT_USED] >= 0)
            cJSON_AddBoolToObject(o, "received_activation_changes_result", q[R_INPUT_USED] > 0);
        cJSON_AddItemToArray(stages, o);
        snprintf(key, sizeof key, "s%d", s);
        cJSON_AddNumberToObject(sp, key, q[R_PARAMS]);
        cJSON_AddStringToObject(fl, key, l07_flags_word((int)q[R_PRE], (int)q[R_POST]));
        if (q[R_PARAMS] > l07_at(grid, st->all, heavy, 0)[R_PARAMS]) heavy = s;
        sum += (long long)q[R_GLOBAL_PARAMS];
        copy += (long long)q[R_SHARED_PARAMS];
    }
    cJSON_AddNumberToObject(f, "heaviest_stage", heavy);
    int light = 0;
    for (int s = 1; s < pp; s++)
        if (l07_at(grid, st->all, s, 0)[R_PARAMS] < l07_at(grid, st->all, light, 0)[R_PARAMS])
            light = s;
    cJSON_AddNumberToObject(f, "lightest_stage", light);
    cJSON_AddNumberToObject(f, "heaviest_over_lightest",
                            round(l07_at(grid, st->all, heavy, 0)[R_PARAMS] /
                                  l07_at(grid, st->all, light, 0)[R_PARAMS] * 1e3) / 1e3);
    cJSON_AddNumberToObject(f, "single_rank_params", (double)st->single_params);
    cJSON_AddNumberToObject(f, "unsharded_params_sum_without_tied_copy", (double)sum);
    cJSON_AddNumberToObject(f, "tied_copy_params", (double)copy);
    cJSON *eg = cJSON_AddArrayToObject(f, "embedding_groups");
    for (int gi = 0; gi < st->n_embedding_groups; gi++)
        cJSON_AddItemToArray(eg, lab_json_int_array(st->embedding_groups[gi], 2));
    cJSON_AddNumberToObject(f, "p2p_tensor_bytes", (double)b);
    cJSON_AddNumberToObject(f, "p2p_bytes_per_boundary_and_direction", (double)(L07_M * b));

    /* C */
    if (st->c_facts != NULL) {
        cJSON_AddItemToObject(f, "parallel_output", cJSON_Duplicate(st->c_facts, 1));
        cJSON *on = cJSON_AddObjectToObject(f, "logits_on");
        cJSON *off = cJSON_AddObjectToObject(f, "logits_off");
        cJSON_AddNumberToObject(on, "held", l07_num(st->c_facts, "on.held_bytes"));
        cJSON_AddNumberToObject(on, "moved", l07_num(st->c_facts, "on.logits_moved_bytes"));
        cJSON_AddNumberToObject(off, "held", l07_num(st->c_facts, "off.held_bytes"));
        cJSON_AddNumberToObject(off, "moved", l07_num(st->c_facts, "off.logits_moved_bytes"));
    }

    /* D */
    cJSON *t = cJSON_AddObjectToObject(f, "tied");
    cJSON_AddNumberToObject(t, "steps", K);
    cJSON_AddNumberToObject(t, "lr", round((double)L07_LR * 1e9) / 1e9);
    cJSON *teg = cJSON_AddArrayToObject(t, "embedding_groups");
    for (int gi = 0; gi < st->n_embedding_groups; gi++)
        cJSON_AddItemToArray(teg, lab_json_int_array(st->embedding_groups[gi], 2));
    cJSON *ts = cJSON_AddObjectToObject(t, "synced");
    cJSON_AddItemToObject(ts, "max_abs_diff_by_step", l07_steps_json(st->diff_sync, K, 1e9));
    cJSON_AddItemToObject(ts, "losses", l07_steps_json(st->loss_sync, K, 1e6));
    cJSON_AddNumberToObject(ts, "max_rel_loss_diff_vs_single_rank", st->sync_vs_single_loss);
    cJSON_AddNumberToObject(ts, "first_vs_single_rank_embedding", st->sync_first_vs_single);
    cJSON_AddNumberToObject(ts, "last_vs_single_rank_embedding", st->sync_last_vs_single);
    cJSON *tn = cJSON_AddObjectToObject(t, "skipped");
    cJSON_AddItemToObject(tn, "max_abs_diff_by_step", l07_steps_json(st->diff_nosync, K, 1e9));
    cJSON_AddItemToObject(tn, "losses", l07_steps_json(st->loss_nosync, K, 1e6));
    cJSON_AddNumberToObject(tn, "max_rel_loss_diff_vs_single_rank", st->nosync_vs_single_loss);
    cJSON_AddNumberToObject(tn, "first_vs_single_rank_embedding", st->nosync_first_vs_single);
    cJSON_AddNumberToObject(tn, "last_vs_single_rank_embedding", st->nosync_last_vs_single);
    cJSON *t1 = cJSON_AddObjectToObject(t, "single_rank");
    cJSON_AddItemToObject(t1, "losses", l07_steps_json(st->loss_single, K, 1e6));
    cJSON_AddNumberToObject(t, "first_divergent_step", st->first_divergent_step);
    cJSON_AddBoolToObject(t, "embedding_alone_in_its_ddp_bucket",
                          st->own_bucket_first == 1 && st->own_bucket_last == 1);
    cJSON *td = cJSON_AddObjectToObject(f, "tied_diff");
    int zero = 1;
    for (int k = 0; k < K; k++) zero &= st->diff_sync[k] == 0.0;
    cJSON_AddStringToObject(td, "synced", zero ? "zero" : "nonzero");
    cJSON_AddStringToObject(td, "skipped", st->diff_nosync[K - 1] == 0.0 ? "zero" : "nonzero");
    cJSON_AddNumberToObject(f, "skipped_max_diff_step1", round(st->diff_nosync[0] * 1e9) / 1e9);

    /* E */
    cJSON *e = cJSON_AddObjectToObject(f, "mistake");
    long long extra = 0;
    for (int s = 0; s < pp; s++) {
        const double *q = l07_at(grid, st->all, s, 0);
        extra += (long long)(q[R_W_PARAMS] - q[R_PARAMS]);
    }
    cJSON_AddNumberToObject(e, "extra_params_per_tp_rank", (double)extra);
    cJSON_AddNumberToObject(e, "extra_params_model", (double)(extra * tp));
    cJSON_AddNumberToObject(e, "all_flags_on_stage_params",
                            (double)l07_formula_params(tp, L07_LAYERS_PER_STAGE, 1, 1, 0));
    if (st->e_schedule != NULL)
        cJSON_AddItemToObject(e, "schedule_on_first_stage", cJSON_Duplicate(st->e_schedule, 1));

    /* F */
    cJSON *fu = cJSON_AddObjectToObject(f, "followup");
    cJSON_AddStringToObject(fu, "variant", cx->variant_name);
    cJSON_AddNumberToObject(fu, "tp", st->fu_tp);
    cJSON_AddNumberToObject(fu, "pp", st->fu_pp);
    cJSON_AddNumberToObject(fu, "dp", st->fu_dp);
    cJSON_AddBoolToObject(fu, "tied_embeddings", !st->fu_untied);
    cJSON *fst = cJSON_AddArrayToObject(fu, "stages");
    int fheavy = 0, flight = 0;
    for (int s = 0; s < st->fu_pp; s++) {
        const double *q = l07_at(&st->fu_grid, st->fu_all, s, 0);
        cJSON_AddItemToArray(fst, l07_stage_json(q, st->fu_pp, st->fu_tp, st->fu_untied));
        if (q[R_PARAMS] > l07_at(&st->fu_grid, st->fu_all, fheavy, 0)[R_PARAMS]) fheavy = s;
        if (q[R_PARAMS] < l07_at(&st->fu_grid, st->fu_all, flight, 0)[R_PARAMS]) flight = s;
    }
    cJSON_AddNumberToObject(fu, "heaviest_stage", fheavy);
    double fh = l07_at(&st->fu_grid, st->fu_all, fheavy, 0)[R_PARAMS];
    double flo = l07_at(&st->fu_grid, st->fu_all, flight, 0)[R_PARAMS];
    cJSON_AddNumberToObject(fu, "heaviest_over_lightest", round(fh / flo * 1e3) / 1e3);
    const double *p = st->fu_all + (size_t)cx->probe * R_COUNT;
    cJSON_AddNumberToObject(fu, "probe_rank", cx->probe);
    cJSON_AddNumberToObject(fu, "probe_stage", p[R_STAGE]);
    cJSON *pf = cJSON_AddObjectToObject(fu, "probe_flags");
    cJSON_AddBoolToObject(pf, "pre_process", p[R_PRE] > 0);
    cJSON_AddBoolToObject(pf, "post_process", p[R_POST] > 0);
    cJSON_AddStringToObject(fu, "probe_input", p[R_PRE] > 0 ? "tokens" : "activation");
    cJSON_AddNumberToObject(fu, "probe_params", p[R_PARAMS]);
    cJSON_AddNumberToObject(fu, "probe_all_flags_on_params", p[R_W_PARAMS]);
    cJSON_AddNumberToObject(fu, "mistake_extra_params", p[R_W_PARAMS] - p[R_PARAMS]);
    return f;
}

/* ---------------------------------------------------------------------------------------------
   the spec */

static int l07_check_world(const lab_ctx *cx, char *why, size_t cap) {
    const mc_grid_desc *d = &cx->grid.desc;
    int N = cx->world_size;
    if (N != 8 && N != 16) {
        snprintf(why, cap, "needs 8 or 16 ranks (PP 4 x TP 2 with DP 1 or 2; the follow-up "
                 "layouts hold 8 ranks each): got %d ranks; try mpirun -np 8", N);
        return 1;
    }
    if (d->pp < 3 || d->pp > L07_MAX_PP) {
        snprintf(why, cap, "needs a pipeline of 3 to %d stages, so that some stage has neither "
                 "pre_process nor post_process: got --pp %d; try --pp 4", L07_MAX_PP, d->pp);
        return 1;
    }
    if (L07_HEADS % d->tp != 0) {
        snprintf(why, cap, "needs --tp to divide the model's %d attention heads: got --tp %d",
                 L07_HEADS, d->tp);
        return 1;
    }
    if (d->vpp > 1 || d->cp > 1 || d->ep > 1) {
        snprintf(why, cap, "builds one model chunk per stage without CP or EP: run it without "
                 "--vpp, --cp or --ep");
        return 1;
    }
    return 0;
}

static int l07_setup(lab_ctx *cx) {
    l07_state *st = cx->state;
    const char *v = lab_flag_value(cx, "--steps");
    int k = v ? atoi(v) : (cx->args->quick ? 2 : L07_STEPS);
    st->steps = k < 1 ? 1 : k > L07_MAX_STEPS ? L07_MAX_STEPS : k;
    st->tp = cx->grid.desc.tp;
    st->pp = cx->grid.desc.pp;
    st->dp = cx->grid.dp;
    st->all = lab_xcalloc((size_t)cx->world_size * R_COUNT, sizeof(double));
    st->fu_all = lab_xcalloc((size_t)cx->world_size * R_COUNT, sizeof(double));
    return LAB_RAN;
}

static void l07_cleanup(lab_ctx *cx) {
    l07_state *st = cx->state;
    l07_run_free(&st->main);
    if (st->have_ps) MC_CHECK(mc_parallel_destroy(&st->ps));
    st->have_ps = 0;
    free(st->all), free(st->fu_all);
    st->all = st->fu_all = NULL;
    cJSON_Delete(st->c_facts), cJSON_Delete(st->e_schedule);
    st->c_facts = st->e_schedule = NULL;
}

static const lab_flag l07_flags[] = {{"--steps", 1}};

static const char l07_summary[] =
    "GPTModel's pre_process, post_process and parallel_output on PP 4 x TP 2: what each stage\n"
    "builds and holds, what crosses each stage boundary, the logits held and moved with the\n"
    "output split over the vocabulary or gathered, the tied embedding's two copies with and\n"
    "without the embedding-group all-reduce, and what \"all flags on\" costs and breaks.";

static const char l07_usage[] =
    "  --steps K          AdamW steps of the tied-embedding experiment (default 5, --quick 2)\n";

static const lab_experiment l07_experiments[] = {
    {"setup", l07_setup}, {"A", l07_run_a}, {"B", l07_run_b}, {"C", l07_run_c},
    {"D", l07_run_d},     {"E", l07_run_e}, {"F", l07_run_f},
};

static const lab_spec l07_spec = {
    .name = "lab07",
    .question = "M007",
    .title = "pre_process, post_process and parallel_output",
    .summary = l07_summary,
    .usage = l07_usage,
    .flags = l07_flags,
    .n_flags = 1,
    .default_world = 8,
    .sizes = {.tp = 2, .pp = 4},
    .min_world = 8,
    .max_world = L07_MAX_WORLD,
    .check_world = l07_check_world,
    .call_timeout_s = 60.0,
    .n_variants = L07_N_VARIANTS,
    .experiments = l07_experiments,
    .n_experiments = (int)(sizeof l07_experiments / sizeof l07_experiments[0]),
    .state_size = sizeof(l07_state),
    .facts = l07_facts,
    .cleanup = l07_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &l07_spec); }
