/* model_cases - the GPT model over TP x PP (x VPP) ranks against the single-rank model.

       mpirun -np N build/tests/model_cases <case> [--tp T] [--pp P] [--vpp V] [--sp]
                   [--untied] [--hidden-dropout] [--recompute full-uniform|full-block|selective] [-M microbatches]

   Cases:
     equiv      every rank also builds the TP = PP = 1 model in process (ps = NULL; the
                initialisation is TP-invariant, so it holds the same global weights) and runs
                the same micro-batches. The distributed model runs the stages by hand (all
                forwards through every virtual stage, then all backwards, blocking P2P on the
                pp group), sums the sequence-parallel grads over TP and the tied embedding
                grads over the embedding group (what finalize_model_grads does), then checks:
                the tied copy equals the word embedding after init, every micro-batch's loss
                (1e-5 relative), the gathered logits, and every parameter gradient against the
                slice of the reference's gradient of the same name.
     recompute  two distributed models with dropout on, one with the given recompute and one
                without, run the same schedule: losses and every gradient bit-identical.
     schedule   as equiv, but the distributed model runs under mc_get_forward_backward_func
                (no pipelining, 1F1B or interleaved) through mc_gpt_forward_step /
                mc_gpt_backward_step; finalize is the hook; grad-ready reports come only from
                each chunk's last micro-batch (grad sync), once per parameter.
     rng        dropout on: every rank's RNG-tracker seeds and the masks they draw (TP ranks'
                model-parallel masks differ, DP replicas' agree).
   In `equiv` every bias starts non-zero (a zero bias hides bias bugs). Dropout is off in `equiv` (masks differ by design across TP ranks and PP stages), except
   with --hidden-dropout under TP without SP: hidden and embedding dropout act on activations
   replicated over TP and draw from the default generator, whose seed does not depend on the
   TP rank, so every TP rank draws the single-rank model's masks. The
   vocabulary (64, divisible by 8) pads to 64 for TP 1, 2 and 4, so the models compare.
   Rank 0 ends with "N passed, N failed". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

typedef struct options {
    int tp, pp, vpp, sp, untied, microbatches;
    int hidden_dropout;          /* equiv: hidden dropout 0.1 (TP without SP only) */
    mc_recompute_granularity granularity;
    mc_recompute_method method;
} options;

static mc_comm *world;

static mc_gpt_config base_config(const options *o) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = o->vpp > 1 ? 2 * o->pp * o->vpp : 4;
    c.hidden_size = 16;
    c.num_attention_heads = 4;
    c.ffn_hidden_size = 32;
    c.vocab_size = 64;
    c.make_vocab_size_divisible_by = 8;
    c.seq_length = 8;
    c.max_position_embeddings = 8;
    c.micro_batch_size = 2;
    c.init_method_std = 0.1f;
    c.hidden_dropout = o->hidden_dropout ? 0.1f : MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    c.untie_embeddings_and_output_weights = o->untied;
    c.seed = 1234;
    return c;
}

static mc_gpt_config parallel_config(const options *o) {
    mc_gpt_config c = base_config(o);
    c.tensor_model_parallel_size = o->tp;
    c.pipeline_model_parallel_size = o->pp;
    c.virtual_pipeline_model_parallel_size = o->vpp > 1 ? o->vpp : 0;
    c.sequence_parallel = o->sp;
    c.recompute_granularity = o->granularity;
    c.recompute_method = o->method;
    c.recompute_num_layers = o->granularity == MC_RECOMPUTE_FULL ? (o->method == MC_RECOMPUTE_BLOCK ? 1 : 2) : 0;
    return c;
}

/* tokens and labels [S, B] of micro-batch m: the same on every rank */
static void batch_of(int m, int *tokens, int *labels, int n, int vocab) {
    uint32_t x = 2166136261u ^ (uint32_t)(m * 7919 + 17);
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = (int)((x >> 9) % (uint32_t)vocab);
        x = x * 1664525u + 1013904223u;
        labels[i] = (int)((x >> 9) % (uint32_t)vocab);
    }
}

