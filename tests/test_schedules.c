/* test_schedules.c - the schedules that run compute (megatron_semantics.md section 8):
   the dispatcher against Megatron's test_get_forward_backward_func table, no pipelining in
   process on the self backend (op order, grad-sync switch, finalize, loss scaling, gradients
   of a toy model against its single-process reference, forward_only, argument and hook
   errors), and 1F1B / interleaved 1F1B over real pipeline stages through
   build/tests/sched_cases under mpirun (1, 2 and 4 ranks). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"
#include "tests/sched_toy.h"

#define RUN_LIMIT_S 90.0
#define OUT_CAP (1 << 17)

TestSuite(schedules, .timeout = 120);

/* ---------------------------------------------------------------------------------------------
   dispatcher (section 8.1): the choice depends on the grid alone, so a state with only its
   grid filled in stands for a run of TP x PP ranks */

static mc_forward_backward_func dispatch(int tp, int pp, int vpp) {
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    mc_grid_desc d;
    memset(&d, 0, sizeof d);
    d.world = tp * pp;
    d.tp = tp;
    d.pp = pp;
    d.vpp = vpp;
    cr_assert_eq(mc_grid_init(&ps.grid, &d), MC_OK, "%s", mc_last_error());
    return mc_get_forward_backward_func(&ps);
}

Test(schedules, dispatcher_follows_megatron_table) {
    cr_expect(dispatch(2, 1, 0) == mc_forward_backward_no_pipelining, "TP 2 PP 1");
    cr_expect(dispatch(2, 4, 0) == mc_forward_backward_pipelining_without_interleaving,
              "TP 2 PP 4");
    cr_expect(dispatch(2, 4, 2) == mc_forward_backward_pipelining_with_interleaving,
              "TP 2 PP 4 VPP 2");
    cr_expect(dispatch(2, 2, 4) == mc_forward_backward_pipelining_with_interleaving,
              "TP 2 PP 2 VPP 4");
    /* Megatron's arguments turn a virtual size of 1 into None */
    cr_expect(dispatch(1, 2, 1) == mc_forward_backward_pipelining_without_interleaving,
              "PP 2 VPP 1");
    cr_expect(mc_get_forward_backward_func(NULL) == NULL);
}

/* ---------------------------------------------------------------------------------------------
   no pipelining in process */

static mc_comm *world;
static mc_parallel_state ps;

static void self_setup(void) {
    cr_assert_eq(mc_comm_init_world(&world, &(mc_comm_desc){.backend = MC_BACKEND_SELF}), MC_OK,
                 "%s", mc_last_error());
    memset(&ps, 0, sizeof ps);
    cr_assert_eq(mc_parallel_init(&ps, &(mc_parallel_desc){.world = world}), MC_OK, "%s",
                 mc_last_error());
}

static void self_teardown(void) {
    mc_parallel_destroy(&ps);
    mc_comm_destroy(world);
}

static mc_schedule_result result;

static void expect_events(const toy *t, int forward_only, const char *want_text) {
    toy_event want[256];
    char got[2048], expected[2048];
    int n = toy_expected_events(t, 0, forward_only, want, 256);
    toy_events_text(t->ev, t->n_ev, got, sizeof got);
    toy_events_text(want, n, expected, sizeof expected);
    cr_expect_str_eq(got, expected);
    if (want_text) cr_expect_str_eq(got, want_text);
    cr_expect_eq(t->contract_errors, 0, "%s", t->first_error);
}

static void expect_grads(const toy *t, int m, float times) {
    float dw[TOY_MAX_STAGES][TOY_E], db[TOY_MAX_STAGES][TOY_E], got_w[TOY_E], got_b[TOY_E];
    float want_w[TOY_E], want_b[TOY_E];
    double loss;
    toy_reference(1, m, dw, db, &loss);
    for (int e = 0; e < TOY_E; e++) {
        got_w[e] = t->dw[0][e];
        got_b[e] = t->db[0][e];
        want_w[e] = times * dw[0][e];
        want_b[e] = times * db[0][e];
    }
    mc_test_allclose(got_w, want_w, TOY_E, 1e-7f, 1e-6f);
    mc_test_allclose(got_b, want_b, TOY_E, 1e-7f, 1e-6f);
}

