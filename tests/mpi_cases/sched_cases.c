/* sched_cases.c - the pipeline schedules running a toy model over real pipeline stages.

   usage: sched_cases <train|invalid> [--pp P] [--vpp V] [--m M] [--n N] [--backend auto|self|mpi]

   World = TP 1 x PP P x DP (world / P): every data-parallel replica runs its own pipeline.
   train    (a) every rank's trace equals mc_schedule_ops for its stage, (b) every stage's
            accumulated dL/dw, dL/db equal the single-process reference of the whole chain,
            (c) loss_sum and num_tokens on the last stage equal the reference, (d) the grad-sync
            switches and finalize come exactly where they belong, the buffer contract holds;
            then (e) forward_only runs only the forwards (no backward, grad sync or finalize)
            with the same loss; then a second training step doubles the gradients; then (g) a
            step with hooks.loss_func: the same trace, gradients and loss, and loss_func runs
            on the last stage only, once per micro-batch, on forward_step's output.
   invalid  (f) an M (or N) that breaks Megatron's interleaving rules fails on every rank with
            the rule's message, quickly, with no compute and no communication; the schedule
            functions refuse a parallel state they do not fit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"
#include "tests/sched_toy.h"

#define TIMEOUT_S mc_case_time_s(10.0)   /* also the watchdog */

static struct {
    int pp, vpp, m, n;
    mc_comm_backend backend;
} opt;

static mc_comm *world;
static mc_parallel_state ps;

static const char *expected_name(void) {
    if (opt.pp > 1) return opt.vpp > 1 ? "with_interleaving" : "without_interleaving";
    return "no_pipelining";
}

static mc_forward_backward_func expected_func(void) {
    if (opt.pp > 1)
        return opt.vpp > 1 ? mc_forward_backward_pipelining_with_interleaving
                           : mc_forward_backward_pipelining_without_interleaving;
    return mc_forward_backward_no_pipelining;
}

static void check_trace(const mc_schedule_result *res, const toy *t, int forward_only,
                        const char *label) {
    mc_schedule_desc d;
    memset(&d, 0, sizeof d);
    d.pp = t->pp;
    d.pp_rank = t->rank;
    d.num_microbatches = t->m;
    d.vpp = t->v > 1 ? t->v : 0;
    d.group_size = opt.n;
    d.forward_only = forward_only;
    static mc_sched_op want[MC_SCHEDULE_TRACE_MAX];
    int warmup = -1;
    int n = mc_schedule_ops(&d, want, MC_SCHEDULE_TRACE_MAX, &warmup);
    if (!MC_CASE_CHECK(n > 0, "%s: mc_schedule_ops failed: %s", label, mc_last_error())) return;
    MC_CASE_CHECK(res->n_ops == n, "%s: pp rank %d ran %d compute ops, mc_schedule_ops has %d",
                  label, t->rank, res->n_ops, n);
    MC_CASE_CHECK(res->n_warmup == warmup, "%s: n_warmup %d, want %d", label, res->n_warmup,
                  warmup);
    for (int i = 0; i < n && i < res->n_ops; i++)
        if (!MC_CASE_CHECK(res->ops[i].kind == want[i].kind &&
                               res->ops[i].microbatch == want[i].microbatch &&
                               res->ops[i].chunk == want[i].chunk,
                           "%s: pp rank %d op %d is %c%d.%d, mc_schedule_ops has %c%d.%d", label,
                           t->rank, i, res->ops[i].kind, res->ops[i].microbatch,
                           res->ops[i].chunk, want[i].kind, want[i].microbatch, want[i].chunk))
            break;
}

static void check_events(const toy *t, int forward_only, const char *label) {
    int cap = 8 * t->m * t->v + 16;
    toy_event *want = (toy_event *)calloc((size_t)cap, sizeof *want);
    if (!MC_CASE_CHECK(want != NULL, "%s: out of memory", label)) return;
    int n = toy_expected_events(t, opt.n, forward_only, want, cap);
    int at = toy_events_diff(t->ev, t->n_ev, want, n);
    if (at >= 0) {
        char got_text[4096], want_text[4096];
        toy_events_text(t->ev, t->n_ev, got_text, sizeof got_text);
        toy_events_text(want, n, want_text, sizeof want_text);
        MC_CASE_CHECK(0, "%s: pp rank %d hook calls differ at #%d\n  got  %s\n  want %s", label,
                      t->rank, at, got_text, want_text);
    } else {
        MC_CASE_CHECK(1, "events");
    }
    MC_CASE_CHECK(t->contract_errors == 0, "%s: pp rank %d: %d buffer-contract violations, first: %s",
                  label, t->rank, t->contract_errors, t->first_error);
    free(want);
}