static int check_rc(int rc, const char *what) {
    return MC_CASE_CHECK_STATUS(rc, MC_OK, what);
}

/* ---------------------------------------------------------------------------------------------
   running the stages by hand: all forwards (each through every virtual stage), then all
   backwards in reverse; a virtual stage v runs on pipeline rank v % PP as chunk v / PP */

typedef struct run_result {
    double loss[16];            /* per micro-batch, on the last stage */
} run_result;

static int run_pipeline(mc_gpt *g, int M, run_result *res) {
    mc_comm *pp = g->ps ? mc_parallel_group(g->ps, MC_GROUP_PP) : NULL;
    int P = g->pp, VS = g->pp * g->n_chunks, rc;
    float *buf = calloc(g->p2p_elems, sizeof(float));
    int *tokens = calloc((size_t)g->N, sizeof(int)), *labels = calloc((size_t)g->N, sizeof(int));
    for (int m = 0; m < M; m++) {
        batch_of(m, tokens, labels, g->N, g->config.vocab_size);
        for (int v = 0; v < VS; v++) {
            if (v % P != g->pp_rank) continue;
            int chunk = v / P;
            float *out = NULL;
            const float *in = NULL;
            if (v > 0) {
                if ((rc = mc_recv(pp, buf, g->p2p_elems, MC_F32, (g->pp_rank + P - 1) % P, m * 64 + v)) != MC_OK)
                    goto done;
                in = buf;
            }
            double loss = 0.0;
            if ((rc = mc_gpt_forward(g, chunk, m, tokens, labels, in, &out, &loss)) != MC_OK) goto done;
            if (v == VS - 1) res->loss[m] = loss;
            if (v < VS - 1 &&
                (rc = mc_send(pp, out, g->p2p_elems, MC_F32, (g->pp_rank + 1) % P, m * 64 + v + 1)) != MC_OK)
                goto done;
        }
    }
    for (int m = M - 1; m >= 0; m--) {
        for (int v = VS - 1; v >= 0; v--) {
            if (v % P != g->pp_rank) continue;
            int chunk = v / P;
            float *dinp = NULL;
            const float *dout = NULL;
            if (v < VS - 1) {
                if ((rc = mc_recv(pp, buf, g->p2p_elems, MC_F32, (g->pp_rank + 1) % P, 1000 + m * 64 + v)) != MC_OK)
                    goto done;
                dout = buf;
            }
            if ((rc = mc_gpt_backward(g, chunk, m, dout, 1.0f / (float)(g->N * M), &dinp)) != MC_OK)
                goto done;
            if (v > 0 &&
                (rc = mc_send(pp, dinp, g->p2p_elems, MC_F32, (g->pp_rank + P - 1) % P, 1000 + m * 64 + v - 1)) != MC_OK)
                goto done;
        }
    }
    rc = MC_OK;
done:
    free(buf);
    free(tokens);
    free(labels);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   running the stages through the schedule module (mc_get_forward_backward_func) with the
   model's schedule adapter */

typedef struct sched_app {
    mc_gpt *gpt;
    int tokens[256], labels[256];
    double loss[16];
    int (*finalize)(mc_gpt *g);
} sched_app;

static int app_forward(void *app, int chunk, int microbatch, const float *input, float **output,
                       double *loss_sum, double *num_tokens) {
    sched_app *a = (sched_app *)app;
    batch_of(microbatch, a->tokens, a->labels, a->gpt->N, a->gpt->config.vocab_size);
    int rc = mc_gpt_forward_step(a->gpt, chunk, microbatch, a->tokens, a->labels, input, output,
                                 loss_sum, num_tokens);
    if (rc == MC_OK && mc_gpt_is_post_process(a->gpt, chunk) && microbatch < 16)
        a->loss[microbatch] = *loss_sum;
    return rc;
}

static int app_backward(void *app, int chunk, int microbatch, const float *output_grad,
                        float loss_scale, float **input_grad) {
    sched_app *a = (sched_app *)app;
    return mc_gpt_backward_step(a->gpt, chunk, microbatch, output_grad, loss_scale, input_grad);
}

static void app_grad_sync(void *app, int chunk, int enable) {
    mc_gpt_set_grad_sync(((sched_app *)app)->gpt, chunk, enable);
}

static int app_finalize(void *app) {
    sched_app *a = (sched_app *)app;
    return a->finalize ? a->finalize(a->gpt) : MC_OK;
}

static int ready_count;
static void count_ready(void *user, int param) {
    (void)user;
    (void)param;
    ready_count++;
}

static int run_schedule(mc_gpt *g, int M, run_result *res, int (*finalize)(mc_gpt *g)) {
    static sched_app app;
    static mc_schedule_result result;
    mc_schedule_hooks hooks;
    memset(&app, 0, sizeof app);
    memset(&hooks, 0, sizeof hooks);
    app.gpt = g;
    app.finalize = finalize;
    hooks.app = &app;
    hooks.forward_step = app_forward;
    hooks.backward_step = app_backward;
    hooks.grad_sync = app_grad_sync;
    hooks.finalize = app_finalize;
    hooks.tensor_elems = g->p2p_elems;
    mc_forward_backward_func fb = mc_get_forward_backward_func(g->ps);
    if (!MC_CASE_CHECK(fb != NULL, "no forward_backward function")) return MC_ERR_INVALID_ARG;
    ready_count = 0;
    g->grad_ready = count_ready;
    int rc = fb(g->ps, &hooks, M, 0, &result);
    g->grad_ready = NULL;
    /* grad sync is on only for each chunk's last backward: every parameter reported once */
    MC_CASE_CHECK(rc != MC_OK || ready_count == g->table.count,
                  "%d grad-ready reports over %d micro-batches for %d parameters", ready_count,
                  M, g->table.count);
    MC_CASE_CHECK(rc != MC_OK || result.n_ops == 2 * M * g->n_chunks,
                  "the schedule ran %d compute ops, want %d", result.n_ops, 2 * M * g->n_chunks);
    for (int m = 0; m < M && m < 16; m++) res->loss[m] = app.loss[m];
    return rc;
}

/* What finalize_model_grads does for the model (§10 steps 3 and 4): sequence-parallel grads
   summed over TP, the tied embedding pair's grads summed over the embedding group. */
static int finalize_by_hand(mc_gpt *g) {
    mc_comm *tp = mc_parallel_group(g->ps, MC_GROUP_TP);
    mc_comm *emb = mc_parallel_group(g->ps, MC_GROUP_EMBEDDING);
    int rc;
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        float *gr = g->grads + p->offset;
        if (p->sequence_parallel && g->sequence_parallel &&
            (rc = mc_all_reduce(tp, gr, gr, p->numel, MC_F32, MC_SUM)) != MC_OK)
            return rc;
        if (p->shared_embedding && g->tied && emb && emb->size > 1 &&
            (rc = mc_all_reduce(emb, gr, gr, p->numel, MC_F32, MC_SUM)) != MC_OK)
            return rc;
    }
    return MC_OK;
}

