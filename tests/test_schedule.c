/* test_schedule.c - the pipeline schedule tables against megatron_semantics.md section 8:
   the dispatcher's choice (Megatron's test_get_forward_backward_func table), 1F1B warmup per
   stage and the full op order for PP 4 / M 8, the interleaved lookup table of the schedules.py
   comment (PP 2, N 3, M 5, VP 2), the interleaved validation rules, forward_only, properties
   that every schedule must keep (each forward and backward exactly once per chunk, a backward
   after its forward, at most P - r activations in flight under 1F1B), and the dependency
   simulation against the bubble of the Megatron paper: (P - 1) / M, and (P - 1) / (V M)
   interleaved. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "test_util.h"

TestSuite(schedule, .timeout = 30);

#define MAX_OPS 4096

/* ---------------------------------------------------------------------------------------------
   helpers */

static mc_schedule_desc sched(int pp, int rank, int m, int vpp, int group_size) {
    mc_schedule_desc d;
    memset(&d, 0, sizeof d);
    d.pp = pp;
    d.pp_rank = rank;
    d.num_microbatches = m;
    d.vpp = vpp;
    d.group_size = group_size;
    return d;
}

/* The ops of one stage as text: "F0 B0 ..." or "F0.1 B2.0 ..." when interleaved. */
static void ops_text(const mc_sched_op *ops, int n, int interleaved, char *buf, size_t cap) {
    size_t used = 0;
    int i;
    buf[0] = '\0';
    for (i = 0; i < n && used < cap; i++) {
        if (interleaved)
            used += (size_t)snprintf(buf + used, cap - used, "%s%c%d.%d", i ? " " : "",
                                     ops[i].kind, ops[i].microbatch, ops[i].chunk);
        else
            used += (size_t)snprintf(buf + used, cap - used, "%s%c%d", i ? " " : "", ops[i].kind,
                                     ops[i].microbatch);
    }
}

static int stage_ops(mc_schedule_desc d, mc_sched_op *ops, int *warmup) {
    int n = mc_schedule_ops(&d, ops, MAX_OPS, warmup);
    cr_assert_geq(n, 0, "mc_schedule_ops(pp %d rank %d M %d vpp %d N %d): %s %s", d.pp,
                  d.pp_rank, d.num_microbatches, d.vpp, d.group_size, mc_err_name(n),
                  mc_last_error());
    return n;
}

static void expect_stage_text(mc_schedule_desc d, const char *want) {
    mc_sched_op ops[MAX_OPS];
    char got[8192];
    int n = stage_ops(d, ops, NULL);
    ops_text(ops, n, d.vpp > 1, got, sizeof got);
    cr_expect_str_eq(got, want, "stage %d:\n got  %s\n want %s", d.pp_rank, got, want);
}

static void expect_invalid(mc_schedule_desc d, const char *const *needles, int n_needles) {
    mc_sched_op ops[MAX_OPS];
    int rc = mc_schedule_ops(&d, ops, MAX_OPS, NULL), i;
    cr_assert_eq(rc, MC_ERR_INVALID_DESC, "pp %d M %d vpp %d N %d: want MC_ERR_INVALID_DESC, got %d",
                 d.pp, d.num_microbatches, d.vpp, d.group_size, rc);
    for (i = 0; i < n_needles; i++)
        cr_expect(mc_test_contains(mc_last_error(), needles[i]), "message \"%s\" lacks \"%s\"",
                  mc_last_error(), needles[i]);
    cr_expect_null(mc_schedule_name(&d));
}

/* ---------------------------------------------------------------------------------------------
   dispatcher */

