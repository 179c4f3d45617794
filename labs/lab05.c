/* labs/lab05.c - M005: TransformerConfig is a contract, not a hyper-parameter dataclass.

       make lab05 && mpirun --oversubscribe -np 4 ./lab05      (as root add --allow-run-as-root)

   The experiments, in order (rank 0 prints, every rank takes part; the driver, lab_driver.h,
   does the answer sheet, the results envelope and the grading around them):
     A. validator: mc_gpt_config_validate over a set of configurations, each built to break
        known rules (heads % TP, ffn % TP, query groups vs TP, layers % PP and % (PP * VPP) as in
        Megatron-LM #468, SP without TP, VPP without PP, recompute options, several at once).
        Every config's report is compared with the rules it was built to break; the #468
        config's layer count under a silent floor division and the padded vocabulary are
        computed independently from their formulas;
     B. train_save: a small GPT trains K1 steps at TP=2, PP=2 (DP = world / 4), saves a
        checkpoint with its fingerprints (mc_checkpoint_save) and trains K2 more steps: the
        uninterrupted run every reload is compared with;
     C. layout: the first DP ranks form a sub-communicator (one rank at the default world) and
        (1) train the same model from scratch at TP=1, PP=1 for K1 + K2 steps (the reference
        of the parallel run), (2) reload the checkpoint there (TP 2->1, PP 2->1, resharded) and
        continue K2 steps; the other ranks wait at a barrier;
     D. math: the config changed in one math field (the variant drawn by the nonce:
        layernorm_epsilon, num_attention_heads, num_layers), at the save layout: the load is
        refused with the differing fields named; forced with MC_CKPT_LOAD_IGNORE_MATH it loads,
        and the continued loss shows the silent change of function. Untied embeddings, forced,
        are refused anyway (a tensor the checkpoint does not hold);
     E. perf: the config changed in a performance-only field (full recompute): the load is
        allowed and the continued loss equals the uninterrupted run's within 1e-6.

   Worlds: 4 ranks by default (TP=2 PP=2 DP=1; the TP=1 PP=1 runs of C use rank 0 alone), 8
   (DP=2; C on ranks 0-1) or 16 (DP=4; C on ranks 0-3): the global batch of 8 samples stays
   the same, so every world trains the same losses (within 1e-5 relative). Any other world, or other --tp / --pp,
   is refused with exit status 2 and the rule.

   Dropout is off in every run, so that the only differences between runs are the ones each
   experiment makes (the RNG states are not restored across a TP / PP change). */
#include "lab_driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LAB05_N_VARIANTS 3
#define LAB05_TP 2                 /* the save layout */
#define LAB05_PP 2
#define LAB05_SEQ 32               /* the model (small enough for a 2-core machine) */
#define LAB05_MBS 2
#define LAB05_GBS 8                /* samples per iteration, whatever the world */
#define LAB05_VOCAB 256            /* a multiple of 128 * TP: no re-padding when TP changes */
#define LAB05_LR 3e-3f
#define LAB05_K2 3                 /* steps trained after the checkpoint */
#define LAB05_MAX_STEPS 32
#define LAB05_LAYOUT_RTOL 1e-5     /* relative: what a changed summation order may move */
#define LAB05_PERF_RTOL 1e-6       /* relative: recompute re-runs the same ops */
#define LAB05_MOVE_RTOL 1e-4       /* relative, 10x the layout tolerance: the loss "moved" */
#define LAB05_MSG_CAP 1024
#define LAB05_TOKENS (LAB05_GBS * LAB05_SEQ)   /* per-token losses of one iteration */

/* ---------------------------------------------------------------------------------------------
   A. the configuration set */

#define LAB05_MAX_BREAKS 6

typedef struct lab05_case {
    const char *name;              /* prediction key */
    const char *what;
    mc_gpt_config cfg;
    const char *breaks[LAB05_MAX_BREAKS];   /* the field each violation it was built with names */
} lab05_case;

/* GPT-2-small-like shapes unless a case says otherwise. */
#define LAB05_GPT2 .num_layers = 12, .hidden_size = 768, .num_attention_heads = 12, \
                   .vocab_size = 50257, .seq_length = 1024, .micro_batch_size = 1

static const lab05_case lab05_cases[] = {
    {"baseline", "this lab's model at TP=2 PP=2",
     {.num_layers = 4, .hidden_size = 64, .num_attention_heads = 4, .ffn_hidden_size = 256,
      .vocab_size = LAB05_VOCAB, .seq_length = LAB05_SEQ, .micro_batch_size = LAB05_MBS,
      .tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2},
     {NULL}},
    {"tp8_shapes", "12 heads and ffn 3004 at TP=8",
     {LAB05_GPT2, .ffn_hidden_size = 3004, .tensor_model_parallel_size = 8},
     {"num_attention_heads", "ffn_hidden_size", "num_query_groups"}},
    {"mr468", "80 layers at PP=16, VPP=2 (Megatron-LM #468)",
     {.num_layers = 80, .hidden_size = 8192, .num_attention_heads = 64, .vocab_size = 32000,
      .seq_length = 4096, .micro_batch_size = 1, .tensor_model_parallel_size = 8,
      .pipeline_model_parallel_size = 16, .virtual_pipeline_model_parallel_size = 2},
     {"num_layers"}},
    {"sp_no_tp", "sequence parallelism at TP=1",
     {LAB05_GPT2, .sequence_parallel = 1},
     {"sequence_parallel"}},
    {"vpp_pp1", "VPP=2 at PP=1",
     {LAB05_GPT2, .virtual_pipeline_model_parallel_size = 2},
     {"virtual_pipeline_model_parallel_size"}},
    {"recompute_full", "full recompute without a method or a layer count",
     {LAB05_GPT2, .recompute_granularity = MC_RECOMPUTE_FULL},
     {"recompute_method", "recompute_num_layers"}},
    {"gqa", "16 heads in 3 query groups at TP=2",
     {.num_layers = 24, .hidden_size = 1024, .num_attention_heads = 16, .num_query_groups = 3,
      .vocab_size = 50257, .seq_length = 1024, .micro_batch_size = 1,
      .tensor_model_parallel_size = 2},
     {"num_query_groups", "num_query_groups"}},
    {"combined", "30 layers at PP=4, 16 heads at TP=3, SP with seq 1000",
     {.num_layers = 30, .hidden_size = 1024, .num_attention_heads = 16, .vocab_size = 50257,
      .seq_length = 1000, .micro_batch_size = 1, .tensor_model_parallel_size = 3,
      .pipeline_model_parallel_size = 4, .sequence_parallel = 1},
     {"num_attention_heads", "ffn_hidden_size", "num_query_groups", "num_layers",
      "seq_length"}},
};
#define LAB05_N_CASES ((int)(sizeof lab05_cases / sizeof lab05_cases[0]))
#define LAB05_REPORT_CAP 4096

typedef struct lab05_case_result {
    int violations;
    int expected;
    int fields_match;              /* every line names a field the case was built to break */
    char report[LAB05_REPORT_CAP];
} lab05_case_result;

typedef struct lab05_exp_a {
    lab05_case_result cases[LAB05_N_CASES];
    /* #468 */
    int old_check_passes;          /* num_layers % pp == 0: the only check upstream had */
    int layers_by_division;        /* (L / (PP * VPP)) * PP * VPP */
    int layers_to_build_status;    /* mc_gpt_num_layers_to_build on the config */
    /* padded vocabulary of 50257 */
    int padded[3], padded_formula[3];
} lab05_exp_a;

/* ---------------------------------------------------------------------------------------------
   B-E. training and the reloads */

