/* labs/lab12.c - M012: stating a version boundary, from what this build and this machine did.

       make lab12 && mpirun --oversubscribe -np 4 ./lab12      (as root add --allow-run-as-root)

   A version statement is only as good as its evidence. The lab collects that evidence on the
   ranks it is started with (every rank takes part; rank 0 prints; the driver, lab_driver.h,
   does the answer sheet, the results and the grading):

     A. probe: the library version (mc_version_string against the header's MC_VERSION_*), the
        git commit the Makefile embedded at build time (and whether the checkout still is at
        it), the Megatron-LM source the library reproduces (MC_MEGATRON_*), the compiler and
        build options, the MPI library (mpi.h against MPI_Get_library_version), CUDA / NCCL /
        GPU / CPU through mc_backend_query, and that every rank reports the same build;
     B. smoke runs: the same tiny GPT trains a few steps in each feature's layout on the
        library's own paths (mc_parallel_init, mc_gpt_init, the schedules, DDP, the optimizer,
        checkpoints) and every loss is compared with one single-rank run of the same model
        and data (rank 0 alone, no parallelism): TP, SP, PP 1F1B, interleaved, DP, the
        distributed optimizer, full and selective recompute (also bit for bit against the same
        layout without recompute), a checkpoint saved at TP x PP and loaded at DP only, bf16
        storage (within bf16's tolerance); the CP and EP rank grids against the mixed-radix
        formula and an all-reduce in each group; the CUDA op table (rank 0, one GPU, against
        the CPU reference) and the NCCL world when they exist; each step is timed;
     C. rules that differ between Megatron versions, as this build applies them: interleaving
        at PP = 2, the batch-size ramp-up against the step schedule that replaced it, which
        RNG stream SP dropout draws from, the GQA refusal;
     D. the matrix: feature x {implemented, exercised here, measured here}, each row with what
        was compared or why it was not run, and the follow-up's three features (from the
        nonce).

   Worlds: 4 ranks by default (the smallest world with a TP x PP layout next to a DP of 2, and
   interleaving at PP = 2, which older Megatron refused; all within 2 minutes on 2 cores), or
   8 (every DP doubles). Others, and layout flags, are refused: the lab picks each smoke
   run's layout itself. Dropout is off in the smoke runs (so every layout computes the
   reference's function); C switches it on for one forward. */
#include "lab_driver.h"

#include <ctype.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define LAB12_N_VARIANTS 3
#define LAB12_LAYERS 4
#define LAB12_HIDDEN 32
#define LAB12_HEADS 4
#define LAB12_FFN 128
#define LAB12_SEQ 16
#define LAB12_VOCAB 128            /* pads to 128 at TP 1 and 2: every layout, one function */
#define LAB12_MBS 2
#define LAB12_GBS 16               /* samples per step, whatever the layout */
#define LAB12_STEPS 3              /* steps of a smoke run */
#define LAB12_REF_STEPS 4          /* the reference: the smoke steps, and the reshard's */
#define LAB12_SAVE_AT 2            /* the reshard run saves after this step */
#define LAB12_LR 3e-3f
#define LAB12_SEED 1234
#define LAB12_RTOL 1e-5            /* fp32 layouts: only summation orders differ */
#define LAB12_BF16_RTOL 1e-2       /* bf16 (8 mantissa bits, 2^-8 = 4e-3 a value) vs fp32 */
#define LAB12_CUDA_RTOL 1e-4       /* the CUDA table against the CPU table (no TF32) */
#define LAB12_DROPOUT 0.1f
#define LAB12_MAX_RUNS 16
#define LAB12_TEXT 256

/* ---------------------------------------------------------------------------------------------
   The features of the matrix */

enum {
    F_TP, F_SP, F_PP, F_VPP, F_DP, F_DISTOPT, F_RC_FULL, F_RC_SEL, F_RESHARD, F_BF16, F_CP_GRID,
    F_EP_GRID, F_BATCH, F_CUDA, F_NCCL, F_GPU_PERF, F_CP_ATTN, F_MOE, F_FP8, F_FSDP, F_PP_LAYOUT,
    F_GQA, F_COUNT
};

typedef struct lab12_feature {
    const char *id;                /* the key in the results and the answer sheet */
    const char *name;
    const char *megatron;          /* what it is in Megatron-Core */
    const char *absent;            /* not in megatron_c at all: why (NULL when it is) */
} lab12_feature;

static const lab12_feature lab12_features[F_COUNT] = {
    {"tp", "tensor parallel", "--tensor-model-parallel-size: Column/RowParallelLinear", NULL},
    {"sp", "sequence parallel", "--sequence-parallel", NULL},
    {"pp_1f1b", "pipeline 1F1B", "forward_backward_pipelining_without_interleaving", NULL},
    {"pp_interleaved", "interleaved 1F1B", "--num-layers-per-virtual-pipeline-stage", NULL},
    {"dp", "data parallel (DDP buckets)", "DistributedDataParallel", NULL},
    {"dist_optimizer", "distributed optimizer", "--use-distributed-optimizer", NULL},
    {"recompute_full", "full recompute", "--recompute-granularity full", NULL},
    {"recompute_selective", "selective recompute", "--recompute-granularity selective", NULL},
    {"ckpt_reshard", "checkpoint reshard", "dist_checkpointing (load under another layout)",
     NULL},
    {"bf16", "bf16 storage", "--bf16 (fp32 main params)", NULL},
    {"cp_grid", "CP rank grid", "--context-parallel-size groups", NULL},
    {"ep_grid", "EP rank grid", "--expert-model-parallel-size groups", NULL},
    {"batch_rampup", "batch-size ramp-up", "--rampup-batch-size / --step-batch-size-schedule",
     NULL},
    {"cuda_ops", "CUDA op table", "the fused GPU kernels (Transformer Engine's role)", NULL},
    {"nccl", "NCCL backend", "torch.distributed NCCL process groups", NULL},
    {"gpu_throughput", "GPU step time", "throughput on the GPU", NULL},
    {"cp_attention", "context-parallel attention", "--context-parallel-size (ring attention)",
     "mc_gpt_config has no context_parallel_size: the model never splits the sequence over CP "
     "ranks (only the CP grid and its groups exist)"},
    {"moe", "MoE layers", "--num-experts, token dispatchers, grouped GEMM",
     "no router, experts or token dispatcher: the EP groups exist, no layer uses them"},
    {"fp8", "FP8", "--fp8-format (Transformer Engine)",
     "mc_dtype has no FP8 type (F32, F64, I32, I64, U8, BF16) and there is no Transformer Engine"},
    {"fsdp", "Megatron-FSDP", "--use-megatron-fsdp",
     "parameters are sharded only by TP / PP and, in the optimizer, by the distributed "
     "optimizer"},
    {"pp_layout", "custom pipeline layout", "--pipeline-model-parallel-layout",
     "every chunk builds num_layers / (PP x VPP) layers; there is no layout string"},
    {"gqa", "grouped-query attention", "--group-query-attention --num-query-groups",
     "only num_query_groups == heads: the validator refuses fewer query groups"},
};

/* The follow-up asks about three features: two that ran here and one that cannot. */
static const int lab12_variant_features[LAB12_N_VARIANTS][3] = {
    {F_VPP, F_DISTOPT, F_FP8}, {F_SP, F_RESHARD, F_MOE}, {F_RC_SEL, F_BF16, F_CP_ATTN}};

typedef struct lab12_status {
    const char *implemented;       /* "yes", "partial", "no", "not built", "unknown" */
    int exercised;                 /* ran here and its check held */
    int measured;                  /* ... and was timed here */
    double ms;                     /* median step (or call) time, when measured */
    char check[LAB12_TEXT];        /* what it was compared with, and how it came out */
    char reason[LAB12_TEXT];       /* why it was not exercised or not measured */
} lab12_status;

/* ---------------------------------------------------------------------------------------------
   State */

typedef struct lab12_run {
    int ran;
    int status;                    /* MC_OK, or the library's refusal */
    char layout[96];
    int tp, pp, vpp, dp, m;
    int n_loss;
    double loss[LAB12_REF_STEPS];
    double ms[LAB12_REF_STEPS];
    double median_ms;
    double max_rel_diff;           /* against the reference, same iterations */
    int ok;                        /* its check held */
    char message[LAB12_TEXT];
} lab12_run;

typedef struct lab12_grid_check {
    int tp, cp, ep, dp, edp;
    int groups_match;              /* every group of the kinds below equals the formula's */
    int sums_match;                /* an all-reduce of world ranks in this rank's groups */
    char first_group[64];          /* e.g. the CP group of rank 0 */
    char kinds[64];
} lab12_grid_check;

typedef struct lab12_state {
    /* A */
    char header_version[16], checkout_commit[48], mpi_header[48], mpi_runtime[32];
    char compiler[16], compiler_version[48], c_standard[8], options[160];
    int version_matches, mpi_matches, ranks_agree, n_builds;
    int cpu_ops, cuda_ops_present, cuda_ops_total;   /* numeric slots of the op tables */
    int gpus_used;
    char hardware[LAB12_TEXT];
    /* B */
    mc_comm *smoke_world;          /* the world, or a CPU world beside an incomplete CUDA one */
    int own_smoke_world;
    char smoke_device[8];
    lab12_run ref, runs[LAB12_MAX_RUNS];
    int n_runs;
    int run_of[F_COUNT];           /* feature -> index in runs, -1 */
    int tp_pp;                     /* index of the TP x PP run without recompute */
    int rc_bitwise[2];             /* full, selective: losses equal bit for bit */
    double rc_rel[2];              /* full, selective: max |rel diff| of the losses */
    int rc_held[2];                /* bit for bit on the CPU; within LAB12_RTOL on a device,
                                      whose backward kernels sum with atomics (run to run,
                                      one layout differs in the last bits there) */
    int reshard_resharded, reshard_saved_tp, reshard_saved_pp;
    char ckpt_dir[512];
    lab12_grid_check cp, ep;
    lab12_run cuda;                /* the single-rank run on the CUDA table */
    double nccl_ms;
    int nccl_ok;
    char cuda_note[LAB12_TEXT];
    /* C */
    int interleaved_pp2_accepted;
    int rampup_accepted, rampup_matches_step, rampup_matches_formula, rampup_rows;
    char step_schedule[128];
    char sp_stream[32], no_sp_stream[32];
    int sp_rule_ok;
    int gqa_refused;
    char gqa_message[LAB12_TEXT];
    int bf16_tp_status;            /* a bf16 forward at TP2 on the smoke world */
    char bf16_tp_message[LAB12_TEXT];
    /* D */
    lab12_status st[F_COUNT];
} lab12_state;

static const char *lab12_level(const lab12_status *s) {
    if (s->measured) return "measured";
    if (s->exercised) return "exercised";
    if (strcmp(s->implemented, "no") == 0) return "absent";
    if (strcmp(s->implemented, "not built") == 0) return "not_built";
    return "implemented";
}

static double lab12_median(const double *v, int n) {
    double tmp[LAB12_REF_STEPS];
    for (int i = 0; i < n; i++) tmp[i] = v[i];
    return n > 0 ? lab_median(tmp, n) : 0.0;
}

/* ---------------------------------------------------------------------------------------------
   A. probe */

