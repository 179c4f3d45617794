/* test_params.c - the parameter table and its DDP layout (megatron_semantics.md §11.3).

   Every expected offset below is worked out by hand from Megatron's rules, in comments next to
   the check: reverse registration order, param starts padded to 64 and bucket ends to
   lcm(DP, 128) under the distributed optimizer, the shared embedding in a bucket of its own,
   buckets closing once they reach bucket_size, one bucket per chunk on pp_rank > 0. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

TestSuite(params, .timeout = 30);

/* A replicated 1-D param of n elements (a bias or a norm weight). */
static mc_param_info vec(int n) {
    mc_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = 1;
    p.global_shape[0] = p.local_shape[0] = n;
    p.partition_dim = -1;
    p.layer = -1;
    return p;
}

/* A column-parallel [rows, cols] weight, this rank holding local_rows of the rows. */
static mc_param_info col(int rows, int local_rows, int cols) {
    mc_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = 2;
    p.global_shape[0] = rows;
    p.local_shape[0] = local_rows;
    p.global_shape[1] = p.local_shape[1] = cols;
    p.partition_dim = 0;
    p.tensor_model_parallel = 1;
    p.layer = -1;
    return p;
}

static int add(mc_param_table *t, const char *name, mc_param_info p) {
    int i = mc_param_table_add(t, name, &p);
    cr_assert_geq(i, 0, "adding %s: %s (%s)", name, mc_err_name(i), mc_last_error());
    return i;
}

static const mc_param_info *info(const mc_param_table *t, const char *name) {
    int i = mc_param_table_find(t, name);
    cr_assert_geq(i, 0, "%s is not in the table", name);
    return &t->info[i];
}

static void layout(mc_param_table *t, int dp, int dist, size_t bucket_size, int pp_rank) {
    int rc = mc_param_table_layout(t, &(mc_param_layout_desc){.dp_size = dp,
                                                                .distributed_optimizer = dist,
                                                                .bucket_size = bucket_size,
                                                                .pp_rank = pp_rank});
    cr_assert_eq(rc, MC_OK, "layout: %s (%s)", mc_err_name(rc), mc_last_error());
}

static void expect_bucket(const mc_param_table *t, int b, size_t start, size_t end, int n_params) {
    cr_assert_lt(b, t->n_buckets, "bucket %d missing (%d buckets)", b, t->n_buckets);
    cr_expect_eq(t->buckets[b].start, start, "bucket %d start %zu, want %zu", b,
                 t->buckets[b].start, start);
    cr_expect_eq(t->buckets[b].end, end, "bucket %d end %zu, want %zu", b, t->buckets[b].end, end);
    cr_expect_eq(t->buckets[b].n_params, n_params, "bucket %d holds %d params, want %d", b,
                 t->buckets[b].n_params, n_params);
}

/* ------------------------------------------------------------------------------------------ */

Test(params, add_find_and_numel) {
    mc_param_table t = {0};
    int a = add(&t, "embedding.word_embeddings.weight", col(1024, 512, 16));
    int b = add(&t, "decoder.final_layernorm.weight", vec(16));
    cr_expect_eq(a, 0);
    cr_expect_eq(b, 1);
    cr_expect_eq(mc_param_table_find(&t, "decoder.final_layernorm.weight"), 1);
    cr_expect_eq(mc_param_table_find(&t, "decoder.final_layernorm.bias"), -1);
    cr_expect_eq(t.info[0].numel, (size_t)512 * 16);
    cr_expect_eq(t.info[1].numel, (size_t)16);
    cr_expect_eq(t.info[1].local_shape[1], 1, "a 1-D param is [n] x 1");
    cr_expect_eq(t.info[0].partition_stride, 1, "stride 0 means 1");
    cr_expect_str_eq(t.info[0].name, "embedding.word_embeddings.weight");
    mc_param_table_destroy(&t);
    cr_expect_eq(t.count, 0);
    cr_expect_null(t.info);
}