/* The slice of the reference's (TP = 1, global) tensor that this rank's shard of `p` holds. */
static void reference_slice(const mc_gpt *ref, const char *ref_name, const mc_param_info *p,
                            int tp_rank, int from_grads, float *out) {
    int k = mc_param_table_find(&ref->table, ref_name);
    const mc_param_info *q = &ref->table.info[k];
    const float *src = (from_grads ? ref->grads : (const float *)ref->params) + q->offset;
    int rows = p->local_shape[0], cols = p->ndim == 2 ? p->local_shape[1] : 1;
    int gcols = p->ndim == 2 ? p->global_shape[1] : 1;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            int gi = p->partition_dim == 0 ? tp_rank * rows + i : i;
            int gj = p->partition_dim == 1 ? tp_rank * cols + j : j;
            out[(size_t)i * cols + j] = src[(size_t)gi * gcols + gj];
        }
}

/* the reference name: the tied copy is the word embedding */
static const char *reference_name(const mc_gpt *g, const mc_param_info *p) {
    if (p->shared && g->tied) return "embedding.word_embeddings.weight";
    return p->name;
}

static void compare_tensor(const char *what, const char *name, const float *got, const float *want,
                           size_t n, double rtol_of_max) {
    double maxabs = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) if (fabs(want[i]) > maxabs) maxabs = fabs(want[i]);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > worst || isnan(d)) { worst = d; at = i; }
    }
    double tol = rtol_of_max * maxabs + 1e-8;
    MC_CASE_CHECK(worst <= tol, "%s %s: max |diff| %.3g at [%zu] (got %.9g, want %.9g), tolerance %.3g",
                  what, name, worst, at, got[at], want[at], tol);
    MC_CASE_CHECK(maxabs > 0 || strstr(name, "bias") || strstr(name, "position"),
                  "%s %s: the reference is all zeros (nothing was compared)", what, name);
}

