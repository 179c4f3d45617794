/* test_rng.c - Philox4x32-10 and the RNG tracker (megatron_semantics.md section 6).

   The block function is checked against the Random123 known-answer vectors; the stream layout
   (element g = lane g % 4 of block g / 4, key = seed) against the block function; draws
   against each other (position independence) and against the numbers printed in the header's
   manual. The tracker follows Megatron's test_cuda_rng_states_tracker and
   test_double_fork_cuda_rng_states_tracker, plus get/set states as recompute uses them and
   the seeds of _set_random_seed + model_parallel_cuda_manual_seed. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "test_util.h"

TestSuite(rng, .timeout = 30);

/* ---------------------------------------------------------------------------------------------
   Philox4x32-10 */

Test(rng, philox_known_answer_vectors) {
    static const uint32_t counter[3][4] = {
        {0, 0, 0, 0},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
    };
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu},
                                       {0xa4093822u, 0x299f31d0u}};
    static const uint32_t want[3][4] = {
        {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
    };
    int v, lane;
    for (v = 0; v < 3; v++) {
        uint32_t out[4];
        mc_philox4x32_10(counter[v], key[v], out);
        for (lane = 0; lane < 4; lane++)
            cr_expect_eq(out[lane], want[v][lane], "vector %d lane %d: %08x, want %08x", v, lane,
                         out[lane], want[v][lane]);
    }
}

/* Element g of a stream is lane g % 4 of the block with counter (g / 4 low, high, 0, 0) and
   key (seed low, high): checked where both halves matter. */
Test(rng, stream_element_layout) {
    static const uint64_t seeds[] = {0, 1234, 0x0123456789abcdefULL};
    static const uint64_t blocks[] = {0, 1, 0xffffffffULL, 0x100000001ULL, 0x0edcba9876543210ULL};
    size_t s, b;
    int lane;
    for (s = 0; s < sizeof seeds / sizeof seeds[0]; s++)
        for (b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
            uint32_t counter[4] = {(uint32_t)blocks[b], (uint32_t)(blocks[b] >> 32), 0, 0};
            uint32_t key[2] = {(uint32_t)seeds[s], (uint32_t)(seeds[s] >> 32)}, out[4];
            mc_philox4x32_10(counter, key, out);
            for (lane = 0; lane < 4; lane++) {
                uint64_t g = blocks[b] * 4 + (uint64_t)lane;
                cr_expect_eq(mc_rng_bits_at(seeds[s], g), out[lane], "seed %llu element %llu",
                             (unsigned long long)seeds[s], (unsigned long long)g);
                cr_expect_eq(mc_rng_uniform_at(seeds[s], g),
                             (float)(out[lane] >> 8) / 16777216.0f, "top 24 bits");
            }
        }
    /* seed 0, element 0: the first KAT word, 0x6627e8d5 -> 0x6627e8 / 2^24. */
    cr_expect_eq(mc_rng_bits_at(0, 0), 0x6627e8d5u);
    cr_expect_eq(mc_rng_uniform_at(0, 0), (float)0x6627e8 / 16777216.0f);
}

Test(rng, uniform_range_and_mean) {
    enum { N = 100000 };
    float *u = malloc(sizeof(float) * N);
    mc_rng rng = {42, 0};
    double sum = 0.0;
    int i;
    cr_assert_not_null(u);
    cr_assert_eq(mc_rng_uniform(&rng, u, N), MC_OK);
    for (i = 0; i < N; i++) {
        double scaled = (double)u[i] * 16777216.0;
        cr_assert(u[i] >= 0.0f && u[i] < 1.0f, "u[%d] = %g outside [0, 1)", i, (double)u[i]);
        cr_assert_eq(scaled, floor(scaled), "u[%d] is not a multiple of 2^-24", i);
        sum += u[i];
    }
    /* The mean of N uniforms has a standard deviation of 1 / sqrt(12 N) ~ 0.0009. */
    cr_expect(fabs(sum / N - 0.5) < 0.005, "mean %g", sum / N);
    free(u);
}

/* ---------------------------------------------------------------------------------------------
   stream position */