typedef struct lab05_run {
    int ran;
    int status;                    /* the load's status (MC_OK for a fresh run) */
    char message[LAB05_MSG_CAP];   /* mc_last_error of a refused load */
    double load_seconds;
    mc_checkpoint_result res;
    int tp, pp, dp;
    int first_iteration;           /* iteration of loss[0] (1-based) */
    int n_loss;
    double loss[LAB05_MAX_STEPS];
    double max_rel_diff;           /* vs the uninterrupted run, same iterations */
    uint64_t math_fp, layout_fp;   /* of the run's config */
    /* per-token losses of the first iteration after the checkpoint, sample-major [GBS, S] */
    int tok_iteration;             /* 0: none captured */
    double tok[LAB05_TOKENS];
    double tok_mean_abs_diff, tok_max_abs_diff;   /* vs the uninterrupted run's */
} lab05_run;

typedef struct lab05_math_change {
    char field[40];                /* the field the variant changes */
    char from[24], to[24];
    const char *expected[3];       /* the math fields that then differ, by construction */
    int n_expected;
    mc_gpt_config cfg;
    int fields_in_message;         /* expected fields the refusal names */
    int diff_count;                /* mc_gpt_config_math_diff(saved, changed) */
} lab05_math_change;

typedef struct lab05_state {
    int k1, k2;
    lab05_exp_a a;
    mc_parallel_state ps;          /* TP=2 PP=2 on the world */
    int have_ps;
    char ckpt_dir[512];
    mc_gpt_config saved_cfg;       /* resolved, as the checkpoint records it */
    /* the checkpoint as written */
    uint64_t meta_math_fp, meta_layout_fp;
    int meta_tp, meta_pp, meta_dp, meta_tensors, meta_config_lines;
    long long meta_iteration;
    lab05_run uninterrupted, reference, layout, math_refused, math_forced, untie_forced, perf;
    lab05_math_change change;
} lab05_state;

/* One training setup on one parallel state. */
typedef struct lab05_trainer {
    mc_parallel_state *ps;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int have_gpt, have_ddp, have_opt;
    int dp, dp_rank, n_micro;
    long long consumed;            /* samples consumed: the next batch starts here */
    long long iteration;
    int tokens[LAB05_SEQ * LAB05_MBS], labels[LAB05_SEQ * LAB05_MBS];
} lab05_trainer;

static mc_schedule_result lab05_sched;   /* large trace: off the stack */

static mc_gpt_config lab05_model_config(int tp, int pp) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c = lab05_cases[0].cfg;
    c.hidden_dropout = MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    c.tensor_model_parallel_size = tp;
    c.pipeline_model_parallel_size = pp;
    c.seed = 1234;
    return c;
}

/* Sample k: a bigram chain t' = 5 t + 17 (mod V) from a start drawn from k. With tied
   embeddings the output layer cannot map a token to its successor by itself: the layers have
   to learn it. */
static void lab05_sample(long long k, int *out, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < 8; i++) h = (h ^ (uint32_t)((k >> (8 * i)) & 0xff)) * 16777619u;
    int t = (int)(h % LAB05_VOCAB);
    for (int s = 0; s < n; s++) {
        out[s] = t;
        t = (5 * t + 17) % LAB05_VOCAB;
    }
}

/* Micro-batch m of DP rank d holds samples consumed + (m * DP + d) * B + j (Megatron's
   sampler), as [S, B] with the sequence first. */
static void lab05_load_microbatch(lab05_trainer *t, int m) {
    int seq[LAB05_SEQ + 1];
    for (int j = 0; j < LAB05_MBS; j++) {
        lab05_sample(t->consumed + ((long long)m * t->dp + t->dp_rank) * LAB05_MBS + j, seq,
                     LAB05_SEQ + 1);
        for (int s = 0; s < LAB05_SEQ; s++) {
            t->tokens[s * LAB05_MBS + j] = seq[s];
            t->labels[s * LAB05_MBS + j] = seq[s + 1];
        }
    }
}

static int lab05_hook_forward(void *app, int chunk, int mb, const float *input, float **output,
                              double *loss_sum, double *num_tokens) {
    lab05_trainer *t = app;
    lab05_load_microbatch(t, mb);
    return mc_gpt_forward_step(&t->gpt, chunk, mb, t->tokens, t->labels, input, output, loss_sum,
                               num_tokens);
}

static int lab05_hook_backward(void *app, int chunk, int mb, const float *output_grad,
                               float loss_scale, float **input_grad) {
    lab05_trainer *t = app;
    return mc_gpt_backward_step(&t->gpt, chunk, mb, output_grad, loss_scale, input_grad);
}

static void lab05_hook_grad_sync(void *app, int chunk, int enable) {
    lab05_trainer *t = app;
    mc_gpt_set_grad_sync(&t->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&t->ddp, chunk, enable);
}

static int lab05_hook_finalize(void *app) {
    lab05_trainer *t = app;
    return mc_finalize_model_grads(t->ps, &t->ddp, NULL, NULL, t->gpt.config.sequence_parallel,
                                   NULL);
}

static void lab05_trainer_destroy(lab05_trainer *t) {
    if (t->have_opt) mc_optimizer_destroy(&t->opt);
    if (t->have_ddp) MC_CHECK(mc_ddp_destroy(&t->ddp));
    if (t->have_gpt) mc_gpt_destroy(&t->gpt);
    t->have_opt = t->have_ddp = t->have_gpt = 0;
}

/* The model, DDP and AdamW for cfg on ps (collective over ps's world), in the memory of the
   world's communicators: host memory on CPU ranks, the rank's GPU with NCCL. */
static void lab05_trainer_init(lab05_trainer *t, const mc_gpt_config *cfg, mc_parallel_state *ps) {
    memset(t, 0, sizeof *t);
    t->ps = ps;
    t->dp = ps->grid.dp;
    t->dp_rank = ps->coords.dp;
    t->n_micro = LAB05_GBS / (LAB05_MBS * t->dp);
    MC_CHECK(mc_gpt_init(&t->gpt, &(mc_gpt_desc){.config = *cfg,
                                                 .ps = ps,
                                                 .ops = mc_comm_memory(ps->world),
                                                 .n_slots = t->n_micro}));
    t->have_gpt = 1;
    MC_CHECK(mc_ddp_init(&t->ddp, &(mc_ddp_desc){.table = &t->gpt.table,
                                                 .grads = t->gpt.grads,
                                                 .dp = mc_parallel_group(ps, MC_GROUP_DP_CP),
                                                 .ops = t->gpt.ops}));
    t->have_ddp = 1;
    MC_CHECK(mc_optimizer_init(&t->opt, &(mc_optimizer_desc){
                                            .ddp = &t->ddp,
                                            .params = t->gpt.params,
                                            .ps = ps,
                                            .lr = LAB05_LR,
                                            .lr_decay_style = MC_LR_DECAY_CONSTANT,
                                        }));
    t->have_opt = 1;
}

/* The per-token losses of the iteration just run, on every rank: the last stage's TP-rank-0
   ranks place their micro-batches at their global sample index, one all-reduce sums them. */