/* The local chunks' gradients against the reference, times `times` (steps accumulated). */
static void check_grads(const toy *t, float (*dw)[TOY_E], float (*db)[TOY_E], float times,
                        const char *label) {
    int bad = 0;
    for (int c = 0; c < t->v; c++)
        for (int e = 0; e < TOY_E; e++) {
            int s = toy_stage(t, c);
            float want_w = times * dw[s][e], want_b = times * db[s][e];
            float tol_w = 1e-6f + 1e-5f * (want_w < 0 ? -want_w : want_w);
            float tol_b = 1e-6f + 1e-5f * (want_b < 0 ? -want_b : want_b);
            float err_w = t->dw[c][e] - want_w, err_b = t->db[c][e] - want_b;
            if (err_w < 0) err_w = -err_w;
            if (err_b < 0) err_b = -err_b;
            if ((err_w > tol_w || err_b > tol_b) && bad++ == 0)
                MC_CASE_CHECK(0, "%s: virtual stage %d (pp rank %d chunk %d) element %d: dw %.9g "
                              "db %.9g, reference %.9g %.9g", label, s, t->rank, c, e,
                              t->dw[c][e], t->db[c][e], want_w, want_b);
        }
    MC_CASE_CHECK(bad == 0, "%s: %d gradient elements differ from the reference", label, bad);
}

static void check_loss(const mc_schedule_result *res, const toy *t, double ref_loss,
                       const char *label) {
    int last = t->rank == t->pp - 1;
    double want = last ? ref_loss : 0.0, want_tokens = last ? (double)TOY_E * t->m : 0.0;
    double diff = res->loss_sum - want;
    if (diff < 0) diff = -diff;
    MC_CASE_CHECK(diff <= 1e-9 * (want < 0 ? -want : want) + 1e-12,
                  "%s: pp rank %d loss_sum %.17g, want %.17g", label, t->rank, res->loss_sum, want);
    MC_CASE_CHECK(res->num_tokens == want_tokens, "%s: pp rank %d num_tokens %g, want %g", label,
                  t->rank, res->num_tokens, want_tokens);
}

static void case_train(void) {
    int pp_rank = mc_parallel_rank(&ps, MC_GROUP_PP), v = opt.vpp > 1 ? opt.vpp : 1;
    static mc_schedule_result res;
    static float dw[TOY_MAX_STAGES][TOY_E], db[TOY_MAX_STAGES][TOY_E];
    double ref_loss = 0.0;
    toy t;
    if (!MC_CASE_CHECK(toy_init(&t, opt.pp, pp_rank, v, opt.m) == 0, "toy_init")) return;
    toy_reference(opt.pp * v, opt.m, dw, db, &ref_loss);

    mc_forward_backward_func f = mc_get_forward_backward_func(&ps);
    MC_CASE_CHECK(f == expected_func(), "mc_get_forward_backward_func did not pick %s",
                  expected_name());
    if (f == NULL) f = expected_func();
    mc_schedule_hooks hooks = toy_hooks(&t, opt.n);

    /* (a)-(d): one training step */
    int rc = f(&ps, &hooks, opt.m, 0, &res);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "training step")) {
        check_trace(&res, &t, 0, "train");
        check_events(&t, 0, "train");
        check_grads(&t, dw, db, 1.0f, "train");
        check_loss(&res, &t, ref_loss, "train");
    }

    /* (e): forward only, on the same buffers: no backward, grad sync or finalize */
    float dw_before[TOY_MAX_V][TOY_E];
    memcpy(dw_before, t.dw, sizeof dw_before);
    t.n_ev = 0;
    rc = f(&ps, &hooks, opt.m, 1, &res);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "forward-only step")) {
        check_trace(&res, &t, 1, "forward_only");
        check_events(&t, 1, "forward_only");
        check_loss(&res, &t, ref_loss, "forward_only");
        MC_CASE_CHECK(memcmp(dw_before, t.dw, sizeof dw_before) == 0,
                      "forward_only changed the gradients");
    }

    /* a second step accumulates: the schedule keeps no state between calls */
    t.n_ev = 0;
    rc = f(&ps, &hooks, opt.m, 0, &res);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "second training step")) {
        check_events(&t, 0, "second step");
        check_grads(&t, dw, db, 2.0f, "second step");
        check_loss(&res, &t, ref_loss, "second step");
    }

    /* (g): Megatron's split, forward_step returning the output and loss_func interpreting it */
    toy_reset(&t);
    t.use_loss_func = 1;
    hooks = toy_hooks(&t, opt.n);
    rc = f(&ps, &hooks, opt.m, 0, &res);
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "training step with loss_func")) {
        int last = pp_rank == opt.pp - 1;
        check_trace(&res, &t, 0, "loss_func");
        check_events(&t, 0, "loss_func");
        check_grads(&t, dw, db, 1.0f, "loss_func");
        check_loss(&res, &t, ref_loss, "loss_func");
        MC_CASE_CHECK(t.n_loss_calls == (last ? opt.m : 0),
                      "loss_func: pp rank %d called it %d times, want %d", pp_rank,
                      t.n_loss_calls, last ? opt.m : 0);
    }
    toy_free(&t);
}

