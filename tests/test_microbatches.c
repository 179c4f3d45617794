/* test_microbatches.c - the micro-batch calculator against megatron_semantics.md section 9:
   the identity GBS = MBS x M x DP (the 512 = 4 x 8 x 16 example of section 15.3), the constant
   calculator with and without decrease_batch_size_if_needed, the core_v0.17 ramp-up with each
   of its asserts and Megatron's own ramp-up test loop, and HEAD's step schedule (suffixes,
   token thresholds, sorting, every validation rule). Cases marked "Megatron test" repeat the
   numbers of tests/unit_tests/test_num_microbatches_calculator.py. */
#include <criterion/criterion.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "megatron_c.h"
#include "test_util.h"

TestSuite(microbatches, .timeout = 30);

/* ---------------------------------------------------------------------------------------------
   helpers */

static mc_microbatch_desc constant_desc(int gbs, int mbs, int dp) {
    mc_microbatch_desc d;
    memset(&d, 0, sizeof d);
    d.global_batch_size = gbs;
    d.micro_batch_size = mbs;
    d.data_parallel_size = dp;
    return d;
}

static mc_microbatch_desc rampup_desc(int gbs, int mbs, int dp, int start, int increment,
                                      long long samples) {
    mc_microbatch_desc d = constant_desc(gbs, mbs, dp);
    d.rampup.start = start;
    d.rampup.increment = increment;
    d.rampup.samples = samples;
    return d;
}

static mc_microbatch_desc step_desc(const char *schedule, int mbs, int dp, int seq_length) {
    mc_microbatch_desc d = constant_desc(0, mbs, dp);
    d.step_schedule = schedule;
    d.seq_length = seq_length;
    return d;
}

static mc_microbatch_calc make_calc(mc_microbatch_desc d) {
    mc_microbatch_calc c;
    int rc = mc_microbatch_init(&c, &d);
    cr_assert_eq(rc, MC_OK, "mc_microbatch_init: %s %s", mc_err_name(rc), mc_last_error());
    return c;
}

/* Init must fail with MC_ERR_INVALID_DESC, leave calc untouched, and name every needle. */
static void expect_init_error(mc_microbatch_desc d, const char *const *needles, int n_needles) {
    mc_microbatch_calc c;
    int rc, i;
    memset(&c, 0x5a, sizeof c);
    rc = mc_microbatch_init(&c, &d);
    cr_assert_eq(rc, MC_ERR_INVALID_DESC, "want MC_ERR_INVALID_DESC, got %s (%s)", mc_err_name(rc),
                 mc_last_error());
    cr_expect_eq(((unsigned char *)&c)[0], 0x5a, "a failed init must not write the calculator");
    for (i = 0; i < n_needles; i++)
        cr_expect(mc_test_contains(mc_last_error(), needles[i]), "message \"%s\" lacks \"%s\"",
                  mc_last_error(), needles[i]);
}

/* After update(consumed, check): the current batch and M. */
static void expect_at(mc_microbatch_calc *c, long long consumed, int check, int batch, int m) {
    int rc = mc_microbatch_update(c, consumed, check);
    cr_assert_eq(rc, MC_OK, "update(%lld): %s", consumed, mc_last_error());
    cr_expect_eq(c->current_global_batch_size, batch, "consumed %lld: batch %d, want %d",
                 consumed, c->current_global_batch_size, batch);
    cr_expect_eq(c->num_microbatches, m, "consumed %lld: M %d, want %d", consumed,
                 c->num_microbatches, m);
}

/* ---------------------------------------------------------------------------------------------
   constant */

Test(microbatches, identity_512_is_4_x_8_x_16) {
    mc_microbatch_calc c = make_calc(constant_desc(512, 4, 16));
    cr_expect_eq(c.mode, MC_MICROBATCH_CONSTANT);
    cr_expect_eq(c.num_microbatches, 8);
    cr_expect_eq(c.current_global_batch_size, 512);
    cr_expect_eq(c.current_running_global_batch_size, 512);
    cr_expect_eq(c.desc.micro_batch_size * c.num_microbatches * c.desc.data_parallel_size, 512);
}

