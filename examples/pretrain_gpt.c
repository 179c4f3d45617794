/* pretrain_gpt - the recipe entry: arguments, data, the training loop, logging, checkpoints.

       make pretrain_gpt
       mpirun --oversubscribe -np 8 ./pretrain_gpt --tensor-model-parallel-size 2 \
           --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 64 \
           --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 \
           --micro-batch-size 2 --global-batch-size 16 --train-iters 20 --lr 1e-3

   Flags use Megatron-LM's names. The library (megatron_c.h) owns the model, the parallel state,
   the schedules, the gradient reduction and the optimizer; this file owns what Megatron's
   pretrain_gpt.py and training.py own: parsing, the data, the loop and the log line.

   Data: synthetic by default (a deterministic, learnable token stream drawn from --seed), or
   --data-path FILE: the bytes of a text file as tokens (vocabulary 256), read as consecutive
   windows of seq_length + 1 bytes. */
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

/* ---------------------------------------------------------------------------------------------
   arguments (Megatron-LM names) */

typedef struct args {
    int tp, pp, vpp, sp;
    int num_layers, hidden_size, num_heads, ffn_hidden_size, seq_length, max_positions;
    int micro_batch_size, global_batch_size;
    int rampup[3];
    int train_iters;
    float lr, min_lr, weight_decay, clip_grad;
    int lr_warmup_iters, lr_decay_iters;
    int seed, vocab_size;
    float hidden_dropout, attention_dropout;
    int recompute_granularity, recompute_method, recompute_num_layers;
    int use_distributed_optimizer;
    const char *save, *load;
    int save_interval, log_interval;
    const char *data_path;
    int untie;
    int override_math;
    int vocab_divisible_by;
    int overlap_grad_reduce;
    int bucket_size;
    int timeout_minutes;        /* --distributed-timeout-minutes (Megatron's, default 10) */
    float timeout_seconds;      /* --distributed-timeout-seconds: overrides the minutes */
} args;

static void usage(FILE *f) {
    fprintf(f,
        "usage: mpirun -np N ./pretrain_gpt [flags]\n"
        "  parallelism: --tensor-model-parallel-size T --pipeline-model-parallel-size P\n"
        "               --virtual-pipeline-model-parallel-size V --sequence-parallel\n"
        "               --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size N\n"
        "  model:       --num-layers L --hidden-size H --num-attention-heads A\n"
        "               --ffn-hidden-size F --seq-length S --max-position-embeddings M\n"
        "               --vocab-size V --make-vocab-size-divisible-by D\n"
        "               --hidden-dropout p --attention-dropout p\n"
        "               --untie-embeddings-and-output-weights\n"
        "  batch:       --micro-batch-size B --global-batch-size G\n"
        "               --rampup-batch-size START INCR SAMPLES\n"
        "  training:    --train-iters N --lr X --min-lr X --lr-warmup-iters N\n"
        "               --lr-decay-iters N --weight-decay X --clip-grad X --seed N\n"
        "  recompute:   --recompute-granularity full|selective --recompute-method uniform|block\n"
        "               --recompute-num-layers N\n"
        "  checkpoints: --save DIR --load DIR --save-interval N --override-math-fingerprint\n"
        "  data/log:    --data-path FILE --log-interval N\n"
        "  watchdog:    --distributed-timeout-minutes N (default 10) or\n"
        "               --distributed-timeout-seconds S: a rank that makes no progress for\n"
        "               that long stops every rank with a message naming it\n"
        "A flag given twice keeps its last value (as Megatron's argparse) and says so. Every\n"
        "rank must get the same flags: the ranks compare them before anything else and stop\n"
        "naming the first one that differs.\n");
}

