/* pretrain_gpt_args.h - pretrain_gpt's command line: Megatron-LM's flag names, the defaults, the
   parser and the checks that run before anything is built.

   Shared by examples/pretrain_gpt.c and `megatron_c memory` (tools/megatron_c.c), so that both
   accept the same flags and refuse a bad one with the same message. Include it after
   megatron_c.h; everything here is static. Messages start with `args_prog` ("pretrain_gpt"
   unless the includer sets another name). */
#ifndef PRETRAIN_GPT_ARGS_H
#define PRETRAIN_GPT_ARGS_H

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define ARGS_MAYBE_UNUSED __attribute__((unused))   /* an includer may use only some helpers */
#else
#define ARGS_MAYBE_UNUSED
#endif

static const char *args_prog = "pretrain_gpt";

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
    int bf16, cpu, profile;     /* --bf16; --cpu (a GPU build trains on the CPU); --profile */
    int timeout_minutes;        /* --distributed-timeout-minutes (Megatron's, default 10) */
    float timeout_seconds;      /* --distributed-timeout-seconds: overrides the minutes */
} args;

/* The flag list (without the usage line). */
static void usage_flags(FILE *f) {
    fprintf(f,
        "  parallelism: --tensor-model-parallel-size T --pipeline-model-parallel-size P\n"
        "               --virtual-pipeline-model-parallel-size V --sequence-parallel\n"
        "               --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size N\n"
        "  model:       --num-layers L --hidden-size H --num-attention-heads A\n"
        "               --ffn-hidden-size F --seq-length S --max-position-embeddings M\n"
        "               --vocab-size V --make-vocab-size-divisible-by D\n"
        "               --hidden-dropout p --attention-dropout p\n"
        "               --untie-embeddings-and-output-weights --bf16\n"
        "  batch:       --micro-batch-size B --global-batch-size G\n"
        "               --rampup-batch-size START INCR SAMPLES\n"
        "  training:    --train-iters N --lr X --min-lr X --lr-warmup-iters N\n"
        "               --lr-decay-iters N --weight-decay X --clip-grad X --seed N\n"
        "  recompute:   --recompute-granularity full|selective --recompute-method uniform|block\n"
        "               --recompute-num-layers N\n"
        "  checkpoints: --save DIR --load DIR --save-interval N --override-math-fingerprint\n"
        "  data/log:    --data-path FILE --log-interval N\n"
        "  device:      --cpu (train on the CPU although a GPU is there) --profile (per-step\n"
        "               breakdown timed with CUDA events)\n"
        "  watchdog:    --distributed-timeout-minutes N (default 10) or\n"
        "               --distributed-timeout-seconds S: a rank that makes no progress for\n"
        "               that long stops every rank with a message naming it\n"
        "A flag given twice keeps its last value (as Megatron's argparse) and says so. Every\n"
        "rank must get the same flags: the ranks compare them before anything else and stop\n"
        "naming the first one that differs.\n");
}

ARGS_MAYBE_UNUSED static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np N ./pretrain_gpt [flags]\n");
    usage_flags(f);
}

