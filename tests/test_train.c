/* Equivalence of every parallel layout with the single-rank run (the training core's main
   promise): ./pretrain_gpt trains the same small GPT on the same data for 10 steps at
   TP = PP = DP = 1 and at a parallel layout, and
     - every iteration's lm loss agrees within 1e-5 relative, and
     - every parameter of the final checkpoint (stored in global form, whatever the layout)
       agrees within 1e-4.
   Dropout is off: masks depend on the rank's stream (Megatron's seeds differ per TP and PP rank),
   so only dropout-free runs are comparable number for number. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "megatron_c.h"
#include "test_util.h"

#define N_ITERS 10
#define MODEL_FLAGS                                                                            \
    "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "                 \
    "--max-position-embeddings 16 --vocab-size 512 --micro-batch-size 2 --global-batch-size 8 " \
    "--lr 3e-3 --lr-warmup-iters 2 --lr-decay-iters 10 --seed 1234 --hidden-dropout 0 "            \
    "--attention-dropout 0"

typedef struct layout_case {
    int np;
    char flags[256];     /* the parallel layout */
    char common[128];    /* model variations both runs use */
} layout_case;

static layout_case layout_cases[] = {
    {2, "--tensor-model-parallel-size 2", ""},
    {4, "--tensor-model-parallel-size 4", ""},
    {2, "--tensor-model-parallel-size 2 --sequence-parallel", ""},
    {4, "--tensor-model-parallel-size 4 --sequence-parallel", ""},
    {2, "--pipeline-model-parallel-size 2", ""},
    {4, "--pipeline-model-parallel-size 4", ""},
    {2, "--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2", ""},
    {2, "", ""},   /* DP = 2 */
    {2, "--use-distributed-optimizer", ""},
    {4, "--tensor-model-parallel-size 2 --overlap-grad-reduce --ddp-bucket-size 3000", ""},
    {4, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2", ""},
    {2, "--pipeline-model-parallel-size 2", "--untie-embeddings-and-output-weights"},
    {2, "--tensor-model-parallel-size 2 --recompute-granularity selective", ""},
    {4, "--pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 1", ""},
    {8, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
        "--use-distributed-optimizer", ""},
    {8, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--virtual-pipeline-model-parallel-size 2 --sequence-parallel --recompute-granularity full "
        "--recompute-method block --recompute-num-layers 1 --use-distributed-optimizer", ""},
    {8, "--tensor-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer", ""},
    {4, "--pipeline-model-parallel-size 4 --virtual-pipeline-model-parallel-size 2",
        "--num-layers 8"},
    /* dropout on (both runs): hidden dropout under TP without SP draws the single-rank masks
       from the default generator, and full recompute must replay them exactly */
    {2, "--tensor-model-parallel-size 2 --recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 1", "--hidden-dropout 0.1"},
};

ParameterizedTestParameters(train, matches_single_rank) {
    return cr_make_param_array(layout_case, layout_cases,
                               sizeof layout_cases / sizeof layout_cases[0]);
}

/* The lm loss of every logged iteration, in order; returns how many were found. */
static int parse_losses(const char *out, double *loss, int cap) {
    int n = 0;
    for (const char *p = strstr(out, "lm loss: "); p && n < cap; p = strstr(p + 1, "lm loss: "))
        loss[n++] = strtod(p + 9, NULL);
    return n;
}

/* env: "" or variables for the ranks ("MC_CPU_REFERENCE=1"), set through env(1) */
static int run_training_env(int np, const char *env, const char *flags, const char *common,
                            const char *save, double *loss, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s%s%s./pretrain_gpt " MODEL_FLAGS " --train-iters %d %s %s "
             "--save %s", *env ? "env " : "", env, *env ? " " : "", N_ITERS, common, flags, save);
    int rc = mc_test_mpirun(np, cmd, 240.0, out, cap);
    cr_assert_eq(rc, 0, "mpirun -np %d %s exited with %d:\n%s", np, cmd, rc, out);
    return parse_losses(out, loss, N_ITERS + 1);
}

