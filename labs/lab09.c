/* labs/lab09.c - M009: why Megatron manages its own micro-batch calculator, measured.

       make lab09 && mpirun --oversubscribe -np 8 ./lab09      (as root add --allow-run-as-root)

   One identity runs through the lab:  global batch = micro batch x micro-batches x DP,
   DP = world / (TP x PP x CP). The experiments, in order (every rank takes part; rank 0
   prints; the driver, lab_driver.h, does the answer sheet, the results and the grading):

     A. fixed global batch: the same tiny GPT on the same samples with (TP, DP, M) =
        (1,8,1) (2,4,2) (4,2,4) (8,1,8) on 8 ranks (the TP ladder of any power-of-two world),
        K steps of AdamW each. M comes from the calculator; the lab checks it against
        GBS / (MBS x DP), counts which samples every rank's forward consumed (the world sees
        GBS distinct samples, each one on TP ranks), counts the backwards that ran with grad
        sync on and the DP collectives of each step, times each step, and compares every
        step's loss with the single-rank run (TP = DP = 1, M = GBS / MBS on rank 0 alone).
        Broken mode: the largest TP with M left at 1, so the global batch shrinks with DP.
     B. pipeline bubble: PP runs on the first p ranks (the others sleep, so the stages have
        the cores) for several (p, m). The schedule's trace carries each op's start and end
        (mc_schedule_hooks.clock): the bubble is 1 - busy / makespan per stage, against
        (p - 1) / (m + p - 1). The same runs give the micro-batches each stage holds at once
        (from the executed op order, against min(p - r, m)), the bytes of one micro-batch's
        activations (the driver's counting allocator around mc_gpt_init) and the peak of the
        schedule's receive buffers (the allocator's peak during the run); where the header has
        the memory estimate (mc_memory_estimate), its in-flight count, slot bytes and receive
        buffers are the expected side. A timeline SVG of one (p, m). The bubble is compared
        only in iterations where every stage had its core (its CPU time kept up with the wall
        clock): on shared cores the timeline measures the sharing, not the schedule.
     C. calculator and ramp-up: the ramp-up schedule table (consumed samples -> global batch,
        micro-batches) from mc_microbatch_update against Megatron's formula and against the
        equivalent step schedule (the mode that replaced ramp-up), a short real training run
        on that schedule (the schedule runs the calculator's M each iteration), and the
        calculator's refusals.
     F. follow-up (variant from the nonce): another GBS / MBS on a TP x PP layout of this
        world, K steps against its own single-rank run, samples per rank, and the DP the rank
        grid gives once CP is added (grid and calculator only: this build has no CP model).

   The model has 8 heads so that every TP of the ladder divides it; its vocabulary (128) pads
   to 128 at every TP, so all layouts compute the same function. Dropout is off: its masks
   depend on each rank's stream (lab10), and the comparison here is about the batch. */
#include "lab_driver.h"

#include <malloc.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LAB09_N_VARIANTS 3
#define LAB09_STEPS 5              /* K: training steps per configuration (--steps) */
#define LAB09_MAX_STEPS 8
#define LAB09_MAX_CFG 4            /* TP 1, 2, 4, 8 */
#define LAB09_MAX_PAIRS 6
#define LAB09_MAX_M 16             /* micro-batches of a bubble run */
/* Bubble runs: a warm-up iteration, then iterations until LAB09_BUBBLE_QUIET of them were
   quiet (every stage had its core: CPU time >= LAB09_QUIET_SHARE of the wall time), at most
   LAB09_BUBBLE_MAX_REPS or LAB09_BUBBLE_BUDGET_S seconds. The bubble is compared with the
   formula when at least LAB09_BUBBLE_MIN_QUIET iterations were quiet: on a machine where
   stages share cores (more stages than cores, or other work) the timeline measures the
   sharing, not the schedule. */
#define LAB09_BUBBLE_MAX_REPS 40
#define LAB09_BUBBLE_QUIET 5
#define LAB09_BUBBLE_MIN_QUIET 3
#define LAB09_QUIET_SHARE 0.9
#define LAB09_BUBBLE_BUDGET_S 4.0
#define LAB09_LOSS_RTOL 1e-5       /* the equivalence suite's tolerance (tests/test_train.c) */
#define LAB09_BUBBLE_TOL 0.05      /* |timeline - its replay|: communication and waits */
/* How far the measured bubble may sit below the formula. An op's time is host clock from its
   call to its return, so a stage that is descheduled inside an op, or waits inside it, books
   that time as busy and the bubble reads low: on a loaded 2-core machine quiet p=2 m=2 runs
   measured down to 0.289 against 1/3 (about 1 run in 10 below 0.303). */
#define LAB09_BUBBLE_FLOOR_TOL 0.06
#define LAB09_RAMP_ITERS 6
#define LAB09_MAX_ROWS 16
#define LAB09_SEED 1234

/* ---------------------------------------------------------------------------------------------
   Models and data */

typedef struct lab09_model {
    int layers, hidden, heads, ffn, seq, vocab;
} lab09_model;

/* A: tiny, so that 8 oversubscribed ranks run every layout in seconds. */
static const lab09_model lab09_small = {2, 32, 8, 128, 16, 128};
/* B: per stage two layers heavy enough that an op takes milliseconds, so the timeline is
   compute rather than the P2P latency; layers dominate the embedding and the output layer. */
static const lab09_model lab09_pipe_model = {2, 128, 8, 512, 32, 128};

static mc_gpt_config lab09_config(const lab09_model *m, int layers, int tp, int pp, int mbs) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = layers;
    c.hidden_size = m->hidden;
    c.num_attention_heads = m->heads;
    c.ffn_hidden_size = m->ffn;
    c.vocab_size = m->vocab;
    c.make_vocab_size_divisible_by = 16;   /* 128 = 16 x 8: no TP changes the padding */
    c.seq_length = m->seq;
    c.max_position_embeddings = m->seq;
    c.hidden_dropout = MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    c.tensor_model_parallel_size = tp;
    c.pipeline_model_parallel_size = pp;
    c.micro_batch_size = mbs;
    c.seed = LAB09_SEED;
    return c;
}

/* Sample k of the data set: seq + 1 tokens, a noisy affine chain drawn from (seed, k) alone,
   so every layout reads exactly the same sample for the same k. */
static void lab09_sample(int seq, int vocab, long long k, int *tokens /* [seq + 1] */) {
    uint64_t offset = (uint64_t)k * (uint64_t)(2 * (seq + 1));
    tokens[0] = (int)(mc_rng_bits_at(LAB09_SEED, offset) % (uint32_t)vocab);
    for (int t = 1; t <= seq; t++) {
        uint32_t r = mc_rng_bits_at(LAB09_SEED, offset + (uint64_t)t);
        tokens[t] = (r % 8 == 0) ? (int)(r / 8 % (uint32_t)vocab) : (tokens[t - 1] * 5 + 3) % vocab;
    }
}

/* ---------------------------------------------------------------------------------------------
   One training setup: parallel state, GPT, DDP, optimizer and calculator on a communicator
   (the world or a sub-world), and the schedule hooks. */

typedef struct lab09_run_desc {
    mc_comm *world;                 /* the ranks of this run */
    int tp, pp;
    const lab09_model *model;
    int layers;                     /* total layers (model->layers per stage for B) */
    mc_microbatch_desc batch;       /* data_parallel_size is filled from the grid */
    int n_slots;                    /* activation slots per chunk */
    int optimizer;                  /* 1: AdamW steps; 0: forward/backward only */
    int clock;                      /* 1: stamp the schedule's trace */
} lab09_run_desc;

typedef struct lab09_run {
    lab09_run_desc d;
    mc_parallel_state ps;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    mc_microbatch_calc mb;
    int have_ps, have_gpt, have_ddp, have_opt;
    int dp, dp_rank, mbs, seq;
    long long consumed;             /* samples consumed before this step */
    int *tokens, *labels, *sample;  /* [S, B], [S, B], [S + 1] */
    int *seen;                      /* [max GBS]: forwards of this rank per sample of the step */
    int seen_cap;
    int backwards, synced_backwards;
    int grad_sync_on;
    long long gpt_heap_bytes;       /* what mc_gpt_init allocated on this rank */
    mc_schedule_hooks hooks;
} lab09_run;

static mc_schedule_result lab09_result;   /* large trace: off the stack */

static double lab09_clock(void *app) {
    (void)app;
    return lab_now();
}

/* Micro-batch mb of DP rank d holds samples consumed + (mb x DP + d) x B + j, j < B: each
   round of micro-batches takes B x DP consecutive samples and DP rank d takes its B. */
static void lab09_load(lab09_run *r, int microbatch) {
    int S = r->seq, B = r->mbs;
    for (int j = 0; j < B; j++) {
        long long in_step = ((long long)microbatch * r->dp + r->dp_rank) * B + j;
        lab09_sample(S, r->d.model->vocab, r->consumed + in_step, r->sample);
        if (in_step < r->seen_cap) r->seen[in_step]++;
        for (int s = 0; s < S; s++) {
            r->tokens[s * B + j] = r->sample[s];
            r->labels[s * B + j] = r->sample[s + 1];
        }
    }
}

static int lab09_hook_forward(void *app, int chunk, int microbatch, const float *input,
                              float **output, double *loss_sum, double *num_tokens) {
    lab09_run *r = (lab09_run *)app;
    lab09_load(r, microbatch);
    return mc_gpt_forward_step(&r->gpt, chunk, microbatch, r->tokens, r->labels, input, output,
                               loss_sum, num_tokens);
}

static int lab09_hook_backward(void *app, int chunk, int microbatch, const float *output_grad,
                               float loss_scale, float **input_grad) {
    lab09_run *r = (lab09_run *)app;
    r->backwards++;
    r->synced_backwards += r->grad_sync_on;
    return mc_gpt_backward_step(&r->gpt, chunk, microbatch, output_grad, loss_scale, input_grad);
}

static void lab09_hook_grad_sync(void *app, int chunk, int enable) {
    lab09_run *r = (lab09_run *)app;
    r->grad_sync_on = enable;
    mc_gpt_set_grad_sync(&r->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&r->ddp, chunk, enable);
}

static int lab09_hook_finalize(void *app) {
    lab09_run *r = (lab09_run *)app;
    return mc_finalize_model_grads(&r->ps, &r->ddp, NULL, NULL, 0, NULL);
}

/* The model's lifecycle in one place (its release function may be renamed). */
static void lab09_gpt_release(mc_gpt *g) { mc_gpt_destroy(g); }

static void lab09_run_free(lab09_run *r) {
    if (r->have_opt) mc_optimizer_destroy(&r->opt);
    if (r->have_ddp) mc_ddp_destroy(&r->ddp);
    if (r->have_gpt) lab09_gpt_release(&r->gpt);
    if (r->have_ps) mc_parallel_destroy(&r->ps);
    free(r->tokens);
    free(r->labels);
    free(r->sample);
    free(r->seen);
    memset(r, 0, sizeof *r);
}

/* Bytes mc_gpt_init allocates on this rank for a model with n_slots activation slots (a
   collective over the pipeline: the tied embedding is synchronised at init). */
