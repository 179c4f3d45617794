/* ddp_cases - multi-rank checks of the DDP grad buckets, finalize_model_grads and the optimizer
   (megatron_semantics.md §10 - §12).

       mpirun -np N build/tests/ddp_cases <case> [--tp T] [--pp P] [--dist]

   Cases:
     allreduce        every bucket all-reduced: grads = mean over DP (overlap off, blocking)
     reduce_scatter   distributed optimizer: DP rank d holds the mean of shard d of every
                      bucket; the shards tile each bucket
     overlap          async buckets launched from register_grad_ready while later params are
                      still "in backward"; the event log; busy / state errors; finish
     optimizer        the distributed optimizer (reduce-scatter, shard step, all-gather) gives
                      the same params, norms and Adam state as the plain one, step after step
     grad_norm        a TP x PP x DP model whose tensor_model_parallel / shared flags vary: the
                      §12 norm counts each logical param once, with and without the
                      distributed optimizer; clipping brings it to clip_grad. Rank 0 prints
                      "grad_norm <value>" so the suite can compare layouts.
     finalize         finalize_model_grads: DP mean, sequence-parallel grads summed over TP,
                      tied embedding grads summed over the embedding group, per-token scaling
                      (with --dist: checked on each rank's shards)
   --tp/--pp pick the parallel layout of grad_norm and finalize (DP = N / (T * P)).
   Every expected value is a closed form of the rank-dependent inputs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define TIMEOUT_S mc_case_time_s(10.0)   /* also the watchdog */

static mc_comm *world;
static int me, np;
static int opt_tp = 1, opt_pp = 1, opt_dist = 0;

/* ---------------------------------------------------------------------------------------------
   a synthetic table of six 1-D params: small buckets, odd sizes */

static const int demo_sizes[] = {37, 128, 5, 300, 64, 17};
enum { N_DEMO = sizeof demo_sizes / sizeof demo_sizes[0] };

static mc_param_info vec(int n) {
    mc_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = 1;
    p.global_shape[0] = p.local_shape[0] = n;
    p.partition_dim = -1;
    p.layer = -1;
    return p;
}

static int demo_table(mc_param_table *t, int dist, int dp, size_t bucket_size) {
    char name[16];
    memset(t, 0, sizeof *t);
    for (int i = 0; i < N_DEMO; i++) {
        mc_param_info p = vec(demo_sizes[i]);
        snprintf(name, sizeof name, "p%d", i);
        if (mc_param_table_add(t, name, &p) < 0) return -1;
    }
    return mc_param_table_layout(t, &(mc_param_layout_desc){.dp_size = dp,
                                                             .distributed_optimizer = dist,
                                                             .bucket_size = bucket_size});
}

/* Rank r's grad at flat element i of a param (padding stays 0): (r + 1) * c(i). */
static float demo_coeff(size_t i) { return 0.125f * (float)(1 + (int)(i % 13)); }

static void demo_fill(const mc_param_table *t, float *grads, int rank) {
    for (int k = 0; k < t->count; k++)
        for (size_t e = 0; e < t->info[k].numel; e++) {
            size_t i = t->info[k].offset + e;
            grads[i] = (float)(rank + 1) * demo_coeff(i);
        }
}

/* mean over r of (r + 1) c(i) = c(i) (np + 1) / 2 */
static float demo_mean(size_t i) { return demo_coeff(i) * (float)(np + 1) * 0.5f; }

static int close_to(double got, double want, double rtol) {
    return fabs(got - want) <= rtol * (fabs(want) + 1e-6);
}

/* Checks the reduced grads of [lo, hi); returns the number of mismatches (first one printed). */
static int check_demo_range(const char *label, const mc_param_table *t, const float *grads,
                            size_t lo, size_t hi) {
    int bad = 0;
    for (int k = 0; k < t->count; k++) {
        const mc_param_info *p = &t->info[k];
        for (size_t e = 0; e < p->numel; e++) {
            size_t i = p->offset + e;
            if (i < lo || i >= hi) continue;
            if (!close_to(grads[i], demo_mean(i), 1e-6) && bad++ == 0)
                MC_CASE_CHECK(0, "%s: grad[%zu] (%s[%zu]) = %.9g, want the mean %.9g", label, i,
                              p->name, e, (double)grads[i], (double)demo_mean(i));
        }
    }
    return bad;
}

