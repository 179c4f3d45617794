/* memory_cases - what a training run allocates, measured on every rank, against the
   implementation model of mc_memory_estimate.

       mpirun -np N build/tests/memory_cases measure [pretrain_gpt's flags]

   The program builds what pretrain_gpt builds (the GPT, DDP over it, the optimizer) from
   pretrain_gpt's own flags and defaults (examples/pretrain_gpt_args.h), and trains two
   iterations on synthetic tokens through mc_get_forward_backward_func. Its op table is the CPU
   table with a counting allocator, and the pp communicator's allocator is counted too, so every
   byte the run takes through them is attributed to a category:
     parameters, gradients   gpt.params and gpt.grads (allocated by mc_gpt_init)
     activations             every other allocation of mc_gpt_init
     optimizer               what mc_optimizer_init allocates (Adam m and v)
     communication           what an iteration allocates: the schedule's P2P receive buffers
                             (pp communicator) and finalize's packed sequence-parallel grads
   Each category's peak must equal the estimate of this rank's stage to the byte (tolerance 0:
   the model replays the allocation code). Rank 0 prints one row per rank and category,
       MEMORY rank 0 stage 0 parameters estimated 123 measured 123
   then "N passed, N failed". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#include "examples/pretrain_gpt_args.h"

#define TIMEOUT_S 60.0
#define N_ITERS 2

static mc_comm *world;
static args opt;

/* --- the counting allocator ----------------------------------------------------------------- */

typedef struct counted { void *ptr; size_t bytes; int category; } counted;
static counted *live;
static int n_live, cap_live;
static double current[MC_MEMORY_CATEGORY_COUNT], peak[MC_MEMORY_CATEGORY_COUNT];
static int phase = MC_MEMORY_ACTIVATIONS;   /* the category of the allocations being made */

static void count_add(void *p, size_t bytes, int category) {
    if (!p) return;
    if (n_live == cap_live) {
        cap_live = cap_live ? 2 * cap_live : 1024;
        live = realloc(live, sizeof *live * (size_t)cap_live);
        if (!live) abort();
    }
    live[n_live++] = (counted){p, bytes, category};
    current[category] += (double)bytes;
    if (current[category] > peak[category]) peak[category] = current[category];
}

static void count_remove(void *p) {
    for (int i = n_live - 1; i >= 0; i--)
        if (live[i].ptr == p) {
            current[live[i].category] -= (double)live[i].bytes;
            live[i] = live[--n_live];
            return;
        }
}

/* Moves a live block to another category (mc_gpt_init's params and grads). */
static void count_reclassify(void *p, int category) {
    for (int i = 0; i < n_live; i++)
        if (live[i].ptr == p) {
            current[live[i].category] -= (double)live[i].bytes;
            live[i].category = category;
            current[category] += (double)live[i].bytes;
        }
}

static void *counting_alloc(size_t bytes) {
    void *p = mc_ops_cpu()->alloc(bytes);
    count_add(p, bytes, phase);
    return p;
}

static void counting_free(void *p) {
    count_remove(p);
    mc_ops_cpu()->free(p);
}

static const mc_comm_ops *pp_ops_original;
static mc_comm_ops pp_ops_counted;

static void *counting_comm_alloc(mc_comm *c, size_t bytes) {
    void *p = pp_ops_original->alloc(c, bytes);
    count_add(p, bytes, MC_MEMORY_COMMUNICATION);
    return p;
}

static void counting_comm_free(mc_comm *c, void *p) {
    count_remove(p);
    pp_ops_original->free(c, p);
}

/* --- a pretrain_gpt run --------------------------------------------------------------------- */

typedef struct run {
    mc_parallel_state ps;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int *tokens, *labels;
} run;

