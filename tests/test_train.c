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
    "--train-iters 10 --lr 3e-3 --lr-warmup-iters 2 --seed 1234 --hidden-dropout 0 "            \
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
    snprintf(cmd, sizeof cmd, "./pretrain_gpt " MODEL_FLAGS " %s %s --save %s", common, flags,
             save);
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
    mc_checkpoint_meta_free(&a);
    mc_checkpoint_meta_free(&b);
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
    for (int i = 0; i < N_ITERS; i++) {
        double rel = fabs(loss[i] - ref_loss[i]) / fabs(ref_loss[i]);
        cr_expect_leq(rel, 1e-5, "np %d %s: iteration %d lm loss %.7e vs single rank %.7e "
                      "(relative %.2e)", c->np, c->flags, i + 1, loss[i], ref_loss[i], rel);
    }
    cr_expect_lt(ref_loss[N_ITERS - 1], ref_loss[0], "the loss must fall over %d steps: %g -> %g",
                 N_ITERS, ref_loss[0], ref_loss[N_ITERS - 1]);
    char worst[256] = "";
    double diff = compare_checkpoints(ref, par, worst, sizeof worst);
    cr_expect_leq(diff, 1e-4, "np %d %s: parameters differ by up to %.3g (%s)", c->np, c->flags,
                  diff, worst);
    char rm[1200];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) cr_log_warn("could not remove %s", dir);
}
