/* tests/test_memory.c - the memory estimate (>>theoretical_memory), `megatron_c memory` and
   pretrain_gpt's up-front memory check.

     - the paper model against hand-computed cases: Korthikanti et al. 2022's per-layer formulas
       with small numbers (s 4, b 2, h 8, a 2: s·b·h = 64, a·s/h = 1), the parameter count of a
       real mc_gpt, Megatron's 18 and 6 + 12/d bytes per parameter, the in-flight counts of 1F1B
       and the interleaving factor L·(1 + (p - 1)/(p·v));
     - the memory account of the op table (counts, peaks, frees, growth);
     - the implementation model against what a run allocates: pretrain_gpt trains two
       iterations under mpirun on a counted op table and prints every rank's peak per category
       beside its estimate; they must be equal to the byte (tolerance 0), for ten layouts;
     - the command line: the 350M example by hand, JSON terms summing to the totals, the SVG,
       and bad flags refused exactly as pretrain_gpt refuses them;
     - pretrain_gpt refusing a model that cannot fit before allocating it. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define OUT_CAP (1u << 20)

TestSuite(memory, .timeout = 120);

/* --- the estimator ---------------------------------------------------------------------------- */

/* s 4, b 2, h 8, a 2, F 32, L 2, vocabulary 16 (padded 16 up to t = 2), positions 4. */
static mc_memory_desc small_desc(void) {
    mc_memory_desc d;
    memset(&d, 0, sizeof d);
    d.config.num_layers = 2;
    d.config.hidden_size = 8;
    d.config.num_attention_heads = 2;
    d.config.seq_length = 4;
    d.config.vocab_size = 16;
    d.config.make_vocab_size_divisible_by = 8;
    d.config.micro_batch_size = 2;
    d.bf16 = 1;
    return d;
}

static mc_memory_stage estimate(const mc_memory_desc *d, int pp_rank) {
    mc_memory_stage st;
    int rc = mc_memory_estimate(d, pp_rank, &st);
    cr_assert_eq(rc, MC_OK, "mc_memory_estimate: %s", mc_last_error());
    return st;
}

/* Bytes of the term `name` of `model` (-1 when there is none). */
static double term_bytes(const mc_memory_stage *st, mc_memory_model model, const char *name) {
    for (int i = 0; i < st->n_terms; i++)
        if (st->terms[i].model == model && strcmp(st->terms[i].name, name) == 0)
            return st->terms[i].bytes;
    return -1.0;
}

static const mc_memory_term *find_term(const mc_memory_stage *st, mc_memory_model model,
                                       const char *name) {
    for (int i = 0; i < st->n_terms; i++)
        if (st->terms[i].model == model && strcmp(st->terms[i].name, name) == 0)
            return &st->terms[i];
    cr_assert_fail("no %s term \"%s\"", mc_memory_model_name(model), name);
    return NULL;
}

#define LAYERS "transformer layers"

Test(memory, paper_activations_no_parallelism) {
    mc_memory_desc d = small_desc();
    mc_memory_stage st = estimate(&d, 0);
    /* s·b·h·(34 + 5·a·s/h) = 64·39 per layer, 2 layers, 1 micro-batch */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 2.0 * 64 * 39);
    /* token ids 8·s·b + dropout mask s·b·h */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "embedding ids, dropout mask"), 64.0 + 64.0);
    /* 4·s·b·h + 4·s·b·V with t = 1 */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "final norm, output layer, logits"),
                 4.0 * 64 + 4.0 * 8 * 16);
    cr_expect_eq(st.bytes[MC_MEMORY_PAPER][MC_MEMORY_ACTIVATIONS], 4992.0 + 128.0 + 768.0);
    const mc_memory_term *t = find_term(&st, MC_MEMORY_PAPER, LAYERS);
    cr_expect_str_eq(t->formula, "s\xc2\xb7" "b\xc2\xb7" "h\xc2\xb7(34 + 5\xc2\xb7" "a\xc2\xb7"
                                 "s/h) \xc3\x97 L/p \xc3\x97 1");
    cr_expect_str_eq(t->values, "4\xc2\xb7" "2\xc2\xb7" "8\xc2\xb7(34 + 5\xc2\xb7" "2\xc2\xb7"
                                "4/8) \xc3\x97 2 \xc3\x97 1");
}