static void case_invalid(void) {
    int pp_rank = mc_parallel_rank(&ps, MC_GROUP_PP), v = opt.vpp > 1 ? opt.vpp : 1;
    static mc_schedule_result res;
    toy t;
    if (!MC_CASE_CHECK(toy_init(&t, opt.pp, pp_rank, v, opt.m) == 0, "toy_init")) return;
    mc_schedule_hooks hooks = toy_hooks(&t, opt.n);
    double start = mc_test_now();
    if (opt.vpp > 1) {
        int rc = mc_forward_backward_pipelining_with_interleaving(&ps, &hooks, opt.m, 0, &res);
        const char *msg = mc_last_error();
        MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_DESC, "interleaved schedule with invalid M / N");
        int group = opt.n ? opt.n : opt.pp;
        int in_range = group >= opt.pp && group <= opt.m;
        const char *rule = in_range ? "remainder of M" : "should range in";
        MC_CASE_CHECK(strstr(msg, rule) != NULL, "message lacks \"%s\": %s", rule, msg);
        MC_CASE_CHECK(t.n_ev == 0 && res.n_ops == 0,
                      "%d hook calls and %d ops before the validation error", t.n_ev, res.n_ops);
        rc = mc_forward_backward_pipelining_with_interleaving(&ps, &hooks, opt.m, 1, &res);
        MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_DESC, "forward-only, invalid M / N");
        /* the non-interleaved schedule refuses model chunks */
        rc = mc_forward_backward_pipelining_without_interleaving(&ps, &hooks, opt.m, 0, &res);
        MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_ARG, "1F1B with vpp > 1");
        MC_CASE_CHECK(strstr(mc_last_error(), "model chunking") != NULL, "message: %s",
                      mc_last_error());
    } else {
        int rc = mc_forward_backward_pipelining_with_interleaving(&ps, &hooks, opt.m, 0, &res);
        MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_ARG, "interleaved schedule without vpp");
    }
    if (opt.pp > 1) {
        int rc = mc_forward_backward_no_pipelining(&ps, &hooks, opt.m, 0, &res);
        MC_CASE_CHECK_STATUS(rc, MC_ERR_INVALID_ARG, "no pipelining with PP > 1");
        hooks.tensor_elems = 0;
        rc = mc_get_forward_backward_func(&ps)(&ps, &hooks, opt.m, 0, &res);
        MC_CASE_CHECK(rc == MC_ERR_INVALID_ARG || rc == MC_ERR_INVALID_DESC,
                      "tensor_elems 0 with PP > 1: %s", mc_err_name(rc));
    }
    MC_CASE_CHECK(t.n_ev == 0, "%d hook calls from refused schedules", t.n_ev);
    double elapsed = mc_test_now() - start;
    MC_CASE_CHECK(elapsed < 2.0, "the refusals took %.2f s (waiting on a peer?)", elapsed);
    toy_free(&t);
}

/* ---------------------------------------------------------------------------------------------
   argument parsing and dispatch */

typedef struct sched_case {
    const char *name;
    void (*run)(void);
} sched_case;

static const sched_case cases[] = {{"train", case_train}, {"invalid", case_invalid}};
enum { N_CASES = sizeof cases / sizeof cases[0] };

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s <train|invalid> [--pp P] [--vpp V] [--m M] [--n N] "
            "[--backend auto|self|mpi]\n",
            prog);
}

static int int_option(const char *name, int *field, const char *flag, const char *value) {
    if (strcmp(flag, name) != 0) return 0;
    char *end = NULL;
    long v = strtol(value, &end, 10);
    if (end == value || *end != '\0' || v < 0 || v > 100000) return -1;
    *field = (int)v;
    return 1;
}

static int parse_options(int argc, char **argv) {
    opt.m = 4;
    opt.backend = MC_BACKEND_AUTO;
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc) return 0;
        const char *flag = argv[i], *value = argv[i + 1];
        int used = int_option("--pp", &opt.pp, flag, value) |
                   int_option("--vpp", &opt.vpp, flag, value) |
                   int_option("--m", &opt.m, flag, value) | int_option("--n", &opt.n, flag, value);
        if (used < 0) return 0;
        if (!used && strcmp(flag, "--backend") == 0) {
            if (!mc_case_backend_option(value, &opt.backend)) return 0;
            used = 1;
        }
        if (!used) return 0;
        i++;
    }
    return 1;
}

int main(int argc, char **argv) {
    const sched_case *chosen = NULL;
    for (int i = 0; argc >= 2 && i < N_CASES; i++)
        if (strcmp(argv[1], cases[i].name) == 0) chosen = &cases[i];
    if (chosen == NULL || !parse_options(argc, argv)) {
        usage(argv[0]);
        return 2;
    }
    int rc = mc_case_init_world(&world, &(mc_comm_desc){.backend = opt.backend,
                                                         .timeout_s = TIMEOUT_S, .watchdog_s = TIMEOUT_S,
                                                         .argc = &argc, .argv = &argv});
    if (rc != MC_OK) return 1;
    if (opt.pp == 0) opt.pp = world->size;
    mc_case_begin(chosen->name, world->rank);
    rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = world,
                                                    .grid = {.pp = opt.pp, .vpp = opt.vpp}});
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_init")) {
        chosen->run();
        mc_parallel_destroy(&ps);
    }
    int exit_code = mc_case_finish(world);
    mc_comm_destroy(world);
    return exit_code;
}