static void lab05_token_losses(lab05_trainer *t, double *out) {
    static double mine[LAB05_TOKENS];
    float l[LAB05_SEQ * LAB05_MBS];   /* [S, B] */
    memset(mine, 0, sizeof mine);
    if (mc_parallel_is_last_stage(t->ps, 1) && t->ps->coords.tp == 0)
        for (int m = 0; m < t->n_micro; m++) {
            MC_CHECK(t->gpt.ops->download(t->gpt.ops, l, mc_gpt_losses(&t->gpt, m), sizeof l));
            for (int j = 0; j < LAB05_MBS; j++) {
                long long g = ((long long)m * t->dp + t->dp_rank) * LAB05_MBS + j;
                for (int s = 0; s < LAB05_SEQ; s++)
                    mine[g * LAB05_SEQ + s] = l[s * LAB05_MBS + j];
            }
        }
    MC_CHECK(lab_all_reduce_f64(t->ps->world, mine, out, LAB05_TOKENS, MC_SUM));
}

/* One iteration; *loss = the lm loss of its global batch (before the update), on every rank;
   tok (may be NULL) receives its per-token losses. */
static void lab05_trainer_step(lab05_trainer *t, double *loss, double *tok) {
    mc_schedule_hooks hooks = {.app = t,
                               .forward_step = lab05_hook_forward,
                               .backward_step = lab05_hook_backward,
                               .grad_sync = lab05_hook_grad_sync,
                               .finalize = lab05_hook_finalize,
                               .tensor_elems = t->gpt.p2p_elems};
    MC_CHECK(mc_ddp_zero_grad(&t->ddp));
    MC_CHECK(mc_gpt_zero_grad(&t->gpt));
    MC_CHECK(mc_get_forward_backward_func(t->ps)(t->ps, &hooks, t->n_micro, 0, &lab05_sched));
    MC_CHECK(mc_optimizer_step(&t->opt));
    /* the last stage's TP-rank-0 ranks hold each DP replica's sums */
    double mine[2] = {0.0, 0.0}, all[2];
    if (mc_parallel_is_last_stage(t->ps, 1) && t->ps->coords.tp == 0)
        mine[0] = lab05_sched.loss_sum, mine[1] = lab05_sched.num_tokens;
    MC_CHECK(lab_all_reduce_f64(t->ps->world, mine, all, 2, MC_SUM));
    *loss = all[1] > 0 ? all[0] / all[1] : NAN;
    if (tok != NULL) lab05_token_losses(t, tok);
    t->iteration++;
    t->consumed += LAB05_GBS;
}

/* `steps` iterations into run; capture: keep the per-token losses of the first one. */
static void lab05_train(lab05_trainer *t, lab05_run *run, int steps, int capture) {
    if (run->n_loss == 0) run->first_iteration = (int)t->iteration + 1;
    for (int i = 0; i < steps && run->n_loss < LAB05_MAX_STEPS; i++) {
        int keep = capture && i == 0;
        if (keep) run->tok_iteration = (int)t->iteration + 1;
        lab05_trainer_step(t, &run->loss[run->n_loss++], keep ? run->tok : NULL);
    }
}

/* Mean and largest |per-token loss difference| against the uninterrupted run. */
static void lab05_token_diff(lab05_run *r, const lab05_run *u) {
    if (r->tok_iteration == 0 || r->tok_iteration != u->tok_iteration) return;
    double sum = 0.0, worst = 0.0;
    for (int i = 0; i < LAB05_TOKENS; i++) {
        double d = fabs(r->tok[i] - u->tok[i]);
        sum += d;
        if (!(d <= worst)) worst = d;
    }
    r->tok_mean_abs_diff = sum / LAB05_TOKENS;
    r->tok_max_abs_diff = worst;
}

static mc_checkpoint_desc lab05_ckpt_desc(lab05_trainer *t, const char *dir, float *m, float *v) {
    mc_checkpoint_desc d;
    memset(&d, 0, sizeof d);
    d.dir = dir, d.ps = t->ps, d.config = &t->gpt.config;
    d.params = &t->gpt.table, d.param_data = (float *)t->gpt.params;
    d.exp_avg = m, d.exp_avg_sq = v, d.ops = t->gpt.ops, d.rng = &t->gpt.rng;
    d.iteration = t->iteration, d.consumed_samples = t->consumed;
    d.optimizer_step = t->opt.iteration;
    return d;
}

/* Adam's m or v in the parameter layout: a zeroed buffer of op memory. */
static float *lab05_state_buffer(const lab05_trainer *t) {
    void *p = NULL;
    MC_CHECK(t->gpt.ops->alloc(t->gpt.ops, &p, t->gpt.table.total * sizeof(float)));
    return p;
}

static void lab05_state_free(const lab05_trainer *t, float *m, float *v) {
    MC_CHECK(t->gpt.ops->free(t->gpt.ops, m));
    MC_CHECK(t->gpt.ops->free(t->gpt.ops, v));
}

/* Saves the model and Adam's m and v (in the parameter layout) at the current iteration. */
static void lab05_save(lab05_trainer *t, const char *dir) {
    const mc_param_table *tab = &t->gpt.table;
    float *m = lab05_state_buffer(t), *v = lab05_state_buffer(t);
    for (int i = 0; i < tab->count; i++) {
        MC_CHECK(mc_optimizer_get_state(&t->opt, i, MC_OPTIM_EXP_AVG, m + tab->info[i].offset));
        MC_CHECK(mc_optimizer_get_state(&t->opt, i, MC_OPTIM_EXP_AVG_SQ, v + tab->info[i].offset));
    }
    mc_checkpoint_desc d = lab05_ckpt_desc(t, dir, m, v);
    MC_CHECK(mc_checkpoint_save(&d));
    lab05_state_free(t, m, v);
}

/* Loads the latest checkpoint into the trainer; on success the optimizer, the iteration and
   the data position continue from it. Returns the load's status (the same on every rank). */
static int lab05_load(lab05_trainer *t, const char *dir, unsigned flags, lab05_run *run) {
    const mc_param_table *tab = &t->gpt.table;
    float *m = lab05_state_buffer(t), *v = lab05_state_buffer(t);
    mc_checkpoint_desc d = lab05_ckpt_desc(t, dir, m, v);
    double t0 = lab_now();
    int rc = mc_checkpoint_load(&d, flags, &run->res);
    run->load_seconds = lab_now() - t0;
    run->status = rc;
    if (rc != MC_OK) snprintf(run->message, sizeof run->message, "%s", mc_last_error());
    if (rc == MC_OK) {
        for (int i = 0; i < tab->count; i++) {
            MC_CHECK(mc_optimizer_set_state(&t->opt, i, MC_OPTIM_EXP_AVG, m + tab->info[i].offset));
            MC_CHECK(mc_optimizer_set_state(&t->opt, i, MC_OPTIM_EXP_AVG_SQ,
                                            v + tab->info[i].offset));
        }
        t->opt.iteration = run->res.optimizer_step;
        t->opt.lr_steps = run->res.iteration;
        t->iteration = run->res.iteration;
        t->consumed = run->res.consumed_samples;
    }
    lab05_state_free(t, m, v);
    return rc;
}

static void lab05_run_layout_of(lab05_run *run, const mc_parallel_state *ps,
                                const mc_gpt_config *cfg) {
    run->ran = 1;
    run->tp = ps->grid.desc.tp, run->pp = ps->grid.desc.pp, run->dp = ps->grid.dp;
    run->math_fp = mc_gpt_config_math_fingerprint(cfg);
    run->layout_fp = mc_gpt_config_layout_fingerprint(cfg);
}

/* Largest |a - b| / |b| over the iterations both runs have. */
static double lab05_max_rel_diff(const lab05_run *a, const lab05_run *ref) {
    double worst = 0.0;
    for (int i = 0; i < a->n_loss; i++) {
        int k = a->first_iteration + i - ref->first_iteration;
        if (k < 0 || k >= ref->n_loss) continue;
        double d = fabs(a->loss[i] - ref->loss[k]) / fmax(fabs(ref->loss[k]), 1e-30);
        if (!(d <= worst)) worst = d;   /* NaN counts as the worst */
    }
    return worst;
}