Test(memory, paper_activations_tensor_and_sequence_parallel) {
    mc_memory_desc d = small_desc();
    d.config.tensor_model_parallel_size = 2;
    mc_memory_stage st = estimate(&d, 0);
    /* s·b·h·(10 + 24/t + 5·a·s/(h·t)) = 64·24.5 */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 2.0 * 64 * 24.5);
    d.config.sequence_parallel = 1;
    st = estimate(&d, 0);
    /* s·b·h·(34 + 5·a·s/h)/t = 64·39/2 */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 2.0 * 64 * 39 / 2);
    /* the embedding's mask and the output inputs are split too, the ids are not */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "embedding ids, dropout mask"), 64.0 + 32.0);
    /* 4·s·b·h·(1 + V/h)/t: the paper's output-layer term */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "final norm, output layer, logits"),
                 4.0 * 64 * (1.0 + 16.0 / 8.0) / 2);
}

Test(memory, paper_activations_recompute) {
    mc_memory_desc d = small_desc();
    d.config.recompute_granularity = MC_RECOMPUTE_SELECTIVE;
    mc_memory_stage st = estimate(&d, 0);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 2.0 * 34 * 64);   /* 34·s·b·h */
    d.config.tensor_model_parallel_size = 2;
    st = estimate(&d, 0);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 2.0 * 64 * (10 + 12));
    d.config.sequence_parallel = 1;
    st = estimate(&d, 0);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 2.0 * 34 * 64 / 2);   /* 34·s·b·h/t */
    /* full recompute: only the input of each layer, 2·s·b·h (/t under SP) */
    d.config.recompute_granularity = MC_RECOMPUTE_FULL;
    d.config.recompute_method = MC_RECOMPUTE_UNIFORM;
    d.config.recompute_num_layers = 1;
    st = estimate(&d, 0);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), -1.0, "no layer keeps activations");
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "recompute group inputs"), 2.0 * 2 * 64 / 2);
    d.config.sequence_parallel = 0, d.config.tensor_model_parallel_size = 1;
    st = estimate(&d, 0);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "recompute group inputs"), 2.0 * 2 * 64);
    /* uniform groups of 2: one stored input for both layers */
    d.config.recompute_num_layers = 2;
    st = estimate(&d, 0);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "recompute group inputs"), 2.0 * 64);
    /* block 1: the first layer keeps its input only, the second everything */
    d.config.recompute_method = MC_RECOMPUTE_BLOCK;
    d.config.recompute_num_layers = 1;
    st = estimate(&d, 0);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "recomputed layers' inputs"), 2.0 * 64);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 64.0 * 39);
}

Test(memory, paper_activations_fp32_coefficients) {
    mc_memory_desc d = small_desc();
    d.bf16 = 0;
    mc_memory_stage st = estimate(&d, 0);
    /* the same tensors at 4 bytes: 16·4 + 2 = 66, 2·4 + 1 = 9 */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 2.0 * 64 * (66 + 9));
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, "final norm, output layer, logits"),
                 8.0 * 64 + 4.0 * 8 * 16);
    /* F != 4h: 34 becomes 18 + 4·F/h (bf16) */
    d = small_desc();
    d.config.ffn_hidden_size = 16;
    st = estimate(&d, 0);
    cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 2.0 * 64 * (18 + 8 + 5));
}

