/* test_config.c - the GPT config: Megatron's defaults, vocabulary padding, the validator
   (megatron_semantics.md section 13: every rule fires with a message naming the field, the
   value and the rule; all violations are reported together) and the two fingerprints. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "megatron_c.h"
#include "test_util.h"

TestSuite(config, .timeout = 30);

/* A small valid GPT: 4 layers, hidden 64, 4 heads, vocab 1000, seq 32. */
static mc_gpt_config small_gpt(void) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = 4;
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.vocab_size = 1000;
    c.seq_length = 32;
    c.micro_batch_size = 2;
    return c;
}

static char report[8192];

/* Validates and checks that exactly `want` violations came back, each mentioned text in it. */
static int validate_expect(const mc_gpt_config *c, int want, const char *must_contain) {
    int n = mc_gpt_config_validate(c, report, sizeof report);
    cr_expect_eq(n, want, "violations: %d, want %d; report:\n%s", n, want, report);
    if (must_contain)
        cr_expect(mc_test_contains(report, must_contain), "report lacks \"%s\":\n%s",
                  must_contain, report);
    return n;
}

/* Lines in the report = the count. */
static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

Test(config, defaults_follow_megatron) {
    mc_gpt_config in = small_gpt(), c;
    cr_assert_eq(mc_gpt_config_resolve(&c, &in), MC_OK);
    cr_expect_eq(c.ffn_hidden_size, 256);
    cr_expect_eq(c.kv_channels, 16);
    cr_expect_eq(c.num_query_groups, 4);
    cr_expect_eq(c.make_vocab_size_divisible_by, 128);
    cr_expect_eq(c.max_position_embeddings, 32);
    cr_expect_eq(c.layernorm_epsilon, 1e-5f);
    cr_expect_eq(c.init_method_std, 0.02f);
    cr_expect_eq(c.hidden_dropout, 0.1f);
    cr_expect_eq(c.attention_dropout, 0.1f);
    cr_expect_eq(c.tensor_model_parallel_size, 1);
    cr_expect_eq(c.pipeline_model_parallel_size, 1);
    cr_expect_eq(c.virtual_pipeline_model_parallel_size, 0);
    cr_expect_eq(c.untie_embeddings_and_output_weights, 0);
    cr_expect_eq(c.seed, 1234);
    cr_expect_eq(c.padded_vocab_size, 1024);
    cr_expect_eq(c.recompute_granularity, MC_RECOMPUTE_NONE);
    /* given values are kept; in place works */
    in.ffn_hidden_size = 100;
    in.layernorm_epsilon = 1e-6f;
    in.hidden_dropout = 0.25f;
    in.virtual_pipeline_model_parallel_size = 1;   /* one chunk: not interleaved */
    cr_assert_eq(mc_gpt_config_resolve(&in, &in), MC_OK);
    cr_expect_eq(in.ffn_hidden_size, 100);
    cr_expect_eq(in.layernorm_epsilon, 1e-6f);
    cr_expect_eq(in.hidden_dropout, 0.25f);
    cr_expect_eq(in.virtual_pipeline_model_parallel_size, 0);
    cr_expect_eq(mc_gpt_config_resolve(NULL, &in), MC_ERR_INVALID_ARG);
}

Test(config, dropout_off_survives_a_second_resolve) {
    mc_gpt_config c = small_gpt(), r, again;
    c.hidden_dropout = MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    mc_gpt_config_resolve(&r, &c);
    cr_expect_eq(r.hidden_dropout, 0.0f);
    cr_expect_eq(r.attention_dropout, 0.0f);
    /* edit the layout of the resolved config and resolve again: dropout stays off, the padded
       vocabulary follows the new TP size */
    r.tensor_model_parallel_size = 4;
    mc_gpt_config_resolve(&again, &r);
    cr_expect_eq(again.hidden_dropout, 0.0f);
    cr_expect_eq(again.attention_dropout, 0.0f);
    cr_expect_eq(again.padded_vocab_size, 1024);   /* 1000 -> multiple of 512 */
    validate_expect(&r, 0, NULL);
}

