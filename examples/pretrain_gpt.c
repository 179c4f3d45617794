/* pretrain_gpt - the recipe entry: arguments, data, the training loop, logging, checkpoints.

       make pretrain_gpt
       mpirun --oversubscribe -np 8 ./pretrain_gpt --tensor-model-parallel-size 2 \
           --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 64 \
           --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 \
           --micro-batch-size 2 --global-batch-size 16 --train-iters 20 --lr 1e-3

   Flags use Megatron-LM's names. The library (megatron_c.h) owns the model, the parallel state,
   the schedules, the gradient reduction and the optimizer; this file owns what Megatron's
   pretrain_gpt.py and training.py own: parsing, the data, the loop and the log line.

   Before it allocates the model, every rank estimates what it will allocate (mc_memory_estimate)
   and the job stops when the ranks of a host would need more than its memory.

   Data: synthetic by default (a deterministic, learnable token stream drawn from --seed), or
   --data-path FILE: the bytes of a text file as tokens (vocabulary 256), read as consecutive
   windows of seq_length + 1 bytes.

   Device: built with `make cuda` and run where every rank has a GPU of its own, the world is
   NCCL and the model, DDP and optimizer run on the world's CUDA op table (mc_comm_memory);
   --cpu forces the CPU table (and the MPI communicator). --bf16 is Megatron's: bf16 parameters
   and activations, fp32 main parameters, gradients and optimizer state. --profile adds a
   per-step breakdown (GEMM, attention, norms, loss, optimizer, other, communication) timed
   with CUDA events to every log line. */
#ifndef MC_COMM_MPI
#define MC_COMM_MPI
#endif
#include "megatron_c.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
   arguments (Megatron-LM names): the parser, shared with `megatron_c memory` */

#include "pretrain_gpt_args.h"

/* The watchdog's limit: --distributed-timeout-seconds when given, else the minutes. */
static double timeout_s_from_args(const args *a) {
    return a->timeout_seconds > 0.0f ? (double)a->timeout_seconds
                                     : 60.0 * (double)a->timeout_minutes;
}

/* Every flag's resolved value as text, in arg_specs order: what the ranks must agree on
   (mc_comm_agree names the first one that differs). `text` holds N_ARG_SPECS rows of
   ARG_TEXT_LEN bytes. */