Test(memory, parameters_and_bytes_per_parameter) {
    mc_memory_desc d = small_desc();
    mc_memory_stage st = estimate(&d, 0);
    /* per layer: qkv 3h·h + 3h, proj h·h + h, fc1 F·h + F, fc2 h·F + h, two norms 4h = 872;
       word and position embeddings 16·8 + 4·8; final norm 16; tied, so no output layer */
    cr_expect_eq(st.params, 2.0 * 872 + 128 + 32 + 16);
    /* the same count as the real model's parameter table */
    mc_gpt gpt;
    cr_assert_eq(mc_gpt_init(&gpt, &(mc_gpt_desc){.config = d.config}), MC_OK, "%s",
                 mc_last_error());
    cr_expect_eq(st.params, (double)gpt.table.total);
    mc_gpt_free(&gpt);
    double P = st.params;
    /* Megatron with bf16: 2 + 4 + 12 = 18 bytes per parameter */
    cr_expect_eq(st.bytes[MC_MEMORY_PAPER][MC_MEMORY_PARAMETERS] +
                     st.bytes[MC_MEMORY_PAPER][MC_MEMORY_GRADIENTS] +
                     st.bytes[MC_MEMORY_PAPER][MC_MEMORY_OPTIMIZER], 18.0 * P);
    /* distributed optimizer over d = 4: 6 + 12/d */
    d.distributed_optimizer = 1, d.data_parallel_size = 4;
    st = estimate(&d, 0);
    cr_expect_eq(st.bytes[MC_MEMORY_PAPER][MC_MEMORY_OPTIMIZER], 12.0 * P / 4);
    cr_expect_eq(st.bytes[MC_MEMORY_PAPER][MC_MEMORY_PARAMETERS], 2.0 * P);
    /* this implementation: fp32 params and grads, m and v sharded; P' padded (starts at 64,
       the bucket end at lcm(4, 128) = 128) */
    cr_expect_gt(st.params_padded, P);
    cr_expect_eq(fmod(st.params_padded, 128.0), 0.0);
    /* bf16 (small_desc): fp32 main params beside m and v */
    cr_expect_eq(term_bytes(&st, MC_MEMORY_IMPLEMENTATION, "main params, Adam m, v"),
                 12.0 * st.params_padded / 4);
    cr_expect_eq(st.bytes[MC_MEMORY_IMPLEMENTATION][MC_MEMORY_PARAMETERS], 2.0 * st.params_padded);
    /* fp32 paper: 4 + 4 + 8 bytes */
    d = small_desc();
    d.bf16 = 0;
    st = estimate(&d, 0);
    cr_expect_eq(st.bytes[MC_MEMORY_PAPER][MC_MEMORY_OPTIMIZER], 8.0 * P);
    cr_expect_eq(st.bytes[MC_MEMORY_PAPER][MC_MEMORY_PARAMETERS], 4.0 * P);
}

Test(memory, one_f_one_b_in_flight) {
    mc_memory_desc d = small_desc();
    d.config.num_layers = 4;
    d.config.pipeline_model_parallel_size = 4;
    d.num_microbatches = 8;
    for (int r = 0; r < 4; r++) {
        mc_memory_stage st = estimate(&d, r);
        cr_expect_eq(st.in_flight, 4 - r, "stage %d holds min(p - r, M) = %d", r, 4 - r);
        cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 64.0 * 39 * (4 - r));
        cr_expect_eq(st.n_slots, 4 - r, "pretrain_gpt's slots: what the schedule holds");
    }
    d.num_microbatches = 2;
    for (int r = 0; r < 4; r++)
        cr_expect_eq(estimate(&d, r).in_flight, 4 - r < 2 ? 4 - r : 2, "min(p - r, M), r = %d", r);
}

Test(memory, interleaved_factor_of_the_paper) {
    static const int pv[][2] = {{2, 2}, {4, 2}, {2, 4}, {4, 4}, {8, 2}};
    for (size_t i = 0; i < sizeof pv / sizeof pv[0]; i++) {
        int p = pv[i][0], v = pv[i][1];
        mc_memory_desc d = small_desc();
        d.config.num_layers = 2 * p * v;
        d.config.pipeline_model_parallel_size = p;
        d.config.virtual_pipeline_model_parallel_size = v;
        d.num_microbatches = 4 * p;
        mc_memory_stage st = estimate(&d, 0);
        int k = 2 * (p - 1) + (v - 1) * p + 1;
        cr_expect_eq(st.in_flight, k, "p %d v %d: stage 0 holds %d chunk micro-batches", p, v, k);
        /* k chunks of L/(p·v) layers = L·(1 + (p - 1)/(p·v)) layers */
        double layers = (double)k * d.config.num_layers / (p * v);
        cr_expect(fabs(layers - d.config.num_layers * (1.0 + (p - 1.0) / (p * v))) < 1e-9,
                  "p %d v %d: %g layers held", p, v, layers);
        cr_expect_eq(term_bytes(&st, MC_MEMORY_PAPER, LAYERS), 64.0 * 39 * layers);
        /* the last stage: its warmup (v - 1)·p, plus one */
        cr_expect_eq(estimate(&d, p - 1).in_flight, (v - 1) * p + 1);
    }
}

