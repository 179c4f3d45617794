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

static int run_training(int np, const char *flags, const char *common, const char *save,
                        double *loss, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "./pretrain_gpt " MODEL_FLAGS " --train-iters %d %s %s --save %s",
             N_ITERS, common, flags, save);
    int rc = mc_test_mpirun(np, cmd, 240.0, out, cap);
    cr_assert_eq(rc, 0, "mpirun -np %d %s exited with %d:\n%s", np, cmd, rc, out);
    return parse_losses(out, loss, N_ITERS + 1);
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
        size_t na, nb;
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