Test(rng, drawing_n_then_m_equals_drawing_n_plus_m) {
    static const size_t splits[][2] = {{4, 8}, {8, 5}, {0, 7}, {12, 1}, {100, 36}};
    size_t s, i;
    for (s = 0; s < sizeof splits / sizeof splits[0]; s++) {
        size_t n = splits[s][0], m = splits[s][1];
        float whole[256], first[256], second[256];
        mc_rng a = {777, 8}, b = {777, 8};
        cr_assert_eq(mc_rng_uniform(&a, whole, n + m), MC_OK);
        cr_assert_eq(mc_rng_uniform(&b, first, n), MC_OK);
        cr_assert_eq(mc_rng_uniform(&b, second, m), MC_OK);
        for (i = 0; i < n; i++) cr_expect_eq(first[i], whole[i], "n %zu m %zu: element %zu", n, m, i);
        for (i = 0; i < m; i++)
            cr_expect_eq(second[i], whole[n + i], "n %zu m %zu: element %zu", n, m, n + i);
        cr_expect_eq(a.offset, b.offset, "both streams end at the same offset");
    }
}

/* A draw that is not a multiple of 4 still moves to the next block: the next draw starts at
   the rounded offset, and any element can be recomputed from (seed, index) alone. */
Test(rng, draws_start_on_a_fresh_block) {
    float u[8];
    mc_rng rng = {99, 0};
    size_t i;
    cr_assert_eq(mc_rng_uniform(&rng, u, 3), MC_OK);
    cr_expect_eq(rng.offset, 4);
    for (i = 0; i < 3; i++) cr_expect_eq(u[i], mc_rng_uniform_at(99, i));
    cr_assert_eq(mc_rng_uniform(&rng, u, 5), MC_OK);
    cr_expect_eq(rng.offset, 12);
    for (i = 0; i < 5; i++) cr_expect_eq(u[i], mc_rng_uniform_at(99, 4 + i), "element %zu", 4 + i);
    cr_assert_eq(mc_rng_uniform(&rng, u, 0), MC_OK);
    cr_expect_eq(rng.offset, 12, "an empty draw does not move");
    cr_expect_eq(mc_rng_uniform(NULL, u, 1), MC_ERR_INVALID_ARG);
}

Test(rng, different_seeds_differ) {
    float a[16], b[16];
    mc_rng x = {1234, 0}, y = {1235, 0};
    int same = 0, i;
    mc_rng_uniform(&x, a, 16);
    mc_rng_uniform(&y, b, 16);
    for (i = 0; i < 16; i++) same += a[i] == b[i];
    cr_expect_lt(same, 2, "%d of 16 equal", same);
}

/* ---------------------------------------------------------------------------------------------
   dropout masks */

Test(rng, dropout_mask_rule_and_rate) {
    enum { N = 40000 };
    uint8_t *mask = malloc(N);
    mc_rng rng = {2024, 16};
    int kept = 0, i;
    cr_assert_not_null(mask);
    cr_assert_eq(mc_rng_dropout_mask(&rng, mask, N, 0.1f), MC_OK);
    cr_expect_eq(rng.offset, 16 + N);
    for (i = 0; i < N; i++) {
        int want = mc_rng_uniform_at(2024, 16 + (uint64_t)i) >= 0.1f;
        cr_assert_eq(mask[i], want, "element %d: mask %d, uniform %g", i, mask[i],
                     (double)mc_rng_uniform_at(2024, 16 + (uint64_t)i));
        kept += mask[i];
    }
    /* Binomial(N, 0.9): standard deviation 60; allow 5 of them. */
    cr_expect(abs(kept - 36000) < 300, "kept %d of %d", kept, N);
    free(mask);
}

Test(rng, dropout_mask_edges_and_errors) {
    uint8_t mask[10];
    mc_rng rng = {5, 0};
    int i;
    cr_assert_eq(mc_rng_dropout_mask(&rng, mask, 10, 0.0f), MC_OK);
    for (i = 0; i < 10; i++) cr_expect_eq(mask[i], 1, "p = 0 keeps everything");
    cr_expect_eq(rng.offset, 12, "10 rounded up to 12");
    cr_assert_eq(mc_rng_dropout_mask(&rng, mask, 10, 1.0f), MC_OK);
    for (i = 0; i < 10; i++) cr_expect_eq(mask[i], 0, "p = 1 drops everything");
    cr_expect_eq(mc_rng_dropout_mask(&rng, mask, 10, -0.1f), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "-0.1"), "%s", mc_last_error());
    cr_expect_eq(mc_rng_dropout_mask(&rng, mask, 10, 1.5f), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_rng_dropout_mask(&rng, mask, 10, NAN), MC_ERR_INVALID_ARG);
    cr_expect_eq(rng.offset, 24, "failed calls do not move the stream");
}