Test(params, grows_past_the_first_capacity) {
    mc_param_table t = {0};
    char name[32];
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "p%d", i);
        cr_assert_eq(add(&t, name, vec(i + 1)), i);
    }
    cr_expect_eq(mc_param_table_find(&t, "p77"), 77);
    cr_expect_eq(t.info[99].numel, (size_t)100);
    mc_param_table_destroy(&t);
}

Test(params, rejects_bad_params) {
    mc_param_table t = {0};
    add(&t, "w", vec(4));
    mc_param_info p = vec(4);
    cr_expect_eq(mc_param_table_add(&t, "w", &p), MC_ERR_INVALID_ARG, "duplicate name");
    cr_expect(mc_test_contains(mc_last_error(), "already registered"), "%s", mc_last_error());
    p.ndim = 3;
    cr_expect_eq(mc_param_table_add(&t, "x", &p), MC_ERR_INVALID_ARG, "ndim 3");
    cr_expect(mc_test_contains(mc_last_error(), "ndim (3)"), "%s", mc_last_error());
    p = vec(0);
    cr_expect_eq(mc_param_table_add(&t, "x", &p), MC_ERR_INVALID_ARG, "empty shape");
    p = col(8, 4, 2);
    p.tensor_model_parallel = 0;
    cr_expect_eq(mc_param_table_add(&t, "x", &p), MC_ERR_INVALID_ARG, "split but not TP");
    p = vec(8);
    p.local_shape[0] = 4;
    cr_expect_eq(mc_param_table_add(&t, "x", &p), MC_ERR_INVALID_ARG, "shard of a replicated");
    cr_expect(mc_test_contains(mc_last_error(), "local_shape[0] (4)"), "%s", mc_last_error());
    p = vec(8);
    p.chunk = MC_MAX_VPP;
    cr_expect_eq(mc_param_table_add(&t, "x", &p), MC_ERR_INVALID_ARG, "chunk out of range");
    p = vec(8);
    p.shared = 1;
    cr_expect_eq(mc_param_table_add(&t, "x", &p), MC_ERR_INVALID_ARG, "shared without embedding");
    cr_expect_eq(mc_param_table_add(&t, "", &p), MC_ERR_INVALID_ARG, "empty name");
    cr_expect_eq(t.count, 1, "no failed add registered anything");
    mc_param_table_destroy(&t);
}

/* Registration a(10) b(20) c(30): layout c b a, no padding without the distributed optimizer. */
Test(params, reverse_registration_order_without_padding) {
    mc_param_table t = {0};
    add(&t, "a", vec(10));
    add(&t, "b", vec(20));
    add(&t, "c", vec(30));
    layout(&t, 4, 0, 0, 0);
    cr_expect_eq(info(&t, "c")->offset, 0);
    cr_expect_eq(info(&t, "b")->offset, 30);
    cr_expect_eq(info(&t, "a")->offset, 50);
    cr_expect_eq(t.total, 60, "no padding at all: 60 elements");
    cr_expect_eq(t.order[0], 2);
    cr_expect_eq(t.order[1], 1);
    cr_expect_eq(t.order[2], 0);
    cr_assert_eq(t.n_buckets, 1);
    expect_bucket(&t, 0, 0, 60, 3);
    cr_expect_eq(t.buckets[0].first_param, 0);
    mc_param_table_destroy(&t);
}

/* Distributed optimizer, DP 2, a(10) b(100) c(30):
     c [0, 30); b starts at pad64(30) = 64 -> [64, 164); a at pad64(164) = 192 -> [192, 202);
     bucket end pad(202, lcm(2, 128) = 128) = 256.
   DP 3: lcm(3, 128) = 384, so the bucket ends at 384. DP 256: lcm = 256 -> 256. */
