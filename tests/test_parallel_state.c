/* test_parallel_state.c - mc_parallel_init and friends: on the self backend in process, on
   several ranks through build/tests/ps_cases under mpirun. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define RUN_LIMIT_S 90.0
#define OUT_CAP (1 << 17)
#define MISMATCH_LIMIT_S 10.0

TestSuite(parallel_state, .timeout = 120);

/* ---------------------------------------------------------------------------------------------
   multi-rank cases */

typedef struct ps_run {
    char case_name[24];
    int np;
    char args[96];
} ps_run;

/* Runs ps_cases; checks exit 0 and "N passed, 0 failed". Returns the output (caller frees)
   and the wall time, launch included. */
static char *run_ps_case(const ps_run *run, double *elapsed) {
    char prog[4096], cmd[4400];
    mc_test_sibling("ps_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s %s %s", prog, run->case_name, run->args);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(run->np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    *elapsed = mc_test_now() - t0;
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect_eq(rc, 0, "ps_cases %s %s on %d ranks exited %d\n%s", run->case_name, run->args,
                 run->np, rc, out);
    cr_expect(found && failed == 0 && passed > 0,
              "ps_cases %s %s on %d ranks: summary %s (%d passed, %d failed)\n%s",
              run->case_name, run->args, run->np, found ? "found" : "missing", passed, failed,
              out);
    return out;
}

/* Grids that cover every kind of group: TP/PP/DP mixes, odd DP, a different order, CP, EP,
   virtual pipeline stages, and PP = 4 where the middle stages are in no embedding group. */
static ps_run init_runs[] = {
    {"init", 1, ""},
    {"init", 2, "--tp 2"},
    {"init", 2, "--pp 2"},
    {"init", 3, ""},
    {"init", 4, "--tp 2 --pp 2"},
    {"init", 4, "--pp 4 --vpp 2"},
    {"init", 4, "--cp 2"},
    {"init", 4, "--ep 2 --tp 2 --etp 1"},
    {"init", 8, "--tp 2 --pp 2"},
    {"init", 8, "--tp 2 --pp 2 --order tp-pp-dp"},
    {"init", 8, "--tp 2 --pp 4 --vpp 2"},
    {"init", 8, "--tp 2 --cp 2 --pp 2"},
    {"init", 8, "--ep 4 --pp 2"},
};

ParameterizedTestParameters(parallel_state, init) {
    return cr_make_param_array(ps_run, init_runs, sizeof init_runs / sizeof init_runs[0]);
}

ParameterizedTest(ps_run *run, parallel_state, init) {
    double elapsed = 0;
    free(run_ps_case(run, &elapsed));
}

/* Disagreements: all ranks fail fast, and the message says what differs. */
static ps_run mismatch_runs[] = {
    {"plan_mismatch", 2, "--pp 2 --variant salt"},
    {"plan_mismatch", 4, "--pp 2 --variant order"},
    {"plan_mismatch", 4, "--tp 2 --pp 2 --variant salt"},
    {"sizes_mismatch", 2, ""},
    {"sizes_mismatch", 4, "--tp 2 --pp 2"},
    {"sizes_mismatch", 8, "--tp 2 --pp 2"},
    {"invalid_on_one_rank", 2, ""},
    {"invalid_on_one_rank", 8, "--tp 2 --pp 2"},
};

ParameterizedTestParameters(parallel_state, mismatch) {
    return cr_make_param_array(ps_run, mismatch_runs,
                               sizeof mismatch_runs / sizeof mismatch_runs[0]);
}

ParameterizedTest(ps_run *run, parallel_state, mismatch) {
    double elapsed = 0;
    char *out = run_ps_case(run, &elapsed);
    cr_expect(elapsed < MISMATCH_LIMIT_S, "%s %s on %d ranks took %.1f s (limit %.0f s)\n%s",
              run->case_name, run->args, run->np, elapsed, MISMATCH_LIMIT_S, out);
    cr_expect(mc_test_contains(out, "rank 0 got MC_ERR_PLAN_MISMATCH"),
              "rank 0 did not report MC_ERR_PLAN_MISMATCH\n%s", out);
    free(out);
}

/* Megatron's example A against A' (world 8, TP = PP = 2): with the default order the first
   group created, dp_cp[0], is [0,2]; with order tp-cp-ep-pp-dp it is [0,4]. The message
   must name that group and both lists. */
Test(parallel_state, order_mismatch_names_first_group) {
    ps_run run = {"plan_mismatch", 8, "--tp 2 --pp 2 --variant order"};
    double elapsed = 0;
    char *out = run_ps_case(&run, &elapsed);
    cr_expect(elapsed < MISMATCH_LIMIT_S, "took %.1f s\n%s", elapsed, out);
    cr_expect(mc_test_contains(out, "dp_cp[0]"), "first differing group not named\n%s", out);
    cr_expect(mc_test_contains(out, "[0,2]") && mc_test_contains(out, "[0,4]"),
              "member lists [0,2] / [0,4] not shown\n%s", out);
    free(out);
}

Test(parallel_state, unknown_option_fails) {
    char prog[4096], cmd[4400], out[4096];
    mc_test_sibling("ps_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s init --tq 2", prog);
    int rc = mc_test_mpirun(1, cmd, RUN_LIMIT_S, out, sizeof out);
    cr_expect_neq(rc, 0, "a misspelt option exited 0\n%s", out);
    cr_expect(mc_test_contains(out, "usage:"), "%s", out);
}

/* ---------------------------------------------------------------------------------------------
   the self backend, in this process */

static mc_comm *world;

static void open_self_world(void) {
    int rc = mc_comm_init_world(&world, &(mc_comm_desc){.backend = MC_BACKEND_SELF});
    cr_assert_eq(rc, MC_OK, "%s: %s", mc_err_name(rc), mc_last_error());
}

static void close_self_world(void) {
    if (world != NULL) mc_comm_destroy(world);
    world = NULL;
}

Test(parallel_state, self_every_group_is_this_rank, .init = open_self_world,
     .fini = close_self_world) {
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    int rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = world});
    cr_assert_eq(rc, MC_OK, "%s: %s", mc_err_name(rc), mc_last_error());
    cr_expect(ps.initialized);
    cr_expect_eq(ps.grid.dp, 1);
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        const char *name = mc_group_kind_name((mc_group_kind)k);
        mc_comm *g = mc_parallel_group(&ps, (mc_group_kind)k);
        cr_expect_not_null(g, "no %s group on a 1-rank world", name);
        if (g == NULL) continue;
        cr_expect_eq(g->size, 1, "%s size %d", name, g->size);
        cr_expect_eq(mc_parallel_rank(&ps, (mc_group_kind)k), 0, "%s rank", name);
        cr_expect_eq(mc_parallel_size(&ps, (mc_group_kind)k), 1, "%s size", name);
        cr_expect_eq(mc_parallel_src_rank(&ps, (mc_group_kind)k), 0, "%s src rank", name);
        cr_expect_eq(ps.group_index[k], 0, "%s group index", name);
        int32_t v = 5, s = 0;
        cr_expect_eq(mc_all_reduce(g, &v, &s, 1, MC_I32, MC_SUM), MC_OK, "%s all-reduce", name);
        cr_expect_eq(s, 5, "%s all-reduce gave %d", name, s);
    }
    cr_expect(mc_parallel_is_first_stage(&ps, 0) && mc_parallel_is_last_stage(&ps, 0),
              "the only stage is first and last");
    cr_expect(mc_parallel_in_embedding_group(&ps, 0), "PP = 1: the rank holds the embedding");
    cr_expect_eq(ps.n_created, mc_grid_creation_plan(&ps.grid, NULL, 0));
    cr_expect_eq(ps.plan_fingerprint, mc_grid_plan_fingerprint(&ps.grid, 0));
    cr_expect_eq(mc_parallel_destroy(&ps), MC_OK);
    cr_expect(!ps.initialized);
}