static int ddp_start(mc_ddp *ddp, mc_param_table *t, float *grads, int dist, int overlap) {
    int rc = mc_ddp_init(ddp, &(mc_ddp_desc){.table = t, .grads = grads, .dp = world,
                                             .distributed_optimizer = dist,
                                             .overlap_grad_reduce = overlap});
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_ddp_init");
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   allreduce */

static void case_allreduce(void) {
    for (int overlap = 0; overlap <= 1; overlap++) {
        mc_param_table t;
        mc_ddp ddp;
        if (!MC_CASE_CHECK_STATUS(demo_table(&t, 0, np, 100), MC_OK, "demo layout")) return;
        float *grads = calloc(t.total, sizeof *grads);
        if (ddp_start(&ddp, &t, grads, 0, overlap) != MC_OK) return;
        MC_CASE_CHECK(t.n_buckets >= 3, "want several buckets, got %d", t.n_buckets);
        for (int iter = 0; iter < 2; iter++) {   /* zero_grad makes the second one work */
            MC_CASE_CHECK_STATUS(mc_ddp_zero_grad(&ddp), MC_OK, "mc_ddp_zero_grad");
            demo_fill(&t, grads, me);
            MC_CASE_CHECK_STATUS(mc_ddp_finish_grad_sync(&ddp), MC_OK, "finish_grad_sync");
            char label[64];
            snprintf(label, sizeof label, "allreduce overlap=%d iter %d", overlap, iter);
            MC_CASE_CHECK(check_demo_range(label, &t, grads, 0, t.total) == 0,
                          "%s: grads are not the DP mean", label);
            /* overlap off: one blocking run per bucket; on but nothing registered: finish
               launches every bucket and waits for each */
            MC_CASE_CHECK(ddp.n_events == (overlap ? 2 : 1) * t.n_buckets,
                          "%s: %d events for %d buckets", label, ddp.n_events, t.n_buckets);
            for (int e = 0; e < ddp.n_events; e++)
                MC_CASE_CHECK(overlap || ddp.events[e].kind == MC_DDP_SYNC,
                              "%s: event %d kind %d, want SYNC", label, e, ddp.events[e].kind);
        }
        int rc = mc_ddp_finish_grad_sync(&ddp);
        MC_CASE_CHECK_STATUS(rc, MC_ERR_STATE, "a second finish_grad_sync");
        MC_CASE_CHECK(mc_test_contains(mc_last_error(), "mc_ddp_zero_grad"),
                      "the message should say to zero the grads: %s", mc_last_error());
        MC_CASE_CHECK_STATUS(mc_ddp_destroy(&ddp), MC_OK, "mc_ddp_destroy");
        free(grads);
        mc_param_table_destroy(&t);
    }
}

/* ---------------------------------------------------------------------------------------------
   reduce_scatter */

static void case_reduce_scatter(void) {
    mc_param_table t;
    mc_ddp ddp;
    if (!MC_CASE_CHECK_STATUS(demo_table(&t, 1, np, 100), MC_OK, "demo layout")) return;
    float *grads = calloc(t.total, sizeof *grads);
    if (ddp_start(&ddp, &t, grads, 1, 0) != MC_OK) return;
    demo_fill(&t, grads, me);
    MC_CASE_CHECK_STATUS(mc_ddp_finish_grad_sync(&ddp), MC_OK, "finish_grad_sync");
    for (int b = 0; b < t.n_buckets; b++) {
        size_t s0 = 0, s1 = 0, size = (t.buckets[b].end - t.buckets[b].start) / (size_t)np;
        MC_CASE_CHECK_STATUS(mc_ddp_shard(&ddp, b, &s0, &s1), MC_OK, "mc_ddp_shard");
        MC_CASE_CHECK((t.buckets[b].end - t.buckets[b].start) % (size_t)np == 0,
                      "bucket %d size %zu not divisible by DP %d", b,
                      t.buckets[b].end - t.buckets[b].start, np);
        MC_CASE_CHECK(s0 == t.buckets[b].start + (size_t)me * size && s1 == s0 + size,
                      "bucket %d shard [%zu, %zu), want [%zu, %zu)", b, s0, s1,
                      t.buckets[b].start + (size_t)me * size,
                      t.buckets[b].start + (size_t)(me + 1) * size);
        /* The shards tile the bucket across ranks: gather every rank's start. */
        int64_t mine = (int64_t)s0, *all = calloc((size_t)np, sizeof *all);
        mc_all_gather(world, &mine, all, 1, MC_I64);
        for (int r = 0; r < np; r++)
            MC_CASE_CHECK(all[r] == (int64_t)(t.buckets[b].start + (size_t)r * size),
                          "bucket %d: rank %d's shard starts at %lld", b, r, (long long)all[r]);
        free(all);
        char label[48];
        snprintf(label, sizeof label, "reduce_scatter bucket %d", b);
        MC_CASE_CHECK(check_demo_range(label, &t, grads, s0, s1) == 0,
                      "%s: shard is not the DP mean", label);
        for (size_t i = s0; i < s1; i++) {   /* padding inside the shard stays 0 */
            int in_param = 0;
            for (int k = 0; k < t.count; k++)
                in_param |= i >= t.info[k].offset && i < t.info[k].offset + t.info[k].numel;
            if (!in_param && grads[i] != 0.0f) {
                MC_CASE_CHECK(0, "padding element %zu is %g, want 0", i, (double)grads[i]);
                break;
            }
        }
    }
    mc_ddp_destroy(&ddp);
    free(grads);
    mc_param_table_destroy(&t);
}

/* ---------------------------------------------------------------------------------------------
   overlap */

static int count_events(const mc_ddp *ddp, mc_ddp_event_kind kind, int bucket) {
    int n = 0;
    for (int e = 0; e < ddp->n_events; e++)
        n += ddp->events[e].kind == kind && ddp->events[e].bucket == bucket;
    return n;
}

static void overlap_run(int dist) {
    mc_param_table t;
    mc_ddp ddp;
    if (!MC_CASE_CHECK_STATUS(demo_table(&t, dist, np, 100), MC_OK, "demo layout")) return;
    float *grads = calloc(t.total, sizeof *grads);
    if (ddp_start(&ddp, &t, grads, dist, 1) != MC_OK) return;

    /* Grad sync disabled (not the last micro-batch): registrations are ignored. */
    MC_CASE_CHECK_STATUS(mc_ddp_zero_grad(&ddp), MC_OK, "zero_grad");
    for (int k = 0; k < t.count; k++)
        MC_CASE_CHECK_STATUS(mc_ddp_register_grad_ready(&ddp, t.order[k]), MC_OK,
                             "register with grad sync off");
    MC_CASE_CHECK(ddp.n_events == 0 && ddp.params_ready == 0,
                  "grad sync off: %d events, %d ready", ddp.n_events, ddp.params_ready);

    /* Last micro-batch: backward produces grads in layout order; each bucket goes out as soon
       as its last param is ready. */
    demo_fill(&t, grads, me);
    MC_CASE_CHECK_STATUS(mc_ddp_set_grad_sync(&ddp, -1, 1), MC_OK, "set_grad_sync");
    int first_launch_at = -1;
    for (int k = 0; k < t.count; k++) {
        int p = t.order[k];
        MC_CASE_CHECK_STATUS(mc_ddp_register_grad_ready(&ddp, p), MC_OK, "register_grad_ready");
        for (int b = 0; b < t.n_buckets; b++) {
            int last = t.buckets[b].first_param + t.buckets[b].n_params - 1;
            int launched = count_events(&ddp, MC_DDP_LAUNCH, b);
            MC_CASE_CHECK(launched == (k >= last),
                          "after %d of %d params: bucket %d (last param at %d) launched %d "
                          "times", k + 1, t.count, b, last, launched);
        }
        if (first_launch_at < 0 && ddp.n_events > 0) first_launch_at = ddp.events[0].params_ready;
        if (k == 0) {
            int rc = mc_ddp_register_grad_ready(&ddp, p);
            MC_CASE_CHECK_STATUS(rc, MC_ERR_STATE, "registering a param twice");
        }
    }
    MC_CASE_CHECK(first_launch_at > 0 && first_launch_at < t.count,
                  "bucket 0 should launch before the last param is ready (at %d of %d)",
                  first_launch_at, t.count);
    /* While collectives are in flight the grads may not be touched. */
    int in_flight = 0;
    for (int b = 0; b < t.n_buckets; b++) in_flight |= ddp.requests[b] != NULL;
    if (in_flight) {
        MC_CASE_CHECK_STATUS(mc_ddp_zero_grad(&ddp), MC_ERR_BUSY, "zero_grad while in flight");
        MC_CASE_CHECK_STATUS(mc_ddp_destroy(&ddp), MC_ERR_BUSY, "destroy while in flight");
    }
    MC_CASE_CHECK_STATUS(mc_ddp_finish_grad_sync(&ddp), MC_OK, "finish_grad_sync");
    for (int b = 0; b < t.n_buckets; b++)
        MC_CASE_CHECK(count_events(&ddp, MC_DDP_WAIT, b) == 1, "bucket %d waited %d times", b,
                      count_events(&ddp, MC_DDP_WAIT, b));
    for (int b = 0; b < t.n_buckets; b++) {
        size_t s0, s1;
        mc_ddp_shard(&ddp, b, &s0, &s1);
        MC_CASE_CHECK(check_demo_range("overlap", &t, grads, s0, s1) == 0,
                      "dist=%d bucket %d: not the DP mean after the overlapped reduction", dist,
                      b);
    }

    /* Only bucket 0's params ready: finish launches the rest itself. */
    MC_CASE_CHECK_STATUS(mc_ddp_zero_grad(&ddp), MC_OK, "zero_grad");
    demo_fill(&t, grads, me);
    mc_ddp_set_grad_sync(&ddp, -1, 1);
    for (int k = 0; k < t.buckets[0].n_params; k++)
        mc_ddp_register_grad_ready(&ddp, t.order[k]);
    MC_CASE_CHECK(ddp.n_events == 1, "one bucket launched, %d events", ddp.n_events);
    MC_CASE_CHECK_STATUS(mc_ddp_finish_grad_sync(&ddp), MC_OK, "finish after a partial backward");
    MC_CASE_CHECK(ddp.n_events == 2 * t.n_buckets, "%d events, want launch + wait per bucket",
                  ddp.n_events);
    for (int b = 0; b < t.n_buckets; b++) {
        size_t s0, s1;
        mc_ddp_shard(&ddp, b, &s0, &s1);
        MC_CASE_CHECK(check_demo_range("partial", &t, grads, s0, s1) == 0,
                      "dist=%d bucket %d after a partial backward", dist, b);
    }
    MC_CASE_CHECK_STATUS(mc_ddp_destroy(&ddp), MC_OK, "mc_ddp_destroy");
    free(grads);
    mc_param_table_destroy(&t);
}

/* A param of chunk 1 is ignored while only chunk 0 syncs. */
static void overlap_chunks(void) {
    mc_param_table t = {0};
    mc_ddp ddp;
    mc_param_info a = vec(10), b = vec(10);
    b.chunk = 1;
    mc_param_table_add(&t, "c0", &a);
    mc_param_table_add(&t, "c1", &b);
    mc_param_table_layout(&t, &(mc_param_layout_desc){.dp_size = np});
    float *grads = calloc(t.total, sizeof *grads);
    if (ddp_start(&ddp, &t, grads, 0, 1) != MC_OK) return;
    mc_ddp_zero_grad(&ddp);
    mc_ddp_set_grad_sync(&ddp, 0, 1);
    mc_ddp_register_grad_ready(&ddp, 1);
    MC_CASE_CHECK(ddp.n_events == 0, "chunk 1 registered while only chunk 0 syncs");
    mc_ddp_register_grad_ready(&ddp, 0);
    MC_CASE_CHECK(ddp.n_events == 1 && ddp.events[0].bucket == 0,
                  "chunk 0's bucket should launch (%d events)", ddp.n_events);
    mc_ddp_finish_grad_sync(&ddp);
    mc_ddp_destroy(&ddp);
    free(grads);
    mc_param_table_destroy(&t);
}

static void case_overlap(void) {
    overlap_run(0);
    overlap_run(1);
    overlap_chunks();
}

/* ---------------------------------------------------------------------------------------------
   optimizer: distributed == plain */

typedef struct opt_rig {
    mc_param_table t;
    mc_ddp ddp;
    mc_optimizer opt;
    float *params, *grads;
} opt_rig;

static int opt_rig_build(opt_rig *r, int dist, mc_optimizer_desc od) {
    memset(r, 0, sizeof *r);
    char name[16];
    for (int k = 0; k < N_DEMO; k++) {
        mc_param_info p = vec(demo_sizes[k]);
        p.no_weight_decay = (k == 2 || k == 5);
        snprintf(name, sizeof name, "p%d", k);
        mc_param_table_add(&r->t, name, &p);
    }
    int rc = mc_param_table_layout(&r->t, &(mc_param_layout_desc){.dp_size = np,
                                                                   .distributed_optimizer = dist,
                                                                   .bucket_size = 100});
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "layout")) return rc;
    r->params = calloc(r->t.total, sizeof(float));
    r->grads = calloc(r->t.total, sizeof(float));
    for (int k = 0; k < r->t.count; k++)
        for (size_t e = 0; e < r->t.info[k].numel; e++)
            r->params[r->t.info[k].offset + e] = 0.1f * (float)sin(1.3 * k + 0.7 * (double)e);
    if ((rc = ddp_start(&r->ddp, &r->t, r->grads, dist, 0)) != MC_OK) return rc;
    od.ddp = &r->ddp;
    od.params = r->params;
    rc = mc_optimizer_init(&r->opt, &od);
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_optimizer_init");
    return rc;
}