Test(config, padded_vocab_examples) {
    cr_expect_eq(mc_gpt_padded_vocab_size(50257, 128, 1), 50304);
    cr_expect_eq(mc_gpt_padded_vocab_size(50257, 128, 2), 50432);
    cr_expect_eq(mc_gpt_padded_vocab_size(50257, 128, 8), 51200);
    cr_expect_eq(mc_gpt_padded_vocab_size(32000, 128, 4), 32256);
    cr_expect_eq(mc_gpt_padded_vocab_size(32000, 128, 1), 32000);   /* already a multiple */
    cr_expect_eq(mc_gpt_padded_vocab_size(256, 1, 1), 256);
    cr_expect_eq(mc_gpt_padded_vocab_size(0, 128, 1), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_gpt_padded_vocab_size(100, 128, 0), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_gpt_padded_vocab_size(2147483000, 128, 8), MC_ERR_INVALID_ARG);
    /* and through resolve */
    mc_gpt_config c = small_gpt(), r;
    c.vocab_size = 50257;
    c.tensor_model_parallel_size = 2;
    mc_gpt_config_resolve(&r, &c);
    cr_expect_eq(r.padded_vocab_size, 50432);
}

Test(config, valid_configs_report_nothing) {
    mc_gpt_config c = small_gpt();
    validate_expect(&c, 0, NULL);
    cr_expect_str_eq(report, "");
    c.tensor_model_parallel_size = 4;
    c.pipeline_model_parallel_size = 2;
    c.virtual_pipeline_model_parallel_size = 2;
    c.sequence_parallel = 1;
    c.recompute_granularity = MC_RECOMPUTE_FULL;
    c.recompute_method = MC_RECOMPUTE_BLOCK;
    c.recompute_num_layers = 2;
    c.hidden_dropout = MC_DROPOUT_OFF;
    validate_expect(&c, 0, NULL);
    c.recompute_granularity = MC_RECOMPUTE_SELECTIVE;
    c.recompute_method = MC_RECOMPUTE_METHOD_NONE;
    c.recompute_num_layers = 0;
    validate_expect(&c, 0, NULL);
}

