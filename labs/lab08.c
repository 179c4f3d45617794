/* labs/lab08.c - M008: one Megatron training iteration, stage by stage, on a timeline.

       make lab08 && mpirun --oversubscribe -np 8 ./lab08      (as root add --allow-run-as-root)

   Default world 8 = TP 2 x PP 2 x DP 2 with sequence parallelism, the distributed optimizer,
   overlapped DP gradient reduction and tied embeddings: every kind of gradient sync of a dense
   GPT happens in one iteration. The library records what it does on a timeline
   (megatron_c.h >>core.timeline: each schedule op, collective, wait and phase of
   finalize_model_grads and the optimizer, with the host's call and return times and the time
   the work completed); this file adds its own phases (get_batch, logging, checkpoint).

   Experiments (every rank takes part; rank 0 prints; the driver does the answer sheet, the
   results and the grading):
     A. the iteration: three training iterations, the third one recorded on the timeline, with
        a log line after each and a checkpoint after the third. From each rank's timeline: the
        stage order, the warm-up forwards of each stage, where grad sync was switched on, the
        DP buckets launched inside the backward of the last micro-batch, how many were still
        in flight when the last backward returned, how long finish_grad_sync waited, the steps
        of finalize_model_grads and of the optimizer. Drawn as one SVG per rank. Compared with:
        mc_schedule_ops (the op-table generator) for the trace and the warm-up, the bucket
        table for the launches, Megatron's train_step / finalize_model_grads order, the
        single-rank run of the same model and data for every loss, bit equality of the DP
        replicas and of the tied embedding copies, and the checkpoint read back.
     B. the special gradient syncs: the same layout with plain DDP (all-reduce, overlap off),
        iteration 1 probed at the start and at the end of finalize_model_grads: the
        sequence-parallel LayerNorm (and row-parallel bias) grads and the tied word-embedding
        grads before and after their syncs, against the single-rank run's grads.
     C. the broken mode: the optimizer reads the grads before finish_grad_sync (the library's
        fault hook mc_fault_finalize_skip_grad_sync, compiled into this lab only). K steps with
        plain DDP and with the distributed optimizer; the divergence between DP replicas
        (max |param difference|) and the distance from the correct run; with plain DDP each
        replica is compared with a single-rank run on that replica's samples alone.
     F. follow-up (variant from the nonce): two iterations of A's layout with another DDP
        setting (small buckets, one bucket per chunk, or overlap off), read on the probe rank:
        launches during backward, buckets outstanding when backward returned, the waits, the
        param all-gather against the next forward.

   On the CPU backends a call's work has finished when it returns, except async collectives,
   whose completion is seen when a wait finds them done. With an op table and communicators
   that record completion markers (CUDA events, see mc_ops.mark_record), t_complete is the
   stream's completion and the SVGs show how long work ran after the host had moved on. */
#include "lab_driver.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
   sizes */

#define L8_LAYERS 4
#define L8_HIDDEN 32
#define L8_HEADS 4
#define L8_FFN 64
#define L8_SEQ 16              /* divisible by TP: sequence parallelism splits it */
#define L8_VOCAB 64
#define L8_MBS 1
#define L8_M 4                 /* micro-batches per DP rank per iteration */
#define L8_ITERS 3             /* A: iterations (the last recorded); C: steps of each run */
#define L8_BUCKET 2048         /* A and C: DDP bucket size in elements */
#define L8_LR 3e-3f
#define L8_CLIP 0.5f           /* clip_grad: small enough that this model's grads get clipped */
#define L8_SEED 1234
#define L8_DATA_SEED 20261208ull
#define L8_EVENTS (1 << 14)    /* timeline ring */
#define L8_MAX_WORLD 16
#define L8_MAX_TRACE 64
#define L8_MAX_EMB (L8_VOCAB * L8_HIDDEN)
#define L8_MAX_SP 1024         /* sequence-parallel grad elements of one stage */
#define L8_N_VARIANTS 3
#define L8_LOSS_RTOL 1e-5      /* loss against the single-rank run, relative */
/* Parameters against a single-rank run, absolute: the two runs add the same gradients in
   another order and Adam turns the rounding of a near-zero gradient into a step of up to lr
   per iteration. */
#define L8_PARAM_ATOL (1e-4 * L8_ITERS)
#define L8_GRAD_RTOL 1e-4      /* a finalized grad against the single-rank grad (relative to
                                  the tensor's largest element) */

/* ---------------------------------------------------------------------------------------------
   data: sample k is a token chain (next = 5 prev + 3 mod V, one token in eight random) */

static void l8_text(long long k, int *text /* [L8_SEQ + 1] */) {
    uint64_t offset = (uint64_t)k * (uint64_t)(2 * (L8_SEQ + 1));
    text[0] = (int)(mc_rng_bits_at(L8_DATA_SEED, offset) % L8_VOCAB);
    for (int t = 1; t <= L8_SEQ; t++) {
        uint32_t r = mc_rng_bits_at(L8_DATA_SEED, offset + (uint64_t)t);
        text[t] = r % 8 == 0 ? (int)(r / 8 % L8_VOCAB) : (text[t - 1] * 5 + 3) % L8_VOCAB;
    }
}

/* ---------------------------------------------------------------------------------------------
   one training setup on this rank (Megatron's model, DDP, optimizer and train_step) */

typedef struct l8_setup {
    int distributed_optimizer;
    int overlap;                  /* overlap_grad_reduce */
    size_t bucket_size;           /* elements; 0 = one bucket per chunk */
    int sp;                       /* sequence parallelism (needs TP > 1) */
    /* data: micro-batch mb of iteration it holds the samples
       it * gbs + (mb * data_dp + data_rank) * MBS + j, j < MBS */
    int m, gbs, data_dp, data_rank;
} l8_setup;

/* What the finalize hook saw when it was called, right after the last backward returned. */
typedef struct l8_at_finalize {
    int launched, waited, synced;    /* DDP bucket events so far */
    int in_flight;                   /* launched and not waited */
    int teardown_tried, teardown_status;
    char teardown_message[200];
} l8_at_finalize;

/* Experiment B's probe: grads copied at the start and the end of finalize_model_grads. */
typedef struct l8_grad_probe {
    int on;
    int n_sp;                        /* sequence-parallel grad elements on this rank */
    float sp_before[L8_MAX_SP], sp_after[L8_MAX_SP];
    int n_emb;                       /* tied-embedding grad elements (0 off the end stages) */
    float emb_before[L8_MAX_EMB], emb_after[L8_MAX_EMB];
} l8_grad_probe;

typedef struct l8_app {
    l8_setup s;
    mc_parallel_state *ps;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int ready;
    int first, last, tp_rank, pp_rank, dp_rank;
    int iteration;                   /* iterations done */
    int tokens[L8_SEQ * L8_MBS], labels[L8_SEQ * L8_MBS];
    mc_schedule_hooks hooks;
    mc_schedule_result *res;
    int broken;                      /* C: the fault is on for this run */
    int teardown_probe;              /* A: try mc_ddp_destroy when the last backward returned */
    l8_at_finalize at_finalize;
    l8_grad_probe *probe;            /* B, or NULL */
    float *host;                     /* (table.total) host copy of params or grads */
    double loss[L8_ITERS + 2];       /* global lm loss per iteration */
} l8_app;

static int l8_hook_forward(void *user, int chunk, int microbatch, const float *input,
                           float **output, double *loss_sum, double *num_tokens) {
    l8_app *a = (l8_app *)user;
    int text[L8_SEQ + 1];
    long long span = mc_timeline_begin("get_batch", microbatch);   /* Megatron's get_batch */
    for (int j = 0; j < L8_MBS; j++) {
        long long k = (long long)a->iteration * a->s.gbs +
                      ((long long)microbatch * a->s.data_dp + a->s.data_rank) * L8_MBS + j;
        l8_text(k, text);
        for (int t = 0; t < L8_SEQ; t++) {
            a->tokens[t * L8_MBS + j] = text[t];
            a->labels[t * L8_MBS + j] = text[t + 1];
        }
    }
    mc_timeline_end(span, NULL);
    return mc_gpt_forward_step(&a->gpt, chunk, microbatch, a->tokens, a->labels, input, output,
                               loss_sum, num_tokens);
}

static int l8_hook_backward(void *user, int chunk, int microbatch, const float *output_grad,
                            float loss_scale, float **input_grad) {
    l8_app *a = (l8_app *)user;
    return mc_gpt_backward_step(&a->gpt, chunk, microbatch, output_grad, loss_scale, input_grad);
}

static void l8_hook_grad_sync(void *user, int chunk, int enable) {
    l8_app *a = (l8_app *)user;
    mc_gpt_set_grad_sync(&a->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&a->ddp, chunk, enable);
}

static void l8_grad_ready(void *user, int param) {
    mc_ddp_register_grad_ready((mc_ddp *)user, param);
}

/* Copies the sequence-parallel grads and the tied embedding's grad of this rank. */
static void l8_probe_copy(l8_app *a, float *sp, float *emb) {
    const mc_param_table *t = &a->gpt.table;
    const mc_ops *o = a->gpt.ops;
    int at = 0;
    for (int i = 0; i < t->count; i++) {
        const mc_param_info *p = &t->info[i];
        if (p->sequence_parallel && at + (int)p->numel <= L8_MAX_SP) {
            MC_CHECK(o->download(o, sp + at, a->gpt.grads + p->offset, p->numel * sizeof(float)));
            at += (int)p->numel;
        }
        if (p->shared_embedding && p->numel <= L8_MAX_EMB)
            MC_CHECK(o->download(o, emb, a->gpt.grads + p->offset, p->numel * sizeof(float)));
    }
}

static int l8_hook_finalize(void *user) {
    l8_app *a = (l8_app *)user;
    l8_at_finalize *f = &a->at_finalize;
    memset(f, 0, sizeof *f);
    for (int e = 0; e < a->ddp.n_events; e++) {
        f->launched += a->ddp.events[e].kind == MC_DDP_LAUNCH;
        f->waited += a->ddp.events[e].kind == MC_DDP_WAIT;
        f->synced += a->ddp.events[e].kind == MC_DDP_SYNC;
    }
    f->in_flight = f->launched - f->waited;
    if (a->teardown_probe && f->in_flight > 0) {
        /* what tearing the DDP down (or zeroing its grads) would do now: refused while a
           bucket's collective is in flight; nothing is freed */
        f->teardown_tried = 1;
        f->teardown_status = mc_ddp_destroy(&a->ddp);
        snprintf(f->teardown_message, sizeof f->teardown_message, "%s", mc_last_error());
    }
    if (a->probe && a->probe->on) l8_probe_copy(a, a->probe->sp_before, a->probe->emb_before);
    int rc = mc_finalize_model_grads(a->ps, &a->ddp, NULL, NULL, a->s.sp, NULL);
    if (rc == MC_OK && a->probe && a->probe->on)
        l8_probe_copy(a, a->probe->sp_after, a->probe->emb_after);
    return rc;
}

static mc_gpt_config l8_config(int tp, int pp, int sp) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = L8_LAYERS;
    c.hidden_size = L8_HIDDEN;
    c.num_attention_heads = L8_HEADS;
    c.ffn_hidden_size = L8_FFN;
    c.vocab_size = L8_VOCAB;
    c.make_vocab_size_divisible_by = 8;
    c.seq_length = L8_SEQ;
    c.max_position_embeddings = L8_SEQ;
    c.micro_batch_size = L8_MBS;
    c.init_method_std = 0.05f;
    c.hidden_dropout = MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    c.tensor_model_parallel_size = tp;
    c.pipeline_model_parallel_size = pp;
    c.sequence_parallel = sp;
    c.seed = L8_SEED;
    return c;
}