/* Megatron initialises every bias to zero, and a bias bug that a zero hides (a row-parallel
   bias added on every TP rank before the all-reduce, a bias left out) passes an equivalence
   test. So the reference's biases get values that differ per element, and every shard of
   the distributed model gets its slice of them. */
static void set_nonzero_biases(mc_gpt *ref, mc_gpt *g, int tp_rank, float *scratch) {
    for (int i = 0; i < ref->table.count; i++) {
        const mc_param_info *q = &ref->table.info[i];
        if (!strstr(q->name, "bias")) continue;
        uint32_t h = 2166136261u;
        for (const char *c = q->name; *c; c++) h = (h ^ (uint8_t)*c) * 16777619u;
        for (size_t k = 0; k < q->numel; k++)
            ((float *)ref->params)[q->offset + k] = 0.02f * (float)((h + 7u * (uint32_t)k) % 11u) - 0.1f;
    }
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        if (!strstr(p->name, "bias")) continue;
        reference_slice(ref, reference_name(g, p), p, tp_rank, 0, scratch);
        memcpy((float *)g->params + p->offset, scratch, p->numel * sizeof(float));
    }
}

static int case_equiv(const options *o, int use_schedule) {
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    mc_parallel_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.world = world;
    pd.grid.tp = o->tp;
    pd.grid.pp = o->pp;
    pd.grid.vpp = o->vpp > 1 ? o->vpp : 0;
    if (!check_rc(mc_parallel_init(&ps, &pd), "mc_parallel_init")) return 1;
    int M = o->microbatches;

    mc_gpt ref, g;
    mc_gpt_desc rd, gd;
    memset(&rd, 0, sizeof rd);
    memset(&gd, 0, sizeof gd);
    rd.config = base_config(o);
    rd.n_slots = M;
    gd.config = parallel_config(o);
    gd.ps = &ps;
    gd.n_slots = M;
    gd.gather_logits = 1;
    if (!check_rc(mc_gpt_init(&ref, &rd), "mc_gpt_init (reference)")) return 1;
    if (!check_rc(mc_gpt_init(&g, &gd), "mc_gpt_init (distributed)")) return 1;
    int tp_rank = g.tp_rank;

    /* after init: every shard (the tied copy included) is the reference's slice */
    float *want = calloc(g.table.total + 1, sizeof(float));
    set_nonzero_biases(&ref, &g, tp_rank, want);
    for (int i = 0; i < g.table.count; i++) {
        const mc_param_info *p = &g.table.info[i];
        reference_slice(&ref, reference_name(&g, p), p, tp_rank, 0, want);
        MC_CASE_CHECK(memcmp((const float *)g.params + p->offset, want,
                             p->numel * sizeof(float)) == 0,
                      "init: %s%s differs from the single-rank model's slice", p->name,
                      p->shared ? " (the tied copy: the embedding-group all-reduce)" : "");
    }

    run_result rr, gr;
    memset(&rr, 0, sizeof rr);
    memset(&gr, 0, sizeof gr);
    check_rc(run_pipeline(&ref, M, &rr), "reference micro-batches");
    if (use_schedule) {
        check_rc(run_schedule(&g, M, &gr, finalize_by_hand), "the schedule");
    } else {
        check_rc(run_pipeline(&g, M, &gr), "distributed micro-batches");
        check_rc(finalize_by_hand(&g), "finalize by hand");
    }

    if (mc_gpt_is_post_process(&g, g.n_chunks - 1)) {
        for (int m = 0; m < M; m++)
            MC_CASE_CHECK(fabs(gr.loss[m] - rr.loss[m]) <= 1e-5 * fabs(rr.loss[m]),
                          "micro-batch %d loss %.9g, single rank %.9g", m, gr.loss[m], rr.loss[m]);
        /* logits of the last micro-batch, gathered over TP */
        int nv = 0;
        float *lg = calloc((size_t)g.N * g.vocab_padded, sizeof(float));
        float *lr = calloc((size_t)g.N * g.vocab_padded, sizeof(float));
        check_rc(mc_gpt_logits(&g, M - 1, lg, &nv), "mc_gpt_logits");
        MC_CASE_CHECK(nv == g.vocab_padded, "gathered logits rows of %d, want %d", nv, g.vocab_padded);
        check_rc(mc_gpt_logits(&ref, M - 1, lr, NULL), "mc_gpt_logits (reference)");
        compare_tensor("logits", "last micro-batch", lg, lr, (size_t)g.N * g.vocab_padded, 1e-5);
        free(lg);
        free(lr);
    }
    for (int i = 0; i < g.table.count; i++) {
        const mc_param_info *p = &g.table.info[i];
        reference_slice(&ref, reference_name(&g, p), p, tp_rank, 1, want);
        compare_tensor("grad", p->name, g.grads + p->offset, want, p->numel, 1e-4);
    }
    free(want);
    mc_gpt_destroy(&g);
    mc_gpt_destroy(&ref);
    mc_parallel_destroy(&ps);
    return 0;
}