Test(params, distributed_optimizer_padding) {
    mc_param_table t = {0};
    add(&t, "a", vec(10));
    add(&t, "b", vec(100));
    add(&t, "c", vec(30));
    layout(&t, 2, 1, 0, 0);
    cr_expect_eq(info(&t, "c")->offset, 0);
    cr_expect_eq(info(&t, "b")->offset, 64);
    cr_expect_eq(info(&t, "a")->offset, 192);
    cr_expect_eq(t.total, 256);
    expect_bucket(&t, 0, 0, 256, 3);

    layout(&t, 3, 1, 0, 0);
    cr_expect_eq(info(&t, "a")->offset, 192);
    cr_expect_eq(t.total, 384, "lcm(3, 128) = 384");

    layout(&t, 256, 1, 0, 0);
    cr_expect_eq(t.total, 256, "lcm(256, 128) = 256");

    layout(&t, 3, 0, 0, 0);   /* a later layout replaces the earlier one */
    cr_expect_eq(info(&t, "a")->offset, 130, "no padding without the distributed optimizer");
    cr_expect_eq(t.total, 140);
    mc_param_table_destroy(&t);
}

/* First stage, distributed optimizer, DP 2: registration emb(1000, shared_embedding),
   w(100), bias(10). Reverse: bias [0, 10); w [64, 164); emb starts at pad64(164) = 192, but
   needs its own bucket: the open bucket closes at pad(192, 128) = 256 and emb takes
   [256, 1256), closing at pad(1256, 128) = 1280. */
Test(params, shared_embedding_gets_its_own_bucket_first_stage) {
    mc_param_table t = {0};
    mc_param_info emb = col(2048, 1000, 1);
    emb.shared_embedding = 1;
    add(&t, "embedding.word_embeddings.weight", emb);
    add(&t, "w", vec(100));
    add(&t, "bias", vec(10));
    layout(&t, 2, 1, 0, 0);
    cr_expect_eq(info(&t, "bias")->offset, 0);
    cr_expect_eq(info(&t, "w")->offset, 64);
    cr_expect_eq(info(&t, "embedding.word_embeddings.weight")->offset, 256);
    cr_assert_eq(t.n_buckets, 2);
    expect_bucket(&t, 0, 0, 256, 2);
    expect_bucket(&t, 1, 256, 1280, 1);
    cr_expect_eq(t.buckets[0].shared_embedding, 0);
    cr_expect_eq(t.buckets[1].shared_embedding, 1);
    cr_expect_eq(t.total, 1280);

    /* Without the distributed optimizer the shared embedding is an ordinary param. */
    layout(&t, 2, 0, 0, 0);
    cr_assert_eq(t.n_buckets, 1);
    expect_bucket(&t, 0, 0, 1110, 3);
    cr_expect_eq(info(&t, "embedding.word_embeddings.weight")->offset, 110);
    cr_expect_eq(t.buckets[0].shared_embedding, 1);
    mc_param_table_destroy(&t);
}

/* Last stage: w(100), bias(10), output copy (1000, shared + shared_embedding) registered last,
   so it comes first: [0, 1000) closes at 1024; bias [1024, 1034); w at pad64(1034) = 1088 ->
   [1088, 1188); end pad(1188, 128) = 1280. Both stages shard the embedding bucket the same
   way: one param at bucket offset 0, padded bucket size 1024 for numel 1000. */
Test(params, shared_embedding_gets_its_own_bucket_last_stage) {
    mc_param_table t = {0};
    mc_param_info out = col(2048, 1000, 1);
    out.shared_embedding = 1;
    out.shared = 1;
    add(&t, "w", vec(100));
    add(&t, "bias", vec(10));
    add(&t, "output_layer.weight", out);
    layout(&t, 2, 1, 0, 1);
    cr_assert_eq(t.n_buckets, 2);
    expect_bucket(&t, 0, 0, 1024, 1);
    expect_bucket(&t, 1, 1024, 1280, 2);
    cr_expect_eq(info(&t, "output_layer.weight")->offset, 0);
    cr_expect_eq(info(&t, "bias")->offset, 1024);
    cr_expect_eq(info(&t, "w")->offset, 1088);
    cr_expect_eq(t.buckets[0].shared_embedding, 1);
    mc_param_table_destroy(&t);
}

/* bucket_size 50, no distributed optimizer, a(10) b(20) c(30) d(40): d [0, 40) stays open
   (40 < 50); c [40, 70) reaches 70 >= 50: bucket [0, 70); b [70, 90), a [90, 100): 30 < 50,
   the rest forms the last bucket [70, 100). */