/* The first "x.y[.z]" in text, or "". */
static void lab12_first_version(const char *text, char *out, size_t cap) {
    out[0] = '\0';
    for (const char *p = text; *p; p++) {
        if (!isdigit((unsigned char)*p) || (p > text && (isalnum((unsigned char)p[-1]) ||
                                                        p[-1] == '.')))
            continue;
        const char *q = p;
        int dots = 0;
        while (isdigit((unsigned char)*q) || (*q == '.' && isdigit((unsigned char)q[1])))
            dots += *q++ == '.';
        if (dots >= 1) {
            snprintf(out, cap, "%.*s", (int)(q - p), p);
            return;
        }
        p = q - 1;
    }
}

static void lab12_compiler(lab12_state *st) {
#if defined(__clang__)
    snprintf(st->compiler, sizeof st->compiler, "clang");
    snprintf(st->compiler_version, sizeof st->compiler_version, "%d.%d.%d", __clang_major__,
             __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
    snprintf(st->compiler, sizeof st->compiler, "gcc");
    snprintf(st->compiler_version, sizeof st->compiler_version, "%d.%d.%d", __GNUC__,
             __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
    snprintf(st->compiler, sizeof st->compiler, "unknown");
    snprintf(st->compiler_version, sizeof st->compiler_version, "unknown");
#endif
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201710L
    snprintf(st->c_standard, sizeof st->c_standard, "C17");
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
    snprintf(st->c_standard, sizeof st->c_standard, "C11");
#else
    snprintf(st->c_standard, sizeof st->c_standard, "C99");
#endif
    static const struct { const char *name; int on; } opts[] = {
        {"MC_COMM_MPI",
#if defined(MC_COMM_MPI)
         1},
#else
         0},
#endif
        {"MC_ENABLE_CUDA",
#if defined(MC_ENABLE_CUDA)
         1},
#else
         0},
#endif
        {"MC_FAULT_HOOKS",
#if defined(MC_FAULT_HOOKS)
         1},
#else
         0},
#endif
        {"MC_USE_CBLAS",
#if defined(MC_USE_CBLAS)
         1},
#else
         0},
#endif
        {"optimized",
#if defined(__OPTIMIZE__)
         1},
#else
         0},
#endif
    };
    st->options[0] = '\0';
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (opts[i].on)
            snprintf(st->options + strlen(st->options), sizeof st->options - strlen(st->options),
                     "%s%s", st->options[0] ? " " : "", opts[i].name);
}