/* ---------------------------------------------------------------------------------------------
   the header's example */

Test(rng, manual_example_numbers) {
    mc_rng rng = {1234, 0};
    mc_rng_tracker t;
    float u[3];
    uint8_t keep[8];
    static const uint8_t want_keep[8] = {1, 0, 1, 0, 0, 1, 1, 1};
    int i;
    cr_assert_eq(mc_rng_uniform(&rng, u, 3), MC_OK);
    cr_expect_float_eq(u[0], 0.127208f, 5e-7f, "u[0] = %.6f", (double)u[0]);
    cr_expect_float_eq(u[1], 0.853469f, 5e-7f, "u[1] = %.6f", (double)u[1]);
    cr_expect_float_eq(u[2], 0.265649f, 5e-7f, "u[2] = %.6f", (double)u[2]);
    cr_expect_eq(rng.offset, 4);
    cr_assert_eq(mc_rng_dropout_mask(&rng, keep, 8, 0.5f), MC_OK);
    for (i = 0; i < 8; i++) cr_expect_eq(keep[i], want_keep[i], "keep[%d]", i);
    cr_expect_eq(rng.offset, 12);
    cr_expect_eq(mc_rng_uniform_at(1234, 1), u[1]);

    memset(&t, 0, sizeof t);
    cr_assert_eq(mc_rng_tracker_seed_megatron(&t, 1234, 1, 0, 0, 0, 0, 0), MC_OK);
    cr_assert_eq(mc_rng_tracker_fork(&t, MC_RNG_MODEL_PARALLEL), MC_OK);
    cr_assert_eq(mc_rng_uniform(mc_rng_tracker_current(&t), u, 2), MC_OK);
    cr_expect_float_eq(u[0], 0.049593f, 5e-7f, "u[0] = %.6f", (double)u[0]);
    cr_expect_float_eq(u[1], 0.576654f, 5e-7f, "u[1] = %.6f", (double)u[1]);
    cr_assert_eq(mc_rng_tracker_unfork(&t, MC_RNG_MODEL_PARALLEL), MC_OK);
    cr_expect_str_eq(mc_rng_tracker_active_name(&t), MC_RNG_DEFAULT);
}

/* ---------------------------------------------------------------------------------------------
   tracker */

static mc_rng tracker_stream(const mc_rng_tracker *t, const char *name) {
    mc_rng r;
    cr_assert_eq(mc_rng_tracker_get(t, name, &r), MC_OK, "%s: %s", name, mc_last_error());
    return r;
}

/* Megatron's test_cuda_rng_states_tracker. */
Test(rng, tracker_add_rules) {
    mc_rng_tracker t;
    mc_rng r;
    memset(&t, 0, sizeof t);
    cr_assert_eq(mc_rng_tracker_add(&t, "state2", 1111), MC_OK);
    cr_expect_eq(mc_rng_tracker_add(&t, "state3", 1111), MC_ERR_INVALID_ARG, "seed reused");
    cr_expect(mc_test_contains(mc_last_error(), "seed 1111 already exists"), "%s",
              mc_last_error());
    cr_expect_eq(mc_rng_tracker_add(&t, "state2", 111), MC_ERR_INVALID_ARG, "name reused");
    cr_expect(mc_test_contains(mc_last_error(), "\"state2\" already exists"), "%s",
              mc_last_error());
    r = tracker_stream(&t, "state2");
    cr_expect_eq(r.seed, 1111, "a new stream is the seeded generator");
    cr_expect_eq(r.offset, 0);
    cr_expect_eq(mc_rng_tracker_fork(&t, "missing"), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "\"missing\" is not added"), "%s", mc_last_error());
    cr_expect_eq(mc_rng_tracker_get(&t, "missing", &r), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_rng_tracker_add(&t, "a-name-that-is-far-too-long-to-keep", 5),
                 MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_rng_tracker_add(&t, MC_RNG_DEFAULT, 6), MC_ERR_INVALID_ARG);
    /* reset forgets names and seeds */
    mc_rng_tracker_reset(&t);
    cr_expect_eq(t.s.n_streams, 0);
    cr_expect_eq(mc_rng_tracker_add(&t, "state3", 1111), MC_OK, "seed free again after reset");
}

