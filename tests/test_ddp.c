/* test_ddp.c - DDP grad buckets, finalize_model_grads and the optimizer across ranks.

   The multi-rank tests launch build/tests/ddp_cases under mpirun (never this binary) and judge
   its exit status and its "N passed, N failed" line; the grad-norm test also checks that every
   TP x PP x DP layout of the same model prints the same norm. The in-process tests cover the
   argument checks on a one-rank `self` communicator. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define RUN_LIMIT_S 90.0
#define OUT_CAP (1 << 16)

TestSuite(ddp, .timeout = 120);

typedef struct ddp_run {
    char case_name[24];
    int np;
    char extra[32];   /* layout arguments, e.g. "--tp 2 --pp 2 --dist" */
} ddp_run;

/* Runs ddp_cases; checks exit 0 and a summary with checks passed and none failed. Returns the
   output (caller frees). */
static char *run_ddp_case(const char *case_name, int np, const char *extra) {
    char prog[4096], cmd[4400];
    mc_test_sibling("ddp_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s %s %s", prog, case_name, extra);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect_eq(rc, 0, "ddp_cases %s %s on %d ranks exited %d\n%s", case_name, extra, np, rc,
                 out);
    cr_expect(found && failed == 0 && passed > 0,
              "ddp_cases %s %s on %d ranks: %d passed, %d failed\n%s", case_name, extra, np,
              passed, failed, out);
    return out;
}

static ddp_run ddp_runs[] = {
    {"allreduce", 1, ""},       {"allreduce", 2, ""},       {"allreduce", 3, ""},
    {"allreduce", 4, ""},       {"reduce_scatter", 1, ""},  {"reduce_scatter", 2, ""},
    {"reduce_scatter", 3, ""},  {"reduce_scatter", 4, ""},  {"overlap", 1, ""},
    {"overlap", 2, ""},         {"overlap", 4, ""},         {"optimizer", 1, ""},
    {"optimizer", 2, ""},       {"optimizer", 3, ""},       {"optimizer", 4, ""},
    {"finalize", 1, ""},        {"finalize", 2, "--tp 2"},  {"finalize", 2, "--pp 2"},
    {"finalize", 2, ""},        {"finalize", 4, "--tp 2 --pp 2"},
    {"finalize", 4, "--tp 2"},  {"finalize", 4, "--pp 2"},  {"finalize", 4, "--pp 4"},
    {"finalize", 1, "--dist"},  {"finalize", 2, "--tp 2 --dist"},
    {"finalize", 2, "--pp 2 --dist"},  {"finalize", 2, "--dist"},
    {"finalize", 4, "--tp 2 --pp 2 --dist"}, {"finalize", 4, "--tp 2 --dist"},
    {"finalize", 4, "--pp 2 --dist"},  {"finalize", 4, "--tp 4 --dist"},
};

ParameterizedTestParameters(ddp, cases) {
    return cr_make_param_array(ddp_run, ddp_runs, sizeof ddp_runs / sizeof ddp_runs[0]);
}

ParameterizedTest(ddp_run *run, ddp, cases) {
    cr_log_info("ddp_cases %s, %d ranks %s", run->case_name, run->np, run->extra);
    free(run_ddp_case(run->case_name, run->np, run->extra));
}

/* One model, nine layouts (TP, PP, DP over 1, 2 and 4 ranks): the same grad norm, because each
   logical parameter counts once (TP replicas on TP rank 0 only, the tied copy never). */
Test(ddp, grad_norm_is_the_same_in_every_layout) {
    static const struct { int np; const char *extra; } layouts[] = {
        {1, ""},       {2, "--tp 2"}, {2, "--pp 2"}, {2, ""},      {4, "--tp 2 --pp 2"},
        {4, "--tp 2"}, {4, "--pp 2"}, {4, "--tp 4"}, {4, "--pp 4"},
    };
    char first[64] = "";
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        char *out = run_ddp_case("grad_norm", layouts[i].np, layouts[i].extra);
        const char *line = strstr(out, "grad_norm ");
        cr_assert_not_null(line, "no grad_norm line for %d ranks %s\n%s", layouts[i].np,
                           layouts[i].extra, out);
        char value[64] = "";
        sscanf(line, "grad_norm %63s", value);
        if (i == 0) memcpy(first, value, sizeof first);
        cr_expect_str_eq(value, first, "%d ranks %s: grad norm %s, TP=PP=DP=1 gives %s",
                         layouts[i].np, layouts[i].extra, value, first);
        free(out);
    }
}

/* ---------------------------------------------------------------------------------------------
   in-process: argument and state checks */

static void small_table(mc_param_table *t, int dist, int dp) {
    memset(t, 0, sizeof *t);
    mc_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = 1;
    p.global_shape[0] = p.local_shape[0] = 10;
    p.partition_dim = -1;
    cr_assert_geq(mc_param_table_add(t, "a", &p), 0);
    cr_assert_geq(mc_param_table_add(t, "b", &p), 0);
    cr_assert_eq(mc_param_table_layout(t, &(mc_param_layout_desc){.dp_size = dp,
                                                                    .distributed_optimizer = dist}),
                 MC_OK);
}