Test(memory, categories_sum_to_the_totals) {
    mc_memory_desc d = small_desc();
    d.config.num_layers = 8;
    d.config.tensor_model_parallel_size = 2, d.config.sequence_parallel = 1;
    d.config.pipeline_model_parallel_size = 2, d.config.virtual_pipeline_model_parallel_size = 2;
    d.num_microbatches = 4, d.distributed_optimizer = 1, d.data_parallel_size = 2;
    for (int r = 0; r < 2; r++) {
        mc_memory_stage st = estimate(&d, r);
        double sum[MC_MEMORY_MODEL_COUNT][MC_MEMORY_CATEGORY_COUNT] = {{0}};
        for (int i = 0; i < st.n_terms; i++) {
            sum[st.terms[i].model][st.terms[i].category] += st.terms[i].bytes;
            cr_expect(st.terms[i].formula[0] && st.terms[i].values[0], "term %s has text",
                      st.terms[i].name);
        }
        for (int m = 0; m < MC_MEMORY_MODEL_COUNT; m++) {
            double total = 0.0;
            for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++) {
                cr_expect_eq(sum[m][c], st.bytes[m][c]);
                total += st.bytes[m][c];
            }
            cr_expect_eq(total, st.total[m]);
        }
        cr_expect_eq(st.ranks, 4, "t x d ranks hold stage %d", r);
    }
}

Test(memory, refuses_bad_input_and_leaves_out_alone) {
    mc_memory_stage st;
    memset(&st, 0xab, sizeof st);
    mc_memory_desc d = small_desc();
    d.config.num_layers = 3;
    d.config.pipeline_model_parallel_size = 2;
    cr_expect_eq(mc_memory_estimate(&d, 0, &st), MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "num_layers (3)"), "%s", mc_last_error());
    cr_expect_eq(((unsigned char *)&st)[0], 0xab, "out is written only on success");
    d = small_desc();
    cr_expect_eq(mc_memory_estimate(&d, 1, &st), MC_ERR_INVALID_ARG, "pp_rank 1 of 1");
    d.config.num_layers = 4, d.config.pipeline_model_parallel_size = 2;
    d.config.virtual_pipeline_model_parallel_size = 2, d.num_microbatches = 3;
    cr_expect_eq(mc_memory_estimate(&d, 0, &st), MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "multiple of PP"), "%s", mc_last_error());
    d = small_desc();
    d.num_microbatches = -1;
    cr_expect_eq(mc_memory_estimate(&d, 0, &st), MC_ERR_INVALID_DESC);
    cr_expect_eq(mc_memory_estimate(NULL, 0, &st), MC_ERR_INVALID_ARG);
    cr_expect_eq(((unsigned char *)&st)[0], 0xab);
}

/* The up-front check relies on this: no loop over layers or parameters. */
Test(memory, a_hundred_million_layers_estimate_at_once, .timeout = 10) {
    mc_memory_desc d = small_desc();
    d.config.num_layers = 100000000;
    d.config.hidden_size = 32;
    d.distributed_optimizer = 1, d.data_parallel_size = 2;
    mc_memory_stage st = estimate(&d, 0);
    cr_expect_gt(st.total[MC_MEMORY_IMPLEMENTATION], 1e13, "%g bytes",
                 st.total[MC_MEMORY_IMPLEMENTATION]);
    /* 12·h² + 13·h per layer */
    cr_expect_gt(st.params, 1e8 * (12.0 * 32 * 32 + 13 * 32));
}

Test(memory, format_bytes) {
    char b[32];
    cr_expect_str_eq(mc_memory_format_bytes(b, sizeof b, 96), "96 B");
    cr_expect_str_eq(mc_memory_format_bytes(b, sizeof b, 1536), "1.50 KiB");
    cr_expect_str_eq(mc_memory_format_bytes(b, sizeof b, 812.0 * 1048576), "812.0 MiB");
    cr_expect_str_eq(mc_memory_format_bytes(b, sizeof b, 3.0 * 1073741824), "3.00 GiB");
}

/* --- the memory account ---------------------------------------------------------------------- */