/* mc_parallel_init never reads its output struct: a state full of garbage (0xff, so that
   `initialized` reads as set) initialises as well as a zeroed one. */
Test(parallel_state, self_init_over_garbage_never_reads_the_struct, .init = open_self_world,
     .fini = close_self_world) {
    mc_parallel_state ps;
    memset(&ps, 0xff, sizeof ps);
    mc_parallel_desc desc = {.world = world};
    cr_assert_eq(mc_parallel_init(&ps, &desc), MC_OK, "init over 0xff: %s", mc_last_error());
    cr_expect_eq(ps.initialized, 1);
    cr_expect_eq(ps.vp_stage, 0, "a field kept the garbage");
    cr_expect_eq(ps.n_created, mc_grid_creation_plan(&ps.grid, NULL, 0));
    cr_expect_not_null(mc_parallel_group(&ps, MC_GROUP_TP));
    cr_expect_eq(mc_parallel_destroy(&ps), MC_OK);
    cr_expect_eq(mc_parallel_init(&ps, &desc), MC_OK, "init after destroy: %s", mc_last_error());
    cr_expect_eq(mc_parallel_destroy(&ps), MC_OK);
}

/* A failed init leaves a zeroed state behind, whatever the struct held: destroy refuses it
   and no getter returns a stale pointer. */
Test(parallel_state, self_failed_init_leaves_a_zeroed_state, .init = open_self_world,
     .fini = close_self_world) {
    mc_parallel_state ps;
    memset(&ps, 0xff, sizeof ps);
    int rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = world, .grid = {.tp = 2}});
    cr_expect_eq(rc, MC_ERR_INVALID_DESC, "tp 2 on 1 rank: %s", mc_err_name(rc));
    cr_expect_eq(ps.initialized, 0);
    cr_expect_null(mc_parallel_group(&ps, MC_GROUP_TP));
    cr_expect_eq(mc_parallel_destroy(&ps), MC_ERR_STATE);
}

Test(parallel_state, self_rejects_sizes_that_do_not_fit, .init = open_self_world,
     .fini = close_self_world) {
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    int rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = world, .grid = {.tp = 2}});
    cr_expect_eq(rc, MC_ERR_INVALID_DESC, "tp 2 on 1 rank: %s", mc_err_name(rc));
    cr_expect(mc_test_contains(mc_last_error(), "tensor_model_parallel_size"),
              "message should name the rule: \"%s\"", mc_last_error());
    cr_expect(!ps.initialized);

    rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = world, .grid = {.world = 2}});
    cr_expect_eq(rc, MC_ERR_INVALID_DESC, "grid.world 2 on a 1-rank world: %s", mc_err_name(rc));

    rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = world, .grid = {.vpp = 2}});
    cr_expect_eq(rc, MC_ERR_INVALID_DESC, "vpp 2 with pp 1: %s", mc_err_name(rc));

    rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = NULL});
    cr_expect(rc < 0, "a desc without a world was accepted");
    cr_expect(!ps.initialized);
}

Test(parallel_state, self_check_plan_agrees_with_itself, .init = open_self_world,
     .fini = close_self_world) {
    mc_grid g;
    cr_assert_eq(mc_grid_init(&g, &(mc_grid_desc){.world = 1}), MC_OK);
    cr_expect_eq(mc_parallel_check_plan(world, &g, 0), MC_OK, "%s", mc_last_error());
    cr_expect_eq(mc_parallel_check_plan(world, &g, 12345), MC_OK, "%s", mc_last_error());
}