Test(rng, tracker_capacity) {
    mc_rng_tracker t;
    char name[16];
    int i;
    memset(&t, 0, sizeof t);
    for (i = 0; i < MC_RNG_MAX_STREAMS; i++) {
        snprintf(name, sizeof name, "s%d", i);
        cr_assert_eq(mc_rng_tracker_add(&t, name, (uint64_t)(100 + i)), MC_OK);
    }
    cr_expect_eq(mc_rng_tracker_add(&t, "one-more", 999), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "MC_RNG_MAX_STREAMS"), "%s", mc_last_error());
}

/* A fork draws from the named stream and leaves the default generator where it was. */
Test(rng, fork_switches_streams_and_restores_default) {
    mc_rng_tracker t;
    float in_fork[4], outside[4];
    int i;
    memset(&t, 0, sizeof t);
    mc_rng_tracker_manual_seed(&t, 10);
    cr_assert_eq(mc_rng_tracker_add(&t, "s", 20), MC_OK);
    cr_assert_eq(mc_rng_tracker_fork(&t, "s"), MC_OK);
    cr_expect_str_eq(mc_rng_tracker_active_name(&t), "s");
    mc_rng_uniform(mc_rng_tracker_current(&t), in_fork, 4);
    cr_assert_eq(mc_rng_tracker_unfork(&t, "s"), MC_OK);
    for (i = 0; i < 4; i++) cr_expect_eq(in_fork[i], mc_rng_uniform_at(20, (uint64_t)i));
    cr_expect_eq(tracker_stream(&t, "s").offset, 4, "the advanced stream is stored back");
    cr_expect_eq(mc_rng_tracker_current(&t)->seed, 10);
    cr_expect_eq(mc_rng_tracker_current(&t)->offset, 0, "the default generator did not move");
    mc_rng_uniform(mc_rng_tracker_current(&t), outside, 4);
    for (i = 0; i < 4; i++) cr_expect_eq(outside[i], mc_rng_uniform_at(10, (uint64_t)i));
    /* a second fork continues the stream */
    cr_assert_eq(mc_rng_tracker_fork(&t, "s"), MC_OK);
    mc_rng_uniform(mc_rng_tracker_current(&t), in_fork, 4);
    cr_assert_eq(mc_rng_tracker_unfork(&t, "s"), MC_OK);
    for (i = 0; i < 4; i++) cr_expect_eq(in_fork[i], mc_rng_uniform_at(20, (uint64_t)(4 + i)));
}

/* Megatron's test_double_fork_cuda_rng_states_tracker: state1, state2, state1 (nested),
   state2, state1 gives the numbers and final states of three draws from state1 and two from
   state2. */