/* rng: with dropout on, every rank's tracker holds Megatron's seeds for its coordinates
   (default and data-parallel-rng seed + 100 * pp_rank, model-parallel-rng that + 2718 +
   tp_rank), and the masks drawn from them differ across TP ranks (model-parallel) but agree
   across DP replicas; data-parallel masks agree over TP too. A single-rank reference has
   tp_rank = pp_rank = 0 only, so no equivalence test can see a seed bug here. */
typedef struct rng_record {
    int32_t tp, pp, dp;
    uint8_t mp_mask[64], dp_mask[64];
} rng_record;

static void draw_mask(mc_rng_tracker t, const char *stream, uint8_t *mask) {
    mc_rng_tracker_fork(&t, stream);
    mc_rng_dropout_mask(mc_rng_tracker_current(&t), mask, 64, 0.5f);
    mc_rng_tracker_unfork(&t, stream);
}

static int case_rng(const options *o) {
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    mc_parallel_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.world = world;
    pd.grid.tp = o->tp;
    pd.grid.pp = o->pp;
    if (!check_rc(mc_parallel_init(&ps, &pd), "mc_parallel_init")) return 1;
    mc_gpt g;
    mc_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.config = parallel_config(o);
    gd.config.hidden_dropout = 0.1f;
    gd.config.attention_dropout = 0.1f;
    gd.ps = &ps;
    gd.n_slots = 1;
    if (!check_rc(mc_gpt_init(&g, &gd), "mc_gpt_init (dropout 0.1)")) return 1;
    int tp = ps.coords.tp, pp = ps.coords.pp, dp = ps.coords.dp;
    long long seed = 1234 + 100LL * pp;
    mc_rng r;
    MC_CASE_CHECK(mc_rng_tracker_get(&g.rng, MC_RNG_MODEL_PARALLEL, &r) == MC_OK &&
                  r.seed == (uint64_t)(seed + 2718 + tp) && r.offset == 0,
                  "tp %d pp %d: model-parallel-rng seed %llu, want 1234 + 100 * %d + 2718 + %d = "
                  "%lld", tp, pp, (unsigned long long)r.seed, pp, tp, seed + 2718 + tp);
    MC_CASE_CHECK(mc_rng_tracker_get(&g.rng, MC_RNG_DATA_PARALLEL, &r) == MC_OK &&
                  r.seed == (uint64_t)seed, "tp %d pp %d: data-parallel-rng seed %llu, want %lld",
                  tp, pp, (unsigned long long)r.seed, seed);
    MC_CASE_CHECK(mc_rng_tracker_current(&g.rng)->seed == (uint64_t)seed,
                  "pp %d: default generator seed %llu, want %lld", pp,
                  (unsigned long long)mc_rng_tracker_current(&g.rng)->seed, seed);
    rng_record mine, *all = calloc((size_t)world->size, sizeof *all);
    memset(&mine, 0, sizeof mine);
    mine.tp = tp, mine.pp = pp, mine.dp = dp;
    draw_mask(g.rng, MC_RNG_MODEL_PARALLEL, mine.mp_mask);
    draw_mask(g.rng, MC_RNG_DATA_PARALLEL, mine.dp_mask);
    int rc = mc_all_gather(world, &mine, all, sizeof mine, MC_U8);
    if (check_rc(rc, "gathering the masks") && world->rank == 0) {
        int tp_pairs = 0, dp_pairs = 0;
        for (int i = 0; i < world->size; i++)
            for (int j = i + 1; j < world->size; j++) {
                const rng_record *a = &all[i], *b = &all[j];
                int same_mp = !memcmp(a->mp_mask, b->mp_mask, 64);
                int same_dp = !memcmp(a->dp_mask, b->dp_mask, 64);
                if (a->pp != b->pp) continue;
                if (a->tp != b->tp) {
                    tp_pairs++;
                    MC_CASE_CHECK(!same_mp, "ranks %d and %d (tp %d, %d; pp %d) draw the same "
                                  "model-parallel mask", i, j, a->tp, b->tp, a->pp);
                    MC_CASE_CHECK(same_dp, "ranks %d and %d (tp %d, %d) draw different "
                                  "data-parallel masks", i, j, a->tp, b->tp);
                } else if (a->dp != b->dp) {
                    dp_pairs++;
                    MC_CASE_CHECK(same_mp && same_dp, "DP replicas %d and %d (dp %d, %d) draw "
                                  "different masks", i, j, a->dp, b->dp);
                }
            }
        MC_CASE_CHECK(tp_pairs > 0 && (world->size == o->tp * o->pp || dp_pairs > 0),
                      "the layout compared %d TP pairs and %d DP pairs", tp_pairs, dp_pairs);
        printf("rng: %d ranks, %d TP pairs differ, %d DP pairs agree\n", world->size, tp_pairs,
               dp_pairs);
    }
    free(all);
    mc_gpt_free(&g);
    mc_parallel_destroy(&ps);
    return 0;
}