static long long lab09_gpt_bytes(mc_parallel_state *ps, const mc_gpt_config *cfg, int n_slots) {
    lab_heap_stats before, after;
    mc_gpt g;
    lab_heap_stats_get(&before);
    MC_CHECK(mc_gpt_init(&g, &(mc_gpt_desc){.config = *cfg, .ps = ps, .n_slots = n_slots}));
    lab_heap_stats_get(&after);
    lab09_gpt_release(&g);
    return after.live_bytes - before.live_bytes;
}

/* Sets up a run on d->world (every rank of it calls this). Returns the calculator's status:
   MC_OK, or its refusal (nothing else is then set up). */
static int lab09_run_init(lab09_run *r, const lab09_run_desc *d) {
    memset(r, 0, sizeof *r);
    r->d = *d;
    MC_CHECK(mc_parallel_init(&r->ps, &(mc_parallel_desc){
                                          .world = d->world,
                                          .grid = {.tp = d->tp, .pp = d->pp}}));
    r->have_ps = 1;
    r->dp = r->ps.grid.dp;
    r->dp_rank = r->ps.coords.dp;
    r->mbs = d->batch.micro_batch_size;
    r->seq = d->model->seq;
    mc_microbatch_desc bd = d->batch;
    bd.data_parallel_size = r->dp;
    int rc = mc_microbatch_init(&r->mb, &bd);
    if (rc != MC_OK) return rc;

    mc_gpt_config cfg = lab09_config(d->model, d->layers, d->tp, d->pp, r->mbs);
    lab_heap_stats before, after;
    lab_heap_stats_get(&before);
    MC_CHECK(mc_gpt_init(&r->gpt, &(mc_gpt_desc){.config = cfg, .ps = &r->ps,
                                                  .n_slots = d->n_slots > 0 ? d->n_slots : 1}));
    lab_heap_stats_get(&after);
    r->have_gpt = 1;
    r->gpt_heap_bytes = after.live_bytes - before.live_bytes;
    mc_comm *dp = mc_parallel_group(&r->ps, MC_GROUP_DP_CP);
    MC_CHECK(mc_ddp_init(&r->ddp, &(mc_ddp_desc){.table = &r->gpt.table, .grads = r->gpt.grads,
                                                  .dp = dp}));
    r->have_ddp = 1;
    if (d->optimizer) {
        MC_CHECK(mc_optimizer_init(&r->opt, &(mc_optimizer_desc){
                                                .ddp = &r->ddp, .params = r->gpt.params,
                                                .ps = &r->ps, .lr = 3e-3f,
                                                .lr_decay_style = MC_LR_DECAY_CONSTANT}));
        r->have_opt = 1;
    }
    size_t n = (size_t)r->seq * (size_t)r->mbs;
    r->tokens = lab_xcalloc(n, sizeof(int));
    r->labels = lab_xcalloc(n, sizeof(int));
    r->sample = lab_xcalloc((size_t)r->seq + 1, sizeof(int));
    r->seen_cap = r->mb.global_batch_size > r->mb.current_global_batch_size
                      ? r->mb.global_batch_size
                      : r->mb.current_global_batch_size;
    r->seen = lab_xcalloc((size_t)r->seen_cap, sizeof(int));
    r->hooks = (mc_schedule_hooks){.app = r,
                                   .forward_step = lab09_hook_forward,
                                   .backward_step = lab09_hook_backward,
                                   .grad_sync = lab09_hook_grad_sync,
                                   .finalize = lab09_hook_finalize,
                                   .tensor_elems = r->gpt.p2p_elems,
                                   .clock = d->clock ? lab09_clock : NULL};
    return MC_OK;
}

/* What one training step measured (the same on every rank of the run). */
typedef struct lab09_step {
    double loss;                    /* lm loss over the global batch */
    double ms;                      /* slowest rank's step time */
    int gbs, m;                     /* calculator: global batch and micro-batches */
    int m_ran;                      /* micro-batches the schedule ran (forwards on this rank) */
    int backwards, synced_backwards;   /* this rank: backwards, those with grad sync on */
    int dp_collectives;             /* DDP bucket collectives of this step (this rank) */
    int distinct_samples;           /* samples of the step that some forward consumed */
    int min_ranks_per_sample, max_ranks_per_sample;
} lab09_step;

static void lab09_run_step(lab09_run *r, lab09_step *out) {
    mc_comm *w = r->ps.world;
    MC_CHECK(mc_microbatch_update(&r->mb, r->consumed, 1));
    int gbs = r->mb.current_running_global_batch_size, m = r->mb.num_microbatches;
    memset(r->seen, 0, sizeof(int) * (size_t)r->seen_cap);
    r->backwards = r->synced_backwards = 0;
    double t0 = lab_now();
    MC_CHECK(mc_ddp_zero_grad(&r->ddp));
    mc_gpt_zero_grad(&r->gpt);
    mc_forward_backward_func fb = mc_get_forward_backward_func(&r->ps);
    MC_CHECK(fb(&r->ps, &r->hooks, m, 0, &lab09_result));
    if (r->have_opt) MC_CHECK(mc_optimizer_step(&r->opt));
    double ms = (lab_now() - t0) * 1e3;

    double mine[2] = {0.0, 0.0}, all[2];
    if (mc_parallel_is_last_stage(&r->ps, 1) && r->ps.coords.tp == 0)
        mine[0] = lab09_result.loss_sum, mine[1] = lab09_result.num_tokens;
    MC_CHECK(lab_all_reduce_f64(w, mine, all, 2, MC_SUM));
    double slowest;
    MC_CHECK(lab_all_reduce_f64(w, &ms, &slowest, 1, MC_MAX));
    int *counts = lab_xcalloc((size_t)r->seen_cap, sizeof(int));
    MC_CHECK(lab_all_reduce_i32(w, r->seen, counts, (size_t)r->seen_cap, MC_SUM));

    memset(out, 0, sizeof *out);
    out->loss = all[1] > 0 ? all[0] / all[1] : 0.0;
    out->ms = slowest;
    out->gbs = gbs;
    out->m = m;
    int forwards = 0;
    for (int i = 0; i < lab09_result.n_ops && i < MC_SCHEDULE_TRACE_MAX; i++)
        forwards += lab09_result.ops[i].kind == 'F';
    out->m_ran = forwards;
    out->backwards = r->backwards;
    out->synced_backwards = r->synced_backwards;
    for (int e = 0; e < r->ddp.n_events; e++)
        out->dp_collectives += r->ddp.events[e].kind == MC_DDP_LAUNCH ||
                               r->ddp.events[e].kind == MC_DDP_SYNC;
    out->min_ranks_per_sample = 1 << 30;
    for (int k = 0; k < gbs && k < r->seen_cap; k++) {
        out->distinct_samples += counts[k] > 0;
        if (counts[k] < out->min_ranks_per_sample) out->min_ranks_per_sample = counts[k];
        if (counts[k] > out->max_ranks_per_sample) out->max_ranks_per_sample = counts[k];
    }
    free(counts);
    r->consumed += gbs;
}

/* ---------------------------------------------------------------------------------------------
   Sub-worlds: a run on some ranks while the others wait asleep (a polling wait would take
   the cores the run is measured on). */