Test(memory, account_counts_peaks_and_frees) {
    mc_memory_account acct = {0};
    mc_ops ops = *mc_ops_cpu();
    ops.account = &acct;
    cr_expect(mc_ops_same_memory(&ops, mc_ops_cpu()), "a counted copy is the same memory");
    void *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(mc_ops_alloc(&ops, MC_MEMORY_PARAMETERS, &a, 1000), MC_OK);
    cr_assert_eq(mc_ops_alloc(&ops, MC_MEMORY_ACTIVATIONS, &b, 300), MC_OK);
    cr_assert_eq(mc_ops_alloc(&ops, MC_MEMORY_ACTIVATIONS, &c, 200), MC_OK);
    cr_expect_eq(acct.bytes[MC_MEMORY_ACTIVATIONS], 500.0);
    cr_expect_eq(acct.total, 1500.0);
    cr_expect_eq(acct.blocks, 3);
    cr_assert_eq(mc_ops_free(&ops, b), MC_OK);
    cr_expect_eq(acct.bytes[MC_MEMORY_ACTIVATIONS], 200.0);
    cr_expect_eq(acct.peak[MC_MEMORY_ACTIVATIONS], 500.0, "the peak stays");
    cr_expect_eq(acct.peak_total, 1500.0);
    mc_memory_account_reset_peaks(&acct);
    cr_expect_eq(acct.peak[MC_MEMORY_ACTIVATIONS], 200.0);
    cr_expect_eq(acct.peak_total, 1200.0);
    /* a block of the raw table is not counted; freeing it through mc_ops_free is fine */
    void *raw = NULL;
    cr_assert_eq(ops.alloc(&ops, &raw, 64), MC_OK);
    cr_expect_eq(mc_ops_free(&ops, raw), MC_OK);
    cr_expect_eq(acct.total, 1200.0);
    cr_expect_eq(mc_ops_alloc(&ops, (mc_memory_category)7, &b, 8), MC_ERR_INVALID_ARG);
    mc_ops_free(&ops, a);
    mc_ops_free(&ops, c);
    cr_expect_eq(acct.total, 0.0);
    cr_expect_eq(acct.blocks, 0);
    mc_memory_account_destroy(&acct);
}

Test(memory, account_keeps_many_blocks) {
    enum { N = 20000 };
    static void *p[N];
    mc_memory_account acct = {0};
    mc_ops ops = *mc_ops_cpu();
    ops.account = &acct;
    for (int round = 0; round < 3; round++) {   /* freed slots are reused across rounds */
        for (int i = 0; i < N; i++)
            cr_assert_eq(mc_ops_alloc(&ops, (mc_memory_category)(i % MC_MEMORY_CATEGORY_COUNT),
                                      &p[i], (size_t)(i % 7 + 1)), MC_OK);
        double want = 0;
        for (int i = 0; i < N; i++) want += i % 7 + 1;
        cr_expect_eq(acct.total, want);
        for (int i = 0; i < N; i += 2) mc_ops_free(&ops, p[i]);
        for (int i = 1; i < N; i += 2) mc_ops_free(&ops, p[i]);
        cr_expect_eq(acct.total, 0.0);
        cr_expect_eq(acct.blocks, 0);
    }
    double most = 0;
    for (int i = 0; i < N; i++) most += i % 7 + 1;
    cr_expect_eq(acct.peak_total, most, "%g", acct.peak_total);
    mc_memory_account_destroy(&acct);
}

/* --- estimate vs measured: pretrain_gpt's own report, byte for byte ------------------------------- */

#define RUN_MODEL                                                                              \
    "--num-layers 8 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --vocab-size 512 " \
    "--micro-batch-size 2 --train-iters 2"

typedef struct measure_case {
    int np;
    char flags[224];
} measure_case;

static measure_case measure_cases[] = {
    {1, "--global-batch-size 8"},
    {2, "--tensor-model-parallel-size 2 --global-batch-size 8"},
    {2, "--tensor-model-parallel-size 2 --sequence-parallel --global-batch-size 8"},
    {2, "--tensor-model-parallel-size 2 --recompute-granularity selective --global-batch-size 8"},
    {4, "--pipeline-model-parallel-size 4 --global-batch-size 16"},
    {2, "--pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method block "
        "--recompute-num-layers 2 --untie-embeddings-and-output-weights --global-batch-size 8"},
    {4, "--pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 3 --use-distributed-optimizer --global-batch-size 16"},
    {4, "--tensor-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce "
        "--ddp-bucket-size 3000 --global-batch-size 8"},
    {4, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--virtual-pipeline-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer "
        "--global-batch-size 8"},
    {4, "--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 4 "
        "--global-batch-size 24"},
    {4, "--pipeline-model-parallel-size 2 --recompute-granularity selective "
        "--use-distributed-optimizer --bf16 --global-batch-size 8"},
    {2, "--pipeline-model-parallel-size 2 --bf16 --global-batch-size 8"},
};