/* One rule at a time: each case breaks exactly one rule of a valid config. */
Test(config, every_rule_fires_with_its_message) {
    mc_gpt_config c;
#define ONE(setup, text)                  \
    do {                                  \
        c = small_gpt();                  \
        setup;                            \
        validate_expect(&c, 1, text);     \
    } while (0)
    ONE(c.num_layers = 0, "num_layers (0) is required and must be > 0");
    ONE(c.hidden_size = 0; c.ffn_hidden_size = 256; c.kv_channels = 16,
        "hidden_size (0) is required and must be > 0");
    ONE(c.num_attention_heads = 0; c.kv_channels = 16; c.num_query_groups = 4,
        "num_attention_heads (0) is required");
    ONE(c.seq_length = 0; c.max_position_embeddings = 32, "seq_length (0) is required");
    ONE(c.vocab_size = 0, "vocab_size (0) is required");
    ONE(c.micro_batch_size = 0, "micro_batch_size (0) is required");
    ONE(c.ffn_hidden_size = -4, "ffn_hidden_size (-4) must be > 0");
    ONE(c.make_vocab_size_divisible_by = -1, "make_vocab_size_divisible_by (-1) must be > 0");
    ONE(c.pipeline_model_parallel_size = -2, "pipeline_model_parallel_size (-2) must be > 0");
    ONE(c.virtual_pipeline_model_parallel_size = 16; c.pipeline_model_parallel_size = 2;
        c.num_layers = 64, "virtual_pipeline_model_parallel_size (16) must be in [0, 8]");
    ONE(c.num_attention_heads = 2; c.tensor_model_parallel_size = 4,   /* groups 2 divide 4 */
        "num_attention_heads (2) must be divisible by tensor_model_parallel_size (4)");
    ONE(c.ffn_hidden_size = 250; c.tensor_model_parallel_size = 4,
        "ffn_hidden_size (250) must be divisible by tensor_model_parallel_size (4)");
    ONE(c.kv_channels = 8,
        "kv_channels (8) x num_attention_heads (4) = 32 must equal hidden_size (64)");
    ONE(c.hidden_size = 66, "kv_channels (16) x num_attention_heads (4) = 64 must equal "
                            "hidden_size (66)");
    ONE(c.num_query_groups = 2, "num_query_groups (2) must equal num_attention_heads (4): "
                                "grouped-query attention is not implemented");
    ONE(c.num_layers = 6; c.pipeline_model_parallel_size = 4,
        "num_layers (6) must be divisible by pipeline_model_parallel_size (4)");
    ONE(c.virtual_pipeline_model_parallel_size = 2,
        "virtual_pipeline_model_parallel_size (2) needs pipeline_model_parallel_size > 1 "
        "(it is 1)");
    ONE(c.num_layers = 80; c.pipeline_model_parallel_size = 16;
        c.virtual_pipeline_model_parallel_size = 2,
        "num_layers (80) must be divisible by pipeline_model_parallel_size (16) x "
        "virtual_pipeline_model_parallel_size (2) = 32 (upstream once divided silently and "
        "built 64 layers: NVIDIA/Megatron-LM #468)");
    ONE(c.sequence_parallel = 1, "Cannot use sequence parallelism without tensor parallelism");
    ONE(c.sequence_parallel = 1; c.tensor_model_parallel_size = 4; c.seq_length = 30;
        c.max_position_embeddings = 32,
        "seq_length (30) must be divisible by tensor_model_parallel_size (4) with "
        "sequence_parallel");
    ONE(c.recompute_granularity = MC_RECOMPUTE_FULL; c.recompute_num_layers = 1,
        "recompute_granularity full needs recompute_method uniform or block");
    ONE(c.recompute_granularity = MC_RECOMPUTE_FULL; c.recompute_method = MC_RECOMPUTE_UNIFORM,
        "recompute_num_layers (0) must be between 1 and num_layers_per_pipeline_rank (4)");
    ONE(c.recompute_granularity = MC_RECOMPUTE_FULL; c.recompute_method = MC_RECOMPUTE_BLOCK;
        c.pipeline_model_parallel_size = 2; c.recompute_num_layers = 3,
        "recompute_num_layers (3) must be between 1 and num_layers_per_pipeline_rank (2)");
    ONE(c.recompute_granularity = MC_RECOMPUTE_SELECTIVE; c.recompute_num_layers = 2,
        "recompute_num_layers (2) must be 0 (None) with recompute_granularity selective");
    ONE(c.recompute_granularity = MC_RECOMPUTE_SELECTIVE;
        c.recompute_method = MC_RECOMPUTE_UNIFORM,
        "recompute_method (uniform) is not supported with recompute_granularity selective");
    ONE(c.recompute_method = MC_RECOMPUTE_BLOCK, "recompute_method (block) and "
                                                 "recompute_num_layers (0) need "
                                                 "recompute_granularity full");
    ONE(c.recompute_granularity = (mc_recompute_granularity)7,
        "recompute_granularity (7) must be none, full or selective");
    ONE(c.hidden_dropout = 1.0f, "hidden_dropout (1) must be in [0, 1)");
    ONE(c.attention_dropout = -0.5f, "attention_dropout (-0.5) must be in [0, 1)");
    ONE(c.layernorm_epsilon = -1e-5f, "layernorm_epsilon (-1e-05) must be > 0");
    ONE(c.init_method_std = -0.02f, "init_method_std (-0.02) must be > 0");
    ONE(c.seed = -3, "seed (-3) must be > 0");
    ONE(c.max_position_embeddings = 16,
        "max_position_embeddings (16) must be >= seq_length (32)");
#undef ONE
}