/* A whole decimal integer that fits an int. Out-of-range values are named as such. */
static int parse_int(const char *flag, const char *v, int *out) {
    char *end;
    long long x;
    errno = 0;
    x = strtoll(v, &end, 10);
    if (*end || end == v) {
        fprintf(stderr, "%s: %s expects an integer, got \"%s\"\n", args_prog, flag, v);
        return -1;
    }
    if (errno == ERANGE || x < INT_MIN || x > INT_MAX) {
        fprintf(stderr, "%s: %s value %s is out of range (an int holds %d .. %d)\n", args_prog,
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
        fprintf(stderr, "%s: %s expects a finite decimal number such as 1e-3, got \"%s\"\n",
                args_prog, flag, v);
        return -1;
    }
    if (errno == ERANGE && fabs(x) > 1.0) x = HUGE_VAL;
    if (!isfinite(x) || !isfinite((float)x)) {
        fprintf(stderr, "%s: %s value %s is out of range (a float holds up to %g)\n", args_prog,
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
    A("--bf16", A_FLAG, bf16),
    A("--cpu", A_FLAG, cpu),
    A("--profile", A_FLAG, profile),
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
    do { if (!(ok)) { fprintf(stderr, "%s: ", args_prog); fprintf(stderr, __VA_ARGS__); \
                      fputc('\n', stderr); bad++; } } while (0)
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

/* What parse_args returns. On ARGS_ERROR and ARGS_UNKNOWN the message is already printed;
   on ARGS_HELP and after ARGS_UNKNOWN the caller shows its usage. */
enum { ARGS_OK = 0, ARGS_HELP = 1, ARGS_ERROR = -1, ARGS_UNKNOWN = -2 };

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
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return ARGS_HELP;
        for (int k = 0; k < N_ARG_SPECS; k++)
            if (!strcmp(argv[i], arg_specs[k].name)) s = &arg_specs[k];
        if (!s) {
            fprintf(stderr, "%s: unknown flag \"%s\"\n", args_prog, argv[i]);
            return ARGS_UNKNOWN;
        }
        /* As Megatron's argparse, the last value counts (scripts append overrides to a base
           command line), but not silently: the note names the flag and the value kept. */
        if (seen[s - arg_specs]++ && note_repeats) {
            int n_values = s->kind == A_FLAG ? 0 : s->kind == A_INT3 ? 3 : 1;
            fprintf(stderr, "%s: note: %s is given more than once; the last one counts%s%s\n",
                    args_prog, s->name, n_values && i + 1 < argc ? ": " : "",
                    n_values && i + 1 < argc ? argv[i + 1] : "");
        }
        char *field = (char *)a + s->offset;
        int need = s->kind == A_FLAG ? 0 : s->kind == A_INT3 ? 3 : 1;
        if (i + need >= argc + (need == 0)) {
            fprintf(stderr, "%s: %s needs %d value(s)\n", args_prog, s->name, need);
            return ARGS_ERROR;
        }
        switch (s->kind) {
        case A_FLAG: *(int *)field = 1; break;
        case A_STR: *(const char **)field = argv[++i]; break;
        case A_INT: if (parse_int(s->name, argv[++i], (int *)field)) return ARGS_ERROR; break;
        case A_FLOAT: if (parse_float(s->name, argv[++i], (float *)field)) return ARGS_ERROR; break;
        case A_INT3:
            for (int k = 0; k < 3; k++)
                if (parse_int(s->name, argv[++i], (int *)field + k)) return ARGS_ERROR;
            break;
        case A_RECOMPUTE_G: {
            const char *v = argv[++i];
            if (!strcmp(v, "full")) *(int *)field = MC_RECOMPUTE_FULL;
            else if (!strcmp(v, "selective")) *(int *)field = MC_RECOMPUTE_SELECTIVE;
            else { fprintf(stderr, "%s: %s must be full or selective, got \"%s\"\n",
                           args_prog, s->name, v); return ARGS_ERROR; }
            break;
        }
        case A_RECOMPUTE_M: {
            const char *v = argv[++i];
            if (!strcmp(v, "uniform")) *(int *)field = MC_RECOMPUTE_UNIFORM;
            else if (!strcmp(v, "block")) *(int *)field = MC_RECOMPUTE_BLOCK;
            else { fprintf(stderr, "%s: %s must be uniform or block, got \"%s\"\n",
                           args_prog, s->name, v); return ARGS_ERROR; }
            break;
        }
        }
    }
    if (check_args(a) > 0) return ARGS_ERROR;
    if (a->max_positions == 0) a->max_positions = a->seq_length;
    /* Megatron's --hidden-dropout 0 switches dropout off; in mc_gpt_config 0 means default. */
    if (a->hidden_dropout == 0.0f) a->hidden_dropout = MC_DROPOUT_OFF;
    if (a->attention_dropout == 0.0f) a->attention_dropout = MC_DROPOUT_OFF;
    if (a->data_path) a->vocab_size = 256;   /* byte-level tokens */
    return ARGS_OK;
}

ARGS_MAYBE_UNUSED static mc_gpt_config config_from_args(const args *a) {
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

/* Every violated config rule at once, one line each, to err (NULL: silent). Returns the number
   of violations (0: valid). */
ARGS_MAYBE_UNUSED static int args_check_config(const args *a, FILE *err) {
    mc_gpt_config cfg = config_from_args(a);
    char report[4096];
    int violations = mc_gpt_config_validate(&cfg, report, sizeof report);
    if (violations > 0 && err) fprintf(err, "%s: invalid configuration:\n%s", args_prog, report);
    return violations;
}

/* The micro-batch calculator of a run with `dp` data-parallel ranks; a refusal is printed to err
   (NULL: silent) with Megatron's rule. */
ARGS_MAYBE_UNUSED static int args_microbatches(const args *a, int dp, mc_microbatch_calc *mb, FILE *err) {
    mc_microbatch_desc d;
    memset(&d, 0, sizeof d);
    d.global_batch_size = a->global_batch_size, d.micro_batch_size = a->micro_batch_size;
    d.data_parallel_size = dp;
    d.rampup.start = a->rampup[0], d.rampup.increment = a->rampup[1];
    d.rampup.samples = a->rampup[2];
    int rc = mc_microbatch_init(mb, &d);
    if (rc != MC_OK && err)
        fprintf(err, "%s: invalid batch: %s: %s\n", args_prog, mc_err_name(rc), mc_last_error());
    return rc;
}

/* The largest number of micro-batches per DP rank (the final global batch, ramp-up included). */
ARGS_MAYBE_UNUSED static int args_max_microbatches(const args *a, int dp) {
    int m = a->global_batch_size / (a->micro_batch_size * dp);
    return m > 0 ? m : 1;
}

/* Activation slots of the model on pipeline stage pp_rank: the most micro-batches one of its
   chunks holds at once under the schedule (1F1B: min(pp - r, M)), not one per micro-batch. */
ARGS_MAYBE_UNUSED static int args_n_slots(const args *a, int dp, int pp_rank) {
    mc_schedule_desc d;
    memset(&d, 0, sizeof d);
    d.pp = a->pp, d.pp_rank = pp_rank, d.num_microbatches = args_max_microbatches(a, dp);
    d.vpp = a->vpp > 1 ? a->vpp : 0;
    int n = mc_schedule_max_in_flight(&d, NULL);
    return n > 0 ? n : 1;
}

/* What mc_memory_estimate needs to know about this run. */
ARGS_MAYBE_UNUSED static mc_memory_desc args_memory_desc(const args *a, int dp) {
    mc_memory_desc d;
    memset(&d, 0, sizeof d);
    d.config = config_from_args(a);
    d.data_parallel_size = dp;
    d.num_microbatches = args_max_microbatches(a, dp);
    d.n_slots = 0;   /* per stage: args_n_slots, what pretrain_gpt passes */
    d.distributed_optimizer = a->use_distributed_optimizer;
    d.bf16 = a->bf16;
    d.bucket_size = (size_t)(a->bucket_size > 0 ? a->bucket_size : 0);
    return d;
}

#endif /* PRETRAIN_GPT_ARGS_H */