static int run_training(int np, const char *flags, const char *common, const char *save,
                        double *loss, char *out, size_t cap) {
    return run_training_env(np, "", flags, common, save, loss, out, cap);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = fread(buf, 1, (size_t)n, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

static int load_meta(const char *dir, mc_checkpoint_meta *meta, char *iter_dir, size_t cap) {
    char path[1200];
    size_t len;
    mc_checkpoint_iteration_dir(iter_dir, cap, dir, N_ITERS);
    snprintf(path, sizeof path, "%s/" MC_CKPT_METADATA_FILE, iter_dir);
    char *text = read_file(path, &len);
    if (!text) return -1;
    int rc = mc_checkpoint_parse_metadata(meta, text, len, path, NULL);
    free(text);
    return rc;
}

static float *read_tensor(const char *iter_dir, const mc_checkpoint_tensor *t, size_t *n) {
    char path[1400];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", iter_dir, t->file);
    char *raw = read_file(path, &len);
    if (!raw || len < MC_CKPT_HEADER_BYTES) { free(raw); return NULL; }
    *n = (len - MC_CKPT_HEADER_BYTES) / sizeof(float);
    float *v = malloc(*n * sizeof(float) + 1);
    memcpy(v, raw + MC_CKPT_HEADER_BYTES, *n * sizeof(float));
    free(raw);
    return v;
}

/* Max |a - b| over every "model" tensor of the reference checkpoint. */
static double compare_checkpoints(const char *ref_dir, const char *dir, char *worst, size_t cap) {
    mc_checkpoint_meta a, b;
    char ia[1100], ib[1100];
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    cr_assert_eq(load_meta(ref_dir, &a, ia, sizeof ia), MC_OK, "reference metadata: %s",
                 mc_last_error());
    cr_assert_eq(load_meta(dir, &b, ib, sizeof ib), MC_OK, "metadata: %s", mc_last_error());
    double max_diff = 0.0;
    int compared = 0;
    for (int i = 0; i < a.n_tensors; i++) {
        const mc_checkpoint_tensor *ta = &a.tensors[i];
        if (strcmp(ta->kind, "model") != 0) continue;
        const mc_checkpoint_tensor *tb = mc_checkpoint_meta_find(&b, "model", ta->name);
        cr_assert_not_null(tb, "tensor %s missing from the parallel checkpoint", ta->name);
        size_t na = 0, nb = 0;
        float *va = read_tensor(ia, ta, &na), *vb = read_tensor(ib, tb, &nb);
        cr_assert(va && vb && na == nb, "tensor %s: %zu vs %zu elements", ta->name, na, nb);
        for (size_t k = 0; k < na; k++) {
            double d = fabs((double)va[k] - (double)vb[k]);
            if (d > max_diff) {
                max_diff = d;
                snprintf(worst, cap, "%s[%zu]: %.9g vs %.9g", ta->name, k, va[k], vb[k]);
            }
        }
        compared++;
        free(va);
        free(vb);
    }
    cr_assert_gt(compared, 10, "only %d model tensors compared", compared);
    mc_checkpoint_meta_destroy(&a);
    mc_checkpoint_meta_destroy(&b);
    return max_diff;
}

ParameterizedTest(layout_case *c, train, matches_single_rank, .timeout = 600) {
    char dir[] = "/tmp/mc_train_XXXXXX", ref[1100], par[1100];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(ref, sizeof ref, "%s/ref", dir);
    snprintf(par, sizeof par, "%s/par", dir);
    static char out[1 << 16];
    double ref_loss[N_ITERS + 1], loss[N_ITERS + 1];
    int n_ref = run_training(1, "", c->common, ref, ref_loss, out, sizeof out);
    cr_assert_eq(n_ref, N_ITERS, "reference run logged %d losses:\n%s", n_ref, out);
    int n = run_training(c->np, c->flags, c->common, par, loss, out, sizeof out);
    cr_assert_eq(n, N_ITERS, "%s logged %d losses:\n%s", c->flags, n, out);
    double worst_rel = 0.0;
    for (int i = 0; i < N_ITERS; i++) {
        double rel = fabs(loss[i] - ref_loss[i]) / fabs(ref_loss[i]);
        if (rel > worst_rel) worst_rel = rel;
        cr_expect_leq(rel, 1e-5, "np %d %s: iteration %d lm loss %.7e vs single rank %.7e "
                      "(relative %.2e)", c->np, c->flags, i + 1, loss[i], ref_loss[i], rel);
    }
    cr_expect_lt(ref_loss[N_ITERS - 1], ref_loss[0], "the loss must fall over %d steps: %g -> %g",
                 N_ITERS, ref_loss[0], ref_loss[N_ITERS - 1]);
    char worst[256] = "";
    double diff = compare_checkpoints(ref, par, worst, sizeof worst);
    cr_expect_leq(diff, 1e-4, "np %d %s: parameters differ by up to %.3g (%s)", c->np, c->flags,
                  diff, worst);
    cr_log_info("np %d %s %s: max relative loss difference %.2e, max |parameter difference| "
                "%.2e", c->np, c->flags, c->common, worst_rel, diff);
    char rm[1200];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) cr_log_warn("could not remove %s", dir);
}

/* The default (fast) CPU table against the reference loops, through the whole recipe: the
   single-rank run with MC_CPU_REFERENCE=1 against the fast table at 1 and 2 threads and at
   DP 2 (one thread per rank), within the same bounds as the layouts above (the GEMM's BLAS
   summation order is the only difference); and the fast table at 1 and 2 threads agree. */
typedef struct cpu_run { int np; const char *env, *flags; } cpu_run;

Test(train, fast_cpu_table_matches_the_reference_loops, .timeout = 600) {
    static const cpu_run runs[] = {
        {1, "MC_CPU_THREADS=1", ""},
        {1, "MC_CPU_THREADS=2", ""},
        {2, "", ""},
        {2, "", "--tensor-model-parallel-size 2"},
    };
    char dir[] = "/tmp/mc_fastcpu_XXXXXX", ref[1100], path[1100];
    cr_assert_not_null(mkdtemp(dir));
    static char out[1 << 16];
    double ref_loss[N_ITERS + 1], loss[N_ITERS + 1];
    snprintf(ref, sizeof ref, "%s/ref", dir);
    int n = run_training_env(1, "MC_CPU_REFERENCE=1", "", "", ref, ref_loss, out, sizeof out);
    cr_assert_eq(n, N_ITERS, "reference run logged %d losses:\n%s", n, out);
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        snprintf(path, sizeof path, "%s/run%zu", dir, r);
        n = run_training_env(runs[r].np, runs[r].env, runs[r].flags, "", path, loss, out,
                             sizeof out);
        cr_assert_eq(n, N_ITERS, "np %d %s %s logged %d losses:\n%s", runs[r].np, runs[r].env,
                     runs[r].flags, n, out);
        for (int i = 0; i < N_ITERS; i++) {
            double rel = fabs(loss[i] - ref_loss[i]) / fabs(ref_loss[i]);
            cr_expect_leq(rel, 1e-5, "np %d %s %s: iteration %d lm loss %.7e vs the reference "
                          "loops %.7e", runs[r].np, runs[r].env, runs[r].flags, i + 1, loss[i],
                          ref_loss[i]);
        }
        char worst[256] = "";
        double diff = compare_checkpoints(ref, path, worst, sizeof worst);
        cr_expect_leq(diff, 1e-4, "np %d %s %s: parameters differ from the reference loops by "
                      "up to %.3g (%s)", runs[r].np, runs[r].env, runs[r].flags, diff, worst);
        cr_log_info("fast table np %d %s %s: max |parameter difference| to the reference %.2e",
                    runs[r].np, runs[r].env, runs[r].flags, diff);
    }
    /* 1 thread against 2 threads */
    char one[1100], two[1100], worst[256] = "";
    snprintf(one, sizeof one, "%s/run0", dir);
    snprintf(two, sizeof two, "%s/run1", dir);
    double diff = compare_checkpoints(one, two, worst, sizeof worst);
    cr_expect_leq(diff, 1e-4, "1 and 2 threads differ by up to %.3g (%s)", diff, worst);
    char rm[1200];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) cr_log_warn("could not remove %s", dir);
}