static void lab12_mpi_header(lab12_state *st) {
#if defined(OMPI_MAJOR_VERSION)
    snprintf(st->mpi_header, sizeof st->mpi_header, "%d.%d.%d", OMPI_MAJOR_VERSION,
             OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#elif defined(MPICH_VERSION)
    snprintf(st->mpi_header, sizeof st->mpi_header, "%s", MPICH_VERSION);
#else
    snprintf(st->mpi_header, sizeof st->mpi_header, "unknown");
#endif
}

/* git rev-parse HEAD in the current directory (rank 0): where the checkout is now. */
static void lab12_checkout_commit(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *p = popen("git rev-parse HEAD 2>/dev/null", "r");
    if (p == NULL) return;
    char line[128] = "";
    if (fgets(line, sizeof line, p) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (strlen(line) == 40 && strspn(line, "0123456789abcdef") == 40)
            snprintf(out, cap, "%s", line);
    }
    pclose(p);
}

/* The numeric ops of a table that are present (the memory ops are not counted). */
static int lab12_numeric_ops(const mc_ops *o, int *total) {
    const void *slots[] = {
        (const void *)o->fill,               (const void *)o->copy,
        (const void *)o->axpy,               (const void *)o->scale,
        (const void *)o->sum_squares,        (const void *)o->gemm,
        (const void *)o->bias_backward,      (const void *)o->layernorm_forward,
        (const void *)o->layernorm_backward, (const void *)o->gelu_forward,
        (const void *)o->gelu_backward,      (const void *)o->attention_stats,
        (const void *)o->attention_forward,  (const void *)o->attention_backward,
        (const void *)o->dropout_forward,    (const void *)o->dropout_backward,
        (const void *)o->check_ids,          (const void *)o->embedding_forward,
        (const void *)o->embedding_backward, (const void *)o->row_max,
        (const void *)o->target_logit,       (const void *)o->sum_exp,
        (const void *)o->row_sum,            (const void *)o->cross_entropy_loss,
        (const void *)o->cross_entropy_backward, (const void *)o->adamw};
    int n = (int)(sizeof slots / sizeof slots[0]), present = 0;
    for (int i = 0; i < n; i++) present += slots[i] != NULL;
    *total = n;
    return present;
}

static uint32_t lab12_fnv(uint32_t h, const char *s) {
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return (h ^ 0xff) * 16777619u;
}

static int lab12_probe(lab_ctx *cx) {
    lab12_state *st = cx->state;
    const mc_backend_info *b = &cx->backend;
    lab_heading(cx, "A. Probe: this build and this machine");
    snprintf(st->header_version, sizeof st->header_version, "%d.%d.%d", MC_VERSION_MAJOR,
             MC_VERSION_MINOR, MC_VERSION_PATCH);
    st->version_matches = strcmp(st->header_version, mc_version_string()) == 0;
    lab12_compiler(st);
    lab12_mpi_header(st);
    lab12_first_version(b->mpi_library, st->mpi_runtime, sizeof st->mpi_runtime);
    st->mpi_matches = strcmp(st->mpi_header, st->mpi_runtime) == 0;
    if (cx->me == 0) lab12_checkout_commit(st->checkout_commit, sizeof st->checkout_commit);
    MC_CHECK(lab_broadcast_bytes(cx->world, st->checkout_commit, sizeof st->checkout_commit, 0));
    int total = 0;
    st->cpu_ops = lab12_numeric_ops(mc_ops_cpu(), &total);
    st->cuda_ops_total = total;

    /* every rank: the same build, libraries and machine kind? */
    uint32_t h = 2166136261u;
    const char *parts[] = {mc_version_string(), lab_build_commit(), st->compiler_version,
                           b->mpi_library, b->cpu_name, b->gpu_name, b->cuda_runtime,
                           b->nccl_version};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) h = lab12_fnv(h, parts[i]);
    int mine = (int)(h & 0x7fffffff);
    int *all = lab_xcalloc((size_t)cx->world_size, sizeof(int));
    MC_CHECK(lab_all_gather_i32(cx->world, &mine, all, 1));
    st->n_builds = 1;
    for (int r = 1; r < cx->world_size; r++) {
        int seen = 0;
        for (int q = 0; q < r && !seen; q++) seen = all[q] == all[r];
        st->n_builds += !seen;
    }
    free(all);
    st->ranks_agree = st->n_builds == 1;

    const char *commit = lab_build_commit();
    int commit_known = strcmp(commit, "unknown") != 0;
    int dirty = lab_build_dirty();
    lab_printf0("library      megatron_c %s (header %s), commit %s%s\n", mc_version_string(),
                st->header_version, commit_known ? commit : "unknown (built outside a git "
                "checkout: quote the release tarball's name instead)",
                dirty == 1 ? " with uncommitted changes" : "");
    if (commit_known && strcmp(st->checkout_commit, "unknown") != 0 &&
        strcmp(st->checkout_commit, commit) != 0)
        lab_printf0("             the checkout is now at %.12s: this binary is older (make lab12 "
                    "rebuilds it)\n", st->checkout_commit);
    lab_printf0("reproduces   Megatron-LM %.8s (%s, megatron.core %s); ramp-up as in %s\n",
                MC_MEGATRON_COMMIT, MC_MEGATRON_DESCRIBE, MC_MEGATRON_PACKAGE,
                MC_MEGATRON_RAMPUP_TAG);
    lab_printf0("compiler     %s %s, %s; options %s\n", st->compiler, st->compiler_version,
                st->c_standard, st->options);
    lab_printf0("MPI          %s (MPI standard %s); mpi.h says %s\n", b->mpi_library,
                b->mpi_version, st->mpi_header);
    if (b->cuda_built)
        lab_printf0("CUDA         runtime %s, driver %s, NCCL %s\n",
                    b->cuda_runtime[0] ? b->cuda_runtime : "-",
                    b->cuda_driver[0] ? b->cuda_driver : "-",
                    b->nccl_version[0] ? b->nccl_version : "-");
    else
        lab_printf0("CUDA         not in this build (make cuda builds megatron_c_cuda.cu with "
                    "nvcc)\n");
    lab_printf0("devices      %d GPU%s visible%s%s; CPU %s, %d processors\n", b->gpu_count,
                b->gpu_count == 1 ? "" : "s", b->gpu_count ? ": " : "", b->gpu_name,
                b->cpu_name[0] ? b->cpu_name : "unknown", b->cpu_count);
    lab_printf0("world        %d ranks, backend %s (%s)\n", cx->world_size, b->backend,
                b->backend_reason);
    lab_printf0("op tables    cpu: %d of %d numeric ops\n", st->cpu_ops, st->cuda_ops_total);

    lab_check(cx, st->version_matches, "mc_version_string() %s equals the header's "
              "MC_VERSION_* %s", mc_version_string(), st->header_version);
    lab_check(cx, !commit_known || (strlen(commit) == 40 && strspn(commit, "0123456789abcdef") ==
                                                              40),
              "the embedded commit is 40 hex digits or \"unknown\" (%s)", commit);
    lab_check(cx, st->mpi_matches, "the MPI library at run time (%s) is the one mpi.h was "
              "compiled against (%s)", st->mpi_runtime, st->mpi_header);
    lab_check(cx, st->ranks_agree, "every rank reports the same build, libraries and "
              "machine kind (%d distinct)", st->n_builds);
    lab_check(cx, st->cpu_ops == st->cuda_ops_total, "the CPU table has every numeric op (%d "
              "of %d)", st->cpu_ops, st->cuda_ops_total);
    lab_printf0("compared with: the header's version macros; the commit's form; mpi.h's "
                "version; the other ranks' reports; the op-table contract\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   B. smoke runs: a trainer on the library's paths */

typedef struct lab12_layout {
    int tp, pp, vpp, sp, dist_opt;
    mc_recompute_granularity recompute;
    mc_dtype dtype;
    float dropout;                 /* 0: off */
} lab12_layout;

typedef struct lab12_trainer {
    mc_parallel_state ps;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int have_ps, have_gpt, have_ddp, have_opt;
    int dp, dp_rank, n_micro, sp;
    long long consumed, iteration;
    int tokens[LAB12_SEQ * LAB12_MBS], labels[LAB12_SEQ * LAB12_MBS];   /* [S, B] */
} lab12_trainer;

static mc_schedule_result lab12_sched;   /* large trace: off the stack */

static mc_gpt_config lab12_config(const lab12_layout *L) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = LAB12_LAYERS;
    c.hidden_size = LAB12_HIDDEN;
    c.num_attention_heads = LAB12_HEADS;
    c.ffn_hidden_size = LAB12_FFN;
    c.vocab_size = LAB12_VOCAB;
    c.make_vocab_size_divisible_by = 32;
    c.seq_length = LAB12_SEQ;
    c.max_position_embeddings = LAB12_SEQ;
    c.hidden_dropout = L->dropout > 0 ? L->dropout : MC_DROPOUT_OFF;
    c.attention_dropout = L->dropout > 0 ? L->dropout : MC_DROPOUT_OFF;
    c.tensor_model_parallel_size = L->tp;
    c.pipeline_model_parallel_size = L->pp;
    c.virtual_pipeline_model_parallel_size = L->vpp;
    c.sequence_parallel = L->sp;
    c.recompute_granularity = L->recompute;
    if (L->recompute == MC_RECOMPUTE_FULL) {
        c.recompute_method = MC_RECOMPUTE_UNIFORM;
        c.recompute_num_layers = 1;
    }
    c.micro_batch_size = LAB12_MBS;
    c.seed = LAB12_SEED;
    return c;
}

/* Sample k: seq + 1 tokens of a noisy affine chain drawn from (seed, k) alone, so every
   layout reads the same sample for the same k. */
static void lab12_sample(long long k, int *out /* [seq + 1] */) {
    uint64_t at = (uint64_t)k * 64u;
    out[0] = (int)(mc_rng_bits_at(LAB12_SEED, at) % LAB12_VOCAB);
    for (int t = 1; t <= LAB12_SEQ; t++) {
        uint32_t r = mc_rng_bits_at(LAB12_SEED, at + (uint64_t)t);
        out[t] = r % 5 == 0 ? (int)(r / 5 % LAB12_VOCAB) : (out[t - 1] * 7 + 3) % LAB12_VOCAB;
    }
}

/* Micro-batch mb of DP rank d holds samples consumed + (mb x DP + d) x B + j (Megatron's
   sampler), [S, B] with the sequence first. */
static void lab12_load(lab12_trainer *t, int mb) {
    int seq[LAB12_SEQ + 1];
    for (int j = 0; j < LAB12_MBS; j++) {
        lab12_sample(t->consumed + ((long long)mb * t->dp + t->dp_rank) * LAB12_MBS + j, seq);
        for (int s = 0; s < LAB12_SEQ; s++) {
            t->tokens[s * LAB12_MBS + j] = seq[s];
            t->labels[s * LAB12_MBS + j] = seq[s + 1];
        }
    }
}

static int lab12_hook_forward(void *app, int chunk, int mb, const float *input, float **output,
                              double *loss_sum, double *num_tokens) {
    lab12_trainer *t = app;
    lab12_load(t, mb);
    return mc_gpt_forward_step(&t->gpt, chunk, mb, t->tokens, t->labels, input, output, loss_sum,
                               num_tokens);
}

static int lab12_hook_backward(void *app, int chunk, int mb, const float *output_grad,
                               float loss_scale, float **input_grad) {
    lab12_trainer *t = app;
    return mc_gpt_backward_step(&t->gpt, chunk, mb, output_grad, loss_scale, input_grad);
}

static void lab12_hook_grad_sync(void *app, int chunk, int enable) {
    lab12_trainer *t = app;
    mc_gpt_set_grad_sync(&t->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&t->ddp, chunk, enable);
}

static int lab12_hook_finalize(void *app) {
    lab12_trainer *t = app;
    return mc_finalize_model_grads(&t->ps, &t->ddp, NULL, NULL, t->sp, NULL);
}

static void lab12_trainer_destroy(lab12_trainer *t) {
    if (t->have_opt) mc_optimizer_destroy(&t->opt);
    if (t->have_ddp) MC_CHECK(mc_ddp_destroy(&t->ddp));
    if (t->have_gpt) mc_gpt_destroy(&t->gpt);
    if (t->have_ps) MC_CHECK(mc_parallel_destroy(&t->ps));
    t->have_opt = t->have_ddp = t->have_gpt = t->have_ps = 0;
}

/* Parallel state, model, DDP and AdamW for layout L on `world`, in the world's memory (the
   CPU's, or the rank's GPU). Returns mc_gpt_init's status: a table the model cannot run on
   is refused there (nothing else is left set up but the parallel state, destroyed too). */
static int lab12_trainer_init(lab12_trainer *t, mc_comm *world, const lab12_layout *L) {
    memset(t, 0, sizeof *t);
    MC_CHECK(mc_parallel_init(&t->ps, &(mc_parallel_desc){
                                          .world = world,
                                          .grid = {.tp = L->tp, .pp = L->pp, .vpp = L->vpp}}));
    t->have_ps = 1;
    t->dp = t->ps.grid.dp;
    t->dp_rank = t->ps.coords.dp;
    t->n_micro = LAB12_GBS / (LAB12_MBS * t->dp);
    t->sp = L->sp;
    mc_gpt_config cfg = lab12_config(L);
    int rc = mc_gpt_init(&t->gpt, &(mc_gpt_desc){.config = cfg,
                                                 .ps = &t->ps,
                                                 .ops = mc_comm_memory(world),
                                                 .dtype = L->dtype,
                                                 .n_slots = t->n_micro,
                                                 .distributed_optimizer = L->dist_opt});
    if (rc != MC_OK) {
        lab12_trainer_destroy(t);
        return rc;
    }
    t->have_gpt = 1;
    MC_CHECK(mc_ddp_init(&t->ddp, &(mc_ddp_desc){.table = &t->gpt.table,
                                                 .grads = t->gpt.grads,
                                                 .dp = mc_parallel_group(&t->ps, MC_GROUP_DP_CP),
                                                 .distributed_optimizer = L->dist_opt,
                                                 .ops = t->gpt.ops}));
    t->have_ddp = 1;
    MC_CHECK(mc_optimizer_init(&t->opt, &(mc_optimizer_desc){.ddp = &t->ddp,
                                                             .params = t->gpt.params,
                                                             .params_dtype = L->dtype,
                                                             .ps = &t->ps,
                                                             .lr = LAB12_LR,
                                                             .lr_decay_style =
                                                                 MC_LR_DECAY_CONSTANT}));
    t->have_opt = 1;
    return MC_OK;
}

/* One iteration: *loss = the lm loss of its global batch (before the update), *ms = the
   slowest rank's time for it; the same on every rank of the trainer's world. */
static void lab12_step(lab12_trainer *t, double *loss, double *ms) {
    mc_schedule_hooks hooks = {.app = t,
                               .forward_step = lab12_hook_forward,
                               .backward_step = lab12_hook_backward,
                               .grad_sync = lab12_hook_grad_sync,
                               .finalize = lab12_hook_finalize,
                               .tensor_elems = t->gpt.p2p_elems,
                               .tensor_dtype = t->gpt.dtype};
    double t0 = lab_now();
    MC_CHECK(mc_ddp_zero_grad(&t->ddp));
    MC_CHECK(mc_gpt_zero_grad(&t->gpt));
    MC_CHECK(mc_get_forward_backward_func(&t->ps)(&t->ps, &hooks, t->n_micro, 0, &lab12_sched));
    MC_CHECK(mc_optimizer_step(&t->opt));
    MC_CHECK(t->gpt.ops->synchronize(t->gpt.ops));
    double mine_ms = (lab_now() - t0) * 1e3;
    double mine[2] = {0.0, 0.0}, all[2];
    if (mc_parallel_is_last_stage(&t->ps, 1) && t->ps.coords.tp == 0)
        mine[0] = lab12_sched.loss_sum, mine[1] = lab12_sched.num_tokens;
    MC_CHECK(lab_all_reduce_f64(t->ps.world, mine, all, 2, MC_SUM));
    MC_CHECK(lab_all_reduce_f64(t->ps.world, &mine_ms, ms, 1, MC_MAX));
    *loss = all[1] > 0 ? all[0] / all[1] : NAN;
    t->iteration++;
    t->consumed += LAB12_GBS;
}

static void lab12_describe(const lab12_layout *L, int dp, char *out, size_t cap) {
    snprintf(out, cap, "TP%d x PP%d%s x DP%d%s%s%s%s", L->tp, L->pp,
             L->vpp > 1 ? (L->vpp == 2 ? " (VPP2)" : " (VPP)") : "", dp, L->sp ? ", SP" : "",
             L->dist_opt ? ", distributed optimizer" : "",
             L->recompute == MC_RECOMPUTE_FULL        ? ", full recompute"
             : L->recompute == MC_RECOMPUTE_SELECTIVE ? ", selective recompute"
                                                      : "",
             L->dtype == MC_BF16 ? ", bf16" : "");
}

/* Largest |loss - reference| / |reference| over the run's iterations (starting at `first`). */
static double lab12_rel_diff(const lab12_run *r, const lab12_run *ref, int first) {
    double worst = 0.0;
    for (int i = 0; i < r->n_loss && first + i < ref->n_loss; i++) {
        double d = fabs(r->loss[i] - ref->loss[first + i]) / fmax(fabs(ref->loss[first + i]),
                                                                    1e-30);
        if (!(d <= worst)) worst = d;   /* NaN counts as the worst */
    }
    return worst;
}

/* Recompute's bar: on CPU ranks the recomputed forward is the same arithmetic in the same order,
   so it must be bit for bit; the CUDA backward kernels sum with atomics in no fixed order. */
static int lab12_recompute_bitwise_bar(const lab12_state *st) {
    return strcmp(st->smoke_device, "cpu") == 0;
}

static const char *lab12_recompute_bar(const lab12_state *st) {
    return lab12_recompute_bitwise_bar(st) ? "bit for bit"
                                           : "within 1e-05 (device kernels sum in no fixed order)";
}

static void lab12_finish_run(lab12_run *r, const lab12_run *ref, int first, double rtol) {
    r->median_ms = lab12_median(r->ms, r->n_loss);
    r->max_rel_diff = lab12_rel_diff(r, ref, first);
    r->ok = r->status == MC_OK && r->n_loss > 0 && r->max_rel_diff <= rtol;
}

/* `steps` iterations of layout L on `world` (every rank of it calls this). */
static void lab12_train(mc_comm *world, const lab12_layout *L, int steps, lab12_run *r) {
    lab12_trainer t;
    memset(r, 0, sizeof *r);
    r->ran = 1;
    r->tp = L->tp, r->pp = L->pp, r->vpp = L->vpp;
    r->status = lab12_trainer_init(&t, world, L);
    if (r->status != MC_OK) {
        snprintf(r->message, sizeof r->message, "%s", mc_last_error());
        return;
    }
    r->dp = t.dp, r->m = t.n_micro;
    lab12_describe(L, t.dp, r->layout, sizeof r->layout);
    for (int i = 0; i < steps; i++) lab12_step(&t, &r->loss[r->n_loss], &r->ms[r->n_loss]), r->n_loss++;
    lab12_trainer_destroy(&t);
}

static void lab12_print_run(const char *feature, const lab12_run *r, double rtol) {
    if (r->status != MC_OK) {
        lab_printf0("  %-20s refused: %s\n", feature, r->message);
        return;
    }
    lab_printf0("  %-20s %-40s M=%d  loss", feature, r->layout, r->m);
    for (int i = 0; i < r->n_loss; i++) lab_printf0(" %.6f", r->loss[i]);
    lab_printf0("  |rel diff| %.1e (<= %.0e: %s)  %.1f ms/step\n", r->max_rel_diff, rtol,
                r->ok ? "ok" : "NO", r->median_ms);
}

/* The reference: the same model and data on rank 0 alone (a self world, no parallelism), on
   the CPU table; the other ranks sleep meanwhile and then receive its losses. */
static void lab12_reference(lab_ctx *cx, lab12_state *st) {
    if (cx->me == 0) {
        mc_comm *self = NULL;
        MC_CHECK(mc_comm_init_world(&self, &(mc_comm_desc){.backend = MC_BACKEND_SELF}));
        lab12_layout L = {.tp = 1, .pp = 1, .dtype = MC_F32};
        lab12_train(self, &L, LAB12_REF_STEPS, &st->ref);
        mc_comm_destroy(self);
        MC_CHECK(st->ref.status);
        snprintf(st->ref.layout, sizeof st->ref.layout, "one rank, no parallelism");
    }
    lab_meet_idle(cx, 0);
    MC_CHECK(lab_broadcast_bytes(cx->world, &st->ref, sizeof st->ref, 0));
    st->ref.median_ms = lab12_median(st->ref.ms, st->ref.n_loss);
    st->ref.ok = 1;
}

static int lab12_add_run(lab12_state *st, int feature) {
    int i = st->n_runs++;
    if (feature >= 0) st->run_of[feature] = i;
    return i;
}

/* Adam's m or v in the parameter layout (op memory). */
static float *lab12_state_buffer(const lab12_trainer *t) {
    void *p = NULL;
    MC_CHECK(t->gpt.ops->alloc(t->gpt.ops, &p, t->gpt.table.total * sizeof(float)));
    return p;
}

static mc_checkpoint_desc lab12_ckpt_desc(lab12_trainer *t, const char *dir, float *m, float *v) {
    mc_checkpoint_desc d;
    memset(&d, 0, sizeof d);
    d.dir = dir, d.ps = &t->ps, d.config = &t->gpt.config;
    d.params = &t->gpt.table, d.param_data = (float *)t->gpt.params;
    d.exp_avg = m, d.exp_avg_sq = v, d.ops = t->gpt.ops, d.rng = &t->gpt.rng;
    d.iteration = t->iteration, d.consumed_samples = t->consumed;
    d.optimizer_step = t->opt.iteration;
    return d;
}

/* The reshard run: LAB12_SAVE_AT steps at TP2 x PP2, a checkpoint with Adam's state, then
   the same checkpoint loaded at TP1 x PP1 (DP = world) and trained on to the reference's
   length. */
static void lab12_reshard(lab_ctx *cx, lab12_state *st, mc_comm *world, lab12_run *r) {
    lab12_trainer t;
    lab12_layout save = {.tp = 2, .pp = 2, .dtype = MC_F32}, load = {.tp = 1, .pp = 1,
                                                                     .dtype = MC_F32};
    memset(r, 0, sizeof *r);
    r->ran = 1;
    r->status = lab12_trainer_init(&t, world, &save);
    if (r->status != MC_OK) {
        snprintf(r->message, sizeof r->message, "%s", mc_last_error());
        return;
    }
    int dp_save = t.dp;
    for (int i = 0; i < LAB12_SAVE_AT; i++)
        lab12_step(&t, &r->loss[r->n_loss], &r->ms[r->n_loss]), r->n_loss++;
    const mc_param_table *tab = &t.gpt.table;
    float *m = lab12_state_buffer(&t), *v = lab12_state_buffer(&t);
    for (int i = 0; i < tab->count; i++) {
        MC_CHECK(mc_optimizer_get_state(&t.opt, i, MC_OPTIM_EXP_AVG, m + tab->info[i].offset));
        MC_CHECK(mc_optimizer_get_state(&t.opt, i, MC_OPTIM_EXP_AVG_SQ, v + tab->info[i].offset));
    }
    mc_checkpoint_desc d = lab12_ckpt_desc(&t, st->ckpt_dir, m, v);
    MC_CHECK(mc_checkpoint_save(&d));
    MC_CHECK(t.gpt.ops->free(t.gpt.ops, m));
    MC_CHECK(t.gpt.ops->free(t.gpt.ops, v));
    lab12_trainer_destroy(&t);

    MC_CHECK(lab12_trainer_init(&t, world, &load));
    tab = &t.gpt.table;
    m = lab12_state_buffer(&t), v = lab12_state_buffer(&t);
    mc_checkpoint_result res;
    d = lab12_ckpt_desc(&t, st->ckpt_dir, m, v);
    r->status = mc_checkpoint_load(&d, 0, &res);
    if (r->status == MC_OK) {
        for (int i = 0; i < tab->count; i++) {
            MC_CHECK(mc_optimizer_set_state(&t.opt, i, MC_OPTIM_EXP_AVG, m + tab->info[i].offset));
            MC_CHECK(mc_optimizer_set_state(&t.opt, i, MC_OPTIM_EXP_AVG_SQ,
                                            v + tab->info[i].offset));
        }
        t.opt.iteration = res.optimizer_step;
        t.opt.lr_steps = res.iteration;
        t.iteration = res.iteration;
        t.consumed = res.consumed_samples;
        st->reshard_resharded = res.resharded;
        st->reshard_saved_tp = res.saved_tp, st->reshard_saved_pp = res.saved_pp;
        while (r->n_loss < LAB12_REF_STEPS)
            lab12_step(&t, &r->loss[r->n_loss], &r->ms[r->n_loss]), r->n_loss++;
    } else {
        snprintf(r->message, sizeof r->message, "%s", mc_last_error());
    }
    MC_CHECK(t.gpt.ops->free(t.gpt.ops, m));
    MC_CHECK(t.gpt.ops->free(t.gpt.ops, v));
    r->dp = t.dp, r->m = t.n_micro, r->tp = 1, r->pp = 1;
    snprintf(r->layout, sizeof r->layout, "TP2 x PP2 x DP%d -> TP1 x PP1 x DP%d", dp_save, t.dp);
    lab12_trainer_destroy(&t);
    (void)cx;
}

/* The mixed-radix formula of the default order tp-cp-ep-dp-pp: the members of the group of
   `kind` that holds rank r (coordinates from r alone, no library call). */
static int lab12_formula_group(int world, int tp, int cp, int ep, int pp, mc_group_kind kind,
                               int r, int *out) {
    int n = 0;
    if (kind == MC_GROUP_EP || kind == MC_GROUP_EXPERT_DP) {
        int edp = world / (tp * ep * pp);           /* expert grid: etp-ep-edp-pp */
        int t = r % tp, e = r / tp % ep, d = r / (tp * ep) % edp, p = r / (tp * ep * edp);
        for (int k = 0; k < (kind == MC_GROUP_EP ? ep : edp); k++)
            out[n++] = kind == MC_GROUP_EP ? t + tp * (k + ep * (d + edp * p))
                                           : t + tp * (e + ep * (k + edp * p));
        return n;
    }
    int dp = world / (tp * cp * pp);                /* dense grid: tp-cp-dp-pp */
    int t = r % tp, c = r / tp % cp, d = r / (tp * cp) % dp, p = r / (tp * cp * dp);
    if (kind == MC_GROUP_CP)
        for (int k = 0; k < cp; k++) out[n++] = t + tp * (k + cp * (d + dp * p));
    else if (kind == MC_GROUP_DP)
        for (int k = 0; k < dp; k++) out[n++] = t + tp * (c + cp * (k + dp * p));
    else if (kind == MC_GROUP_DP_CP)
        for (int k = 0; k < dp; k++)
            for (int j = 0; j < cp; j++) out[n++] = t + tp * (j + cp * (k + dp * p));
    return n;
}

/* A grid with CP or EP over the whole world: every group of the kinds against the formula,
   then the parallel state on the world and one all-reduce of world ranks in this rank's
   group of each kind. */
static void lab12_grid(lab_ctx *cx, lab12_grid_check *g, int cp, int ep, const mc_group_kind *kinds,
                       int n_kinds) {
    int W = cx->world_size, members[64], want[64];
    memset(g, 0, sizeof *g);
    g->tp = W / 4, g->cp = cp, g->ep = ep;
    mc_grid grid;
    MC_CHECK(mc_grid_init(&grid, &(mc_grid_desc){.world = W, .tp = g->tp, .cp = cp, .ep = ep}));
    g->dp = grid.dp, g->edp = grid.edp;
    g->groups_match = g->dp == W / (g->tp * cp) && g->edp == W / (g->tp * ep);
    g->kinds[0] = '\0';
    for (int k = 0; k < n_kinds; k++) {
        snprintf(g->kinds + strlen(g->kinds), sizeof g->kinds - strlen(g->kinds), "%s%s",
                 k ? ", " : "", mc_group_kind_name(kinds[k]));
        for (int r = 0; r < W; r++) {
            int idx = -1, pos = -1;
            MC_CHECK(mc_grid_group_of(&grid, kinds[k], r, &idx, &pos));
            int n = mc_grid_group_members(&grid, kinds[k], idx, members, 64);
            int nw = lab12_formula_group(W, g->tp, cp, ep, 1, kinds[k], r, want);
            g->groups_match = g->groups_match && n == nw && lab_ints_same_set(members, n, want, nw);
            if (r == 0 && k == 0) lab_format_ints(g->first_group, sizeof g->first_group, members, n);
        }
    }
    mc_parallel_state ps;
    MC_CHECK(mc_parallel_init(&ps, &(mc_parallel_desc){
                                       .world = cx->world,
                                       .grid = {.tp = g->tp, .cp = cp, .ep = ep}}));
    int ok = 1;
    for (int k = 0; k < n_kinds; k++) {
        mc_comm *c = mc_parallel_group(&ps, kinds[k]);
        int mine = cx->me, sum = 0;
        MC_CHECK(lab_all_reduce_i32(c, &mine, &sum, 1, MC_SUM));
        int nw = lab12_formula_group(W, g->tp, cp, ep, 1, kinds[k], cx->me, want), expect = 0;
        for (int i = 0; i < nw; i++) expect += want[i];
        ok = ok && sum == expect;
    }
    MC_CHECK(mc_parallel_destroy(&ps));
    MC_CHECK(lab_all_reduce_i32(cx->world, &ok, &g->sums_match, 1, MC_MIN));
}

/* The CUDA op table on rank 0's GPU (one rank, a self world on the table), against the CPU
   reference; what the table holds when it cannot run the model. */
static void lab12_cuda(lab_ctx *cx, lab12_state *st) {
    memset(&st->cuda, 0, sizeof st->cuda);
    st->cuda.status = MC_ERR_UNSUPPORTED;
#if defined(MC_ENABLE_CUDA)
    if (cx->me == 0) {
        if (mc_cuda_device_count() == 0) {
            snprintf(st->cuda_note, sizeof st->cuda_note, "no CUDA device visible to rank 0");
        } else {
            mc_ops ops;
            int rc = mc_ops_cuda_init(&ops, &(mc_cuda_desc){.device = 0});
            if (rc != MC_OK) {
                snprintf(st->cuda_note, sizeof st->cuda_note, "mc_ops_cuda_init: %s",
                         mc_last_error());
            } else {
                int total = 0;
                st->cuda_ops_present = lab12_numeric_ops(&ops, &total);
                if (st->cuda_ops_present < total) {
                    snprintf(st->cuda_note, sizeof st->cuda_note, "the table has %d of %d "
                             "numeric ops (%s)", st->cuda_ops_present, total,
                             mc_ops_cuda_describe(&ops));
                } else {
                    mc_comm *self = NULL;
                    MC_CHECK(mc_comm_init_world(&self, &(mc_comm_desc){
                                                           .backend = MC_BACKEND_SELF,
                                                           .memory = &ops}));
                    lab12_layout L = {.tp = 1, .pp = 1, .dtype = MC_F32};
                    lab12_train(self, &L, LAB12_STEPS, &st->cuda);
                    snprintf(st->cuda.layout, sizeof st->cuda.layout, "one rank on %s",
                             mc_ops_cuda_describe(&ops));
                    mc_comm_destroy(self);
                }
                mc_ops_cuda_destroy(&ops);
            }
        }
    }
#else
    snprintf(st->cuda_note, sizeof st->cuda_note, "not in this build (built without CUDA=1)");
#endif
    lab_meet_idle(cx, 0);
    MC_CHECK(lab_broadcast_bytes(cx->world, &st->cuda, sizeof st->cuda, 0));
    MC_CHECK(lab_broadcast_bytes(cx->world, st->cuda_note, sizeof st->cuda_note, 0));
    MC_CHECK(lab_broadcast_bytes(cx->world, &st->cuda_ops_present, sizeof(int), 0));
    if (st->cuda.ran) lab12_finish_run(&st->cuda, &st->ref, 0, LAB12_CUDA_RTOL);
}

/* The NCCL world: an all-reduce of the ranks against n (n - 1) / 2, and its time. */
static void lab12_nccl(lab_ctx *cx, lab12_state *st) {
    if (cx->world->backend != MC_BACKEND_NCCL) return;
    double t[5], sum = 0.0, me = cx->me;
    for (int i = 0; i < 5; i++) {
        double t0 = lab_now();
        MC_CHECK(lab_all_reduce_f64(cx->world, &me, &sum, 1, MC_SUM));
        t[i] = (lab_now() - t0) * 1e3;
    }
    st->nccl_ok = sum == cx->world_size * (cx->world_size - 1) / 2.0;
    st->nccl_ms = lab_median(t, 5);
}

/* The world the smoke runs use: the world itself, unless it is an NCCL world whose CUDA table
   cannot run the model yet; then a CPU (mpi) world beside it. */
static mc_comm *lab12_smoke_world(lab_ctx *cx, lab12_state *st) {
    const mc_ops *mem = mc_comm_memory(cx->world);
    int total = 0;
    if (cx->world->backend != MC_BACKEND_NCCL || lab12_numeric_ops(mem, &total) == total) {
        snprintf(st->smoke_device, sizeof st->smoke_device, "%s",
                 mem->device == MC_DEVICE_CUDA ? "cuda" : "cpu");
        return cx->world;
    }
    mc_comm *cpu = NULL;
    MC_CHECK(mc_comm_init_world(&cpu, &(mc_comm_desc){.backend = MC_BACKEND_MPI,
                                                      .timeout_s = cx->world->timeout_s}));
    st->own_smoke_world = 1;
    snprintf(st->smoke_device, sizeof st->smoke_device, "cpu");
    return cpu;
}

static int lab12_smoke(lab_ctx *cx) {
    lab12_state *st = cx->state;
    for (int f = 0; f < F_COUNT; f++) st->run_of[f] = -1;
    const char *res = cx->args->results_path;
    size_t n = strlen(res);
    if (n > 5 && strcmp(res + n - 5, ".json") == 0) n -= 5;
    snprintf(st->ckpt_dir, sizeof st->ckpt_dir, "%.*s.ckpt", (int)n, res);
    mc_comm *w = st->smoke_world = lab12_smoke_world(cx, st);
    lab_heading(cx, "B. Smoke runs: %d layer GPT, hidden %d, %d samples of %d tokens per step, "
                "%d steps, on %s ranks", LAB12_LAYERS, LAB12_HIDDEN, LAB12_GBS, LAB12_SEQ,
                LAB12_STEPS, st->smoke_device);
    lab12_reference(cx, st);
    lab_printf0("  %-20s %-40s M=%d  loss", "reference", st->ref.layout, LAB12_GBS / LAB12_MBS);
    for (int i = 0; i < st->ref.n_loss; i++) lab_printf0(" %.6f", st->ref.loss[i]);
    lab_printf0("  %.1f ms/step\n", st->ref.median_ms);

    int W = cx->world_size;
    static const struct {
        int feature;
        lab12_layout L;
        double rtol;
    } plan[] = {
        {F_TP, {.tp = 2, .pp = 1, .dtype = MC_F32}, LAB12_RTOL},
        {F_SP, {.tp = 2, .pp = 1, .sp = 1, .dtype = MC_F32}, LAB12_RTOL},
        {F_PP, {.tp = 1, .pp = 2, .dtype = MC_F32}, LAB12_RTOL},
        {F_VPP, {.tp = 1, .pp = 2, .vpp = 2, .dtype = MC_F32}, LAB12_RTOL},
        {F_DP, {.tp = 1, .pp = 1, .dtype = MC_F32}, LAB12_RTOL},
        {F_DISTOPT, {.tp = 1, .pp = 1, .dist_opt = 1, .dtype = MC_F32}, LAB12_RTOL},
        {-1, {.tp = 2, .pp = 2, .dtype = MC_F32}, LAB12_RTOL},
        {F_RC_FULL, {.tp = 2, .pp = 2, .recompute = MC_RECOMPUTE_FULL, .dtype = MC_F32},
         LAB12_RTOL},
        {F_RC_SEL, {.tp = 2, .pp = 2, .recompute = MC_RECOMPUTE_SELECTIVE, .dtype = MC_F32},
         LAB12_RTOL},
        {F_BF16, {.tp = 1, .pp = 2, .dtype = MC_BF16}, LAB12_BF16_RTOL},
    };
    for (size_t p = 0; p < sizeof plan / sizeof plan[0]; p++) {
        int i = lab12_add_run(st, plan[p].feature);
        if (plan[p].feature < 0) st->tp_pp = i;
        lab12_train(w, &plan[p].L, LAB12_STEPS, &st->runs[i]);
        lab12_finish_run(&st->runs[i], &st->ref, 0, plan[p].rtol);
        lab12_print_run(plan[p].feature >= 0 ? lab12_features[plan[p].feature].id : "tp_pp",
                        &st->runs[i], plan[p].rtol);
    }
    const lab12_run *base = &st->runs[st->tp_pp];
    for (int k = 0; k < 2; k++) {
        const lab12_run *rc = &st->runs[st->run_of[k == 0 ? F_RC_FULL : F_RC_SEL]];
        int same = rc->n_loss == base->n_loss && rc->status == MC_OK;
        double rel = same ? 0.0 : 1.0;
        for (int i = 0; i < rc->n_loss && rc->n_loss == base->n_loss; i++) {
            double d = fabs(rc->loss[i] - base->loss[i]) / fmax(fabs(base->loss[i]), 1e-30);
            if (d > rel) rel = d;
            same = same && rc->loss[i] == base->loss[i];
        }
        st->rc_bitwise[k] = same;
        st->rc_rel[k] = rel;
        st->rc_held[k] = lab12_recompute_bitwise_bar(st) ? same
                                                         : rc->status == MC_OK && rel <= LAB12_RTOL;
    }
    static const char *const words[3] = {"DIFFERENT", "within 1e-05", "bit for bit"};
    lab_printf0("  recompute against tp_pp (same layout, nothing recomputed): full %s, "
                "selective %s", words[st->rc_bitwise[0] ? 2 : st->rc_held[0]],
                words[st->rc_bitwise[1] ? 2 : st->rc_held[1]]);
    if (!st->rc_bitwise[0] || !st->rc_bitwise[1])
        lab_printf0(" (|rel diff| %.1e and %.1e; on %s ranks the bar is %s)", st->rc_rel[0],
                    st->rc_rel[1], st->smoke_device, lab12_recompute_bar(st));
    lab_printf0("\n");
    const lab12_run *bf = &st->runs[st->run_of[F_BF16]];
    int bf16_differs = bf->status == MC_OK && bf->max_rel_diff > 0.0;
    lab_printf0("  bf16 against fp32: |rel diff| %.1e (the rounding of bf16 storage; fp32 "
                "layouts differ by < %.0e)\n", bf->max_rel_diff, LAB12_RTOL);

    int ri = lab12_add_run(st, F_RESHARD);
    lab12_run *rs = &st->runs[ri];
    lab12_reshard(cx, st, w, rs);
    lab12_finish_run(rs, &st->ref, 0, LAB12_RTOL);
    lab12_print_run("ckpt_reshard", rs, LAB12_RTOL);
    lab_printf0("  checkpoint %s: saved at TP%d x PP%d after step %d, loaded %s, steps %d-%d "
                "after the load\n", st->ckpt_dir, st->reshard_saved_tp, st->reshard_saved_pp,
                LAB12_SAVE_AT, st->reshard_resharded ? "resharded" : "NOT resharded",
                LAB12_SAVE_AT + 1, LAB12_REF_STEPS);

    static const mc_group_kind cp_kinds[] = {MC_GROUP_CP, MC_GROUP_DP, MC_GROUP_DP_CP};
    static const mc_group_kind ep_kinds[] = {MC_GROUP_EP, MC_GROUP_EXPERT_DP, MC_GROUP_DP};
    lab12_grid(cx, &st->cp, 2, 1, cp_kinds, 3);
    lab12_grid(cx, &st->ep, 1, 2, ep_kinds, 3);
    lab_printf0("  %-20s TP%d x CP%d: DP = %d / (%d x %d) = %d; groups %s %s the formula "
                "(rank 0's CP group %s); all-reduce in each: %s\n", "cp_grid", st->cp.tp,
                st->cp.cp, W, st->cp.tp, st->cp.cp, st->cp.dp, st->cp.kinds,
                st->cp.groups_match ? "equal" : "DIFFER FROM", st->cp.first_group,
                st->cp.sums_match ? "ok" : "NO");
    lab_printf0("  %-20s TP%d x EP%d: dense DP = %d / %d = %d (EP is not a factor), expert DP = "
                "%d / (%d x %d) = %d; groups %s %s the formula (rank 0's EP group %s); "
                "all-reduce in each: %s\n", "ep_grid", st->ep.tp, st->ep.ep, W, st->ep.tp,
                st->ep.dp, W, st->ep.tp, st->ep.ep, st->ep.edp, st->ep.kinds,
                st->ep.groups_match ? "equal" : "DIFFER FROM", st->ep.first_group,
                st->ep.sums_match ? "ok" : "NO");

    lab12_cuda(cx, st);
    if (st->cuda.ran)
        lab12_print_run("cuda_ops", &st->cuda, LAB12_CUDA_RTOL);
    else
        lab_printf0("  %-20s not run: %s\n", "cuda_ops", st->cuda_note);
    lab12_nccl(cx, st);
    if (cx->world->backend == MC_BACKEND_NCCL)
        lab_printf0("  %-20s all-reduce of the ranks on the NCCL world: %s, %.3f ms\n", "nccl",
                    st->nccl_ok ? "ok" : "WRONG SUM", st->nccl_ms);
    else
        lab_printf0("  %-20s not run: the world's backend is %s (%s)\n", "nccl",
                    cx->backend.backend, cx->backend.backend_reason);

    for (int i = 0; i < st->n_runs; i++) {
        const lab12_run *r = &st->runs[i];
        lab_check(cx, r->ok, "%s: every loss within its tolerance of the single-rank run "
                  "(|rel diff| %.1e)", r->layout, r->max_rel_diff);
    }
    lab_check(cx, st->rc_held[0] && st->rc_held[1], "full and selective recompute give the "
              "losses of the same layout without recompute, %s", lab12_recompute_bar(st));
    lab_check(cx, bf16_differs, "bf16 storage changes the losses (it is really in use)");
    lab_check(cx, st->reshard_resharded && st->reshard_saved_tp == 2 && st->reshard_saved_pp == 2,
              "the checkpoint saved at TP2 x PP2 was resharded on load");
    lab_check(cx, st->cp.groups_match && st->cp.sums_match, "the CP grid's groups equal the "
              "formula and reduce over their members");
    lab_check(cx, st->ep.groups_match && st->ep.sums_match, "the EP grid's groups equal the "
              "formula and reduce over their members");
    if (st->cuda.ran)
        lab_check(cx, st->cuda.ok, "the CUDA table's losses are within %.0e of the CPU "
                  "reference", LAB12_CUDA_RTOL);
    if (cx->world->backend == MC_BACKEND_NCCL)
        lab_check(cx, st->nccl_ok, "the NCCL all-reduce of the ranks gives n(n-1)/2");
    lab_printf0("compared with: one single-rank run of the same model and data (rank 0 alone, "
                "CPU table); recompute with the same layout without it; each grid with the "
                "mixed-radix formula of tp-cp-ep-dp-pp\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   C. rules that differ between Megatron versions, as this build applies them */

typedef struct lab12_tap {
    char stream[MC_GPT_DROPOUT_SITES][32];
} lab12_tap;

static void lab12_on_draw(void *user, const mc_gpt_dropout_draw *d) {
    lab12_tap *t = user;
    if (t->stream[d->site][0] == '\0') snprintf(t->stream[d->site], 32, "%s", d->stream);
}

/* The stream of every dropout site in one forward at TP2 (SP on or off), on this rank. */
static void lab12_dropout_streams(mc_comm *world, int sp, lab12_tap *tap) {
    lab12_trainer t;
    lab12_layout L = {.tp = 2, .pp = 1, .sp = sp, .dtype = MC_F32, .dropout = LAB12_DROPOUT};
    memset(tap, 0, sizeof *tap);
    MC_CHECK(lab12_trainer_init(&t, world, &L));
    t.gpt.dropout_drawn = lab12_on_draw;
    t.gpt.dropout_drawn_user = tap;
    lab12_load(&t, 0);
    float *out = NULL;
    double loss = 0.0;
    MC_CHECK(mc_gpt_forward(&t.gpt, 0, 0, t.tokens, t.labels, NULL, &out, &loss));
    lab12_trainer_destroy(&t);
}

static int lab12_rules(lab_ctx *cx) {
    lab12_state *st = cx->state;
    lab_heading(cx, "C. Rules that differ between Megatron versions, as this build applies them");
    /* 1. interleaving at PP = 2 (Megatron refused it before overlap_p2p_comm; #750) */
    const lab12_run *v = &st->runs[st->run_of[F_VPP]];
    st->interleaved_pp2_accepted = v->status == MC_OK && v->pp == 2 && v->vpp == 2;
    lab_printf0("interleaved 1F1B at PP=2, VPP=2: %s%s\n",
                st->interleaved_pp2_accepted ? "accepted and trained (B)" : "refused: ",
                st->interleaved_pp2_accepted ? "" : v->message);

    /* 2. the batch-size ramp-up and the step schedule that replaced it */
    mc_microbatch_desc rd = {.global_batch_size = LAB12_GBS, .micro_batch_size = LAB12_MBS,
                             .data_parallel_size = 2, .rampup = {.start = 4, .increment = 4,
                                                                 .samples = 96}};
    mc_microbatch_calc ramp, step;
    st->rampup_accepted = mc_microbatch_init(&ramp, &rd) == MC_OK;
    int n_inc = (LAB12_GBS - 4) / 4;
    double per = 96.0 / n_inc;
    st->step_schedule[0] = '\0';
    for (int k = 0; k <= n_inc; k++)
        snprintf(st->step_schedule + strlen(st->step_schedule),
                 sizeof st->step_schedule - strlen(st->step_schedule), "%s%lld:%d", k ? " " : "",
                 k == 0 ? 0LL : (long long)ceil(k * per), 4 + 4 * k);
    mc_microbatch_desc sd = {.micro_batch_size = LAB12_MBS, .data_parallel_size = 2,
                             .step_schedule = st->step_schedule};
    int step_ok = mc_microbatch_init(&step, &sd) == MC_OK;
    st->rampup_matches_step = st->rampup_accepted && step_ok;
    st->rampup_matches_formula = st->rampup_accepted;
    st->rampup_rows = 0;
    for (long long c = 0; c <= 160 && st->rampup_accepted && step_ok; c += 4) {
        MC_CHECK(mc_microbatch_update(&ramp, c, 0));
        MC_CHECK(mc_microbatch_update(&step, c, 0));
        int formula = c > 96 ? LAB12_GBS : 4 + (int)floor(c / per) * 4;
        st->rampup_matches_step = st->rampup_matches_step &&
                                  ramp.current_global_batch_size ==
                                      step.current_global_batch_size &&
                                  ramp.num_microbatches == step.num_microbatches;
        st->rampup_matches_formula = st->rampup_matches_formula &&
                                     ramp.current_global_batch_size == formula;
        st->rampup_rows++;
    }
    lab_printf0("batch-size ramp-up 4 -> %d by 4 over 96 samples (Megatron up to %s): %s; the "
                "step schedule \"%s\" (its replacement): %s at %d consumed-sample counts\n",
                LAB12_GBS, MC_MEGATRON_RAMPUP_TAG, st->rampup_accepted ? "accepted" : "refused",
                st->step_schedule, st->rampup_matches_step ? "the same batches" : "DIFFERENT",
                st->rampup_rows);

    /* 3. the RNG stream of dropout with and without SP (core 0.9.0 left SP dropout outside
       the tracker's fork; #1256) */
    lab12_tap with_sp, without_sp;
    lab12_dropout_streams(st->smoke_world, 1, &with_sp);
    lab12_dropout_streams(st->smoke_world, 0, &without_sp);
    snprintf(st->sp_stream, sizeof st->sp_stream, "%s",
             with_sp.stream[MC_GPT_DROPOUT_ATTENTION_OUT]);
    snprintf(st->no_sp_stream, sizeof st->no_sp_stream, "%s",
             without_sp.stream[MC_GPT_DROPOUT_ATTENTION_OUT]);
    st->sp_rule_ok = 1;
    for (int s = 0; s < MC_GPT_DROPOUT_SITES; s++) {
        int probs = s == MC_GPT_DROPOUT_ATTENTION_PROBS;
        st->sp_rule_ok = st->sp_rule_ok &&
                         strcmp(with_sp.stream[s], MC_RNG_MODEL_PARALLEL) == 0 &&
                         strcmp(without_sp.stream[s], probs ? MC_RNG_MODEL_PARALLEL
                                                            : MC_RNG_DEFAULT) == 0;
    }
    lab_printf0("dropout streams at TP2: with SP the hidden and embedding dropouts draw from "
                "%s, without SP from %s; attention probabilities from %s either way\n",
                st->sp_stream, st->no_sp_stream, with_sp.stream[MC_GPT_DROPOUT_ATTENTION_PROBS]);

    /* 4. bf16 activations across TP: their all-reduce needs a backend that reduces bf16 */
    {
        lab12_trainer t;
        lab12_layout B = {.tp = 2, .pp = 1, .dtype = MC_BF16};
        MC_CHECK(lab12_trainer_init(&t, st->smoke_world, &B));
        lab12_load(&t, 0);
        float *out = NULL;
        double loss = 0.0;
        st->bf16_tp_status = mc_gpt_forward(&t.gpt, 0, 0, t.tokens, t.labels, NULL, &out, &loss);
        snprintf(st->bf16_tp_message, sizeof st->bf16_tp_message, "%.200s",
                 st->bf16_tp_status == MC_OK ? "ran" : mc_last_error());
        lab12_trainer_destroy(&t);
        int worst = st->bf16_tp_status;
        MC_CHECK(lab_all_reduce_i32(st->smoke_world, &st->bf16_tp_status, &worst, 1, MC_MIN));
        st->bf16_tp_status = worst;
    }
    lab_printf0("bf16 at TP2 on the %s backend: %s%s\n", mc_backend_name(st->smoke_world->backend),
                st->bf16_tp_status == MC_OK ? "ran" : "refused: ",
                st->bf16_tp_status == MC_OK ? "" : st->bf16_tp_message);

    /* 5. grouped-query attention */
    lab12_layout L = {.tp = 1, .pp = 1, .dtype = MC_F32};
    mc_gpt_config g = lab12_config(&L);
    g.num_query_groups = 2;
    char report[512];
    int violations = mc_gpt_config_validate(&g, report, sizeof report);
    st->gqa_refused = violations > 0 && strstr(report, "num_query_groups") != NULL;
    report[strcspn(report, "\n")] = '\0';
    snprintf(st->gqa_message, sizeof st->gqa_message, "%.200s", report);
    lab_printf0("grouped-query attention (%d heads, 2 query groups): %s%s\n", LAB12_HEADS,
                st->gqa_refused ? "refused: " : "accepted", st->gqa_refused ? report : "");

    lab_check(cx, st->rampup_accepted && st->rampup_matches_step && st->rampup_matches_formula,
              "the ramp-up, the equivalent step schedule and Megatron's ramp-up formula give "
              "the same batch at every count");
    lab_check(cx, st->sp_rule_ok, "every dropout site draws from the stream the header's rule "
              "names (SP: model-parallel-rng; no SP: default-rng, attention probabilities "
              "model-parallel-rng)");
    lab_check(cx, st->gqa_refused, "the validator refuses num_query_groups != heads, naming "
              "the field");
    lab_printf0("compared with: Megatron's ramp-up formula; the dropout rule of megatron_c.h "
                "(>>models.gpt); the validator's rule list\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   D. the matrix */

static void lab12_from_run(lab12_status *s, const lab12_run *r, const char *what) {
    s->implemented = "yes";
    if (r->status != MC_OK) {
        snprintf(s->reason, sizeof s->reason, "refused here: %.200s", r->message);
        return;
    }
    s->exercised = r->ok;
    s->measured = r->ok && r->median_ms > 0;
    s->ms = r->median_ms;
    snprintf(s->check, sizeof s->check, "%s: %s; |rel diff| %.1e against %s", r->layout,
             r->ok ? "held" : "FAILED", r->max_rel_diff, what);
    if (!r->ok) snprintf(s->reason, sizeof s->reason, "its check failed here");
}

static int lab12_matrix(lab_ctx *cx) {
    lab12_state *st = cx->state;
    const mc_backend_info *b = &cx->backend;
    lab_heading(cx, "D. The matrix: implemented / exercised here / measured here");
    for (int f = 0; f < F_COUNT; f++) {
        lab12_status *s = &st->st[f];
        memset(s, 0, sizeof *s);
        s->implemented = lab12_features[f].absent ? "no" : "yes";
        if (lab12_features[f].absent)
            snprintf(s->reason, sizeof s->reason, "%s", lab12_features[f].absent);
        if (st->run_of[f] >= 0)
            lab12_from_run(s, &st->runs[st->run_of[f]], f == F_BF16 ? "the fp32 single-rank run"
                                                                   : "the single-rank run");
    }
    lab12_status *s;
    for (int k = 0; k < 2; k++) {
        s = &st->st[k == 0 ? F_RC_FULL : F_RC_SEL];
        if (!st->rc_held[k]) s->exercised = s->measured = 0;
        snprintf(s->check + strlen(s->check), sizeof s->check - strlen(s->check),
                 "; %s the same layout without recompute",
                 st->rc_bitwise[k] ? "bit for bit equal to"
                 : st->rc_held[k]  ? "within 1e-05 of" : "DIFFERENT from");
    }
    s = &st->st[F_RESHARD];
    if (!st->reshard_resharded) s->exercised = s->measured = 0;
    snprintf(s->check + strlen(s->check), sizeof s->check - strlen(s->check),
             "; saved after step %d, %s on load", LAB12_SAVE_AT,
             st->reshard_resharded ? "resharded" : "NOT resharded");
    for (int k = 0; k < 2; k++) {
        const lab12_grid_check *g = k == 0 ? &st->cp : &st->ep;
        s = &st->st[k == 0 ? F_CP_GRID : F_EP_GRID];
        s->exercised = g->groups_match && g->sums_match;
        snprintf(s->check, sizeof s->check, "groups %s against the formula, all-reduce %s",
                 g->kinds, s->exercised ? "held" : "FAILED");
        snprintf(s->reason, sizeof s->reason, "not timed: a pure function of the sizes");
    }
    s = &st->st[F_BATCH];
    s->exercised = st->rampup_accepted && st->rampup_matches_step && st->rampup_matches_formula;
    snprintf(s->check, sizeof s->check, "ramp-up = step schedule \"%s\" = formula at %d counts",
             st->step_schedule, st->rampup_rows);
    snprintf(s->reason, sizeof s->reason, "not timed: the calculator is arithmetic");
    s = &st->st[F_GQA];
    snprintf(s->check, sizeof s->check, "the validator: %.200s", st->gqa_message);

    /* CUDA, NCCL, the GPU */
    lab12_status *cu = &st->st[F_CUDA], *nc = &st->st[F_NCCL], *gp = &st->st[F_GPU_PERF];
    if (!b->cuda_built) {
        cu->implemented = nc->implemented = gp->implemented = "not built";
        snprintf(cu->reason, sizeof cu->reason, "this binary has no CUDA code (make cuda builds "
                 "megatron_c_cuda.cu)");
        snprintf(nc->reason, sizeof nc->reason, "this binary has no NCCL backend (make cuda)");
        snprintf(gp->reason, sizeof gp->reason, "no GPU code in this binary: the times above "
                 "are CPU ranks");
    } else {
        cu->implemented = st->cuda.ran ? "yes" : st->cuda_ops_present > 0 ? "partial" : "unknown";
        if (st->cuda.ran) {
            lab12_from_run(cu, &st->cuda, "the CPU single-rank run");
        } else {
            snprintf(cu->reason, sizeof cu->reason, "%s", st->cuda_note);
        }
        gp->implemented = cu->implemented;
        gp->exercised = gp->measured = cu->measured || strcmp(st->smoke_device, "cuda") == 0;
        gp->ms = cu->measured ? cu->ms : 0;
        if (gp->measured)
            snprintf(gp->check, sizeof gp->check, "step times of the smoke runs on %s", b->gpu_name);
        else
            snprintf(gp->reason, sizeof gp->reason, "nothing ran on a GPU here (%.200s)",
                     st->cuda_note[0] ? st->cuda_note : "no GPU");
        nc->implemented = "yes";
        nc->exercised = nc->measured = cx->world->backend == MC_BACKEND_NCCL && st->nccl_ok;
        nc->ms = nc->measured ? st->nccl_ms : 0;
        if (nc->exercised)
            snprintf(nc->check, sizeof nc->check, "all-reduce of the ranks on the NCCL world");
        else
            snprintf(nc->reason, sizeof nc->reason, "the world's backend is %s (%s)", b->backend,
                     b->backend_reason);
    }
    st->gpus_used = cx->world->backend == MC_BACKEND_NCCL ? cx->world_size
                    : st->cuda.ran                         ? 1
                                                           : 0;
    if (st->gpus_used > 0)
        snprintf(st->hardware, sizeof st->hardware, "%d ranks, %d x %s in use%s", cx->world_size,
                 st->gpus_used, b->gpu_name, cx->world->backend == MC_BACKEND_NCCL
                                                 ? " (one per rank, NCCL)" : " (rank 0 only)");
    else
        snprintf(st->hardware, sizeof st->hardware, "%d CPU ranks on %d processors (%s), no GPU "
                 "in use", cx->world_size, b->cpu_count, b->cpu_name[0] ? b->cpu_name : "CPU");

    lab_printf0("%-20s %-11s %-9s %-8s %9s  %s\n", "feature", "implemented", "exercised",
                "measured", "ms/step", "what was compared, or why not");
    for (int f = 0; f < F_COUNT; f++) {
        s = &st->st[f];
        char ms[16] = "-";
        if (s->measured) snprintf(ms, sizeof ms, "%.1f", s->ms);
        lab_printf0("%-20s %-11s %-9s %-8s %9s  %s\n", lab12_features[f].id, s->implemented,
                    s->exercised ? "yes" : "no", s->measured ? "yes" : "no", ms,
                    s->exercised ? s->check : s->reason);
    }
    lab_printf0("hardware: %s\n", st->hardware);
    lab_printf0("measured = ran here, held its check and was timed on this hardware; exercised "
                "= ran and held its check (nothing to time); implemented = in this binary, not "
                "run here; not built = needs another build; no = not in megatron_c\n");
    const int *fv = lab12_variant_features[cx->variant - 1];
    lab_printf0("follow-up %s asks about: %s (%s), %s (%s), %s (%s)\n", cx->variant_name,
                lab12_features[fv[0]].id, lab12_level(&st->st[fv[0]]), lab12_features[fv[1]].id,
                lab12_level(&st->st[fv[1]]), lab12_features[fv[2]].id,
                lab12_level(&st->st[fv[2]]));
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   Results */

static cJSON *lab12_run_json(const lab12_run *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "layout", r->layout);
    cJSON_AddBoolToObject(o, "ok", r->ok);
    if (r->status != MC_OK) {
        cJSON_AddStringToObject(o, "refused", r->message);
        return o;
    }
    cJSON_AddNumberToObject(o, "dp", r->dp);
    cJSON_AddNumberToObject(o, "microbatches", r->m);
    cJSON *l = cJSON_AddArrayToObject(o, "loss");
    for (int i = 0; i < r->n_loss; i++) cJSON_AddItemToArray(l, cJSON_CreateNumber(r->loss[i]));
    cJSON *t = cJSON_AddArrayToObject(o, "step_ms");
    for (int i = 0; i < r->n_loss; i++)
        cJSON_AddItemToArray(t, cJSON_CreateNumber(lab_round_ms(r->ms[i])));
    cJSON_AddNumberToObject(o, "median_step_ms", lab_round_ms(r->median_ms));
    cJSON_AddNumberToObject(o, "max_rel_diff", r->max_rel_diff);
    return o;
}

static cJSON *lab12_grid_json(const lab12_grid_check *g) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tp", g->tp);
    cJSON_AddNumberToObject(o, "cp", g->cp);
    cJSON_AddNumberToObject(o, "ep", g->ep);
    cJSON_AddNumberToObject(o, "dp", g->dp);
    cJSON_AddNumberToObject(o, "expert_dp", g->edp);
    cJSON_AddStringToObject(o, "kinds", g->kinds);
    cJSON_AddStringToObject(o, "rank0_first_group", g->first_group);
    cJSON_AddBoolToObject(o, "groups_match_formula", g->groups_match);
    cJSON_AddBoolToObject(o, "all_reduce_ok", g->sums_match);
    return o;
}

static cJSON *lab12_probe_json(lab_ctx *cx) {
    const lab12_state *st = cx->state;
    const mc_backend_info *b = &cx->backend;
    cJSON *p = cJSON_CreateObject();
    cJSON *lib = cJSON_AddObjectToObject(p, "library");
    cJSON_AddStringToObject(lib, "name", "megatron_c");
    cJSON_AddStringToObject(lib, "version", mc_version_string());
    cJSON_AddStringToObject(lib, "header_version", st->header_version);
    cJSON_AddBoolToObject(lib, "header_matches_library", st->version_matches);
    cJSON *bd = cJSON_AddObjectToObject(p, "build");
    const char *commit = lab_build_commit();
    cJSON_AddStringToObject(bd, "commit", commit);
    char shortc[16];
    snprintf(shortc, sizeof shortc, "%.7s", commit);
    cJSON_AddStringToObject(bd, "commit_short", strcmp(commit, "unknown") ? shortc : "unknown");
    cJSON_AddNumberToObject(bd, "dirty", lab_build_dirty());
    cJSON_AddStringToObject(bd, "checkout_commit", st->checkout_commit);
    if (strcmp(commit, "unknown") && strcmp(st->checkout_commit, "unknown"))
        cJSON_AddBoolToObject(bd, "matches_checkout", !strcmp(commit, st->checkout_commit));
    else
        cJSON_AddNullToObject(bd, "matches_checkout");
    cJSON *mg = cJSON_AddObjectToObject(p, "megatron");
    cJSON_AddStringToObject(mg, "commit", MC_MEGATRON_COMMIT);
    cJSON_AddStringToObject(mg, "describe", MC_MEGATRON_DESCRIBE);
    cJSON_AddStringToObject(mg, "package", MC_MEGATRON_PACKAGE);
    cJSON_AddStringToObject(mg, "rampup_tag", MC_MEGATRON_RAMPUP_TAG);
    cJSON *cc = cJSON_AddObjectToObject(p, "compiler");
    cJSON_AddStringToObject(cc, "name", st->compiler);
    cJSON_AddStringToObject(cc, "version", st->compiler_version);
    cJSON_AddStringToObject(cc, "c_standard", st->c_standard);
    cJSON_AddStringToObject(cc, "options", st->options);
    cJSON *mpi = cJSON_AddObjectToObject(p, "mpi");
    cJSON_AddStringToObject(mpi, "library", b->mpi_library);
    cJSON_AddStringToObject(mpi, "library_version", st->mpi_runtime);
    cJSON_AddStringToObject(mpi, "header_version", st->mpi_header);
    cJSON_AddStringToObject(mpi, "standard", b->mpi_version);
    cJSON_AddBoolToObject(mpi, "header_matches_library", st->mpi_matches);
    cJSON *cu = cJSON_AddObjectToObject(p, "cuda");
    cJSON_AddBoolToObject(cu, "built", b->cuda_built);
    cJSON_AddStringToObject(cu, "runtime", b->cuda_runtime);
    cJSON_AddStringToObject(cu, "driver", b->cuda_driver);
    cJSON_AddStringToObject(cu, "nccl", b->nccl_version);
    cJSON_AddNumberToObject(cu, "table_numeric_ops", st->cuda_ops_present);
    cJSON *hw = cJSON_AddObjectToObject(p, "hardware");
    cJSON_AddNumberToObject(hw, "gpu_count", b->gpu_count);
    cJSON_AddStringToObject(hw, "gpu_name", b->gpu_name);
    cJSON_AddNumberToObject(hw, "gpus_used", st->gpus_used);
    cJSON_AddStringToObject(hw, "cpu_name", b->cpu_name);
    cJSON_AddNumberToObject(hw, "cpu_count", b->cpu_count);
    cJSON_AddNumberToObject(hw, "world_size", cx->world_size);
    cJSON_AddStringToObject(hw, "backend", b->backend);
    cJSON_AddStringToObject(hw, "backend_reason", b->backend_reason);
    cJSON_AddStringToObject(hw, "smoke_device", st->smoke_device);
    cJSON_AddStringToObject(hw, "summary", st->hardware);
    cJSON_AddNumberToObject(p, "cpu_table_numeric_ops", st->cpu_ops);
    cJSON_AddNumberToObject(p, "op_table_numeric_slots", st->cuda_ops_total);
    cJSON_AddBoolToObject(p, "ranks_agree", st->ranks_agree);
    return p;
}

static cJSON *lab12_status_json(const lab12_state *st, int f) {
    const lab12_status *s = &st->st[f];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", lab12_features[f].name);
    cJSON_AddStringToObject(o, "megatron", lab12_features[f].megatron);
    cJSON_AddStringToObject(o, "implemented", s->implemented);
    cJSON_AddBoolToObject(o, "exercised", s->exercised);
    cJSON_AddBoolToObject(o, "measured", s->measured);
    cJSON_AddStringToObject(o, "level", lab12_level(s));
    if (s->measured) cJSON_AddNumberToObject(o, "ms", lab_round_ms(s->ms));
    else cJSON_AddNullToObject(o, "ms");
    cJSON_AddStringToObject(o, "check", s->check);
    cJSON_AddStringToObject(o, "reason", s->reason);
    return o;
}

static cJSON *lab12_facts(lab_ctx *cx) {
    const lab12_state *st = cx->state;
    cJSON *facts = cJSON_CreateObject();
    cJSON_AddItemToObject(facts, "probe", lab12_probe_json(cx));

    cJSON *sm = cJSON_AddObjectToObject(facts, "smoke");
    cJSON_AddStringToObject(sm, "device", st->smoke_device);
    cJSON *model = cJSON_AddObjectToObject(sm, "model");
    cJSON_AddNumberToObject(model, "layers", LAB12_LAYERS);
    cJSON_AddNumberToObject(model, "hidden", LAB12_HIDDEN);
    cJSON_AddNumberToObject(model, "heads", LAB12_HEADS);
    cJSON_AddNumberToObject(model, "seq", LAB12_SEQ);
    cJSON_AddNumberToObject(model, "vocab", LAB12_VOCAB);
    cJSON_AddNumberToObject(model, "global_batch", LAB12_GBS);
    cJSON_AddNumberToObject(model, "micro_batch", LAB12_MBS);
    cJSON_AddNumberToObject(model, "steps", LAB12_STEPS);
    cJSON_AddNumberToObject(model, "rtol", LAB12_RTOL);
    cJSON_AddNumberToObject(model, "bf16_rtol", LAB12_BF16_RTOL);
    cJSON_AddItemToObject(sm, "reference", lab12_run_json(&st->ref));
    cJSON *runs = cJSON_AddObjectToObject(sm, "runs");
    for (int f = 0; f < F_COUNT; f++)
        if (st->run_of[f] >= 0)
            cJSON_AddItemToObject(runs, lab12_features[f].id, lab12_run_json(&st->runs[st->run_of[f]]));
    cJSON_AddItemToObject(runs, "tp_pp", lab12_run_json(&st->runs[st->tp_pp]));
    if (st->cuda.ran) cJSON_AddItemToObject(runs, "cuda_ops", lab12_run_json(&st->cuda));
    /* the two numbers a statement quotes, per run: its largest relative loss difference from
       the reference and its median step time */
    cJSON *rd = cJSON_AddObjectToObject(sm, "rel_diff"), *ms = cJSON_AddObjectToObject(sm, "step_ms");
    for (int f = 0; f < F_COUNT; f++)
        if (st->run_of[f] >= 0 && st->runs[st->run_of[f]].status == MC_OK) {
            const lab12_run *r = &st->runs[st->run_of[f]];
            cJSON_AddNumberToObject(rd, lab12_features[f].id, r->max_rel_diff);
            cJSON_AddNumberToObject(ms, lab12_features[f].id, lab_round_ms(r->median_ms));
        }
    if (st->cuda.ran && st->cuda.status == MC_OK) {
        cJSON_AddNumberToObject(rd, "cuda_ops", st->cuda.max_rel_diff);
        cJSON_AddNumberToObject(ms, "cuda_ops", lab_round_ms(st->cuda.median_ms));
    }
    cJSON_AddNumberToObject(ms, "reference", lab_round_ms(st->ref.median_ms));
    cJSON_AddBoolToObject(sm, "recompute_full_bitwise", st->rc_bitwise[0]);
    cJSON_AddBoolToObject(sm, "recompute_selective_bitwise", st->rc_bitwise[1]);
    cJSON *ck = cJSON_AddObjectToObject(sm, "checkpoint");
    cJSON_AddStringToObject(ck, "dir", st->ckpt_dir);
    cJSON_AddNumberToObject(ck, "saved_tp", st->reshard_saved_tp);
    cJSON_AddNumberToObject(ck, "saved_pp", st->reshard_saved_pp);
    cJSON_AddBoolToObject(ck, "resharded", st->reshard_resharded);
    cJSON_AddItemToObject(sm, "cp_grid", lab12_grid_json(&st->cp));
    cJSON_AddItemToObject(sm, "ep_grid", lab12_grid_json(&st->ep));
    cJSON_AddStringToObject(sm, "cuda_note", st->cuda_note);
    if (cx->world->backend == MC_BACKEND_NCCL)
        cJSON_AddNumberToObject(sm, "nccl_all_reduce_ms", lab_round_ms(st->nccl_ms));

    cJSON *ru = cJSON_AddObjectToObject(facts, "rules");
    cJSON_AddBoolToObject(ru, "interleaved_pp2_accepted", st->interleaved_pp2_accepted);
    cJSON_AddBoolToObject(ru, "rampup_accepted", st->rampup_accepted);
    cJSON_AddBoolToObject(ru, "rampup_matches_step_schedule", st->rampup_matches_step);
    cJSON_AddStringToObject(ru, "step_schedule", st->step_schedule);
    cJSON_AddStringToObject(ru, "rampup_removed_after", MC_MEGATRON_RAMPUP_TAG);
    cJSON_AddStringToObject(ru, "sp_dropout_stream", st->sp_stream);
    cJSON_AddStringToObject(ru, "no_sp_dropout_stream", st->no_sp_stream);
    cJSON_AddBoolToObject(ru, "dropout_rule_holds", st->sp_rule_ok);
    cJSON_AddBoolToObject(ru, "bf16_tp2_accepted", st->bf16_tp_status == MC_OK);
    cJSON_AddStringToObject(ru, "bf16_tp2_message", st->bf16_tp_message);
    cJSON_AddBoolToObject(ru, "gqa_refused", st->gqa_refused);
    cJSON_AddStringToObject(ru, "gqa_message", st->gqa_message);

    cJSON *fe = cJSON_AddObjectToObject(facts, "features");
    cJSON *lv = cJSON_AddObjectToObject(facts, "levels");
    cJSON *ex = cJSON_AddArrayToObject(facts, "exercised");
    cJSON *me = cJSON_AddArrayToObject(facts, "measured");
    cJSON *ab = cJSON_AddArrayToObject(facts, "absent");
    for (int f = 0; f < F_COUNT; f++) {
        const char *id = lab12_features[f].id;
        cJSON_AddItemToObject(fe, id, lab12_status_json(st, f));
        cJSON_AddStringToObject(lv, id, lab12_level(&st->st[f]));
        if (st->st[f].exercised) cJSON_AddItemToArray(ex, cJSON_CreateString(id));
        if (st->st[f].measured) cJSON_AddItemToArray(me, cJSON_CreateString(id));
        if (!strcmp(st->st[f].implemented, "no")) cJSON_AddItemToArray(ab, cJSON_CreateString(id));
    }

    cJSON *fu = cJSON_AddObjectToObject(facts, "followup");
    cJSON_AddStringToObject(fu, "variant", cx->variant_name);
    cJSON *ids = cJSON_AddArrayToObject(fu, "features");
    const int *fv = lab12_variant_features[cx->variant - 1];
    for (int k = 0; k < 3; k++) {
        char key[16];
        snprintf(key, sizeof key, "feature_%d", k + 1);
        cJSON_AddItemToArray(ids, cJSON_CreateString(lab12_features[fv[k]].id));
        cJSON *one = lab12_status_json(st, fv[k]);
        cJSON_AddStringToObject(one, "id", lab12_features[fv[k]].id);
        cJSON_AddItemToObject(fu, key, one);
    }
    cJSON_AddStringToObject(fu, "smoke_device", st->smoke_device);
    cJSON_AddStringToObject(fu, "hardware", st->hardware);
    return facts;
}

static void lab12_cleanup(lab_ctx *cx) {
    lab12_state *st = cx->state;
    if (st->own_smoke_world) mc_comm_destroy(st->smoke_world);
    st->own_smoke_world = 0;
}

/* 4 or 8 ranks, and no layout flags: each smoke run has its own layout. */
static int lab12_check_world(const lab_ctx *cx, char *why, size_t cap) {
    const mc_grid_desc *g = &cx->grid.desc;
    if (g->tp != 1 || g->pp != 1 || g->cp != 1 || g->ep != 1 || g->vpp > 1) {
        snprintf(why, cap, "no layout flags (got tp=%d pp=%d cp=%d ep=%d vpp=%d): lab12 gives "
                 "each smoke run its own layout", g->tp, g->pp, g->cp, g->ep, g->vpp);
        return 1;
    }
    if (cx->world_size != 4 && cx->world_size != 8) {
        snprintf(why, cap, "needs 4 or 8 ranks (got %d): every smoke layout (TP2 x PP2, PP2 "
                 "with VPP2, DP = world) must divide the world and leave the global batch of "
                 "%d samples a multiple of MBS x DP", cx->world_size, LAB12_GBS);
        return 1;
    }
    return 0;
}

static const lab_experiment lab12_experiments[] = {
    {"A", lab12_probe}, {"B", lab12_smoke}, {"C", lab12_rules}, {"D", lab12_matrix}};

static const lab_spec lab12_spec = {
    .name = "lab12",
    .question = "M012",
    .title = "stating a version boundary",
    .summary = "Probes this build and machine (library version and commit, compiler, MPI, "
               "CUDA, NCCL, GPUs), runs a smoke test of each feature against a single-rank "
               "reference, and prints the matrix feature x {implemented, exercised here, "
               "measured here} that a version statement must stay inside.",
    .default_world = 4,
    .min_world = 4,
    .max_world = 8,
    .check_world = lab12_check_world,
    .n_variants = LAB12_N_VARIANTS,
    .experiments = lab12_experiments,
    .n_experiments = 4,
    .state_size = sizeof(lab12_state),
    .facts = lab12_facts,
    .cleanup = lab12_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab12_spec); }
