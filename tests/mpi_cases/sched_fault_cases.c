/* sched_fault_cases.c - the pipeline executor's op-table check, shown able to fail.

       mpirun -np P build/tests/sched_fault_cases

   This program carries its own copy of the library (MC_STATIC), built with MC__SCHEDULE_FAULT:
   its 1F1B executor runs one warmup forward too many, a bug that a test comparing the
   parallel run with itself could not see. Every stage must refuse to run with MC_ERR_STATE
   naming the first op that differs from mc_schedule_ops, before any compute and before any
   P2P (so no stage waits for a peer), and end in well under a second. */
#define MC_STATIC
#define MC__SCHEDULE_FAULT 1
#define MEGATRON_C_IMPLEMENTATION
#include "megatron_c.h"

#include <stdio.h>
#include <string.h>

#include "tests/test_util.h"
#include "tests/sched_toy.h"

static mc_comm *world;
static mc_parallel_state ps;

static void case_fault(void) {
    const int m = 2 * world->size;
    int pp_rank = mc_parallel_rank(&ps, MC_GROUP_PP);
    toy t;
    if (!MC_CASE_CHECK(toy_init(&t, world->size, pp_rank, 1, m) == 0, "toy_init")) return;
    mc_schedule_hooks hooks = toy_hooks(&t, 0);
    static mc_schedule_result result;
    double t0 = mc_test_now();
    int rc = mc_forward_backward_pipelining_without_interleaving(&ps, &hooks, m, 0, &result);
    double elapsed = mc_test_now() - t0;
    MC_CASE_CHECK_STATUS(rc, MC_ERR_STATE, "the faulty 1F1B executor");
    const char *msg = mc_last_error();
    MC_CASE_CHECK(strstr(msg, "mc_schedule_ops lists") && strstr(msg, "before any P2P"),
                  "the refusal must name the op table: \"%s\"", msg);
    MC_CASE_CHECK(t.n_forward == 0 && result.n_ops == 0, "%d forwards (%d ops) ran before the "
                  "refusal", t.n_forward, result.n_ops);
    MC_CASE_CHECK(elapsed < 1.0, "the refusal took %.2f s", elapsed);
    if (world->rank == world->size - 1) printf("fault: pp rank %d: %s\n", pp_rank, msg);
    toy_free(&t);
}

int main(int argc, char **argv) {
    int rc = mc_case_init_world(&world, &(mc_comm_desc){.timeout_s = mc_case_time_s(10.0),
                                                         .watchdog_s = mc_case_time_s(10.0),
                                                         .argc = &argc, .argv = &argv});
    if (rc != MC_OK) return 1;
    mc_case_begin("fault", world->rank);
    if (world->size < 2) {
        mc_case_skip(world, "needs 2 ranks");
        mc_comm_destroy(world);
        return 0;
    }
    rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = world, .grid = {.pp = world->size}});
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_init")) {
        case_fault();
        mc_parallel_destroy(&ps);
    }
    int exit_code = mc_case_finish(world);
    mc_comm_destroy(world);
    return exit_code;
}