Test(params, bucket_size_splits_buckets) {
    mc_param_table t = {0};
    add(&t, "a", vec(10));
    add(&t, "b", vec(20));
    add(&t, "c", vec(30));
    add(&t, "d", vec(40));
    layout(&t, 2, 0, 50, 0);
    cr_assert_eq(t.n_buckets, 2);
    expect_bucket(&t, 0, 0, 70, 2);
    expect_bucket(&t, 1, 70, 100, 2);
    cr_expect_eq(t.buckets[1].first_param, 2);
    cr_expect_eq(t.order[t.buckets[1].first_param], 1, "b opens the second bucket");

    /* A bucket closes as soon as it reaches the size, even exactly: bucket_size 40 closes
       after d alone, then c + b = 50 >= 40, then a. */
    layout(&t, 2, 0, 40, 0);
    cr_assert_eq(t.n_buckets, 3);
    expect_bucket(&t, 0, 0, 40, 1);
    expect_bucket(&t, 1, 40, 90, 2);
    expect_bucket(&t, 2, 90, 100, 1);

    /* The same with the distributed optimizer, DP 2, bucket_size 50: d [0, 40) open;
       c at 64 -> [64, 94), 94 >= 50: close at pad(94, 128) = 128; b [128, 148); a at
       pad64(148) = 192 -> [192, 202): 202 - 128 = 74 >= 50 closes at 256. */
    layout(&t, 2, 1, 50, 0);
    cr_assert_eq(t.n_buckets, 2);
    expect_bucket(&t, 0, 0, 128, 2);
    expect_bucket(&t, 1, 128, 256, 2);
    cr_expect_eq(info(&t, "a")->offset, 192);
    mc_param_table_destroy(&t);
}

/* pp_rank > 0: Megatron sets bucket_size to None, so everything is one bucket. */
Test(params, later_pipeline_stages_do_not_bucket) {
    mc_param_table t = {0};
    add(&t, "a", vec(10));
    add(&t, "b", vec(20));
    add(&t, "c", vec(30));
    add(&t, "d", vec(40));
    layout(&t, 2, 0, 50, 1);
    cr_assert_eq(t.n_buckets, 1);
    expect_bucket(&t, 0, 0, 100, 4);
    mc_param_table_destroy(&t);
}

/* Two chunks (VPP): chunk 0 is laid out first, then chunk 1, each in reverse registration
   order; bucketing applies to chunk 0 only (Megatron's disable_bucketing for later chunks). */
Test(params, virtual_pipeline_chunks) {
    mc_param_table t = {0};
    mc_param_info p;
    const char *names[] = {"c0.a", "c1.a", "c0.b", "c1.b", "c0.c", "c1.c"};
    for (int i = 0; i < 6; i++) {
        p = vec(30);
        p.chunk = i % 2;
        add(&t, names[i], p);
    }
    layout(&t, 1, 0, 30, 0);
    /* chunk 0: c0.c [0,30) b0; c0.b [30,60) b1; c0.a [60,90) b2. chunk 1: one bucket [90,180) */
    cr_assert_eq(t.n_buckets, 4);
    expect_bucket(&t, 0, 0, 30, 1);
    expect_bucket(&t, 2, 60, 90, 1);
    expect_bucket(&t, 3, 90, 180, 3);
    cr_expect_eq(t.buckets[3].chunk, 1);
    cr_expect_eq(info(&t, "c0.c")->offset, 0);
    cr_expect_eq(info(&t, "c1.c")->offset, 90);
    cr_expect_eq(info(&t, "c1.a")->offset, 150);

    /* Distributed optimizer, DP 4 (lcm 128): chunk 0: c0.c [0,30), c0.b [64,94),
       c0.a [128,158) -> end pad(158, 128) = 256; chunk 1 starts at 256:
       c1.c [256,286), c1.b [320,350), c1.a [384,414) -> 512. */
    layout(&t, 4, 1, 0, 0);
    cr_assert_eq(t.n_buckets, 2);
    expect_bucket(&t, 0, 0, 256, 3);
    expect_bucket(&t, 1, 256, 512, 3);
    cr_expect_eq(info(&t, "c1.a")->offset, 384);
    mc_param_table_destroy(&t);
}