/* Megatron test: (32, 8, 2) gives 2 micro-batches; update is a no-op. */
Test(microbatches, constant_update_changes_nothing) {
    mc_microbatch_calc c = make_calc(constant_desc(32, 8, 2));
    cr_expect_eq(c.num_microbatches, 2);
    expect_at(&c, 16, 1, 32, 2);
    expect_at(&c, 1000000, 1, 32, 2);
}

Test(microbatches, constant_not_divisible_names_values_and_rule) {
    static const char *const needles[] = {"global batch size (500)", "micro batch size (4)",
                                          "data parallel size (16)", "64", "divisible"};
    expect_init_error(constant_desc(500, 4, 16), needles, 5);
}

/* Megatron tests: (32, 8, 3, decrease) runs 24 as 1 micro-batch; (33, 8, 2) runs 32 as 2;
   (16, 4, 3) runs 12 as 1. The reported global batch stays the requested one. */
Test(microbatches, decrease_batch_size_if_needed_rounds_the_running_batch) {
    static const int cases[][5] = {
        /* gbs, mbs, dp, running, M */
        {32, 8, 3, 24, 1},
        {33, 8, 2, 32, 2},
        {16, 4, 3, 12, 1},
        {500, 4, 16, 448, 7},
    };
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mc_microbatch_desc d = constant_desc(cases[i][0], cases[i][1], cases[i][2]);
        mc_microbatch_calc c;
        d.decrease_batch_size_if_needed = 1;
        c = make_calc(d);
        cr_expect_eq(c.current_global_batch_size, cases[i][0], "case %zu: reported batch", i);
        cr_expect_eq(c.current_running_global_batch_size, cases[i][3], "case %zu: running %d",
                     i, c.current_running_global_batch_size);
        cr_expect_eq(c.num_microbatches, cases[i][4], "case %zu: M %d", i, c.num_microbatches);
    }
}

Test(microbatches, decrease_below_one_microbatch_is_an_error) {
    static const char *const needles[] = {"at least 1", "(30)", "64"};
    mc_microbatch_desc d = constant_desc(30, 4, 16);
    d.decrease_batch_size_if_needed = 1;
    expect_init_error(d, needles, 3);
}

Test(microbatches, sizes_must_be_positive) {
    static const char *const gbs[] = {"global_batch_size (0)"};
    static const char *const mbs[] = {"micro_batch_size (-1)"};
    static const char *const dp[] = {"data_parallel_size (0)"};
    expect_init_error(constant_desc(0, 4, 16), gbs, 1);
    expect_init_error(constant_desc(64, -1, 16), mbs, 1);
    expect_init_error(constant_desc(64, 4, 0), dp, 1);
}