/* The uninterrupted run's loss at `iteration`, or NAN. */
static double lab05_loss_at(const lab05_run *r, int iteration) {
    int k = iteration - r->first_iteration;
    return k >= 0 && k < r->n_loss ? r->loss[k] : NAN;
}

/* reshard | refuse | allow, from what the load returned. */
static const char *lab05_outcome(const lab05_run *r) {
    if (!r->ran) return "not_run";
    if (r->status != MC_OK) return "refuse";
    return r->res.resharded ? "reshard" : "allow";
}

static void lab05_print_losses(const char *label, const lab05_run *r) {
    lab_printf0("  %-34s", label);
    for (int i = 0; i < r->n_loss; i++)
        lab_printf0(" %d:%.6f", r->first_iteration + i, r->loss[i]);
    lab_printf0("\n");
}

/* ---------------------------------------------------------------------------------------------
   A. the validator */

static int lab05_count_lines(const char *s) {
    int n = 0;
    for (; *s != '\0'; s++) n += *s == '\n';
    return n;
}

/* 1 when every line of the report starts with one of the case's fields, each used once. */
static int lab05_lines_match(const char *report, const lab05_case *c) {
    int used[LAB05_MAX_BREAKS] = {0};
    const char *line = report;
    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        int hit = 0;
        for (int i = 0; i < LAB05_MAX_BREAKS && c->breaks[i] != NULL && !hit; i++) {
            size_t k = strlen(c->breaks[i]);
            if (!used[i] && len > k && strncmp(line, c->breaks[i], k) == 0 && line[k] == ' ')
                used[i] = hit = 1;
        }
        if (!hit) return 0;
        line = end != NULL ? end + 1 : line + len;
    }
    return 1;
}