#define ARG_TEXT_LEN 96
static void args_to_text(const args *a, char (*text)[ARG_TEXT_LEN]) {
    for (int k = 0; k < N_ARG_SPECS; k++) {
        const char *field = (const char *)a + arg_specs[k].offset;
        char *t = text[k];
        switch (arg_specs[k].kind) {
        case A_FLAG: case A_INT: case A_RECOMPUTE_G: case A_RECOMPUTE_M:
            snprintf(t, ARG_TEXT_LEN, "%d", *(const int *)field); break;
        case A_FLOAT: {   /* the shortest text that reads back as the same float */
            float v = *(const float *)field;
            for (int digits = 6; digits <= 9; digits++) {
                snprintf(t, ARG_TEXT_LEN, "%.*g", digits, (double)v);
                if (strtof(t, NULL) == v) break;
            }
            break;
        }
        case A_STR: {
            const char *v = *(const char *const *)field;
            snprintf(t, ARG_TEXT_LEN, "%s", v ? v : "(none)");
            break;
        }
        case A_INT3: {
            const int *v = (const int *)field;
            snprintf(t, ARG_TEXT_LEN, "%d %d %d", v[0], v[1], v[2]);
            break;
        }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
   data: sample k is seq_length + 1 tokens; tokens[0..S) are the input, tokens[1..S] the labels */

typedef struct dataset {
    unsigned char *bytes;      /* --data-path contents, or NULL for synthetic data */
    size_t n_bytes;
    int vocab, seq_length;
    uint64_t seed;
} dataset;

/* Reads --data-path whole. On failure returns -1 with the reason in `why` (the caller prints
   it once the ranks agree that they all see the same thing). A file must be a regular file
   read to its last byte: a directory, a short read or a failed allocation never falls back
   to synthetic data. */
static int dataset_open(dataset *d, const args *a, char *why, size_t why_cap) {
    memset(d, 0, sizeof *d);
    d->vocab = a->vocab_size, d->seq_length = a->seq_length, d->seed = (uint64_t)a->seed;
    if (!a->data_path) return 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below) */
    int fd = open(a->data_path, O_RDONLY | O_NONBLOCK);
    struct stat st;
    FILE *f = NULL;
    if (fd < 0 || fstat(fd, &st) != 0 || !(f = fdopen(fd, "rb"))) {
        snprintf(why, why_cap, "--data-path %s: %s", a->data_path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_cap, "--data-path %s is not a regular file (%s)", a->data_path,
                 S_ISDIR(st.st_mode) ? "a directory" : "a device, pipe or socket");
        fclose(f);
        return -1;
    }
    long long n = (long long)st.st_size;
    if (n < (long long)a->seq_length + 2) {
        snprintf(why, why_cap, "--data-path %s has %lld bytes; it needs at least "
                 "seq_length + 2 = %d", a->data_path, n, a->seq_length + 2);
        fclose(f);
        return -1;
    }
    if ((unsigned long long)n > (size_t)-1 / 2 || !(d->bytes = malloc((size_t)n))) {
        snprintf(why, why_cap, "--data-path %s: cannot allocate %lld bytes to read it",
                 a->data_path, n);
        fclose(f);
        return -1;
    }
    d->n_bytes = fread(d->bytes, 1, (size_t)n, f);
    int read_error = ferror(f);
    fclose(f);
    if (d->n_bytes != (size_t)n) {
        snprintf(why, why_cap, "--data-path %s: read %zu of its %lld bytes (%s)", a->data_path,
                 d->n_bytes, n, read_error ? strerror(errno) : "the file shrank while read");
        free(d->bytes);
        d->bytes = NULL, d->n_bytes = 0;
        return -1;
    }
    return 0;
}

/* What the ranks compare about the data: the file's size and an FNV-1a hash of its bytes
   (ranks on different machines may see different files under one path). */
static void dataset_describe(const dataset *d, int open_rc, const char *why, char *out,
                             size_t cap) {
    if (open_rc != 0) {
        snprintf(out, cap, "unreadable: %s", why);
    } else if (!d->bytes) {
        snprintf(out, cap, "synthetic");
    } else {
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < d->n_bytes; i++) h = (h ^ d->bytes[i]) * 1099511628211ull;
        snprintf(out, cap, "%zu bytes, fnv1a %016llx", d->n_bytes, (unsigned long long)h);
    }
}

/* Synthetic text: a noisy affine chain t' = (a*t + b) mod V with a random restart every few
   tokens, so there is structure to learn (the loss falls) and every sample is reproducible
   from (seed, k) alone. */
static void dataset_sample(const dataset *d, long long k, int *tokens /* [S+1] */) {
    int S = d->seq_length;
    if (d->bytes) {
        size_t span = d->n_bytes - (size_t)S - 1;
        size_t start = (size_t)((unsigned long long)k * (unsigned long long)S % span);
        for (int t = 0; t <= S; t++) tokens[t] = d->bytes[start + (size_t)t];
        return;
    }
    uint64_t offset = (uint64_t)k * (uint64_t)(2 * (S + 1));
    int t0 = (int)(mc_rng_bits_at(d->seed, offset) % (uint32_t)d->vocab);
    tokens[0] = t0;
    for (int t = 1; t <= S; t++) {
        uint32_t r = mc_rng_bits_at(d->seed, offset + (uint64_t)t);
        tokens[t] = (r % 8 == 0) ? (int)(r / 8 % (uint32_t)d->vocab)
                                 : (tokens[t - 1] * 5 + 3) % d->vocab;
    }
}

/* ---------------------------------------------------------------------------------------------
   the training state the schedule hooks see */

typedef struct trainer {
    args a;
    mc_parallel_state ps;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    dataset data;
    int dp_rank, dp_size;
    long long batch_start;     /* first sample of this iteration's global batch */
    int *tokens, *labels;      /* [S, B] of the micro-batch being fed */
    int *sample;               /* [S + 1] scratch */
    mc_ops ops;                /* the CPU table, counting its memory in `account` */
    mc_memory_account account;
    mc_memory_stage estimate;  /* this rank's stage, from check_memory */
} trainer;

/* Micro-batch m of this DP rank holds samples batch_start + (m * DP + dp_rank) * B + j, j < B
   (Megatron's sampler: each step of micro-batches takes B * DP consecutive samples, and DP rank
   d takes its B of them). Writes tokens/labels as [S, B], sequence first. */
static void load_microbatch(trainer *t, int microbatch) {
    int S = t->a.seq_length, B = t->a.micro_batch_size;
    for (int j = 0; j < B; j++) {
        long long k = t->batch_start + ((long long)microbatch * t->dp_size + t->dp_rank) * B + j;
        dataset_sample(&t->data, k, t->sample);
        for (int s = 0; s < S; s++) {
            t->tokens[s * B + j] = t->sample[s];
            t->labels[s * B + j] = t->sample[s + 1];
        }
    }
}

static int hook_forward(void *app, int chunk, int microbatch, const float *input,
                        float **output, double *loss_sum, double *num_tokens) {
    trainer *t = (trainer *)app;
    load_microbatch(t, microbatch);
    return mc_gpt_forward_step(&t->gpt, chunk, microbatch, t->tokens, t->labels, input, output,
                               loss_sum, num_tokens);
}

static int hook_backward(void *app, int chunk, int microbatch, const float *output_grad,
                         float loss_scale, float **input_grad) {
    trainer *t = (trainer *)app;
    return mc_gpt_backward_step(&t->gpt, chunk, microbatch, output_grad, loss_scale, input_grad);
}

/* The schedule says when a chunk's last micro-batch runs: the model then reports finished
   parameter grads and DDP launches their buckets while backward goes on. */
static void hook_grad_sync(void *app, int chunk, int enable) {
    trainer *t = (trainer *)app;
    mc_gpt_set_grad_sync(&t->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&t->ddp, chunk, enable);
}

static void grad_ready(void *user, int param_index) {
    mc_ddp_register_grad_ready((mc_ddp *)user, param_index);
}

static int hook_finalize(void *app) {
    trainer *t = (trainer *)app;
    return mc_finalize_model_grads(&t->ps, &t->ddp, NULL, NULL, t->a.sp, NULL);
}

/* ---------------------------------------------------------------------------------------------
   setup */

#define CHECK(call)                                                                           \
    do {                                                                                      \
        int rc_ = (call);                                                                     \
        if (rc_ != MC_OK) {                                                                   \
            fprintf(stderr, "pretrain_gpt: %s failed: %s: %s\n", #call, mc_err_name(rc_),     \
                    mc_last_error());                                                         \
            return rc_;                                                                       \
        }                                                                                     \
    } while (0)

/* Full local m / v in the parameter layout (what checkpoints store); a collective over DP under
   the distributed optimizer. */
static int gather_optimizer_state(trainer *t, float *m, float *v) {
    const mc_param_table *tab = &t->gpt.table;
    for (int i = 0; i < tab->count; i++) {
        CHECK(mc_optimizer_get_state(&t->opt, i, MC_OPTIM_EXP_AVG, m + tab->info[i].offset));
        CHECK(mc_optimizer_get_state(&t->opt, i, MC_OPTIM_EXP_AVG_SQ, v + tab->info[i].offset));
    }
    return MC_OK;
}

static int scatter_optimizer_state(trainer *t, const float *m, const float *v) {
    const mc_param_table *tab = &t->gpt.table;
    for (int i = 0; i < tab->count; i++) {
        CHECK(mc_optimizer_set_state(&t->opt, i, MC_OPTIM_EXP_AVG, m + tab->info[i].offset));
        CHECK(mc_optimizer_set_state(&t->opt, i, MC_OPTIM_EXP_AVG_SQ, v + tab->info[i].offset));
    }
    return MC_OK;
}

/* Op memory (device memory on a GPU) for n floats, or NULL. */
static float *op_floats(const mc_ops *o, size_t n) {
    void *p = NULL;
    return o->alloc(o, &p, (n ? n : 1) * sizeof(float)) == MC_OK ? (float *)p : NULL;
}

/* The fp32 parameter values a checkpoint holds: the model's own, or under --bf16 the
   optimizer's main parameters (full local shards without the distributed optimizer). */
static float *checkpoint_params(trainer *t) {
    return t->gpt.dtype == MC_BF16 ? t->opt.main : (float *)t->gpt.params;
}

static int save_checkpoint(trainer *t, long long iteration, long long consumed) {
    size_t n = t->gpt.table.total;
    const mc_ops *o = t->gpt.ops;
    float *m = op_floats(o, n), *v = op_floats(o, n);
    int rc = m && v ? gather_optimizer_state(t, m, v) : MC_ERR_NO_MEMORY;
    if (rc == MC_OK) {
        mc_checkpoint_desc d = {0};
        d.dir = t->a.save, d.ps = &t->ps, d.config = &t->gpt.config;
        d.params = &t->gpt.table, d.param_data = checkpoint_params(t), d.ops = o;
        d.exp_avg = m, d.exp_avg_sq = v, d.rng = &t->gpt.rng;
        d.iteration = iteration, d.consumed_samples = consumed;
        d.optimizer_step = t->opt.iteration;
        rc = mc_checkpoint_save(&d);
        if (rc != MC_OK)
            fprintf(stderr, "pretrain_gpt: saving %s failed: %s\n", t->a.save, mc_last_error());
        else if (t->ps.world->rank == 0)
            printf("saved checkpoint at iteration %8lld to %s\n", iteration, t->a.save);
    }
    if (m) o->free(o, m);
    if (v) o->free(o, v);
    return rc;
}

static int load_checkpoint(trainer *t, long long *iteration, long long *consumed) {
    size_t n = t->gpt.table.total;
    const mc_ops *o = t->gpt.ops;
    float *m = op_floats(o, n), *v = op_floats(o, n);
    mc_checkpoint_result res;
    int rc = m && v ? MC_OK : MC_ERR_NO_MEMORY;
    if (rc == MC_OK) {
        mc_checkpoint_desc d = {0};
        d.dir = t->a.load, d.ps = &t->ps, d.config = &t->gpt.config;
        d.params = &t->gpt.table, d.param_data = checkpoint_params(t), d.ops = o;
        d.exp_avg = m, d.exp_avg_sq = v, d.rng = &t->gpt.rng;
        rc = mc_checkpoint_load(&d, t->a.override_math ? MC_CKPT_LOAD_IGNORE_MATH : 0u, &res);
        if (rc == MC_ERR_INVALID_DESC && t->ps.world->rank == 0)
            fprintf(stderr, "pretrain_gpt: --load %s: the checkpoint's model differs from this "
                    "one (pass --override-math-fingerprint to load it anyway)\n", t->a.load);
    }
    if (rc == MC_OK && res.optimizer_loaded) rc = scatter_optimizer_state(t, m, v);
    /* --bf16: the loaded fp32 main parameters become the model's bf16 parameters */
    if (rc == MC_OK && t->gpt.dtype == MC_BF16)
        rc = o->copy(o, t->gpt.params, t->opt.main, n, MC_BF16, MC_F32);
    if (rc == MC_OK) {
        *iteration = res.iteration, *consumed = res.consumed_samples;
        t->opt.iteration = res.optimizer_step;
        t->opt.lr_steps = res.iteration;
        if (t->ps.world->rank == 0)
            printf("loaded checkpoint from %s at iteration %lld (%s%s)\n", t->a.load,
                   res.iteration, res.resharded ? "resharded to this layout" : "same layout",
                   res.math_mismatch_ignored ? "; MATH FINGERPRINT MISMATCH IGNORED" : "");
    }
    if (m) o->free(o, m);
    if (v) o->free(o, v);
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* lm loss over the global batch: the last stage's TP-rank-0 ranks hold each DP replica's sums;
   one world all-reduce of (loss sum, token count) gathers them. */
static int global_loss(trainer *t, const mc_schedule_result *r, double *loss) {
    double mine[2] = {0.0, 0.0}, all[2];
    int last = mc_parallel_is_last_stage(&t->ps, 1);
    if (last && t->ps.coords.tp == 0) mine[0] = r->loss_sum, mine[1] = r->num_tokens;
    CHECK(mc_host_collective(t->ps.world, MC_COLL_ALL_REDUCE, mine, all, 2, MC_F64, MC_SUM, 0));
    *loss = all[1] > 0 ? all[0] / all[1] : 0.0;
    return MC_OK;
}

static void log_iteration(const trainer *t, long long it, long long consumed, double ms,
                          int gbs, double loss, int skipped, int nan_iters) {
    time_t wall = time(NULL);
    char stamp[32];
    double tokens_per_s = ms > 0 ? (double)gbs * t->a.seq_length / (ms / 1000.0) : 0.0;
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", localtime(&wall));
    printf(" [%s] iteration %8lld/%8d | consumed samples: %12lld | elapsed time per iteration "
           "(ms): %.1f | tokens per second: %.1f | learning rate: %.6E | global batch size: %5d "
           "| lm loss: %.6E | loss scale: 1.0 | grad norm: %.3f | number of skipped iterations: "
           "%3d | number of nan iterations: %3d |\n",
           stamp, it, t->a.train_iters, consumed, ms, tokens_per_s,
           mc_optimizer_lr_at(&t->opt.desc, t->opt.lr_steps), gbs, loss,
           t->opt.last_grad_norm, skipped, nan_iters);
    fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------
   the up-front memory check: what every rank is about to allocate (mc_memory_estimate, this
   library's model), summed over the ranks of each host, against that host's memory. A job that
   cannot fit stops here, on every rank, before mc_gpt_init allocates anything large. */

/* Physical memory, or a container's (cgroup v2 / v1) limit when that is smaller. On a CUDA
   table the limit is the device's memory and the ranks that share it (a hook for the GPU
   recipe: it compares each GPU's ranks with that GPU's total instead). */
static double host_memory_bytes(void) {
    static const char *const limits[] = {"/sys/fs/cgroup/memory.max",
                                         "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    double bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        FILE *f = fopen(limits[i], "r");
        double limit;
        if (!f) continue;
        if (fscanf(f, "%lf", &limit) == 1 && limit > 0 && limit < bytes) bytes = limit;
        fclose(f);
    }
    return bytes;
}

static int64_t host_id(void) {
    char name[256] = "";
    uint64_t h = 1469598103934665603ULL;   /* FNV-1a of the host name */
    gethostname(name, sizeof name - 1);
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    return (int64_t)(h >> 1);
}

static int check_memory(trainer *t) {
    mc_memory_stage *est = &t->estimate;
    mc_comm *world = t->ps.world;
    mc_memory_desc d = args_memory_desc(&t->a, t->dp_size);
    d.ops = &t->ops, d.tp_rank = t->ps.coords.tp, d.dp_rank = t->ps.coords.dp;
    int rc = mc_memory_estimate(&d, t->ps.coords.pp, est);
    if (rc != MC_OK) {
        if (world->rank == 0) fprintf(stderr, "pretrain_gpt: %s\n", mc_last_error());
        return MC_ERR_INVALID_DESC;
    }
    double mine = est->total[MC_MEMORY_IMPLEMENTATION], limit = host_memory_bytes();
    int64_t me[2] = {host_id(), mine < 4e18 ? (int64_t)mine : (int64_t)4e18};
    int64_t *all = malloc(sizeof *all * 2 * (size_t)world->size);
    if (!all) return MC_ERR_NO_MEMORY;
    rc = mc_host_collective(world, MC_COLL_ALL_GATHER, me, all, 2, MC_I64, MC_SUM, 0);
    double host_total = 0.0;
    int host_ranks = 0, first_on_host = world->rank;
    for (int r = 0; rc == MC_OK && r < world->size; r++)
        if (all[2 * r] == me[0]) {
            host_total += (double)all[2 * r + 1], host_ranks++;
            if (r < first_on_host) first_on_host = r;
        }
    free(all);
    if (rc != MC_OK) return rc;
    int over = host_total > limit, any_over = 0;
    CHECK(mc_host_collective(world, MC_COLL_ALL_REDUCE, &over, &any_over, 1, MC_I32, MC_MAX, 0));
    char total_s[32], limit_s[32], mine_s[32], cat_s[MC_MEMORY_CATEGORY_COUNT][32];
    for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++)
        mc_memory_format_bytes(cat_s[c], sizeof cat_s[c], est->bytes[MC_MEMORY_IMPLEMENTATION][c]);
    mc_memory_format_bytes(total_s, sizeof total_s, host_total);
    mc_memory_format_bytes(limit_s, sizeof limit_s, limit);
    mc_memory_format_bytes(mine_s, sizeof mine_s, mine);
    if (over && world->rank == first_on_host)
        fprintf(stderr, "pretrain_gpt: not enough memory: the %d rank(s) on this host would "
                "allocate an estimated %s, more than its %s (rank %d, pipeline stage %d: %s = "
                "parameters %s + gradients %s + optimizer %s + activations %s + communication "
                "%s); nothing large was allocated. `./megatron_c memory` with the same flags "
                "shows every term.\n", host_ranks, total_s, limit_s, world->rank,
                t->ps.coords.pp, mine_s, cat_s[0], cat_s[1], cat_s[2], cat_s[3], cat_s[4]);
    else if (world->rank == 0 && !any_over)
        printf("pretrain_gpt: memory estimate: rank 0 (pipeline stage 0) %s = parameters %s + "
               "gradients %s + optimizer %s + activations %s + communication %s; %d rank(s) on "
               "this host, %s of %s\n", mine_s, cat_s[0], cat_s[1], cat_s[2], cat_s[3],
               cat_s[4], host_ranks, total_s, limit_s);
    return any_over ? MC_ERR_NO_MEMORY : MC_OK;
}

/* ---------------------------------------------------------------------------------------------
   the measured side: at the end, every rank's peak per category (the op table's accounting,
   from mc_gpt_init on) beside the estimate of its stage. CUDA: the device's own peak too. */

static int report_memory(trainer *t) {
    enum { PER_RANK = 2 + 2 * MC_MEMORY_CATEGORY_COUNT + 2 };
    mc_comm *world = t->ps.world;
    double mine[PER_RANK], *all = malloc(sizeof *all * PER_RANK * (size_t)world->size);
    int k = 0;
    if (!all) return MC_ERR_NO_MEMORY;
    mine[k++] = world->rank, mine[k++] = t->ps.coords.pp;
    for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++) {
        mine[k++] = t->account.peak[c];
        mine[k++] = t->estimate.bytes[MC_MEMORY_IMPLEMENTATION][c];
    }
    mine[k++] = t->account.peak_total, mine[k++] = t->estimate.total[MC_MEMORY_IMPLEMENTATION];
    int rc = mc_host_collective(world, MC_COLL_ALL_GATHER, mine, all, PER_RANK, MC_F64, MC_SUM, 0);
    if (rc == MC_OK && world->rank == 0) {
        printf("memory peak per rank in bytes, measured (the op table's accounting since "
               "mc_gpt_init) / estimated (mc_memory_estimate):\n  rank stage");
        for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++)
            printf(" %23s", mc_memory_category_name(c));
        printf(" %23s\n", "all at once / sum");
        for (int r = 0; r < world->size; r++) {
            const double *v = all + (size_t)r * PER_RANK;
            printf("  %4.0f %5.0f", v[0], v[1]);
            for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++)
                printf(" %11.0f/%-11.0f", v[2 + 2 * c], v[3 + 2 * c]);
            printf(" %11.0f/%-11.0f\n", v[PER_RANK - 2], v[PER_RANK - 1]);
        }
    }
#if defined(MC_ENABLE_CUDA)
    if (rc == MC_OK && t->ops.device == MC_DEVICE_CUDA)
        printf("[rank %d] device peak (CUDA allocator): %zu bytes\n", world->rank,
               mc_ops_cuda_peak_bytes(&t->ops, 0));
#endif
    free(all);
    return rc;
}