Test(microbatches, update_on_a_zeroed_calculator_is_a_state_error) {
    mc_microbatch_calc c;
    memset(&c, 0, sizeof c);
    cr_expect_eq(mc_microbatch_update(&c, 0, 1), MC_ERR_STATE);
    cr_expect_eq(mc_microbatch_change_points(&c, NULL, 0), MC_ERR_STATE);
    cr_expect_eq(mc_microbatch_init(NULL, NULL), MC_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------------------------------------------
   ramp-up (core_v0.17) */

/* start 16, +16 per 100 samples up to 64; MBS 2 x DP 4 = 8 samples per micro-batch step. */
Test(microbatches, rampup_table) {
    static const long long consumed[] = {0, 1, 99, 100, 199, 200, 299, 300, 301, 100000};
    static const int batch[] = {16, 16, 16, 32, 32, 48, 48, 64, 64, 64};
    mc_microbatch_calc c = make_calc(rampup_desc(64, 2, 4, 16, 16, 300));
    size_t i;
    cr_expect_eq(c.mode, MC_MICROBATCH_RAMPUP);
    cr_expect_eq(c.current_global_batch_size, 16, "init runs update(0)");
    cr_expect_eq(c.num_microbatches, 2);
    for (i = 0; i < sizeof consumed / sizeof consumed[0]; i++)
        expect_at(&c, consumed[i], 1, batch[i], batch[i] / 8);
}

/* Megatron's test_ramp_up: [16, 16, 96] to 32 with MBS 8 x DP 2; the loop adds the current
   batch to the consumed samples, then updates with the consistency check. */
Test(microbatches, rampup_training_loop_matches_megatron_test) {
    static const long long want[] = {0, 16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256};
    mc_microbatch_calc c = make_calc(rampup_desc(32, 8, 2, 16, 16, 96));
    long long consumed = 0;
    int count = 0;
    while (consumed < 256) {
        consumed += c.current_global_batch_size;
        count++;
        cr_assert_lt(count, (int)(sizeof want / sizeof want[0]));
        cr_expect_eq(consumed, want[count], "iteration %d: consumed %lld, want %lld", count,
                     consumed, want[count]);
        cr_assert_eq(mc_microbatch_update(&c, consumed, 1), MC_OK, "%s", mc_last_error());
    }
    cr_expect_eq(count, 11);
}

/* Megatron's test_update_num_microbatches. */
Test(microbatches, rampup_consistency_check) {
    mc_microbatch_calc c = make_calc(rampup_desc(32, 4, 2, 16, 8, 96));
    cr_expect_eq(c.num_microbatches, 2);
    expect_at(&c, 48, 0, 24, 3);

    c = make_calc(rampup_desc(32, 8, 2, 16, 8, 96));
    cr_expect_eq(mc_microbatch_update(&c, 49, 1), MC_ERR_INVALID_DESC,
                 "24 is not a multiple of 16: the checked update must fail");
    cr_expect(mc_test_contains(mc_last_error(), "(24)") &&
                  mc_test_contains(mc_last_error(), "divisible"),
              "%s", mc_last_error());
    /* Without the check a non-multiple floors silently: 24 / 16 = 1. */
    expect_at(&c, 49, 0, 24, 1);
}

Test(microbatches, rampup_with_decrease_skips_the_check_and_rounds) {
    mc_microbatch_desc d = rampup_desc(32, 8, 2, 16, 8, 96);
    mc_microbatch_calc c;
    d.decrease_batch_size_if_needed = 1;
    c = make_calc(d);
    expect_at(&c, 49, 1, 24, 1);
    cr_expect_eq(c.current_running_global_batch_size, 16);
}

Test(microbatches, rampup_asserts) {
    static const char *const start[] = {"rampup.start (0)", "positive"};
    static const char *const inc[] = {"rampup.increment (0)", "positive"};
    static const char *const samples[] = {"rampup.samples (-5)", "non-negative"};
    static const char *const below[] = {"(16)", "(32)", "greater than or equal"};
    static const char *const interval[] = {"64 - 16 = 48", "increment (10)", "divisible"};
    static const char *const zero_samples[] = {"rampup.samples (0)", "divides by zero"};
    static const char *const gbs[] = {"global_batch_size (0)"};
    expect_init_error(rampup_desc(64, 2, 4, 0, 16, 300), start, 2);
    expect_init_error(rampup_desc(64, 2, 4, 16, 0, 300), inc, 2);
    expect_init_error(rampup_desc(64, 2, 4, 16, 16, -5), samples, 2);
    expect_init_error(rampup_desc(16, 2, 4, 32, 16, 300), below, 3);
    expect_init_error(rampup_desc(64, 2, 4, 16, 10, 300), interval, 3);
    expect_init_error(rampup_desc(64, 2, 4, 16, 16, 0), zero_samples, 2);
    expect_init_error(rampup_desc(0, 2, 4, 16, 16, 300), gbs, 1);
}

/* Megatron divides by zero when GBS == start; here that ramp-up runs at GBS throughout. */
Test(microbatches, rampup_start_equal_to_gbs_is_constant) {
    mc_microbatch_calc c = make_calc(rampup_desc(64, 2, 4, 64, 16, 300));
    long long points[4];
    expect_at(&c, 0, 1, 64, 8);
    expect_at(&c, 150, 1, 64, 8);
    expect_at(&c, 1000, 1, 64, 8);
    cr_expect_eq(mc_microbatch_change_points(&c, points, 4), 1);
    cr_expect_eq(points[0], 0);
}

Test(microbatches, rampup_change_points) {
    mc_microbatch_calc c = make_calc(rampup_desc(64, 2, 4, 16, 16, 300));
    long long points[8];
    int n = mc_microbatch_change_points(&c, points, 8), i;
    cr_assert_eq(n, 4, "change points: %d", n);
    cr_expect_eq(points[0], 0);
    cr_expect_eq(points[1], 100);
    cr_expect_eq(points[2], 200);
    cr_expect_eq(points[3], 300);
    /* Each is the first count of its batch. */
    for (i = 1; i < n; i++) {
        int before, at;
        mc_microbatch_update(&c, points[i] - 1, 0);
        before = c.current_global_batch_size;
        mc_microbatch_update(&c, points[i], 0);
        at = c.current_global_batch_size;
        cr_expect_neq(before, at, "the batch changes at %lld", points[i]);
    }
    cr_expect_eq(mc_microbatch_change_points(&c, NULL, 0), 4, "NULL counts");
}

/* 10 samples over 3 increments: per_inc = 3.33..., so the steps begin at 4, 7 and 10, and
   the batch is final from 10 on. */
Test(microbatches, rampup_change_points_with_fractional_increments) {
    mc_microbatch_calc c = make_calc(rampup_desc(40, 1, 1, 10, 10, 10));
    long long points[8];
    int n = mc_microbatch_change_points(&c, points, 8);
    cr_assert_eq(n, 4);
    cr_expect_eq(points[1], 4);
    cr_expect_eq(points[2], 7);
    cr_expect_eq(points[3], 10);
    expect_at(&c, 3, 1, 10, 10);
    expect_at(&c, 4, 1, 20, 20);
    expect_at(&c, 10, 1, 40, 40);
}

/* ---------------------------------------------------------------------------------------------
   step schedule (HEAD) */

Test(microbatches, step_schedule_basic) {
    mc_microbatch_calc c = make_calc(step_desc("0:32 1000:64", 4, 2, 0));
    long long points[4];
    cr_expect_eq(c.mode, MC_MICROBATCH_STEP);
    cr_expect_eq(c.global_batch_size, 64, "GBS is the last entry's batch");
    cr_expect_eq(c.num_microbatches, 4);
    expect_at(&c, 999, 1, 32, 4);
    expect_at(&c, 1000, 1, 64, 8);
    expect_at(&c, 5000, 1, 64, 8);
    cr_assert_eq(mc_microbatch_change_points(&c, points, 4), 2);
    cr_expect_eq(points[1], 1000);
}

Test(microbatches, step_schedule_suffixes_commas_and_sorting) {
    mc_microbatch_calc c = make_calc(step_desc("2.5k:64, 0:16,1K:32", 1, 1, 0));
    cr_assert_eq(c.n_steps, 3);
    cr_expect_eq(c.step_threshold[0], 0);
    cr_expect_eq(c.step_threshold[1], 1000);
    cr_expect_eq(c.step_threshold[2], 2500);
    cr_expect_eq(c.step_batch[2], 64);
    expect_at(&c, 999, 1, 16, 16);
    expect_at(&c, 1000, 1, 32, 32);
    expect_at(&c, 2499, 1, 32, 32);
    expect_at(&c, 2500, 1, 64, 64);
}

/* Megatron's documented example "0:768 250B:1536 500B:3072 750B:6144" with seq_length 4096:
   250e9 tokens / 4096 = 61035156.25 -> 61035156 samples. */
Test(microbatches, step_schedule_tokens_divided_by_seq_length) {
    mc_microbatch_calc c = make_calc(step_desc("0:768 250B:1536 500B:3072 750B:6144", 2, 16, 4096));
    cr_assert_eq(c.n_steps, 4);
    cr_expect_eq(c.step_threshold[1], 61035156LL);
    cr_expect_eq(c.step_threshold[2], 122070312LL);
    cr_expect_eq(c.step_threshold[3], 183105468LL);
    expect_at(&c, 61035155LL, 1, 768, 24);
    expect_at(&c, 61035156LL, 1, 1536, 48);
    expect_at(&c, 200000000LL, 1, 6144, 192);
}

/* Megatron test: an early entry smaller than MBS x DP is fine until it is checked. */
Test(microbatches, step_schedule_small_early_entry) {
    mc_microbatch_calc c = make_calc(
        step_desc("0:256 200000:512 600000:1024 1500000:2048 3000000:4096 6000000:6144", 1, 512, 0));
    cr_expect_eq(c.current_global_batch_size, 256);
    cr_expect_eq(c.num_microbatches, 0, "M may be 0 before the first checked update");
    cr_expect_eq(mc_microbatch_update(&c, 0, 1), MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "(256)"), "%s", mc_last_error());
    expect_at(&c, 200000, 1, 512, 1);
    expect_at(&c, 1500000, 1, 2048, 4);
    expect_at(&c, 6000000, 1, 6144, 12);
}

Test(microbatches, step_schedule_errors) {
    static const char *const colon[] = {"\"1000=64\"", "THRESHOLD:BATCH_SIZE"};
    static const char *const number[] = {"\"0:abc\""};
    static const char *const first[] = {"threshold 0", "got 10"};
    static const char *const increasing[] = {"strictly increasing", "1000"};
    static const char *const tokens[] = {"strictly increasing", "seq_length"};
    static const char *const positive[] = {"positive", "got 0"};
    static const char *const empty[] = {"at least one entry"};
    expect_init_error(step_desc("0:32 1000=64", 1, 1, 0), colon, 2);
    expect_init_error(step_desc("0:abc", 1, 1, 0), number, 1);
    expect_init_error(step_desc("10:32 1000:64", 1, 1, 0), first, 2);
    expect_init_error(step_desc("0:32 1000:64 1K:128", 1, 1, 0), increasing, 2);
    /* 1000 and 1500 tokens are both sample 0 of 2048-token sequences. */
    expect_init_error(step_desc("0:32 1000:64 1500:128", 1, 1, 2048), tokens, 2);
    expect_init_error(step_desc("0:32 1000:0", 1, 1, 0), positive, 2);
    expect_init_error(step_desc(" , ", 1, 1, 0), empty, 1);
}

Test(microbatches, step_schedule_exclusions) {
    static const char *const decrease[] = {"decrease_batch_size_if_needed"};
    static const char *const both[] = {"global_batch_size (64)"};
    static const char *const rampup[] = {"rampup", "step_schedule"};
    mc_microbatch_desc d = step_desc("0:16 100:32", 8, 2, 0);
    d.decrease_batch_size_if_needed = 1;
    expect_init_error(d, decrease, 1);
    d = step_desc("0:16 100:32", 8, 2, 0);
    d.global_batch_size = 64;
    expect_init_error(d, both, 1);
    d = step_desc("0:16 100:32", 8, 2, 0);
    d.rampup.start = 16;
    d.rampup.increment = 16;
    d.rampup.samples = 100;
    expect_init_error(d, rampup, 2);
}

Test(microbatches, step_schedule_string_is_not_kept) {
    char schedule[32];
    mc_microbatch_calc c;
    snprintf(schedule, sizeof schedule, "0:8 50:16");
    c = make_calc(step_desc(schedule, 1, 1, 0));
    memset(schedule, 'x', sizeof schedule - 1);
    cr_expect_null(c.desc.step_schedule);
    expect_at(&c, 50, 1, 16, 16);
}

/* Megatron's float arithmetic, kept: 9 samples over 7 increments gives per_inc = 9/7, and
   9 / (9/7) is 6.999... in doubles, so at consumed == samples the batch is one increment
   short of GBS; GBS arrives at samples + 1, where the consumed > samples branch takes over. */
Test(microbatches, rampup_last_step_follows_megatron_rounding) {
    mc_microbatch_calc c = make_calc(rampup_desc(64, 1, 1, 8, 8, 9));
    long long points[16];
    int n;
    expect_at(&c, 9, 1, 56, 56);
    expect_at(&c, 10, 1, 64, 64);
    n = mc_microbatch_change_points(&c, points, 16);
    cr_assert_geq(n, 2);
    cr_expect_eq(points[n - 1], 10, "the last change is at samples + 1, got %lld", points[n - 1]);
}
