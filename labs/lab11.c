/* labs/lab11.c - M011: where Megatron-Core's model building ends and the training application
   begins, seen through forward_step_func.

   Three parts, as in Megatron:
     library   megatron_c.h builds this rank's stage of a small GPT (mc_gpt) and runs the
               pipeline schedule (mc_get_forward_backward_func): which micro-batch runs when on
               which stage, P2P between stages, the grad-sync switch, the backward seed;
     recipe    this file: the micro-batch count, the data iterator and its sampler, the
               optimizer step, consumed samples, the loop over iterations;
     task      labs/lab11_task.c (the learner's to edit): forward_step and loss_func, for two
               tasks, called by the schedule through hooks.forward_step / hooks.loss_func.

   Default world 4 as PP = 2 x DP = 2 (ranks 0, 1 hold stage 0; ranks 2, 3 stage 1). Two
   pipelines side by side show what the callback contract has to get right beyond one
   pipeline: the micro-batch count is per data-parallel rank, M = GBS / (MBS x DP) (Megatron's
   calculator), the loss runs on the last stage of every replica, and the recipe fault that
   forgets DP (M = GBS / MBS) changes what each rank runs. `--pp 4` on the same 4 ranks shows
   stages in between (DP = 1; forgetting DP then changes nothing and that fault is skipped).

   Experiments, on every rank:
     A  the contract: task "lm" for --iters iterations. Per rank, in iteration 1: calls of
        forward_step, loss_func and backward, batches read from the data iterator, the
        schedule's warmup and op trace; the backward seed the schedule passed on the last
        stage. Compared with: mc_schedule_ops for the stage and M (the op-table generator),
        the calculator and the formula for M, 1 / (num_tokens x M) for the seed, and the
        single-rank run of the same code (one process, no pipelining, M x DP micro-batches):
        every iteration's loss and every parameter afterwards.
     B  a second task: task "prev" (another target, same model and data) through the same
        schedule function: the same function pointer, identical traces and calls on every
        rank, a different loss; checked against its own single-rank run.
     C  three injected faults with task "lm", each diagnosed from its symptoms alone:
          library  the schedule drops micro-batch (probe rank mod M) on every stage
                   (mc_fault_schedule_drop_microbatch, compiled into this lab only);
          recipe   num_microbatches = GBS / MBS, DP forgotten;
          data     the dataset's labels misaligned by one (labels[t] = text[t + 2]).
        Diagnosis: a trace that differs from the op table for the M the recipe passed, or a
        result other than the single-rank run, is the library's; an M other than the
        calculator's is the recipe's; labels that fail the data check (labels[t] ==
        tokens[t + 1]) are the data's. Each diagnosis is checked against what was injected.
   The follow-up (variant from the nonce) reads the probe rank's view of one fault. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab_driver.h"
#include "lab11_task.h"

/* ---------------------------------------------------------------------------------------------
   sizes */

#define L11_GBS 8            /* samples per iteration (the global batch) */
#define L11_MBS 1            /* samples per micro-batch */
#define L11_SEQ 8            /* tokens per sample */
#define L11_VOCAB 32
#define L11_HIDDEN 32
#define L11_HEADS 4
#define L11_LAYERS 4
#define L11_LR 4e-3f
#define L11_SEED 1234
#define L11_DATA_SEED 20261201ull
#define L11_DEFAULT_ITERS 4
#define L11_MAX_ITERS 32
#define L11_MAX_MB L11_GBS   /* the most micro-batches a run passes (the recipe fault's) */
#define L11_MAX_SAMPLES (2 * L11_GBS * L11_MBS)
#define L11_MAX_OPS (2 * L11_MAX_MB)
#define L11_MAX_WORLD 8
#define L11_EVAL_BASE 1000000LL   /* held-out samples start here */
#define L11_LOSS_RTOL 1e-5        /* loss against the single-rank run, relative */
/* Parameters against the single-rank run, absolute, per iteration: the two runs add the same
   gradients in another order, and Adam turns the rounding of a near-zero gradient into a step
   of up to lr, so the bound grows with the iterations (measured: about 1e-5 per iteration). */
#define L11_PARAM_ATOL_PER_ITER 5e-5

enum { L11_TASK_LM = 0, L11_TASK_PREV = 1 };
enum { L11_FAULT_LIBRARY = 0, L11_FAULT_RECIPE = 1, L11_FAULT_DATA = 2, L11_N_FAULTS = 3 };
static const char *const l11_fault_name[L11_N_FAULTS] = {"library", "recipe", "data"};

/* ---------------------------------------------------------------------------------------------
   the application's state on one rank (lab11_task.h's lab11_app) */

/* What one rank saw in one iteration. */
typedef struct l11_counts {
    int forward, loss, backward, batches;
    int batches_outside_forward;  /* iterator reads not made from inside forward_step */
    int n_samples;
    int samples[L11_MAX_SAMPLES];
    int label_bad, label_checked; /* data check: labels[t] != tokens[t + 1] */
    float seed_scale;             /* loss_scale of the last backward on the last stage */
    double tokens;                /* num_tokens loss_func reported, summed */
} l11_counts;

struct lab11_app {
    const lab11_task *task;
    mc_parallel_state *ps;
    int single;                   /* the single-rank reference */
    int first, last;              /* stage position */
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int ready;                    /* gpt, ddp, opt initialised */
    /* data pipeline: Megatron's pretraining sampler over a synthetic dataset */
    int dp_rank, dp_size, label_shift;
    long long sample_base;        /* first sample of the iterator's range */
    long long next_step;          /* micro-batch steps this rank's iterator has handed out */
    int tokens[L11_SEQ * L11_MBS], labels[L11_SEQ * L11_MBS], target[L11_SEQ * L11_MBS];
    int in_forward;
    float losses[L11_SEQ * L11_MBS];   /* the last stage's per-token losses, on the host */
    float *host_params;           /* (table.total) a host copy of the parameters */
    l11_counts now;
};

int lab11_is_first_stage(const lab11_app *app) { return app->first; }
int lab11_is_last_stage(const lab11_app *app) { return app->last; }
int *lab11_target_buffer(lab11_app *app) { return app->target; }
int lab11_tokens_per_microbatch(const lab11_app *app) { return L11_SEQ * L11_MBS; }

/* Sample k of the dataset: a deterministic token chain (next = 5 * prev + 3 mod V, with one
   token in eight drawn at random), so the next token is learnable. text has S + 2 tokens. */
static void l11_text(long long k, int *text) {
    uint64_t offset = (uint64_t)k * (uint64_t)(2 * (L11_SEQ + 2));
    text[0] = (int)(mc_rng_bits_at(L11_DATA_SEED, offset) % L11_VOCAB);
    for (int t = 1; t < L11_SEQ + 2; t++) {
        uint32_t r = mc_rng_bits_at(L11_DATA_SEED, offset + (uint64_t)t);
        text[t] = r % 8 == 0 ? (int)(r / 8 % L11_VOCAB) : (text[t - 1] * 5 + 3) % L11_VOCAB;
    }
}