static int lab05_run_validator(lab_ctx *cx) {
    lab05_state *st = cx->state;
    lab05_exp_a *a = &st->a;
    lab_heading(cx, "A. mc_gpt_config_validate over %d configurations", LAB05_N_CASES);
    for (int i = 0; i < LAB05_N_CASES; i++) {
        const lab05_case *c = &lab05_cases[i];
        lab05_case_result *r = &a->cases[i];
        r->violations = mc_gpt_config_validate(&c->cfg, r->report, sizeof r->report);
        while (r->expected < LAB05_MAX_BREAKS && c->breaks[r->expected] != NULL) r->expected++;
        r->fields_match = lab05_lines_match(r->report, c);
        lab_printf0("%-15s %-52s %d violation%s\n", c->name, c->what, r->violations,
                    r->violations == 1 ? "" : "s");
        for (const char *p = r->report; *p != '\0';) {
            const char *e = strchr(p, '\n');
            int n = e != NULL ? (int)(e - p) : (int)strlen(p);
            lab_printf0("    - %.*s\n", n, p);
            p += n + (e != NULL);
        }
        lab_check(cx, r->violations == r->expected && r->fields_match &&
                          lab05_count_lines(r->report) == r->violations,
                  "%s: %d violations reported, one line each naming the %d fields it was built "
                  "to break", c->name, r->violations, r->expected);
    }
    /* Megatron-LM #468: upstream checked num_layers % pp only and divided by pp * vpp. */
    const mc_gpt_config *m = &lab05_cases[2].cfg;
    int pp = m->pipeline_model_parallel_size, vpp = m->virtual_pipeline_model_parallel_size;
    a->old_check_passes = m->num_layers % pp == 0;
    a->layers_by_division = m->num_layers / (pp * vpp) * pp * vpp;
    a->layers_to_build_status = mc_gpt_num_layers_to_build(m);
    lab_printf0("#468: %d layers at PP=%d VPP=%d: num_layers %% pp = %d (the old check %s); a "
                "floor division builds %d x %d x %d = %d layers; mc_gpt_num_layers_to_build: "
                "%s\n", m->num_layers, pp, vpp, m->num_layers % pp,
                a->old_check_passes ? "passes" : "fails", m->num_layers / (pp * vpp), pp, vpp,
                a->layers_by_division,
                a->layers_to_build_status < 0 ? mc_err_name(a->layers_to_build_status) : "ok");
    lab_check(cx, a->old_check_passes && a->layers_by_division == 64 &&
                      a->layers_to_build_status == MC_ERR_INVALID_DESC,
              "#468: the pp-only check passes, the division builds 64 of 80 layers, the model "
              "refuses to build");
    /* Vocabulary padding: ceil(V / (div * tp)) * div * tp, independently of the library. */
    static const int tps[3] = {1, 2, 8};
    for (int i = 0; i < 3; i++) {
        mc_gpt_config c = {LAB05_GPT2, .tensor_model_parallel_size = tps[i]};
        mc_gpt_config r;
        MC_CHECK(mc_gpt_config_resolve(&r, &c));
        int mult = 128 * tps[i];
        a->padded[i] = r.padded_vocab_size;
        a->padded_formula[i] = (50257 + mult - 1) / mult * mult;
    }
    lab_printf0("vocab 50257 padded to a multiple of 128 x TP: TP=1 %d, TP=2 %d, TP=8 %d\n",
                a->padded[0], a->padded[1], a->padded[2]);
    lab_check(cx, memcmp(a->padded, a->padded_formula, sizeof a->padded) == 0,
              "padded vocabulary = ceil(V / (128 TP)) x 128 TP at TP 1, 2, 8");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   B. train, save, train on (the uninterrupted run) */

static void lab05_read_metadata(lab_ctx *cx, lab05_state *st) {
    if (cx->me != 0) return;
    char dir[600], path[700];
    MC_CHECK(mc_checkpoint_iteration_dir(dir, sizeof dir, st->ckpt_dir, st->k1));
    snprintf(path, sizeof path, "%s/%s", dir, MC_CKPT_METADATA_FILE);
    size_t len = 0;
    char *text = lab_read_text(path, &len);
    if (text == NULL) {
        lab_check(cx, 0, "the checkpoint's %s can be read", path);
        return;
    }
    mc_checkpoint_meta meta;
    MC_CHECK(mc_checkpoint_parse_metadata(&meta, text, len, path, NULL));
    st->meta_math_fp = meta.math_fingerprint, st->meta_layout_fp = meta.layout_fingerprint;
    st->meta_tp = meta.tp, st->meta_pp = meta.pp, st->meta_dp = meta.dp;
    st->meta_tensors = meta.n_tensors, st->meta_iteration = meta.iteration;
    for (const char *p = text; (p = strstr(p, "\nconfig ")) != NULL; p++) st->meta_config_lines++;
    mc_checkpoint_meta_free(&meta);
    free(text);
}

static int lab05_run_train_save(lab_ctx *cx) {
    lab05_state *st = cx->state;
    lab_heading(cx, "B. train %d steps at TP=%d PP=%d DP=%d, save, train %d more", st->k1,
                LAB05_TP, LAB05_PP, cx->grid.dp, st->k2);
    MC_CHECK(mc_parallel_init(&st->ps, &(mc_parallel_desc){
                                           .world = cx->world,
                                           .grid = {.tp = LAB05_TP, .pp = LAB05_PP}}));
    st->have_ps = 1;
    mc_gpt_config cfg = lab05_model_config(LAB05_TP, LAB05_PP);
    lab05_trainer t;
    lab05_trainer_init(&t, &cfg, &st->ps);
    st->saved_cfg = t.gpt.config;
    lab05_run *u = &st->uninterrupted;
    lab05_run_layout_of(u, &st->ps, &t.gpt.config);
    lab05_train(&t, u, st->k1, 0);
    lab05_save(&t, st->ckpt_dir);
    lab05_train(&t, u, st->k2, 1);
    lab05_trainer_destroy(&t);
    lab05_read_metadata(cx, st);
    lab_printf0("model: %d layers, hidden %d, %d heads, ffn %d, vocab %d, seq %d; global batch "
                "%d = %d x %d micro-batches x DP %d; AdamW lr %g, dropout off\n",
                cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.ffn_hidden_size,
                cfg.vocab_size, cfg.seq_length, LAB05_GBS, LAB05_MBS, t.n_micro, t.dp,
                (double)LAB05_LR);
    lab_printf0("checkpoint %s at iteration %d: math_fingerprint %016llx, layout_fingerprint "
                "%016llx, layout tp %d pp %d dp %d, %d config fields, %d tensors\n",
                st->ckpt_dir, st->k1, (unsigned long long)st->meta_math_fp,
                (unsigned long long)st->meta_layout_fp, st->meta_tp, st->meta_pp, st->meta_dp,
                st->meta_config_lines, st->meta_tensors);
    lab05_print_losses("uninterrupted (TP=2 PP=2) loss", u);
    if (cx->me == 0) {
        int finite = 1;
        for (int i = 0; i < u->n_loss; i++) finite &= isfinite(u->loss[i]);
        lab_check(cx, finite && u->loss[st->k1 - 1] < u->loss[0],
                  "the uninterrupted run trains: finite losses, iteration %d below iteration 1",
                  st->k1);
        lab_check(cx, st->meta_math_fp == mc_gpt_config_math_fingerprint(&st->saved_cfg) &&
                          st->meta_layout_fp == mc_gpt_config_layout_fingerprint(&st->saved_cfg),
                  "the checkpoint's fingerprints are the model config's");
        lab_check(cx, st->meta_tp == LAB05_TP && st->meta_pp == LAB05_PP &&
                          st->meta_iteration == st->k1,
                  "the checkpoint records layout TP=%d PP=%d and iteration %d", LAB05_TP,
                  LAB05_PP, st->k1);
    }
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   C. the layout change, on the first DP ranks */

static int lab05_run_layout(lab_ctx *cx) {
    lab05_state *st = cx->state;
    int d = cx->grid.dp;
    lab_heading(cx, "C. layout change: TP 2->1, PP 2->1 on world ranks 0..%d (a sub-communicator "
                "of %d rank%s, DP=%d)", d - 1, d, d == 1 ? "" : "s", d);
    int *members = lab_xcalloc((size_t)d, sizeof *members);
    for (int i = 0; i < d; i++) members[i] = i;
    mc_comm *sub = NULL;
    MC_CHECK(mc_comm_create_group(cx->world, members, d, &sub));
    free(members);
    if (sub != NULL) {
        mc_parallel_state ps1;
        MC_CHECK(mc_parallel_init(&ps1, &(mc_parallel_desc){.world = sub,
                                                            .grid = {.tp = 1, .pp = 1}}));
        mc_gpt_config cfg = lab05_model_config(1, 1);
        lab05_trainer t;
        /* the reference: the same model from scratch at TP=1 PP=1 */
        lab05_trainer_init(&t, &cfg, &ps1);
        lab05_run_layout_of(&st->reference, &ps1, &t.gpt.config);
        lab05_train(&t, &st->reference, st->k1 + st->k2, 0);
        lab05_trainer_destroy(&t);
        /* the reload */
        lab05_trainer_init(&t, &cfg, &ps1);
        lab05_run_layout_of(&st->layout, &ps1, &t.gpt.config);
        MC_CHECK(lab05_load(&t, st->ckpt_dir, 0, &st->layout));
        lab05_train(&t, &st->layout, st->k2, 1);
        lab05_trainer_destroy(&t);
        MC_CHECK(mc_parallel_destroy(&ps1));
        mc_comm_destroy(sub);
    }
    MC_CHECK(mc_barrier(cx->world));
    if (cx->me != 0) return LAB_RAN;
    lab05_run *l = &st->layout, *r = &st->reference, *u = &st->uninterrupted;
    l->max_rel_diff = lab05_max_rel_diff(l, u);
    r->max_rel_diff = lab05_max_rel_diff(r, u);
    lab05_token_diff(l, u);
    lab05_print_losses("reference (TP=1 PP=1, no reload)", r);
    lab05_print_losses("reloaded at TP=1 PP=1", l);
    lab_printf0("load: %s (saved at TP %d PP %d DP %d, now TP 1 PP 1 DP %d); %s\n",
                lab05_outcome(l), l->res.saved_tp, l->res.saved_pp, l->res.saved_dp, d,
                l->res.note[0] ? l->res.note : "RNG states restored");
    lab_printf0("largest relative loss difference: reload vs uninterrupted %.2e, TP=1 reference "
                "vs TP=2 PP=2 run %.2e (tolerance %.0e)\n", l->max_rel_diff, r->max_rel_diff,
                LAB05_LAYOUT_RTOL);
    lab_printf0("per-token losses of iteration %d: mean |difference| %.2e, largest %.2e\n",
                l->tok_iteration, l->tok_mean_abs_diff, l->tok_max_abs_diff);
    lab_check(cx, l->status == MC_OK && l->res.resharded && !l->res.math_mismatch_ignored,
              "the checkpoint loads at TP=1 PP=1, resharded, with the math fingerprint equal");
    lab_check(cx, r->max_rel_diff <= LAB05_LAYOUT_RTOL,
              "TP=2 PP=2 training equals TP=1 PP=1 training: every loss within %.0e relative",
              LAB05_LAYOUT_RTOL);
    lab_check(cx, l->n_loss == st->k2 && l->max_rel_diff <= LAB05_LAYOUT_RTOL &&
                      l->tok_iteration == st->k1 + 1 && l->tok_max_abs_diff <= 1e-4,
              "the resharded continuation equals the uninterrupted run within %.0e relative "
              "(every token's loss within 1e-4)", LAB05_LAYOUT_RTOL);
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   D. a math change: refused, then forced */

/* The variant's change; the numbers come from the nonce. */
static void lab05_math_change_init(lab_ctx *cx, lab05_math_change *mc) {
    uint32_t h = lab_nonce_hash(cx->nonce);
    mc->cfg = lab05_model_config(LAB05_TP, LAB05_PP);
    switch (cx->variant) {
    case 1: {
        static const float eps[3] = {1e-2f, 3e-2f, 1e-1f};
        float e = eps[(h >> 8) % 3];
        snprintf(mc->field, sizeof mc->field, "layernorm_epsilon");
        snprintf(mc->from, sizeof mc->from, "1e-05");
        snprintf(mc->to, sizeof mc->to, "%g", (double)e);
        mc->cfg.layernorm_epsilon = e;
        mc->expected[0] = "layernorm_epsilon";
        mc->n_expected = 1;
        break;
    }
    case 2: {
        int heads = (h >> 8) % 2 ? 8 : 2;   /* kv_channels and query groups follow */
        snprintf(mc->field, sizeof mc->field, "num_attention_heads");
        snprintf(mc->from, sizeof mc->from, "4");
        snprintf(mc->to, sizeof mc->to, "%d", heads);
        mc->cfg.num_attention_heads = heads;
        mc->expected[0] = "num_attention_heads";
        mc->expected[1] = "kv_channels";
        mc->expected[2] = "num_query_groups";
        mc->n_expected = 3;
        break;
    }
    default:
        snprintf(mc->field, sizeof mc->field, "num_layers");
        snprintf(mc->from, sizeof mc->from, "4");
        snprintf(mc->to, sizeof mc->to, "2");
        mc->cfg.num_layers = 2;
        mc->expected[0] = "num_layers";
        mc->n_expected = 1;
        break;
    }
}

/* A fresh trainer for cfg at the save layout, loaded with flags, trained `steps` on success. */
static void lab05_reload(lab05_state *st, const mc_gpt_config *cfg, unsigned flags,
                         lab05_run *run, int steps) {
    lab05_trainer t;
    lab05_trainer_init(&t, cfg, &st->ps);
    lab05_run_layout_of(run, &st->ps, &t.gpt.config);
    if (lab05_load(&t, st->ckpt_dir, flags, run) == MC_OK) lab05_train(&t, run, steps, 1);
    lab05_trainer_destroy(&t);
}

static int lab05_run_math(lab_ctx *cx) {
    lab05_state *st = cx->state;
    lab05_math_change *mc = &st->change;
    lab05_math_change_init(cx, mc);
    lab_heading(cx, "D. math change (%s): %s %s -> %s at TP=%d PP=%d", cx->variant_name,
                mc->field, mc->from, mc->to, LAB05_TP, LAB05_PP);
    char report[LAB05_REPORT_CAP];
    MC_CHECK(mc_gpt_config_validate(&mc->cfg, report, sizeof report) == 0 ? MC_OK
                                                                           : MC_ERR_INVALID_DESC);
    lab05_reload(st, &mc->cfg, 0, &st->math_refused, 0);
    lab05_reload(st, &mc->cfg, MC_CKPT_LOAD_IGNORE_MATH, &st->math_forced, st->k2);
    mc_gpt_config untied = lab05_model_config(LAB05_TP, LAB05_PP);
    untied.untie_embeddings_and_output_weights = 1;
    lab05_reload(st, &untied, MC_CKPT_LOAD_IGNORE_MATH, &st->untie_forced, 0);
    if (cx->me != 0) return LAB_RAN;
    lab05_run *rf = &st->math_refused, *fo = &st->math_forced, *un = &st->untie_forced;
    lab05_run *u = &st->uninterrupted;
    mc->diff_count = mc_gpt_config_math_diff(&st->saved_cfg, &mc->cfg, NULL, 0);
    for (int i = 0; i < mc->n_expected; i++)
        mc->fields_in_message += strstr(rf->message, mc->expected[i]) != NULL;
    fo->max_rel_diff = lab05_max_rel_diff(fo, u);
    lab05_token_diff(fo, u);
    lab_printf0("load: %s (%s) after %.1f ms:\n  %s\n", lab05_outcome(rf),
                mc_err_name(rf->status), rf->load_seconds * 1e3, rf->message);
    lab_printf0("forced (MC_CKPT_LOAD_IGNORE_MATH): %s%s\n", lab05_outcome(fo),
                fo->res.math_mismatch_ignored ? ", mismatch ignored" : "");
    lab05_print_losses("uninterrupted loss", u);
    lab05_print_losses("forced reload loss", fo);
    double jump = fo->n_loss > 0 ? fo->loss[0] - lab05_loss_at(u, fo->first_iteration) : NAN;
    lab_printf0("first resumed step: %+.6f (%+.2f%%); largest relative difference %.2e\n", jump,
                100.0 * jump / lab05_loss_at(u, fo->first_iteration), fo->max_rel_diff);
    lab_printf0("per-token losses of iteration %d: mean |difference| %.4f, largest %.4f (the "
                "mean loss hides how much the function changed)\n", fo->tok_iteration,
                fo->tok_mean_abs_diff, fo->tok_max_abs_diff);
    lab_printf0("untied embeddings, forced: %s (%s):\n  %s\n", lab05_outcome(un),
                mc_err_name(un->status), un->message);
    lab_check(cx, rf->status == MC_ERR_INVALID_DESC &&
                      mc->fields_in_message == mc->n_expected &&
                      mc->diff_count == mc->n_expected,
              "the changed math is refused, naming the %d field%s that differ", mc->n_expected,
              mc->n_expected == 1 ? "" : "s");
    lab_check(cx, rf->math_fp != st->meta_math_fp && rf->layout_fp == st->meta_layout_fp,
              "the changed config's math fingerprint differs from the checkpoint's, its layout "
              "fingerprint does not");
    lab_check(cx, fo->status == MC_OK && fo->res.math_mismatch_ignored && !fo->res.resharded &&
                      fo->n_loss == st->k2 && fo->max_rel_diff > LAB05_MOVE_RTOL &&
                      fo->tok_mean_abs_diff > 1e-3,
              "forced, the checkpoint loads; the loss moves by more than %.0e relative and the "
              "per-token losses by more than 1e-3 on average", LAB05_MOVE_RTOL);
    lab_check(cx, un->status != MC_OK && strstr(un->message, "output_layer.weight") != NULL,
              "untied embeddings are refused even when forced: the checkpoint has no "
              "output_layer.weight");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   E. a performance-only change */

static int lab05_run_perf(lab_ctx *cx) {
    lab05_state *st = cx->state;
    lab_heading(cx, "E. performance change: recompute_granularity full (uniform, 1 layer) at "
                "TP=%d PP=%d", LAB05_TP, LAB05_PP);
    mc_gpt_config cfg = lab05_model_config(LAB05_TP, LAB05_PP);
    cfg.recompute_granularity = MC_RECOMPUTE_FULL;
    cfg.recompute_method = MC_RECOMPUTE_UNIFORM;
    cfg.recompute_num_layers = 1;
    lab05_reload(st, &cfg, 0, &st->perf, st->k2);
    if (cx->me != 0) return LAB_RAN;
    lab05_run *p = &st->perf;
    p->max_rel_diff = lab05_max_rel_diff(p, &st->uninterrupted);
    lab05_token_diff(p, &st->uninterrupted);
    lab05_print_losses("uninterrupted loss", &st->uninterrupted);
    lab05_print_losses("reloaded with full recompute", p);
    lab_printf0("load: %s; largest relative difference %.2e (tolerance %.0e); per-token losses "
                "of iteration %d: largest |difference| %.2e\n", lab05_outcome(p),
                p->max_rel_diff, LAB05_PERF_RTOL, p->tok_iteration, p->tok_max_abs_diff);
    lab_check(cx, p->status == MC_OK && !p->res.resharded && p->math_fp == st->meta_math_fp &&
                      p->layout_fp == st->meta_layout_fp,
              "recompute is in neither fingerprint: the load is allowed as it is");
    lab_check(cx, p->n_loss == st->k2 && p->max_rel_diff <= LAB05_PERF_RTOL &&
                      p->tok_iteration == st->k1 + 1 && p->tok_max_abs_diff <= 1e-5,
              "with recompute the continuation equals the uninterrupted run within %.0e",
              LAB05_PERF_RTOL);
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   facts */

static cJSON *lab05_losses_json(const lab05_run *r) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < r->n_loss; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(round(r->loss[i] * 1e6) / 1e6));
    return a;
}

static void lab05_hex(char *out, size_t cap, uint64_t v) {
    snprintf(out, cap, "%016llx", (unsigned long long)v);
}

/* One reload: its outcome, its load's result and the losses against the uninterrupted run. */
static cJSON *lab05_run_json(const lab05_state *st, const lab05_run *r, double tol) {
    cJSON *o = cJSON_CreateObject();
    char hex[20];
    cJSON_AddStringToObject(o, "outcome", lab05_outcome(r));
    cJSON_AddStringToObject(o, "status", r->status == MC_OK ? "MC_OK" : mc_err_name(r->status));
    if (r->status != MC_OK) cJSON_AddStringToObject(o, "message", r->message);
    cJSON *lay = cJSON_AddObjectToObject(o, "layout");
    cJSON_AddNumberToObject(lay, "tp", r->tp);
    cJSON_AddNumberToObject(lay, "pp", r->pp);
    cJSON_AddNumberToObject(lay, "dp", r->dp);
    lab05_hex(hex, sizeof hex, r->math_fp);
    cJSON_AddStringToObject(o, "math_fingerprint", hex);
    lab05_hex(hex, sizeof hex, r->layout_fp);
    cJSON_AddStringToObject(o, "layout_fingerprint", hex);
    cJSON_AddNumberToObject(o, "load_ms", lab_round_ms(r->load_seconds * 1e3));
    if (r->status == MC_OK && r->first_iteration > 0) {
        cJSON_AddBoolToObject(o, "resharded", r->res.resharded);
        cJSON_AddBoolToObject(o, "math_mismatch_ignored", r->res.math_mismatch_ignored);
        cJSON_AddBoolToObject(o, "rng_restored", r->res.rng_restored);
        cJSON_AddStringToObject(o, "note", r->res.note);
        cJSON_AddNumberToObject(o, "first_iteration", r->first_iteration);
        cJSON_AddItemToObject(o, "losses", lab05_losses_json(r));
        cJSON *ua = cJSON_AddArrayToObject(o, "uninterrupted_losses");
        for (int i = 0; i < r->n_loss; i++) {
            double v = lab05_loss_at(&st->uninterrupted, r->first_iteration + i);
            cJSON_AddItemToArray(ua, cJSON_CreateNumber(round(v * 1e6) / 1e6));
        }
        double first = r->loss[0] - lab05_loss_at(&st->uninterrupted, r->first_iteration);
        cJSON_AddNumberToObject(o, "first_step_difference", round(first * 1e6) / 1e6);
        cJSON_AddNumberToObject(o, "max_rel_diff", r->max_rel_diff);
        if (tol > 0) cJSON_AddNumberToObject(o, "tolerance", tol);
        cJSON_AddBoolToObject(o, "loss_moves", r->max_rel_diff > LAB05_MOVE_RTOL);
        cJSON_AddNumberToObject(o, "token_loss_iteration", r->tok_iteration);
        cJSON_AddNumberToObject(o, "token_loss_mean_abs_diff", r->tok_mean_abs_diff);
        cJSON_AddNumberToObject(o, "token_loss_max_abs_diff", r->tok_max_abs_diff);
    }
    return o;
}

static cJSON *lab05_validator_json(const lab05_exp_a *a) {
    cJSON *v = cJSON_CreateObject();
    cJSON *counts = cJSON_AddObjectToObject(v, "violations");
    cJSON *cases = cJSON_AddArrayToObject(v, "cases");
    for (int i = 0; i < LAB05_N_CASES; i++) {
        const lab05_case_result *r = &a->cases[i];
        cJSON_AddNumberToObject(counts, lab05_cases[i].name, r->violations);
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "name", lab05_cases[i].name);
        cJSON_AddStringToObject(c, "what", lab05_cases[i].what);
        cJSON_AddNumberToObject(c, "violations", r->violations);
        cJSON_AddNumberToObject(c, "built_to_break", r->expected);
        cJSON_AddBoolToObject(c, "lines_name_the_broken_fields", r->fields_match);
        cJSON *lines = cJSON_AddArrayToObject(c, "report");
        for (const char *p = r->report; *p != '\0';) {
            const char *e = strchr(p, '\n');
            size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
            char *line = lab_xcalloc(n + 1, 1);
            memcpy(line, p, n);
            cJSON_AddItemToArray(lines, cJSON_CreateString(line));
            free(line);
            p += n + (e != NULL);
        }
        cJSON_AddItemToArray(cases, c);
    }
    cJSON *m = cJSON_AddObjectToObject(v, "mr468");
    cJSON_AddNumberToObject(m, "num_layers", lab05_cases[2].cfg.num_layers);
    cJSON_AddNumberToObject(m, "pp", lab05_cases[2].cfg.pipeline_model_parallel_size);
    cJSON_AddNumberToObject(m, "vpp", lab05_cases[2].cfg.virtual_pipeline_model_parallel_size);
    cJSON_AddBoolToObject(m, "pp_only_check_passes", a->old_check_passes);
    cJSON_AddNumberToObject(m, "layers_built_by_division", a->layers_by_division);
    cJSON_AddStringToObject(m, "num_layers_to_build",
                            a->layers_to_build_status < 0 ? mc_err_name(a->layers_to_build_status)
                                                          : "ok");
    cJSON *pv = cJSON_AddObjectToObject(v, "padded_vocab");
    cJSON_AddNumberToObject(pv, "vocab_size", 50257);
    cJSON_AddNumberToObject(pv, "tp1", a->padded[0]);
    cJSON_AddNumberToObject(pv, "tp2", a->padded[1]);
    cJSON_AddNumberToObject(pv, "tp8", a->padded[2]);
    return v;
}

static cJSON *lab05_facts(lab_ctx *cx) {
    const lab05_state *st = cx->state;
    const lab05_math_change *mc = &st->change;
    char hex[20];
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "world", cx->world_size);
    cJSON_AddItemToObject(f, "validator", lab05_validator_json(&st->a));

    cJSON *tr = cJSON_AddObjectToObject(f, "training");
    cJSON *model = cJSON_AddObjectToObject(tr, "model");
    cJSON_AddNumberToObject(model, "num_layers", st->saved_cfg.num_layers);
    cJSON_AddNumberToObject(model, "hidden_size", st->saved_cfg.hidden_size);
    cJSON_AddNumberToObject(model, "num_attention_heads", st->saved_cfg.num_attention_heads);
    cJSON_AddNumberToObject(model, "vocab_size", st->saved_cfg.vocab_size);
    cJSON_AddNumberToObject(model, "seq_length", st->saved_cfg.seq_length);
    cJSON_AddNumberToObject(tr, "k1", st->k1);
    cJSON_AddNumberToObject(tr, "k2", st->k2);
    cJSON_AddNumberToObject(tr, "global_batch_size", LAB05_GBS);
    cJSON_AddNumberToObject(tr, "micro_batch_size", LAB05_MBS);
    cJSON_AddNumberToObject(tr, "save_dp", cx->grid.dp);
    cJSON_AddItemToObject(tr, "uninterrupted_losses", lab05_losses_json(&st->uninterrupted));
    cJSON_AddItemToObject(tr, "tp1_reference_losses", lab05_losses_json(&st->reference));
    cJSON_AddNumberToObject(tr, "tp1_reference_max_rel_diff", st->reference.max_rel_diff);

    cJSON *ck = cJSON_AddObjectToObject(f, "checkpoint");
    cJSON_AddStringToObject(ck, "dir", st->ckpt_dir);
    cJSON_AddNumberToObject(ck, "iteration", (double)st->meta_iteration);
    lab05_hex(hex, sizeof hex, st->meta_math_fp);
    cJSON_AddStringToObject(ck, "math_fingerprint", hex);
    lab05_hex(hex, sizeof hex, st->meta_layout_fp);
    cJSON_AddStringToObject(ck, "layout_fingerprint", hex);
    cJSON_AddNumberToObject(ck, "saved_tp", st->meta_tp);
    cJSON_AddNumberToObject(ck, "saved_pp", st->meta_pp);
    cJSON_AddNumberToObject(ck, "saved_dp", st->meta_dp);
    cJSON_AddNumberToObject(ck, "config_fields", st->meta_config_lines);
    cJSON_AddNumberToObject(ck, "tensors", st->meta_tensors);

    cJSON *rl = cJSON_AddObjectToObject(f, "reload");
    cJSON *lay = lab05_run_json(st, &st->layout, LAB05_LAYOUT_RTOL);
    cJSON_AddStringToObject(lay, "change", "TP 2->1, PP 2->1");
    cJSON_AddNumberToObject(lay, "ranks", cx->grid.dp);
    cJSON_AddItemToObject(rl, "layout", lay);
    cJSON *math = cJSON_AddObjectToObject(rl, "math");
    cJSON_AddStringToObject(math, "variant", cx->variant_name);
    cJSON_AddStringToObject(math, "field", mc->field);
    cJSON_AddStringToObject(math, "from", mc->from);
    cJSON_AddStringToObject(math, "to", mc->to);
    cJSON_AddNumberToObject(math, "fields_named", mc->diff_count);
    cJSON_AddItemToObject(math, "refused", lab05_run_json(st, &st->math_refused, 0));
    cJSON_AddItemToObject(math, "forced", lab05_run_json(st, &st->math_forced, 0));
    cJSON *un = lab05_run_json(st, &st->untie_forced, 0);
    cJSON_AddStringToObject(un, "change", "untie_embeddings_and_output_weights 0 -> 1, forced");
    cJSON_AddItemToObject(rl, "untie_forced", un);
    cJSON *perf = lab05_run_json(st, &st->perf, LAB05_PERF_RTOL);
    cJSON_AddStringToObject(perf, "change", "recompute_granularity none -> full (uniform, 1)");
    cJSON_AddItemToObject(rl, "perf", perf);

    /* what the predictions are graded against */
    cJSON *o = cJSON_AddObjectToObject(f, "outcomes");
    cJSON_AddStringToObject(o, "layout_change", lab05_outcome(&st->layout));
    cJSON_AddBoolToObject(o, "layout_loss_moves", st->layout.max_rel_diff > LAB05_MOVE_RTOL);
    cJSON_AddStringToObject(o, "math_change", lab05_outcome(&st->math_refused));
    cJSON_AddBoolToObject(o, "math_forced_loads", st->math_forced.status == MC_OK);
    cJSON_AddBoolToObject(o, "math_forced_loss_moves",
                          st->math_forced.status == MC_OK &&
                              st->math_forced.max_rel_diff > LAB05_MOVE_RTOL);
    cJSON_AddStringToObject(o, "perf_change", lab05_outcome(&st->perf));
    cJSON_AddBoolToObject(o, "perf_loss_moves", st->perf.max_rel_diff > LAB05_MOVE_RTOL);
    cJSON_AddStringToObject(o, "untie_forced", lab05_outcome(&st->untie_forced));
    cJSON_AddNumberToObject(o, "move_threshold", LAB05_MOVE_RTOL);
    return f;
}

static void lab05_report(lab_ctx *cx) {
    const lab05_state *st = cx->state;
    lab_printf0("\n== Measured ==\n");
    lab_printf0("validator: ");
    for (int i = 0; i < LAB05_N_CASES; i++)
        lab_printf0("%s%s %d", i ? ", " : "", lab05_cases[i].name, st->a.cases[i].violations);
    lab_printf0(" violations\n");
    lab_printf0("layout change TP 2->1 PP 2->1: %s, continued loss within %.1e of the "
                "uninterrupted run\n", lab05_outcome(&st->layout), st->layout.max_rel_diff);
    lab_printf0("math change %s %s -> %s: %s; forced: loss moves by up to %.2f%%\n",
                st->change.field, st->change.from, st->change.to,
                lab05_outcome(&st->math_refused), 100.0 * st->math_forced.max_rel_diff);
    lab_printf0("performance change (full recompute): %s, within %.1e\n",
                lab05_outcome(&st->perf), st->perf.max_rel_diff);
}

/* ---------------------------------------------------------------------------------------------
   the spec */

static int lab05_check_world(const lab_ctx *cx, char *why, size_t cap) {
    const mc_grid_desc *g = &cx->grid.desc;
    if (g->tp != LAB05_TP || g->pp != LAB05_PP || g->cp != 1 || g->vpp != 0 || g->ep != 1) {
        snprintf(why, cap, "it saves at TP=%d PP=%d (no CP, VPP or EP) and reloads at TP=1 "
                 "PP=1; got tp=%d pp=%d cp=%d vpp=%d ep=%d", LAB05_TP, LAB05_PP, g->tp, g->pp,
                 g->cp, g->vpp, g->ep);
        return 1;
    }
    if (LAB05_GBS % (LAB05_MBS * cx->grid.dp) != 0) {
        snprintf(why, cap, "the global batch (%d samples of %d per micro-batch) must split over "
                 "DP = world / %d = %d: use 4, 8 or 16 ranks", LAB05_GBS, LAB05_MBS,
                 LAB05_TP * LAB05_PP, cx->grid.dp);
        return 1;
    }
    return 0;
}

/* Runs before A on every rank: step counts and the checkpoint directory. */
static int lab05_run_setup(lab_ctx *cx) {
    lab05_state *st = cx->state;
    uint32_t h = lab_nonce_hash(cx->nonce);
    st->k1 = cx->args->quick ? 3 : 12 + (int)((h >> 4) % 5);
    st->k2 = cx->args->quick ? 2 : LAB05_K2;
    const char *res = cx->args->results_path;
    size_t n = strlen(res);
    if (n > 5 && strcmp(res + n - 5, ".json") == 0) n -= 5;
    snprintf(st->ckpt_dir, sizeof st->ckpt_dir, "%.*s.ckpt", (int)n, res);
    return LAB_RAN;
}

static void lab05_cleanup(lab_ctx *cx) {
    lab05_state *st = cx->state;
    if (st->have_ps) MC_CHECK(mc_parallel_destroy(&st->ps));
    st->have_ps = 0;
}

static const char lab05_summary[] =
    "lab05 (M005): why TransformerConfig is a contract and not a hyper-parameter dataclass.\n"
    "A runs the config validator over configurations built to break its rules; B trains a small\n"
    "GPT at TP=2 PP=2 and saves a checkpoint with its config fingerprints; C, D and E reload it\n"
    "under a layout change (resharded), a math change (refused; forced, the loss jumps) and a\n"
    "performance-only change (allowed, same loss). Worlds: 4 (default), 8 or 16 ranks.";

static const lab_experiment lab05_experiments[] = {
    {"setup", lab05_run_setup},
    {"A", lab05_run_validator},
    {"B", lab05_run_train_save},
    {"C", lab05_run_layout},
    {"D", lab05_run_math},
    {"E", lab05_run_perf},
};

static const lab_spec lab05_spec = {
    .name = "lab05",
    .question = "M005",
    .title = "TransformerConfig is a contract",
    .summary = lab05_summary,
    .default_world = 4,
    .sizes = {.tp = LAB05_TP, .pp = LAB05_PP},
    .min_world = 4,
    .max_world = 16,
    .check_world = lab05_check_world,
    .call_timeout_s = 20.0,
    .n_variants = LAB05_N_VARIANTS,
    .experiments = lab05_experiments,
    .n_experiments = (int)(sizeof lab05_experiments / sizeof lab05_experiments[0]),
    .state_size = sizeof(lab05_state),
    .facts = lab05_facts,
    .report = lab05_report,
    .cleanup = lab05_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab05_spec); }