/* Megatron's test_get_forward_backward_func: (TP, PP, VPP) -> schedule; TP plays no part. */
Test(schedule, dispatcher_matches_megatron_table) {
    mc_schedule_desc a = sched(1, 0, 4, 0, 0), b = sched(4, 0, 8, 0, 0);
    mc_schedule_desc c = sched(4, 0, 8, 2, 0), d = sched(2, 0, 8, 4, 0);
    cr_expect_str_eq(mc_schedule_name(&a), "no_pipelining");
    cr_expect_str_eq(mc_schedule_name(&b), "without_interleaving");
    cr_expect_str_eq(mc_schedule_name(&c), "with_interleaving");
    cr_expect_str_eq(mc_schedule_name(&d), "with_interleaving");
    /* Megatron's arguments turn a virtual size of 1 into None. */
    b.vpp = 1;
    cr_expect_str_eq(mc_schedule_name(&b), "without_interleaving");
}

/* ---------------------------------------------------------------------------------------------
   no pipelining and 1F1B */

Test(schedule, no_pipelining_alternates) {
    mc_sched_op ops[MAX_OPS];
    int warmup = -1;
    expect_stage_text(sched(1, 0, 4, 0, 0), "F0 B0 F1 B1 F2 B2 F3 B3");
    cr_expect_eq(stage_ops(sched(0, 0, 4, 0, 0), ops, &warmup), 8, "pp 0 defaults to 1");
    cr_expect_eq(warmup, 0);
}

Test(schedule, one_f_one_b_warmup_per_stage) {
    /* Literal tables first: pp 4 with M 8 and with M 2 (the warmup is capped at M). */
    static const int pp4_m8[] = {3, 2, 1, 0};
    static const int pp4_m2[] = {2, 2, 1, 0};
    static const int pp8_m3[] = {3, 3, 3, 3, 3, 2, 1, 0};
    mc_sched_op ops[MAX_OPS];
    int r, p, m, warmup;
    for (r = 0; r < 4; r++) {
        stage_ops(sched(4, r, 8, 0, 0), ops, &warmup);
        cr_expect_eq(warmup, pp4_m8[r], "pp 4 M 8 stage %d: warmup %d", r, warmup);
        stage_ops(sched(4, r, 2, 0, 0), ops, &warmup);
        cr_expect_eq(warmup, pp4_m2[r], "pp 4 M 2 stage %d: warmup %d", r, warmup);
    }
    for (r = 0; r < 8; r++) {
        stage_ops(sched(8, r, 3, 0, 0), ops, &warmup);
        cr_expect_eq(warmup, pp8_m3[r], "pp 8 M 3 stage %d: warmup %d", r, warmup);
    }
    /* Then the rule over a range: min(P - r - 1, M), and the ops begin with that many F. */
    for (p = 2; p <= 8; p++)
        for (m = 1; m <= 12; m++)
            for (r = 0; r < p; r++) {
                int want = p - r - 1 < m ? p - r - 1 : m, n = stage_ops(sched(p, r, m, 0, 0), ops,
                                                                         &warmup), i;
                cr_expect_eq(warmup, want, "pp %d M %d stage %d", p, m, r);
                cr_expect_eq(n, 2 * m);
                for (i = 0; i < want; i++) cr_expect_eq(ops[i].kind, 'F');
                if (want < m) cr_expect_eq(ops[want + 1].kind, 'B', "steady state starts");
            }
}