/* next(data_iterator). Micro-batch step n of DP rank d holds samples (n * DP + d) * B + j,
   j < B (each step of the sampler takes B * DP consecutive samples, DP rank d its B of them).
   The dataset gives tokens = text[0:S] and labels = text[shift:shift + S]. */
int lab11_get_batch(lab11_app *app, lab11_batch *batch) {
    int text[L11_SEQ + 2], B = L11_MBS;
    l11_counts *c = &app->now;
    for (int j = 0; j < B; j++) {
        long long k = app->sample_base +
                      (app->next_step * app->dp_size + app->dp_rank) * (long long)B + j;
        l11_text(k, text);
        for (int s = 0; s < L11_SEQ; s++) {
            app->tokens[s * B + j] = text[s];
            app->labels[s * B + j] = text[s + app->label_shift];
        }
        if (c->n_samples < L11_MAX_SAMPLES) c->samples[c->n_samples++] = (int)k;
        /* the application's data check: a label is the next input token */
        for (int s = 0; s + 1 < L11_SEQ; s++) {
            c->label_checked++;
            c->label_bad += app->labels[s * B + j] != app->tokens[(s + 1) * B + j];
        }
    }
    app->next_step++;
    c->batches++;
    c->batches_outside_forward += !app->in_forward;
    batch->tokens = app->tokens;
    batch->labels = app->labels;
    batch->seq_length = L11_SEQ;
    batch->micro_batch_size = B;
    return 0;
}

int lab11_model(lab11_app *app, int microbatch, const int *tokens, const int *labels,
                const float *input, const float **output) {
    float *out = NULL;
    double ntok = 0.0;
    if (app->last && labels == NULL) {
        fprintf(stderr, "lab11_model: micro-batch %d on the last stage came without labels: the "
                "last stage returns the per-token losses, so forward_step must pass targets "
                "there (labs/lab11_task.c)\n", microbatch);
        return MC_ERR_INVALID_ARG;
    }
    int rc = mc_gpt_forward_step(&app->gpt, 0, microbatch, tokens, labels, input, &out, NULL,
                                 &ntok);
    if (rc != MC_OK) return rc;
    if (!app->last) {   /* hidden states stay in the model's memory: the schedule sends them */
        *output = out;
        return out != NULL ? MC_OK : MC_ERR_STATE;
    }
    /* the per-token losses, copied to the host for the task's loss_func */
    const float *losses = mc_gpt_losses(&app->gpt, microbatch % app->gpt.n_slots);
    if (losses == NULL) return MC_ERR_STATE;
    rc = app->gpt.ops->download(app->gpt.ops, app->losses, losses, sizeof app->losses);
    *output = app->losses;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   the hooks: what the training application wires into the library's schedule (Megatron's
   train_step: forward_step_func, config.no_sync_func, config.finalize_model_grads_func) */

static int hook_forward(void *user, int chunk, int microbatch, const float *input,
                        float **output, double *loss_sum, double *num_tokens) {
    lab11_app *app = (lab11_app *)user;
    const float *out = NULL;
    app->now.forward++;
    app->in_forward = 1;
    int rc = app->task->forward_step(app, microbatch, input, &out);
    app->in_forward = 0;
    *output = (float *)out;   /* the schedule only reads it (sends it, or hands it to loss) */
    return rc;
}

static int hook_loss(void *user, int microbatch, const float *output, double *loss_sum,
                     double *num_tokens) {
    lab11_app *app = (lab11_app *)user;
    app->now.loss++;
    int rc = app->task->loss_func(app, microbatch, output, loss_sum, num_tokens);
    app->now.tokens += *num_tokens;
    return rc;
}

static int hook_backward(void *user, int chunk, int microbatch, const float *output_grad,
                         float loss_scale, float **input_grad) {
    lab11_app *app = (lab11_app *)user;
    app->now.backward++;
    if (app->last) app->now.seed_scale = loss_scale;
    return mc_gpt_backward_step(&app->gpt, chunk, microbatch, output_grad, loss_scale,
                                input_grad);
}

static void hook_grad_sync(void *user, int chunk, int enable) {
    lab11_app *app = (lab11_app *)user;
    mc_gpt_set_grad_sync(&app->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&app->ddp, chunk, enable);
}

static int hook_finalize(void *user) {
    lab11_app *app = (lab11_app *)user;
    return mc_finalize_model_grads(app->ps, &app->ddp, NULL, NULL, 0, NULL);
}

/* ---------------------------------------------------------------------------------------------
   one training run */

typedef struct l11_run_desc {
    const char *name;
    int task;                     /* L11_TASK_* */
    int num_microbatches;         /* what the recipe passes per DP rank */
    int drop_microbatch;          /* library fault: the id the schedule skips, or -1 */
    int label_shift;              /* 1, or 2 for the data fault */
} l11_run_desc;

/* One rank's values of a run, gathered on every rank after the run (all ints: it travels
   through lab_all_gather_i32). */
typedef struct l11_rankrow {
    int forward, loss, backward, batches, outside, warmup, trace_ok, n_ops, n_samples;
    int ops[L11_MAX_OPS];         /* kind 'F' / 'B' times 1000 plus the micro-batch */
    int samples[L11_MAX_SAMPLES];
    int stage, dp_rank, n_layers, layers[L11_LAYERS];
    float seed_scale;
    int loss_tokens;              /* num_tokens loss_func reported per call */
} l11_rankrow;

/* One rank's view of the first iteration, plus what every rank agrees on. */
typedef struct l11_result {
    l11_run_desc desc;
    int ran;
    l11_counts first;             /* this rank, iteration 1 */
    int n_ops, warmup;
    mc_sched_op ops[L11_MAX_OPS];
    int trace_matches_table;      /* this rank: trace == mc_schedule_ops(stage, M passed) */
    mc_forward_backward_func fb;
    int iters;
    double loss[L11_MAX_ITERS];   /* global, per iteration */
    double eval_loss;             /* held-out, correctly aligned labels; NAN if not run */
    double schedule_param_change; /* this rank: max |change| of a parameter over a schedule call */
    double step_param_change;     /* ... over the optimizer step */
    int samples_per_iteration;    /* read by the first stages of all DP ranks, iteration 1 */
    /* against the single-rank run of the same recipe, data and task */
    double ref_loss[L11_MAX_ITERS];
    double max_loss_rel, max_param_diff;
    int matches_reference;
    int trace_all_ok, label_bad_all, label_checked_all;
    char diagnosis[16];
    l11_rankrow rows[L11_MAX_WORLD];   /* every rank's row (l11_gather) */
} l11_result;