Test(schedules, no_pipelining_runs_f_b_pairs_and_syncs_the_last, .init = self_setup,
     .fini = self_teardown) {
    toy t;
    cr_assert_eq(toy_init(&t, 1, 0, 1, 4), 0);
    mc_schedule_hooks hooks = toy_hooks(&t, 0);
    cr_assert(mc_get_forward_backward_func(&ps) == mc_forward_backward_no_pipelining);
    int rc = mc_forward_backward_no_pipelining(&ps, &hooks, 4, 0, &result);
    cr_assert_eq(rc, MC_OK, "%s", mc_last_error());
    /* backwards 0..2 inside no_sync, the last one with sync on, then finalize */
    expect_events(&t, 0, "S0:0 F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 S0:1 B3.0 S0:0 Z");
    cr_expect_eq(result.n_ops, 8);
    cr_expect_eq(result.n_warmup, 0);
    double ref_loss;
    float rw[TOY_MAX_STAGES][TOY_E], rb[TOY_MAX_STAGES][TOY_E];
    toy_reference(1, 4, rw, rb, &ref_loss);
    cr_expect_float_eq(result.loss_sum, ref_loss, 1e-12);
    cr_expect_eq(result.num_tokens, 4.0 * TOY_E);
    expect_grads(&t, 4, 1.0f);
    toy_free(&t);
}

Test(schedules, no_pipelining_forward_only_skips_backward_sync_finalize, .init = self_setup,
     .fini = self_teardown) {
    toy t;
    cr_assert_eq(toy_init(&t, 1, 0, 1, 3), 0);
    mc_schedule_hooks hooks = toy_hooks(&t, 0);
    hooks.backward_step = NULL;   /* not needed when forward_only */
    int rc = mc_forward_backward_no_pipelining(&ps, &hooks, 3, 1, &result);
    cr_assert_eq(rc, MC_OK, "%s", mc_last_error());
    expect_events(&t, 1, "F0.0 F1.0 F2.0");
    cr_expect_eq(result.n_ops, 3);
    cr_expect_gt(result.loss_sum, 0.0);
    toy_free(&t);
}

/* hooks.clock: each traced op is stamped right before its hook is called and right after it
   returns. With a clock that counts its calls, op i starts at 2i and ends at 2i + 1 and nothing
   else reads the clock; without a clock both times stay 0. */
static double clock_calls;
static double counting_clock(void *app) {
    (void)app;
    return clock_calls++;
}

Test(schedules, trace_clock_stamps_every_op_around_its_hook, .init = self_setup,
     .fini = self_teardown) {
    toy t;
    cr_assert_eq(toy_init(&t, 1, 0, 1, 3), 0);
    mc_schedule_hooks hooks = toy_hooks(&t, 0);
    hooks.clock = counting_clock;
    clock_calls = 0;
    int rc = mc_forward_backward_no_pipelining(&ps, &hooks, 3, 0, &result);
    cr_assert_eq(rc, MC_OK, "%s", mc_last_error());
    cr_assert_eq(result.n_ops, 6);
    for (int i = 0; i < result.n_ops; i++) {
        cr_expect_eq(result.op_start[i], 2.0 * i, "op %d (%c%d) started at %g", i,
                     result.ops[i].kind, result.ops[i].microbatch, result.op_start[i]);
        cr_expect_eq(result.op_end[i], 2.0 * i + 1.0, "op %d ended at %g", i, result.op_end[i]);
    }
    cr_expect_eq(clock_calls, 12.0, "two stamps per op and no others (%g)", clock_calls);
    toy_free(&t);

    cr_assert_eq(toy_init(&t, 1, 0, 1, 3), 0);
    hooks = toy_hooks(&t, 0);
    cr_assert_eq(mc_forward_backward_no_pipelining(&ps, &hooks, 3, 0, &result), MC_OK);
    for (int i = 0; i < result.n_ops; i++)
        cr_expect(result.op_start[i] == 0.0 && result.op_end[i] == 0.0, "no clock: op %d", i);
    toy_free(&t);
}