/* --profile: the per-category times of the iterations since the last log line, per iteration
   (CUDA events around every op; communication overlaps compute, so the parts need not add up to
   the iteration time). */
static void log_breakdown(const trainer *t, int iterations) {
#if defined(MC_ENABLE_CUDA)
    static const char *const names[MC_PROF_COUNT] = {"gemm", "attention", "norms", "loss",
                                                     "optimizer", "other", "communication"};
    double ms[MC_PROF_COUNT];
    if (!t->a.profile || t->gpt.ops->device != MC_DEVICE_CUDA || iterations < 1) return;
    if (mc_ops_cuda_profile_read(t->gpt.ops, ms) != MC_OK) return;
    printf(" step time breakdown (ms per iteration, CUDA events):");
    for (int k = 0; k < MC_PROF_COUNT; k++)
        printf(" %s %.2f%s", names[k], ms[k] / iterations, k + 1 < MC_PROF_COUNT ? " |" : "\n");
    fflush(stdout);
#else
    (void)t;
    (void)iterations;
#endif
}

static int train(trainer *t) {
    args *a = &t->a;
    mc_comm *world = t->ps.world;
    int me = world->rank;
#if defined(MC_ENABLE_CUDA)
    const mc_ops *ops = &t->ops;   /* the world's memory owner (CPU or GPU), counted */
#endif
    mc_dtype dtype = a->bf16 ? MC_BF16 : MC_F32;
    if (a->bf16 && a->use_distributed_optimizer && (a->save || a->load)) {
        if (me == 0)
            fprintf(stderr, "pretrain_gpt: --bf16 with --use-distributed-optimizer cannot --save "
                    "or --load yet (the fp32 main parameters are sharded); drop one of them\n");
        return MC_ERR_UNSUPPORTED;
    }

    /* config: every violated rule at once */
    if (args_check_config(a, me == 0 ? stderr : NULL) > 0) return MC_ERR_INVALID_DESC;
    if (a->bf16 && a->tp > 1 && world->backend != MC_BACKEND_NCCL) {
        if (me == 0)
            fprintf(stderr, "pretrain_gpt: --bf16 with --tensor-model-parallel-size %d needs the "
                    "nccl backend: tensor parallelism reduces bf16 activations, and the %s "
                    "backend has no bf16 reductions (MPI has no bf16 type)\n", a->tp,
                    mc_backend_name(world->backend));
        return MC_ERR_INVALID_DESC;
    }
    mc_gpt_config cfg = config_from_args(a);
    t->dp_size = t->ps.grid.dp, t->dp_rank = t->ps.coords.dp;

    mc_microbatch_calc mb;
    if (args_microbatches(a, t->dp_size, &mb, me == 0 ? stderr : NULL) != MC_OK)
        return MC_ERR_INVALID_DESC;
    /* before anything large is allocated: would this run fit? */
    int fits = check_memory(t);
    if (fits != MC_OK) return fits;

    mc_memory_account_reset_peaks(&t->account);   /* from here: what training needs */
    mc_gpt_desc gd = {0};
    gd.ops = &t->ops, gd.dtype = dtype;   /* Megatron's --bf16: bf16 params and activations */
    gd.config = cfg, gd.ps = &t->ps, gd.n_slots = args_n_slots(a, t->dp_size, t->ps.coords.pp);
    gd.distributed_optimizer = a->use_distributed_optimizer;
    gd.bucket_size = (size_t)(a->bucket_size > 0 ? a->bucket_size : 0);
    CHECK(mc_gpt_init(&t->gpt, &gd));

    mc_ddp_desc dd = {0};
    dd.table = &t->gpt.table, dd.grads = t->gpt.grads, dd.ops = &t->ops;
    dd.dp = mc_parallel_group(&t->ps, MC_GROUP_DP_CP);
    dd.distributed_optimizer = a->use_distributed_optimizer;
    dd.overlap_grad_reduce = a->overlap_grad_reduce;
    CHECK(mc_ddp_init(&t->ddp, &dd));
    if (a->overlap_grad_reduce) t->gpt.grad_ready = grad_ready, t->gpt.grad_ready_user = &t->ddp;

    mc_optimizer_desc od = {0};
    od.ddp = &t->ddp, od.params = t->gpt.params, od.ps = &t->ps, od.ops = &t->ops;
    od.params_dtype = dtype;   /* bf16: fp32 main params in the optimizer */
    od.lr = a->lr, od.min_lr = a->min_lr;
    od.lr_warmup_iters = a->lr_warmup_iters;
    od.lr_decay_iters = a->lr_decay_iters > 0 ? a->lr_decay_iters : a->train_iters;
    od.train_iters = a->train_iters;
    od.weight_decay = a->weight_decay > 0 ? a->weight_decay : MC_WEIGHT_DECAY_OFF;
    od.clip_grad = a->clip_grad > 0 ? a->clip_grad : MC_CLIP_GRAD_OFF;
    CHECK(mc_optimizer_init(&t->opt, &od));

    t->tokens = calloc((size_t)a->seq_length * (size_t)a->micro_batch_size, sizeof(int));
    t->labels = calloc((size_t)a->seq_length * (size_t)a->micro_batch_size, sizeof(int));
    t->sample = calloc((size_t)a->seq_length + 1, sizeof(int));
    if (!t->tokens || !t->labels || !t->sample) return MC_ERR_NO_MEMORY;

    long long iteration = 0, consumed = 0, logged = 0;
    if (a->load) CHECK(load_checkpoint(t, &iteration, &consumed));
    logged = iteration;
    if (me == 0)
        printf("pretrain_gpt: world %d = tp %d x pp %d x dp %d%s%s; %d layers, hidden %d, heads "
               "%d, seq %d, vocab %d (padded %d); %zu parameters on rank 0\n",
               world->size, a->tp, a->pp, t->dp_size, a->vpp > 1 ? " (interleaved)" : "",
               a->sp ? " + sequence parallel" : "", a->num_layers, a->hidden_size, a->num_heads,
               a->seq_length, a->vocab_size, t->gpt.vocab_padded, t->gpt.table.total);
    if (me == 0) {
#if defined(MC_ENABLE_CUDA)
        if (ops->device == MC_DEVICE_CUDA)
            printf("pretrain_gpt: device %s; %s\n", mc_ops_cuda_describe(ops),
                   a->bf16 ? "bf16 (fp32 main parameters and grads)" : "fp32");
        else
#endif
            printf("pretrain_gpt: device cpu; %s\n", a->bf16 ? "bf16 storage emulated" : "fp32");
    }
#if defined(MC_ENABLE_CUDA)
    if (a->profile && ops->device == MC_DEVICE_CUDA) CHECK(mc_ops_cuda_profile(ops, 1));
#endif

    mc_forward_backward_func fb = mc_get_forward_backward_func(&t->ps);
    mc_schedule_hooks hooks = {0};
    hooks.app = t, hooks.forward_step = hook_forward, hooks.backward_step = hook_backward;
    hooks.grad_sync = hook_grad_sync, hooks.finalize = hook_finalize;
    hooks.tensor_elems = t->gpt.p2p_elems, hooks.tensor_dtype = dtype;
    static mc_schedule_result result;   /* large trace: keep it off the stack */

    int skipped_iters = 0, nan_iters = 0;
    while (iteration < a->train_iters) {
        CHECK(mc_microbatch_update(&mb, consumed, 1));
        int gbs = mb.current_running_global_batch_size;
        double t0 = now_s();
        t->batch_start = consumed;
        CHECK(mc_ddp_zero_grad(&t->ddp));   /* the model's grads are the ddp's buffer */
        CHECK(fb(&t->ps, &hooks, mb.num_microbatches, 0, &result));
        int step_rc = mc_optimizer_step(&t->opt);
        int skipped = step_rc == MC_ERR_STATE;   /* non-finite grad norm: Megatron skips */
        if (step_rc != MC_OK && !skipped) CHECK(step_rc);
        double loss;
        CHECK(global_loss(t, &result, &loss));
        /* Counted over the log interval, as Megatron's log line does. */
        skipped_iters += skipped;
        nan_iters += skipped || !isfinite(loss);
        if (!isfinite(loss)) {   /* Megatron's check_for_nan_in_loss_and_grad: stop */
            if (me == 0)
                fprintf(stderr, "pretrain_gpt: iteration %lld: lm loss is %g; stopping instead "
                        "of training on it (lower --lr, or check the data)\n", iteration + 1,
                        loss);
            return MC_ERR_STATE;
        }
        iteration++;
        consumed += gbs;
        double ms = (now_s() - t0) * 1000.0;
        if (iteration % a->log_interval == 0 || iteration == a->train_iters) {
            if (me == 0) {
                log_iteration(t, iteration, consumed, ms, gbs, loss, skipped_iters, nan_iters);
                log_breakdown(t, (int)(iteration - logged));
            }
            skipped_iters = nan_iters = 0;
            logged = iteration;
        }
        if (a->save && a->save_interval > 0 && iteration % a->save_interval == 0)
            CHECK(save_checkpoint(t, iteration, consumed));
    }
    if (a->save && (a->save_interval <= 0 || iteration % a->save_interval != 0))
        CHECK(save_checkpoint(t, iteration, consumed));
    CHECK(report_memory(t));
    return MC_OK;
}