static void opt_rig_free(opt_rig *r) {
    mc_optimizer_destroy(&r->opt);
    mc_ddp_destroy(&r->ddp);
    mc_param_table_destroy(&r->t);
    free(r->params);
    free(r->grads);
}

static void opt_rig_fill(opt_rig *r, int iter) {
    for (int k = 0; k < r->t.count; k++)
        for (size_t e = 0; e < r->t.info[k].numel; e++)
            r->grads[r->t.info[k].offset + e] =
                0.01f * (float)(me + 1) * (float)cos(k + 0.3 * (double)e + iter);
}

/* Compares every param of b with a's (by name); returns the mismatch count. */
static int compare_params(const char *label, const opt_rig *a, const opt_rig *b) {
    int bad = 0;
    for (int k = 0; k < a->t.count; k++) {
        const mc_param_info *pa = &a->t.info[k], *pb = &b->t.info[k];
        for (size_t e = 0; e < pa->numel; e++) {
            double x = a->params[pa->offset + e], y = b->params[pb->offset + e];
            if (fabs(x - y) > 1e-6 + 1e-5 * fabs(x) && bad++ == 0)
                MC_CASE_CHECK(0, "%s: %s[%zu] = %.9g distributed, %.9g plain", label, pa->name,
                              e, y, x);
        }
    }
    return bad;
}