/* Megatron's 1F1B function also runs PP = 1 (warmup 0): the same order as no pipelining. */
Test(schedules, one_f_one_b_on_a_single_stage_equals_no_pipelining, .init = self_setup,
     .fini = self_teardown) {
    toy t;
    cr_assert_eq(toy_init(&t, 1, 0, 1, 5), 0);
    mc_schedule_hooks hooks = toy_hooks(&t, 0);
    int rc = mc_forward_backward_pipelining_without_interleaving(&ps, &hooks, 5, 0, &result);
    cr_assert_eq(rc, MC_OK, "%s", mc_last_error());
    expect_events(&t, 0, "S0:0 F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 S0:1 B4.0 S0:0 Z");
    expect_grads(&t, 5, 1.0f);
    /* a second step accumulates into the same gradients */
    t.n_ev = 0;
    cr_assert_eq(mc_forward_backward_pipelining_without_interleaving(&ps, &hooks, 5, 0, &result),
                 MC_OK);
    expect_grads(&t, 5, 2.0f);
    toy_free(&t);
}

Test(schedules, interleaving_needs_model_chunks, .init = self_setup, .fini = self_teardown) {
    toy t;
    cr_assert_eq(toy_init(&t, 1, 0, 1, 4), 0);
    mc_schedule_hooks hooks = toy_hooks(&t, 0);
    int rc = mc_forward_backward_pipelining_with_interleaving(&ps, &hooks, 4, 0, &result);
    cr_expect_eq(rc, MC_ERR_INVALID_ARG, "%s", mc_err_name(rc));
    cr_expect(mc_test_contains(mc_last_error(), "model chunking"), "%s", mc_last_error());
    cr_expect_eq(t.n_ev, 0);
    toy_free(&t);
}

Test(schedules, arguments_are_checked_before_any_call, .init = self_setup,
     .fini = self_teardown) {
    toy t;
    cr_assert_eq(toy_init(&t, 1, 0, 1, 2), 0);
    mc_schedule_hooks hooks = toy_hooks(&t, 0), bad;
    mc_parallel_state blank;
    memset(&blank, 0, sizeof blank);
    cr_expect_eq(mc_forward_backward_no_pipelining(NULL, &hooks, 2, 0, &result), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_forward_backward_no_pipelining(&blank, &hooks, 2, 0, &result),
                 MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "not initialized"), "%s", mc_last_error());
    cr_expect_eq(mc_forward_backward_no_pipelining(&ps, NULL, 2, 0, &result), MC_ERR_INVALID_ARG);
    bad = hooks;
    bad.forward_step = NULL;
    cr_expect_eq(mc_forward_backward_no_pipelining(&ps, &bad, 2, 0, &result), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "forward_step"), "%s", mc_last_error());
    bad = hooks;
    bad.backward_step = NULL;
    cr_expect_eq(mc_forward_backward_no_pipelining(&ps, &bad, 2, 0, &result), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "backward_step"), "%s", mc_last_error());
    cr_expect_eq(mc_forward_backward_no_pipelining(&ps, &hooks, 2, 0, NULL), MC_ERR_INVALID_ARG);
    int rc = mc_forward_backward_no_pipelining(&ps, &hooks, 0, 0, &result);
    cr_expect_eq(rc, MC_ERR_INVALID_DESC, "%s", mc_err_name(rc));
    cr_expect(mc_test_contains(mc_last_error(), "num_microbatches (0)"), "%s", mc_last_error());
    cr_expect_eq(t.n_ev, 0, "hooks were called");
    toy_free(&t);
}

/* A failing hook stops the schedule with its status: no later op, no finalize. */
Test(schedules, a_failing_forward_step_stops_the_run, .init = self_setup, .fini = self_teardown) {
    toy t;
    cr_assert_eq(toy_init(&t, 1, 0, 1, 4), 0);
    t.fail_forward_at = 2;
    mc_schedule_hooks hooks = toy_hooks(&t, 0);
    int rc = mc_forward_backward_no_pipelining(&ps, &hooks, 4, 0, &result);
    cr_expect_eq(rc, MC_ERR_INVALID_ARG, "%s", mc_err_name(rc));
    char got[512];
    toy_events_text(t.ev, t.n_ev, got, sizeof got);
    cr_expect_str_eq(got, "S0:0 F0.0 B0.0 F1.0 B1.0 F2.0");
    cr_expect_eq(result.n_ops, 5);
    toy_free(&t);
}