/* ---------------------------------------------------------------------------------------------
   Checkpoints through the recipe: stop at iteration 5 under one layout, resume under another,
   and the next steps must be the uninterrupted single-rank run's (parameters, Adam state, the
   iteration, consumed samples and the LR schedule all carry over). */

#define HALF (N_ITERS / 2)

static int run_cmd(int np, const char *args, char *out, size_t cap) {
    char cmd[1700];
    snprintf(cmd, sizeof cmd, "./pretrain_gpt " MODEL_FLAGS " %s", args);
    return mc_test_mpirun(np, cmd, 240.0, out, cap);
}

typedef struct resume_case { int np; char flags[128]; } resume_case;
static resume_case resume_cases[] = {
    {1, ""},                                   /* TP1 PP1 */
    {4, "--tensor-model-parallel-size 4"},     /* TP4 PP1 */
    {4, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"},   /* same layout */
};

ParameterizedTestParameters(train, resume_resharded) {
    return cr_make_param_array(resume_case, resume_cases,
                               sizeof resume_cases / sizeof resume_cases[0]);
}

ParameterizedTest(resume_case *c, train, resume_resharded, .timeout = 600) {
    char dir[] = "/tmp/mc_resume_XXXXXX", args[1200];
    cr_assert_not_null(mkdtemp(dir));
    static char out[1 << 16];
    double ref[N_ITERS + 1], resumed[N_ITERS + 1];

    snprintf(args, sizeof args, "--train-iters %d", N_ITERS);
    cr_assert_eq(run_cmd(1, args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(parse_losses(out, ref, N_ITERS + 1), N_ITERS, "%s", out);

    /* the first half at TP2 PP2, saved */
    snprintf(args, sizeof args, "--train-iters %d --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2 --save %s/ckpt", HALF, dir);
    cr_assert_eq(run_cmd(4, args, out, sizeof out), 0, "%s", out);

    /* the second half under the case's layout */
    snprintf(args, sizeof args, "--train-iters %d %s --load %s/ckpt", N_ITERS, c->flags, dir);
    cr_assert_eq(run_cmd(c->np, args, out, sizeof out), 0, "%s", out);
    cr_assert(mc_test_contains(out, "loaded checkpoint"), "%s", out);
    int n = parse_losses(out, resumed, N_ITERS + 1);
    cr_assert_eq(n, N_ITERS - HALF, "the resumed run logged %d losses:\n%s", n, out);
    for (int i = 0; i < n; i++) {
        double want = ref[HALF + i], rel = fabs(resumed[i] - want) / fabs(want);
        cr_expect_leq(rel, 1e-5, "np %d %s: iteration %d after resuming: lm loss %.7e vs "
                      "uninterrupted %.7e (relative %.2e)", c->np, c->flags, HALF + i + 1,
                      resumed[i], want, rel);
    }
    snprintf(args, sizeof args, "rm -rf %s", dir);
    if (system(args) != 0) cr_log_warn("could not remove %s", dir);
}

/* A checkpoint of another model (tied vs untied embeddings) is refused and names the field;
   a truncated tensor file is a clear error, not a crash or a hang. */
Test(train, checkpoint_refusals, .timeout = 300) {
    char dir[] = "/tmp/mc_refuse_XXXXXX", args[1200];
    cr_assert_not_null(mkdtemp(dir));
    static char out[1 << 16];
    snprintf(args, sizeof args, "--train-iters 2 --tensor-model-parallel-size 2 --save %s/ckpt",
             dir);
    cr_assert_eq(run_cmd(2, args, out, sizeof out), 0, "%s", out);

    snprintf(args, sizeof args, "--train-iters 4 --untie-embeddings-and-output-weights "
             "--load %s/ckpt", dir);
    int rc = run_cmd(1, args, out, sizeof out);
    cr_expect_neq(rc, 0, "loading a tied checkpoint into an untied model must fail:\n%s", out);
    cr_expect(mc_test_contains(out, "untie_embeddings_and_output_weights"),
              "the refusal must name the differing field:\n%s", out);

    /* cut the word embedding's file in half */
    char path[1400];
    snprintf(path, sizeof path, "%s/ckpt/iter_0000002/model.embedding.word_embeddings.weight.bin",
             dir);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "expected tensor file %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    cr_assert_eq(truncate(path, size / 2), 0);
    snprintf(args, sizeof args, "--train-iters 4 --load %s/ckpt", dir);
    rc = run_cmd(2, args, out, sizeof out);
    cr_expect_neq(rc, 0, "a truncated tensor file must fail the load:\n%s", out);
    cr_expect(mc_test_contains(out, "word_embeddings"), "the error must name the file:\n%s", out);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    if (system(args) != 0) cr_log_warn("could not remove %s", dir);
}

/* Bad input to the recipe: every violated config rule is reported at once (exit 2), a missing
   data file is named, an unknown flag shows the usage. Never a crash or a hang. */
Test(train, recipe_rejects_bad_input, .timeout = 120) {
    static char out[1 << 16];
    int rc = mc_test_mpirun(2, "./pretrain_gpt --num-layers 3 --hidden-size 30 "
                               "--num-attention-heads 4 --pipeline-model-parallel-size 2 "
                               "--train-iters 1", 60.0, out, sizeof out);
    cr_expect_neq(rc, 0, "%s", out);
    cr_expect(mc_test_contains(out, "num_attention_heads") || mc_test_contains(out, "hidden_size"),
              "the heads/hidden rule must be reported:\n%s", out);
    cr_expect(mc_test_contains(out, "num_layers (3)"), "the layers %% PP rule must be reported "
              "in the same run:\n%s", out);
    rc = mc_test_mpirun(1, "./pretrain_gpt --data-path /nonexistent/corpus.txt --train-iters 1",
                        60.0, out, sizeof out);
    cr_expect_neq(rc, 0, "%s", out);
    cr_expect(mc_test_contains(out, "/nonexistent/corpus.txt"), "%s", out);
    rc = mc_test_run("./pretrain_gpt --no-such-flag", 30.0, out, sizeof out);
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(mc_test_contains(out, "--no-such-flag") && mc_test_contains(out, "usage"), "%s",
              out);
}

/* --data-path trains on the bytes of a text file: the loss falls on the project's own README. */
Test(train, byte_level_text_data, .timeout = 120) {
    static char out[1 << 16];
    double loss[32];
    int rc = mc_test_mpirun(2, "./pretrain_gpt --data-path README.md --num-layers 2 "
                               "--hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                               "--micro-batch-size 4 --global-batch-size 8 --train-iters 30 "
                               "--lr 3e-3 --log-interval 1", 120.0, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    int n = parse_losses(out, loss, 32);
    cr_assert_eq(n, 30, "%s", out);
    cr_expect_lt(loss[29], loss[0] - 0.5, "byte-level loss %g -> %g should fall clearly",
                 loss[0], loss[29]);
}

/* ---------------------------------------------------------------------------------------------
   Never crash, never hang, never train on garbage: the recipe's flags, its data file, ranks
   that disagree and a rank that stops. */

typedef struct bad_flag { const char *args; const char *want; } bad_flag;

/* Each one exits 2 before MPI starts, naming the flag and the rule. */
Test(train, recipe_rejects_bad_numbers, .timeout = 120) {
    static const bad_flag cases[] = {
        {"--log-interval 0", "--log-interval (0) must be >= 1"},
        {"--lr inf", "--lr expects a finite decimal number"},
        {"--min-lr nan", "--min-lr expects a finite decimal number"},
        {"--clip-grad nan", "--clip-grad expects a finite decimal number"},
        {"--clip-grad -1", "--clip-grad (-1) must be >= 0"},
        {"--weight-decay nan", "--weight-decay expects a finite decimal number"},
        {"--weight-decay -5", "--weight-decay (-5) must be >= 0"},
        {"--lr 0x10", "--lr expects a finite decimal number"},
        {"--lr 1e39", "--lr value 1e39 is out of range"},
        {"--lr 1e-3 --min-lr 1e-2", "--min-lr (0.01) must be in [0, --lr (0.001)]"},
        {"--num-layers 99999999999", "--num-layers value 99999999999 is out of range"},
        {"--seed 0", "--seed (0) must be > 0"},
        {"--train-iters 0", "--train-iters (0) must be >= 1"},
        {"--distributed-timeout-minutes 0", "--distributed-timeout-minutes (0) must be >= 1"},
    };
    static char out[1 << 14];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./pretrain_gpt %s --train-iters 1", cases[i].args);
        if (strstr(cases[i].args, "--train-iters"))
            snprintf(cmd, sizeof cmd, "./pretrain_gpt %s", cases[i].args);
        int rc = mc_test_run(cmd, 30.0, out, sizeof out);
        cr_expect_eq(rc, 2, "%s: exit %d, want 2:\n%s", cases[i].args, rc, out);
        cr_expect(mc_test_contains(out, cases[i].want), "%s: want \"%s\" in:\n%s",
                  cases[i].args, cases[i].want, out);
    }
}

/* A repeated flag keeps its last value, as Megatron's argparse does (the equivalence suite
   appends overrides to a base command line), but says so once instead of silently. */
Test(train, repeated_flag_is_announced, .timeout = 120) {
    static char out[1 << 15];
    double twice[4], once[4];
    int rc = mc_test_run("./pretrain_gpt --lr 1e-3 --train-iters 3 --lr 2e-3", 60.0, out,
                         sizeof out);
    cr_expect_eq(rc, 0, "exit %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "note: --lr is given more than once; the last one counts: "
                               "2e-3"), "%s", out);
    cr_assert_eq(parse_losses(out, twice, 4), 3, "%s", out);
    rc = mc_test_run("./pretrain_gpt --lr 2e-3 --train-iters 3", 60.0, out, sizeof out);
    cr_assert_eq(parse_losses(out, once, 4), 3, "%s", out);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(twice[i], once[i], "iteration %d: %.7e with --lr given twice, %.7e with the "
                     "last value alone", i + 1, twice[i], once[i]);
    rc = mc_test_run("./pretrain_gpt --train-iters 1 --sequence-parallel --sequence-parallel",
                     60.0, out, sizeof out);
    cr_expect(mc_test_contains(out, "note: --sequence-parallel is given more than once"), "%s",
              out);
}

/* --data-path must be a regular file read whole: a directory or a FIFO is refused (never
   synthetic data, never a wait for a writer), and a file that yields fewer bytes than its
   size (sysfs reports 4096 for a few bytes) is a read error, not a span that wraps. */
Test(train, data_path_is_read_whole_or_refused, .timeout = 120) {
    static char out[1 << 14];
    int rc = mc_test_run("./pretrain_gpt --data-path /tmp --train-iters 1", 30.0, out,
                         sizeof out);
    cr_expect_eq(rc, 1, "a directory: exit %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "is not a regular file (a directory)"), "%s", out);
    cr_expect(!mc_test_contains(out, "iteration"), "a directory trained:\n%s", out);

    char fifo[] = "/tmp/mc_fifo_XXXXXX", cmd[256];
    cr_assert_not_null(mkdtemp(fifo));
    char path[64];
    snprintf(path, sizeof path, "%s/pipe", fifo);
    cr_assert_eq(mkfifo(path, 0600), 0);
    snprintf(cmd, sizeof cmd, "./pretrain_gpt --data-path %s --train-iters 1", path);
    rc = mc_test_run(cmd, 20.0, out, sizeof out);
    cr_expect_eq(rc, 1, "a FIFO: exit %d (-1: it waited for a writer)\n%s", rc, out);
    cr_expect(mc_test_contains(out, "is not a regular file"), "%s", out);
    unlink(path);
    rmdir(fifo);

    const char *sysfs = "/sys/kernel/mm/transparent_hugepage/enabled";
    if (access(sysfs, R_OK) != 0) {
        cr_log_warn("%s is missing: the short-read check is not run here", sysfs);
        return;
    }
    snprintf(cmd, sizeof cmd, "./pretrain_gpt --data-path %s --seq-length 64 --train-iters 200",
             sysfs);
    rc = mc_test_run(cmd, 60.0, out, sizeof out);
    cr_expect_eq(rc, 1, "a short read: exit %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "of its 4096 bytes"), "%s", out);
}

/* A loss that turns NaN stops the run (Megatron's check_for_nan_in_loss_and_grad) instead of
   logging "number of nan iterations: 0" over garbage. */
Test(train, nan_loss_stops_the_run, .timeout = 120) {
    static char out[1 << 15];
    int rc = mc_test_run("./pretrain_gpt --lr 1e30 --train-iters 20", 60.0, out, sizeof out);
    cr_expect_eq(rc, 1, "exit %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "lm loss is") && mc_test_contains(out, "stopping"), "%s",
              out);
    cr_expect(!mc_test_contains(out, "lm loss: nan") && !mc_test_contains(out, "lm loss: -nan"),
              "a NaN loss was logged as an iteration:\n%s", out);
}

/* Ranks started with different flags (an MPMD command line) stop at once on every rank,
   naming the first differing flag, before any collective that depends on it: different
   --num-layers used to die in MPI (MPI_ERR_TRUNCATE), different --lr or --seed trained. */
Test(train, ranks_must_agree_on_every_flag, .timeout = 240) {
    static const bad_flag cases[] = {
        {"./pretrain_gpt --num-layers 2 : -np 2 ./pretrain_gpt --num-layers 4",
         "--num-layers is \"4\" on ranks 2, 3 but \"2\" on ranks 0, 1"},
        {"./pretrain_gpt --global-batch-size 8 : -np 1 ./pretrain_gpt --global-batch-size 16",
         "--global-batch-size is \"16\" on rank 1 but \"8\" on rank 0"},
        {"./pretrain_gpt --lr 1e-3 : -np 1 ./pretrain_gpt --lr 0.002",
         "--lr is \"0.002\" on rank 1 but \"0.001\" on rank 0"},
        {"./pretrain_gpt --seed 5 : -np 1 ./pretrain_gpt --seed 6",
         "--seed is \"6\" on rank 1 but \"5\" on rank 0"},
        {"./pretrain_gpt --data-path README.md : -np 1 ./pretrain_gpt --data-path Makefile",
         "--data-path is \"Makefile\" on rank 1"},
    };
    static char out[1 << 15];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double t0 = mc_test_now();
        int np = i == 0 ? 2 : 1;   /* ranks of the first program; the rest follow ":" */
        int rc = mc_test_mpirun(np, cases[i].args, 60.0, out, sizeof out);
        double elapsed = mc_test_now() - t0;
        cr_expect(rc != 0 && rc != -1, "%s: exit %d\n%s", cases[i].args, rc, out);
        cr_expect(mc_test_contains(out, cases[i].want), "%s: want \"%s\" in:\n%s",
                  cases[i].args, cases[i].want, out);
        cr_expect(!mc_test_contains(out, "MPI_ERR") && !mc_test_contains(out, "iteration "),
                  "%s went past the agreement:\n%s", cases[i].args, out);
        cr_expect_lt(elapsed, 30.0, "%s took %.1f s", cases[i].args, elapsed);
    }
}

/* kill -STOP of one rank: every rank exits non-zero within the watchdog's limit
   (--distributed-timeout-seconds 4), the message names the stopped rank and the call. */
Test(train, stopped_rank_ends_the_job, .timeout = 240) {
    static char out[1 << 16];
    const char *launcher = getenv("MC_MPIRUN");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
             "./tests/stop_rank.sh 1 'iteration        3/' %s -np 4 ./pretrain_gpt "
             "--pipeline-model-parallel-size 2 --train-iters 100000 "
             "--distributed-timeout-seconds 4",
             launcher && *launcher ? launcher
                                   : (geteuid() == 0 ? "mpirun --oversubscribe "
                                                       "--allow-run-as-root"
                                                     : "mpirun --oversubscribe"));
    int rc = mc_test_run(cmd, 200.0, out, sizeof out);
    cr_assert_eq(rc, 0, "stop_rank.sh exit %d\n%s", rc, out);
    double after = -1.0;
    const char *line = strstr(out, "stopped rank 1");
    cr_assert_not_null(line, "%s", out);
    const char *at = strstr(line, " after ");
    if (at) sscanf(at, " after %lf", &after);
    cr_expect(mc_test_contains(line, "mpirun exited") && !mc_test_contains(line, "exited 0"),
              "the job must end non-zero:\n%s", out);
    cr_expect(after >= 0 && after < 4.0 + 6.0, "the job ended %.1f s after the stop (limit "
              "4 s)\n%s", after, out);
    cr_expect(mc_test_contains(out, "watchdog: rank 1 made no progress"), "%s", out);
    cr_expect(mc_test_contains(out, "all_reduce #") || mc_test_contains(out, "recv #") ||
              mc_test_contains(out, "send_recv #"), "the call must be named:\n%s", out);
}