static void case_optimizer(void) {
    mc_optimizer_desc od = {.lr = 0.01f, .weight_decay = 0.05f, .clip_grad = 0.05f,
                            .lr_warmup_iters = 1, .train_iters = 5};
    opt_rig plain, dist;
    if (opt_rig_build(&plain, 0, od) != MC_OK || opt_rig_build(&dist, 1, od) != MC_OK) return;
    MC_CASE_CHECK(dist.opt.state_numel * (size_t)np == dist.t.total,
                  "distributed state %zu x DP %d != %zu", dist.opt.state_numel, np, dist.t.total);
    int clipped = 0;
    for (int iter = 0; iter < 4; iter++) {
        opt_rig *rigs[2] = {&plain, &dist};
        for (int j = 0; j < 2; j++) {
            MC_CASE_CHECK_STATUS(mc_ddp_zero_grad(&rigs[j]->ddp), MC_OK, "zero_grad");
            opt_rig_fill(rigs[j], iter);
            MC_CASE_CHECK_STATUS(mc_finalize_model_grads(NULL, &rigs[j]->ddp, NULL, NULL, 0, NULL),
                                 MC_OK, "finalize");
            MC_CASE_CHECK_STATUS(mc_optimizer_step(&rigs[j]->opt), MC_OK, "step");
        }
        char label[32];
        snprintf(label, sizeof label, "iteration %d", iter + 1);
        MC_CASE_CHECK(compare_params(label, &plain, &dist) == 0, "%s: params differ", label);
        MC_CASE_CHECK(close_to(dist.opt.last_grad_norm, plain.opt.last_grad_norm, 1e-6),
                      "%s: grad norm %.12g distributed, %.12g plain", label,
                      dist.opt.last_grad_norm, plain.opt.last_grad_norm);
        MC_CASE_CHECK(dist.opt.last_lr == plain.opt.last_lr, "%s: lr %g vs %g", label,
                      (double)dist.opt.last_lr, (double)plain.opt.last_lr);
        clipped |= plain.opt.last_clip_coeff < 1.0f;
    }
    MC_CASE_CHECK(clipped, "clip_grad 0.05 should have clipped at least once");

    /* Every DP rank holds the same full params after the all-gather. */
    float *root = malloc(dist.t.total * sizeof *root);
    memcpy(root, dist.params, dist.t.total * sizeof *root);
    mc_broadcast(world, root, dist.t.total, MC_F32, 0);
    MC_CASE_CHECK(memcmp(root, dist.params, dist.t.total * sizeof *root) == 0,
                  "rank %d's params differ from rank 0's after the all-gather", me);
    free(root);

    /* Adam state, per param: assembled from the owners it equals the plain optimizer's. */
    for (int k = 0; k < dist.t.count; k++) {
        size_t n = dist.t.info[k].numel, lo, hi;
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (int which = 0; which < 2; which++) {
            mc_optimizer_get_state(&plain.opt, k, (mc_optimizer_state_kind)which, a);
            int rc = mc_optimizer_get_state(&dist.opt, k, (mc_optimizer_state_kind)which, b);
            MC_CASE_CHECK_STATUS(rc, MC_OK, "get_state (distributed)");
            int bad = 0;
            for (size_t e = 0; e < n; e++) bad += !(fabs(a[e] - b[e]) <= 1e-9 + 1e-4 * fabs(a[e]));
            MC_CASE_CHECK(bad == 0, "%s state %d: %d elements differ", dist.t.info[k].name,
                          which, bad);
        }
        /* set_state stores only the owned piece; get_state assembles the whole again. */
        for (size_t e = 0; e < n; e++) a[e] = (float)(k * 1000 + (int)e);
        mc_optimizer_set_state(&dist.opt, k, MC_OPTIM_EXP_AVG, a);
        mc_optimizer_get_state(&dist.opt, k, MC_OPTIM_EXP_AVG, b);
        MC_CASE_CHECK(memcmp(a, b, n * sizeof *a) == 0, "%s: set/get state roundtrip",
                      dist.t.info[k].name);
        mc_optimizer_owned_range(&dist.opt, k, &lo, &hi);
        int64_t owned = (int64_t)(hi - lo), total = 0;
        mc_all_reduce(world, &owned, &total, 1, MC_I64, MC_SUM);
        MC_CASE_CHECK(total == (int64_t)n, "%s: owned ranges add up to %lld of %zu",
                      dist.t.info[k].name, (long long)total, n);
        free(a);
        free(b);
    }
    opt_rig_free(&plain);
    opt_rig_free(&dist);
}