ParameterizedTestParameters(memory, measured_equals_estimate) {
    return cr_make_param_array(measure_case, measure_cases,
                               sizeof measure_cases / sizeof measure_cases[0]);
}

/* pretrain_gpt's rows "rank stage m/e m/e m/e m/e m/e m/e" after the memory header; returns the
   rows read into rows[r] = {rank, stage, measured0, estimated0, ...}. */
static int parse_memory_rows(const char *out, double rows[][14], int cap) {
    const char *p = strstr(out, "memory peak per rank");
    int n = 0;
    if (!p) return 0;
    p = strchr(p, '\n');
    if (p) p = strchr(p + 1, '\n');   /* the column header */
    while (p && n < cap) {
        double *r = rows[n];
        int used = 0, k;
        p++;
        if (sscanf(p, "%lf %lf%n", &r[0], &r[1], &used) != 2) break;
        const char *q = p + used;
        for (k = 0; k < 6; k++) {
            if (sscanf(q, " %lf/%lf%n", &r[2 + 2 * k], &r[3 + 2 * k], &used) != 2) break;
            q += used;
        }
        if (k < 6) break;
        n++;
        p = strchr(p, '\n');
    }
    return n;
}

ParameterizedTest(measure_case *c, memory, measured_equals_estimate, .timeout = 180) {
    static char out[OUT_CAP];
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/pretrain_gpt' " RUN_MODEL " %s", mc_test_repo_root(), c->flags);
    int rc = mc_test_mpirun(c->np, cmd, 150.0, out, sizeof out);
    cr_assert_eq(rc, 0, "-np %d %s exited %d:\n%s", c->np, cmd, rc, out);
    static double rows[16][14];
    int n = parse_memory_rows(out, rows, 16);
    cr_assert_eq(n, c->np, "one memory row per rank:\n%s", out);
    for (int r = 0; r < n; r++) {
        for (int k = 0; k < MC_MEMORY_CATEGORY_COUNT; k++)
            cr_expect_eq(rows[r][2 + 2 * k], rows[r][3 + 2 * k],
                         "-np %d %s: rank %.0f %s measured %.0f, estimated %.0f", c->np, c->flags,
                         rows[r][0], mc_memory_category_name(k), rows[r][2 + 2 * k],
                         rows[r][3 + 2 * k]);
        cr_expect_gt(rows[r][2], 0.0, "rank %.0f has parameters", rows[r][0]);
        cr_expect_gt(rows[r][8], 0.0, "rank %.0f has activations", rows[r][0]);
    }
    /* the calculator gives the same estimate for the first rank of every stage */
    char mem[8192];
    snprintf(mem, sizeof mem, "'%s/megatron_c' memory --world %d " RUN_MODEL " %s --json",
             mc_test_repo_root(), c->np, c->flags);
    static char json[OUT_CAP];
    cr_assert_eq(mc_test_run(mem, 60.0, json, sizeof json), 0, "%s", json);
    cJSON *root = cJSON_Parse(json);
    cr_assert_not_null(root, "%s", json);
    const cJSON *stage;
    cJSON_ArrayForEach(stage, cJSON_GetObjectItemCaseSensitive(root, "stages")) {
        int pp_rank = cJSON_GetObjectItemCaseSensitive(stage, "pp_rank")->valueint, found = 0;
        const cJSON *impl = cJSON_GetObjectItemCaseSensitive(stage, "implementation");
        for (int r = 0; r < n && !found; r++)   /* ranks ascend; tp 0 x dp 0 comes first */
            if ((int)rows[r][1] == pp_rank) {
                found = 1;
                for (int k = 0; k < MC_MEMORY_CATEGORY_COUNT; k++)
                    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(impl, mc_memory_category_name(k))
                                     ->valuedouble, rows[r][3 + 2 * k],
                                 "stage %d %s: megatron_c memory vs pretrain_gpt", pp_rank,
                                 mc_memory_category_name(k));
            }
        cr_expect(found, "stage %d has a rank", pp_rank);
    }
    cJSON_Delete(root);
}

/* --- the command line ------------------------------------------------------------------------- */

static int run_capture(const char *cmd, char *out) {
    return mc_test_run(cmd, 60.0, out, OUT_CAP);
}