/* Every rank's flags and data must agree; this is the job's first collective (see
   mc_comm_agree), so ranks started with different flags stop before any collective whose
   count or size depends on them. */
static int agree_on_config(mc_comm *world, const args *a, const char *data_text) {
    static char text[N_ARG_SPECS][ARG_TEXT_LEN];
    mc_agree_item items[N_ARG_SPECS + 1];
    args_to_text(a, text);
    for (int k = 0; k < N_ARG_SPECS; k++) items[k].name = arg_specs[k].name, items[k].value = text[k];
    items[N_ARG_SPECS].name = "the contents of --data-path";
    items[N_ARG_SPECS].value = data_text;
    return mc_comm_agree(world, items, N_ARG_SPECS + 1);
}

static int exit_code_of(int rc) {
    return rc == MC_OK ? 0 : rc == MC_ERR_INVALID_DESC ? 2 : 1;
}

/* PRETRAIN_GPT_NO_MAIN: tests/fuzz includes this file to reach the parser and the reader. */
#ifndef PRETRAIN_GPT_NO_MAIN
int main(int argc, char **argv) {
    static trainer t;
    int parsed = parse_args(argc, argv, &t.a);
    if (parsed == ARGS_HELP) {
        usage(stdout);
        return 0;
    }
    if (parsed == ARGS_UNKNOWN) usage(stderr);
    if (parsed != ARGS_OK) return 2;
    mc_comm *world = NULL;
    mc_comm_desc cd = {0};
    cd.argc = &argc, cd.argv = &argv;
    cd.timeout_s = cd.watchdog_s = timeout_s_from_args(&t.a);
    /* Every buffer of the run is counted by category in the op table's account. AUTO: nccl
       with its CUDA table when every rank has a GPU (make cuda), else mpi or self on the CPU;
       --cpu keeps a GPU build on the CPU. The CPU table is handed to the world so that its
       communication buffers are counted too; a CUDA world makes its own table, and the run
       takes a counted copy of it after the world exists. */
    t.ops = *mc_ops_cpu();
    t.ops.account = &t.account;
#if defined(MC_ENABLE_CUDA)
    if (t.a.cpu) cd.backend = MC_BACKEND_MPI, cd.memory = &t.ops;
#else
    cd.memory = &t.ops;
#endif
    int rc = mc_comm_init_world(&world, &cd);
    if (rc != MC_OK) {
        fprintf(stderr, "pretrain_gpt: %s: %s\n", mc_err_name(rc), mc_last_error());
        return 1;
    }
    if (mc_comm_memory(world) != &t.ops) {   /* the world's own table (CUDA): a counted copy */
        t.ops = *mc_comm_memory(world);
        t.ops.account = &t.account;
    }
    char why[512] = "", data_text[512];
    int data_rc = dataset_open(&t.data, &t.a, why, sizeof why);
    dataset_describe(&t.data, data_rc, why, data_text, sizeof data_text);
    rc = agree_on_config(world, &t.a, data_text);
    if (rc != MC_OK) {
        if (world->rank == 0) fprintf(stderr, "pretrain_gpt: %s\n", mc_last_error());
    } else if (data_rc != 0) {
        if (world->rank == 0) fprintf(stderr, "pretrain_gpt: %s\n", why);
        rc = MC_ERR_IO;
    } else {
        mc_parallel_desc pd = {0};
        pd.world = world;
        pd.grid.tp = t.a.tp, pd.grid.pp = t.a.pp, pd.grid.vpp = t.a.vpp > 1 ? t.a.vpp : 0;
        rc = mc_parallel_init(&t.ps, &pd);
        if (rc != MC_OK) {
            if (world->rank == 0)
                fprintf(stderr, "pretrain_gpt: %s: %s\n", mc_err_name(rc), mc_last_error());
        } else {
            rc = train(&t);
        }
    }
    /* After a watchdog verdict (printed with the failed call above) the job cannot go on:
       the ranks exit non-zero without MPI_Finalize and mpirun ends the stuck rank. */
    if (mc_comm_watchdog_verdict(world))
        fprintf(stderr, "pretrain_gpt: rank %d exits: the watchdog stopped the job\n",
                world->rank);
    if (t.ps.initialized) mc_parallel_destroy(&t.ps);
    mc_comm_destroy(world);
    free(t.data.bytes);
    mc_memory_account_destroy(&t.account);
    return exit_code_of(rc);
}
#endif