/* ---------------------------------------------------------------------------------------------
   a small GPT-like model over TP x PP (grad_norm, finalize)

   L = 4 layers, stage s holding layers [s L/P, (s+1) L/P). Per layer l:
     decoder.layers.l.mlp.linear_fc1.weight  [8, 6]  column-parallel (split dim 0)
     decoder.layers.l.mlp.linear_fc1.bias    [8]     column-parallel
     decoder.layers.l.mlp.linear_fc2.weight  [6, 8]  row-parallel (split dim 1)
     decoder.layers.l.mlp.linear_fc2.bias    [6]     replicated, sequence_parallel
     decoder.layers.l.input_layernorm.weight [6]     replicated, sequence_parallel
   first stage: embedding.word_embeddings.weight [16, 6] vocab-parallel (shared_embedding
   when P > 1); last stage, P > 1: output_layer.weight, the tied copy (shared). */

#define N_LAYERS 4

static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    while (*s) h = (h ^ (uint8_t)*s++) * 16777619u;
    return h;
}

/* The grad of global element gi of logical param `name` (the tied copy shares the
   embedding's name so the two stages hold the same logical values). */
static float global_grad(const char *name, size_t gi) {
    return (float)sin((double)(name_hash(name) % 1000) * 0.01 + 0.37 * (double)gi) * 0.5f;
}