/* Loss scaling: Megatron's 3-tuple path divides by max(num_tokens, 1) and by M. */
typedef struct scale_probe {
    double tokens[4];
    float seen[4];
} scale_probe;

static int probe_forward(void *app, int chunk, int mb, const float *input, float **output,
                         double *loss_sum, double *num_tokens) {
    scale_probe *p = (scale_probe *)app;
    *loss_sum = 1.0;
    *num_tokens = p->tokens[mb];
    *output = NULL;
    return MC_OK;
}

static int probe_backward(void *app, int chunk, int mb, const float *output_grad,
                          float loss_scale, float **input_grad) {
    ((scale_probe *)app)->seen[mb] = loss_scale;
    *input_grad = NULL;
    return MC_OK;
}

Test(schedules, loss_scale_is_one_over_tokens_times_microbatches, .init = self_setup,
     .fini = self_teardown) {
    scale_probe p = {{8.0, 0.0, 2.0, 0.5}, {0}};
    mc_schedule_hooks hooks;
    memset(&hooks, 0, sizeof hooks);
    hooks.app = &p;
    hooks.forward_step = probe_forward;
    hooks.backward_step = probe_backward;
    cr_assert_eq(mc_forward_backward_no_pipelining(&ps, &hooks, 4, 0, &result), MC_OK, "%s",
                 mc_last_error());
    cr_expect_float_eq(p.seen[0], 1.0f / 32.0f, 1e-9f);
    cr_expect_float_eq(p.seen[1], 1.0f / 4.0f, 1e-9f);   /* all tokens masked: max(0, 1) */
    cr_expect_float_eq(p.seen[2], 1.0f / 8.0f, 1e-9f);
    cr_expect_float_eq(p.seen[3], 1.0f / 4.0f, 1e-9f);   /* max(0.5, 1) */
    cr_expect_float_eq(result.loss_sum, 4.0, 1e-12);
    cr_expect_float_eq(result.num_tokens, 10.5, 1e-12);
}

/* Megatron's forward_step_func returns (output, loss_func): the schedule calls loss_func on
   the last stage with that output, and the seed uses loss_func's num_tokens. */
typedef struct loss_probe {
    float out[4][2];
    int forwards, losses;
    const float *given[4];
    float seen[4];
} loss_probe;

static int lp_forward(void *app, int chunk, int mb, const float *input, float **output,
                      double *loss_sum, double *num_tokens) {
    loss_probe *p = (loss_probe *)app;
    p->forwards++;
    p->out[mb][0] = (float)mb;
    *output = p->out[mb];
    return MC_OK;
}

static int lp_loss(void *app, int mb, const float *output, double *loss_sum,
                   double *num_tokens) {
    loss_probe *p = (loss_probe *)app;
    p->losses++;
    p->given[mb] = output;
    *loss_sum = output[0];
    *num_tokens = 2.0 * (mb + 1);
    return MC_OK;
}

static int lp_backward(void *app, int chunk, int mb, const float *output_grad, float loss_scale,
                       float **input_grad) {
    ((loss_probe *)app)->seen[mb] = loss_scale;
    *input_grad = NULL;
    return MC_OK;
}

Test(schedules, loss_func_reads_the_forward_output_and_sets_the_seed, .init = self_setup,
     .fini = self_teardown) {
    static loss_probe p;
    memset(&p, 0, sizeof p);
    mc_schedule_hooks hooks;
    memset(&hooks, 0, sizeof hooks);
    hooks.app = &p;
    hooks.forward_step = lp_forward;
    hooks.loss_func = lp_loss;
    hooks.backward_step = lp_backward;
    cr_assert_eq(mc_forward_backward_no_pipelining(&ps, &hooks, 4, 0, &result), MC_OK, "%s",
                 mc_last_error());
    cr_expect_eq(p.forwards, 4);
    cr_expect_eq(p.losses, 4);
    for (int mb = 0; mb < 4; mb++) {
        cr_expect(p.given[mb] == p.out[mb], "micro-batch %d: loss_func got another tensor", mb);
        cr_expect_float_eq(p.seen[mb], 1.0f / (2.0f * (float)(mb + 1) * 4.0f), 1e-9f);
    }
    cr_expect_float_eq(result.loss_sum, 0.0 + 1.0 + 2.0 + 3.0, 1e-12);
    cr_expect_float_eq(result.num_tokens, 2.0 + 4.0 + 6.0 + 8.0, 1e-12);
}