Test(ddp, init_rejects_mismatched_descs) {
    mc_param_table t;
    mc_ddp ddp;
    float grads[512] = {0};
    small_table(&t, 1, 2);
    cr_expect_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.grads = grads}), MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "table is required"), "%s", mc_last_error());
    cr_expect_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t}), MC_ERR_INVALID_DESC,
                 "grads missing");
    cr_expect_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads}),
                 MC_ERR_INVALID_DESC, "the table is padded for the distributed optimizer");
    cr_expect(mc_test_contains(mc_last_error(), "distributed_optimizer (0)"), "%s",
              mc_last_error());
    /* DP 1 (no communicator) against a table laid out for DP 2 */
    cr_expect_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads,
                                                  .distributed_optimizer = 1}),
                 MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "dp_size 2"), "%s", mc_last_error());
    mc_param_table_destroy(&t);

    mc_param_table bare = {0};
    mc_param_info p = {0};
    p.ndim = 1;
    p.global_shape[0] = p.local_shape[0] = 3;
    p.partition_dim = -1;
    mc_param_table_add(&bare, "x", &p);
    cr_expect_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &bare, .grads = grads}),
                 MC_ERR_INVALID_DESC, "no layout yet");
    cr_expect(mc_test_contains(mc_last_error(), "mc_param_table_layout"), "%s", mc_last_error());
    mc_param_table_destroy(&bare);
}

/* DP 1 without a communicator: grads are left as they are (the mean over one rank), the
   event log still shows each bucket once. */
Test(ddp, single_rank_without_communicator) {
    mc_param_table t;
    mc_ddp ddp;
    small_table(&t, 0, 1);
    float grads[20];
    cr_assert_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads,
                                                  .overlap_grad_reduce = 1}),
                 MC_OK, "%s", mc_last_error());
    cr_assert_eq(mc_ddp_zero_grad(&ddp), MC_OK);
    for (int i = 0; i < 20; i++) cr_assert_eq(grads[i], 0.0f, "zero_grad zeroes");
    for (int i = 0; i < 20; i++) grads[i] = (float)i;
    cr_expect_eq(mc_ddp_register_grad_ready(&ddp, 5), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_ddp_set_grad_sync(&ddp, MC_MAX_VPP, 1), MC_ERR_INVALID_ARG);
    cr_assert_eq(mc_ddp_set_grad_sync(&ddp, 0, 1), MC_OK);
    cr_assert_eq(mc_ddp_register_grad_ready(&ddp, 1), MC_OK);
    cr_assert_eq(mc_ddp_register_grad_ready(&ddp, 0), MC_OK);
    cr_expect_eq(ddp.n_events, 1);
    cr_expect_eq(ddp.events[0].kind, MC_DDP_LAUNCH);
    cr_expect_eq(ddp.events[0].params_ready, 2);
    cr_assert_eq(mc_finalize_model_grads(NULL, &ddp, NULL, NULL, 0, NULL), MC_OK, "%s",
                 mc_last_error());
    for (int i = 0; i < 20; i++) cr_expect_eq(grads[i], (float)i);
    double tokens = 4.0;   /* per-token normalisation on one rank: divide by 4 */
    cr_assert_eq(mc_ddp_zero_grad(&ddp), MC_OK);
    for (int i = 0; i < 20; i++) grads[i] = (float)i;
    cr_assert_eq(mc_finalize_model_grads(NULL, &ddp, NULL, NULL, 0, &tokens), MC_OK);
    for (int i = 0; i < 20; i++) cr_expect_float_eq(grads[i], (float)i / 4.0f, 1e-7);
    cr_expect_eq(mc_ddp_destroy(&ddp), MC_OK);
    mc_param_table_destroy(&t);
}

/* gradient_scaling_factor replaces 1/size(dp) (Megatron's expert buffers: 1/(DP x CP) over
   expert-DP); a negative or NaN factor, or one combined with per-token loss, is refused. */
Test(ddp, gradient_scaling_factor) {
    mc_param_table t;
    mc_ddp ddp;
    small_table(&t, 0, 1);
    float grads[20];
    cr_assert_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads,
                                                  .gradient_scaling_factor = 0.25f}),
                 MC_OK, "%s", mc_last_error());
    cr_expect_float_eq(ddp.scale, 0.25f, 1e-9);
    cr_assert_eq(mc_ddp_zero_grad(&ddp), MC_OK);
    for (int i = 0; i < 20; i++) grads[i] = (float)i;
    cr_assert_eq(mc_ddp_finish_grad_sync(&ddp), MC_OK, "%s", mc_last_error());
    for (int i = 0; i < 20; i++) cr_expect_float_eq(grads[i], 0.25f * (float)i, 1e-7);
    cr_expect_eq(mc_ddp_destroy(&ddp), MC_OK);

    cr_expect_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads,
                                                  .gradient_scaling_factor = -1.0f}),
                 MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "gradient_scaling_factor (-1)"), "%s",
              mc_last_error());
    cr_expect_eq(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &t, .grads = grads,
                                                  .gradient_scaling_factor = 0.5f,
                                                  .calculate_per_token_loss = 1}),
                 MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "calculate_per_token_loss"), "%s",
              mc_last_error());
    mc_param_table_free(&t);
}