/* Megatron's "multiple or divisor of TP" rule shows next to the no-GQA rule. */
Test(config, query_groups_rule_of_megatron) {
    mc_gpt_config c = small_gpt();
    c.num_attention_heads = 12;
    c.hidden_size = 96;
    c.tensor_model_parallel_size = 4;
    c.num_query_groups = 6;   /* neither a multiple nor a divisor of 4 */
    int n = mc_gpt_config_validate(&c, report, sizeof report);
    cr_expect_eq(n, 2, "%s", report);
    cr_expect(mc_test_contains(report, "num_query_groups (6) must be a multiple or a divisor of "
                                       "tensor_model_parallel_size (4)"), "%s", report);
    cr_expect(mc_test_contains(report, "grouped-query attention is not implemented"), "%s",
              report);
}

Test(config, all_violations_are_reported_together) {
    mc_gpt_config c = small_gpt();
    c.num_attention_heads = 6;         /* 6 % 4, 16 x 6 != 64, groups 6 vs TP 4 */
    c.kv_channels = 16;
    c.ffn_hidden_size = 256;
    c.tensor_model_parallel_size = 4;
    c.num_layers = 5;                  /* 5 % 2 */
    c.pipeline_model_parallel_size = 2;
    c.hidden_dropout = 1.5f;
    int n = mc_gpt_config_validate(&c, report, sizeof report);
    cr_expect_eq(n, 5, "%s", report);
    cr_expect_eq(count_lines(report), n, "one line per violation:\n%s", report);
    cr_expect(mc_test_contains(report, "num_query_groups (6) must be a multiple or a divisor"));
    cr_expect(mc_test_contains(report, "num_attention_heads (6) must be divisible"));
    cr_expect(mc_test_contains(report, "= 96 must equal hidden_size (64)"));
    cr_expect(mc_test_contains(report, "num_layers (5) must be divisible"));
    cr_expect(mc_test_contains(report, "hidden_dropout (1.5)"));
    /* a missing required field and a bad SP setting with it: 3 at once */
    c = small_gpt();
    c.num_layers = 0;
    c.sequence_parallel = 1;
    c.seed = -1;
    cr_expect_eq(mc_gpt_config_validate(&c, report, sizeof report), 3, "%s", report);
    cr_expect_eq(count_lines(report), 3, "%s", report);
    /* a short buffer still counts every violation and stays terminated */
    char tiny[24];
    cr_expect_eq(mc_gpt_config_validate(&c, tiny, sizeof tiny), 3);
    cr_expect(strlen(tiny) < sizeof tiny);
    cr_expect_eq(mc_gpt_config_validate(&c, NULL, 0), 3);
}