#define GPT2_350M                                                                              \
    "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "            \
    "--vocab-size 50257 --micro-batch-size 4 --global-batch-size 32 "                           \
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "      \
    "--recompute-granularity selective --bf16"

static const cJSON *json_get(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert_not_null(v, "key %s missing", key);
    return v;
}

static double json_num(const cJSON *o, const char *key) {
    const cJSON *v = json_get(o, key);
    cr_assert(cJSON_IsNumber(v), "key %s is not a number", key);
    return v->valuedouble;
}

Test(memory, cli_350m_json_by_hand) {
    static char out[OUT_CAP];
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && ./megatron_c memory " GPT2_350M " --json 2>/dev/null",
             mc_test_repo_root());
    cr_assert_eq(run_capture(cmd, out), 0, "%s", out);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "invalid JSON: %.300s", out);
    const cJSON *stages = json_get(root, "stages");
    cr_assert_eq(cJSON_GetArraySize(stages), 2);
    const cJSON *s0 = cJSON_GetArrayItem(stages, 0);
    cr_expect_eq(json_num(s0, "ranks"), 2);
    cr_expect_eq(json_num(s0, "in_flight"), 2, "min(p - r, M) = min(2, 8)");
    /* 34·s·b·h/t per layer x 12 layers x 2 in flight, plus (8·s·b + s·b·h/t) x 2 */
    double s = 1024, b = 4, h = 1024, t = 2;
    double acts = 34 * s * b * h / t * 12 * 2 + (8 * s * b + s * b * h / t) * 2;
    cr_expect_eq(json_num(json_get(s0, "paper"), "activations"), acts);
    /* P = 12·((4h + 2F)·h + 3h + F)/t + 12·6h + V·h/t + Pm·h, V = 50432 (padded at t = 2) */
    double P = 12 * ((4 * h + 2 * 4096) * h + 3 * h + 4096) / t + 12 * 6 * h + 50432 * h / t +
               1024 * h;
    cr_expect_eq(json_num(s0, "params"), P);
    cr_expect_eq(json_num(json_get(s0, "paper"), "parameters"), 2 * P);
    /* with --bf16 this implementation stores bf16 params too (mc_gpt_desc.dtype) */
    cr_expect_eq(json_num(json_get(s0, "implementation"), "parameters"), 2 * P);
    /* every stage: terms add up to the categories */
    for (int i = 0; i < 2; i++) {
        const cJSON *st = cJSON_GetArrayItem(stages, i), *term;
        double sums[2][5] = {{0}};
        cJSON_ArrayForEach(term, json_get(st, "terms")) {
            int m = strcmp(json_get(term, "model")->valuestring, "paper") != 0;
            const char *cat = json_get(term, "category")->valuestring;
            for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++)
                if (strcmp(cat, mc_memory_category_name(c)) == 0) sums[m][c] += json_num(term, "bytes");
        }
        for (int c = 0; c < MC_MEMORY_CATEGORY_COUNT; c++) {
            cr_expect_eq(sums[0][c], json_num(json_get(st, "paper"), mc_memory_category_name(c)));
            cr_expect_eq(sums[1][c],
                         json_num(json_get(st, "implementation"), mc_memory_category_name(c)));
        }
    }
    cJSON_Delete(root);
}

Test(memory, cli_text_shows_formulas_with_numbers_and_svg_bars) {
    static char out[OUT_CAP];
    char cmd[8192], svg[256];
    snprintf(svg, sizeof svg, "/tmp/mc_memory_test_%d.svg", (int)getpid());
    snprintf(cmd, sizeof cmd, "cd '%s' && ./megatron_c memory " GPT2_350M " --svg %s",
             mc_test_repo_root(), svg);
    cr_assert_eq(run_capture(cmd, out), 0, "%s", out);
    cr_expect(mc_test_contains(out, "34\xc2\xb7s\xc2\xb7" "b\xc2\xb7h/t \xc3\x97 L/p \xc3\x97 "
                                    "min(p - r, M)"), "%s", out);
    cr_expect(mc_test_contains(out, "= 34\xc2\xb7" "1024\xc2\xb7" "4\xc2\xb7" "1024/2 \xc3\x97 12 "
                                    "\xc3\x97 2"), "%s", out);
    cr_expect(mc_test_contains(out, "stage 1 of 2") && mc_test_contains(out, "this implementation"),
              "%s", out);
    FILE *f = fopen(svg, "r");
    cr_assert_not_null(f, "no %s:\n%s", svg, out);
    static char text[OUT_CAP];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(svg);
    cr_expect(mc_test_contains(text, "<svg") && mc_test_contains(text, "</svg>"));
    int bars = 0;
    for (const char *p = strstr(text, "class=\"bar\""); p; p = strstr(p + 1, "class=\"bar\"")) bars++;
    /* paper: 4 non-zero categories (no communication); implementation: 5; two stages */
    cr_expect_eq(bars, 2 * (4 + 5), "%d bars", bars);
}