/* A whole decimal integer that fits an int. Out-of-range values are named as such. */
static int parse_int(const char *flag, const char *v, int *out) {
    char *end;
    long long x;
    errno = 0;
    x = strtoll(v, &end, 10);
    if (*end || end == v) {
        fprintf(stderr, "pretrain_gpt: %s expects an integer, got \"%s\"\n", flag, v);
        return -1;
    }
    if (errno == ERANGE || x < INT_MIN || x > INT_MAX) {
        fprintf(stderr, "pretrain_gpt: %s value %s is out of range (an int holds %d .. %d)\n",
                flag, v, INT_MIN, INT_MAX);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* A finite decimal number ("1e-3", "0.5", "-2"): strtod's hexadecimal forms, "inf" and "nan"
   are refused, and so is a value a float cannot hold. */
static int parse_float(const char *flag, const char *v, float *out) {
    char *end;
    double x;
    int decimal = *v != '\0';
    for (const char *p = v; *p; p++)
        if (!strchr("0123456789.eE+-", *p)) decimal = 0;
    errno = 0;
    x = decimal ? strtod(v, &end) : 0.0;
    if (!decimal || *end || end == v) {
        fprintf(stderr, "pretrain_gpt: %s expects a finite decimal number such as 1e-3, got \"%s\"\n",
                flag, v);
        return -1;
    }
    if (errno == ERANGE && fabs(x) > 1.0) x = HUGE_VAL;
    if (!isfinite(x) || !isfinite((float)x)) {
        fprintf(stderr, "pretrain_gpt: %s value %s is out of range (a float holds up to %g)\n",
                flag, v, (double)FLT_MAX);
        return -1;
    }
    *out = (float)x;
    return 0;
}

/* One row per flag: name, how many values, and where they go. */
typedef enum { A_INT, A_FLOAT, A_FLAG, A_STR, A_INT3, A_RECOMPUTE_G, A_RECOMPUTE_M } arg_kind;
typedef struct arg_spec { const char *name; arg_kind kind; size_t offset; } arg_spec;
#define A(name, kind, field) {name, kind, offsetof(args, field)}
static const arg_spec arg_specs[] = {
    A("--tensor-model-parallel-size", A_INT, tp),
    A("--pipeline-model-parallel-size", A_INT, pp),
    A("--virtual-pipeline-model-parallel-size", A_INT, vpp),
    A("--sequence-parallel", A_FLAG, sp),
    A("--num-layers", A_INT, num_layers),
    A("--hidden-size", A_INT, hidden_size),
    A("--num-attention-heads", A_INT, num_heads),
    A("--ffn-hidden-size", A_INT, ffn_hidden_size),
    A("--seq-length", A_INT, seq_length),
    A("--max-position-embeddings", A_INT, max_positions),
    A("--micro-batch-size", A_INT, micro_batch_size),
    A("--global-batch-size", A_INT, global_batch_size),
    A("--rampup-batch-size", A_INT3, rampup),
    A("--train-iters", A_INT, train_iters),
    A("--lr", A_FLOAT, lr),
    A("--min-lr", A_FLOAT, min_lr),
    A("--lr-warmup-iters", A_INT, lr_warmup_iters),
    A("--lr-decay-iters", A_INT, lr_decay_iters),
    A("--weight-decay", A_FLOAT, weight_decay),
    A("--clip-grad", A_FLOAT, clip_grad),
    A("--seed", A_INT, seed),
    A("--vocab-size", A_INT, vocab_size),
    A("--hidden-dropout", A_FLOAT, hidden_dropout),
    A("--attention-dropout", A_FLOAT, attention_dropout),
    A("--recompute-granularity", A_RECOMPUTE_G, recompute_granularity),
    A("--recompute-method", A_RECOMPUTE_M, recompute_method),
    A("--recompute-num-layers", A_INT, recompute_num_layers),
    A("--use-distributed-optimizer", A_FLAG, use_distributed_optimizer),
    A("--untie-embeddings-and-output-weights", A_FLAG, untie),
    A("--save", A_STR, save),
    A("--load", A_STR, load),
    A("--save-interval", A_INT, save_interval),
    A("--log-interval", A_INT, log_interval),
    A("--data-path", A_STR, data_path),
    A("--override-math-fingerprint", A_FLAG, override_math),
    A("--make-vocab-size-divisible-by", A_INT, vocab_divisible_by),
    A("--overlap-grad-reduce", A_FLAG, overlap_grad_reduce),
    A("--ddp-bucket-size", A_INT, bucket_size),
    A("--distributed-timeout-minutes", A_INT, timeout_minutes),
    A("--distributed-timeout-seconds", A_FLOAT, timeout_seconds),
};
#undef A
#define N_ARG_SPECS ((int)(sizeof arg_specs / sizeof arg_specs[0]))

/* The rules Megatron's arguments.py and the LR scheduler assert that mc_gpt_config does not
   see (the schedule, the optimizer, logging, the watchdog). Prints every violation; returns
   their count. */
static int check_args(const args *a) {
    int bad = 0;
#define RULE(ok, ...) \
    do { if (!(ok)) { fprintf(stderr, "pretrain_gpt: " __VA_ARGS__); fputc('\n', stderr); \
                      bad++; } } while (0)
    RULE(a->train_iters >= 1, "--train-iters (%d) must be >= 1", a->train_iters);
    RULE(a->log_interval >= 1, "--log-interval (%d) must be >= 1", a->log_interval);
    RULE(a->save_interval >= 0, "--save-interval (%d) must be >= 0 (0: save at the end only)",
         a->save_interval);
    RULE(a->lr >= 0.0f, "--lr (%g) must be >= 0", (double)a->lr);
    RULE(a->min_lr >= 0.0f && a->min_lr <= a->lr,
         "--min-lr (%g) must be in [0, --lr (%g)] (Megatron: 0 <= min_lr <= max_lr)",
         (double)a->min_lr, (double)a->lr);
    RULE(a->weight_decay >= 0.0f, "--weight-decay (%g) must be >= 0", (double)a->weight_decay);
    RULE(a->clip_grad >= 0.0f, "--clip-grad (%g) must be >= 0 (0 switches clipping off)",
         (double)a->clip_grad);
    RULE(a->lr_warmup_iters >= 0, "--lr-warmup-iters (%d) must be >= 0", a->lr_warmup_iters);
    RULE(a->lr_decay_iters >= 0, "--lr-decay-iters (%d) must be >= 0", a->lr_decay_iters);
    RULE(a->seed >= 1, "--seed (%d) must be > 0 (Megatron's _set_random_seed)", a->seed);
    RULE(a->bucket_size >= 0, "--ddp-bucket-size (%d) must be >= 0", a->bucket_size);
    RULE(a->vocab_divisible_by >= 0, "--make-vocab-size-divisible-by (%d) must be >= 0",
         a->vocab_divisible_by);
    RULE(a->rampup[0] >= 0 && a->rampup[1] >= 0 && a->rampup[2] >= 0,
         "--rampup-batch-size (%d %d %d) must be three numbers >= 0", a->rampup[0],
         a->rampup[1], a->rampup[2]);
    RULE(a->timeout_minutes >= 1, "--distributed-timeout-minutes (%d) must be >= 1",
         a->timeout_minutes);
    RULE(a->timeout_seconds >= 0.0f,
         "--distributed-timeout-seconds (%g) must be > 0 (it overrides the minutes)",
         (double)a->timeout_seconds);
#undef RULE
    return bad;
}

/* 0 parsed, 1 --help (printed), -1 bad usage (printed). */
static int parse_args(int argc, char **argv, args *a) {
    unsigned char seen[N_ARG_SPECS];
    /* one note per job, not one per rank (parsing comes before MPI starts) */
    const char *world_rank = getenv("OMPI_COMM_WORLD_RANK");
    int note_repeats = !world_rank || !strcmp(world_rank, "0");
    memset(seen, 0, sizeof seen);
    memset(a, 0, sizeof *a);
    a->tp = a->pp = 1;
    a->num_layers = 2, a->hidden_size = 64, a->num_heads = 4, a->seq_length = 32;
    a->micro_batch_size = 2, a->global_batch_size = 8, a->train_iters = 10;
    a->lr = 1e-3f, a->seed = 1234, a->vocab_size = 256, a->log_interval = 1;
    a->clip_grad = 1.0f, a->weight_decay = 0.01f;
    a->hidden_dropout = a->attention_dropout = 0.1f;   /* Megatron's defaults */
    a->timeout_minutes = 10;                           /* Megatron's default */
    for (int i = 1; i < argc; i++) {
        const arg_spec *s = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 1; }
        for (int k = 0; k < N_ARG_SPECS; k++)
            if (!strcmp(argv[i], arg_specs[k].name)) s = &arg_specs[k];
        if (!s) {
            fprintf(stderr, "pretrain_gpt: unknown flag \"%s\"\n", argv[i]);
            usage(stderr);
            return -1;
        }
        /* As Megatron's argparse, the last value counts (scripts append overrides to a base
           command line), but not silently: the note names the flag and the value kept. */
        if (seen[s - arg_specs]++ && note_repeats) {
            int n_values = s->kind == A_FLAG ? 0 : s->kind == A_INT3 ? 3 : 1;
            fprintf(stderr, "pretrain_gpt: note: %s is given more than once; the last one "
                    "counts%s%s\n", s->name, n_values && i + 1 < argc ? ": " : "",
                    n_values && i + 1 < argc ? argv[i + 1] : "");
        }
        char *field = (char *)a + s->offset;
        int need = s->kind == A_FLAG ? 0 : s->kind == A_INT3 ? 3 : 1;
        if (i + need >= argc + (need == 0)) {
            fprintf(stderr, "pretrain_gpt: %s needs %d value(s)\n", s->name, need);
            return -1;
        }
        switch (s->kind) {
        case A_FLAG: *(int *)field = 1; break;
        case A_STR: *(const char **)field = argv[++i]; break;
        case A_INT: if (parse_int(s->name, argv[++i], (int *)field)) return -1; break;
        case A_FLOAT: if (parse_float(s->name, argv[++i], (float *)field)) return -1; break;
        case A_INT3:
            for (int k = 0; k < 3; k++)
                if (parse_int(s->name, argv[++i], (int *)field + k)) return -1;
            break;
        case A_RECOMPUTE_G: {
            const char *v = argv[++i];
            if (!strcmp(v, "full")) *(int *)field = MC_RECOMPUTE_FULL;
            else if (!strcmp(v, "selective")) *(int *)field = MC_RECOMPUTE_SELECTIVE;
            else { fprintf(stderr, "pretrain_gpt: %s must be full or selective, got \"%s\"\n",
                           s->name, v); return -1; }
            break;
        }
        case A_RECOMPUTE_M: {
            const char *v = argv[++i];
            if (!strcmp(v, "uniform")) *(int *)field = MC_RECOMPUTE_UNIFORM;
            else if (!strcmp(v, "block")) *(int *)field = MC_RECOMPUTE_BLOCK;
            else { fprintf(stderr, "pretrain_gpt: %s must be uniform or block, got \"%s\"\n",
                           s->name, v); return -1; }
            break;
        }
        }
    }
    if (check_args(a) > 0) return -1;
    if (a->max_positions == 0) a->max_positions = a->seq_length;
    /* Megatron's --hidden-dropout 0 switches dropout off; in mc_gpt_config 0 means default. */
    if (a->hidden_dropout == 0.0f) a->hidden_dropout = MC_DROPOUT_OFF;
    if (a->attention_dropout == 0.0f) a->attention_dropout = MC_DROPOUT_OFF;
    if (a->data_path) a->vocab_size = 256;   /* byte-level tokens */
    return 0;
}

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

static mc_gpt_config config_from_args(const args *a) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = a->num_layers, c.hidden_size = a->hidden_size;
    c.num_attention_heads = a->num_heads, c.ffn_hidden_size = a->ffn_hidden_size;
    c.vocab_size = a->vocab_size, c.make_vocab_size_divisible_by = a->vocab_divisible_by;
    c.seq_length = a->seq_length, c.max_position_embeddings = a->max_positions;
    c.untie_embeddings_and_output_weights = a->untie;
    c.hidden_dropout = a->hidden_dropout, c.attention_dropout = a->attention_dropout;
    c.tensor_model_parallel_size = a->tp, c.pipeline_model_parallel_size = a->pp;
    c.virtual_pipeline_model_parallel_size = a->vpp, c.sequence_parallel = a->sp;
    c.recompute_granularity = (mc_recompute_granularity)a->recompute_granularity;
    c.recompute_method = (mc_recompute_method)a->recompute_method;
    c.recompute_num_layers = a->recompute_num_layers;
    c.micro_batch_size = a->micro_batch_size, c.seed = a->seed;
    return c;
}

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