typedef struct l11_state {
    mc_parallel_state ps;         /* the layout over the world */
    mc_comm *self_world;          /* this rank alone */
    mc_parallel_state self_ps;
    int pp, dp, stage, dp_rank, iters, M, calc_M, forgot_dp_M;
    int layers[L11_LAYERS], n_layers;
    l11_result clean, second, fault[L11_N_FAULTS];
    int second_same_fb, second_trace_identical, second_calls_identical, second_loss_differs;
    int dropped;                  /* the library fault's micro-batch */
    int recipe_fault_possible;    /* DP > 1 */
} l11_state;

static mc_gpt_config l11_config(int pp) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = L11_LAYERS;
    c.hidden_size = L11_HIDDEN;
    c.num_attention_heads = L11_HEADS;
    c.ffn_hidden_size = 2 * L11_HIDDEN;
    c.vocab_size = L11_VOCAB;
    c.make_vocab_size_divisible_by = 8;
    c.seq_length = L11_SEQ;
    c.max_position_embeddings = L11_SEQ;
    c.micro_batch_size = L11_MBS;
    c.init_method_std = 0.05f;
    c.hidden_dropout = MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    c.untie_embeddings_and_output_weights = 1;   /* one copy of each weight per stage */
    c.pipeline_model_parallel_size = pp;
    c.seed = L11_SEED;
    return c;
}

static void l11_app_init(lab11_app *app, mc_parallel_state *ps, int single, int task,
                         int label_shift) {
    memset(app, 0, sizeof *app);
    app->task = &lab11_tasks[task];
    app->ps = ps;
    app->single = single;
    app->first = mc_parallel_is_first_stage(ps, 1);
    app->last = mc_parallel_is_last_stage(ps, 1);
    app->dp_rank = mc_parallel_rank(ps, MC_GROUP_DP);
    app->dp_size = mc_parallel_size(ps, MC_GROUP_DP);
    app->label_shift = label_shift;
    mc_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.config = l11_config(ps->grid.desc.pp);
    gd.ps = ps;
    gd.ops = mc_comm_memory(ps->world);   /* the CPU table, or the CUDA one on nccl */
    gd.n_slots = L11_MAX_MB;
    MC_CHECK(mc_gpt_init(&app->gpt, &gd));
    mc_ddp_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.table = &app->gpt.table;
    dd.grads = app->gpt.grads;
    dd.dp = mc_parallel_group(ps, MC_GROUP_DP_CP);
    dd.ops = app->gpt.ops;
    MC_CHECK(mc_ddp_init(&app->ddp, &dd));
    mc_optimizer_desc od;
    memset(&od, 0, sizeof od);
    od.ddp = &app->ddp;
    od.params = app->gpt.params;
    od.ps = ps;
    od.lr = L11_LR;
    od.min_lr = L11_LR;
    od.train_iters = L11_MAX_ITERS;
    od.lr_decay_iters = L11_MAX_ITERS;
    od.weight_decay = MC_WEIGHT_DECAY_OFF;
    od.clip_grad = MC_CLIP_GRAD_OFF;
    MC_CHECK(mc_optimizer_init(&app->opt, &od));
    app->host_params = lab_xcalloc(app->gpt.table.total, sizeof(float));
    app->ready = 1;
}

static void l11_app_free(lab11_app *app) {
    if (!app->ready) return;
    mc_optimizer_destroy(&app->opt);
    mc_ddp_destroy(&app->ddp);
    mc_gpt_destroy(&app->gpt);
    free(app->host_params);
    app->ready = 0;
}

static mc_schedule_hooks l11_hooks(lab11_app *app) {
    mc_schedule_hooks h;
    memset(&h, 0, sizeof h);
    h.app = app;
    h.forward_step = hook_forward;
    h.loss_func = hook_loss;
    h.backward_step = hook_backward;
    h.grad_sync = hook_grad_sync;
    h.finalize = hook_finalize;
    h.tensor_elems = app->gpt.p2p_elems;
    return h;
}

/* The mean loss over every token of the iteration: the last stages' sums over all ranks. */
static double l11_global_loss(lab11_app *app, const mc_schedule_result *res) {
    double mine[2] = {0.0, 0.0}, all[2];
    if (app->last) mine[0] = res->loss_sum, mine[1] = res->num_tokens;
    MC_CHECK(lab_all_reduce_f64(app->ps->world, mine, all, 2, MC_SUM));
    return all[1] > 0 ? all[0] / all[1] : 0.0;
}

/* The parameters, downloaded into app->host_params (fp32 models only). */
static const float *l11_params(lab11_app *app) {
    MC_CHECK(app->gpt.ops->download(app->gpt.ops, app->host_params, app->gpt.params,
                                    app->gpt.table.total * sizeof(float)));
    return app->host_params;
}

static double l11_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d != d ? INFINITY : d;
    }
    return m;
}

/* Held-out loss with correctly aligned labels, through the schedule's forward-only path. */
static double l11_eval(lab11_app *app, int m) {
    static mc_schedule_result res;
    lab11_app saved = *app;
    app->task = &lab11_tasks[L11_TASK_LM];
    app->label_shift = 1;
    app->sample_base = L11_EVAL_BASE;
    app->next_step = 0;
    mc_schedule_hooks h = l11_hooks(app);
    MC_CHECK(mc_get_forward_backward_func(app->ps)(app->ps, &h, m, 1, &res));
    double loss = l11_global_loss(app, &res);
    app->task = saved.task;
    app->label_shift = saved.label_shift;
    app->sample_base = saved.sample_base;
    app->next_step = saved.next_step;
    app->now = saved.now;
    return loss;
}

/* Trains `iters` iterations from the same initial weights and data; keeps the model in app. */
static void l11_train(lab11_app *app, const l11_run_desc *d, int iters, int eval_m,
                      l11_result *r) {
    static mc_schedule_result res;
    float *before = lab_xcalloc(app->gpt.table.total, sizeof(float));
    mc_schedule_hooks h = l11_hooks(app);
    mc_forward_backward_func fb = mc_get_forward_backward_func(app->ps);
    r->desc = *d;
    r->fb = fb;
    r->iters = iters;
    for (int it = 0; it < iters; it++) {
        memset(&app->now, 0, sizeof app->now);
        MC_CHECK(mc_ddp_zero_grad(&app->ddp));
        mc_gpt_zero_grad(&app->gpt);
        memcpy(before, l11_params(app), app->gpt.table.total * sizeof(float));
        mc_fault_schedule_drop_microbatch(app->single ? -1 : d->drop_microbatch);
        int rc = fb(app->ps, &h, d->num_microbatches, 0, &res);
        mc_fault_schedule_drop_microbatch(-1);
        MC_CHECK(rc);
        double moved = l11_max_abs_diff(before, l11_params(app), app->gpt.table.total);
        if (moved > r->schedule_param_change) r->schedule_param_change = moved;
        rc = mc_optimizer_step(&app->opt);
        if (rc != MC_ERR_STATE) MC_CHECK(rc);   /* a non-finite grad norm skips the step */
        moved = l11_max_abs_diff(before, l11_params(app), app->gpt.table.total);
        if (it == 0 || moved < r->step_param_change) r->step_param_change = moved;
        r->loss[it] = l11_global_loss(app, &res);
        if (it == 0) {
            r->first = app->now;
            r->n_ops = res.n_ops < L11_MAX_OPS ? res.n_ops : L11_MAX_OPS;
            memcpy(r->ops, res.ops, sizeof(mc_sched_op) * (size_t)r->n_ops);
            r->warmup = res.n_warmup;
        }
    }
    free(before);
    r->eval_loss = eval_m > 0 ? l11_eval(app, eval_m) : NAN;
    r->ran = 1;
}