static void l8_app_init(l8_app *a, mc_parallel_state *ps, const l8_setup *s) {
    memset(a, 0, sizeof *a);
    a->s = *s;
    a->ps = ps;
    a->res = lab_xcalloc(1, sizeof *a->res);   /* a large trace: off the stack */
    a->first = mc_parallel_is_first_stage(ps, 1);
    a->last = mc_parallel_is_last_stage(ps, 1);
    a->tp_rank = mc_parallel_rank(ps, MC_GROUP_TP);
    a->pp_rank = mc_parallel_rank(ps, MC_GROUP_PP);
    a->dp_rank = mc_parallel_rank(ps, MC_GROUP_DP);
    mc_schedule_desc sd = {.pp = ps->grid.desc.pp, .pp_rank = a->pp_rank,
                           .num_microbatches = s->m};
    mc_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.config = l8_config(ps->grid.desc.tp, ps->grid.desc.pp, s->sp);
    gd.ps = ps;
    gd.ops = mc_comm_memory(ps->world);   /* the CPU table, or the CUDA one (--device cuda) */
    gd.n_slots = mc_schedule_max_in_flight(&sd, NULL);
    gd.distributed_optimizer = s->distributed_optimizer;
    gd.bucket_size = s->bucket_size;
    MC_CHECK(mc_gpt_init(&a->gpt, &gd));
    mc_ddp_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.table = &a->gpt.table;
    dd.grads = a->gpt.grads;
    dd.dp = mc_parallel_group(ps, MC_GROUP_DP_CP);
    dd.distributed_optimizer = s->distributed_optimizer;
    dd.overlap_grad_reduce = s->overlap;
    dd.ops = a->gpt.ops;
    MC_CHECK(mc_ddp_init(&a->ddp, &dd));
    if (s->overlap) a->gpt.grad_ready = l8_grad_ready, a->gpt.grad_ready_user = &a->ddp;
    mc_optimizer_desc od;
    memset(&od, 0, sizeof od);
    od.ddp = &a->ddp;
    od.params = a->gpt.params;
    od.ps = ps;
    od.ops = a->gpt.ops;
    od.lr = L8_LR;
    od.lr_decay_style = MC_LR_DECAY_CONSTANT;
    od.clip_grad = L8_CLIP;
    MC_CHECK(mc_optimizer_init(&a->opt, &od));
    memset(&a->hooks, 0, sizeof a->hooks);
    a->hooks.app = a;
    a->hooks.forward_step = l8_hook_forward;
    a->hooks.backward_step = l8_hook_backward;
    a->hooks.grad_sync = l8_hook_grad_sync;
    a->hooks.finalize = l8_hook_finalize;
    a->hooks.tensor_elems = a->gpt.p2p_elems;
    a->hooks.clock = NULL;
    a->host = lab_xcalloc(a->gpt.table.total, sizeof(float));
    a->ready = 1;
}

static void l8_app_free(l8_app *a) {
    if (!a->ready) return;
    mc_optimizer_destroy(&a->opt);
    MC_CHECK(mc_ddp_destroy(&a->ddp));
    mc_gpt_destroy(&a->gpt);
    free(a->host);
    free(a->res);
    a->ready = 0;
}

/* The clock of the schedule's own trace: the timeline's (one time base for both). */
static double l8_clock(void *app) {
    (void)app;
    return mc_timeline_now();
}

/* Megatron's training_log: the lm loss over the global batch (the last stages' sums reduced
   over the world, read on the host), the grad norm and the learning rate. */
static double l8_log(l8_app *a, int print) {
    long long span = mc_timeline_begin("logging", a->iteration);
    double mine[2] = {0.0, 0.0}, all[2];
    if (a->last && a->tp_rank == 0) mine[0] = a->res->loss_sum, mine[1] = a->res->num_tokens;
    MC_CHECK(mc_host_collective(a->ps->world, MC_COLL_ALL_REDUCE, mine, all, 2, MC_F64, MC_SUM,
                                0));
    double loss = all[1] > 0 ? all[0] / all[1] : 0.0;
    if (print)
        lab_printf0("  iteration %d | lm loss %.6f | grad norm %.4f | clip coeff %.3f | lr %.1e\n",
                    a->iteration, loss, a->opt.last_grad_norm, (double)a->opt.last_clip_coeff,
                    (double)a->opt.last_lr);
    mc_timeline_end(span, NULL);
    return loss;
}

/* One train_step: zero the grads, the schedule (forward, backward, finalize), the optimizer
   step; in the broken mode the wait for the DP collectives comes after the step. */
static void l8_step(l8_app *a, int print_log) {
    long long span = mc_timeline_begin("zero_grad", a->iteration + 1);
    MC_CHECK(mc_ddp_zero_grad(&a->ddp));
    MC_CHECK(mc_gpt_zero_grad(&a->gpt));
    mc_timeline_end(span, a->gpt.ops);
    mc_fault_finalize_skip_grad_sync(a->broken);
    int rc = mc_get_forward_backward_func(a->ps)(a->ps, &a->hooks, a->s.m, 0, a->res);
    mc_fault_finalize_skip_grad_sync(0);
    MC_CHECK(rc);
    rc = mc_optimizer_step(&a->opt);
    if (rc != MC_ERR_STATE) MC_CHECK(rc);   /* a non-finite grad norm skips the step */
    if (a->broken) MC_CHECK(mc_ddp_finish_grad_sync(&a->ddp));   /* too late: closes them */
    a->iteration++;
    a->loss[a->iteration - 1] = l8_log(a, print_log);
}

static const float *l8_params(l8_app *a) {
    MC_CHECK(a->gpt.ops->download(a->gpt.ops, a->host, a->gpt.params,
                                  a->gpt.table.total * sizeof(float)));
    return a->host;
}

static double l8_max_abs_diff(const float *x, const float *y, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)y[i]);
        if (d != d) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* The local TP shard [rows, cols] of a param of the single-rank model, as this rank holds it
   (dim-0 splits take rows tp_rank * rows .., dim-1 splits columns). */
static void l8_ref_shard(const mc_param_info *mine, const float *ref_full, int ref_cols,
                         int tp_rank, float *out) {
    int rows = mine->local_shape[0], cols = mine->ndim == 2 ? mine->local_shape[1] : 1;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            int gr = mine->partition_dim == 0 ? tp_rank * rows + r : r;
            int gc = mine->partition_dim == 1 ? tp_rank * cols + c : c;
            out[r * cols + c] = ref_full[gr * ref_cols + gc];
        }
}

/* Max |x - ref| over the params of this rank, each against the same-named param of the
   single-rank model (the tied output copy against the word embedding). */
static double l8_diff_vs_ref(l8_app *a, const float *mine, l8_app *ref, const float *ref_host) {
    const mc_param_table *t = &a->gpt.table, *rt = &ref->gpt.table;
    double worst = 0.0;
    for (int i = 0; i < t->count; i++) {
        const mc_param_info *p = &t->info[i];
        const char *name = p->shared ? MC_CKPT_TIED_KEY : p->name;
        int j = mc_param_table_find(rt, name);
        if (j < 0) return INFINITY;
        const mc_param_info *q = &rt->info[j];
        float *shard = lab_xcalloc(p->numel, sizeof(float));
        l8_ref_shard(p, ref_host + q->offset, q->ndim == 2 ? q->local_shape[1] : 1, a->tp_rank,
                     shard);
        double d = l8_max_abs_diff(mine + p->offset, shard, p->numel);
        free(shard);
        if (d > worst) worst = d;
    }
    return worst;
}

/* Max |x - y| over the params of two models of the same layout sizes (TP, PP), by name: their
   flat buffers may be laid out differently (the distributed optimizer pads buckets). */
static double l8_diff_by_name(l8_app *a, const float *xa, l8_app *b, const float *xb) {
    const mc_param_table *t = &a->gpt.table, *u = &b->gpt.table;
    double worst = 0.0;
    for (int i = 0; i < t->count; i++) {
        int j = mc_param_table_find(u, t->info[i].name);
        if (j < 0 || u->info[j].numel != t->info[i].numel) return INFINITY;
        double d = l8_max_abs_diff(xa + t->info[i].offset, xb + u->info[j].offset,
                                   t->info[i].numel);
        if (d > worst) worst = d;
    }
    return worst;
}

/* Max |param difference| between this rank and the ranks holding the same shard in the other
   DP replicas, over the world (collective). */
static double l8_dp_divergence(lab_ctx *cx, l8_app *a) {
    mc_comm *dp = mc_parallel_group(a->ps, MC_GROUP_DP);
    size_t n = a->gpt.table.total;
    const float *mine = l8_params(a);
    double *me = lab_xcalloc(n, sizeof(double)), *all;
    int size = dp->size;
    for (size_t i = 0; i < n; i++) me[i] = mine[i];
    all = lab_xcalloc(n * (size_t)size, sizeof(double));
    MC_CHECK(lab_all_gather_f64(dp, me, all, n));
    double worst = 0.0, out = 0.0;
    for (int r = 1; r < size; r++)
        for (size_t i = 0; i < n; i++) {
            double d = fabs(all[i] - all[(size_t)r * n + i]);
            if (d > worst || d != d) worst = d != d ? INFINITY : d;
        }
    free(me);
    free(all);
    MC_CHECK(lab_all_reduce_f64(cx->world, &worst, &out, 1, MC_MAX));
    return out;
}

/* ---------------------------------------------------------------------------------------------
   state */

/* One rank's recorded iteration, read from its timeline. All doubles (gathered as such);
   times in ms from the moment every rank left the barrier before the iteration. */
typedef struct l8_sum {
    double rank, stage, tp, dp, n_events, dropped;
    double forwards, backwards, warmup, forwards_before_backward, trace_ok, grad_sync_marks;
    double grad_sync_before_last_ok;
    double buckets, launched_in_backward, launched_in_finish, launched_last_mb, waits;
    double wait_ms, in_flight_at_backward_return;
    double last_backward_return_ms, last_dp_complete_ms, first_forward_ms;
    double tp_collectives, p2p_calls, dp_bytes;
    double stage_ms[5];          /* forward_backward, finalize, optimizer, logging, checkpoint */
    double finalize_ms[3];       /* dp_grad_sync, layernorm_grad_sync, embedding_grad_sync */
    double optimizer_ms[5];      /* grad_norm, clip_grads, adamw_update, param_all_gather,
                                    lr_scheduler */
    double times_consistent;     /* t_call <= t_return (<= t_complete where known) everywhere */
    double param_gather_end_ms, next_forward_ms;   /* F: iteration 1's gather, 2's forward */
    double param_gather_span_end_ms;   /* F: the span's completion (device: its queued work) */
    double clipped;
    double teardown_tried, teardown_refused;
    double iteration_ms;
} l8_sum;

#define L8_SUM_DOUBLES ((int)(sizeof(l8_sum) / sizeof(double)))

static const char *const l8_stage_names[5] = {"forward_backward", "finalize_model_grads",
                                              "optimizer_step", "logging", "checkpoint"};
static const char *const l8_finalize_names[3] = {"dp_grad_sync", "layernorm_grad_sync",
                                                 "embedding_grad_sync"};
static const char *const l8_finalize_spans[3] = {"finish_grad_sync", "sp_grad_all_reduce",
                                                 "embedding_grad_all_reduce"};
static const char *const l8_optimizer_names[5] = {"grad_norm", "clip_grads", "adamw_update",
                                                  "param_all_gather", "lr_scheduler"};
static const char *const l8_optimizer_spans[5] = {"grad_norm", "clip_grads", "adamw",
                                                  "param_all_gather", "lr_scheduler_step"};

typedef struct l8_variant {
    const char *title;
    size_t bucket_size;
    int overlap;
} l8_variant;

static const l8_variant l8_variants[L8_N_VARIANTS] = {
    {"small buckets (512 elements), overlap on", 512, 1},
    {"one bucket per model chunk, overlap on", 0, 1},
    {"overlap_grad_reduce off", L8_BUCKET, 0},
};

typedef struct l8_state {
    mc_parallel_state ps;
    mc_comm *self_world;
    mc_parallel_state self_ps;
    int tp, pp, dp, stage, dp_rank, tp_rank;
    int n_buckets;                      /* this rank, A's layout */
    /* A */
    double a_loss[L8_ITERS], ref_loss[L8_ITERS + 1];
    double a_loss_rel, a_param_diff, a_dp_divergence, a_tied_diff;
    int a_checkpoint_ok;
    char checkpoint_dir[300];
    l8_sum sums[L8_MAX_WORLD];
    cJSON *events[L8_MAX_WORLD];        /* rank 0: every rank's recorded events */
    double grad_norm, clip_coeff, lr;
    char teardown_message[200];
    int teardown_status;
    /* B */
    double sp_tp_diff_before, sp_tp_diff_after, sp_sum_vs_ref, sp_before_vs_ref, sp_after_vs_ref;
    double emb_stage_diff_before, emb_stage_diff_after, emb_sum_vs_ref, emb_before_vs_ref,
        emb_after_vs_ref;
    int sp_elems, emb_elems;
    /* C */
    double c_correct_div, c_correct_vs_ref;
    double c_ddp_div, c_ddp_vs_correct, c_ddp_vs_replica_ref;
    double c_dist_div, c_dist_vs_correct;
    double c_correct_loss[L8_ITERS], c_ddp_loss[L8_ITERS], c_dist_loss[L8_ITERS];
    /* F */
    l8_sum f_sums[L8_MAX_WORLD];
    double f_loss_rel;
    int n_checks, n_failed;
} l8_state;

#define L8_CHECK(cx, ok, ...) \
    (((l8_state *)(cx)->state)->n_checks++, \
     ((l8_state *)(cx)->state)->n_failed += !lab_check((cx), (ok), __VA_ARGS__))

static void l8_compared(lab_ctx *cx, const char *what) {
    l8_state *st = cx->state;
    if (st->n_failed == 0)
        lab_printf0("  compared %s: %d checks, all held\n", what, st->n_checks);
    else
        lab_printf0("  compared %s: %d of %d checks FAILED\n", what, st->n_failed, st->n_checks);
    st->n_checks = st->n_failed = 0;
}