/* Every rank of the world meets here; an early rank sleeps between tests of the barrier. */
static void lab09_meet(lab_ctx *cx) {
    mc_request *req = NULL;
    MC_CHECK(mc_barrier_async(cx->world, &req));
    double deadline = lab_now() + 600.0;
    for (;;) {
        int done = 0;
        MC_CHECK(mc_test(req, &done));
        if (done) return;
        if (lab_now() > deadline) {
            fprintf(stderr, "lab09: rank %d waited 600 s for the other ranks; stopping\n",
                    cx->me);
            lab_abort(LAB_EXIT_FAILED);
        }
        struct timespec nap = {0, 20 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

/* The first n world ranks as a communicator (NULL on the others). Collective on the world. */
static mc_comm *lab09_sub_world(lab_ctx *cx, int n) {
    int members[64];
    for (int i = 0; i < n; i++) members[i] = i;
    mc_comm *sub = NULL;
    MC_CHECK(mc_comm_create_group(cx->world, members, n, &sub));
    return sub;
}

/* ---------------------------------------------------------------------------------------------
   State */

typedef struct lab09_cfg {
    int tp, dp, pp, mbs, gbs;
    int m;                          /* calculator */
    int m_formula;                  /* GBS / (MBS x DP) */
    int m_ran;
    double loss[LAB09_MAX_STEPS];
    double ms[LAB09_MAX_STEPS];
    double step_ms_median;
    double max_rel_diff;            /* vs the single-rank run, over the steps */
    int distinct_samples;
    int min_ranks_per_sample, max_ranks_per_sample;
    int backwards_per_step, synced_backwards_per_step;
    int dp_collectives_per_step, n_buckets;
    long long gpt_heap_bytes;       /* rank 0 */
    long long slot_bytes;           /* rank 0: one micro-batch's activation slot */
} lab09_cfg;

typedef struct lab09_stage {
    double busy_ms, first_ms, last_ms;
    int in_flight, in_flight_formula;
    int warmup;
    long long slot_bytes;           /* one micro-batch's activation slot */
    long long p2p_peak_bytes;       /* peak of the schedule's allocations during the run */
    long long p2p_tensor_bytes;     /* usable bytes of one received tensor */
    int p2p_buffers;                /* p2p_peak_bytes / p2p_tensor_bytes */
    double bubble;                  /* 1 - busy / makespan, last measured iteration */
    /* the expected side from mc_memory_estimate, when this build has it */
    int estimated;
    int est_in_flight, est_p2p_buffers;
    double est_slot_bytes;
} lab09_stage;

typedef struct lab09_pair {
    int p, m;
    double formula;                 /* (p - 1) / (m + p - 1) */
    double measured;                /* median over the quiet iterations (else over all) */
    int n_reps, n_quiet;
    double reps[LAB09_BUBBLE_MAX_REPS];     /* bubble of each measured iteration */
    double shares[LAB09_BUBBLE_MAX_REPS];   /* the least CPU share of a stage in it */
    int quiet[LAB09_BUBBLE_MAX_REPS];       /* every stage had its core */
    double median_share;
    double kept_bubble;             /* the bubble of the iteration whose timeline is kept */
    double replay;                  /* that timeline replayed with free communication */
    double makespan_ms;
    int checked;                    /* 1: enough quiet iterations, compared with the tolerance */
    lab09_stage stage[8];
    /* the timeline of the last iteration: per stage 2m ops (kind, mb, start, end) */
    double *timeline;
} lab09_pair;

typedef struct lab09_ramp_row {
    int iteration;
    long long consumed;
    int gbs, m;                     /* ramp-up calculator */
    int gbs_formula, m_formula;     /* Megatron's formula */
    int step_gbs, step_m;           /* the equivalent step schedule */
    int m_ran;                      /* training: micro-batches the schedule ran */
    double loss;
} lab09_ramp_row;

typedef struct lab09_state {
    int steps;
    int cores;
    int n_checks, n_failed;         /* of the experiment running now (LAB09_CHECK) */
    /* A */
    int n_cfg;
    lab09_cfg cfg[LAB09_MAX_CFG];
    lab09_cfg single;               /* TP = DP = 1 on rank 0 */
    lab09_cfg unfair;               /* largest TP, M = 1 */
    double max_rel_diff, unfair_rel_diff;
    const char *losses_equal;
    /* B */
    int n_pairs;
    lab09_pair pair[LAB09_MAX_PAIRS];
    int figure_pair;
    /* C */
    int ramp_tp, ramp_dp, ramp_mbs;
    mc_rampup ramp;
    int ramp_gbs;
    char step_schedule[256];
    int n_rows;
    lab09_ramp_row row[LAB09_MAX_ROWS];
    int n_change_points;
    long long change_point[LAB09_MAX_ROWS];
    char refusal[512];
    int refusal_status;
    int refusal_gbs, refusal_mbs, refusal_dp;
    /* F */
    int fu_gbs, fu_mbs, fu_tp, fu_pp, fu_dp, fu_m, fu_m_formula;
    lab09_cfg fu, fu_single;
    double fu_rel_diff;
    int cp_tp, cp_pp, cp_cp, cp_dp, cp_m;
} lab09_state;

/* lab_check, counted for the experiment's closing line. */
#define LAB09_CHECK(cx, ok, ...)                                                                  \
    (((lab09_state *)(cx)->state)->n_checks++,                                                \
     ((lab09_state *)(cx)->state)->n_failed += !lab_check((cx), (ok), __VA_ARGS__))

/* The experiment's last line: what its measurements were compared with, and how that went. */
static void lab09_compared(lab_ctx *cx, const char *what) {
    lab09_state *st = cx->state;
    if (st->n_failed == 0)
        lab_printf0("  compared %s: %d checks, all held\n", what, st->n_checks);
    else
        lab_printf0("  compared %s: %d of %d checks FAILED\n", what, st->n_failed, st->n_checks);
    st->n_checks = st->n_failed = 0;
}

/* ---------------------------------------------------------------------------------------------
   Helpers */

static int lab09_is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

static int lab09_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int lab09_steps(const lab_ctx *cx) {
    const char *v = lab_flag_value(cx, "--steps");
    int k = v ? atoi(v) : (cx->args->quick ? 2 : LAB09_STEPS);
    return k < 1 ? 1 : k > LAB09_MAX_STEPS ? LAB09_MAX_STEPS : k;
}

static double lab09_median(const double *v, int n) {
    double tmp[LAB09_MAX_STEPS];
    memcpy(tmp, v, sizeof(double) * (size_t)n);
    return lab_median(tmp, n);
}

static double lab09_rel_diff(double a, double ref) {
    return fabs(a - ref) / (fabs(ref) > 0 ? fabs(ref) : 1.0);
}

/* Trains K steps of one layout on `world` and fills c (every rank of world calls it). */
static void lab09_train(lab09_cfg *c, mc_comm *world, int tp, int pp, int gbs, int mbs,
                        int steps) {
    lab09_run r;
    lab09_run_desc d = {.world = world, .tp = tp, .pp = pp, .model = &lab09_small,
                        .layers = lab09_small.layers,
                        .batch = {.global_batch_size = gbs, .micro_batch_size = mbs},
                        .n_slots = pp, .optimizer = 1};   /* 1F1B holds at most PP */
    MC_CHECK(lab09_run_init(&r, &d));
    memset(c, 0, sizeof *c);
    c->tp = tp;
    c->pp = pp;
    c->dp = r.dp;
    c->mbs = mbs;
    c->gbs = gbs;
    c->m = r.mb.num_microbatches;
    c->m_formula = gbs / (mbs * r.dp);
    c->n_buckets = r.gpt.table.n_buckets;
    c->gpt_heap_bytes = r.gpt_heap_bytes;
    c->min_ranks_per_sample = 1 << 30;
    for (int k = 0; k < steps; k++) {
        lab09_step st;
        lab09_run_step(&r, &st);
        c->loss[k] = st.loss;
        c->ms[k] = st.ms;
        c->m_ran = st.m_ran;
        c->distinct_samples = st.distinct_samples;
        if (st.min_ranks_per_sample < c->min_ranks_per_sample)
            c->min_ranks_per_sample = st.min_ranks_per_sample;
        if (st.max_ranks_per_sample > c->max_ranks_per_sample)
            c->max_ranks_per_sample = st.max_ranks_per_sample;
        c->backwards_per_step = st.backwards;
        c->synced_backwards_per_step = st.synced_backwards;
        c->dp_collectives_per_step = st.dp_collectives;
    }
    c->step_ms_median = lab09_median(c->ms, steps);
    lab09_run_free(&r);
}

/* The single-rank run of the same batch on world rank 0 alone; everyone else waits. */
static void lab09_train_single(lab_ctx *cx, lab09_cfg *c, int gbs, int mbs, int steps) {
    mc_comm *one = lab09_sub_world(cx, 1);
    if (one != NULL) {
        lab09_train(c, one, 1, 1, gbs, mbs, steps);
        mc_comm_destroy(one);
    }
    lab09_meet(cx);
}

/* ---------------------------------------------------------------------------------------------
   A. fixed global batch across the TP ladder */

static int lab09_run_a(lab_ctx *cx) {
    lab09_state *st = cx->state;
    int N = cx->world_size, mbs = 1, gbs = N * mbs, K = st->steps;
    lab_heading(cx, "A. fixed global batch %d (MBS %d) on %d ranks while TP changes, %d steps each",
                gbs, mbs, N, K);
    st->n_cfg = 0;
    for (int tp = 1; tp <= N && tp <= 8; tp *= 2) {
        lab09_cfg *c = &st->cfg[st->n_cfg++];
        lab09_train(c, cx->world, tp, 1, gbs, mbs, K);
        /* one slot's bytes on rank 0: a model with a second slot, minus this one */
        mc_parallel_state ps;
        MC_CHECK(mc_parallel_init(&ps, &(mc_parallel_desc){.world = cx->world,
                                                            .grid = {.tp = tp}}));
        mc_gpt_config cfg = lab09_config(&lab09_small, lab09_small.layers, tp, 1, mbs);
        c->slot_bytes = lab09_gpt_bytes(&ps, &cfg, 2) - lab09_gpt_bytes(&ps, &cfg, 1);
        mc_parallel_destroy(&ps);
    }
    lab09_train_single(cx, &st->single, gbs, mbs, K);
    /* rank 0 ran the single-rank run: give its numbers to every rank */
    MC_CHECK(lab_broadcast_bytes(cx->world, &st->single, sizeof st->single, 0));

    /* broken mode: the largest TP with M kept at 1, so GBS = MBS x DP */
    lab09_cfg *big = &st->cfg[st->n_cfg - 1];
    lab09_train(&st->unfair, cx->world, big->tp, 1, mbs * big->dp, mbs, K);

    st->max_rel_diff = 0;
    int bitwise = 1;
    for (int i = 0; i < st->n_cfg; i++) {
        lab09_cfg *c = &st->cfg[i];
        c->max_rel_diff = 0;
        for (int k = 0; k < K; k++) {
            double d = lab09_rel_diff(c->loss[k], st->single.loss[k]);
            if (d > c->max_rel_diff) c->max_rel_diff = d;
            bitwise &= c->loss[k] == st->single.loss[k];
        }
        if (c->max_rel_diff > st->max_rel_diff) st->max_rel_diff = c->max_rel_diff;
    }
    st->losses_equal = bitwise ? "identical"
                       : st->max_rel_diff <= LAB09_LOSS_RTOL ? "within_tolerance"
                                                             : "different";
    st->unfair_rel_diff = 0;
    for (int k = 0; k < K; k++) {
        double d = lab09_rel_diff(st->unfair.loss[k], big->loss[k]);
        if (d > st->unfair_rel_diff) st->unfair_rel_diff = d;
    }

    lab_printf0("  TP  DP   M  GBS  M=GBS/(MBS*DP)  samples  ranks/sample  sync-on B  DP colls"
                "  step ms   act. slot   loss step 1 .. %d\n", K);
    for (int i = 0; i < st->n_cfg; i++) {
        lab09_cfg *c = &st->cfg[i];
        lab_printf0("  %2d  %2d  %2d  %3d  %14d  %7d  %12d  %4d of %-2d  %8d  %7.1f  %8.1f KiB ",
                    c->tp, c->dp, c->m, c->gbs, c->m_formula, c->distinct_samples,
                    c->max_ranks_per_sample, c->synced_backwards_per_step, c->backwards_per_step,
                    c->dp_collectives_per_step, c->step_ms_median, c->slot_bytes / 1024.0);
        for (int k = 0; k < K; k++) lab_printf0(" %.7f", c->loss[k]);
        lab_printf0("\n");
    }
    lab_printf0("  single rank (TP 1, DP 1, M %d):", st->single.m);
    for (int k = 0; k < K; k++) lab_printf0(" %.7f", st->single.loss[k]);
    lab_printf0("\n  losses vs the single-rank run: largest relative difference %.2e over %d "
                "layouts and %d steps -> %s (tolerance %.0e)\n",
                st->max_rel_diff, st->n_cfg, K, st->losses_equal, LAB09_LOSS_RTOL);
    lab_printf0("  broken mode, TP %d with M left at 1: GBS %d instead of %d; its losses differ "
                "from the fair run by up to %.2e (relative)\n",
                st->unfair.tp, st->unfair.gbs, gbs, st->unfair_rel_diff);

    for (int i = 0; i < st->n_cfg; i++) {
        lab09_cfg *c = &st->cfg[i];
        LAB09_CHECK(cx, c->m == c->m_formula && c->m * c->mbs * c->dp == gbs,
                    "TP %d: the calculator's M (%d) is GBS / (MBS x DP) = %d / (%d x %d) = %d",
                    c->tp, c->m, gbs, c->mbs, c->dp, c->m_formula);
        LAB09_CHECK(cx, c->dp == N / c->tp, "TP %d: DP = world / TP = %d (got %d)", c->tp,
                    N / c->tp, c->dp);
        LAB09_CHECK(cx, c->m_ran == c->m, "TP %d: the schedule ran %d forwards for M = %d",
                    c->tp, c->m_ran, c->m);
        LAB09_CHECK(cx, c->distinct_samples == gbs,
                    "TP %d: the world consumed %d distinct samples per step (GBS %d)", c->tp,
                    c->distinct_samples, gbs);
        LAB09_CHECK(cx, c->min_ranks_per_sample == c->tp && c->max_ranks_per_sample == c->tp,
                    "TP %d: every sample went through exactly TP ranks (got %d..%d)", c->tp,
                    c->min_ranks_per_sample, c->max_ranks_per_sample);
        LAB09_CHECK(cx, c->synced_backwards_per_step == 1 && c->backwards_per_step == c->m,
                    "TP %d: grad sync was on for 1 of the %d backwards (got %d of %d)", c->tp,
                    c->m, c->synced_backwards_per_step, c->backwards_per_step);
        LAB09_CHECK(cx, c->dp == 1 || c->dp_collectives_per_step == c->n_buckets,
                    "TP %d: %d DP collectives per step, one per bucket (%d), whatever M", c->tp,
                    c->dp_collectives_per_step, c->n_buckets);
        LAB09_CHECK(cx, c->max_rel_diff <= LAB09_LOSS_RTOL,
                    "TP %d: losses within %.0e of the single-rank run (%.2e)", c->tp,
                    LAB09_LOSS_RTOL, c->max_rel_diff);
        LAB09_CHECK(cx, c->slot_bytes > 0, "TP %d: one activation slot has bytes (%lld)", c->tp,
                    c->slot_bytes);
    }
    LAB09_CHECK(cx, st->single.m == gbs / mbs, "single rank: M = GBS / MBS = %d (got %d)",
                gbs / mbs, st->single.m);
    LAB09_CHECK(cx, st->n_cfg < 2 || st->cfg[st->n_cfg - 1].slot_bytes < st->cfg[0].slot_bytes,
                "a micro-batch's activations per rank shrink with TP");
    LAB09_CHECK(cx, st->unfair.gbs == mbs * big->dp && st->unfair_rel_diff > LAB09_LOSS_RTOL,
                "broken mode: GBS %d = MBS x DP, and its losses differ from the fair run",
                st->unfair.gbs);
    lab09_compared(cx, "M with GBS / (MBS x DP), DP with world / TP, samples per step with GBS "
                       "and ranks per sample with TP, sync-on backwards with 1 and DP collectives "
                       "with the buckets, every loss with the single-rank run (1e-5), the broken "
                       "mode's with the fair run");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   B. the pipeline bubble from the schedule's timeline */

static int lab09_parse_pairs(const char *text, lab09_pair *out, int cap) {
    int n = 0;
    const char *s = text;
    while (s && *s && n < cap) {
        int p = 0, m = 0, used = 0;
        if (sscanf(s, "%dx%d%n", &p, &m, &used) != 2) return -1;
        memset(&out[n], 0, sizeof out[n]);
        out[n].p = p;
        out[n].m = m;
        n++;
        s += used;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

/* CPU seconds of this process: a stage that keeps its core accrues CPU time at the rate of
   the wall clock (waits poll the network), one that shares its core with other processes
   falls behind. */
static double lab09_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1 when every rank of c runs on this host, so CLOCK_MONOTONIC is one clock for all of them
   (collective on c). */
static int lab09_one_host(mc_comm *c) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    uint32_t h = lab_nonce_hash(host) & 0x7fffffff;
    int mine[2] = {(int)h, -(int)h}, all[2];
    MC_CHECK(lab_all_reduce_i32(c, mine, all, 2, MC_MAX));
    return all[0] == -all[1];
}

/* Starts an iteration on every rank of c at once: with one clock, rank 0 names a moment a few
   milliseconds ahead and every rank waits for it (a barrier alone lets ranks leave it
   milliseconds apart when they share cores); otherwise the barrier's exit. Returns the start
   time on this rank's clock. */
static double lab09_start_together(mc_comm *c, int one_clock) {
    MC_CHECK(mc_barrier(c));
    if (!one_clock) return lab_now();
    double at = lab_now() + 0.005;
    MC_CHECK(lab_broadcast_bytes(c, &at, sizeof at, 0));
    while (lab_now() < at) {}
    return at;
}

#if defined(MC_MEMORY_MAX_TERMS)
/* The memory estimate (megatron_c.h >>theoretical_memory) of one stage: the micro-batches it
   holds at the peak, one slot's activation bytes (the implementation model with two slots minus
   one slot) and the receive buffers at the peak. */
static void lab09_estimate(lab09_stage *g, const mc_gpt_config *cfg, int m, int stage) {
    mc_memory_stage one, two, run;
    mc_memory_desc d;
    memset(&d, 0, sizeof d);
    d.config = *cfg;
    d.data_parallel_size = 1;
    d.num_microbatches = m;
    d.n_slots = 1;
    int rc = mc_memory_estimate(&d, stage, &one);
    d.n_slots = 2;
    if (rc == MC_OK) rc = mc_memory_estimate(&d, stage, &two);
    d.n_slots = m;
    if (rc == MC_OK) rc = mc_memory_estimate(&d, stage, &run);
    if (rc != MC_OK) return;
    g->estimated = 1;
    g->est_in_flight = run.in_flight;
    g->est_p2p_buffers = run.p2p_buffers;
    g->est_slot_bytes = two.bytes[MC_MEMORY_IMPLEMENTATION][MC_MEMORY_ACTIVATIONS] -
                        one.bytes[MC_MEMORY_IMPLEMENTATION][MC_MEMORY_ACTIVATIONS];
}
#endif

/* The kept timeline replayed with free communication: every op keeps its measured duration
   and its stage's order, and starts as soon as its stage is free and its input exists (F on
   stage s after F of the micro-batch on s - 1; B after B on s + 1, or after its own F on the
   last stage). The bubble of that replay is the idle time the schedule's dependencies imply
   for these durations; what the real timeline adds on top is communication and waiting. */
static double lab09_replay(const lab09_pair *pr) {
    int p = pr->p, m = pr->m, n = 2 * m;
    double f_end[8][LAB09_MAX_M], b_end[8][LAB09_MAX_M], clock[8] = {0}, busy[8] = {0};
    int next[8] = {0}, done = 0;
    for (int s = 0; s < p; s++)
        for (int k = 0; k < m; k++) f_end[s][k] = b_end[s][k] = -1.0;
    while (done < p * n) {
        int progressed = 0;
        for (int s = 0; s < p; s++) {
            const double *tl = pr->timeline + (size_t)s * 4 * n;
            while (next[s] < n) {
                const double *op = tl + 4 * next[s];
                int backward = op[0] > 0.5, mb = (int)op[1];
                if (mb < 0 || mb >= m) return -1.0;
                double ready = !backward ? (s == 0 ? 0.0 : f_end[s - 1][mb])
                               : s == p - 1 ? f_end[s][mb]
                                            : b_end[s + 1][mb];
                if (ready < 0) break;   /* its input is not produced yet */
                double d = op[3] - op[2], start = ready > clock[s] ? ready : clock[s];
                clock[s] = start + d;
                busy[s] += d;
                (backward ? b_end : f_end)[s][mb] = clock[s];
                next[s]++;
                done++;
                progressed = 1;
            }
        }
        if (!progressed) return -1.0;   /* an order the dependencies cannot run */
    }
    double makespan = 0, mean = 0;
    for (int s = 0; s < p; s++) makespan = clock[s] > makespan ? clock[s] : makespan;
    for (int s = 0; s < p; s++) mean += makespan > 0 ? 1.0 - busy[s] / makespan : 0.0;
    return mean / p;
}

#define LAB09_STAGE_ROW 9   /* busy, first, last (ms), in flight, slot, p2p peak, bubble, warmup,
                               makespan */

static void lab09_measure_pair(lab_ctx *cx, lab09_pair *pr) {
    int p = pr->p, m = pr->m;
    pr->formula = (double)(p - 1) / (double)(m + p - 1);
    size_t per_stage = (size_t)4 * 2 * (size_t)m;
    pr->timeline = lab_xcalloc(per_stage * (size_t)p, sizeof(double));
    double *row_all = lab_xcalloc((size_t)p * LAB09_STAGE_ROW, sizeof(double));
    mc_comm *sub = lab09_sub_world(cx, p);
    if (sub != NULL) {
        lab09_run r;
        lab09_run_desc d = {.world = sub, .tp = 1, .pp = p, .model = &lab09_pipe_model,
                            .layers = lab09_pipe_model.layers * p,
                            .batch = {.global_batch_size = m, .micro_batch_size = 1},
                            .n_slots = m, .optimizer = 0, .clock = 1};
        MC_CHECK(lab09_run_init(&r, &d));
        mc_gpt_config cfg = lab09_config(&lab09_pipe_model, d.layers, 1, p, 1);
        long long slot = lab09_gpt_bytes(&r.ps, &cfg, 2) - lab09_gpt_bytes(&r.ps, &cfg, 1);
        double row[LAB09_STAGE_ROW] = {0}, kept_row[LAB09_STAGE_ROW] = {0};
        double *tl = lab_xcalloc(per_stage, sizeof(double));
        double *kept_tl = lab_xcalloc(per_stage, sizeof(double));
        double budget = p > lab09_cores() ? 1.0 : cx->args->quick ? 2.0 : LAB09_BUBBLE_BUDGET_S;
        double began = lab_now();
        int kept = 0, one_clock = lab09_one_host(sub);
        for (int rep = 0; rep <= LAB09_BUBBLE_MAX_REPS; rep++) {
            double t0 = lab09_start_together(sub, one_clock), c0 = lab09_cpu_now();
            lab_heap_stats before, after;
            lab_heap_stats_get(&before);
            lab_heap_peak_reset();
            lab09_step step;
            r.consumed = 0;
            lab09_run_step(&r, &step);
            const mc_schedule_result *res = &lab09_result;
            double wall = res->op_end[res->n_ops - 1] - t0;
            double share = (lab09_cpu_now() - c0) / (lab_now() - t0);
            lab_heap_stats_get(&after);
            double busy = 0;
            int held = 0, in_flight = 0;
            for (int i = 0; i < res->n_ops; i++) {
                busy += res->op_end[i] - res->op_start[i];
                held += res->ops[i].kind == 'F' ? 1 : -1;
                if (held > in_flight) in_flight = held;
            }
            double first = res->op_start[0] - t0;
            /* the makespan: the first start to the last end over every stage */
            double mine[3] = {-first, wall, -share}, span[3];
            MC_CHECK(lab_all_reduce_f64(sub, mine, span, 3, MC_MAX));
            double makespan = span[1] + span[0];
            double b = 1.0 - busy / makespan, sum = 0;
            MC_CHECK(lab_all_reduce_f64(sub, &b, &sum, 1, MC_SUM));
            double elapsed = lab_now() - began, slowest;
            MC_CHECK(lab_all_reduce_f64(sub, &elapsed, &slowest, 1, MC_MAX));
            if (rep == 0) continue;   /* warm-up: first touch of every buffer */
            int quiet = -span[2] >= LAB09_QUIET_SHARE;
            if (pr->n_reps < LAB09_BUBBLE_MAX_REPS) {
                pr->reps[pr->n_reps] = sum / p;
                pr->shares[pr->n_reps] = -span[2];
                pr->quiet[pr->n_reps] = quiet;
                pr->n_reps++;
            }
            pr->n_quiet += quiet;
            double values[LAB09_STAGE_ROW] = {busy * 1e3, first * 1e3, wall * 1e3, in_flight,
                                              (double)slot,
                                              (double)(after.peak_bytes - before.live_bytes), b,
                                              res->n_warmup, makespan * 1e3};
            memcpy(row, values, sizeof row);
            for (int i = 0; i < 2 * m; i++) {
                int ok = i < res->n_ops;
                tl[4 * i] = ok && res->ops[i].kind == 'B';
                tl[4 * i + 1] = ok ? res->ops[i].microbatch : 0;
                tl[4 * i + 2] = ok ? (res->op_start[i] - t0) * 1e3 : 0;
                tl[4 * i + 3] = ok ? (res->op_end[i] - t0) * 1e3 : 0;
            }
            if (quiet || !kept) {   /* keep the last quiet iteration (any, before one) */
                memcpy(kept_row, row, sizeof row);
                memcpy(kept_tl, tl, sizeof(double) * per_stage);
                kept = kept || quiet;
            }
            if (pr->n_quiet >= LAB09_BUBBLE_QUIET || slowest > budget) break;
        }
        MC_CHECK(lab_all_gather_f64(sub, kept_row, row_all, LAB09_STAGE_ROW));
        MC_CHECK(lab_all_gather_f64(sub, kept_tl, pr->timeline, per_stage));
        free(tl);
        free(kept_tl);
        lab09_run_free(&r);
        mc_comm_destroy(sub);
    }
    lab09_meet(cx);
    /* rank 0 ran in the sub-world: its view goes to everyone */
    MC_CHECK(lab_broadcast_bytes(cx->world, pr, offsetof(lab09_pair, timeline), 0));
    MC_CHECK(lab_broadcast_bytes(cx->world, row_all,
                                 sizeof(double) * (size_t)p * LAB09_STAGE_ROW, 0));
    MC_CHECK(lab_broadcast_bytes(cx->world, pr->timeline,
                                 sizeof(double) * per_stage * (size_t)p, 0));
    double chosen[LAB09_BUBBLE_MAX_REPS];
    int n = 0;
    for (int i = 0; i < pr->n_reps; i++)
        if (pr->quiet[i]) chosen[n++] = pr->reps[i];
    pr->checked = n >= LAB09_BUBBLE_MIN_QUIET;
    if (!pr->checked)
        for (int i = n = 0; i < pr->n_reps; i++) chosen[n++] = pr->reps[i];
    pr->measured = n > 0 ? lab_median(chosen, n) : 0.0;
    double shares[LAB09_BUBBLE_MAX_REPS];
    memcpy(shares, pr->shares, sizeof(double) * (size_t)pr->n_reps);
    pr->median_share = pr->n_reps > 0 ? lab_median(shares, pr->n_reps) : 0.0;
    size_t tensor = (size_t)lab09_pipe_model.seq * lab09_pipe_model.hidden * sizeof(float);
    void *probe = malloc(tensor);
    long long usable = probe ? (long long)malloc_usable_size(probe) : (long long)tensor;
    free(probe);
    for (int s = 0; s < p; s++) {
        lab09_stage *g = &pr->stage[s];
        const double *row = row_all + LAB09_STAGE_ROW * s;
        g->busy_ms = row[0];
        g->first_ms = row[1];
        g->last_ms = row[2];
        g->in_flight = (int)row[3];
        g->in_flight_formula = p - s < m ? p - s : m;
        g->slot_bytes = (long long)row[4];
        g->p2p_peak_bytes = (long long)row[5];
        g->p2p_tensor_bytes = usable;
        g->p2p_buffers = (int)(g->p2p_peak_bytes / usable);
        g->bubble = row[6];
        g->warmup = (int)row[7];
        pr->makespan_ms = row[8];
        pr->kept_bubble += g->bubble / p;
#if defined(MC_MEMORY_MAX_TERMS)
        mc_gpt_config cfg = lab09_config(&lab09_pipe_model, lab09_pipe_model.layers * p, 1, p, 1);
        lab09_estimate(g, &cfg, m, s);
#endif
    }
    free(row_all);
    pr->replay = lab09_replay(pr);
}

static int lab09_run_b(lab_ctx *cx) {
    lab09_state *st = cx->state;
    int N = cx->world_size;
    const char *spec = lab_flag_value(cx, "--pairs");
    char def[64];
    snprintf(def, sizeof def, N >= 4 && !cx->args->quick ? "2x2,2x8,4x4" : "2x2,2x8");
    lab09_pair parsed[LAB09_MAX_PAIRS];
    int n = lab09_parse_pairs(spec ? spec : def, parsed, LAB09_MAX_PAIRS);
    if (n <= 0) {
        lab_printf0("--pairs needs a list like 2x2,2x8 (p x m), got '%s'\n", spec);
        LAB09_CHECK(cx, 0, "--pairs is readable");
        return LAB_SKIPPED;
    }
    lab_heading(cx, "B. pipeline bubble from the schedule's timeline (1F1B on the first p ranks; "
                "the others sleep; %d cores here)", st->cores);
    st->n_pairs = 0;
    for (int i = 0; i < n; i++) {
        if (parsed[i].p < 2 || parsed[i].p > N || parsed[i].p > 8 || parsed[i].m < 1 ||
            parsed[i].m > LAB09_MAX_M) {
            lab_printf0("  (p %d, m %d) skipped: needs 2 <= p <= min(world, 8) and 1 <= m <= %d\n",
                        parsed[i].p, parsed[i].m, LAB09_MAX_M);
            continue;
        }
        lab09_pair *pr = &st->pair[st->n_pairs++];
        *pr = parsed[i];
        lab09_measure_pair(cx, pr);
    }
    /* the figure shows the last pair whose stages had a core each */
    st->figure_pair = st->n_pairs - 1;
    for (int i = 0; i < st->n_pairs; i++)
        if (st->pair[i].checked) st->figure_pair = i;
    lab_printf0("   p   m  formula (p-1)/(m+p-1)  measured  replay  quiet/iterations  CPU share  "
                "makespan ms\n");
    for (int i = 0; i < st->n_pairs; i++) {
        lab09_pair *pr = &st->pair[i];
        lab_printf0("  %2d  %2d  %21.3f  %8.3f  %6.3f  %7d/%-2d         %5.2f  %11.1f%s\n", pr->p,
                    pr->m, pr->formula, pr->measured, pr->replay, pr->n_quiet, pr->n_reps,
                    pr->median_share, pr->makespan_ms,
                    pr->checked ? ""
                    : pr->p > st->cores ? "   not compared: more stages than cores"
                                        : "   not compared: the stages shared their cores");
    }
    lab_printf0("  measured: median over the quiet iterations; replay: the kept iteration's ops "
                "with their measured durations and free communication (measured above the formula "
                "is unequal ops, above the replay is P2P and waiting)\n");
    lab_printf0("  per stage: busy ms, micro-batches in flight on the timeline (min(p-r, m)), one "
                "micro-batch's activations (allocator), held at the peak = in flight x slot (the "
                "model keeps m slots ready), the schedule's receive buffers at their peak\n");
    for (int i = 0; i < st->n_pairs; i++) {
        lab09_pair *pr = &st->pair[i];
        for (int s = 0; s < pr->p; s++) {
            lab09_stage *g = &pr->stage[s];
            lab_printf0("  p %d m %2d stage %d: busy %7.1f ms  warmup %d  in flight %d (%d)  "
                        "slot %6.1f KiB  activations at peak %7.1f KiB  receive buffers %d "
                        "(%.1f KiB)\n",
                        pr->p, pr->m, s, g->busy_ms, g->warmup, g->in_flight,
                        g->in_flight_formula, g->slot_bytes / 1024.0,
                        g->in_flight * g->slot_bytes / 1024.0, g->p2p_buffers,
                        g->p2p_peak_bytes / 1024.0);
        }
    }
    for (int i = 0; i < st->n_pairs; i++) {
        lab09_pair *pr = &st->pair[i];
        LAB09_CHECK(cx, pr->replay >= 0, "p %d m %d: the kept timeline replays in its order",
                    pr->p, pr->m);
        if (pr->checked) {
            /* the formula is the bubble of a balanced pipeline with free communication: real
               stages only add idle time to it */
            LAB09_CHECK(cx, pr->measured >= pr->formula - LAB09_BUBBLE_FLOOR_TOL,
                        "p %d m %d: measured bubble %.3f is not below (p-1)/(m+p-1) = %.3f",
                        pr->p, pr->m, pr->measured, pr->formula);
            /* How far the timeline sits above its replay is P2P and waiting on a shared
               machine: reported, never a check (a loaded host moves it freely). */
            if (fabs(pr->kept_bubble - pr->replay) > LAB09_BUBBLE_TOL)
                lab_printf0("  note: p %d m %d: the timeline's bubble %.3f is %.3f above its "
                            "replay with free communication (%.3f): time spent in P2P and "
                            "waiting\n", pr->p, pr->m, pr->kept_bubble,
                            pr->kept_bubble - pr->replay, pr->replay);
        }
        for (int s = 0; s < pr->p; s++) {
            lab09_stage *g = &pr->stage[s];
            int w = pr->p - s - 1 < pr->m ? pr->p - s - 1 : pr->m;
            LAB09_CHECK(cx, g->in_flight == g->in_flight_formula,
                        "p %d m %d stage %d: %d micro-batches in flight, min(p - r, m) = %d",
                        pr->p, pr->m, s, g->in_flight, g->in_flight_formula);
            LAB09_CHECK(cx, g->warmup == w,
                        "p %d m %d stage %d: warmup %d = min(p - r - 1, m) = %d", pr->p, pr->m, s,
                        g->warmup, w);
            LAB09_CHECK(cx, g->slot_bytes > 0, "p %d m %d stage %d: a slot has bytes", pr->p,
                        pr->m, s);
            LAB09_CHECK(cx, g->p2p_buffers <= g->in_flight_formula + 1,
                        "p %d m %d stage %d: %d receive buffers at the peak, at most in flight + 1",
                        pr->p, pr->m, s, g->p2p_buffers);
            if (g->estimated) {
                LAB09_CHECK(cx, g->in_flight == g->est_in_flight,
                            "p %d m %d stage %d: in flight %d, mc_memory_estimate %d", pr->p, pr->m,
                            s, g->in_flight, g->est_in_flight);
                /* the allocator counts usable sizes: a little above the requested bytes */
                LAB09_CHECK(cx, fabs((double)g->slot_bytes - g->est_slot_bytes) <=
                                    0.02 * g->est_slot_bytes + 4096,
                            "p %d m %d stage %d: one slot %lld bytes, mc_memory_estimate %.0f",
                            pr->p, pr->m, s, g->slot_bytes, g->est_slot_bytes);
                LAB09_CHECK(cx, g->p2p_buffers == g->est_p2p_buffers,
                            "p %d m %d stage %d: %d receive buffers at the peak, "
                            "mc_memory_estimate %d",
                            pr->p, pr->m, s, g->p2p_buffers, g->est_p2p_buffers);
            }
        }
    }
    int n_cmp = 0;
    for (int i = 0; i < st->n_pairs; i++) n_cmp += st->pair[i].checked;
    char what[512];
    snprintf(what, sizeof what,
             "the bubble with (p-1)/(m+p-1) as its floor and with its timeline's replay (%d of %d "
             "pairs had a core per stage), in flight with min(p-r, m), warmup with min(p-r-1, m), "
             "receive buffers with in flight + 1%s", n_cmp, st->n_pairs,
#if defined(MC_MEMORY_MAX_TERMS)
             ", each stage with mc_memory_estimate"
#else
             ""
#endif
    );
    lab09_compared(cx, what);
    return LAB_RAN;
}

/* The timeline of one (p, m) as an SVG: one row per stage, F and B boxes by micro-batch. */
static void lab09_figure(lab_ctx *cx) {
    lab09_state *st = cx->state;
    if (cx->me != 0 || st->n_pairs == 0) return;
    lab09_pair *pr = &st->pair[st->figure_pair];
    int p = pr->p, m = pr->m;
    lab_svg *svg = lab_svg_new(760, 110 + 36.0 * p);
    if (svg == NULL) return;
    lab_svg_axes ax = {.x = 70, .y = 40, .w = 660, .h = 36.0 * p, .x_min = 0,
                       .x_max = pr->makespan_ms > 0 ? pr->makespan_ms * 1.02 : 1,
                       .y_min = 0, .y_max = p, .x_ticks = 6, .y_ticks = 0,
                       .x_label = "time (ms)", .y_label = NULL};
    lab_svg_axes_draw(svg, &ax);
    char title[200];
    snprintf(title, sizeof title,
             "1F1B, p = %d, m = %d: bubble %.3f measured, %.3f = (p-1)/(m+p-1)%s", p, m,
             pr->measured, pr->formula, pr->checked ? "" : " (stages shared cores)");
    lab_svg_text(svg, 380, 20, LAB_SVG_MIDDLE, 13, title);
    double t_min = 1e300;
    for (int s = 0; s < p; s++) {
        const double *tl = pr->timeline + (size_t)s * 8 * m;
        if (tl[2] < t_min) t_min = tl[2];
    }
    for (int s = 0; s < p; s++) {
        const double *tl = pr->timeline + (size_t)s * 8 * m;
        char label[24];
        snprintf(label, sizeof label, "stage %d", s);
        lab_svg_text(svg, 62, lab_svg_y(&ax, p - s - 0.5) + 4, LAB_SVG_END, 11, label);
        for (int i = 0; i < 2 * m; i++) {
            int backward = tl[4 * i] > 0.5, mb = (int)tl[4 * i + 1];
            double a = tl[4 * i + 2] - t_min, b = tl[4 * i + 3] - t_min;
            char tip[64];
            snprintf(tip, sizeof tip, "%c%d on stage %d: %.2f..%.2f ms", backward ? 'B' : 'F', mb,
                     s, a, b);
            lab_svg_rect(svg, lab_svg_x(&ax, a), lab_svg_y(&ax, p - s - 0.1),
                         lab_svg_dx(&ax, b - a), lab_svg_dy(&ax, 0.8),
                         backward ? "#d62728" : "#1f77b4", tip);
        }
    }
    lab_svg_text(svg, 380, 100 + 36.0 * p, LAB_SVG_MIDDLE, 11,
                 "blue: forward, red: backward; gaps are the bubble (and P2P waits)");
    lab_figure(cx, "timeline", svg);
    lab_svg_free(svg);
}

/* ---------------------------------------------------------------------------------------------
   C. the calculator: ramp-up table, step schedule, a run on it, refusals */

/* Megatron's ramp-up formula, written out independently of the library. */
static int lab09_rampup_formula(const mc_rampup *r, int gbs, long long consumed) {
    if (consumed > r->samples) return gbs;
    int n_inc = (gbs - r->start) / r->increment;
    double per_inc = (double)r->samples / n_inc;
    return r->start + (int)floor((double)consumed / per_inc) * r->increment;
}

static int lab09_run_c(lab_ctx *cx) {
    lab09_state *st = cx->state;
    int N = cx->world_size;
    st->ramp_tp = N >= 2 ? 2 : 1;
    st->ramp_dp = N / st->ramp_tp;
    st->ramp_mbs = 1;
    int unit = st->ramp_mbs * st->ramp_dp;
    st->ramp = (mc_rampup){.start = unit, .increment = unit, .samples = 6LL * unit};
    st->ramp_gbs = 4 * unit;
    int n_inc = (st->ramp_gbs - st->ramp.start) / st->ramp.increment;
    long long per_inc = st->ramp.samples / n_inc;
    /* the step schedule with the same change points (Megatron HEAD's replacement) */
    size_t off = 0;
    for (int k = 0; k <= n_inc; k++)
        off += (size_t)snprintf(st->step_schedule + off, sizeof st->step_schedule - off,
                                "%s%lld:%d", k ? " " : "", k * per_inc,
                                st->ramp.start + k * st->ramp.increment);
    lab_heading(cx, "C. the calculator: ramp-up %d -> %d by %d over %lld samples (TP %d, DP %d, "
                "MBS %d)",
                st->ramp.start, st->ramp_gbs, st->ramp.increment, st->ramp.samples, st->ramp_tp,
                st->ramp_dp, st->ramp_mbs);

    mc_microbatch_calc ramp, step;
    MC_CHECK(mc_microbatch_init(&ramp, &(mc_microbatch_desc){
                                           .global_batch_size = st->ramp_gbs,
                                           .micro_batch_size = st->ramp_mbs,
                                           .data_parallel_size = st->ramp_dp, .rampup = st->ramp}));
    MC_CHECK(mc_microbatch_init(&step, &(mc_microbatch_desc){
                                           .micro_batch_size = st->ramp_mbs,
                                           .data_parallel_size = st->ramp_dp,
                                           .step_schedule = st->step_schedule}));
    st->n_change_points = mc_microbatch_change_points(&ramp, st->change_point, LAB09_MAX_ROWS);

    /* a real run on the ramp-up: the loop asks the calculator for M every iteration */
    lab09_run r;
    MC_CHECK(lab09_run_init(&r, &(lab09_run_desc){
                                    .world = cx->world, .tp = st->ramp_tp, .pp = 1,
                                    .model = &lab09_small, .layers = lab09_small.layers,
                                    .batch = {.global_batch_size = st->ramp_gbs,
                                              .micro_batch_size = st->ramp_mbs,
                                              .rampup = st->ramp},
                                    .optimizer = 1}));
    st->n_rows = 0;
    for (int it = 0; it < LAB09_RAMP_ITERS; it++) {
        lab09_ramp_row *row = &st->row[st->n_rows++];
        row->iteration = it + 1;
        row->consumed = r.consumed;
        MC_CHECK(mc_microbatch_update(&ramp, r.consumed, 1));
        MC_CHECK(mc_microbatch_update(&step, r.consumed, 1));
        row->gbs = ramp.current_global_batch_size;
        row->m = ramp.num_microbatches;
        row->gbs_formula = lab09_rampup_formula(&st->ramp, st->ramp_gbs, r.consumed);
        row->m_formula = row->gbs_formula / unit;
        row->step_gbs = step.current_global_batch_size;
        row->step_m = step.num_microbatches;
        lab09_step s;
        lab09_run_step(&r, &s);
        row->m_ran = s.m_ran;
        row->loss = s.loss;
    }
    lab09_run_free(&r);

    /* refusals: a batch that MBS x DP does not divide */
    st->refusal_gbs = 2 * unit + 1;
    st->refusal_mbs = st->ramp_mbs;
    st->refusal_dp = st->ramp_dp;
    mc_microbatch_calc bad;
    st->refusal_status = mc_microbatch_init(&bad, &(mc_microbatch_desc){
                                                      .global_batch_size = st->refusal_gbs,
                                                      .micro_batch_size = st->refusal_mbs,
                                                      .data_parallel_size = st->refusal_dp});
    snprintf(st->refusal, sizeof st->refusal, "%s", st->refusal_status ? mc_last_error() : "");

    lab_printf0("  iteration  consumed  GBS  M   formula GBS M   step schedule GBS M   M run  "
                "loss\n");
    for (int i = 0; i < st->n_rows; i++) {
        lab09_ramp_row *row = &st->row[i];
        lab_printf0("  %9d  %8lld  %3d  %2d  %11d %2d  %17d %2d  %6d  %.6f\n", row->iteration,
                    row->consumed, row->gbs, row->m, row->gbs_formula, row->m_formula,
                    row->step_gbs, row->step_m, row->m_ran, row->loss);
    }
    lab_printf0("  change points (consumed samples):");
    for (int i = 0; i < st->n_change_points && i < LAB09_MAX_ROWS; i++)
        lab_printf0(" %lld", st->change_point[i]);
    lab_printf0("\n  the same schedule as --step-batch-size-schedule \"%s\" (ramp-up was removed "
                "after core_v0.17)\n", st->step_schedule);
    lab_printf0("  GBS %d, MBS %d, DP %d: %s: %s\n", st->refusal_gbs, st->refusal_mbs,
                st->refusal_dp, mc_err_name(st->refusal_status), st->refusal);

    for (int i = 0; i < st->n_rows; i++) {
        lab09_ramp_row *row = &st->row[i];
        LAB09_CHECK(cx, row->gbs == row->gbs_formula && row->m == row->m_formula,
                    "iteration %d, %lld consumed: GBS %d M %d, the formula gives %d and %d",
                    row->iteration, row->consumed, row->gbs, row->m, row->gbs_formula,
                    row->m_formula);
        LAB09_CHECK(cx, row->step_gbs == row->gbs && row->step_m == row->m,
                    "iteration %d: the step schedule gives the ramp-up's batch", row->iteration);
        LAB09_CHECK(cx, row->m_ran == row->m,
                    "iteration %d: the schedule ran the calculator's M %d", row->iteration, row->m);
        LAB09_CHECK(cx, row->m * st->ramp_mbs * st->ramp_dp == row->gbs,
                    "iteration %d: M x MBS x DP = GBS", row->iteration);
    }
    LAB09_CHECK(cx, st->refusal_status == MC_ERR_INVALID_DESC,
                "GBS %d with MBS %d and DP %d is refused (%s)", st->refusal_gbs, st->refusal_mbs,
                st->refusal_dp, mc_err_name(st->refusal_status));
    lab09_compared(cx, "each row with Megatron's ramp-up formula, the equivalent step schedule and "
                       "the micro-batches the schedule ran; the refusal with MC_ERR_INVALID_DESC");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   F. the follow-up variant */

typedef struct lab09_variant {
    int gbs, mbs, tp, pp;
} lab09_variant;

static const lab09_variant lab09_variants[LAB09_N_VARIANTS] = {
    {16, 2, 2, 2},   /* F1: DP 2, M 4 */
    {12, 1, 4, 2},   /* F2: DP 1, M 12 */
    {12, 3, 1, 2},   /* F3: DP 4, M 1 */
};

static int lab09_run_f(lab_ctx *cx) {
    lab09_state *st = cx->state;
    int N = cx->world_size, K = st->steps;
    lab09_variant v = lab09_variants[cx->variant - 1];
    while (v.tp > 1 && v.tp * v.pp > N) v.tp /= 2;   /* smaller worlds: fewer TP ranks */
    st->fu_gbs = v.gbs;
    st->fu_mbs = v.mbs;
    st->fu_tp = v.tp;
    st->fu_pp = v.pp;
    st->fu_dp = N / (v.tp * v.pp);
    st->fu_m_formula = v.gbs / (v.mbs * st->fu_dp);
    lab_heading(cx, "F. follow-up %s: GBS %d with MBS %d on TP %d x PP %d (world %d), %d steps",
                cx->variant_name, v.gbs, v.mbs, v.tp, v.pp, N, K);
    if (v.gbs % (v.mbs * st->fu_dp) != 0) {
        lab_printf0("  GBS %d is not a multiple of MBS x DP = %d in this world: skipped\n", v.gbs,
                    v.mbs * st->fu_dp);
        return LAB_SKIPPED;
    }
    lab09_train(&st->fu, cx->world, v.tp, v.pp, v.gbs, v.mbs, K);
    lab09_train_single(cx, &st->fu_single, v.gbs, v.mbs, K);
    MC_CHECK(lab_broadcast_bytes(cx->world, &st->fu_single, sizeof st->fu_single, 0));
    st->fu_m = st->fu.m;
    st->fu_rel_diff = 0;
    for (int k = 0; k < K; k++) {
        double d = lab09_rel_diff(st->fu.loss[k], st->fu_single.loss[k]);
        if (d > st->fu_rel_diff) st->fu_rel_diff = d;
    }
    /* CP: the rank grid and the calculator only */
    st->cp_tp = v.tp;
    st->cp_pp = v.pp;
    st->cp_cp = 2;
    while (st->cp_tp > 1 && st->cp_tp * st->cp_pp * st->cp_cp > N) st->cp_tp /= 2;
    mc_grid g;
    if (st->cp_tp * st->cp_pp * st->cp_cp <= N &&
        mc_grid_init(&g, &(mc_grid_desc){.world = N, .tp = st->cp_tp, .pp = st->cp_pp,
                                          .cp = st->cp_cp}) == MC_OK) {
        st->cp_dp = g.dp;
        mc_microbatch_calc c;
        mc_microbatch_desc cd = {.global_batch_size = v.gbs, .micro_batch_size = v.mbs,
                                 .data_parallel_size = g.dp};
        st->cp_m = mc_microbatch_init(&c, &cd) == MC_OK ? c.num_microbatches : 0;
    }
    lab_printf0("  DP = %d / (TP %d x PP %d) = %d; M = GBS / (MBS x DP) = %d / (%d x %d) = %d "
                "(calculator %d); the schedule ran %d\n",
                N, v.tp, v.pp, st->fu_dp, v.gbs, v.mbs, st->fu_dp, st->fu_m_formula, st->fu.m,
                st->fu.m_ran);
    lab_printf0("  %d distinct samples per step; every sample on %d..%d ranks (TP x PP = %d)\n",
                st->fu.distinct_samples, st->fu.min_ranks_per_sample, st->fu.max_ranks_per_sample,
                v.tp * v.pp);
    lab_printf0("  losses:      ");
    for (int k = 0; k < K; k++) lab_printf0(" %.7f", st->fu.loss[k]);
    lab_printf0("\n  single rank: ");
    for (int k = 0; k < K; k++) lab_printf0(" %.7f", st->fu_single.loss[k]);
    lab_printf0("  (M %d)\n  largest relative difference %.2e; step %.1f ms\n", st->fu_single.m,
                st->fu_rel_diff, st->fu.step_ms_median);
    if (st->cp_dp > 0)
        lab_printf0("  with CP %d as well (TP %d, PP %d; rank grid and calculator only): DP %d, "
                    "M %d\n",
                    st->cp_cp, st->cp_tp, st->cp_pp, st->cp_dp, st->cp_m);

    LAB09_CHECK(cx, st->fu.m == st->fu_m_formula, "follow-up: M %d = GBS / (MBS x DP) = %d",
                st->fu.m, st->fu_m_formula);
    LAB09_CHECK(cx, st->fu.dp == st->fu_dp, "follow-up: DP %d = world / (TP x PP) = %d", st->fu.dp,
                st->fu_dp);
    LAB09_CHECK(cx, st->fu.distinct_samples == v.gbs, "follow-up: %d distinct samples = GBS %d",
                st->fu.distinct_samples, v.gbs);
    LAB09_CHECK(cx, st->fu.min_ranks_per_sample == v.tp * v.pp &&
                        st->fu.max_ranks_per_sample == v.tp * v.pp,
                "follow-up: each sample on TP x PP = %d ranks", v.tp * v.pp);
    LAB09_CHECK(cx, st->fu_rel_diff <= LAB09_LOSS_RTOL,
                "follow-up: losses within %.0e of the single-rank run (%.2e)", LAB09_LOSS_RTOL,
                st->fu_rel_diff);
    if (st->cp_dp > 0)
        LAB09_CHECK(cx, st->cp_dp == N / (st->cp_tp * st->cp_pp * st->cp_cp),
                    "with CP: DP = world / (TP x PP x CP) = %d", st->cp_dp);
    lab09_compared(cx, "DP with world / (TP x PP), M with GBS / (MBS x DP), samples with GBS and "
                       "ranks per sample with TP x PP, losses with the single-rank run");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   Results */

static cJSON *lab09_cfg_json(const lab09_cfg *c, int steps) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tp", c->tp);
    cJSON_AddNumberToObject(o, "pp", c->pp);
    cJSON_AddNumberToObject(o, "dp", c->dp);
    cJSON_AddNumberToObject(o, "micro_batch_size", c->mbs);
    cJSON_AddNumberToObject(o, "global_batch_size", c->gbs);
    cJSON_AddNumberToObject(o, "num_microbatches", c->m);
    cJSON_AddNumberToObject(o, "num_microbatches_formula", c->m_formula);
    cJSON_AddNumberToObject(o, "microbatches_run", c->m_ran);
    cJSON *l = cJSON_AddArrayToObject(o, "losses");
    cJSON *t = cJSON_AddArrayToObject(o, "step_ms");
    for (int k = 0; k < steps; k++) {
        cJSON_AddItemToArray(l, cJSON_CreateNumber(round(c->loss[k] * 1e7) / 1e7));
        cJSON_AddItemToArray(t, cJSON_CreateNumber(lab_round_ms(c->ms[k])));
    }
    cJSON_AddNumberToObject(o, "final_loss", round(c->loss[steps - 1] * 1e7) / 1e7);
    cJSON_AddNumberToObject(o, "step_ms_median", round(c->step_ms_median * 10) / 10);
    cJSON_AddNumberToObject(o, "max_rel_diff_vs_single_rank", c->max_rel_diff);
    cJSON_AddNumberToObject(o, "distinct_samples_per_step", c->distinct_samples);
    cJSON_AddNumberToObject(o, "ranks_per_sample", c->max_ranks_per_sample);
    cJSON_AddNumberToObject(o, "backwards_per_step", c->backwards_per_step);
    cJSON_AddNumberToObject(o, "backwards_with_grad_sync", c->synced_backwards_per_step);
    cJSON_AddNumberToObject(o, "dp_collectives_per_step", c->dp_collectives_per_step);
    cJSON_AddNumberToObject(o, "ddp_buckets", c->n_buckets);
    cJSON_AddNumberToObject(o, "model_heap_bytes", (double)c->gpt_heap_bytes);
    cJSON_AddNumberToObject(o, "activation_slot_bytes", (double)c->slot_bytes);
    return o;
}

static cJSON *lab09_facts(lab_ctx *cx) {
    lab09_state *st = cx->state;
    int K = st->steps;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "world", cx->world_size);
    cJSON_AddNumberToObject(f, "steps", K);
    cJSON_AddNumberToObject(f, "cores", st->cores);
    cJSON *model = cJSON_AddObjectToObject(f, "model");
    cJSON_AddNumberToObject(model, "layers", lab09_small.layers);
    cJSON_AddNumberToObject(model, "hidden", lab09_small.hidden);
    cJSON_AddNumberToObject(model, "heads", lab09_small.heads);
    cJSON_AddNumberToObject(model, "seq_length", lab09_small.seq);
    cJSON_AddNumberToObject(model, "vocab", lab09_small.vocab);

    /* A */
    cJSON *a = cJSON_AddObjectToObject(f, "fixed_gbs");
    cJSON_AddNumberToObject(a, "global_batch_size", st->n_cfg ? st->cfg[0].gbs : 0);
    cJSON_AddNumberToObject(a, "micro_batch_size", st->n_cfg ? st->cfg[0].mbs : 0);
    cJSON *cfgs = cJSON_AddArrayToObject(a, "configs");
    cJSON *mb = cJSON_AddObjectToObject(f, "microbatches");   /* the prediction's shape */
    cJSON *dps = cJSON_AddObjectToObject(f, "dp_sizes");
    for (int i = 0; i < st->n_cfg; i++) {
        char key[8];
        snprintf(key, sizeof key, "tp%d", st->cfg[i].tp);
        cJSON_AddItemToArray(cfgs, lab09_cfg_json(&st->cfg[i], K));
        cJSON_AddNumberToObject(mb, key, st->cfg[i].m);
        cJSON_AddNumberToObject(dps, key, st->cfg[i].dp);
    }
    cJSON_AddItemToObject(a, "single_rank", lab09_cfg_json(&st->single, K));
    cJSON_AddNumberToObject(a, "max_rel_diff", st->max_rel_diff);
    cJSON_AddNumberToObject(a, "tolerance", LAB09_LOSS_RTOL);
    cJSON_AddStringToObject(a, "losses_equal", st->losses_equal ? st->losses_equal : "different");
    cJSON_AddStringToObject(f, "losses_equal", st->losses_equal ? st->losses_equal : "different");
    cJSON *u = lab09_cfg_json(&st->unfair, K);
    cJSON_AddNumberToObject(u, "max_rel_diff_vs_fair", st->unfair_rel_diff);
    cJSON_AddItemToObject(a, "broken_fixed_m", u);

    /* B */
    cJSON *b = cJSON_AddObjectToObject(f, "bubble");
    cJSON_AddNumberToObject(b, "tolerance", LAB09_BUBBLE_TOL);
    cJSON_AddNumberToObject(b, "floor_tolerance", LAB09_BUBBLE_FLOOR_TOL);
    cJSON *pairs = cJSON_AddArrayToObject(b, "pairs");
    for (int i = 0; i < st->n_pairs; i++) {
        const lab09_pair *pr = &st->pair[i];
        cJSON *o = cJSON_CreateObject();
        char key[24];
        snprintf(key, sizeof key, "p%d_m%d", pr->p, pr->m);
        cJSON_AddNumberToObject(o, "p", pr->p);
        cJSON_AddNumberToObject(o, "m", pr->m);
        cJSON_AddNumberToObject(o, "formula", round(pr->formula * 1e4) / 1e4);
        cJSON_AddNumberToObject(o, "measured", round(pr->measured * 1e4) / 1e4);
        cJSON_AddNumberToObject(o, "kept_iteration_bubble", round(pr->kept_bubble * 1e4) / 1e4);
        cJSON_AddNumberToObject(o, "replay_free_communication", round(pr->replay * 1e4) / 1e4);
        cJSON_AddBoolToObject(o, "compared", pr->checked);
        cJSON_AddNumberToObject(o, "makespan_ms", round(pr->makespan_ms * 10) / 10);
        cJSON_AddNumberToObject(o, "quiet_iterations", pr->n_quiet);
        cJSON_AddNumberToObject(o, "median_cpu_share", round(pr->median_share * 1e3) / 1e3);
        cJSON *reps = cJSON_AddArrayToObject(o, "iterations");
        for (int k = 0; k < pr->n_reps; k++) {
            cJSON *it = cJSON_CreateObject();
            cJSON_AddNumberToObject(it, "bubble", round(pr->reps[k] * 1e4) / 1e4);
            cJSON_AddNumberToObject(it, "cpu_share", round(pr->shares[k] * 1e3) / 1e3);
            cJSON_AddBoolToObject(it, "quiet", pr->quiet[k]);
            cJSON_AddItemToArray(reps, it);
        }
        cJSON *stages = cJSON_AddArrayToObject(o, "stages");
        for (int s = 0; s < pr->p; s++) {
            const lab09_stage *g = &pr->stage[s];
            cJSON *so = cJSON_CreateObject();
            cJSON_AddNumberToObject(so, "stage", s);
            cJSON_AddNumberToObject(so, "busy_ms", round(g->busy_ms * 10) / 10);
            cJSON_AddNumberToObject(so, "bubble", round(g->bubble * 1e4) / 1e4);
            cJSON_AddNumberToObject(so, "warmup", g->warmup);
            cJSON_AddNumberToObject(so, "in_flight", g->in_flight);
            cJSON_AddNumberToObject(so, "in_flight_formula", g->in_flight_formula);
            cJSON_AddNumberToObject(so, "activation_slot_bytes", (double)g->slot_bytes);
            cJSON_AddNumberToObject(so, "activation_peak_bytes",
                                    (double)g->slot_bytes * g->in_flight);
            cJSON_AddNumberToObject(so, "activation_peak_bytes_formula",
                                    (double)g->slot_bytes * g->in_flight_formula);
            /* what this run's model allocated: mc_gpt_init keeps n_slots = m slots ready */
            cJSON_AddNumberToObject(so, "activation_slots_allocated", pr->m);
            cJSON_AddNumberToObject(so, "activation_allocated_bytes",
                                    (double)g->slot_bytes * pr->m);
            cJSON_AddNumberToObject(so, "receive_buffers_peak_bytes", (double)g->p2p_peak_bytes);
            cJSON_AddNumberToObject(so, "receive_buffers", g->p2p_buffers);
            cJSON *ex = cJSON_AddObjectToObject(so, "expected");
            cJSON_AddStringToObject(ex, "source", g->estimated ? "mc_memory_estimate"
                                                               : "min(p - r, m) x measured slot");
            cJSON_AddNumberToObject(ex, "in_flight", g->estimated ? g->est_in_flight
                                                                  : g->in_flight_formula);
            if (g->estimated) {
                cJSON_AddNumberToObject(ex, "activation_slot_bytes", round(g->est_slot_bytes));
                cJSON_AddNumberToObject(ex, "receive_buffers", g->est_p2p_buffers);
            }
            cJSON_AddItemToArray(stages, so);
        }
        cJSON_AddItemToArray(pairs, o);
        /* the measured value: only a bubble compared with the formula (see >>B) */
        if (pr->checked) cJSON_AddNumberToObject(b, key, round(pr->measured * 1e4) / 1e4);
        else cJSON_AddNullToObject(b, key);
        /* what the predictions are judged against: the formula, which a timed bubble on a
           loaded machine exceeds by run-to-run amounts a prediction cannot foresee */
        char fkey[32];
        snprintf(fkey, sizeof fkey, "formula_p%d_m%d", pr->p, pr->m);
        cJSON_AddNumberToObject(b, fkey, round(pr->formula * 1e4) / 1e4);
    }

    /* C */
    cJSON *c = cJSON_AddObjectToObject(f, "rampup");
    cJSON_AddNumberToObject(c, "tp", st->ramp_tp);
    cJSON_AddNumberToObject(c, "dp", st->ramp_dp);
    cJSON_AddNumberToObject(c, "micro_batch_size", st->ramp_mbs);
    cJSON_AddNumberToObject(c, "start", st->ramp.start);
    cJSON_AddNumberToObject(c, "increment", st->ramp.increment);
    cJSON_AddNumberToObject(c, "samples", (double)st->ramp.samples);
    cJSON_AddNumberToObject(c, "global_batch_size", st->ramp_gbs);
    cJSON_AddStringToObject(c, "step_schedule", st->step_schedule);
    cJSON_AddStringToObject(c, "versions", "rampup_batch_size: Megatron-LM up to core_v0.17; "
                            "step_batch_size_schedule: HEAD (PRs #3779, #4411)");
    cJSON *rows = cJSON_AddArrayToObject(c, "table");
    cJSON *ms = cJSON_AddArrayToObject(c, "microbatches");
    cJSON *gb = cJSON_AddArrayToObject(c, "global_batches");
    cJSON *by_it = cJSON_AddObjectToObject(c, "microbatches_by_iteration");
    for (int i = 0; i < st->n_rows; i++) {
        const lab09_ramp_row *row = &st->row[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "iteration", row->iteration);
        cJSON_AddNumberToObject(o, "consumed_samples", (double)row->consumed);
        cJSON_AddNumberToObject(o, "global_batch_size", row->gbs);
        cJSON_AddNumberToObject(o, "num_microbatches", row->m);
        cJSON_AddNumberToObject(o, "microbatches_run", row->m_ran);
        cJSON_AddNumberToObject(o, "loss", round(row->loss * 1e6) / 1e6);
        cJSON_AddItemToArray(rows, o);
        cJSON_AddItemToArray(ms, cJSON_CreateNumber(row->m));
        char key[16];
        snprintf(key, sizeof key, "it%d", row->iteration);
        cJSON_AddNumberToObject(by_it, key, row->m);
        cJSON_AddItemToArray(gb, cJSON_CreateNumber(row->gbs));
    }
    cJSON *cp = cJSON_AddArrayToObject(c, "change_points");
    for (int i = 0; i < st->n_change_points && i < LAB09_MAX_ROWS; i++)
        cJSON_AddItemToArray(cp, cJSON_CreateNumber((double)st->change_point[i]));
    cJSON *ref = cJSON_AddObjectToObject(f, "calculator_refusal");
    cJSON_AddNumberToObject(ref, "global_batch_size", st->refusal_gbs);
    cJSON_AddNumberToObject(ref, "micro_batch_size", st->refusal_mbs);
    cJSON_AddNumberToObject(ref, "data_parallel_size", st->refusal_dp);
    cJSON_AddStringToObject(ref, "status", mc_err_name(st->refusal_status));
    cJSON_AddStringToObject(ref, "message", st->refusal);

    /* F */
    cJSON *fu = cJSON_AddObjectToObject(f, "followup");
    cJSON_AddStringToObject(fu, "variant", cx->variant_name);
    cJSON_AddNumberToObject(fu, "global_batch_size", st->fu_gbs);
    cJSON_AddNumberToObject(fu, "micro_batch_size", st->fu_mbs);
    cJSON_AddNumberToObject(fu, "tp", st->fu_tp);
    cJSON_AddNumberToObject(fu, "pp", st->fu_pp);
    cJSON_AddNumberToObject(fu, "dp_size", st->fu_dp);
    cJSON_AddNumberToObject(fu, "num_microbatches", st->fu_m);
    cJSON_AddNumberToObject(fu, "num_microbatches_formula", st->fu_m_formula);
    cJSON_AddNumberToObject(fu, "ranks_per_sample", st->fu.max_ranks_per_sample);
    cJSON_AddNumberToObject(fu, "distinct_samples_per_step", st->fu.distinct_samples);
    cJSON_AddNumberToObject(fu, "max_rel_diff_vs_single_rank", st->fu_rel_diff);
    cJSON_AddItemToObject(fu, "run", lab09_cfg_json(&st->fu, K));
    cJSON_AddItemToObject(fu, "single_rank", lab09_cfg_json(&st->fu_single, K));
    cJSON *cpo = cJSON_AddObjectToObject(fu, "with_cp");
    cJSON_AddNumberToObject(cpo, "tp", st->cp_tp);
    cJSON_AddNumberToObject(cpo, "pp", st->cp_pp);
    cJSON_AddNumberToObject(cpo, "cp", st->cp_cp);
    cJSON_AddNumberToObject(cpo, "dp", st->cp_dp);
    cJSON_AddNumberToObject(cpo, "num_microbatches", st->cp_m);
    cJSON_AddStringToObject(cpo, "note", "rank grid and calculator only: this build's GPT has no "
                            "context parallelism");
    return f;
}

/* ---------------------------------------------------------------------------------------------
   The spec */

static int lab09_check_world(const lab_ctx *cx, char *why, size_t cap) {
    int N = cx->world_size;
    if (!lab09_is_pow2(N) || N < 2 || N > 16) {
        snprintf(why, cap, "needs a power-of-two world from 2 to 16 ranks (the TP ladder 1, 2, 4, "
                 "8 must divide it and the model's 8 heads): got %d ranks; try mpirun -np 8", N);
        return 1;
    }
    if (cx->grid.desc.tp != 1 || cx->grid.desc.pp != 1 || cx->grid.desc.cp != 1) {
        snprintf(why, cap, "chooses its own layouts: run it without --tp, --pp or --cp");
        return 1;
    }
    const mc_ops *mem = mc_comm_memory(cx->world);
    if (mem != NULL && mem->device != MC_DEVICE_CPU) {   /* its measures are the host's */
        snprintf(why, cap, "measures activation memory on the host heap and the bubble on CPU "
                 "cores, but this world keeps its buffers on the %s device: run it on CPU ranks "
                 "(without --device cuda; on a GPU-per-rank machine add --backend mpi)",
                 mem->name ? mem->name : "?");
        return 1;
    }
    return 0;
}

static int lab09_setup(lab_ctx *cx) {
    lab09_state *st = cx->state;
    st->steps = lab09_steps(cx);
    st->cores = lab09_cores();
    return LAB_RAN;
}

static int lab09_run_figure(lab_ctx *cx) {
    lab09_figure(cx);
    return LAB_RAN;
}

static void lab09_cleanup(lab_ctx *cx) {
    lab09_state *st = cx->state;
    for (int i = 0; i < st->n_pairs; i++) {
        free(st->pair[i].timeline);
        st->pair[i].timeline = NULL;
    }
}

static const lab_flag lab09_flags[] = {{"--steps", 1}, {"--pairs", 1}};

static const char lab09_summary[] =
    "Why Megatron manages its own micro-batch calculator: GBS = MBS x M x DP on a fixed global\n"
    "batch while TP changes (losses, step time, samples per rank, grad syncs), the pipeline\n"
    "bubble measured from the schedule's timeline against (p-1)/(m+p-1), activations held per\n"
    "stage, and the ramp-up table from the calculator.";

static const char lab09_usage[] =
    "  --steps K          training steps per layout (default 5, --quick 2)\n"
    "  --pairs PxM,...    pipeline runs for the bubble (default 2x2,2x8,4x4; --quick 2x2,2x8)\n";

static const lab_experiment lab09_experiments[] = {
    {"setup", lab09_setup}, {"A", lab09_run_a}, {"B", lab09_run_b},
    {"figure", lab09_run_figure}, {"C", lab09_run_c}, {"F", lab09_run_f},
};

static const lab_spec lab09_spec = {
    .name = "lab09",
    .question = "M009",
    .title = "the micro-batch calculator",
    .summary = lab09_summary,
    .usage = lab09_usage,
    .flags = lab09_flags,
    .n_flags = 2,
    .default_world = 8,
    .min_world = 2,
    .max_world = 16,
    .check_world = lab09_check_world,
    .call_timeout_s = 60.0,
    .n_variants = LAB09_N_VARIANTS,
    .experiments = lab09_experiments,
    .n_experiments = (int)(sizeof lab09_experiments / sizeof lab09_experiments[0]),
    .state_size = sizeof(lab09_state),
    .facts = lab09_facts,
    .cleanup = lab09_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab09_spec); }
