/* test_comm.c - the communicator layer: self backend in process, MPI through comm_cases.

   The multi-rank tests launch build/tests/comm_cases under mpirun (never this binary) and
   judge its exit status and its "N passed, N failed" line. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define RUN_LIMIT_S 90.0   /* below the suite's timeout, so the group kill reports the hang */
#define OUT_CAP (1 << 17)

TestSuite(comm, .timeout = 120);

/* ---------------------------------------------------------------------------------------------
   multi-rank cases */

typedef struct comm_run {
    char case_name[32];
    int np;
    char extra[32];   /* extra arguments, e.g. "--backend mpi" */
} comm_run;

/* Runs comm_cases and checks: exit 0, a summary line with checks passed and none failed. */
static void run_comm_case(const char *case_name, int np, const char *extra) {
    char prog[4096], cmd[4400];
    mc_test_sibling("comm_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s %s %s", prog, case_name, extra ? extra : "");
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect_eq(rc, 0, "comm_cases %s on %d ranks exited %d\n%s", case_name, np, rc, out);
    cr_expect(found, "comm_cases %s on %d ranks printed no summary line\n%s", case_name, np, out);
    cr_expect(found && failed == 0 && passed > 0,
              "comm_cases %s on %d ranks: %d passed, %d failed\n%s", case_name, np, passed,
              failed, out);
    free(out);
}

/* Every case at the sizes it fits: odd sizes and 8 (more ranks than cores) included. */
static comm_run comm_runs[] = {
    {"allreduce", 1, ""},         {"allreduce", 1, "--backend mpi"},
    {"allreduce", 2, ""},         {"allreduce", 3, ""},
    {"allreduce", 4, ""},         {"allreduce", 8, ""},
    {"allgather", 1, ""},         {"allgather", 3, ""},
    {"allgather", 4, ""},         {"allgather", 8, ""},
    {"reduce_scatter", 1, ""},    {"reduce_scatter", 2, ""},
    {"reduce_scatter", 3, ""},    {"reduce_scatter", 8, ""},
    {"broadcast", 1, ""},         {"broadcast", 3, ""},
    {"broadcast", 4, ""},         {"broadcast", 8, ""},
    {"ring", 2, ""},              {"ring", 3, ""},
    {"ring", 8, ""},              {"batch", 2, ""},
    {"batch", 3, ""},             {"batch", 8, ""},
    {"async", 1, ""},             {"async", 2, ""},
    {"async", 3, ""},             {"async", 8, ""},
    {"barrier", 1, ""},           {"barrier", 4, ""},
    {"barrier", 8, ""},           {"create_collective", 1, ""},
    {"create_collective", 2, ""}, {"create_collective", 3, ""},
    {"create_collective", 4, ""}, {"create_collective", 8, ""},
    {"create_local", 1, ""},      {"create_local", 3, ""},
    {"create_local", 4, ""},      {"create_local", 8, ""},
    {"mismatch", 2, ""},          {"mismatch", 3, ""},
    {"mismatch", 8, ""},          {"positional", 2, ""},
    {"positional", 4, ""},        {"timeout", 2, ""},
    {"timeout", 4, ""},
    {"agree", 2, ""},             {"agree", 3, ""},
    {"agree", 8, ""},
    {"watchdog_slow", 3, ""},     {"watchdog_slow", 8, ""},
};

ParameterizedTestParameters(comm, cases) {
    return cr_make_param_array(comm_run, comm_runs, sizeof comm_runs / sizeof comm_runs[0]);
}

ParameterizedTest(comm_run *run, comm, cases) {
    cr_log_info("comm_cases %s, %d ranks %s", run->case_name, run->np, run->extra);
    run_comm_case(run->case_name, run->np, run->extra);
}

/* A case that needs a peer says so at np = 1 instead of failing or hanging. */
Test(comm, needs_two_ranks_is_a_skip) {
    char prog[4096], cmd[4400], out[4096];
    mc_test_sibling("comm_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s ring", prog);
    int rc = mc_test_mpirun(1, cmd, RUN_LIMIT_S, out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "skipped: needs 2 ranks"), "%s", out);
}