static int case_recompute(const options *o) {
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    mc_parallel_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.world = world;
    pd.grid.tp = o->tp;
    pd.grid.pp = o->pp;
    pd.grid.vpp = o->vpp > 1 ? o->vpp : 0;
    if (!check_rc(mc_parallel_init(&ps, &pd), "mc_parallel_init")) return 1;
    int M = o->microbatches;
    options plain = *o;
    plain.granularity = MC_RECOMPUTE_NONE;
    plain.method = MC_RECOMPUTE_METHOD_NONE;
    mc_gpt a, b;
    mc_gpt_desc da, db;
    memset(&da, 0, sizeof da);
    memset(&db, 0, sizeof db);
    da.config = parallel_config(&plain);
    db.config = parallel_config(o);
    da.config.hidden_dropout = db.config.hidden_dropout = 0.2f;
    da.config.attention_dropout = db.config.attention_dropout = 0.25f;
    da.ps = db.ps = &ps;
    da.n_slots = db.n_slots = M;
    if (!check_rc(mc_gpt_init(&a, &da), "mc_gpt_init (no recompute)")) return 1;
    if (!check_rc(mc_gpt_init(&b, &db), "mc_gpt_init (recompute)")) return 1;
    run_result ra, rb;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    check_rc(run_pipeline(&a, M, &ra), "micro-batches without recompute");
    check_rc(run_pipeline(&b, M, &rb), "micro-batches with recompute");
    for (int m = 0; m < M; m++)
        MC_CASE_CHECK(memcmp(&ra.loss[m], &rb.loss[m], sizeof(double)) == 0,
                      "micro-batch %d loss %.17g with recompute, %.17g without", m, rb.loss[m], ra.loss[m]);
    MC_CASE_CHECK(a.table.total == b.table.total, "layouts differ");
    for (int i = 0; i < a.table.count; i++) {
        const mc_param_info *p = &a.table.info[i];
        size_t bad = 0;
        for (size_t k = 0; k < p->numel; k++)
            bad += memcmp(&a.grads[p->offset + k], &b.grads[p->offset + k], sizeof(float)) != 0;
        MC_CASE_CHECK(bad == 0, "%s: %zu of %zu grad elements differ with recompute", p->name, bad, p->numel);
    }
    mc_gpt_destroy(&a);
    mc_gpt_destroy(&b);
    mc_parallel_destroy(&ps);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.tp = o.pp = 1;
    o.microbatches = 2;
    if (argc < 2) {
        fprintf(stderr, "usage: model_cases equiv|schedule|recompute [--tp T] [--pp P] [--vpp V] [--sp] "
                        "[--untied] [--recompute full-uniform|full-block|selective] [-M n]\n");
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--tp") && i + 1 < argc) o.tp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pp") && i + 1 < argc) o.pp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vpp") && i + 1 < argc) o.vpp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-M") && i + 1 < argc) o.microbatches = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sp")) o.sp = 1;
        else if (!strcmp(argv[i], "--untied")) o.untied = 1;
        else if (!strcmp(argv[i], "--hidden-dropout")) o.hidden_dropout = 1;
        else if (!strcmp(argv[i], "--recompute") && i + 1 < argc) {
            const char *r = argv[++i];
            if (!strcmp(r, "selective")) o.granularity = MC_RECOMPUTE_SELECTIVE;
            else {
                o.granularity = MC_RECOMPUTE_FULL;
                o.method = !strcmp(r, "full-block") ? MC_RECOMPUTE_BLOCK : MC_RECOMPUTE_UNIFORM;
            }
        } else {
            fprintf(stderr, "model_cases: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (o.microbatches < 1 || o.microbatches > 16) o.microbatches = 2;
    mc_comm_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.argc = &argc;
    cd.argv = &argv;
    cd.timeout_s = cd.watchdog_s = mc_case_time_s(10.0);   /* a wrong schedule ends in seconds */
    if (mc_comm_init_world(&world, &cd) != MC_OK) {
        fprintf(stderr, "model_cases: %s\n", mc_last_error());
        return 1;
    }
    mc_case_begin(argv[1], world->rank);
    if (world->size % (o.tp * o.pp) != 0) {
        int rc = mc_case_skip(world, "the world does not divide into TP x PP");
        mc_comm_destroy(world);
        return rc;
    }
    if (!strcmp(argv[1], "equiv")) case_equiv(&o, 0);
    else if (!strcmp(argv[1], "schedule")) case_equiv(&o, 1);
    else if (!strcmp(argv[1], "recompute")) case_recompute(&o);
    else if (!strcmp(argv[1], "rng")) case_rng(&o);
    else MC_CASE_CHECK(0, "unknown case %s", argv[1]);
    int rc = mc_case_finish(world);
    mc_comm_destroy(world);
    return rc;
}