/* Adding a param after a layout drops the layout (every later offset would move). */
Test(params, add_after_layout_drops_the_layout) {
    mc_param_table t = {0};
    add(&t, "a", vec(10));
    layout(&t, 1, 0, 0, 0);
    cr_expect_eq(t.n_buckets, 1);
    add(&t, "b", vec(10));
    cr_expect_eq(t.n_buckets, 0);
    cr_expect_null(t.order);
    cr_expect_eq(t.total, 0);
    layout(&t, 1, 0, 0, 0);
    cr_expect_eq(t.total, 20);
    mc_param_table_destroy(&t);
}

Test(params, layout_rejects_bad_desc) {
    mc_param_table t = {0};
    add(&t, "a", vec(10));
    cr_expect_eq(mc_param_table_layout(&t, &(mc_param_layout_desc){.dp_size = -2}),
                 MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "dp_size (-2)"), "%s", mc_last_error());
    cr_expect_eq(mc_param_table_layout(&t, &(mc_param_layout_desc){.pp_rank = -1}),
                 MC_ERR_INVALID_DESC);
    mc_param_table_destroy(&t);
}

/* Properties over many shapes and DP sizes: params never overlap, keep their layout order,
   sit inside their bucket; buckets tile [0, total); under the distributed optimizer every
   param start is a multiple of 64 and every bucket a multiple of lcm(DP, 128) (so DP divides
   it); without it there is no padding at all. */
Test(params, layout_invariants) {
    static const int sizes[] = {1, 63, 64, 65, 127, 128, 129, 1000, 3, 4096, 7, 200};
    enum { N = sizeof sizes / sizeof sizes[0] };
    for (int dist = 0; dist <= 1; dist++)
        for (int dp = 1; dp <= 8; dp++)
            for (size_t bucket_size = 0; bucket_size <= 2000; bucket_size += 500) {
                mc_param_table t = {0};
                char name[16];
                size_t sum = 0;
                for (int i = 0; i < N; i++) {
                    mc_param_info p = vec(sizes[i]);
                    p.shared_embedding = (i == 4);
                    snprintf(name, sizeof name, "p%d", i);
                    add(&t, name, p);
                    sum += (size_t)sizes[i];
                }
                layout(&t, dp, dist, bucket_size, 0);
                size_t lcm = 128;
                while (lcm % (size_t)dp) lcm += 128;
                size_t prev_end = 0;
                for (int b = 0; b < t.n_buckets; b++) {
                    const mc_bucket *bk = &t.buckets[b];
                    cr_assert_eq(bk->start, prev_end, "buckets tile the buffer");
                    prev_end = bk->end;
                    if (dist) cr_assert_eq((bk->end - bk->start) % lcm, 0, "bucket %d size", b);
                    for (int k = 0; k < bk->n_params; k++) {
                        const mc_param_info *p = &t.info[t.order[bk->first_param + k]];
                        cr_assert_geq(p->offset, bk->start);
                        cr_assert_leq(p->offset + p->numel, bk->end);
                        if (dist) cr_assert_eq(p->offset % 64, 0, "%s start", p->name);
                        if (dist && p->shared_embedding)
                            cr_assert_eq(bk->n_params, 1, "shared embedding alone");
                    }
                }
                cr_assert_eq(prev_end, t.total);
                for (int k = 1; k < N; k++) {
                    const mc_param_info *a = &t.info[t.order[k - 1]], *b = &t.info[t.order[k]];
                    cr_assert_eq(t.order[k - 1], t.order[k] + 1, "reverse registration order");
                    cr_assert_leq(a->offset + a->numel, b->offset, "no overlap");
                }
                if (!dist) cr_assert_eq(t.total, sum, "no padding without the dist. optimizer");
                mc_param_table_destroy(&t);
            }
}