/* This rank's trace against the op table for its stage and the M the recipe passed. */
static int l11_trace_matches(const l11_result *r, int pp, int stage) {
    static mc_sched_op want[L11_MAX_OPS];
    mc_schedule_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.pp = pp;
    sd.pp_rank = stage;
    sd.num_microbatches = r->desc.num_microbatches;
    int warmup = -1, n = mc_schedule_ops(&sd, want, L11_MAX_OPS, &warmup);
    if (n != r->n_ops || warmup != r->warmup) return 0;
    for (int i = 0; i < n; i++)
        if (want[i].kind != r->ops[i].kind || want[i].microbatch != r->ops[i].microbatch)
            return 0;
    return 1;
}

/* Every parameter of this rank's stage against the same-named one of the single-rank model. */
static double l11_param_diff(lab11_app *pp_app, lab11_app *ref) {
    double worst = 0.0;
    const mc_param_table *t = &pp_app->gpt.table;
    const float *mine = l11_params(pp_app), *theirs = l11_params(ref);
    for (int i = 0; i < t->count; i++) {
        const mc_param_info *p = &t->info[i];
        int j = mc_param_table_find(&ref->gpt.table, p->name);
        if (j < 0 || ref->gpt.table.info[j].numel != p->numel) return INFINITY;
        double d = l11_max_abs_diff(mine + p->offset, theirs + ref->gpt.table.info[j].offset,
                                    p->numel);
        if (d > worst) worst = d;
    }
    return worst;
}

/* ---------------------------------------------------------------------------------------------
   per-rank values gathered on every rank */


static void l11_row(const l11_state *st, const l11_result *r, l11_rankrow *row) {
    memset(row, 0, sizeof *row);
    row->forward = r->first.forward;
    row->loss = r->first.loss;
    row->backward = r->first.backward;
    row->batches = r->first.batches;
    row->outside = r->first.batches_outside_forward;
    row->warmup = r->warmup;
    row->trace_ok = r->trace_matches_table;
    row->n_ops = r->n_ops;
    for (int i = 0; i < r->n_ops; i++)
        row->ops[i] = (r->ops[i].kind == 'B') * 1000 + r->ops[i].microbatch;
    row->n_samples = r->first.n_samples;
    memcpy(row->samples, r->first.samples, sizeof row->samples);
    row->stage = st->stage;
    row->dp_rank = st->dp_rank;
    row->n_layers = st->n_layers;
    memcpy(row->layers, st->layers, sizeof row->layers);
    row->seed_scale = r->first.seed_scale;
    row->loss_tokens = r->first.loss > 0 ? (int)(r->first.tokens / r->first.loss) : 0;
}

/* Every rank's row of result r into r->rows (collective). */
static void l11_gather(lab_ctx *cx, l11_result *r) {
    l11_rankrow mine;
    l11_row(cx->state, r, &mine);
    MC_CHECK(lab_all_gather_i32(cx->world, (const int *)&mine, (int *)r->rows,
                                sizeof mine / sizeof(int)));
}

static void l11_trace_text(const l11_rankrow *row, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < row->n_ops && used + 8 < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%c%d", i ? " " : "",
                                 row->ops[i] >= 1000 ? 'B' : 'F', row->ops[i] % 1000);
}

/* The forward micro-batch ids of a row that are missing from 0 .. m-1. */
static int l11_missing(const l11_rankrow *row, int m, int *out) {
    int n = 0;
    for (int id = 0; id < m; id++) {
        int seen = 0;
        for (int i = 0; i < row->n_ops && !seen; i++) seen = row->ops[i] == id;
        if (!seen) out[n++] = id;
    }
    return n;
}

/* Runs `d` on the layout and as the single-rank run of the same code, and compares them. */
static void l11_measure(lab_ctx *cx, const l11_run_desc *d, l11_result *r) {
    l11_state *st = cx->state;
    static lab11_app pp_app, ref;
    memset(r, 0, sizeof *r);
    l11_run_desc rd = *d;
    rd.num_microbatches = d->num_microbatches * st->dp;   /* the same samples in one process */
    rd.drop_microbatch = -1;
    l11_result rr;
    memset(&rr, 0, sizeof rr);
    int eval_m = d->task == L11_TASK_LM ? st->M : 0;
    l11_app_init(&ref, &st->self_ps, 1, d->task, d->label_shift);
    l11_train(&ref, &rd, st->iters, 0, &rr);
    l11_app_init(&pp_app, &st->ps, 0, d->task, d->label_shift);
    l11_train(&pp_app, d, st->iters, eval_m, r);

    for (int it = 0; it < st->iters; it++) {
        r->ref_loss[it] = rr.loss[it];
        double rel = fabs(r->loss[it] - rr.loss[it]) / fmax(fabs(rr.loss[it]), 1e-12);
        if (rel > r->max_loss_rel || rel != rel) r->max_loss_rel = rel != rel ? INFINITY : rel;
    }
    double mine = l11_param_diff(&pp_app, &ref), worst = 0.0;
    MC_CHECK(lab_all_reduce_f64(cx->world, &mine, &worst, 1, MC_MAX));
    r->max_param_diff = worst;
    r->matches_reference =
        r->max_loss_rel <= L11_LOSS_RTOL && worst <= L11_PARAM_ATOL_PER_ITER * st->iters;

    int ok = l11_trace_matches(r, st->pp, st->stage), all_ok = 0;
    r->trace_matches_table = ok;
    MC_CHECK(lab_all_reduce_i32(cx->world, &ok, &all_ok, 1, MC_MIN));
    r->trace_all_ok = all_ok;
    int lab[2] = {r->first.label_bad, r->first.label_checked}, sum[2];
    MC_CHECK(lab_all_reduce_i32(cx->world, lab, sum, 2, MC_SUM));
    r->label_bad_all = sum[0];
    r->label_checked_all = sum[1];
    int read = pp_app.first ? r->first.batches * L11_MBS : 0, total = 0;
    MC_CHECK(lab_all_reduce_i32(cx->world, &read, &total, 1, MC_SUM));
    r->samples_per_iteration = total;

    /* the diagnosis, from the symptoms alone */
    const char *dx = "none";
    if (!r->trace_all_ok || !r->matches_reference) dx = "library";
    else if (d->num_microbatches != st->calc_M) dx = "recipe";
    else if (r->label_bad_all > 0) dx = "data";
    snprintf(r->diagnosis, sizeof r->diagnosis, "%s", dx);
    l11_gather(cx, r);
    l11_app_free(&pp_app);
    l11_app_free(&ref);
}