static mc_param_info shard_of(int rows, int cols, int split_dim, int tp) {
    mc_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = cols > 0 ? 2 : 1;
    p.global_shape[0] = p.local_shape[0] = rows;
    p.global_shape[1] = p.local_shape[1] = cols > 0 ? cols : 1;
    p.partition_dim = split_dim;
    p.tensor_model_parallel = split_dim >= 0;
    if (split_dim >= 0) p.local_shape[split_dim] /= tp;
    p.layer = -1;
    return p;
}

static int model_table(mc_param_table *t, int tp, int pp, int pp_rank, int dist, int dp) {
    char name[MC_PARAM_NAME_MAX];
    memset(t, 0, sizeof *t);
    if (pp_rank == 0) {
        mc_param_info emb = shard_of(16, 6, 0, tp);
        emb.shared_embedding = pp > 1;
        mc_param_table_add(t, "embedding.word_embeddings.weight", &emb);
    }
    int per = N_LAYERS / pp;
    for (int l = pp_rank * per; l < (pp_rank + 1) * per; l++) {
        mc_param_info fc1w = shard_of(8, 6, 0, tp), fc1b = shard_of(8, 0, 0, tp);
        mc_param_info fc2w = shard_of(6, 8, 1, tp), fc2b = shard_of(6, 0, -1, tp);
        mc_param_info ln = shard_of(6, 0, -1, tp);
        fc1b.no_weight_decay = fc2b.no_weight_decay = ln.no_weight_decay = 1;
        fc2b.sequence_parallel = ln.sequence_parallel = 1;
        fc1w.layer = fc1b.layer = fc2w.layer = fc2b.layer = ln.layer = l;
        snprintf(name, sizeof name, "decoder.layers.%d.input_layernorm.weight", l);
        mc_param_table_add(t, name, &ln);
        snprintf(name, sizeof name, "decoder.layers.%d.mlp.linear_fc1.weight", l);
        mc_param_table_add(t, name, &fc1w);
        snprintf(name, sizeof name, "decoder.layers.%d.mlp.linear_fc1.bias", l);
        mc_param_table_add(t, name, &fc1b);
        snprintf(name, sizeof name, "decoder.layers.%d.mlp.linear_fc2.weight", l);
        mc_param_table_add(t, name, &fc2w);
        snprintf(name, sizeof name, "decoder.layers.%d.mlp.linear_fc2.bias", l);
        mc_param_table_add(t, name, &fc2b);
    }
    if (pp_rank == pp - 1 && pp > 1) {
        mc_param_info out = shard_of(16, 6, 0, tp);
        out.shared = out.shared_embedding = 1;
        mc_param_table_add(t, "output_layer.weight", &out);
    }
    /* Small buckets on the first stage so that the embedding's own bucket matters. */
    return mc_param_table_layout(t, &(mc_param_layout_desc){.dp_size = dp,
                                                             .distributed_optimizer = dist,
                                                             .bucket_size = 100,
                                                             .pp_rank = pp_rank});
}

/* The logical name and global element of local element e of param p on tp_rank. */
static const char *logical_name(const mc_param_info *p) {
    return strcmp(p->name, "output_layer.weight") == 0 ? "embedding.word_embeddings.weight"
                                                       : p->name;
}

static size_t global_index(const mc_param_info *p, size_t e, int tp_rank) {
    size_t lc = (size_t)p->local_shape[1], row = e / lc, c = e % lc;
    if (p->partition_dim == 0) row += (size_t)tp_rank * (size_t)p->local_shape[0];
    if (p->partition_dim == 1) c += (size_t)tp_rank * lc;
    return row * (size_t)p->global_shape[1] + c;
}