/* ---------------------------------------------------------------------------------------------
   single-rank references (every rank runs its own, on the self world: TP = PP = DP = 1) */

/* The correct run: the whole global batch, M x DP micro-batches, L8_ITERS steps. Keeps the
   model (params after the last step) and, in grads_it1, the finalized grads of step 1. */
static void l8_reference(lab_ctx *cx, l8_app *ref, float **grads_it1, int data_dp,
                         int data_rank, int m) {
    l8_state *st = cx->state;
    l8_setup s = {.m = m, .gbs = L8_MBS * L8_M * st->dp, .data_dp = data_dp,
                  .data_rank = data_rank};
    l8_app_init(ref, &st->self_ps, &s);
    for (int it = 0; it < L8_ITERS; it++) {
        l8_step(ref, 0);
        if (it == 0 && grads_it1) {
            *grads_it1 = lab_xcalloc(ref->gpt.table.total, sizeof(float));
            /* the step scaled the grads by the clip coefficient: undo it */
            MC_CHECK(ref->gpt.ops->download(ref->gpt.ops, *grads_it1, ref->gpt.grads,
                                            ref->gpt.table.total * sizeof(float)));
            float c = ref->opt.last_clip_coeff;
            for (size_t i = 0; i < ref->gpt.table.total; i++) (*grads_it1)[i] /= c;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
   reading a timeline */

static double l8_ms(double t, double t0) { return t > 0.0 ? (t - t0) * 1e3 : -1.0; }
/* ms for the results: 1 us resolution, -1 (not known) kept as is */
static double l8_round(double ms) { return ms < 0 ? -1.0 : lab_round_ms(ms); }

/* 1 when event e lies inside a span or op named `name` (kind `kind`, or any kind for -1). */
static int l8_inside(const mc_timeline *tl, const mc_timeline_event *e, const char *name,
                     int kind) {
    for (const mc_timeline_event *p = mc_timeline_event_at(tl, e->parent); p;
         p = mc_timeline_event_at(tl, p->parent))
        if (strcmp(p->name, name) == 0 && (kind < 0 || (int)p->kind == kind)) return 1;
    return 0;
}

/* The first event named `name` of kind `kind` from id `from` on, or NULL. */
static const mc_timeline_event *l8_find(const mc_timeline *tl, long long from, const char *name,
                                        int kind) {
    for (long long id = from > mc_timeline_first(tl) ? from : mc_timeline_first(tl);
         id < tl->n_events; id++) {
        const mc_timeline_event *e = mc_timeline_event_at(tl, id);
        if (e && strcmp(e->name, name) == 0 && (kind < 0 || (int)e->kind == kind)) return e;
    }
    return NULL;
}

/* When the communication inside span `g` completed: the latest completion of its collective
   and async events (the span's own completion also covers compute the device still had queued
   when it returned, which the next forward's host call may precede; -1: no communication). */
static double l8_comm_end(const mc_timeline *tl, const mc_timeline_event *g) {
    double end = -1;
    for (long long id = g->id + 1; id < tl->n_events; id++) {
        const mc_timeline_event *e = mc_timeline_event_at(tl, id);
        if (!e || (e->kind != MC_TIMELINE_COLLECTIVE && e->kind != MC_TIMELINE_ASYNC)) continue;
        const mc_timeline_event *p = mc_timeline_event_at(tl, e->parent);
        while (p && p->id != g->id) p = mc_timeline_event_at(tl, p->parent);
        if (p && e->t_complete > end) end = e->t_complete;
    }
    return end;
}

/* This rank's summary of the events from id `from` (one iteration) of a timeline. */
static void l8_summarise(lab_ctx *cx, const mc_timeline *tl, long long from, double t0,
                         const l8_app *a, l8_sum *s) {
    l8_state *st = cx->state;
    memset(s, 0, sizeof *s);
    s->rank = cx->me;
    s->stage = a->pp_rank;
    s->tp = a->tp_rank;
    s->dp = a->dp_rank;
    s->n_events = (double)(tl->n_events - from);
    s->dropped = from < mc_timeline_first(tl) ? (double)(mc_timeline_first(tl) - from) : 0;
    s->buckets = a->gpt.table.n_buckets;
    s->times_consistent = 1;
    for (int k = 0; k < 5; k++) s->stage_ms[k] = s->optimizer_ms[k] = -1;
    for (int k = 0; k < 3; k++) s->finalize_ms[k] = -1;
    s->last_dp_complete_ms = s->first_forward_ms = -1;

    /* the schedule's ops, against the op table of this stage */
    mc_sched_op want[L8_MAX_TRACE];
    mc_schedule_desc sd = {.pp = st->pp, .pp_rank = a->pp_rank, .num_microbatches = a->s.m};
    int warm = -1, n_want = mc_schedule_ops(&sd, want, L8_MAX_TRACE, &warm);
    int n_ops = 0, ok = 1, seen_backward = 0, last_backward_mb = -1;
    long long id_last_backward = -1;
    for (long long id = from; id < tl->n_events; id++) {
        const mc_timeline_event *e = mc_timeline_event_at(tl, id);
        if (!e) continue;
        /* a device marker's time may sit a few microseconds off the host clock */
        if (e->t_return > 0 && e->t_return + 1e-9 < e->t_call) s->times_consistent = 0;
        if (e->t_complete > 0 && e->t_return > 0 && e->t_complete + 1e-4 < e->t_call)
            s->times_consistent = 0;
        if (e->kind == MC_TIMELINE_COMPUTE) {
            int is_f = strcmp(e->name, "forward") == 0;
            if (n_ops < n_want && (want[n_ops].kind != (is_f ? 'F' : 'B') ||
                                   want[n_ops].microbatch != e->index))
                ok = 0;
            n_ops++;
            if (is_f) {
                s->forwards++;
                if (!seen_backward) s->forwards_before_backward++;
                if (s->first_forward_ms < 0) s->first_forward_ms = l8_ms(e->t_call, t0);
            } else {
                s->backwards++;
                seen_backward = 1;
                s->last_backward_return_ms = l8_ms(e->t_return, t0);
                last_backward_mb = e->index;
                id_last_backward = e->id;
            }
        } else if (e->kind == MC_TIMELINE_MARK && strcmp(e->name, "grad_sync_on") == 0) {
            s->grad_sync_marks++;
            /* the next schedule op must be the backward of the last micro-batch */
            const mc_timeline_event *nx = l8_find(tl, id + 1, "backward", MC_TIMELINE_COMPUTE);
            s->grad_sync_before_last_ok = nx && nx->index == a->s.m - 1;
        } else if ((e->kind == MC_TIMELINE_COLLECTIVE || e->kind == MC_TIMELINE_ASYNC) &&
                   l8_inside(tl, e, "ddp_bucket", MC_TIMELINE_SPAN)) {
            const mc_timeline_event *b = mc_timeline_event_at(tl, e->parent);
            int in_backward = l8_inside(tl, e, "backward", MC_TIMELINE_COMPUTE);
            s->launched_in_backward += in_backward;
            s->launched_in_finish += l8_inside(tl, e, "finish_grad_sync", MC_TIMELINE_SPAN);
            if (in_backward) {
                const mc_timeline_event *p = b;
                while (p && p->kind != MC_TIMELINE_COMPUTE) p = mc_timeline_event_at(tl, p->parent);
                s->launched_last_mb += p && p->index == a->s.m - 1;
            }
            s->dp_bytes += (double)e->bytes;
            double done = l8_ms(e->t_complete, t0);
            if (done > s->last_dp_complete_ms) s->last_dp_complete_ms = done;
        } else if (e->kind == MC_TIMELINE_WAIT && l8_inside(tl, e, "finish_grad_sync", -1)) {
            s->waits++;
            s->wait_ms += (e->t_return - e->t_call) * 1e3;
        } else if (e->kind == MC_TIMELINE_COLLECTIVE && strncmp(e->comm, "tp[", 3) == 0 &&
                   (l8_inside(tl, e, "forward", MC_TIMELINE_COMPUTE) ||
                    l8_inside(tl, e, "backward", MC_TIMELINE_COMPUTE))) {
            s->tp_collectives++;
        } else if (e->kind == MC_TIMELINE_COLLECTIVE && strncmp(e->comm, "pp[", 3) == 0) {
            s->p2p_calls++;
        }
    }
    /* warm-up: the schedule's count; on the timeline, 1F1B runs one steady forward before the
       first backward unless every forward was a warm-up one */
    s->warmup = a->res->n_warmup;
    s->trace_ok = ok && n_ops == n_want && (int)s->warmup == warm &&
                  (int)s->forwards_before_backward == (warm < a->s.m ? warm + 1 : a->s.m);
    (void)last_backward_mb;
    (void)id_last_backward;
    /* stages: when each began (the first event of its name) */
    const mc_timeline_event *e;
    s->stage_ms[0] = s->first_forward_ms;
    if ((e = l8_find(tl, from, "finalize_model_grads", MC_TIMELINE_SPAN)))
        s->stage_ms[1] = l8_ms(e->t_call, t0);
    if ((e = l8_find(tl, from, "optimizer_step", MC_TIMELINE_SPAN)))
        s->stage_ms[2] = l8_ms(e->t_call, t0);
    if ((e = l8_find(tl, from, "logging", MC_TIMELINE_SPAN))) s->stage_ms[3] = l8_ms(e->t_call, t0);
    if ((e = l8_find(tl, from, "save_checkpoint", MC_TIMELINE_SPAN)))
        s->stage_ms[4] = l8_ms(e->t_call, t0);
    for (int k = 0; k < 3; k++)
        if ((e = l8_find(tl, from, l8_finalize_spans[k], MC_TIMELINE_SPAN)))
            s->finalize_ms[k] = l8_ms(e->t_call, t0);
    for (int k = 0; k < 5; k++)
        if ((e = l8_find(tl, from, l8_optimizer_spans[k], -1))) {
            s->optimizer_ms[k] = l8_ms(e->t_call, t0);
            if (k == 1) s->clipped = e->index == 1;
        }
    s->in_flight_at_backward_return = a->at_finalize.in_flight;
    s->teardown_tried = a->at_finalize.teardown_tried;
    s->teardown_refused = a->at_finalize.teardown_tried && a->at_finalize.teardown_status ==
                                                                 MC_ERR_BUSY;
    if ((e = l8_find(tl, from, "logging", MC_TIMELINE_SPAN)))
        s->iteration_ms = l8_ms(e->t_return, t0);
}

/* The positions 1, 2, ... of `n` start times (-1: absent, position 0). */
static void l8_positions(const double *t, int n, int *pos) {
    for (int i = 0; i < n; i++) {
        pos[i] = 0;
        if (t[i] < 0) continue;
        pos[i] = 1;
        for (int j = 0; j < n; j++)
            if (j != i && t[j] >= 0 && (t[j] < t[i] || (t[j] == t[i] && j < i))) pos[i]++;
    }
}

static int l8_in_order(const double *t, int n) {
    int pos[8];
    l8_positions(t, n, pos);
    for (int i = 0, want = 1; i < n; i++) {
        if (t[i] < 0) continue;
        if (pos[i] != want++) return 0;
    }
    return 1;
}

/* The recorded events of this rank as JSON (times in ms from t0). */
static cJSON *l8_events_json(const mc_timeline *tl, long long from, double t0) {
    cJSON *arr = cJSON_CreateArray();
    for (long long id = from; id < tl->n_events; id++) {
        const mc_timeline_event *e = mc_timeline_event_at(tl, id);
        if (!e) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", (double)(e->id - from));
        cJSON_AddStringToObject(o, "kind", mc_timeline_kind_name(e->kind));
        cJSON_AddStringToObject(o, "name", e->name);
        if (e->comm[0]) cJSON_AddStringToObject(o, "comm", e->comm);
        if (e->index >= 0) cJSON_AddNumberToObject(o, "index", e->index);
        if (e->chunk >= 0) cJSON_AddNumberToObject(o, "chunk", e->chunk);
        cJSON_AddNumberToObject(o, "depth", e->depth);
        cJSON_AddNumberToObject(o, "parent", e->parent >= from ? (double)(e->parent - from) : -1);
        if (e->ref >= 0) cJSON_AddNumberToObject(o, "ref", (double)(e->ref - from));
        if (e->bytes) cJSON_AddNumberToObject(o, "bytes", (double)e->bytes);
        cJSON_AddNumberToObject(o, "t_call_ms", l8_round(l8_ms(e->t_call, t0)));
        cJSON_AddNumberToObject(o, "t_return_ms", l8_round(l8_ms(e->t_return, t0)));
        cJSON_AddNumberToObject(o, "t_complete_ms", l8_round(l8_ms(e->t_complete, t0)));
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

/* Every rank's summary on every rank. */
static void l8_gather_sums(lab_ctx *cx, const l8_sum *mine, l8_sum *all) {
    MC_CHECK(lab_all_gather_f64(cx->world, (const double *)mine, (double *)all, L8_SUM_DOUBLES));
}

/* ---------------------------------------------------------------------------------------------
   the SVG of one rank's iteration: a lane per kind of work, host call -> return solid, the
   time the work went on after the host returned (until its completion) light */

typedef struct l8_lane {
    const char *label;
} l8_lane;

enum { L8_LANE_SCHED, L8_LANE_TP, L8_LANE_P2P, L8_LANE_DP, L8_LANE_FINALIZE, L8_LANE_OPT,
       L8_LANE_APP, L8_N_LANES };
static const char *const l8_lane_labels[L8_N_LANES] = {
    "forward / backward", "TP/SP collectives", "pipeline P2P", "DP buckets (async)",
    "finalize_model_grads", "optimizer", "data, logging, checkpoint"};

/* The name of the span or schedule op around event e ("" at top level); by[] indexes the
   events by id. */
static const char *l8_parent_name(const cJSON *e, const cJSON *const *by, int n, int kind_only) {
    int p = cJSON_GetObjectItem(e, "parent")->valueint;
    while (p >= 0 && p < n && by[p]) {
        const char *kind = cJSON_GetObjectItem(by[p], "kind")->valuestring;
        if (!kind_only || strcmp(kind, "compute") == 0 || strcmp(kind, "span") == 0)
            return cJSON_GetObjectItem(by[p], "name")->valuestring;
        p = cJSON_GetObjectItem(by[p], "parent")->valueint;
    }
    return "";
}

/* Which lane an event is drawn in (-1: not drawn, e.g. drawn as part of its span). */
static int l8_lane_of(const cJSON *e, const cJSON *const *by, int n, const char **color) {
    const char *kind = cJSON_GetObjectItem(e, "kind")->valuestring;
    const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
    const cJSON *comm = cJSON_GetObjectItem(e, "comm");
    const char *cm = comm ? comm->valuestring : "";
    const char *in = l8_parent_name(e, by, n, 1);
    *color = "#888888";
    if (strcmp(kind, "compute") == 0) {
        *color = strcmp(name, "forward") == 0 ? "#1f77b4" : "#ff7f0e";
        return L8_LANE_SCHED;
    }
    if (strcmp(kind, "collective") == 0 || strcmp(kind, "async") == 0) {
        if (strcmp(in, "ddp_bucket") == 0) return *color = "#d62728", L8_LANE_DP;
        if (strcmp(in, "forward") != 0 && strcmp(in, "backward") != 0 && in[0]) return -1;
        if (strncmp(cm, "tp[", 3) == 0) return *color = "#2ca02c", L8_LANE_TP;
        if (strncmp(cm, "pp[", 3) == 0) return *color = "#9467bd", L8_LANE_P2P;
        return -1;
    }
    if (strcmp(kind, "span") == 0) {
        if (strcmp(name, "finish_grad_sync") == 0) return *color = "#d62728", L8_LANE_FINALIZE;
        if (strcmp(name, "sp_grad_all_reduce") == 0) return *color = "#2ca02c", L8_LANE_FINALIZE;
        if (strcmp(name, "embedding_grad_all_reduce") == 0)
            return *color = "#8c564b", L8_LANE_FINALIZE;
        if (strcmp(name, "grad_norm") == 0) return *color = "#17becf", L8_LANE_OPT;
        if (strcmp(name, "clip_grads") == 0) return *color = "#bcbd22", L8_LANE_OPT;
        if (strcmp(name, "adamw") == 0) return *color = "#e377c2", L8_LANE_OPT;
        if (strcmp(name, "param_all_gather") == 0) return *color = "#7f7f7f", L8_LANE_OPT;
        if (strcmp(name, "get_batch") == 0) return *color = "#aec7e8", L8_LANE_APP;
        if (strcmp(name, "logging") == 0) return *color = "#98df8a", L8_LANE_APP;
        if (strcmp(name, "save_checkpoint") == 0) return *color = "#c5b0d5", L8_LANE_APP;
    }
    return -1;
}

/* An axis end at or above t with at most 12 round ticks (1, 2 or 5 times a power of ten). */
static double l8_axis(double t, int *ticks) {
    static const double mult[3] = {1.0, 2.0, 5.0};
    double p10 = pow(10.0, floor(log10(t / 12.0)));
    for (int k = 0;; k++) {
        double step = mult[k % 3] * p10 * pow(10.0, k / 3);
        if (t / step <= 12.0) {
            *ticks = (int)ceil(t / step - 1e-9);
            return *ticks * step;
        }
    }
}

static lab_svg *l8_svg(int rank, const l8_sum *s, const cJSON *events) {
    /* the axis ends with the iteration (logging done); the checkpoint, which takes far longer
       on a disk, runs off the right edge with its duration written beside it */
    double t_end = 0, ckpt_ms = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        double c0 = cJSON_GetObjectItem(e, "t_call_ms")->valuedouble;
        double r = cJSON_GetObjectItem(e, "t_return_ms")->valuedouble;
        double c = cJSON_GetObjectItem(e, "t_complete_ms")->valuedouble;
        if (strcmp(name, "save_checkpoint") == 0) ckpt_ms = r - c0;
        if (cJSON_GetObjectItem(e, "parent")->valuedouble >= 0 || strcmp(name, "save_checkpoint") == 0)
            continue;
        if (r > t_end) t_end = r;
        if (c > t_end) t_end = c;
    }
    if (s->iteration_ms > t_end) t_end = s->iteration_ms;
    int ticks = 10;
    t_end = l8_axis(t_end > 0 ? t_end * 1.05 : 1.0, &ticks);
    double lane_h = 26, top = 40, left = 170, width = 960;
    lab_svg *svg = lab_svg_new(left + width + 30, top + lane_h * L8_N_LANES + 90);
    lab_svg_axes ax = {.x = left, .y = top, .w = width, .h = lane_h * L8_N_LANES, .x_min = 0,
                       .x_max = t_end, .y_min = 0, .y_max = L8_N_LANES, .x_ticks = ticks,
                       .y_ticks = 0, .x_label = "ms since the iteration began (every rank left a "
                                                "barrier at 0)", .y_label = NULL};
    char title[256];
    snprintf(title, sizeof title, "lab08: rank %d (pp stage %d, tp %d, dp %d), one training "
             "iteration; solid: host call -> return, light: still running until completion",
             rank, (int)s->stage, (int)s->tp, (int)s->dp);
    lab_svg_text(svg, left, 16, LAB_SVG_START, 12, title);
    lab_svg_axes_draw(svg, &ax);
    for (int l = 0; l < L8_N_LANES; l++)
        lab_svg_text(svg, left - 6, top + lane_h * (l + 0.65), LAB_SVG_END, 11, l8_lane_labels[l]);
    int n = cJSON_GetArraySize(events);
    const cJSON **by = (const cJSON **)lab_xcalloc((size_t)n + 1, sizeof *by);
    cJSON_ArrayForEach(e, events) {
        int id = cJSON_GetObjectItem(e, "id")->valueint;
        if (id >= 0 && id < n) by[id] = e;
    }
    cJSON_ArrayForEach(e, events) {
        const char *color;
        int lane = l8_lane_of(e, by, n, &color);
        if (lane < 0) continue;
        double t0 = cJSON_GetObjectItem(e, "t_call_ms")->valuedouble;
        double t1 = cJSON_GetObjectItem(e, "t_return_ms")->valuedouble;
        double tc = cJSON_GetObjectItem(e, "t_complete_ms")->valuedouble;
        const cJSON *idx = cJSON_GetObjectItem(e, "index");
        const cJSON *comm = cJSON_GetObjectItem(e, "comm");
        char tip[200];
        snprintf(tip, sizeof tip, "%s %s%s%s%s idx %d: call %.3f ms, return %.3f ms, complete "
                 "%.3f ms", cJSON_GetObjectItem(e, "kind")->valuestring,
                 cJSON_GetObjectItem(e, "name")->valuestring, comm ? " on " : "",
                 comm ? comm->valuestring : "", "", idx ? idx->valueint : -1, t0, t1, tc);
        double y = top + lane_h * lane + 4, h = lane_h - 8;
        if (strcmp(cJSON_GetObjectItem(e, "kind")->valuestring, "span") == 0 &&
            lane == L8_LANE_APP && strcmp(cJSON_GetObjectItem(e, "name")->valuestring,
                                          "get_batch") == 0)
            y += h / 2, h /= 2;
        if (t0 >= t_end) continue;
        double x0 = lab_svg_x(&ax, t0), w = lab_svg_dx(&ax, fmin(t1, t_end) - t0);
        lab_svg_rect(svg, x0, y, w < 0.8 ? 0.8 : w, h, color, tip);
        if (tc > t1 + 1e-6) {   /* running after the host returned (async, or on a device) */
            lab_svg_rect(svg, lab_svg_x(&ax, t1), y + h * 0.25,
                         lab_svg_dx(&ax, fmin(tc, t_end) - t1), h * 0.5, "#f4b6b6", tip);
        }
    }
    free(by);
    if (s->last_backward_return_ms > 0) {
        double x = lab_svg_x(&ax, s->last_backward_return_ms);
        lab_svg_line(svg, x, top - 4, x, top + lane_h * L8_N_LANES, "#d62728", 1.2);
        lab_svg_text(svg, x + 3, top - 6, LAB_SVG_START, 10, "last backward returned");
    }
    char note[300];
    snprintf(note, sizeof note, "%d DP buckets: %d launched inside the backward, %d still in "
             "flight when the last backward returned; finish_grad_sync waited %.3f ms",
             (int)s->buckets, (int)s->launched_in_backward, (int)s->in_flight_at_backward_return,
             s->wait_ms);
    lab_svg_text(svg, left, top + lane_h * L8_N_LANES + 50, LAB_SVG_START, 11, note);
    if (ckpt_ms >= 0) {
        snprintf(note, sizeof note, "save_checkpoint took %.1f ms in all (it runs past the right "
                 "edge: files, fsync and checksums)", ckpt_ms);
        lab_svg_text(svg, left, top + lane_h * L8_N_LANES + 66, LAB_SVG_START, 11, note);
    }
    return svg;
}

/* ---------------------------------------------------------------------------------------------
   A. the iteration on a timeline */

static mc_timeline_event l8_ring[L8_EVENTS];

static void l8_checkpoint_dir(lab_ctx *cx, char *out, size_t cap) {
    const char *res = cx->args->results_path ? cx->args->results_path
                                             : cx->args->results_default;
    const char *slash = strrchr(res, '/');
    if (slash) snprintf(out, cap, "%.*s/lab08.checkpoint", (int)(slash - res), res);
    else snprintf(out, cap, "lab08.checkpoint");
}

/* Megatron's save_checkpoint: the optimizer state gathered (a collective over DP under the
   distributed optimizer), then the model, m and v and the RNG states written and verified. */
static void l8_save(lab_ctx *cx, l8_app *a, const char *dir) {
    long long span = mc_timeline_begin("save_checkpoint", a->iteration);
    const mc_param_table *t = &a->gpt.table;
    const mc_ops *o = a->gpt.ops;
    void *m = NULL, *v = NULL;   /* [total] op memory: get_state writes there */
    MC_CHECK(mc_ops_alloc(o, MC_MEMORY_OPTIMIZER, &m, t->total * sizeof(float)));
    MC_CHECK(mc_ops_alloc(o, MC_MEMORY_OPTIMIZER, &v, t->total * sizeof(float)));
    for (int i = 0; i < t->count; i++) {
        MC_CHECK(mc_optimizer_get_state(&a->opt, i, MC_OPTIM_EXP_AVG,
                                        (float *)m + t->info[i].offset));
        MC_CHECK(mc_optimizer_get_state(&a->opt, i, MC_OPTIM_EXP_AVG_SQ,
                                        (float *)v + t->info[i].offset));
    }
    mc_checkpoint_desc d;
    memset(&d, 0, sizeof d);
    d.dir = dir;
    d.ps = a->ps;
    d.config = &a->gpt.config;
    d.params = t;
    d.param_data = (float *)a->gpt.params;
    d.exp_avg = (float *)m;
    d.exp_avg_sq = (float *)v;
    d.ops = o;
    d.rng = &a->gpt.rng;
    d.iteration = a->iteration;
    d.consumed_samples = (long long)a->iteration * a->s.gbs;
    d.optimizer_step = a->opt.iteration;
    MC_CHECK(mc_checkpoint_save(&d));
    mc_timeline_end(span, o);
    mc_ops_free(o, m);
    mc_ops_free(o, v);
    (void)cx;
}

/* Reads the checkpoint back into a fresh buffer: 1 when it equals the live parameters. */
static int l8_verify_checkpoint(lab_ctx *cx, l8_app *a, const char *dir) {
    const mc_param_table *t = &a->gpt.table;
    const mc_ops *o = a->gpt.ops;
    void *back = NULL;
    MC_CHECK(mc_ops_alloc(o, MC_MEMORY_PARAMETERS, &back, t->total * sizeof(float)));
    float *host = lab_xcalloc(t->total, sizeof(float));
    const float *live = l8_params(a);
    mc_checkpoint_desc d;
    memset(&d, 0, sizeof d);
    d.dir = dir;
    d.ps = a->ps;
    d.config = &a->gpt.config;
    d.params = t;
    d.param_data = (float *)back;
    d.ops = o;
    d.iteration = a->iteration;
    mc_checkpoint_result res;
    int rc = mc_checkpoint_load(&d, MC_CKPT_LOAD_ITERATION | MC_CKPT_LOAD_NO_RNG, &res);
    int same = rc == MC_OK && res.iteration == a->iteration;
    if (same) MC_CHECK(o->download(o, host, back, t->total * sizeof(float)));
    for (int i = 0; same && i < t->count; i++)
        same = memcmp(host + t->info[i].offset, live + t->info[i].offset,
                      t->info[i].numel * sizeof(float)) == 0;
    free(host);
    mc_ops_free(o, back);
    int all = 0;
    MC_CHECK(lab_all_reduce_i32(cx->world, &same, &all, 1, MC_MIN));
    return all;
}

/* Max |word embedding on the first stage - output layer on the last| over the world. */
static double l8_tied_diff(lab_ctx *cx, l8_app *a) {
    mc_comm *emb = mc_parallel_group(a->ps, MC_GROUP_EMBEDDING);
    double mine = 0.0, worst = 0.0;
    if (emb && emb->size == 2) {
        const mc_param_table *t = &a->gpt.table;
        const float *p = l8_params(a);
        int i = mc_param_table_find(t, a->first ? MC_CKPT_TIED_KEY : "output_layer.weight");
        size_t n = i >= 0 ? t->info[i].numel : 0;
        double *x = lab_xcalloc(n ? n : 1, sizeof(double)), *both = lab_xcalloc(2 * n + 1,
                                                                                   sizeof(double));
        for (size_t k = 0; k < n; k++) x[k] = p[t->info[i].offset + k];
        MC_CHECK(lab_all_gather_f64(emb, x, both, n));
        for (size_t k = 0; k < n; k++) {
            double d = fabs(both[k] - both[n + k]);
            if (d > mine) mine = d;
        }
        free(x);
        free(both);
    }
    MC_CHECK(lab_all_reduce_f64(cx->world, &mine, &worst, 1, MC_MAX));
    return worst;
}

static int l8_iteration_a(lab_ctx *cx) {
    l8_state *st = cx->state;
    lab_heading(cx, "A. one training iteration on a timeline (TP %d x PP %d x DP %d, SP, "
                "distributed optimizer, overlap_grad_reduce, %d micro-batches)", st->tp, st->pp,
                st->dp, L8_M);
    static l8_app a, ref;
    l8_setup s = {.distributed_optimizer = 1, .overlap = 1, .bucket_size = L8_BUCKET, .sp = 1,
                  .m = L8_M, .gbs = L8_MBS * L8_M * st->dp, .data_dp = st->dp,
                  .data_rank = st->dp_rank};
    l8_app_init(&a, &st->ps, &s);
    a.hooks.clock = l8_clock;   /* the schedule's own trace on the timeline's clock */
    st->n_buckets = a.gpt.table.n_buckets;
    l8_checkpoint_dir(cx, st->checkpoint_dir, sizeof st->checkpoint_dir);

    mc_timeline tl;
    long long from = 0;
    double t0 = 0;
    for (int it = 0; it < L8_ITERS; it++) {
        int recorded = it == L8_ITERS - 1;
        if (recorded) {
            MC_CHECK(mc_barrier(cx->world));
            MC_CHECK(mc_timeline_start(&tl, &(mc_timeline_desc){.events = l8_ring,
                                                                .capacity = L8_EVENTS}));
            t0 = mc_timeline_now();
            a.teardown_probe = 1;
        }
        l8_step(&a, 1);
        if (recorded) {
            l8_save(cx, &a, st->checkpoint_dir);
            MC_CHECK(mc_timeline_stop(&tl));
        }
    }
    memcpy(st->a_loss, a.loss, sizeof st->a_loss);
    st->grad_norm = a.opt.last_grad_norm;
    st->clip_coeff = a.opt.last_clip_coeff;
    st->lr = a.opt.last_lr;
    st->teardown_status = a.at_finalize.teardown_status;
    snprintf(st->teardown_message, sizeof st->teardown_message, "%s",
             a.at_finalize.teardown_message);

    l8_sum mine;
    l8_summarise(cx, &tl, from, t0, &a, &mine);
    l8_gather_sums(cx, &mine, st->sums);
    cJSON *ev = l8_events_json(&tl, from, t0);
    for (int r = 0; r < cx->world_size; r++) {
        cJSON *got = lab_json_from_rank(cx, r == cx->me ? ev : NULL, r);
        if (cx->me == 0) st->events[r] = got;
        else cJSON_Delete(got);
    }

    /* the independent sides */
    st->a_checkpoint_ok = l8_verify_checkpoint(cx, &a, st->checkpoint_dir);
    st->a_dp_divergence = l8_dp_divergence(cx, &a);
    st->a_tied_diff = l8_tied_diff(cx, &a);
    l8_reference(cx, &ref, NULL, 1, 0, L8_M * st->dp);
    memcpy(st->ref_loss, ref.loss, sizeof(double) * L8_ITERS);
    double worst_rel = 0;
    for (int k = 0; k < L8_ITERS; k++) {
        double rel = fabs(st->a_loss[k] - st->ref_loss[k]) / fmax(fabs(st->ref_loss[k]), 1e-12);
        if (rel > worst_rel || rel != rel) worst_rel = rel != rel ? INFINITY : rel;
    }
    st->a_loss_rel = worst_rel;
    double pd = l8_diff_vs_ref(&a, l8_params(&a), &ref, l8_params(&ref)), pd_all = 0;
    MC_CHECK(lab_all_reduce_f64(cx->world, &pd, &pd_all, 1, MC_MAX));
    st->a_param_diff = pd_all;
    l8_app_free(&ref);
    /* the DDP survived the teardown probe (it refused) */
    l8_app_free(&a);

    /* print and check (rank 0 holds every rank's summary) */
    const l8_sum *s0 = &st->sums[0];
    lab_printf0("  recorded iteration %d on every rank: %d events on rank 0 (ring of %d, %d "
                "dropped)\n", L8_ITERS, (int)s0->n_events, L8_EVENTS, (int)s0->dropped);
    lab_printf0("  rank stage tp dp | F  B warmup sync_on | buckets in_bwd in_fin in_flight "
                "wait_ms | bwd_done_ms dp_done_ms | tp_coll p2p\n");
    int all_trace = 1, all_warm = 1, all_sync = 1, all_launch = 1, all_inflight = 1,
        all_order = 1, all_fin = 1, all_opt = 1, all_times = 1, all_teardown = 1, all_last = 1;
    for (int r = 0; r < cx->world_size; r++) {
        const l8_sum *w = &st->sums[r];
        lab_printf0("  %4d %5d %2d %2d | %d  %d %6d %7d | %7d %6d %6d %9d %7.3f | %11.3f %10.3f "
                    "| %7d %3d\n", r, (int)w->stage, (int)w->tp, (int)w->dp, (int)w->forwards,
                    (int)w->backwards, (int)w->warmup, (int)w->grad_sync_marks, (int)w->buckets,
                    (int)w->launched_in_backward, (int)w->launched_in_finish,
                    (int)w->in_flight_at_backward_return, w->wait_ms, w->last_backward_return_ms,
                    w->last_dp_complete_ms, (int)w->tp_collectives, (int)w->p2p_calls);
        int want_warm = st->pp - (int)w->stage - 1 < L8_M ? st->pp - (int)w->stage - 1 : L8_M;
        all_trace &= w->trace_ok == 1;
        all_warm &= (int)w->warmup == want_warm;
        all_sync &= w->grad_sync_marks == 1 && w->grad_sync_before_last_ok == 1;
        all_launch &= (int)w->launched_in_backward + (int)w->launched_in_finish ==
                          (int)w->buckets &&
                      (int)w->launched_last_mb == (int)w->launched_in_backward;
        all_inflight &= w->in_flight_at_backward_return >= 1;
        all_last &= w->last_dp_complete_ms > w->last_backward_return_ms;
        all_order &= l8_in_order(w->stage_ms, 5) && w->stage_ms[0] >= 0 && w->stage_ms[4] >= 0;
        all_fin &= l8_in_order(w->finalize_ms, 3) && w->finalize_ms[0] >= 0 &&
                   w->finalize_ms[1] >= 0;
        all_opt &= l8_in_order(w->optimizer_ms, 5) && w->optimizer_ms[0] >= 0 &&
                   w->optimizer_ms[2] >= 0;
        all_times &= w->times_consistent == 1 && w->dropped == 0;
        all_teardown &= w->teardown_tried == 1 && w->teardown_refused == 1;
    }
    lab_printf0("  stage order on rank 0 (ms from the barrier): forward_backward %.3f, "
                "finalize_model_grads %.3f, optimizer_step %.3f, logging %.3f, checkpoint %.3f\n",
                s0->stage_ms[0], s0->stage_ms[1], s0->stage_ms[2], s0->stage_ms[3],
                s0->stage_ms[4]);
    lab_printf0("  finalize_model_grads: finish_grad_sync %.3f, sp_grad_all_reduce %.3f, "
                "embedding_grad_all_reduce %.3f\n", s0->finalize_ms[0], s0->finalize_ms[1],
                s0->finalize_ms[2]);
    lab_printf0("  optimizer_step: grad_norm %.3f (%.4f), clip_grads %.3f (coeff %.3f), adamw "
                "%.3f, param_all_gather %.3f, lr_scheduler_step %.3f\n", s0->optimizer_ms[0],
                st->grad_norm, s0->optimizer_ms[1], st->clip_coeff, s0->optimizer_ms[2],
                s0->optimizer_ms[3], s0->optimizer_ms[4]);
    lab_printf0("  when the last backward returned, mc_ddp_destroy said: %s (%s)\n",
                mc_err_name(st->teardown_status), st->teardown_message);

    L8_CHECK(cx, all_trace, "every rank's forward/backward order is mc_schedule_ops' for its "
             "stage and M = %d", L8_M);
    L8_CHECK(cx, all_warm, "every stage ran min(pp - stage - 1, M) warm-up forwards");
    L8_CHECK(cx, all_sync, "grad sync was switched on once per rank, right before the backward "
             "of the last micro-batch");
    L8_CHECK(cx, all_launch, "every DDP bucket was launched once, and the launches during "
             "backward all came from the last micro-batch's backward");
    L8_CHECK(cx, all_inflight, "on every rank at least one bucket was still in flight when the "
             "last backward returned");
    L8_CHECK(cx, all_last, "on every rank the last DP bucket completed after the last backward "
             "had returned");
    L8_CHECK(cx, all_order, "every rank ran forward/backward, finalize_model_grads, the "
             "optimizer step, logging and the checkpoint in train_step's order");
    L8_CHECK(cx, all_fin, "finalize_model_grads ran the DP finish, the SP LayerNorm all-reduce "
             "and the embedding all-reduce in Megatron's order on every rank");
    L8_CHECK(cx, all_opt, "the optimizer ran grad norm, clipping, AdamW, the param all-gather "
             "and the scheduler in that order on every rank");
    L8_CHECK(cx, all_times, "every event has t_call <= t_return <= t_complete and none fell out "
             "of the ring");
    L8_CHECK(cx, all_teardown, "tearing the DDP down while buckets were in flight was refused "
             "(MC_ERR_BUSY) on every rank");
    L8_CHECK(cx, st->a_loss_rel <= L8_LOSS_RTOL, "every loss equals the single-rank run's "
             "(largest relative difference %.2g)", st->a_loss_rel);
    L8_CHECK(cx, st->a_param_diff <= L8_PARAM_ATOL, "every parameter equals the single-rank "
             "run's after %d steps (largest difference %.2g)", L8_ITERS, st->a_param_diff);
    L8_CHECK(cx, st->a_dp_divergence == 0.0, "the DP replicas hold identical parameters (max "
             "difference %.2g)", st->a_dp_divergence);
    L8_CHECK(cx, st->a_tied_diff == 0.0, "the tied word embedding equals its copy on the last "
             "stage (max difference %.2g)", st->a_tied_diff);
    L8_CHECK(cx, st->a_checkpoint_ok, "the checkpoint reads back equal to the live parameters");
    lab_printf0("  losses:             ");
    for (int k = 0; k < L8_ITERS; k++) lab_printf0(" %.6f", st->a_loss[k]);
    lab_printf0("\n  single-rank run:    ");
    for (int k = 0; k < L8_ITERS; k++) lab_printf0(" %.6f", st->ref_loss[k]);
    lab_printf0("\n");
    if (cx->me == 0) {
        for (int r = 0; r < cx->world_size; r++) {
            char name[32];
            snprintf(name, sizeof name, "timeline.rank%d", r);
            lab_svg *svg = l8_svg(r, &st->sums[r], st->events[r]);
            lab_figure(cx, name, svg);
            lab_svg_free(svg);
        }
    }
    l8_compared(cx, "the trace with mc_schedule_ops, the launches with the bucket table, the "
                "order with Megatron's train_step, losses and parameters with the single-rank "
                "run, the replicas and tied copies with each other, the checkpoint with the "
                "parameters");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   B and C. the special gradient syncs, and the broken mode */

/* Sum over the communicator of x[n] on the host (collective). */
static void l8_sum_over(mc_comm *c, const float *x, int n, double *out) {
    double *in = lab_xcalloc((size_t)n + 1, sizeof(double));
    for (int i = 0; i < n; i++) in[i] = x[i];
    MC_CHECK(lab_all_reduce_f64(c, in, out, (size_t)n, MC_SUM));
    free(in);
}

/* Max |x_tp0 - x_tp_r| over the TP group (collective). */
static double l8_tp_spread(mc_comm *tp, const float *x, int n) {
    double *in = lab_xcalloc((size_t)n + 1, sizeof(double));
    double *all = lab_xcalloc((size_t)n * (size_t)tp->size + 1, sizeof(double)), worst = 0;
    for (int i = 0; i < n; i++) in[i] = x[i];
    MC_CHECK(lab_all_gather_f64(tp, in, all, (size_t)n));
    for (int r = 1; r < tp->size; r++)
        for (int i = 0; i < n; i++) {
            double d = fabs(all[i] - all[(size_t)r * n + i]);
            if (d > worst) worst = d;
        }
    free(in);
    free(all);
    return worst;
}

/* The reference's values for this rank's probe order: the SP params in table order, or the
   tied embedding's TP shard. Returns the count. */
static int l8_ref_probe(const l8_app *a, const l8_app *ref, const float *ref_grads, int emb,
                        float *out) {
    const mc_param_table *t = &a->gpt.table, *rt = &ref->gpt.table;
    int at = 0;
    for (int i = 0; i < t->count; i++) {
        const mc_param_info *p = &t->info[i];
        if (emb ? !p->shared_embedding : !p->sequence_parallel) continue;
        int j = mc_param_table_find(rt, p->shared ? MC_CKPT_TIED_KEY : p->name);
        if (j < 0) return -1;
        const mc_param_info *q = &rt->info[j];
        l8_ref_shard(p, ref_grads + q->offset, q->ndim == 2 ? q->local_shape[1] : 1, a->tp_rank,
                     out + at);
        at += (int)p->numel;
    }
    return at;
}

static double l8_rel_to(const double *x, const float *ref, int n) {
    double worst = 0, scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs(x[i] - ref[i]));
    return scale > 0 ? worst / scale : worst;
}

static double l8_rel_to_f(const float *x, const float *ref, int n) {
    double *d = lab_xcalloc((size_t)n + 1, sizeof(double));
    for (int i = 0; i < n; i++) d[i] = x[i];
    double r = l8_rel_to(d, ref, n);
    free(d);
    return r;
}

static double l8_max_world(lab_ctx *cx, double v) {
    double out = 0;
    MC_CHECK(lab_all_reduce_f64(cx->world, &v, &out, 1, MC_MAX));
    return out;
}

/* Trains a copy of the layout for L8_ITERS steps (broken: the fault on) and returns it. */
static void l8_train(lab_ctx *cx, l8_app *a, int distributed_optimizer, int broken,
                     l8_grad_probe *probe) {
    l8_state *st = cx->state;
    l8_setup s = {.distributed_optimizer = distributed_optimizer, .overlap = 0,
                  .bucket_size = L8_BUCKET, .sp = 1, .m = L8_M, .gbs = L8_MBS * L8_M * st->dp,
                  .data_dp = st->dp, .data_rank = st->dp_rank};
    l8_app_init(a, &st->ps, &s);
    a->broken = broken;
    a->probe = probe;
    for (int it = 0; it < L8_ITERS; it++) {
        if (probe) probe->on = it == 0;
        l8_step(a, 0);
    }
    if (probe) probe->on = 0;
}

static int l8_special_and_broken(lab_ctx *cx) {
    l8_state *st = cx->state;
    lab_heading(cx, "B. the special gradient syncs (plain DDP, overlap off, iteration 1 probed at "
                "the start and end of finalize_model_grads)");
    static l8_app good, ddp_bad, dist_bad, ref, rep;
    static l8_grad_probe probe;
    float *ref_grads = NULL;
    memset(&probe, 0, sizeof probe);
    l8_train(cx, &good, 0, 0, &probe);
    l8_reference(cx, &ref, &ref_grads, 1, 0, L8_M * st->dp);
    mc_comm *tp = mc_parallel_group(&st->ps, MC_GROUP_TP);
    mc_comm *dp = mc_parallel_group(&st->ps, MC_GROUP_DP);

    /* sequence-parallel grads: partial over the sequence shard before, summed after */
    static float want[L8_MAX_EMB];
    static double sum_tp[L8_MAX_EMB], sum_all[L8_MAX_EMB];
    int n_sp = l8_ref_probe(&good, &ref, ref_grads, 0, want);
    st->sp_elems = n_sp;
    st->sp_tp_diff_before = l8_max_world(cx, l8_tp_spread(tp, probe.sp_before, n_sp));
    st->sp_tp_diff_after = l8_max_world(cx, l8_tp_spread(tp, probe.sp_after, n_sp));
    {   /* the lab's own sum of the partials: over TP, then the mean over DP */
        float *f = lab_xcalloc((size_t)n_sp + 1, sizeof(float));
        l8_sum_over(tp, probe.sp_before, n_sp, sum_tp);
        for (int i = 0; i < n_sp; i++) f[i] = (float)sum_tp[i];
        l8_sum_over(dp, f, n_sp, sum_all);
        for (int i = 0; i < n_sp; i++) sum_all[i] /= dp->size;
        free(f);
    }
    st->sp_sum_vs_ref = l8_max_world(cx, l8_rel_to(sum_all, want, n_sp));
    st->sp_before_vs_ref = l8_max_world(cx, l8_rel_to_f(probe.sp_before, want, n_sp));
    st->sp_after_vs_ref = l8_max_world(cx, l8_rel_to_f(probe.sp_after, want, n_sp));

    /* tied embedding: each end stage holds its own contribution before, their sum after */
    int n_emb = good.first || good.last ? l8_ref_probe(&good, &ref, ref_grads, 1, want) : 0;
    mc_comm *emb = mc_parallel_group(&st->ps, MC_GROUP_EMBEDDING);
    double e_before = 0, e_after = 0, e_sum = 0, e_bref = 0, e_aref = 0;
    if (n_emb > 0 && emb && emb->size == 2) {
        e_before = l8_tp_spread(emb, probe.emb_before, n_emb);
        e_after = l8_tp_spread(emb, probe.emb_after, n_emb);
        float *f = lab_xcalloc((size_t)n_emb, sizeof(float));
        l8_sum_over(emb, probe.emb_before, n_emb, sum_tp);
        for (int i = 0; i < n_emb; i++) f[i] = (float)sum_tp[i];
        l8_sum_over(dp, f, n_emb, sum_all);
        for (int i = 0; i < n_emb; i++) sum_all[i] /= dp->size;
        free(f);
        e_sum = l8_rel_to(sum_all, want, n_emb);
        e_bref = l8_rel_to_f(probe.emb_before, want, n_emb);
        e_aref = l8_rel_to_f(probe.emb_after, want, n_emb);
    }
    st->emb_elems = n_emb;
    st->emb_stage_diff_before = l8_max_world(cx, e_before);
    st->emb_stage_diff_after = l8_max_world(cx, e_after);
    st->emb_sum_vs_ref = l8_max_world(cx, e_sum);
    st->emb_before_vs_ref = l8_max_world(cx, e_bref);
    st->emb_after_vs_ref = l8_max_world(cx, e_aref);
    free(ref_grads);

    lab_printf0("  sequence-parallel grads (LayerNorm weights and biases, row-parallel biases: "
                "%d elements per rank):\n", st->sp_elems);
    lab_printf0("    before the TP all-reduce: max |tp0 - tp1| = %.3g, relative distance to the "
                "single-rank grad %.3g\n", st->sp_tp_diff_before, st->sp_before_vs_ref);
    lab_printf0("    after it:                 max |tp0 - tp1| = %.3g, relative distance %.3g; "
                "the lab's own sum of the partials: %.3g\n", st->sp_tp_diff_after,
                st->sp_after_vs_ref, st->sp_sum_vs_ref);
    lab_printf0("  tied word embedding (%d elements per rank):\n", st->emb_elems);
    lab_printf0("    before the embedding all-reduce: max |first stage - last stage| = %.3g, "
                "relative distance to the single-rank grad %.3g\n", st->emb_stage_diff_before,
                st->emb_before_vs_ref);
    lab_printf0("    after it:                        max |first - last| = %.3g, relative "
                "distance %.3g; the lab's own sum: %.3g\n", st->emb_stage_diff_after,
                st->emb_after_vs_ref, st->emb_sum_vs_ref);
    L8_CHECK(cx, st->sp_tp_diff_before > 1e-6, "before the SP all-reduce the LayerNorm grads "
             "differ between the TP ranks (each saw its own sequence shard)");
    L8_CHECK(cx, st->sp_tp_diff_after == 0.0, "after it they are identical on the TP ranks");
    L8_CHECK(cx, st->sp_after_vs_ref <= L8_GRAD_RTOL && st->sp_sum_vs_ref <= L8_GRAD_RTOL,
             "the synced LayerNorm grads, and the lab's own sum of the partials, equal the "
             "single-rank grads (relative %.2g, %.2g)", st->sp_after_vs_ref, st->sp_sum_vs_ref);
    L8_CHECK(cx, st->sp_before_vs_ref > 1e-2, "a partial LayerNorm grad is far from the "
             "single-rank grad (relative %.2g)", st->sp_before_vs_ref);
    L8_CHECK(cx, st->emb_stage_diff_before > 1e-6 && st->emb_stage_diff_after == 0.0,
             "the two copies of the tied embedding had different grads before the embedding "
             "all-reduce and identical ones after it");
    L8_CHECK(cx, st->emb_after_vs_ref <= L8_GRAD_RTOL && st->emb_sum_vs_ref <= L8_GRAD_RTOL,
             "the synced embedding grad equals the single-rank grad of the tied weight (relative "
             "%.2g)", st->emb_after_vs_ref);
    l8_compared(cx, "the grads across TP and across the end stages, and with the single-rank "
                "run's grads and the lab's own sums of the partials");

    lab_heading(cx, "C. the broken mode: the optimizer reads the grads before finish_grad_sync "
                "(%d steps each)", L8_ITERS);
    /* the correct run is B's, after its K steps */
    st->c_correct_div = l8_dp_divergence(cx, &good);
    double d = l8_diff_vs_ref(&good, l8_params(&good), &ref, l8_params(&ref));
    st->c_correct_vs_ref = l8_max_world(cx, d);
    memcpy(st->c_correct_loss, good.loss, sizeof st->c_correct_loss);
    /* broken, plain DDP: each replica on its own gradient */
    l8_train(cx, &ddp_bad, 0, 1, NULL);
    memcpy(st->c_ddp_loss, ddp_bad.loss, sizeof st->c_ddp_loss);
    st->c_ddp_div = l8_dp_divergence(cx, &ddp_bad);
    float *good_host = lab_xcalloc(good.gpt.table.total, sizeof(float));
    memcpy(good_host, l8_params(&good), good.gpt.table.total * sizeof(float));
    st->c_ddp_vs_correct = l8_max_world(cx, l8_diff_by_name(&ddp_bad, l8_params(&ddp_bad), &good,
                                                            good_host));
    l8_reference(cx, &rep, NULL, st->dp, st->dp_rank, L8_M);   /* this replica's samples only */
    d = l8_diff_vs_ref(&ddp_bad, l8_params(&ddp_bad), &rep, l8_params(&rep));
    st->c_ddp_vs_replica_ref = l8_max_world(cx, d);
    l8_app_free(&ddp_bad);
    /* broken, distributed optimizer: the param all-gather makes the replicas equal again */
    l8_train(cx, &dist_bad, 1, 1, NULL);
    memcpy(st->c_dist_loss, dist_bad.loss, sizeof st->c_dist_loss);
    st->c_dist_div = l8_dp_divergence(cx, &dist_bad);
    st->c_dist_vs_correct = l8_max_world(cx, l8_diff_by_name(&dist_bad, l8_params(&dist_bad),
                                                             &good, good_host));
    free(good_host);
    l8_app_free(&dist_bad);
    l8_app_free(&rep);
    l8_app_free(&ref);
    l8_app_free(&good);

    lab_printf0("  run                         max |param difference| between DP replicas   vs "
                "the correct run\n");
    lab_printf0("  correct (finish, then step)  %-44.3g %.3g (vs one rank)\n", st->c_correct_div,
                st->c_correct_vs_ref);
    lab_printf0("  broken, plain DDP            %-44.3g %.3g\n", st->c_ddp_div,
                st->c_ddp_vs_correct);
    lab_printf0("  broken, distributed optimizer %-43.3g %.3g\n", st->c_dist_div,
                st->c_dist_vs_correct);
    lab_printf0("  broken plain DDP: each replica against a single-rank run on that replica's "
                "samples alone: %.3g\n", st->c_ddp_vs_replica_ref);
    L8_CHECK(cx, st->c_correct_div == 0.0 && st->c_correct_vs_ref <= L8_PARAM_ATOL,
             "the correct run keeps identical replicas equal to the single-rank run (%.2g)",
             st->c_correct_vs_ref);
    L8_CHECK(cx, st->c_ddp_div > 1e-4, "with plain DDP the broken mode makes the DP replicas "
             "diverge (%.3g)", st->c_ddp_div);
    L8_CHECK(cx, st->c_ddp_vs_replica_ref <= L8_PARAM_ATOL, "each broken replica trained on its "
             "own samples alone: it equals the single-rank run on them (%.2g)",
             st->c_ddp_vs_replica_ref);
    L8_CHECK(cx, st->c_dist_div == 0.0, "with the distributed optimizer the broken replicas stay "
             "identical (the param all-gather copies every shard's owner)");
    L8_CHECK(cx, st->c_dist_vs_correct > 1e-4, "... and are still wrong: they differ from the "
             "correct run by %.3g", st->c_dist_vs_correct);
    l8_compared(cx, "the replicas with each other, with the correct run, and each broken replica "
                "with the single-rank run on its own samples");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   F. the follow-up: another DDP setting, read on the probe rank */

static int l8_followup(lab_ctx *cx) {
    l8_state *st = cx->state;
    const l8_variant *v = &l8_variants[cx->variant - 1];
    lab_heading(cx, "F. follow-up %s: %s, two iterations recorded, read on rank %d",
                cx->variant_name, v->title, cx->probe);
    static l8_app a, ref;
    l8_setup s = {.distributed_optimizer = 1, .overlap = v->overlap, .bucket_size = v->bucket_size,
                  .sp = 1, .m = L8_M, .gbs = L8_MBS * L8_M * st->dp, .data_dp = st->dp,
                  .data_rank = st->dp_rank};
    l8_app_init(&a, &st->ps, &s);
    a.hooks.clock = l8_clock;
    mc_timeline tl;
    MC_CHECK(mc_barrier(cx->world));
    MC_CHECK(mc_timeline_start(&tl, &(mc_timeline_desc){.events = l8_ring, .capacity = L8_EVENTS}));
    double t0 = mc_timeline_now();
    l8_step(&a, 0);
    long long second = tl.n_events;
    l8_at_finalize first_finalize = a.at_finalize;
    l8_step(&a, 0);
    MC_CHECK(mc_timeline_stop(&tl));
    /* iteration 1: the events before iteration 2's first one */
    l8_sum mine;
    mc_timeline first = tl;
    first.n_events = second;
    a.at_finalize = first_finalize;
    l8_summarise(cx, &first, 0, t0, &a, &mine);
    const mc_timeline_event *g = l8_find(&tl, 0, "param_all_gather", MC_TIMELINE_SPAN);
    const mc_timeline_event *f = l8_find(&tl, second, "forward", MC_TIMELINE_COMPUTE);
    double comm_end = g ? l8_comm_end(&tl, g) : -1;
    mine.param_gather_end_ms = comm_end > 0 ? l8_ms(comm_end, t0) : -1;
    mine.param_gather_span_end_ms = g ? l8_ms(g->t_complete, t0) : -1;
    mine.next_forward_ms = f ? l8_ms(f->t_call, t0) : -1;
    l8_gather_sums(cx, &mine, st->f_sums);
    l8_reference(cx, &ref, NULL, 1, 0, L8_M * st->dp);
    double worst = 0;
    for (int k = 0; k < 2; k++)
        worst = fmax(worst, fabs(a.loss[k] - ref.loss[k]) / fmax(fabs(ref.loss[k]), 1e-12));
    st->f_loss_rel = worst;
    l8_app_free(&ref);
    l8_app_free(&a);

    const l8_sum *p = &st->f_sums[cx->probe];
    lab_printf0("  rank %d (stage %d): %d buckets; %d launched inside the backward, %d by "
                "finish_grad_sync; %d still in flight when the last backward returned; "
                "finish_grad_sync waited %d times, %.3f ms in all\n", cx->probe, (int)p->stage,
                (int)p->buckets, (int)p->launched_in_backward, (int)p->launched_in_finish,
                (int)p->in_flight_at_backward_return, (int)p->waits, p->wait_ms);
    lab_printf0("  the last backward returned at %.3f ms, the last DP bucket completed at %.3f ms; "
                "iteration 1's param all-gather completed at %.3f ms, iteration 2's first "
                "forward began at %.3f ms\n", p->last_backward_return_ms, p->last_dp_complete_ms,
                p->param_gather_end_ms, p->next_forward_ms);
    if (p->param_gather_span_end_ms > p->param_gather_end_ms + 1e-3)   /* a device's queue */
        lab_printf0("  (the param all-gather span completed at %.3f ms: the device finished the "
                    "work queued before it then, after its collectives)\n",
                    p->param_gather_span_end_ms);
    int all_ok = 1;
    for (int r = 0; r < cx->world_size; r++) {
        const l8_sum *w = &st->f_sums[r];
        int launches = (int)w->launched_in_backward + (int)w->launched_in_finish == (int)w->buckets;
        int overlap = v->overlap ? (int)w->launched_in_backward >= 1
                                 : (int)w->launched_in_backward == 0;
        int in_flight = (int)w->in_flight_at_backward_return ==
                        (v->overlap ? (int)w->launched_in_backward : 0);
        int gather = w->param_gather_end_ms >= 0 && w->param_gather_end_ms <= w->next_forward_ms;
        if (!(launches && overlap && in_flight && gather))
            lab_printf0("  rank %d does not: %d buckets, %d launched inside the backward, %d by "
                        "finish_grad_sync, %d in flight at backward's return; param all-gather "
                        "completed at %.3f ms, the next forward began at %.3f ms\n", r,
                        (int)w->buckets, (int)w->launched_in_backward, (int)w->launched_in_finish,
                        (int)w->in_flight_at_backward_return, w->param_gather_end_ms,
                        w->next_forward_ms);
        all_ok &= launches && overlap && in_flight && gather;
    }
    L8_CHECK(cx, all_ok, "on every rank: launches = the bucket table's buckets, %s, the buckets "
             "in flight at backward's return = those launched in it, and the param all-gather "
             "completed before the next forward", v->overlap ? "some during backward"
                                                             : "none during backward");
    L8_CHECK(cx, st->f_loss_rel <= L8_LOSS_RTOL, "both losses equal the single-rank run's "
             "(relative %.2g)", st->f_loss_rel);
    l8_compared(cx, "the launches with the bucket table and the overlap setting, the losses with "
                "the single-rank run");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   facts */

static cJSON *l8_order_json(const double *t, const char *const *names, int n) {
    int pos[8];
    l8_positions(t, n, pos);
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < n; i++) {
        if (pos[i] > 0) cJSON_AddNumberToObject(o, names[i], pos[i]);
        else cJSON_AddNullToObject(o, names[i]);
    }
    return o;
}

static cJSON *l8_losses_json(const double *x, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(x[i]));
    return a;
}

/* A rank's DP bucket launches and finish_grad_sync (A's per-rank table and F's probe rank;
   `in_flight_key` names the buckets in flight at backward's return). */
static void l8_launches_json(cJSON *o, const l8_sum *w, const char *in_flight_key) {
    cJSON_AddNumberToObject(o, "buckets", w->buckets);
    cJSON_AddNumberToObject(o, "launched_during_backward", w->launched_in_backward);
    cJSON_AddNumberToObject(o, "launched_by_finish_grad_sync", w->launched_in_finish);
    cJSON_AddNumberToObject(o, in_flight_key, w->in_flight_at_backward_return);
    cJSON_AddNumberToObject(o, "finish_grad_sync_waits", w->waits);
    cJSON_AddNumberToObject(o, "finish_grad_sync_wait_ms", l8_round(w->wait_ms));
    cJSON_AddNumberToObject(o, "last_backward_return_ms", l8_round(w->last_backward_return_ms));
    cJSON_AddNumberToObject(o, "last_dp_bucket_complete_ms", l8_round(w->last_dp_complete_ms));
}

static cJSON *l8_rank_json(const l8_sum *w) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", w->rank);
    cJSON_AddNumberToObject(o, "stage", w->stage);
    cJSON_AddNumberToObject(o, "tp_rank", w->tp);
    cJSON_AddNumberToObject(o, "dp_rank", w->dp);
    cJSON_AddNumberToObject(o, "events", w->n_events);
    cJSON_AddNumberToObject(o, "forwards", w->forwards);
    cJSON_AddNumberToObject(o, "backwards", w->backwards);
    cJSON_AddNumberToObject(o, "warmup_forwards", w->warmup);
    cJSON_AddBoolToObject(o, "trace_matches_schedule", w->trace_ok == 1);
    cJSON_AddNumberToObject(o, "backwards_with_grad_sync", w->grad_sync_marks);
    l8_launches_json(o, w, "in_flight_at_backward_return");
    cJSON_AddNumberToObject(o, "dp_complete_after_backward_ms",
                            l8_round(w->last_dp_complete_ms - w->last_backward_return_ms));
    cJSON_AddNumberToObject(o, "tp_collectives_in_forward_backward", w->tp_collectives);
    cJSON_AddNumberToObject(o, "p2p_calls", w->p2p_calls);
    cJSON_AddNumberToObject(o, "iteration_ms", l8_round(w->iteration_ms));
    return o;
}

static cJSON *l8_facts(lab_ctx *cx) {
    l8_state *st = cx->state;
    cJSON *f = cJSON_CreateObject();
    cJSON *m = cJSON_AddObjectToObject(f, "model");
    cJSON_AddNumberToObject(m, "layers", L8_LAYERS);
    cJSON_AddNumberToObject(m, "hidden", L8_HIDDEN);
    cJSON_AddNumberToObject(m, "heads", L8_HEADS);
    cJSON_AddNumberToObject(m, "seq", L8_SEQ);
    cJSON_AddNumberToObject(m, "vocab", L8_VOCAB);
    cJSON_AddNumberToObject(m, "micro_batch_size", L8_MBS);
    cJSON_AddNumberToObject(m, "num_microbatches", L8_M);
    cJSON_AddNumberToObject(m, "global_batch_size", L8_MBS * L8_M * st->dp);
    cJSON_AddNumberToObject(m, "bucket_size", L8_BUCKET);
    cJSON_AddNumberToObject(m, "iterations", L8_ITERS);
    cJSON_AddStringToObject(m, "dtype", "fp32");
    cJSON *w = cJSON_AddObjectToObject(f, "world");
    cJSON_AddNumberToObject(w, "size", cx->world_size);
    cJSON_AddNumberToObject(w, "tp", st->tp);
    cJSON_AddNumberToObject(w, "pp", st->pp);
    cJSON_AddNumberToObject(w, "dp", st->dp);
    cJSON_AddStringToObject(w, "completion_times",
                            strcmp(cx->backend.device_kind, "cuda") == 0
                                ? "device: stream markers where the op table and the "
                                  "communicators record them, else the host's view"
                                : "host: CPU work is done when the call returns; an async "
                                  "collective when a wait finds it done");

    const l8_sum *s0 = &st->sums[0];
    cJSON_AddItemToObject(f, "stage_order", l8_order_json(s0->stage_ms, l8_stage_names, 5));
    cJSON_AddItemToObject(f, "finalize_order",
                          l8_order_json(s0->finalize_ms, l8_finalize_names, 3));
    cJSON_AddItemToObject(f, "optimizer_order",
                          l8_order_json(s0->optimizer_ms, l8_optimizer_names, 5));
    cJSON *wf = cJSON_AddObjectToObject(f, "warmup_forwards");
    for (int p = 0; p < st->pp; p++)
        for (int r = 0; r < cx->world_size; r++)
            if ((int)st->sums[r].stage == p) {
                char key[16];
                snprintf(key, sizeof key, "stage%d", p);
                cJSON_AddNumberToObject(wf, key, st->sums[r].warmup);
                break;
            }
    cJSON_AddNumberToObject(f, "backwards_with_grad_sync", s0->grad_sync_marks);
    int in_flight_min = 1 << 30;
    for (int r = 0; r < cx->world_size; r++)
        if ((int)st->sums[r].in_flight_at_backward_return < in_flight_min)
            in_flight_min = (int)st->sums[r].in_flight_at_backward_return;
    cJSON_AddStringToObject(f, "comm_done_when_backward_returns", in_flight_min > 0 ? "no" : "yes");

    cJSON *tl = cJSON_AddObjectToObject(f, "timeline");
    cJSON *ranks = cJSON_AddArrayToObject(tl, "ranks");
    for (int r = 0; r < cx->world_size; r++) cJSON_AddItemToArray(ranks, l8_rank_json(&st->sums[r]));
    cJSON_AddNumberToObject(tl, "grad_norm", st->grad_norm);
    cJSON_AddNumberToObject(tl, "clip_coeff", st->clip_coeff);
    cJSON_AddNumberToObject(tl, "lr", st->lr);
    cJSON *td = cJSON_AddObjectToObject(tl, "teardown_probe");
    cJSON_AddStringToObject(td, "call", "mc_ddp_destroy when the last backward returned");
    cJSON_AddStringToObject(td, "status", mc_err_name(st->teardown_status));
    cJSON_AddStringToObject(td, "message", st->teardown_message);
    cJSON_AddStringToObject(f, "teardown_before_finish",
                            st->teardown_status == MC_ERR_BUSY ? "refused" : "allowed");
    char svg[320];
    lab_path_beside_results(cx->args->results_path ? cx->args->results_path
                                                   : cx->args->results_default,
                            "timeline.rank0", "svg", svg, sizeof svg);
    cJSON_AddStringToObject(tl, "svg_rank0", svg);
    cJSON_AddStringToObject(tl, "checkpoint_dir", st->checkpoint_dir);
    cJSON_AddItemToObject(tl, "losses", l8_losses_json(st->a_loss, L8_ITERS));
    cJSON_AddItemToObject(tl, "single_rank_losses", l8_losses_json(st->ref_loss, L8_ITERS));
    cJSON_AddNumberToObject(tl, "max_loss_rel_diff", st->a_loss_rel);
    cJSON_AddNumberToObject(tl, "max_param_diff_vs_single_rank", st->a_param_diff);
    cJSON_AddNumberToObject(tl, "dp_replica_divergence", st->a_dp_divergence);
    cJSON_AddNumberToObject(tl, "tied_embedding_copy_diff", st->a_tied_diff);
    cJSON_AddBoolToObject(tl, "checkpoint_reads_back", st->a_checkpoint_ok);

    cJSON *sp = cJSON_AddObjectToObject(f, "special_grad_syncs");
    cJSON_AddNumberToObject(sp, "sp_grad_elements_per_rank", st->sp_elems);
    cJSON_AddNumberToObject(sp, "layernorm_tp_diff_before", st->sp_tp_diff_before);
    cJSON_AddNumberToObject(sp, "layernorm_tp_diff_after", st->sp_tp_diff_after);
    cJSON_AddNumberToObject(sp, "layernorm_before_vs_single_rank", st->sp_before_vs_ref);
    cJSON_AddNumberToObject(sp, "layernorm_after_vs_single_rank", st->sp_after_vs_ref);
    cJSON_AddNumberToObject(sp, "layernorm_lab_sum_vs_single_rank", st->sp_sum_vs_ref);
    cJSON_AddNumberToObject(sp, "embedding_grad_elements_per_rank", st->emb_elems);
    cJSON_AddNumberToObject(sp, "embedding_stage_diff_before", st->emb_stage_diff_before);
    cJSON_AddNumberToObject(sp, "embedding_stage_diff_after", st->emb_stage_diff_after);
    cJSON_AddNumberToObject(sp, "embedding_before_vs_single_rank", st->emb_before_vs_ref);
    cJSON_AddNumberToObject(sp, "embedding_after_vs_single_rank", st->emb_after_vs_ref);
    cJSON_AddStringToObject(f, "layernorm_grads_equal_before_sync",
                            st->sp_tp_diff_before == 0.0 ? "yes" : "no");

    cJSON *br = cJSON_AddObjectToObject(f, "broken_mode");
    cJSON_AddStringToObject(br, "fault", "mc_fault_finalize_skip_grad_sync: the optimizer steps "
                                         "before finish_grad_sync (overlap off)");
    cJSON_AddNumberToObject(br, "steps", L8_ITERS);
    cJSON_AddNumberToObject(br, "correct_dp_divergence", st->c_correct_div);
    cJSON_AddNumberToObject(br, "correct_vs_single_rank", st->c_correct_vs_ref);
    cJSON_AddNumberToObject(br, "ddp_dp_divergence", st->c_ddp_div);
    cJSON_AddNumberToObject(br, "ddp_vs_correct", st->c_ddp_vs_correct);
    cJSON_AddNumberToObject(br, "ddp_vs_replica_single_rank", st->c_ddp_vs_replica_ref);
    cJSON_AddNumberToObject(br, "distopt_dp_divergence", st->c_dist_div);
    cJSON_AddNumberToObject(br, "distopt_vs_correct", st->c_dist_vs_correct);
    cJSON_AddItemToObject(br, "correct_losses", l8_losses_json(st->c_correct_loss, L8_ITERS));
    cJSON_AddItemToObject(br, "ddp_losses", l8_losses_json(st->c_ddp_loss, L8_ITERS));
    cJSON_AddItemToObject(br, "distopt_losses", l8_losses_json(st->c_dist_loss, L8_ITERS));
    cJSON_AddStringToObject(f, "broken_ddp_replicas", st->c_ddp_div > 0 ? "diverge" : "identical");
    cJSON_AddStringToObject(f, "broken_distopt_replicas",
                            st->c_dist_div > 0 ? "diverge" : "identical");

    const l8_variant *v = &l8_variants[cx->variant - 1];
    const l8_sum *p = &st->f_sums[cx->probe];
    cJSON *fu = cJSON_AddObjectToObject(f, "followup");
    cJSON_AddStringToObject(fu, "variant", cx->variant_name);
    cJSON_AddStringToObject(fu, "setting", v->title);
    cJSON_AddNumberToObject(fu, "bucket_size", (double)v->bucket_size);
    cJSON_AddBoolToObject(fu, "overlap_grad_reduce", v->overlap);
    cJSON_AddNumberToObject(fu, "probe_rank", cx->probe);
    cJSON_AddNumberToObject(fu, "probe_stage", p->stage);
    l8_launches_json(fu, p, "outstanding_at_backward_return");
    cJSON_AddNumberToObject(fu, "param_gather_complete_ms", l8_round(p->param_gather_end_ms));
    cJSON_AddNumberToObject(fu, "next_forward_ms", l8_round(p->next_forward_ms));
    cJSON_AddStringToObject(fu, "param_gather_before_next_forward",
                            p->param_gather_end_ms >= 0 && p->param_gather_end_ms <=
                                                               p->next_forward_ms
                                ? "yes" : "no");
    cJSON_AddNumberToObject(fu, "max_loss_rel_diff", st->f_loss_rel);
    return f;
}

/* ---------------------------------------------------------------------------------------------
   world, setup, cleanup */

static int l8_check_world(const lab_ctx *cx, char *why, size_t cap) {
    const mc_grid_desc *g = &cx->grid.desc;
    if (g->tp < 2 || L8_HEADS % g->tp != 0 || L8_SEQ % g->tp != 0) {
        snprintf(why, cap, "needs tp in {2, 4} (got tp=%d): sequence parallelism needs TP > 1 "
                 "and TP must divide the %d heads and the sequence of %d", g->tp, L8_HEADS,
                 L8_SEQ);
        return 1;
    }
    if (g->pp < 2 || L8_LAYERS % g->pp != 0) {
        snprintf(why, cap, "needs pp in {2, 4} (got pp=%d): the tied embedding needs a first and "
                 "a last stage, and pp must divide the %d layers", g->pp, L8_LAYERS);
        return 1;
    }
    if (g->cp != 1 || g->ep != 1 || g->vpp > 1) {
        snprintf(why, cap, "needs cp=ep=1 and no --vpp (got cp=%d ep=%d vpp=%d)", g->cp, g->ep,
                 g->vpp);
        return 1;
    }
    if (cx->grid.dp < 2) {
        snprintf(why, cap, "needs DP >= 2 (got %d ranks for tp=%d pp=%d: DP %d): the broken mode "
                 "compares data-parallel replicas; try mpirun -np %d", cx->world_size, g->tp,
                 g->pp, cx->grid.dp, 2 * g->tp * g->pp);
        return 1;
    }
    return 0;
}

static int l8_setup_world(lab_ctx *cx) {
    l8_state *st = cx->state;
    MC_CHECK(mc_parallel_init(&st->ps, &(mc_parallel_desc){.world = cx->world,
                                                            .grid = cx->grid.desc}));
    MC_CHECK(mc_comm_init_world(&st->self_world, &(mc_comm_desc){.backend = MC_BACKEND_SELF}));
    MC_CHECK(mc_parallel_init(&st->self_ps, &(mc_parallel_desc){.world = st->self_world}));
    st->tp = st->ps.grid.desc.tp;
    st->pp = st->ps.grid.desc.pp;
    st->dp = st->ps.grid.dp;
    st->stage = mc_parallel_rank(&st->ps, MC_GROUP_PP);
    st->dp_rank = mc_parallel_rank(&st->ps, MC_GROUP_DP);
    st->tp_rank = mc_parallel_rank(&st->ps, MC_GROUP_TP);
    return LAB_RAN;
}

static int l8_run_a(lab_ctx *cx) {
    l8_setup_world(cx);
    return l8_iteration_a(cx);
}

static void l8_cleanup(lab_ctx *cx) {
    l8_state *st = cx->state;
    for (int r = 0; r < L8_MAX_WORLD; r++) cJSON_Delete(st->events[r]);
    if (st->self_ps.initialized) mc_parallel_destroy(&st->self_ps);
    if (st->self_world) mc_comm_destroy(st->self_world);
    if (st->ps.initialized) mc_parallel_destroy(&st->ps);
}

/* The recorded events of every rank beside the results (rank 0). */
static void l8_report(lab_ctx *cx) {
    l8_state *st = cx->state;
    char path[320];
    lab_path_beside_results(cx->args->results_path ? cx->args->results_path
                                                   : cx->args->results_default,
                            "timeline", "json", path, sizeof path);
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "lab", "lab08");
    cJSON_AddStringToObject(doc, "what", "every event of the recorded iteration of experiment A, "
                                         "per rank; times in ms from the barrier before it");
    cJSON *ranks = cJSON_AddArrayToObject(doc, "ranks");
    for (int r = 0; r < cx->world_size; r++) {
        cJSON_AddItemToArray(ranks, st->events[r] ? st->events[r] : cJSON_CreateArray());
        st->events[r] = NULL;
    }
    if (lab_json_write_atomic(doc, path) == 0) lab_printf0("\nwrote %s (every event, per rank)\n", path);
    cJSON_Delete(doc);
    char svg[320];
    lab_path_beside_results(cx->args->results_path ? cx->args->results_path
                                                   : cx->args->results_default,
                            "timeline.rank0", "svg", svg, sizeof svg);
    lab_printf0("the SVG timeline of rank 0 is %s (one per rank: timeline.rank0 .. rank%d)\n", svg,
                cx->world_size - 1);
    lab_printf0("broken mode (%d steps): DP replicas differ by %.3g with plain DDP; with the "
                "distributed optimizer they differ by %.3g but are %.3g away from the correct "
                "run\n", L8_ITERS, st->c_ddp_div, st->c_dist_div, st->c_dist_vs_correct);
}

static const lab_experiment l8_experiments[] = {
    {"A", l8_run_a},
    {"BC", l8_special_and_broken},
    {"F", l8_followup},
};

static const lab_spec l8_spec = {
    .name = "lab08",
    .question = "M008",
    .title = "one training iteration, stage by stage",
    .summary = "Records one training iteration of a GPT on TP 2 x PP 2 x DP 2 (sequence "
               "parallel, distributed optimizer, overlapped DP buckets, tied embeddings) on the "
               "library's timeline: host call, return and completion of every schedule op, "
               "collective, wait and phase of finalize_model_grads and the optimizer, plus "
               "logging and a checkpoint, drawn as one SVG per rank; probes the special "
               "gradient syncs; and runs the broken mode (the optimizer before finish_grad_sync) "
               "to measure how far the DP replicas drift apart.",
    .default_world = 8,
    .sizes = {.tp = 2, .pp = 2},
    .max_world = L8_MAX_WORLD,
    .check_world = l8_check_world,
    .call_timeout_s = 30.0,
    .n_variants = L8_N_VARIANTS,
    .experiments = l8_experiments,
    .n_experiments = 3,
    .state_size = sizeof(l8_state),
    .facts = l8_facts,
    .report = l8_report,
    .cleanup = l8_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &l8_spec); }