/* ---------------------------------------------------------------------------------------------
   printing */

static void l11_print_table(lab_ctx *cx, const l11_rankrow *rows) {
    lab_printf0("rank stage dp  layers  forward_step loss_func backward batches warmup  "
                "trace (iteration 1)\n");
    for (int i = 0; i < cx->world_size; i++) {
        const l11_rankrow *w = &rows[i];
        char layers[32], trace[256];
        lab_format_ints(layers, sizeof layers, w->layers, w->n_layers);
        l11_trace_text(w, trace, sizeof trace);
        lab_printf0("%4d %5d %2d  %-7s %12d %9d %8d %7d %6d  %s\n", i, w->stage, w->dp_rank,
                    layers, w->forward, w->loss, w->backward, w->batches, w->warmup, trace);
    }
}

static void l11_print_losses(const l11_result *r) {
    lab_printf0("loss per iteration:");
    for (int i = 0; i < r->iters; i++) lab_printf0(" %.6f", r->loss[i]);
    lab_printf0("\nsingle-rank run:   ");
    for (int i = 0; i < r->iters; i++) lab_printf0(" %.6f", r->ref_loss[i]);
    lab_printf0("\n  largest loss difference %.2g (relative), parameter difference %.2g: %s\n",
                r->max_loss_rel, r->max_param_diff,
                r->matches_reference ? "the same computation" : "NOT the same computation");
}

/* ---------------------------------------------------------------------------------------------
   world */

/* --iters K: training iterations per run; -1 when the value is not an integer in range. */
static int l11_iters(const lab_ctx *cx) {
    const char *v = lab_flag_value(cx, "--iters");
    if (v == NULL) return L11_DEFAULT_ITERS;
    char *end = NULL;
    long k = strtol(v, &end, 10);
    return end != v && *end == '\0' && k >= 1 && k <= L11_MAX_ITERS ? (int)k : -1;
}

static int l11_check_world(const lab_ctx *cx, char *why, size_t cap) {
    const mc_grid_desc *g = &cx->grid.desc;
    int dp = cx->grid.dp;
    if (l11_iters(cx) < 0) {
        snprintf(why, cap, "needs --iters between 1 and %d (got '%s')", L11_MAX_ITERS,
                 lab_flag_value(cx, "--iters"));
        return 1;
    }
    if (g->pp < 2) {
        snprintf(why, cap, "needs pp >= 2 (got pp=%d): lab11 measures what the pipeline "
                 "schedule calls on each stage", g->pp);
        return 1;
    }
    if (L11_LAYERS % g->pp != 0) {
        snprintf(why, cap, "needs num_layers (%d) %% pp == 0: got pp=%d; use --pp 2 or --pp 4",
                 L11_LAYERS, g->pp);
        return 1;
    }
    if (g->tp != 1 || g->cp != 1 || g->ep != 1 || g->vpp > 1) {
        snprintf(why, cap, "needs tp=cp=ep=1 and no --vpp (got tp=%d cp=%d ep=%d vpp=%d): the "
                 "lab compares the callbacks of one plain pipeline per replica", g->tp, g->cp,
                 g->ep, g->vpp);
        return 1;
    }
    if (L11_GBS % (L11_MBS * dp) != 0 || L11_GBS / (L11_MBS * dp) < 2) {
        snprintf(why, cap, "needs global batch %d divisible by micro-batch %d x DP into at "
                 "least 2 micro-batches: got DP=%d (world %d / pp %d)", L11_GBS, L11_MBS, dp,
                 cx->world_size, g->pp);
        return 1;
    }
    if (cx->world->backend == MC_BACKEND_NCCL) {
        snprintf(why, cap, "needs --backend mpi: it has not been verified on the nccl backend "
                 "yet (its model takes the world's op table, but no multi-GPU run has checked it)");
        return 1;
    }
    return 0;
}


/* ---------------------------------------------------------------------------------------------
   A. the contract */