Test(schedule, one_f_one_b_order_pp4_m8) {
    expect_stage_text(sched(4, 0, 8, 0, 0),
                      "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
    expect_stage_text(sched(4, 1, 8, 0, 0),
                      "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
    expect_stage_text(sched(4, 2, 8, 0, 0),
                      "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
    expect_stage_text(sched(4, 3, 8, 0, 0),
                      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

/* Section 15.7: stage r keeps at most P - r micro-batches of activations (min with M). */
Test(schedule, one_f_one_b_activations_in_flight) {
    mc_sched_op ops[MAX_OPS];
    int p, m, r;
    for (p = 2; p <= 8; p++)
        for (m = 1; m <= 12; m++)
            for (r = 0; r < p; r++) {
                int n = stage_ops(sched(p, r, m, 0, 0), ops, NULL), live = 0, peak = 0, i;
                int want = p - r < m ? p - r : m;
                for (i = 0; i < n; i++) {
                    live += ops[i].kind == 'F' ? 1 : -1;
                    if (live > peak) peak = live;
                }
                cr_expect_eq(peak, want, "pp %d M %d stage %d: peak %d, want %d", p, m, r, peak,
                             want);
            }
}

/* ---------------------------------------------------------------------------------------------
   properties of every schedule */

/* Each (micro-batch, chunk) has exactly one F and one B (none when forward-only), and B comes
   after F; forwards of one chunk run in micro-batch order, as do backwards (FIFO). */
static void check_complete(mc_schedule_desc d) {
    mc_sched_op ops[MAX_OPS];
    int v = d.vpp > 1 ? d.vpp : 1, m = d.num_microbatches, n, i;
    int *f_at = malloc(sizeof(int) * (size_t)(m * v)), *b_at = malloc(sizeof(int) * (size_t)(m * v));
    int last_f[16], last_b[16];
    cr_assert(f_at && b_at && v <= 16);
    for (i = 0; i < m * v; i++) f_at[i] = b_at[i] = -1;
    for (i = 0; i < v; i++) last_f[i] = last_b[i] = -1;
    n = stage_ops(d, ops, NULL);
    cr_assert_eq(n, m * v * (d.forward_only ? 1 : 2));
    for (i = 0; i < n; i++) {
        const mc_sched_op *op = &ops[i];
        int slot = op->chunk * m + op->microbatch;
        cr_assert(op->chunk >= 0 && op->chunk < v && op->microbatch >= 0 && op->microbatch < m,
                  "op %d out of range", i);
        if (op->kind == 'F') {
            cr_expect_eq(f_at[slot], -1, "F%d.%d twice", op->microbatch, op->chunk);
            cr_expect_gt(op->microbatch, last_f[op->chunk], "forwards of chunk %d in order",
                         op->chunk);
            f_at[slot] = i;
            last_f[op->chunk] = op->microbatch;
        } else {
            cr_assert_eq(op->kind, 'B');
            cr_expect_eq(b_at[slot], -1, "B%d.%d twice", op->microbatch, op->chunk);
            cr_expect_neq(f_at[slot], -1, "B%d.%d before its F", op->microbatch, op->chunk);
            cr_expect_gt(op->microbatch, last_b[op->chunk], "backwards of chunk %d in order",
                         op->chunk);
            b_at[slot] = i;
            last_b[op->chunk] = op->microbatch;
        }
    }
    for (i = 0; i < m * v; i++) {
        cr_expect_neq(f_at[i], -1, "F%d.%d missing", i % m, i / m);
        if (d.forward_only)
            cr_expect_eq(b_at[i], -1);
        else
            cr_expect_neq(b_at[i], -1, "B%d.%d missing", i % m, i / m);
    }
    free(f_at);
    free(b_at);
}

Test(schedule, every_op_exactly_once_and_backward_after_forward) {
    int p, v, m, r, n_group, fwd;
    int checked = 0;
    for (fwd = 0; fwd <= 1; fwd++)
        for (p = 1; p <= 5; p++)
            for (v = 1; v <= 4; v++)
                for (m = 1; m <= 13; m++)
                    for (n_group = 0; n_group <= 6; n_group++) {
                        mc_schedule_desc d = sched(p, 0, m, v, n_group);
                        if (mc_schedule_name(&d) == NULL) continue;   /* invalid: skipped */
                        d.forward_only = fwd;
                        for (r = 0; r < p; r++) {
                            d.pp_rank = r;
                            check_complete(d);
                            checked++;
                        }
                    }
    cr_expect_gt(checked, 500, "only %d schedules checked", checked);
}

/* ---------------------------------------------------------------------------------------------
   interleaved */

/* The schedules.py comment: PP2 N3 M5 VP2. */
Test(schedule, interleaved_table_of_the_megatron_comment) {
    static const int want_mb[] = {0, 1, 2, 0, 1, 2, 3, 4, 3, 4};
    static const int want_chunk[] = {0, 0, 0, 1, 1, 1, 0, 0, 1, 1};
    mc_schedule_desc d = sched(2, 0, 5, 2, 3);
    int mb[16], chunk[16], k, n = mc_schedule_table(&d, mb, chunk, 16);
    mc_sched_op ops[MAX_OPS];
    cr_assert_eq(n, 10);
    for (k = 0; k < 10; k++) {
        cr_expect_eq(mb[k], want_mb[k], "k %d: micro-batch %d, want %d", k, mb[k], want_mb[k]);
        cr_expect_eq(chunk[k], want_chunk[k], "k %d: chunk %d, want %d", k, chunk[k],
                     want_chunk[k]);
    }
    /* Forward-only runs the table in order on every stage. */
    d.forward_only = 1;
    for (d.pp_rank = 0; d.pp_rank < 2; d.pp_rank++) {
        int warmup;
        n = stage_ops(d, ops, &warmup);
        cr_assert_eq(n, 10);
        cr_expect_eq(warmup, 10, "forward-only: all in warmup");
        for (k = 0; k < 10; k++) {
            cr_expect_eq(ops[k].microbatch, want_mb[k]);
            cr_expect_eq(ops[k].chunk, want_chunk[k]);
        }
    }
    d.pp_rank = 1;
    cr_expect_eq(mc_schedule_table(&d, NULL, NULL, 0), 10, "NULL counts");
    cr_expect_eq(mc_schedule_table(&d, mb, chunk, 9), MC_ERR_INVALID_ARG, "cap below M x V");
}

/* warmup = (P - r - 1) * 2 + (V - 1) * N: 5 and 3 here; B(k) runs chunk V - 1 - table[k]. */
Test(schedule, interleaved_order_pp2_n3_m5_vp2) {
    mc_sched_op ops[MAX_OPS];
    int warmup;
    stage_ops(sched(2, 0, 5, 2, 3), ops, &warmup);
    cr_expect_eq(warmup, 5);
    stage_ops(sched(2, 1, 5, 2, 3), ops, &warmup);
    cr_expect_eq(warmup, 3);
    expect_stage_text(sched(2, 0, 5, 2, 3),
                      "F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 B0.1 F3.0 B1.1 F4.0 B2.1 F3.1 B0.0 F4.1 "
                      "B1.0 B2.0 B3.1 B4.1 B3.0 B4.0");
    expect_stage_text(sched(2, 1, 5, 2, 3),
                      "F0.0 F1.0 F2.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.0 B0.0 F4.0 B1.0 F3.1 "
                      "B2.0 F4.1 B3.1 B4.1 B3.0 B4.0");
}

Test(schedule, interleaved_warmup_formula_and_clamp) {
    static const int pp4_m8_v2[] = {10, 8, 6, 4};   /* (3 - r) * 2 + 1 * 4 */
    mc_sched_op ops[MAX_OPS];
    int r, warmup;
    for (r = 0; r < 4; r++) {
        stage_ops(sched(4, r, 8, 2, 0), ops, &warmup);
        cr_expect_eq(warmup, pp4_m8_v2[r], "pp 4 M 8 V 2 stage %d: %d", r, warmup);
    }
    /* pp 4, M 4, V 2: stage 0 would warm up 6 + 4 = 10 > M*V = 8, so all 8 are warmup. */
    stage_ops(sched(4, 0, 4, 2, 0), ops, &warmup);
    cr_expect_eq(warmup, 8);
    expect_stage_text(sched(4, 0, 4, 2, 0),
                      "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 B0.1 B1.1 B2.1 B3.1 B0.0 B1.0 "
                      "B2.0 B3.0");
}

Test(schedule, interleaved_validation) {
    static const char *const m_not_multiple[] = {"num_microbatches 6", "group_size 4", "2",
                                                 "multiple of PP"};
    static const char *const n_below_pp[] = {"N = 2", "PP = 4", "M = 8"};
    static const char *const n_above_m[] = {"N = 9", "M = 8"};
    static const char *const needs_pp[] = {"greater than 1", "vpp = 2", "pp = 1"};
    static const char *const remainder[] = {"remainder", "is 1"};
    expect_invalid(sched(4, 0, 6, 2, 0), m_not_multiple, 4);
    expect_invalid(sched(4, 0, 8, 2, 2), n_below_pp, 3);
    expect_invalid(sched(4, 0, 8, 2, 9), n_above_m, 2);
    expect_invalid(sched(1, 0, 8, 2, 0), needs_pp, 3);
    expect_invalid(sched(2, 0, 7, 2, 3), remainder, 2);   /* 7 mod 3 = 1 < 2 */
    /* Remainders of 0 or >= P are fine: 5 mod 3 = 2 with P = 2 (the comment's example). */
    cr_expect_str_eq(mc_schedule_name(&(mc_schedule_desc){.pp = 2, .num_microbatches = 5,
                                                          .vpp = 2, .group_size = 3}),
                     "with_interleaving");
    /* Without interleaving any M works. */
    cr_expect_str_eq(mc_schedule_name(&(mc_schedule_desc){.pp = 4, .num_microbatches = 6}),
                     "without_interleaving");
}

Test(schedule, invalid_descs_and_caps) {
    static const char *const rank[] = {"pp_rank (4)", "pp = 4"};
    static const char *const m[] = {"num_microbatches (0)"};
    static const char *const pp[] = {"pp (-1)"};
    mc_schedule_desc d = sched(4, 0, 8, 0, 0);
    mc_sched_op ops[16];
    expect_invalid(sched(4, 4, 8, 0, 0), rank, 2);
    expect_invalid(sched(4, 0, 0, 0, 0), m, 1);
    expect_invalid(sched(-1, 0, 8, 0, 0), pp, 1);
    cr_expect_eq(mc_schedule_ops(&d, NULL, 0, NULL), 16, "NULL out counts");
    cr_expect_eq(mc_schedule_ops(&d, ops, 15, NULL), MC_ERR_INVALID_ARG, "cap below the count");
    cr_expect_eq(mc_schedule_ops(NULL, ops, 16, NULL), MC_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------------------------------------------
   forward only */

Test(schedule, forward_only_keeps_1f1b_warmup) {
    mc_schedule_desc d = sched(4, 1, 8, 0, 0);
    mc_sched_op ops[MAX_OPS];
    int warmup, n;
    d.forward_only = 1;
    n = stage_ops(d, ops, &warmup);
    cr_expect_eq(n, 8);
    cr_expect_eq(warmup, 2, "1F1B forward-only keeps min(P - r - 1, M)");
    expect_stage_text(d, "F0 F1 F2 F3 F4 F5 F6 F7");
    d = sched(4, 1, 8, 2, 0);
    d.forward_only = 1;
    n = stage_ops(d, ops, &warmup);
    cr_expect_eq(n, 16);
    cr_expect_eq(warmup, 16, "interleaved forward-only: warmup = M * V");
}

/* ---------------------------------------------------------------------------------------------
   simulation */

static mc_schedule_timing simulate(mc_schedule_desc d, double f, double b) {
    mc_schedule_timing t;
    int rc = mc_schedule_simulate(&d, f, b, NULL, 0, &t);
    cr_assert_eq(rc, MC_OK, "simulate pp %d M %d vpp %d: %s", d.pp, d.num_microbatches, d.vpp,
                 mc_last_error());
    return t;
}

Test(schedule, simulated_1f1b_bubble_is_p_minus_1_over_m) {
    int p, m;
    for (p = 1; p <= 8; p++)
        for (m = 1; m <= 16; m++) {
            mc_schedule_timing t = simulate(sched(p, 0, m, 0, 0), 1.0, 2.0);
            cr_expect_float_eq(t.makespan, 3.0 * (m + p - 1), 1e-9, "pp %d M %d: makespan %g", p,
                               m, t.makespan);
            cr_expect_float_eq(t.busy, 3.0 * m, 1e-9);
            cr_expect_float_eq(t.bubble_ratio, (double)(p - 1) / m, 1e-9, "pp %d M %d: ratio %g",
                               p, m, t.bubble_ratio);
            cr_expect_float_eq(t.bubble_fraction, (double)(p - 1) / (m + p - 1), 1e-9);
        }
    /* Equal forward and backward cost gives the same ratio. */
    cr_expect_float_eq(simulate(sched(4, 0, 8, 0, 0), 1.0, 1.0).bubble_ratio, 3.0 / 8, 1e-9);
}

/* The simulation is linear in pp: a million stages with one micro-batch (what
   `megatron_c schedule --pp 1048576 --microbatches 1` asks) and 4096 stages with 8 take well
   under the suite's timeout; sweeping the stages in one direction only took pp^2 steps
   (minutes). The makespans are 1F1B's closed form. */
Test(schedule, simulation_is_linear_in_pp, .timeout = 20) {
    static const int cases[][2] = {{1 << 20, 1}, {4096, 8}, {65536, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int p = cases[i][0], m = cases[i][1];
        mc_schedule_timing t = simulate(sched(p, 0, m, 0, 0), 1.0, 2.0);
        cr_expect_float_eq(t.makespan, 3.0 * ((double)m + p - 1), 1e-6,
                           "pp %d M %d: makespan %g", p, m, t.makespan);
    }
    mc_schedule_timing t = simulate(sched(512, 0, 1024, 2, 0), 1.0, 2.0);
    cr_expect_gt(t.makespan, 0.0);
}

Test(schedule, simulated_interleaving_divides_the_bubble_by_v) {
    static const int cases[][3] = {{2, 4, 2}, {4, 8, 2}, {4, 16, 4}, {4, 12, 3}, {8, 16, 2}};
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int p = cases[i][0], m = cases[i][1], v = cases[i][2];
        double plain = simulate(sched(p, 0, m, 0, 0), 0, 0).bubble_ratio;
        double inter = simulate(sched(p, 0, m, v, 0), 0, 0).bubble_ratio;
        cr_expect_float_eq(inter, (double)(p - 1) / (v * m), 1e-9,
                           "pp %d M %d V %d: interleaved ratio %g, want (P-1)/(VM) = %g", p, m, v,
                           inter, (double)(p - 1) / (v * m));
        cr_expect_lt(inter, plain);
    }
}

Test(schedule, simulated_start_times_respect_dependencies) {
    mc_schedule_desc d = sched(4, 0, 8, 2, 0);
    mc_sched_op ops[4][64];
    double start[4 * 32], f = 1.0, b = 2.0;
    int n = 0, r, i, j;
    cr_assert_eq(mc_schedule_simulate(&d, f, b, start, 4 * 32, NULL), MC_OK, "%s", mc_last_error());
    for (r = 0; r < 4; r++) {
        d.pp_rank = r;
        n = stage_ops(d, ops[r], NULL);
        cr_assert_eq(n, 32);
    }
    for (r = 0; r < 4; r++)
        for (i = 0; i < n; i++) {
            const mc_sched_op *op = &ops[r][i];
            int vs = op->chunk * 4 + r;
            int dep_vs = op->kind == 'F' ? vs - 1 : vs + 1;
            if (i > 0)
                cr_expect_geq(start[r * n + i],
                              start[r * n + i - 1] + (ops[r][i - 1].kind == 'F' ? f : b),
                              "stage %d op %d overlaps the previous one", r, i);
            if (dep_vs < 0 || dep_vs >= 8) continue;
            for (j = 0; j < n; j++) {   /* the producer on the neighbouring virtual stage */
                const mc_sched_op *q = &ops[dep_vs % 4][j];
                if (q->kind == op->kind && q->microbatch == op->microbatch &&
                    q->chunk == dep_vs / 4)
                    cr_expect_geq(start[r * n + i],
                                  start[(dep_vs % 4) * n + j] + (op->kind == 'F' ? f : b),
                                  "stage %d %c%d.%d starts before its input", r, op->kind,
                                  op->microbatch, op->chunk);
            }
        }
    cr_expect_eq(mc_schedule_simulate(&d, f, b, start, 10, NULL), MC_ERR_INVALID_ARG,
                 "cap below pp x ops");
    cr_expect_eq(mc_schedule_simulate(&d, -1.0, b, NULL, 0, NULL), MC_ERR_INVALID_ARG);
}

Test(schedule, simulated_forward_only) {
    mc_schedule_desc d = sched(4, 0, 8, 0, 0);
    mc_schedule_timing t;
    d.forward_only = 1;
    t = simulate(d, 0, 0);
    cr_expect_float_eq(t.makespan, 8 + 4 - 1, 1e-9, "M + P - 1 forward slots: %g", t.makespan);
    cr_expect_float_eq(t.busy, 8, 1e-9);
}

/* The most micro-batches a chunk holds at once, against a replay of mc_schedule_ops' own list
   (a forward adds to its chunk, a backward takes from its chunk). */
static int held_by_replay(mc_schedule_desc d, int *per_chunk) {
    static mc_sched_op ops[4096];
    int held[MC_MAX_VPP] = {0}, best = 0, n = mc_schedule_ops(&d, ops, 4096, NULL);
    cr_assert_gt(n, 0, "%s", mc_last_error());
    memset(per_chunk, 0, sizeof(int) * MC_MAX_VPP);
    for (int i = 0; i < n; i++) {
        int c = ops[i].chunk;
        if (ops[i].kind == 'B') {
            held[c]--;
            continue;
        }
        if (++held[c] > per_chunk[c]) per_chunk[c] = held[c];
        if (per_chunk[c] > best) best = per_chunk[c];
        if (d.forward_only) held[c]--;
    }
    return best;
}

Test(schedule, max_in_flight) {
    int got[MC_MAX_VPP], want[MC_MAX_VPP];
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(mc_schedule_max_in_flight(&(mc_schedule_desc){.pp = 4, .pp_rank = r,
                                                                   .num_microbatches = 8}, NULL),
                     4 - r, "1F1B stage %d: min(pp - r, M)", r);
        cr_expect_eq(mc_schedule_max_in_flight(&(mc_schedule_desc){.pp = 4, .pp_rank = r,
                                                                   .num_microbatches = 2}, NULL),
                     4 - r < 2 ? 4 - r : 2);
    }
    cr_expect_eq(mc_schedule_max_in_flight(&(mc_schedule_desc){.num_microbatches = 8}, NULL), 1);
    cr_expect_eq(mc_schedule_max_in_flight(
                     &(mc_schedule_desc){.pp = 4, .num_microbatches = 8, .forward_only = 1}, NULL),
                 1);
    static const int cases[][4] = {{2, 2, 4, 0}, {2, 2, 8, 0}, {4, 2, 8, 0}, {4, 4, 8, 0},
                                   {2, 4, 6, 3}, {4, 2, 8, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int r = 0; r < cases[i][0]; r++) {
            mc_schedule_desc d = {.pp = cases[i][0], .pp_rank = r, .vpp = cases[i][1],
                                  .num_microbatches = cases[i][2], .group_size = cases[i][3]};
            int best = mc_schedule_max_in_flight(&d, got), expect = held_by_replay(d, want);
            cr_expect_eq(best, expect, "pp %d vpp %d M %d stage %d", d.pp, d.vpp,
                         d.num_microbatches, r);
            for (int c = 0; c < d.vpp; c++)
                cr_expect_eq(got[c], want[c], "pp %d vpp %d M %d stage %d chunk %d", d.pp, d.vpp,
                             d.num_microbatches, r, c);
        }
    /* stage 0 of pp 2, vpp 2, M 4: chunk 0 holds all four micro-batches at one point (the
       first backward frees a chunk-1 set), so its slots cannot be fewer than 4 */
    mc_schedule_desc d = {.pp = 2, .vpp = 2, .num_microbatches = 4};
    cr_expect_eq(mc_schedule_max_in_flight(&d, got), 4);
    d.num_microbatches = 3;
    cr_expect_eq(mc_schedule_max_in_flight(&d, got), MC_ERR_INVALID_DESC, "Megatron's M rule");
}