static int setup_ps(mc_parallel_state *ps) {
    memset(ps, 0, sizeof *ps);
    int rc = mc_parallel_init(ps, &(mc_parallel_desc){.world = world,
                                                      .grid = {.tp = opt_tp, .pp = opt_pp}});
    MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_init");
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   grad_norm */

/* sum over every logical param of its global grads squared, each counted once */
static double expected_norm(void) {
    mc_param_table t;
    double sum = 0.0;
    model_table(&t, 1, 1, 0, 0, 1);   /* the TP=PP=1 model lists every logical param once */
    for (int k = 0; k < t.count; k++)
        for (size_t e = 0; e < t.info[k].numel; e++) {
            double g = global_grad(t.info[k].name, e);
            sum += g * g;
        }
    mc_param_table_destroy(&t);
    return sqrt(sum);
}

static void case_grad_norm(void) {
    mc_parallel_state ps;
    if (setup_ps(&ps) != MC_OK) return;
    int tp_rank = ps.coords.tp, pp_rank = ps.coords.pp, dp = ps.grid.dp;
    double want = expected_norm();
    for (int dist = 0; dist <= 1; dist++) {
        mc_param_table t;
        mc_ddp ddp;
        mc_optimizer opt;
        if (!MC_CASE_CHECK_STATUS(model_table(&t, opt_tp, opt_pp, pp_rank, dist, dp), MC_OK,
                                  "model layout"))
            return;
        float *grads = calloc(t.total, sizeof *grads), *params = calloc(t.total, sizeof *params);
        int rc = mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads,
                                                  .dp = mc_parallel_group(&ps, MC_GROUP_DP_CP),
                                                  .distributed_optimizer = dist});
        MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_ddp_init");
        rc = mc_optimizer_init(&opt, &(mc_optimizer_desc){.ddp = &ddp, .params = params,
                                                          .ps = &ps, .lr = 1e-3f,
                                                          .clip_grad = (float)(want / 4)});
        MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_optimizer_init");
        /* The grads as finalize leaves them: every DP rank equal, TP shards of one global
           tensor, replicas equal on every TP rank, the tied copy equal to the embedding. */
        for (int k = 0; k < t.count; k++)
            for (size_t e = 0; e < t.info[k].numel; e++)
                grads[t.info[k].offset + e] =
                    global_grad(logical_name(&t.info[k]), global_index(&t.info[k], e, tp_rank));
        double norm = -1.0;
        MC_CASE_CHECK_STATUS(mc_optimizer_grad_norm(&opt, &norm), MC_OK, "grad_norm");
        MC_CASE_CHECK(close_to(norm, want, 1e-6),
                      "dist=%d tp %d pp %d dp %d: grad norm %.12g, want %.12g (each logical "
                      "param once)", dist, opt_tp, opt_pp, dp, norm, want);
        if (me == 0 && dist == 0) printf("grad_norm %.9f\n", norm);
        /* Clipping to a quarter of the norm. */
        MC_CASE_CHECK_STATUS(mc_optimizer_step(&opt), MC_OK, "step");
        MC_CASE_CHECK(close_to(opt.last_grad_norm, want, 1e-6), "step's norm %.12g",
                      opt.last_grad_norm);
        MC_CASE_CHECK(close_to(opt.last_clip_coeff, (want / 4) / (want + 1e-6), 1e-6),
                      "clip coefficient %.9g", (double)opt.last_clip_coeff);
        MC_CASE_CHECK_STATUS(mc_optimizer_grad_norm(&opt, &norm), MC_OK, "grad_norm");
        MC_CASE_CHECK(close_to(norm, want / 4, 1e-5), "dist=%d: norm after clipping %.9g, "
                      "want clip_grad %.9g", dist, norm, want / 4);
        mc_optimizer_destroy(&opt);
        mc_ddp_destroy(&ddp);
        mc_param_table_destroy(&t);
        free(grads);
        free(params);
    }
    mc_parallel_destroy(&ps);
}

/* ---------------------------------------------------------------------------------------------
   finalize */