static int l11_exp_contract(lab_ctx *cx) {
    l11_state *st = cx->state;
    st->iters = l11_iters(cx);
    MC_CHECK(mc_parallel_init(&st->ps, &(mc_parallel_desc){.world = cx->world,
                                                            .grid = cx->grid.desc}));
    MC_CHECK(mc_comm_init_world(&st->self_world, &(mc_comm_desc){.backend = MC_BACKEND_SELF}));
    MC_CHECK(mc_parallel_init(&st->self_ps, &(mc_parallel_desc){.world = st->self_world}));
    st->pp = st->ps.grid.desc.pp;
    st->dp = st->ps.grid.dp;
    st->stage = mc_parallel_rank(&st->ps, MC_GROUP_PP);
    st->dp_rank = mc_parallel_rank(&st->ps, MC_GROUP_DP);
    mc_microbatch_calc calc;
    MC_CHECK(mc_microbatch_init(&calc, &(mc_microbatch_desc){.global_batch_size = L11_GBS,
                                                             .micro_batch_size = L11_MBS,
                                                             .data_parallel_size = st->dp}));
    st->calc_M = calc.num_microbatches;
    st->M = L11_GBS / (L11_MBS * st->dp);   /* the recipe: Megatron's formula */
    st->forgot_dp_M = L11_GBS / L11_MBS;
    int per = L11_LAYERS / st->pp;
    st->n_layers = per;
    for (int i = 0; i < per; i++) st->layers[i] = st->stage * per + i;

    lab_heading(cx, "A. The callback contract: task \"%s\", %d iterations, PP=%d x DP=%d",
                lab11_tasks[L11_TASK_LM].name, st->iters, st->pp, st->dp);
    lab_printf0("num_microbatches M = GBS / (MBS x DP) = %d / (%d x %d) = %d (the calculator: "
                "%d)\n", L11_GBS, L11_MBS, st->dp, st->M, st->calc_M);
    lab_check(cx, st->M == st->calc_M, "M = GBS / (MBS x DP) = %d equals the calculator's %d",
              st->M, st->calc_M);

    l11_run_desc d = {"clean", L11_TASK_LM, st->M, -1, 1};
    l11_measure(cx, &d, &st->clean);
    l11_result *r = &st->clean;
    const l11_rankrow *rows = r->rows;
    l11_print_table(cx, rows);
    int calls_ok = 1, loss_ok = 1, outside = 0;
    for (int i = 0; i < cx->world_size; i++) {
        int last = rows[i].stage == st->pp - 1;
        calls_ok &= rows[i].forward == st->M && rows[i].backward == st->M;
        loss_ok &= rows[i].loss == (last ? st->M : 0);
        outside += rows[i].outside;
    }
    lab_check(cx, calls_ok, "forward_step and backward ran M = %d times on every rank", st->M);
    lab_check(cx, loss_ok, "loss_func ran M = %d times on each last-stage rank and never "
              "elsewhere", st->M);
    lab_check(cx, r->trace_all_ok, "every rank's trace equals mc_schedule_ops for its stage "
              "and M = %d", st->M);
    lab_check(cx, outside == 0, "the data iterator was read only from inside forward_step");
    float want_seed = (float)(1.0 / ((double)L11_SEQ * L11_MBS * st->M));
    float seed = rows[cx->world_size - 1].seed_scale;
    lab_printf0("backward seed on the last stage: %.6g = 1 / (%d tokens x %d micro-batches); "
                "loss_func reported %d tokens per micro-batch\n", seed, L11_SEQ * L11_MBS,
                st->M, rows[cx->world_size - 1].loss_tokens);
    lab_check(cx, fabsf(seed - want_seed) <= 1e-7f * want_seed + 1e-12f,
              "the schedule's backward seed %.6g equals 1 / (num_tokens x M) = %.6g", seed,
              want_seed);
    l11_print_losses(r);
    lab_check(cx, r->matches_reference, "the PP x DP run equals the single-rank run of the "
              "same code (loss rel %.2g <= %.0e, parameters %.2g <= %.1e; if you edited "
              "labs/lab11_task.c, it must not depend on the layout)", r->max_loss_rel,
              L11_LOSS_RTOL, r->max_param_diff, L11_PARAM_ATOL_PER_ITER * st->iters);
    double sched = 0.0, step = 0.0;
    MC_CHECK(lab_all_reduce_f64(cx->world, &r->schedule_param_change, &sched, 1, MC_MAX));
    MC_CHECK(lab_all_reduce_f64(cx->world, &r->step_param_change, &step, 1, MC_MIN));
    r->schedule_param_change = sched;
    r->step_param_change = step;
    lab_printf0("largest parameter change inside the schedule call: %g; smallest change made "
                "by the optimizer step on any rank: %.3g\n", sched, step);
    lab_check(cx, sched == 0.0, "the schedule changed no parameter (the optimizer is the "
              "application's)");
    lab_check(cx, step > 0.0, "the application's optimizer step changed the parameters on "
              "every rank");
    lab_printf0("held-out loss after %d iterations: %.6f (before training about ln %d = %.3f)\n",
                st->iters, r->eval_loss, L11_VOCAB, log((double)L11_VOCAB));
    lab_check(cx, strcmp(r->diagnosis, "none") == 0, "the clean run's diagnosis is none (got "
              "%s)", r->diagnosis);
    lab_printf0("compared with: M from the calculator; the calls with M and the stage; every "
                "trace with mc_schedule_ops; the seed with 1 / (tokens x M); every loss and "
                "parameter with the single-rank run (one process, no pipelining, %d "
                "micro-batches)\n", st->M * st->dp);
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   B. a second task through the same schedule */

static int l11_exp_second_task(lab_ctx *cx) {
    l11_state *st = cx->state;
    lab_heading(cx, "B. A second task on the same schedule: \"%s\" predicts %s",
                lab11_tasks[L11_TASK_PREV].name, lab11_tasks[L11_TASK_PREV].target);
    l11_run_desc d = {"second", L11_TASK_PREV, st->M, -1, 1};
    l11_measure(cx, &d, &st->second);
    l11_result *a = &st->clean, *b = &st->second;
    const l11_rankrow *ra = a->rows, *rb = b->rows;
    l11_print_table(cx, rb);
    int same_trace = 1, same_calls = 1;
    for (int i = 0; i < cx->world_size; i++) {
        same_trace &= ra[i].n_ops == rb[i].n_ops &&
                      memcmp(ra[i].ops, rb[i].ops, sizeof(int) * (size_t)ra[i].n_ops) == 0;
        same_calls &= ra[i].forward == rb[i].forward && ra[i].loss == rb[i].loss &&
                      ra[i].backward == rb[i].backward;
    }
    double gap = 0.0;
    for (int it = 0; it < st->iters; it++)
        gap = fmax(gap, fabs(a->loss[it] - b->loss[it]));
    st->second_same_fb = a->fb == b->fb && b->fb == mc_get_forward_backward_func(&st->ps);
    st->second_trace_identical = same_trace;
    st->second_calls_identical = same_calls;
    st->second_loss_differs = gap > 1e-3;
    lab_printf0("schedule function: the same one as in A (%s); traces identical on every rank: "
                "%s; calls identical: %s\n", st->second_same_fb ? "yes" : "NO",
                same_trace ? "yes" : "NO", same_calls ? "yes" : "NO");
    l11_print_losses(b);
    lab_printf0("largest loss gap to task \"%s\" over the iterations: %.4f\n",
                lab11_tasks[L11_TASK_LM].name, gap);
    lab_check(cx, st->second_same_fb, "task \"%s\" ran on the very schedule function of A",
              lab11_tasks[L11_TASK_PREV].name);
    lab_check(cx, same_trace && same_calls, "the schedule's op trace and the calls per rank "
              "are identical for both tasks");
    lab_check(cx, b->matches_reference, "the second task equals its own single-rank run (loss "
              "rel %.2g, parameters %.2g)", b->max_loss_rel, b->max_param_diff);
    lab_printf0("compared with: A's schedule function, traces and calls on every rank; the "
                "single-rank run of task \"%s\"\n", lab11_tasks[L11_TASK_PREV].name);
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   C. three faults, classified from their symptoms */

static void l11_fault_desc(const l11_state *st, int f, l11_run_desc *d) {
    l11_run_desc base = {l11_fault_name[f], L11_TASK_LM, st->M, -1, 1};
    *d = base;
    if (f == L11_FAULT_LIBRARY) d->drop_microbatch = st->dropped;
    if (f == L11_FAULT_RECIPE) d->num_microbatches = st->forgot_dp_M;
    if (f == L11_FAULT_DATA) d->label_shift = 2;
}

static int l11_exp_faults(lab_ctx *cx) {
    l11_state *st = cx->state;
    static const char *const what[L11_N_FAULTS] = {
        "the library's schedule skips one micro-batch on every stage",
        "the recipe passes num_microbatches = GBS / MBS (DP forgotten)",
        "the dataset's labels are misaligned by one (labels[t] = text[t + 2])"};
    st->dropped = cx->probe % st->M;
    st->recipe_fault_possible = st->forgot_dp_M != st->M;
    lab_heading(cx, "C. Three faults, diagnosed from their symptoms (task \"%s\")",
                lab11_tasks[L11_TASK_LM].name);
    for (int f = 0; f < L11_N_FAULTS; f++) {
        l11_result *r = &st->fault[f];
        if (f == L11_FAULT_RECIPE && !st->recipe_fault_possible) {
            memset(r, 0, sizeof *r);
            lab_printf0("\n[%s] skipped: at DP = 1, GBS / MBS is the right M\n",
                        l11_fault_name[f]);
            continue;
        }
        l11_run_desc d;
        l11_fault_desc(st, f, &d);
        l11_measure(cx, &d, r);
        const l11_rankrow *rows = r->rows;
        lab_printf0("\n[%s] %s", l11_fault_name[f], what[f]);
        if (f == L11_FAULT_LIBRARY) lab_printf0(": micro-batch %d", st->dropped);
        lab_printf0("\n");
        l11_print_table(cx, rows);
        lab_printf0("M passed %d (calculator %d); traces match the op table for M = %d: %s; "
                    "samples read per iteration %d (global batch %d); data check: %d of %d "
                    "labels are not the next token\n", d.num_microbatches, st->calc_M,
                    d.num_microbatches, r->trace_all_ok ? "yes" : "no",
                    r->samples_per_iteration, L11_GBS, r->label_bad_all, r->label_checked_all);
        l11_print_losses(r);
        if (f == L11_FAULT_DATA)
            lab_printf0("held-out loss with aligned labels after %d iterations: %.6f (clean "
                        "run: %.6f)\n", st->iters, r->eval_loss, st->clean.eval_loss);
        lab_printf0("diagnosis from the symptoms: %s\n", r->diagnosis);
        lab_check(cx, strcmp(r->diagnosis, l11_fault_name[f]) == 0,
                  "the %s fault is diagnosed as %s (got %s)", l11_fault_name[f],
                  l11_fault_name[f], r->diagnosis);
        if (f == L11_FAULT_LIBRARY) {
            int ok = 1;
            for (int i = 0; i < cx->world_size; i++) {
                int miss[L11_MAX_MB];
                int n = l11_missing(&rows[i], st->M, miss);
                ok &= rows[i].forward == st->M - 1 && n == 1 && miss[0] == st->dropped;
            }
            lab_check(cx, ok, "every rank ran M - 1 = %d forward_steps, micro-batch %d missing",
                      st->M - 1, st->dropped);
        }
        if (f == L11_FAULT_RECIPE)
            lab_check(cx, r->trace_all_ok && r->matches_reference,
                      "with the wrong M the library still did exactly what it was asked");
        if (f == L11_FAULT_DATA)
            lab_check(cx, r->matches_reference, "with misaligned labels the PP run still "
                      "equals the single-rank run on the same data");
    }
    lab_printf0("\ncompared with: each diagnosis with the fault injected; the library fault's "
                "traces with the op table; every run with the single-rank run of its own recipe "
                "and data\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   facts */

static cJSON *l11_rank_object_int(const l11_rankrow *rows, int n, size_t field) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "rank%d", i);
        cJSON_AddNumberToObject(o, key, *(const int *)((const char *)&rows[i] + field));
    }
    return o;
}

static cJSON *l11_losses_json(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(round(v[i] * 1e6) / 1e6));
    return a;
}