/* The same bad flag gives pretrain_gpt's message, with the program's name in front. */
Test(memory, cli_bad_flags_as_pretrain_gpt, .timeout = 180) {
    static const struct { int np; const char *flags; } bad[] = {
        {1, "--num-layers x"},
        {1, "--lr abc"},
        {1, "--recompute-granularity partial"},
        {1, "--no-such-flag"},
        {1, "--num-layers"},
        {1, "--global-batch-size 7"},
        {2, "--num-layers 3 --hidden-size 30 --pipeline-model-parallel-size 2"},
        {2, "--num-layers 4 --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2 "
            "--global-batch-size 6"},
    };
    static char mine[OUT_CAP], theirs[OUT_CAP];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "cd '%s' && ./megatron_c memory --world %d %s 2>&1 >/dev/null",
                 mc_test_repo_root(), bad[i].np, bad[i].flags);
        int rc = run_capture(cmd, mine);
        cr_expect_eq(rc, 2, "megatron_c memory %s: exit %d\n%s", bad[i].flags, rc, mine);
        snprintf(cmd, sizeof cmd, "'%s/pretrain_gpt' --train-iters 1 %s", mc_test_repo_root(),
                 bad[i].flags);
        rc = mc_test_mpirun(bad[i].np, cmd, 60.0, theirs, sizeof theirs);
        cr_expect_neq(rc, 0, "pretrain_gpt %s: exit 0", bad[i].flags);
        /* the first line after "megatron_c memory: " must appear after "pretrain_gpt: " */
        const char *msg = strstr(mine, "megatron_c memory: ");
        cr_assert_not_null(msg, "%s", mine);
        msg += strlen("megatron_c memory: ");
        char line[512], want[600];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(msg, "\n"), msg);
        snprintf(want, sizeof want, "pretrain_gpt: %s", line);
        cr_expect(mc_test_contains(theirs, want), "%s:\n  memory said: %s\n  pretrain_gpt said: %s",
                  bad[i].flags, line, theirs);
    }
}

/* --- pretrain_gpt's up-front check ---------------------------------------------------------- */

Test(memory, pretrain_gpt_refuses_what_cannot_fit_before_allocating, .timeout = 120) {
    static char out[OUT_CAP];
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && ./pretrain_gpt --num-layers 100000000 --hidden-size 32",
             mc_test_repo_root());
    double t0 = mc_test_now();
    int rc = mc_test_run(cmd, 60.0, out, sizeof out);
    double took = mc_test_now() - t0;
    cr_expect_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "not enough memory") && mc_test_contains(out, "TiB") &&
                  mc_test_contains(out, "parameters") && mc_test_contains(out, "activations"),
              "the refusal names the estimate:\n%s", out);
    cr_expect_lt(took, 30.0, "the refusal took %.1f s (allocating would take minutes)", took);
    /* on two ranks, both stop */
    snprintf(cmd, sizeof cmd, "'%s/pretrain_gpt' --num-layers 100000000 --hidden-size 32 "
             "--tensor-model-parallel-size 2", mc_test_repo_root());
    rc = mc_test_mpirun(2, cmd, 60.0, out, sizeof out);
    cr_expect(rc != 0 && rc != -1, "exit %d (-1: timed out):\n%s", rc, out);
    cr_expect(mc_test_contains(out, "not enough memory"), "%s", out);
    /* a model that fits prints its estimate and trains */
    snprintf(cmd, sizeof cmd, "cd '%s' && ./pretrain_gpt --train-iters 1", mc_test_repo_root());
    rc = mc_test_run(cmd, 60.0, out, sizeof out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(mc_test_contains(out, "memory estimate") && mc_test_contains(out, "lm loss"), "%s",
              out);
}