static int save_checkpoint(trainer *t, long long iteration, long long consumed) {
    size_t n = t->gpt.table.total;
    float *m = calloc(n ? n : 1, sizeof *m), *v = calloc(n ? n : 1, sizeof *v);
    int rc = m && v ? gather_optimizer_state(t, m, v) : MC_ERR_NO_MEMORY;
    if (rc == MC_OK) {
        mc_checkpoint_desc d = {0};
        d.dir = t->a.save, d.ps = &t->ps, d.config = &t->gpt.config;
        d.params = &t->gpt.table, d.param_data = t->gpt.params;
        d.exp_avg = m, d.exp_avg_sq = v, d.rng = &t->gpt.rng;
        d.iteration = iteration, d.consumed_samples = consumed;
        d.optimizer_step = t->opt.iteration;
        rc = mc_checkpoint_save(&d);
        if (rc != MC_OK)
            fprintf(stderr, "pretrain_gpt: saving %s failed: %s\n", t->a.save, mc_last_error());
        else if (t->ps.world->rank == 0)
            printf("saved checkpoint at iteration %8lld to %s\n", iteration, t->a.save);
    }
    free(m);
    free(v);
    return rc;
}

static int load_checkpoint(trainer *t, long long *iteration, long long *consumed) {
    size_t n = t->gpt.table.total;
    float *m = calloc(n ? n : 1, sizeof *m), *v = calloc(n ? n : 1, sizeof *v);
    mc_checkpoint_result res;
    int rc = m && v ? MC_OK : MC_ERR_NO_MEMORY;
    if (rc == MC_OK) {
        mc_checkpoint_desc d = {0};
        d.dir = t->a.load, d.ps = &t->ps, d.config = &t->gpt.config;
        d.params = &t->gpt.table, d.param_data = t->gpt.params;
        d.exp_avg = m, d.exp_avg_sq = v, d.rng = &t->gpt.rng;
        rc = mc_checkpoint_load(&d, t->a.override_math ? MC_CKPT_LOAD_IGNORE_MATH : 0u, &res);
        if (rc == MC_ERR_INVALID_DESC && t->ps.world->rank == 0)
            fprintf(stderr, "pretrain_gpt: --load %s: the checkpoint's model differs from this "
                    "one (pass --override-math-fingerprint to load it anyway)\n", t->a.load);
    }
    if (rc == MC_OK && res.optimizer_loaded) rc = scatter_optimizer_state(t, m, v);
    if (rc == MC_OK) {
        *iteration = res.iteration, *consumed = res.consumed_samples;
        t->opt.iteration = res.optimizer_step;
        t->opt.lr_steps = res.iteration;
        if (t->ps.world->rank == 0)
            printf("loaded checkpoint from %s at iteration %lld (%s%s)\n", t->a.load,
                   res.iteration, res.resharded ? "resharded to this layout" : "same layout",
                   res.math_mismatch_ignored ? "; MATH FINGERPRINT MISMATCH IGNORED" : "");
    }
    free(m);
    free(v);
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

static int train(trainer *t) {
    args *a = &t->a;
    mc_comm *world = t->ps.world;
    int me = world->rank;

    /* config: every violated rule at once */
    mc_gpt_config cfg = config_from_args(a);
    char report[4096];
    if (mc_gpt_config_validate(&cfg, report, sizeof report) > 0) {
        if (me == 0) fprintf(stderr, "pretrain_gpt: invalid configuration:\n%s", report);
        return MC_ERR_INVALID_DESC;
    }
    t->dp_size = t->ps.grid.dp, t->dp_rank = t->ps.coords.dp;

    mc_microbatch_calc mb;
    mc_microbatch_desc mbd = {0};
    mbd.global_batch_size = a->global_batch_size, mbd.micro_batch_size = a->micro_batch_size;
    mbd.data_parallel_size = t->dp_size;
    mbd.rampup.start = a->rampup[0], mbd.rampup.increment = a->rampup[1];
    mbd.rampup.samples = a->rampup[2];
    CHECK(mc_microbatch_init(&mb, &mbd));
    int max_microbatches = a->global_batch_size / (a->micro_batch_size * t->dp_size);

    mc_gpt_desc gd = {0};
    gd.config = cfg, gd.ps = &t->ps, gd.n_slots = max_microbatches > 0 ? max_microbatches : 1;
    gd.distributed_optimizer = a->use_distributed_optimizer;
    gd.bucket_size = (size_t)(a->bucket_size > 0 ? a->bucket_size : 0);
    CHECK(mc_gpt_init(&t->gpt, &gd));

    mc_ddp_desc dd = {0};
    dd.table = &t->gpt.table, dd.grads = t->gpt.grads;
    dd.dp = mc_parallel_group(&t->ps, MC_GROUP_DP_CP);
    dd.distributed_optimizer = a->use_distributed_optimizer;
    dd.overlap_grad_reduce = a->overlap_grad_reduce;
    CHECK(mc_ddp_init(&t->ddp, &dd));
    if (a->overlap_grad_reduce) t->gpt.grad_ready = grad_ready, t->gpt.grad_ready_user = &t->ddp;

    mc_optimizer_desc od = {0};
    od.ddp = &t->ddp, od.params = t->gpt.params, od.ps = &t->ps;
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

    long long iteration = 0, consumed = 0;
    if (a->load) CHECK(load_checkpoint(t, &iteration, &consumed));
    if (me == 0)
        printf("pretrain_gpt: world %d = tp %d x pp %d x dp %d%s%s; %d layers, hidden %d, heads "
               "%d, seq %d, vocab %d (padded %d); %zu parameters on rank 0\n",
               world->size, a->tp, a->pp, t->dp_size, a->vpp > 1 ? " (interleaved)" : "",
               a->sp ? " + sequence parallel" : "", a->num_layers, a->hidden_size, a->num_heads,
               a->seq_length, a->vocab_size, t->gpt.vocab_padded, t->gpt.table.total);

    mc_forward_backward_func fb = mc_get_forward_backward_func(&t->ps);
    mc_schedule_hooks hooks = {0};
    hooks.app = t, hooks.forward_step = hook_forward, hooks.backward_step = hook_backward;
    hooks.grad_sync = hook_grad_sync, hooks.finalize = hook_finalize;
    hooks.tensor_elems = t->gpt.p2p_elems;
    static mc_schedule_result result;   /* large trace: keep it off the stack */

    int skipped_iters = 0, nan_iters = 0;
    while (iteration < a->train_iters) {
        CHECK(mc_microbatch_update(&mb, consumed, 1));
        int gbs = mb.current_running_global_batch_size;
        double t0 = now_s();
        t->batch_start = consumed;
        CHECK(mc_ddp_zero_grad(&t->ddp));
        mc_gpt_zero_grad(&t->gpt);
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
        if (me == 0 && (iteration % a->log_interval == 0 || iteration == a->train_iters)) {
            log_iteration(t, iteration, consumed, ms, gbs, loss, skipped_iters, nan_iters);
            skipped_iters = nan_iters = 0;
        }
        if (a->save && a->save_interval > 0 && iteration % a->save_interval == 0)
            CHECK(save_checkpoint(t, iteration, consumed));
    }
    if (a->save && (a->save_interval <= 0 || iteration % a->save_interval != 0))
        CHECK(save_checkpoint(t, iteration, consumed));
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
    if (parsed != 0) return parsed > 0 ? 0 : 2;
    mc_comm *world = NULL;
    mc_comm_desc cd = {0};
    cd.argc = &argc, cd.argv = &argv;
    cd.timeout_s = cd.watchdog_s = timeout_s_from_args(&t.a);
    int rc = mc_comm_init_world(&world, &cd);
    if (rc != MC_OK) {
        fprintf(stderr, "pretrain_gpt: %s: %s\n", mc_err_name(rc), mc_last_error());
        return 1;
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
    return exit_code_of(rc);
}
#endif