/* All ranks' value when it is the same everywhere, else -1. */
static int l11_uniform(const l11_rankrow *rows, int n, size_t field) {
    int v = *(const int *)((const char *)&rows[0] + field);
    for (int i = 1; i < n; i++)
        if (*(const int *)((const char *)&rows[i] + field) != v) return -1;
    return v;
}

static cJSON *l11_result_json(lab_ctx *cx, const l11_result *r, const l11_rankrow *rows) {
    int n = cx->world_size;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "task", lab11_tasks[r->desc.task].name);
    cJSON_AddNumberToObject(o, "num_microbatches_passed", r->desc.num_microbatches);
    cJSON_AddItemToObject(o, "forward_step_calls", l11_rank_object_int(rows, n, offsetof(l11_rankrow, forward)));
    cJSON_AddItemToObject(o, "loss_func_calls", l11_rank_object_int(rows, n, offsetof(l11_rankrow, loss)));
    cJSON_AddItemToObject(o, "backward_calls", l11_rank_object_int(rows, n, offsetof(l11_rankrow, backward)));
    cJSON_AddItemToObject(o, "batches_read", l11_rank_object_int(rows, n, offsetof(l11_rankrow, batches)));
    cJSON_AddItemToObject(o, "warmup", l11_rank_object_int(rows, n, offsetof(l11_rankrow, warmup)));
    cJSON_AddNumberToObject(o, "forward_calls", l11_uniform(rows, n, offsetof(l11_rankrow, forward)));
    cJSON *trace = cJSON_CreateObject(), *samples = cJSON_CreateObject();
    for (int i = 0; i < n; i++) {
        char key[16], text[256];
        snprintf(key, sizeof key, "rank%d", i);
        l11_trace_text(&rows[i], text, sizeof text);
        cJSON_AddStringToObject(trace, key, text);
        cJSON_AddItemToObject(samples, key, lab_json_int_array(rows[i].samples, rows[i].n_samples));
    }
    cJSON_AddItemToObject(o, "trace", trace);
    cJSON_AddItemToObject(o, "samples", samples);
    cJSON_AddBoolToObject(o, "trace_matches_table", r->trace_all_ok);
    int miss[L11_MAX_MB], nm = l11_missing(&rows[0], r->desc.num_microbatches, miss);
    cJSON_AddItemToObject(o, "missing_microbatches", lab_json_int_array(miss, nm));
    cJSON_AddNumberToObject(o, "samples_per_iteration", r->samples_per_iteration);
    cJSON_AddNumberToObject(o, "consumed_samples_per_iteration", L11_GBS);
    cJSON_AddItemToObject(o, "loss", l11_losses_json(r->loss, r->iters));
    cJSON_AddItemToObject(o, "single_rank_loss", l11_losses_json(r->ref_loss, r->iters));
    cJSON_AddNumberToObject(o, "max_loss_rel_diff", r->max_loss_rel);
    cJSON_AddNumberToObject(o, "max_param_diff", r->max_param_diff);
    cJSON_AddBoolToObject(o, "matches_single_rank", r->matches_reference);
    if (!isnan(r->eval_loss))
        cJSON_AddNumberToObject(o, "eval_loss_aligned_labels", round(r->eval_loss * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "label_check_failures", r->label_bad_all);
    cJSON_AddNumberToObject(o, "label_check_positions", r->label_checked_all);
    cJSON_AddStringToObject(o, "diagnosis", r->diagnosis);
    cJSON_AddStringToObject(o, "fix_side", strcmp(r->diagnosis, "library") == 0 ? "library"
                                           : strcmp(r->diagnosis, "none") == 0 ? "none"
                                                                                : "application");
    return o;
}