/* The timeout case must end in about its timeouts (2 + 1 + 1 s), never hang. */
Test(comm, timeout_ends_in_bounded_time) {
    char prog[4096], cmd[4400], out[1 << 15];
    mc_test_sibling("comm_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s timeout", prog);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(3, cmd, RUN_LIMIT_S, out, sizeof out);
    double elapsed = mc_test_now() - t0;
    cr_expect_eq(rc, 0, "exit %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "MC_ERR_TIMEOUT"), "%s", out);
    cr_expect(elapsed < 20.0, "the timeout case took %.1f s\n%s", elapsed, out);
}

/* The watchdog cases end the job on purpose: the ranks exit without MPI_Finalize (which would
   wait for the stuck rank), so mpirun's exit status is not 0; the checks are the lines the
   ranks print and the time it took. */
static void run_watchdog_case(const char *case_name, int np, const char *want) {
    char prog[4096], cmd[4400];
    mc_test_sibling("comm_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s %s", prog, case_name);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(np, cmd, 60.0, out, OUT_CAP);
    double elapsed = mc_test_now() - t0;
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect(rc != -1, "comm_cases %s on %d ranks hung (killed after 60 s)\n%s", case_name, np,
              out);
    cr_expect(found && failed == 0 && passed > 0, "comm_cases %s on %d ranks: %d passed, %d "
              "failed\n%s", case_name, np, passed, failed, out);
    cr_expect(!mc_test_contains(out, "] FAIL "), "%s", out);
    cr_expect(mc_test_contains(out, want), "want \"%s\" in\n%s", want, out);
    cr_expect(elapsed < 20.0, "the job took %.1f s to end (the watchdog is 3 s)\n%s", elapsed,
              out);
    free(out);
}

Test(comm, watchdog_ends_a_deadlock_on_every_rank) {
    run_watchdog_case("watchdog_deadlock", 3, "although every rank answers");
}

/* kill -STOP of one rank (here the rank stops itself): every other rank ends within the
   watchdog's limit naming it, and mpirun ends it. */
Test(comm, watchdog_names_a_stopped_rank) {
    run_watchdog_case("watchdog_stop", 4, "watchdog: rank 3 made no progress");
}

/* The mpi backend with a device table (ranks sharing a GPU): every collective staged through
   host copies, checked on a pretend device whose bytes are scrambled (staged_cases.c). */
static void run_staged(int np) {
    char prog[4096], cmd[4400];
    mc_test_sibling("staged_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s all", prog);
    char *out = malloc(OUT_CAP);
    cr_assert_not_null(out);
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    int passed = 0, failed = -1;
    int found = mc_test_summary(out, &passed, &failed);
    cr_expect_eq(rc, 0, "staged_cases on %d ranks exited %d\n%s", np, rc, out);
    cr_expect(found && failed == 0 && passed >= 23 * np,
              "staged_cases on %d ranks: %d passed, %d failed\n%s", np, passed, failed, out);
    free(out);
}

Test(comm, mpi_stages_a_device_table_on_one_rank) { run_staged(1); }
Test(comm, mpi_stages_a_device_table_on_three_ranks) { run_staged(3); }
Test(comm, mpi_stages_a_device_table_on_eight_ranks) { run_staged(8); }

/* An unknown case is a usage error, not a pass. */
Test(comm, unknown_case_fails) {
    char prog[4096], cmd[4400], out[4096];
    mc_test_sibling("comm_cases", prog, sizeof prog);
    snprintf(cmd, sizeof cmd, "%s no_such_case", prog);
    int rc = mc_test_mpirun(1, cmd, RUN_LIMIT_S, out, sizeof out);
    cr_expect_neq(rc, 0, "an unknown case exited 0\n%s", out);
    cr_expect(mc_test_contains(out, "usage:"), "%s", out);
}

/* ---------------------------------------------------------------------------------------------
   the self backend, in this process: a world of one rank that needs no MPI */

static mc_comm *self_world(void) {
    mc_comm *w = NULL;
    int rc = mc_comm_init_world(&w, &(mc_comm_desc){.backend = MC_BACKEND_SELF});
    cr_assert_eq(rc, MC_OK, "mc_comm_init_world(self): %s: %s", mc_err_name(rc), mc_last_error());
    cr_assert_not_null(w);
    return w;
}

Test(comm, self_world_needs_no_mpi) {
    mc_comm *w = self_world();
    cr_expect_eq(w->size, 1);
    cr_expect_eq(w->rank, 0);
    cr_expect_eq(w->world_rank, 0);
    cr_expect_eq(w->backend, MC_BACKEND_SELF);
    cr_expect_str_eq(mc_backend_name(w->backend), "self");
    cr_expect(w->timeout_s > 0, "default timeout %g", w->timeout_s);
    int initialized = 1;
    MPI_Initialized(&initialized);
    cr_expect_eq(initialized, 0, "the self backend initialised MPI");
    mc_comm_destroy(w);
}

Test(comm, self_collectives_are_identity) {
    mc_comm *w = self_world();
    const mc_reduce_op ops[] = {MC_SUM, MC_MAX, MC_MIN, MC_AVG};
    float in[5] = {1.5f, -2.0f, 0.0f, 7.25f, -0.5f}, out[5];
    for (int o = 0; o < 4; o++) {
        memset(out, 0, sizeof out);
        cr_expect_eq(mc_all_reduce(w, in, out, 5, MC_F32, ops[o]), MC_OK, "op %d: %s", o,
                     mc_last_error());
        mc_test_allclose(out, in, 5, 0.0f, 0.0f);
    }
    int64_t big[3] = {1LL << 40, -3, 5}, big_out[3] = {0};
    cr_expect_eq(mc_all_gather(w, big, big_out, 3, MC_I64), MC_OK);
    cr_expect_arr_eq(big_out, big, sizeof big);
    memset(big_out, 0, sizeof big_out);
    cr_expect_eq(mc_reduce_scatter(w, big, big_out, 3, MC_I64, MC_SUM), MC_OK);
    cr_expect_arr_eq(big_out, big, sizeof big);
    double d[2] = {0.25, 4.0};
    cr_expect_eq(mc_broadcast(w, d, 2, MC_F64, 0), MC_OK);
    cr_expect(d[0] == 0.25 && d[1] == 4.0, "broadcast changed the root's data");
    cr_expect_eq(mc_barrier(w), MC_OK);
    mc_comm_destroy(w);
}

Test(comm, self_async_and_test) {
    mc_comm *w = self_world();
    int32_t in[4] = {1, 2, 3, 4}, out[4] = {0};
    mc_request *req = NULL;
    cr_assert_eq(mc_all_reduce_async(w, in, out, 4, MC_I32, MC_SUM, &req), MC_OK, "%s",
                 mc_last_error());
    cr_assert_not_null(req);
    int done = 0;
    for (int polls = 0; polls < 1000 && !done; polls++)
        cr_assert_eq(mc_test(req, &done), MC_OK, "%s", mc_last_error());
    cr_expect_eq(done, 1, "a size-1 all-reduce never completed");   /* done also freed req */
    cr_expect_arr_eq(out, in, sizeof in);

    mc_request *b = NULL;
    cr_assert_eq(mc_barrier_async(w, &b), MC_OK);
    cr_expect_eq(mc_wait(b), MC_OK);
    mc_comm_destroy(w);
}

Test(comm, self_groups) {
    mc_comm *w = self_world();
    int me[1] = {0};
    mc_comm *g = NULL;
    cr_assert_eq(mc_comm_create_group(w, me, 1, &g), MC_OK, "%s", mc_last_error());
    cr_assert_not_null(g);
    cr_expect_eq(g->size, 1);
    cr_expect_eq(g->rank, 0);
    cr_expect_eq(g->world_ranks[0], 0);
    cr_expect_eq(g->backend, MC_BACKEND_SELF);
    float x = 3.0f, y = 0.0f;
    cr_expect_eq(mc_all_reduce(g, &x, &y, 1, MC_F32, MC_SUM), MC_OK);
    cr_expect_eq(y, 3.0f);
    mc_comm_destroy(g);

    mc_comm *l = NULL;
    cr_expect_eq(mc_comm_create_group_local(w, me, 1, 42, &l), MC_OK, "%s", mc_last_error());
    cr_expect(l != NULL && l->size == 1, "local singleton group");
    if (l) mc_comm_destroy(l);
    mc_comm_destroy(w);
}

Test(comm, self_rejects_bad_ranks) {
    mc_comm *w = self_world();
    int outside[1] = {1}, dup[2] = {0, 0};
    mc_comm *g = NULL;
    cr_expect_eq(mc_comm_create_group(w, outside, 1, &g), MC_ERR_INVALID_ARG,
                 "member 1 of a 1-rank world: %s", mc_last_error());
    cr_expect_null(g);
    cr_expect(strlen(mc_last_error()) > 0, "no message for an invalid member");
    cr_expect_eq(mc_comm_create_group(w, dup, 2, &g), MC_ERR_INVALID_ARG,
                 "duplicate member: %s", mc_last_error());
    cr_expect_null(g);
    double d = 1.0;
    cr_expect_eq(mc_broadcast(w, &d, 1, MC_F64, 1), MC_ERR_INVALID_ARG,
                 "broadcast from root 1 of 1: %s", mc_last_error());
    mc_comm_destroy(w);
}

Test(comm, self_buffers_round_trip) {
    mc_comm *w = self_world();
    float host[8], back[8];
    for (int i = 0; i < 8; i++) host[i] = 0.5f * (float)i - 1.0f;
    float *buf = mc_comm_alloc(w, sizeof host);
    cr_assert_not_null(buf);
    cr_expect_eq(mc_comm_upload(w, buf, host, sizeof host), MC_OK);
    cr_expect_eq(mc_all_reduce(w, buf, buf, 8, MC_F32, MC_SUM), MC_OK);
    cr_expect_eq(mc_comm_download(w, back, buf, sizeof back), MC_OK);
    mc_test_allclose(back, host, 8, 0.0f, 0.0f);
    mc_comm_free(w, buf);
    mc_comm_destroy(w);
}

#if !defined(MC_ENABLE_CUDA)
Test(comm, nccl_without_cuda_is_unsupported) {
    mc_comm *w = (mc_comm *)&w;
    int rc = mc_comm_init_world(&w, &(mc_comm_desc){.backend = MC_BACKEND_NCCL});
    cr_expect_eq(rc, MC_ERR_UNSUPPORTED, "got %s: %s", mc_err_name(rc), mc_last_error());
    cr_expect_null(w, "a failed init left a world behind");
    if (rc == MC_OK && w) mc_comm_destroy(w);
}
#endif

/* The MPI backend on a singleton world (MPI_Init inside the test: each test is a process). */
Test(comm, mpi_singleton_owns_init_and_finalize) {
    mc_comm *w = NULL;
    int rc = mc_comm_init_world(&w, &(mc_comm_desc){.backend = MC_BACKEND_MPI});
    cr_assert_eq(rc, MC_OK, "%s: %s", mc_err_name(rc), mc_last_error());
    cr_expect_eq(w->backend, MC_BACKEND_MPI);
    cr_expect_eq(w->size, 1);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    cr_expect_eq(initialized, 1);
    cr_expect_eq(w->owns_mpi_init, 1, "the world initialised MPI, so it must finalise it");
    int64_t v = 9, s = 0;
    cr_expect_eq(mc_all_reduce(w, &v, &s, 1, MC_I64, MC_MAX), MC_OK);
    cr_expect_eq(s, 9);
    mc_comm_destroy(w);
    MPI_Finalized(&finalized);
    cr_expect_eq(finalized, 1, "mc_comm_destroy(world) did not finalise MPI");
}

/* ---------------------------------------------------------------------------------------------
   mc_backend_query: what the process runs on */

Test(comm, backend_query_names_backend_reason_and_mpi) {
    mc_comm *w = NULL;
    int rc = mc_comm_init_world(&w, &(mc_comm_desc){.backend = MC_BACKEND_AUTO});
    cr_assert_eq(rc, MC_OK, "%s: %s", mc_err_name(rc), mc_last_error());
    mc_backend_info info;
    memset(&info, 0x5a, sizeof info);   /* output only: garbage in, full answer out */
    cr_assert_eq(mc_backend_query(w, &info), MC_OK, "%s", mc_last_error());
    cr_expect_str_eq(info.backend, mc_backend_name(w->backend));
    cr_expect_str_eq(info.backend_reason, w->backend_reason);
    cr_expect(strlen(info.backend_reason) > 10, "no reason: '%s'", info.backend_reason);
    cr_expect_eq(info.world_size, 1);
    cr_expect_str_eq(info.device_kind, "cpu");
    cr_expect(mc_test_contains(info.mpi_library, "MPI"), "mpi_library '%s'", info.mpi_library);
    cr_expect(strchr(info.mpi_version, '.') != NULL, "mpi_version '%s'", info.mpi_version);
    cr_expect(info.cpu_count >= 1, "cpu_count %d", info.cpu_count);
    cr_expect_eq(info.device_count, info.cpu_count, "a cpu world counts cpus");
#if !defined(MC_ENABLE_CUDA)
    cr_expect_eq(info.cuda_built, 0);
    cr_expect_eq(info.gpu_count, 0);
    cr_expect_str_empty(info.nccl_version);
    cr_expect_str_empty(info.cuda_runtime);
#endif
    mc_comm_destroy(w);
}

Test(comm, backend_query_without_a_world_and_with_a_self_world) {
    mc_backend_info info;
    cr_expect_eq(mc_backend_query(NULL, NULL), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "out"), "%s", mc_last_error());
    cr_assert_eq(mc_backend_query(NULL, &info), MC_OK);
    cr_expect_str_empty(info.backend);
    cr_expect_eq(info.world_size, 0);
    mc_comm *w = self_world();
    cr_assert_eq(mc_backend_query(w, &info), MC_OK);
    cr_expect_str_eq(info.backend, "self");
    cr_expect_str_eq(info.backend_reason, "requested by mc_comm_desc.backend");
    mc_comm_destroy(w);
}