static int hook_forward(void *app, int chunk, int microbatch, const float *input, float **output,
                        double *loss_sum, double *num_tokens) {
    run *r = (run *)app;
    int n = opt.seq_length * opt.micro_batch_size;
    for (int i = 0; i < n; i++) {
        r->tokens[i] = (7 * i + 3 * microbatch) % opt.vocab_size;
        r->labels[i] = (7 * i + 3 * microbatch + 1) % opt.vocab_size;
    }
    return mc_gpt_forward_step(&r->gpt, chunk, microbatch, r->tokens, r->labels, input, output,
                               loss_sum, num_tokens);
}

static int hook_backward(void *app, int chunk, int microbatch, const float *output_grad,
                         float loss_scale, float **input_grad) {
    run *r = (run *)app;
    return mc_gpt_backward_step(&r->gpt, chunk, microbatch, output_grad, loss_scale, input_grad);
}

static void hook_grad_sync(void *app, int chunk, int enable) {
    run *r = (run *)app;
    mc_gpt_set_grad_sync(&r->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&r->ddp, chunk, enable);
}

static int hook_finalize(void *app) {
    run *r = (run *)app;
    return mc_finalize_model_grads(&r->ps, &r->ddp, NULL, NULL, opt.sp, NULL);
}

static void case_measure(void) {
    static run r;
    mc_ops ops = *mc_ops_cpu();
    ops.name = "cpu (counted)";
    ops.alloc = counting_alloc;
    ops.free = counting_free;
    mc_parallel_desc pd = {0};
    pd.world = world;
    pd.grid.tp = opt.tp, pd.grid.pp = opt.pp, pd.grid.vpp = opt.vpp > 1 ? opt.vpp : 0;
    int rc = mc_parallel_init(&r.ps, &pd);
    if (!MC_CASE_CHECK(rc == MC_OK, "mc_parallel_init: %s", mc_last_error())) return;
    int dp = r.ps.grid.dp, m = args_max_microbatches(&opt, dp);
    mc_comm *pp = mc_parallel_group(&r.ps, MC_GROUP_PP);
    pp_ops_original = pp->ops;
    pp_ops_counted = *pp->ops;
    pp_ops_counted.alloc = counting_comm_alloc;
    pp_ops_counted.free = counting_comm_free;
    pp->ops = &pp_ops_counted;

    mc_gpt_desc gd = {0};
    gd.config = config_from_args(&opt), gd.ps = &r.ps, gd.ops = &ops;
    gd.n_slots = args_n_slots(&opt, dp, r.ps.coords.pp);   /* as pretrain_gpt */
    gd.distributed_optimizer = opt.use_distributed_optimizer;
    gd.bucket_size = (size_t)(opt.bucket_size > 0 ? opt.bucket_size : 0);
    phase = MC_MEMORY_ACTIVATIONS;
    rc = mc_gpt_init(&r.gpt, &gd);
    if (!MC_CASE_CHECK(rc == MC_OK, "mc_gpt_init: %s", mc_last_error())) return;
    count_reclassify(r.gpt.params, MC_MEMORY_PARAMETERS);
    count_reclassify(r.gpt.grads, MC_MEMORY_GRADIENTS);
    for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++) peak[c] = current[c];   /* no frees yet */

    mc_ddp_desc dd = {0};
    dd.table = &r.gpt.table, dd.grads = r.gpt.grads, dd.ops = &ops;
    dd.dp = mc_parallel_group(&r.ps, MC_GROUP_DP_CP);
    dd.distributed_optimizer = opt.use_distributed_optimizer;
    dd.overlap_grad_reduce = opt.overlap_grad_reduce;
    phase = MC_MEMORY_OPTIMIZER;
    rc = mc_ddp_init(&r.ddp, &dd);
    MC_CASE_CHECK(rc == MC_OK, "mc_ddp_init: %s", mc_last_error());
    mc_optimizer_desc od = {0};
    od.ddp = &r.ddp, od.params = r.gpt.params, od.ps = &r.ps, od.ops = &ops, od.lr = 1e-3f;
    if (rc == MC_OK) rc = mc_optimizer_init(&r.opt, &od);
    MC_CASE_CHECK(rc == MC_OK, "mc_optimizer_init: %s", mc_last_error());

    r.tokens = calloc((size_t)opt.seq_length * (size_t)opt.micro_batch_size, sizeof(int));
    r.labels = calloc((size_t)opt.seq_length * (size_t)opt.micro_batch_size, sizeof(int));
    mc_schedule_hooks hooks = {0};
    hooks.app = &r, hooks.forward_step = hook_forward, hooks.backward_step = hook_backward;
    hooks.grad_sync = hook_grad_sync, hooks.finalize = hook_finalize;
    hooks.tensor_elems = r.gpt.p2p_elems;
    static mc_schedule_result result;
    phase = MC_MEMORY_COMMUNICATION;
    for (int it = 0; rc == MC_OK && it < N_ITERS; it++) {
        rc = mc_ddp_zero_grad(&r.ddp);
        mc_gpt_zero_grad(&r.gpt);
        if (rc == MC_OK) rc = mc_get_forward_backward_func(&r.ps)(&r.ps, &hooks, m, 0, &result);
        if (rc == MC_OK) rc = mc_optimizer_step(&r.opt);
        MC_CASE_CHECK(rc == MC_OK, "iteration %d: %s: %s", it, mc_err_name(rc), mc_last_error());
    }

    /* the estimate of this rank's stage */
    static mc_memory_stage st;
    mc_memory_desc md = args_memory_desc(&opt, dp);
    rc = mc_memory_estimate(&md, r.ps.coords.pp, &st);
    MC_CASE_CHECK(rc == MC_OK, "mc_memory_estimate: %s", mc_last_error());
    int64_t mine[2 + 2 * MC_MEMORY_CATEGORY_COUNT];
    mine[0] = world->rank, mine[1] = r.ps.coords.pp;
    for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++) {
        double want = st.bytes[MC_MEMORY_IMPLEMENTATION][c];
        mine[2 + 2 * c] = (int64_t)want, mine[3 + 2 * c] = (int64_t)peak[c];
        MC_CASE_CHECK(peak[c] == want, "stage %d %s: measured %.0f bytes, estimated %.0f",
                      r.ps.coords.pp, mc_memory_category_name(c), peak[c], want);
    }
    int n = 2 + 2 * MC_MEMORY_CATEGORY_COUNT;
    int64_t *all = calloc((size_t)n * (size_t)world->size, sizeof *all);
    if (all && mc_case_collective_host(world, 1, mine, all, n, MC_I64) == MC_OK && world->rank == 0)
        for (int k = 0; k < world->size; k++)
            for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++)
                printf("MEMORY rank %lld stage %lld %s estimated %lld measured %lld\n",
                       (long long)all[k * n], (long long)all[k * n + 1],
                       mc_memory_category_name(c), (long long)all[k * n + 2 + 2 * c],
                       (long long)all[k * n + 3 + 2 * c]);
    free(all);
    fflush(stdout);

    mc_optimizer_destroy(&r.opt);
    mc_ddp_destroy(&r.ddp);
    mc_gpt_free(&r.gpt);
    pp->ops = pp_ops_original;
    mc_parallel_destroy(&r.ps);
    free(r.tokens);
    free(r.labels);
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "measure") != 0) {
        fprintf(stderr, "usage: mpirun -np N %s measure [pretrain_gpt's flags]\n", argv[0]);
        return 2;
    }
    args_prog = "memory_cases";
    /* argv[1] plays argv[0] for pretrain_gpt's parser */
    if (parse_args(argc - 1, argv + 1, &opt) != ARGS_OK) return 2;
    int rc = mc_case_init_world(&world, &(mc_comm_desc){.timeout_s = TIMEOUT_S, .argc = &argc,
                                                         .argv = &argv});
    if (rc != MC_OK) return 1;
    int fits = world->size % (opt.tp * opt.pp) == 0;
    return mc_case_run(world, "measure", case_measure,
                       fits ? NULL : "the layout does not fit this many ranks");
}