Test(rng, double_fork_equals_single_forks) {
    enum { N = 10 };
    mc_rng_tracker t;
    float d1[3][N], d2[2][N], s1[3][N], s2[2][N];
    mc_rng double_state1, double_state2;
    int i, j;
    memset(&t, 0, sizeof t);
    cr_assert_eq(mc_rng_tracker_add(&t, "state1", 1234), MC_OK);
    cr_assert_eq(mc_rng_tracker_add(&t, "state2", 5678), MC_OK);
    cr_assert_eq(mc_rng_tracker_fork(&t, "state1"), MC_OK);
    mc_rng_uniform(mc_rng_tracker_current(&t), d1[0], N);
    cr_assert_eq(mc_rng_tracker_fork(&t, "state2"), MC_OK);
    mc_rng_uniform(mc_rng_tracker_current(&t), d2[0], N);
    cr_assert_eq(mc_rng_tracker_fork(&t, "state1"), MC_OK);
    cr_expect_eq(t.depth, 3);
    mc_rng_uniform(mc_rng_tracker_current(&t), d1[1], N);
    cr_assert_eq(mc_rng_tracker_unfork(&t, "state1"), MC_OK);
    mc_rng_uniform(mc_rng_tracker_current(&t), d2[1], N);
    cr_assert_eq(mc_rng_tracker_unfork(&t, "state2"), MC_OK);
    mc_rng_uniform(mc_rng_tracker_current(&t), d1[2], N);
    cr_assert_eq(mc_rng_tracker_unfork(&t, "state1"), MC_OK);
    cr_expect_eq(t.depth, 0);
    double_state1 = tracker_stream(&t, "state1");
    double_state2 = tracker_stream(&t, "state2");

    mc_rng_tracker_reset(&t);
    cr_assert_eq(mc_rng_tracker_add(&t, "state1", 1234), MC_OK);
    cr_assert_eq(mc_rng_tracker_add(&t, "state2", 5678), MC_OK);
    cr_assert_eq(mc_rng_tracker_fork(&t, "state1"), MC_OK);
    for (i = 0; i < 3; i++) mc_rng_uniform(mc_rng_tracker_current(&t), s1[i], N);
    cr_assert_eq(mc_rng_tracker_unfork(&t, "state1"), MC_OK);
    cr_assert_eq(mc_rng_tracker_fork(&t, "state2"), MC_OK);
    for (i = 0; i < 2; i++) mc_rng_uniform(mc_rng_tracker_current(&t), s2[i], N);
    cr_assert_eq(mc_rng_tracker_unfork(&t, "state2"), MC_OK);

    for (i = 0; i < 3; i++)
        for (j = 0; j < N; j++) cr_expect_eq(d1[i][j], s1[i][j], "state1 draw %d element %d", i, j);
    for (i = 0; i < 2; i++)
        for (j = 0; j < N; j++) cr_expect_eq(d2[i][j], s2[i][j], "state2 draw %d element %d", i, j);
    cr_expect_eq(double_state1.offset, tracker_stream(&t, "state1").offset);
    cr_expect_eq(double_state2.offset, tracker_stream(&t, "state2").offset);
    cr_expect_eq(double_state1.offset, 3 * 12, "three draws of 10, each rounded to 12");
}

Test(rng, unfork_checks_the_active_name) {
    mc_rng_tracker t;
    memset(&t, 0, sizeof t);
    cr_assert_eq(mc_rng_tracker_add(&t, "a", 1), MC_OK);
    cr_assert_eq(mc_rng_tracker_add(&t, "b", 2), MC_OK);
    cr_expect_eq(mc_rng_tracker_unfork(&t, "a"), MC_ERR_STATE, "nothing is forked");
    cr_assert_eq(mc_rng_tracker_fork(&t, "a"), MC_OK);
    cr_assert_eq(mc_rng_tracker_fork(&t, "b"), MC_OK);
    cr_expect_eq(mc_rng_tracker_unfork(&t, "a"), MC_ERR_STATE, "b is innermost");
    cr_expect(mc_test_contains(mc_last_error(), "current state name b") &&
                  mc_test_contains(mc_last_error(), "desired state name a"),
              "%s", mc_last_error());
    cr_expect_eq(t.depth, 2, "a failed unfork changes nothing");
    cr_expect_eq(mc_rng_tracker_unfork(&t, "b"), MC_OK);
    cr_expect_eq(mc_rng_tracker_unfork(&t, "a"), MC_OK);
}

Test(rng, fork_depth_limit) {
    mc_rng_tracker t;
    int i;
    memset(&t, 0, sizeof t);
    cr_assert_eq(mc_rng_tracker_add(&t, "a", 1), MC_OK);
    for (i = 0; i < MC_RNG_MAX_FORK_DEPTH; i++) cr_assert_eq(mc_rng_tracker_fork(&t, "a"), MC_OK);
    cr_expect_eq(mc_rng_tracker_fork(&t, "a"), MC_ERR_STATE);
    for (i = 0; i < MC_RNG_MAX_FORK_DEPTH; i++) cr_assert_eq(mc_rng_tracker_unfork(&t, "a"), MC_OK);
    cr_expect_str_eq(mc_rng_tracker_active_name(&t), MC_RNG_DEFAULT);
}