static cJSON *l11_facts(lab_ctx *cx) {
    l11_state *st = cx->state;
    int n = cx->world_size;
    cJSON *f = cJSON_CreateObject();
    cJSON *lay = cJSON_AddObjectToObject(f, "layout");
    cJSON_AddNumberToObject(lay, "world", n);
    cJSON_AddNumberToObject(lay, "pp", st->pp);
    cJSON_AddNumberToObject(lay, "dp", st->dp);
    cJSON *bat = cJSON_AddObjectToObject(f, "batch");
    cJSON_AddNumberToObject(bat, "global_batch_size", L11_GBS);
    cJSON_AddNumberToObject(bat, "micro_batch_size", L11_MBS);
    cJSON_AddNumberToObject(bat, "data_parallel_size", st->dp);
    cJSON_AddNumberToObject(bat, "tokens_per_microbatch", L11_SEQ * L11_MBS);
    cJSON_AddNumberToObject(f, "num_microbatches", st->M);
    cJSON_AddNumberToObject(bat, "calculator_num_microbatches", st->calc_M);
    cJSON_AddNumberToObject(bat, "gbs_over_mbs", st->forgot_dp_M);
    cJSON_AddNumberToObject(f, "iterations", st->iters);
    cJSON_AddStringToObject(f, "schedule", st->pp > 1 ? "forward_backward_pipelining_without_interleaving"
                                                      : "forward_backward_no_pipelining");
    const l11_rankrow *rows = st->clean.rows;
    cJSON *layers = cJSON_AddObjectToObject(f, "layers");
    cJSON *stages = cJSON_AddObjectToObject(f, "stage_of_rank");
    for (int i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "rank%d", i);
        cJSON_AddItemToObject(layers, key, lab_json_int_array(rows[i].layers, rows[i].n_layers));
        cJSON_AddNumberToObject(stages, key, rows[i].stage);
    }
    cJSON *clean = l11_result_json(cx, &st->clean, rows);
    cJSON_AddNumberToObject(clean, "seed_scale", rows[n - 1].seed_scale);
    cJSON_AddNumberToObject(clean, "schedule_param_change", st->clean.schedule_param_change);
    cJSON_AddNumberToObject(clean, "optimizer_step_param_change", st->clean.step_param_change);
    cJSON_AddStringToObject(clean, "who_reads_data", "forward_step");
    cJSON_AddStringToObject(clean, "who_steps_optimizer",
                            st->clean.schedule_param_change == 0.0 ? "application" : "schedule");
    cJSON_AddItemToObject(f, "clean", clean);

    rows = st->second.rows;
    cJSON *sec = l11_result_json(cx, &st->second, rows);
    cJSON_AddStringToObject(sec, "target", lab11_tasks[L11_TASK_PREV].target);
    cJSON_AddBoolToObject(sec, "same_schedule_function", st->second_same_fb);
    cJSON_AddBoolToObject(sec, "trace_identical", st->second_trace_identical);
    cJSON_AddBoolToObject(sec, "calls_identical", st->second_calls_identical);
    cJSON_AddBoolToObject(sec, "loss_differs", st->second_loss_differs);
    cJSON_AddItemToObject(f, "second_task", sec);

    cJSON *faults = cJSON_AddObjectToObject(f, "faults");
    for (int k = 0; k < L11_N_FAULTS; k++) {
        if (!st->fault[k].ran) continue;
        rows = st->fault[k].rows;
        cJSON *o = l11_result_json(cx, &st->fault[k], rows);
        cJSON_AddStringToObject(o, "class", st->fault[k].diagnosis);
        if (k == L11_FAULT_LIBRARY) cJSON_AddNumberToObject(o, "dropped_microbatch", st->dropped);
        if (k == L11_FAULT_DATA) cJSON_AddNumberToObject(o, "label_shift", 2);
        cJSON_AddItemToObject(faults, l11_fault_name[k], o);
    }

    /* the follow-up: the probe rank's view of the variant's fault */
    int fk = cx->variant - 1;
    cJSON *fu = cJSON_AddObjectToObject(f, "followup");
    cJSON_AddStringToObject(fu, "variant", cx->variant_name);
    cJSON_AddStringToObject(fu, "fault", l11_fault_name[fk]);
    cJSON_AddNumberToObject(fu, "probe_rank", cx->probe);
    cJSON_AddNumberToObject(fu, "probe_stage", st->clean.rows[cx->probe].stage);
    cJSON_AddNumberToObject(fu, "probe_warmup", st->clean.rows[cx->probe].warmup);
    if (st->fault[fk].ran) {
        const l11_rankrow *p = &st->fault[fk].rows[cx->probe];
        cJSON_AddNumberToObject(fu, "probe_forward_calls", p->forward);
        cJSON_AddNumberToObject(fu, "probe_loss_calls", p->loss);
        cJSON_AddItemToObject(fu, "probe_samples", lab_json_int_array(p->samples, p->n_samples));
        cJSON_AddStringToObject(fu, "fix_side", strcmp(st->fault[fk].diagnosis, "library") == 0
                                                    ? "library" : "application");
    }
    return f;
}

static void l11_cleanup(lab_ctx *cx) {
    l11_state *st = cx->state;
    if (st->self_ps.initialized) mc_parallel_destroy(&st->self_ps);
    if (st->self_world) mc_comm_destroy(st->self_world);
    if (st->ps.initialized) mc_parallel_destroy(&st->ps);
}

static const lab_flag l11_flags[] = {{"--iters", 1}};

static const lab_experiment l11_experiments[] = {
    {"A", l11_exp_contract}, {"B", l11_exp_second_task}, {"C", l11_exp_faults}};

static const lab_spec lab11_spec = {
    .name = "lab11",
    .question = "M011",
    .title = "the model/application boundary and forward_step_func",
    .summary = "Runs the library's pipeline schedule with the forward_step and loss_func of "
               "labs/lab11_task.c (yours to edit) on PP=2 x DP=2: the calls on every stage, a "
               "second task on the same schedule, and three injected faults (library, recipe, "
               "data) diagnosed from their symptoms; every run is checked against the "
               "single-rank run of the same code.",
    .usage = "  --iters K          training iterations per run (default 4, at most 32)\n",
    .flags = l11_flags,
    .n_flags = 1,
    .default_world = 4,
    .sizes = {.pp = 2},
    .max_world = L11_MAX_WORLD,
    .check_world = l11_check_world,
    .call_timeout_s = 20.0,
    .n_variants = L11_N_FAULTS,
    .experiments = l11_experiments,
    .n_experiments = 3,
    .state_size = sizeof(l11_state),
    .facts = l11_facts,
    .cleanup = l11_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab11_spec); }