Test(config, math_fingerprint_tracks_the_function) {
    mc_gpt_config base = small_gpt(), c;
    uint64_t f = mc_gpt_config_math_fingerprint(&base);
    /* resolved or not: the same */
    mc_gpt_config_resolve(&c, &base);
    cr_expect_eq(mc_gpt_config_math_fingerprint(&c), f);
#define CHANGES(setup, changes)                                                               \
    do {                                                                                      \
        c = small_gpt();                                                                      \
        setup;                                                                                \
        cr_expect_eq(mc_gpt_config_math_fingerprint(&c) != f, changes, "math fingerprint, " \
                     #setup);                                                                 \
    } while (0)
    CHANGES(c.layernorm_epsilon = 1e-6f, 1);
    CHANGES(c.num_attention_heads = 8, 1);
    CHANGES(c.vocab_size = 1001, 1);
    CHANGES(c.untie_embeddings_and_output_weights = 1, 1);
    CHANGES(c.num_layers = 8, 1);
    CHANGES(c.ffn_hidden_size = 128, 1);
    CHANGES(c.max_position_embeddings = 64, 1);
    CHANGES(c.make_vocab_size_divisible_by = 64, 1);
    CHANGES(c.tensor_model_parallel_size = 2, 0);   /* padded vocab changes, math does not */
    CHANGES(c.pipeline_model_parallel_size = 2, 0);
    CHANGES(c.virtual_pipeline_model_parallel_size = 2, 0);
    CHANGES(c.sequence_parallel = 1, 0);
    CHANGES(c.recompute_granularity = MC_RECOMPUTE_SELECTIVE, 0);
    CHANGES(c.recompute_granularity = MC_RECOMPUTE_FULL; c.recompute_method = MC_RECOMPUTE_BLOCK;
            c.recompute_num_layers = 1, 0);
    CHANGES(c.hidden_dropout = MC_DROPOUT_OFF, 0);
    CHANGES(c.init_method_std = 0.01f, 0);
    CHANGES(c.seed = 7, 0);
    CHANGES(c.micro_batch_size = 8, 0);
    CHANGES(c.seq_length = 16; c.max_position_embeddings = 32, 0);
    CHANGES(c.layernorm_epsilon = 1e-5f, 0);   /* the default, spelled out */
    CHANGES(c.ffn_hidden_size = 256, 0);
    CHANGES(c.untie_embeddings_and_output_weights = 0, 0);
#undef CHANGES
}

Test(config, layout_fingerprint_tracks_the_layout) {
    mc_gpt_config base = small_gpt(), c;
    uint64_t f = mc_gpt_config_layout_fingerprint(&base);
#define CHANGES(setup, changes)                                                                \
    do {                                                                                       \
        c = small_gpt();                                                                       \
        setup;                                                                                 \
        cr_expect_eq(mc_gpt_config_layout_fingerprint(&c) != f, changes, "layout fingerprint, " \
                     #setup);                                                                  \
    } while (0)
    CHANGES(c.tensor_model_parallel_size = 2, 1);
    CHANGES(c.pipeline_model_parallel_size = 2, 1);
    CHANGES(c.pipeline_model_parallel_size = 2; c.virtual_pipeline_model_parallel_size = 2, 1);
    CHANGES(c.sequence_parallel = 1, 1);
    CHANGES(c.tensor_model_parallel_size = 1, 0);   /* the default, spelled out */
    CHANGES(c.layernorm_epsilon = 1e-6f, 0);
    CHANGES(c.num_attention_heads = 8, 0);
    CHANGES(c.vocab_size = 1001, 0);
    CHANGES(c.untie_embeddings_and_output_weights = 1, 0);
    CHANGES(c.recompute_granularity = MC_RECOMPUTE_SELECTIVE, 0);
#undef CHANGES
    /* the two fingerprints differ from each other for the same config */
    cr_expect_neq(mc_gpt_config_math_fingerprint(&base), f);
}

Test(config, math_diff_names_fields_and_values) {
    mc_gpt_config a = small_gpt(), b = small_gpt();
    char out[512];
    cr_expect_eq(mc_gpt_config_math_diff(&a, &b, out, sizeof out), 0);
    cr_expect_str_eq(out, "");
    b.tensor_model_parallel_size = 2;   /* layout only: no math difference */
    b.hidden_dropout = 0.3f;
    cr_expect_eq(mc_gpt_config_math_diff(&a, &b, out, sizeof out), 0, "%s", out);
    b.layernorm_epsilon = 1e-6f;
    b.untie_embeddings_and_output_weights = 1;
    b.num_attention_heads = 8;
    b.kv_channels = 8;
    cr_expect_eq(mc_gpt_config_math_diff(&a, &b, out, sizeof out), 5, "%s", out);
    cr_expect_str_eq(out, "num_attention_heads: 4 vs 8; kv_channels: 16 vs 8; "
                          "num_query_groups: 4 vs 8; layernorm_epsilon: 1e-05 vs 1e-06; "
                          "untie_embeddings_and_output_weights: 0 vs 1");
    char tiny[10];
    cr_expect_eq(mc_gpt_config_math_diff(&a, &b, tiny, sizeof tiny), 5);
    cr_expect(strlen(tiny) < sizeof tiny);
    cr_expect_eq(mc_gpt_config_math_diff(&a, NULL, out, sizeof out), MC_ERR_INVALID_ARG);
}