/* Recompute: snapshot before the checkpointed forward, restore before re-running it, and the
   re-run draws the same mask; restoring the later snapshot puts every stream back. */
Test(rng, get_and_set_states_replay_a_forward) {
    mc_rng_tracker t;
    mc_rng_states before, after, copy;
    uint8_t first[32], replay[32], next_a[8], next_b[8];
    int i;
    memset(&t, 0, sizeof t);
    cr_assert_eq(mc_rng_tracker_seed_megatron(&t, 7, 0, 0, 0, 0, 0, 0), MC_OK);
    cr_assert_eq(mc_rng_tracker_get_states(&t, &before), MC_OK);
    copy = before;
    /* the "forward": a default-stream mask and a model-parallel mask */
    mc_rng_dropout_mask(mc_rng_tracker_current(&t), first, 16, 0.5f);
    mc_rng_tracker_fork(&t, MC_RNG_MODEL_PARALLEL);
    mc_rng_dropout_mask(mc_rng_tracker_current(&t), first + 16, 16, 0.5f);
    mc_rng_tracker_unfork(&t, MC_RNG_MODEL_PARALLEL);
    cr_expect_eq(memcmp(&before, &copy, sizeof before), 0, "a snapshot is a copy");
    cr_assert_eq(mc_rng_tracker_get_states(&t, &after), MC_OK);

    cr_assert_eq(mc_rng_tracker_set_states(&t, &before), MC_OK);
    mc_rng_dropout_mask(mc_rng_tracker_current(&t), replay, 16, 0.5f);
    mc_rng_tracker_fork(&t, MC_RNG_MODEL_PARALLEL);
    mc_rng_dropout_mask(mc_rng_tracker_current(&t), replay + 16, 16, 0.5f);
    mc_rng_tracker_unfork(&t, MC_RNG_MODEL_PARALLEL);
    for (i = 0; i < 32; i++) cr_expect_eq(replay[i], first[i], "mask element %d", i);

    /* Restoring the current snapshot: later draws continue as if nothing was replayed. */
    cr_assert_eq(mc_rng_tracker_set_states(&t, &after), MC_OK);
    mc_rng_dropout_mask(mc_rng_tracker_current(&t), next_a, 8, 0.5f);
    cr_assert_eq(mc_rng_tracker_set_states(&t, &after), MC_OK);
    mc_rng_dropout_mask(mc_rng_tracker_current(&t), next_b, 8, 0.5f);
    cr_expect_eq(memcmp(next_a, next_b, 8), 0);
    cr_expect_eq(t.s.current.offset, 16 + 8, "the default stream resumes after the forward");
}

Test(rng, set_states_inside_a_fork_needs_the_same_streams) {
    mc_rng_tracker t;
    mc_rng_states other, same;
    memset(&t, 0, sizeof t);
    memset(&other, 0, sizeof other);
    cr_assert_eq(mc_rng_tracker_add(&t, "a", 1), MC_OK);
    cr_assert_eq(mc_rng_tracker_get_states(&t, &same), MC_OK);
    cr_assert_eq(mc_rng_tracker_fork(&t, "a"), MC_OK);
    cr_expect_eq(mc_rng_tracker_set_states(&t, &other), MC_ERR_STATE);
    cr_expect_eq(mc_rng_tracker_set_states(&t, &same), MC_OK);
    cr_expect_eq(mc_rng_tracker_unfork(&t, "a"), MC_OK);
    cr_expect_eq(mc_rng_tracker_set_states(&t, &other), MC_OK, "allowed outside forks");
    cr_expect_eq(t.s.n_streams, 0);
}

/* ---------------------------------------------------------------------------------------------
   Megatron's seeds */