/* ---------------------------------------------------------------------------------------------
   pipelines over MPI ranks (build/tests/sched_cases) */

typedef struct sched_run {
    char case_name[16];
    int np;
    char args[48];
} sched_run;

static sched_run sched_runs[] = {
    /* no pipelining and 1F1B; "--pp 2" on 4 ranks: two data-parallel pipelines at once */
    {"train", 1, "--m 4"},
    {"train", 2, "--m 4"},
    {"train", 2, "--m 1"},                 /* warmup clamps to M */
    {"train", 2, "--m 7"},
    {"train", 4, "--m 8"},
    {"train", 4, "--m 2"},                 /* stages 0 and 1 clamp */
    {"train", 4, "--m 1"},
    {"train", 4, "--pp 2 --m 3"},
    /* interleaved */
    {"train", 2, "--vpp 2 --m 2"},         /* every micro-batch in warmup on pp rank 0 */
    {"train", 2, "--vpp 2 --m 4"},
    {"train", 2, "--vpp 2 --m 5 --n 3"},   /* the table of the schedules.py comment */
    {"train", 2, "--vpp 4 --m 6"},
    {"train", 4, "--vpp 2 --m 4"},
    {"train", 4, "--vpp 2 --m 8"},
    {"train", 4, "--vpp 2 --m 9 --n 5"},   /* last group of 4 = PP */
    {"train", 4, "--vpp 3 --m 4"},
    {"train", 4, "--pp 2 --vpp 2 --m 4"},
    /* refusals: Megatron's interleaving rules, schedules that do not fit the state */
    {"invalid", 1, "--m 4"},
    {"invalid", 2, "--m 4"},
    {"invalid", 2, "--vpp 2 --m 3"},       /* M mod N = 1 < PP */
    {"invalid", 4, "--vpp 2 --m 2"},       /* N = PP = 4 > M */
    {"invalid", 4, "--vpp 2 --m 9 --n 4"}, /* M mod N = 1 < PP */
    {"invalid", 4, "--vpp 2 --m 8 --n 3"}, /* N < PP */
};

ParameterizedTestParameters(schedules, pipelines) {
    return cr_make_param_array(sched_run, sched_runs, sizeof sched_runs / sizeof sched_runs[0]);
}

ParameterizedTest(sched_run *run, schedules, pipelines) {
    char prog[4096], cmd[4400];
    mc_test_sibling("sched_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s %s %s", prog, run->case_name, run->args);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    int rc = mc_test_mpirun(run->np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect_eq(rc, 0, "sched_cases %s %s on %d ranks exited %d\n%s", run->case_name, run->args,
                 run->np, rc, out);
    cr_expect(found && failed == 0 && passed > 0,
              "sched_cases %s %s on %d ranks: %d passed, %d failed\n%s", run->case_name,
              run->args, run->np, passed, failed, out);
    free(out);
}

/* The executor checks its own op order against mc_schedule_ops before any P2P: a copy of the
   library with a planted 1F1B bug (one warmup forward too many) must be refused on every stage
   at once, with no compute run and no stage left waiting for a peer. */
Test(schedules, executor_refuses_an_order_the_op_table_does_not_list) {
    char prog[4096];
    mc_test_sibling("sched_fault_cases", prog, sizeof prog);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    for (int np = 2; np <= 4; np += 2) {
        double t0 = mc_test_now();
        int rc = mc_test_mpirun(np, prog, RUN_LIMIT_S, out, OUT_CAP);
        int passed = 0, failed = -1;
        int found = mc_test_summary(out, &passed, &failed);
        cr_expect_eq(rc, 0, "sched_fault_cases on %d ranks exited %d\n%s", np, rc, out);
        cr_expect(found && failed == 0 && passed > 0, "sched_fault_cases on %d ranks: %d passed, "
                  "%d failed\n%s", np, passed, failed, out);
        cr_expect(mc_test_contains(out, "mc_schedule_ops lists"), "%s", out);
        cr_expect_lt(mc_test_now() - t0, 30.0, "took %.1f s", mc_test_now() - t0);
    }
    free(out);
}