static void case_finalize(void) {
    mc_parallel_state ps;
    if (setup_ps(&ps) != MC_OK) return;
    int tp = opt_tp, pp = opt_pp, tp_rank = ps.coords.tp, pp_rank = ps.coords.pp;
    int dp = ps.grid.dp, dp_rank = ps.coords.dp;
    mc_param_table t;
    mc_ddp ddp;
    if (!MC_CASE_CHECK_STATUS(model_table(&t, tp, pp, pp_rank, opt_dist, dp), MC_OK, "layout"))
        return;
    float *grads = calloc(t.total, sizeof *grads);
    int rc = mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads,
                                              .dp = mc_parallel_group(&ps, MC_GROUP_DP_CP),
                                              .distributed_optimizer = opt_dist,
                                              .overlap_grad_reduce = 1});
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_ddp_init")) return;
    mc_ddp_zero_grad(&ddp);
    /* Rank inputs: G(name, gi) x (dp_rank + 1), x (tp_rank + 1) for sequence-parallel params
       (partial sums under SP); the last stage's tied copy uses its own values G("output"). */
    for (int k = 0; k < t.count; k++) {
        const mc_param_info *p = &t.info[k];
        for (size_t e = 0; e < p->numel; e++) {
            float g = global_grad(p->name, global_index(p, e, tp_rank)) * (float)(dp_rank + 1);
            if (p->sequence_parallel) g *= (float)(tp_rank + 1);
            grads[p->offset + e] = g;
        }
    }
    /* Per-token loss: only the last stage knows the token count (10 per DP rank and rank
       index); the others pass garbage that the broadcast must replace. */
    double tokens = mc_parallel_is_last_stage(&ps, 1) ? 10.0 * (dp_rank + 1) : -5.0;
    rc = mc_finalize_model_grads(&ps, &ddp, NULL, NULL, 1, &tokens);
    if (!MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_finalize_model_grads")) return;
    double want_tokens = 10.0 * dp * (dp + 1) / 2.0;
    MC_CASE_CHECK(tokens == want_tokens, "global tokens %g, want %g", tokens, want_tokens);

    double dp_mean = (dp + 1) / 2.0, tp_sum = tp > 1 ? tp * (tp + 1) / 2.0 : 1.0;
    int bad = 0;
    for (int k = 0; k < t.count; k++) {
        const mc_param_info *p = &t.info[k];
        size_t lo = 0, hi = p->numel;
        if (opt_dist) {   /* only this rank's shard of the bucket is reduced */
            size_t s0, s1;
            mc_ddp_shard(&ddp, ddp.bucket_of[k], &s0, &s1);
            lo = s0 > p->offset ? s0 - p->offset : 0;
            hi = s1 < p->offset + p->numel ? (s1 > p->offset ? s1 - p->offset : 0) : p->numel;
        }
        for (size_t e = lo; e < hi; e++) {
            size_t gi = global_index(p, e, tp_rank);
            double want = global_grad(p->name, gi) * dp_mean;
            if (p->sequence_parallel) want *= tp_sum;
            if (p->shared_embedding)   /* word embedding + output copy */
                want = (global_grad("embedding.word_embeddings.weight", gi) +
                        global_grad("output_layer.weight", gi)) * dp_mean;
            want /= want_tokens;
            if (!close_to(grads[p->offset + e], want, 1e-5) && bad++ == 0)
                MC_CASE_CHECK(0, "tp %d pp %d dp %d dist %d: %s[%zu] = %.9g, want %.9g", tp, pp,
                              dp, opt_dist, p->name, e, (double)grads[p->offset + e], want);
        }
    }
    MC_CASE_CHECK(bad == 0, "%d finalized grads are wrong", bad);
    mc_ddp_destroy(&ddp);
    mc_param_table_destroy(&t);
    free(grads);
    mc_parallel_destroy(&ps);
}

/* ---------------------------------------------------------------------------------------------
   main */

typedef struct ddp_case {
    const char *name;
    void (*run)(void);
} ddp_case;

static const ddp_case cases[] = {
    {"allreduce", case_allreduce}, {"reduce_scatter", case_reduce_scatter},
    {"overlap", case_overlap},     {"optimizer", case_optimizer},
    {"grad_norm", case_grad_norm}, {"finalize", case_finalize},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

static void usage(const char *prog) {
    fprintf(stderr, "usage: %s <case> [--tp T] [--pp P] [--dist]\ncases:", prog);
    for (int i = 0; i < N_CASES; i++) fprintf(stderr, " %s", cases[i].name);
    fprintf(stderr, "\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(argv[0]);
        return 2;
    }
    const ddp_case *chosen = NULL;
    for (int i = 0; i < N_CASES; i++)
        if (strcmp(argv[1], cases[i].name) == 0) chosen = &cases[i];
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--tp") == 0 && i + 1 < argc) opt_tp = atoi(argv[++i]);
        else if (strcmp(argv[i], "--pp") == 0 && i + 1 < argc) opt_pp = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dist") == 0) opt_dist = 1;
        else chosen = NULL;
    }
    if (chosen == NULL) {
        usage(argv[0]);
        return 2;
    }
    int rc = mc_case_init_world(&world, &(mc_comm_desc){.timeout_s = TIMEOUT_S, .watchdog_s = TIMEOUT_S, .argc = &argc,
                                                         .argv = &argv});
    if (rc != MC_OK) return 1;
    me = world->rank;
    np = world->size;
    int fits = np % (opt_tp * opt_pp) == 0 && N_LAYERS % opt_pp == 0;
    return mc_case_run(world, chosen->name, chosen->run,
                       fits ? NULL : "the layout does not fit this many ranks");
}