static void expect_seeds(long long seed, int tp, int pp, int ep, int etp, int dp, int dp_init,
                         uint64_t want_default, uint64_t want_model, uint64_t want_expert) {
    mc_rng_tracker t;
    memset(&t, 0, sizeof t);
    cr_assert_eq(mc_rng_tracker_seed_megatron(&t, seed, tp, pp, ep, etp, dp, dp_init), MC_OK,
                 "%s", mc_last_error());
    cr_expect_eq(t.s.current.seed, want_default, "default generator: %llu",
                 (unsigned long long)t.s.current.seed);
    cr_expect_eq(t.s.current.offset, 0);
    cr_expect_eq(tracker_stream(&t, MC_RNG_DATA_PARALLEL).seed, want_default);
    cr_expect_eq(tracker_stream(&t, MC_RNG_MODEL_PARALLEL).seed, want_model,
                 "model-parallel: %llu", (unsigned long long)tracker_stream(&t, MC_RNG_MODEL_PARALLEL).seed);
    cr_expect_eq(tracker_stream(&t, MC_RNG_EXPERT_PARALLEL).seed, want_expert,
                 "expert-parallel: %llu", (unsigned long long)tracker_stream(&t, MC_RNG_EXPERT_PARALLEL).seed);
    cr_expect_eq(t.s.n_streams, 3);
}

Test(rng, megatron_seed_offsets) {
    /* seed 1234 on tp 1: 1234 + 2718 + 1 = 3953; expert 1234 + 1024 = 2258 */
    expect_seeds(1234, 1, 0, 0, 0, 0, 0, 1234, 3953, 2258);
    /* pp 3 adds 300 to all of them; dp is ignored without data_parallel_random_init */
    expect_seeds(1234, 0, 3, 0, 0, 5, 0, 1534, 4252, 2558);
    /* data_parallel_random_init adds 10 * dp */
    expect_seeds(1234, 0, 3, 0, 0, 5, 1, 1584, 4302, 2608);
    /* expert: + 100 * ep + etp */
    expect_seeds(1000, 2, 0, 3, 1, 0, 0, 1000, 3720, 2325);
}

Test(rng, megatron_seed_rules) {
    mc_rng_tracker t;
    memset(&t, 0, sizeof t);
    cr_expect_eq(mc_rng_tracker_seed_megatron(&t, 0, 0, 0, 0, 0, 0, 0), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "seed (0) must be > 0"), "%s", mc_last_error());
    cr_expect_eq(mc_rng_tracker_seed_megatron(&t, -5, 0, 0, 0, 0, 0, 0), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_rng_tracker_seed_megatron(&t, 5, -1, 0, 0, 0, 0, 0), MC_ERR_INVALID_ARG);
    /* 2718 + tp 0 = 1024 + 100 * 16 + 94: Megatron's add refuses the repeated seed too. */
    cr_expect_eq(mc_rng_tracker_seed_megatron(&t, 5, 0, 0, 16, 94, 0, 0), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "already exists"), "%s", mc_last_error());
}

/* Seeding again starts over: the old streams and forks are gone. */
Test(rng, megatron_seed_resets_the_tracker) {
    mc_rng_tracker t;
    memset(&t, 0, sizeof t);
    cr_assert_eq(mc_rng_tracker_add(&t, "custom", 3953), MC_OK);
    cr_assert_eq(mc_rng_tracker_fork(&t, "custom"), MC_OK);
    cr_assert_eq(mc_rng_tracker_seed_megatron(&t, 1234, 1, 0, 0, 0, 0, 0), MC_OK,
                 "the seed 3953 was used before the reset: %s", mc_last_error());
    cr_expect_eq(t.depth, 0);
    cr_expect_str_eq(mc_rng_tracker_active_name(&t), MC_RNG_DEFAULT);
    cr_expect_eq(mc_rng_tracker_fork(&t, "custom"), MC_ERR_INVALID_ARG);
}

/* The boundary: an element whose uniform equals p exactly is kept (dropped means u < p). */
Test(rng, dropout_mask_keeps_a_uniform_equal_to_p) {
    uint8_t mask[8];
    mc_rng rng = {31, 0};
    float p = mc_rng_uniform_at(31, 5);
    int i;
    cr_assert_eq(mc_rng_dropout_mask(&rng, mask, 8, p), MC_OK);
    cr_expect_eq(mask[5], 1, "u == p (%g) is kept", (double)p);
    for (i = 0; i < 8; i++)
        cr_expect_eq(mask[i], mc_rng_uniform_at(31, (uint64_t)i) >= p, "element %d", i);
}
