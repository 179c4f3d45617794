/* tp_cases - multi-rank checks of the tensor-parallel mappings and layers: TP = the number of
   ranks, every result compared with the TP = 1 computation of the same global tensors, which
   every rank runs in process as the reference (weights from mc_init_normal_shard at TP = 1,
   shards from mc_init_normal_shard at this rank's TP coordinates).

       mpirun -np N build/tests/tp_cases <case>

   Cases:
     mappings        every mapping of §2, forward and backward, against the expected slices and
                     sums of full tensors; the divisibility errors at TP > 1.
     column          ColumnParallelLinear: plain, SP, gather_output, skip_bias_add, NULL scratch;
                     out, dX, dW (accumulated), db; the dX all-reduce is asynchronous.
     row             RowParallelLinear: input_is_parallel on/off, SP, skip_bias_add.
     embedding       VocabParallelEmbedding with ids spanning every shard (repeats included);
                     on 2 ranks also Megatron's example V = 8, ids [1,5,7,3].
     cross_entropy   vocab-parallel cross entropy with and without label smoothing: losses and
                     dlogits equal TP = 1; exactly three all-reduces (MAX, SUM, SUM), no
                     all-gather; Megatron's local-K smoothing would differ at TP > 1.
   Rank 0 ends with "N passed, N failed"; the exit status is 0 iff every rank passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "tests/test_util.h"

#define TIMEOUT_S mc_case_time_s(10.0)   /* also the watchdog */
#define SEED 1234u
#define ATOL 2e-5
#define RTOL 1e-4

static mc_comm *world;
static mc_comm *tp; /* the TP group: every rank (TP = world size) */
static int me, np;
static const mc_ops *ops;

/* ---------------------------------------------------------------------------------------------
   helpers */

static float *fzalloc(size_t n) {
    return (float *)calloc(n ? n : 1, sizeof(float));
}

/* A full tensor of deterministic values (the TP = 1 master of `name`). */
static float *full_tensor(const char *name, int rows, int cols, float std) {
    float *t = fzalloc((size_t)rows * cols);
    mc_init_normal_shard(t, name, rows, cols, -1, 1, 0, 1, std, SEED);
    return t;
}

/* A tensor that differs on every rank: "name.rank<r>". */
static float *rank_tensor(const char *name, int r, int rows, int cols) {
    char full[96];
    snprintf(full, sizeof full, "%s.rank%d", name, r);
    return full_tensor(full, rows, cols, 1.0f);
}

/* Columns [c0, c0 + w) of a [rows, cols] tensor (written by index, independently of the
   library's split). */
static float *cols_of(const float *t, int rows, int cols, int c0, int w) {
    float *out = fzalloc((size_t)rows * w);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < w; j++) out[(size_t)i * w + j] = t[(size_t)i * cols + c0 + j];
    return out;
}

static float *rows_of(const float *t, int cols, int r0, int h) {
    float *out = fzalloc((size_t)h * cols);
    memcpy(out, t + (size_t)r0 * cols, (size_t)h * cols * sizeof(float));
    return out;
}

static void add_into(float *acc, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

static int close_at(const char *label, const float *got, const float *want, size_t n, int line) {
    size_t bad = 0, first = 0;
    double max_diff = 0.0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - (double)want[i]);
        if (diff > max_diff || isnan(diff)) max_diff = diff;
        if (!(diff <= ATOL + RTOL * fabs((double)want[i]))) {
            if (bad == 0) first = i;
            bad++;
        }
    }
    return mc_case_check_at(bad == 0, line,
                            "%s (TP %d): %zu of %zu differ, max |diff| %g; first [%zu] got %.8g "
                            "want %.8g",
                            label, np, bad, n, max_diff, first, bad ? (double)got[first] : 0.0,
                            bad ? (double)want[first] : 0.0);
}
#define CLOSE(label, got, want, n) close_at((label), (got), (want), (n), __LINE__)

#define OK(call) MC_CASE_CHECK_STATUS((call), MC_OK, #call)

/* ---------------------------------------------------------------------------------------------
   a communicator wrapper that counts collectives (and keeps a copy of the first all-reduce's
   input), installed by swapping the TP communicator's op table */

typedef struct counter {
    int all_reduce, all_gather, reduce_scatter, async_all_reduce;
    mc_reduce_op reduce_ops[8];
    size_t reduce_counts[8];
    float *first_reduce_input; /* malloc'ed copy */
    size_t first_reduce_count;
} counter;

static counter cnt;
static const mc_comm_ops *real_ops;
static mc_comm_ops counting_ops;

static int count_all_reduce(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                            mc_reduce_op op, mc_request **req) {
    if (cnt.all_reduce < 8) {
        cnt.reduce_ops[cnt.all_reduce] = op;
        cnt.reduce_counts[cnt.all_reduce] = count;
    }
    if (cnt.all_reduce == 0 && dt == MC_F32) {
        cnt.first_reduce_input = (float *)malloc(count * sizeof(float));
        memcpy(cnt.first_reduce_input, send, count * sizeof(float));
        cnt.first_reduce_count = count;
    }
    cnt.all_reduce++;
    if (req) cnt.async_all_reduce++;
    return real_ops->all_reduce(c, send, recv, count, dt, op, req);
}

static int count_all_gather(mc_comm *c, const void *send, void *recv, size_t count, mc_dtype dt,
                            mc_request **req) {
    cnt.all_gather++;
    return real_ops->all_gather(c, send, recv, count, dt, req);
}

static int count_reduce_scatter(mc_comm *c, const void *send, void *recv, size_t recv_count,
                                mc_dtype dt, mc_reduce_op op, mc_request **req) {
    cnt.reduce_scatter++;
    return real_ops->reduce_scatter(c, send, recv, recv_count, dt, op, req);
}

static void counting_begin(void) {
    free(cnt.first_reduce_input);
    memset(&cnt, 0, sizeof cnt);
    real_ops = tp->ops;
    counting_ops = *real_ops;
    counting_ops.all_reduce = count_all_reduce;
    counting_ops.all_gather = count_all_gather;
    counting_ops.reduce_scatter = count_reduce_scatter;
    tp->ops = &counting_ops;
}

static void counting_end(void) {
    tp->ops = real_ops;
}

/* ---------------------------------------------------------------------------------------------
   mappings */

static void case_mappings(void) {
    const int N = 6, S = 4 * np, B = 2, Cc = 3, D = 4 * np, Dl = 4;
    const size_t R = (size_t)B * Cc, Sl = (size_t)S / np;
    float *x = full_tensor("map.x", N, D, 1.0f);          /* [N, D] replicated */
    float *xs = full_tensor("map.xs", S, (int)R, 1.0f);   /* [S, R] replicated */
    float *mine = rank_tensor("map.g", me, N, D);         /* [N, D], different per rank */
    float *mine_s = rank_tensor("map.gs", me, S, (int)R); /* [S, R], different per rank */
    float *sum = fzalloc((size_t)N * D), *sum_s = fzalloc((size_t)S * R);
    for (int r = 0; r < np; r++) { /* the sums over ranks, computed here */
        float *g = rank_tensor("map.g", r, N, D), *gs = rank_tensor("map.gs", r, S, (int)R);
        add_into(sum, g, (size_t)N * D);
        add_into(sum_s, gs, (size_t)S * R);
        free(g);
        free(gs);
    }
    float *x_cols = cols_of(x, N, D, me * Dl, Dl), *sum_cols = cols_of(sum, N, D, me * Dl, Dl);
    float *xs_rows = rows_of(xs, (int)R, me * (int)Sl, (int)Sl);
    float *sum_rows = rows_of(sum_s, (int)R, me * (int)Sl, (int)Sl);
    float *out = fzalloc((size_t)N * D + (size_t)S * R), *scratch = fzalloc((size_t)N * D);
    size_t n = (size_t)N * D;

    /* copy_to: identity forward (also in place), all-reduce backward */
    OK(mc_copy_to_tp_region_forward(out, x, n, MC_F32, tp, ops));
    CLOSE("copy_to forward", out, x, n);
    memcpy(out, x, n * sizeof(float));
    OK(mc_copy_to_tp_region_forward(out, out, n, MC_F32, tp, ops));
    CLOSE("copy_to forward in place", out, x, n);
    OK(mc_copy_to_tp_region_backward(out, mine, n, MC_F32, tp, ops));
    CLOSE("copy_to backward = all-reduce", out, sum, n);
    /* reduce_from: all-reduce forward (in place), identity backward */
    memcpy(out, mine, n * sizeof(float));
    OK(mc_reduce_from_tp_region_forward(out, out, n, MC_F32, tp, ops));
    CLOSE("reduce_from forward = all-reduce", out, sum, n);
    OK(mc_reduce_from_tp_region_backward(out, mine, n, MC_F32, tp, ops));
    CLOSE("reduce_from backward = identity", out, mine, n);
    /* scatter_to_tp: split last / all-gather last */
    OK(mc_scatter_to_tp_region_forward(out, x, N, D, MC_F32, tp, ops));
    CLOSE("scatter_to_tp forward = my columns", out, x_cols, (size_t)N * Dl);
    OK(mc_scatter_to_tp_region_backward(out, scratch, x_cols, N, D, MC_F32, tp, ops));
    CLOSE("scatter_to_tp backward = all-gather last dim", out, x, n);
    /* gather_from_tp: all-gather last (scratch allocated inside) / split last */
    OK(mc_gather_from_tp_region_forward(out, NULL, x_cols, N, D, MC_F32, tp, ops));
    CLOSE("gather_from_tp forward = all-gather last dim", out, x, n);
    OK(mc_gather_from_tp_region_backward(out, x, N, D, MC_F32, tp, ops));
    CLOSE("gather_from_tp backward = my columns", out, x_cols, (size_t)N * Dl);
    /* all_gather_last_dim: all-gather / reduce-scatter last dim */
    OK(mc_all_gather_last_dim_forward(out, scratch, x_cols, N, D, MC_F32, tp, ops));
    CLOSE("all_gather_last_dim forward", out, x, n);
    OK(mc_all_gather_last_dim_backward(out, NULL, mine, N, D, MC_F32, tp, ops));
    CLOSE("all_gather_last_dim backward = reduce-scatter last dim", out, sum_cols, (size_t)N * Dl);
    /* reduce_scatter_last_dim: reduce-scatter / all-gather last dim */
    OK(mc_reduce_scatter_last_dim_forward(out, scratch, mine, N, D, MC_F32, tp, ops));
    CLOSE("reduce_scatter_last_dim forward", out, sum_cols, (size_t)N * Dl);
    OK(mc_reduce_scatter_last_dim_backward(out, NULL, x_cols, N, D, MC_F32, tp, ops));
    CLOSE("reduce_scatter_last_dim backward = all-gather last dim", out, x, n);

    /* sequence-parallel mappings along the first dim */
    size_t ns = (size_t)S * R;
    OK(mc_scatter_to_sp_region_forward(out, xs, S, R, MC_F32, tp, ops));
    CLOSE("scatter_to_sp forward = my rows", out, xs_rows, Sl * R);
    OK(mc_scatter_to_sp_region_backward(out, xs_rows, S, R, MC_F32, tp, ops));
    CLOSE("scatter_to_sp backward = all-gather first dim", out, xs, ns);
    OK(mc_gather_from_sp_region_forward(out, xs_rows, S, R, MC_F32, tp, ops));
    CLOSE("gather_from_sp forward = all-gather first dim", out, xs, ns);
    OK(mc_gather_from_sp_region_backward(out, mine_s, S, R, 1, MC_F32, tp, ops));
    CLOSE("gather_from_sp backward (tensor_parallel_output_grad) = reduce-scatter", out, sum_rows,
          Sl * R);
    OK(mc_gather_from_sp_region_backward(out, xs, S, R, 0, MC_F32, tp, ops));
    CLOSE("gather_from_sp backward (no tensor_parallel_output_grad) = my rows", out, xs_rows,
          Sl * R);
    OK(mc_reduce_scatter_to_sp_region_forward(out, mine_s, S, R, MC_F32, tp, ops));
    CLOSE("reduce_scatter_to_sp forward", out, sum_rows, Sl * R);
    OK(mc_reduce_scatter_to_sp_region_backward(out, xs_rows, S, R, MC_F32, tp, ops));
    CLOSE("reduce_scatter_to_sp backward = all-gather first dim", out, xs, ns);

    /* Megatron's divisibility errors, with the sizes in the message */
    if (np > 1) {
        char want[160];
        int rc = mc_scatter_to_tp_region_forward(out, x, N, D + 1, MC_F32, tp, ops);
        snprintf(want, sizeof want,
                 "last dimension (%d) is not divisible by "
                 "tensor_model_parallel_size (%d)",
                 D + 1, np);
        MC_CASE_CHECK(rc == MC_ERR_INVALID_ARG && mc_test_contains(mc_last_error(), want),
                      "split of D = %d over TP %d: %s, '%s'", D + 1, np, mc_err_name(rc),
                      mc_last_error());
        rc = mc_gather_from_sp_region_forward(out, xs_rows, S + 1, R, MC_F32, tp, ops);
        snprintf(want, sizeof want,
                 "first dimension of the tensor (S = %d) should be divisible "
                 "by tensor parallel size (%d)",
                 S + 1, np);
        MC_CASE_CHECK(rc == MC_ERR_INVALID_ARG && mc_test_contains(mc_last_error(), want),
                      "gather of S = %d over TP %d: %s, '%s'", S + 1, np, mc_err_name(rc),
                      mc_last_error());
    }
    free(x), free(xs), free(mine), free(mine_s), free(sum), free(sum_s), free(x_cols);
    free(sum_cols), free(xs_rows), free(sum_rows), free(out), free(scratch);
}

/* ---------------------------------------------------------------------------------------------
   column-parallel linear */

#define PREFILL 0.5f /* grads start here: the layers must accumulate (+=) */

static void prefill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = PREFILL;
}

static void plus_prefill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += PREFILL;
}

static const char *flag_text(int flags) {
    static char buf[128];
    snprintf(buf, sizeof buf, "%s%s%s%s", flags & MC_TP_SEQUENCE_PARALLEL ? "sp " : "",
             flags & MC_TP_GATHER_OUTPUT ? "gather_output " : "",
             flags & MC_TP_INPUT_IS_PARALLEL ? "input_is_parallel " : "",
             flags & MC_TP_SKIP_BIAS_ADD ? "skip_bias_add " : "");
    return buf;
}

static void case_column(void) {
    const int S = 8, B = 2, C = 8, OC = 12, N = S * B, OCl = OC / np, Sl = S / np;
    float *X = full_tensor("col.x", N, C, 1.0f), *W = full_tensor("col.w", OC, C, 0.3f);
    float *bias = full_tensor("col.b", 1, OC, 0.1f), *dY = full_tensor("col.dy", N, OC, 1.0f);
    /* TP = 1 reference: the same library calls without a TP group */
    float *Y = fzalloc((size_t)N * OC), *Y_nob = fzalloc((size_t)N * OC);
    float *dX = fzalloc((size_t)N * C), *dW = fzalloc((size_t)OC * C), *db = fzalloc(OC);
    OK(mc_column_parallel_linear_forward(Y, NULL, X, W, bias, S, B, C, OC, 0, MC_F32, NULL, ops));
    OK(mc_column_parallel_linear_forward(Y_nob, NULL, X, W, NULL, S, B, C, OC, 0, MC_F32, NULL,
                                         ops));
    OK(mc_column_parallel_linear_backward(dX, dW, db, NULL, dY, X, W, S, B, C, OC, 0, MC_F32, NULL,
                                          ops));
    plus_prefill(dW, (size_t)OC * C);
    plus_prefill(db, OC);

    /* this rank's shard, initialised for TP = np, must be rows [r OC/TP, ...) of the master */
    float *w = fzalloc((size_t)OCl * C), *b = fzalloc(OCl);
    mc_init_normal_shard(w, "col.w", OC, C, 0, 1, me, np, 0.3f, SEED);
    mc_init_normal_shard(b, "col.b", 1, OC, 0, 1, me, np, 0.1f, SEED);
    float *w_want = rows_of(W, C, me * OCl, OCl), *b_want = rows_of(bias, 1, me * OCl, OCl);
    CLOSE("column weight shard = rows of the TP=1 master", w, w_want, (size_t)OCl * C);
    CLOSE("column bias shard = slice of the TP=1 master", b, b_want, OCl);

    float *Y_cols = cols_of(Y, N, OC, me * OCl, OCl),
          *Ynob_cols = cols_of(Y_nob, N, OC, me * OCl, OCl);
    float *dY_cols = cols_of(dY, N, OC, me * OCl, OCl);
    float *dW_rows = rows_of(dW, C, me * OCl, OCl), *db_rows = rows_of(db, 1, me * OCl, OCl);
    float *X_rows = rows_of(X, C, me * Sl * B, Sl * B),
          *dX_rows = rows_of(dX, C, me * Sl * B, Sl * B);

    const int variants[] = {0, MC_TP_SEQUENCE_PARALLEL, MC_TP_GATHER_OUTPUT, MC_TP_SKIP_BIAS_ADD,
                            MC_TP_SEQUENCE_PARALLEL | MC_TP_SKIP_BIAS_ADD};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        int flags = variants[v], sp = flags & MC_TP_SEQUENCE_PARALLEL;
        int gather = flags & MC_TP_GATHER_OUTPUT, skip = flags & MC_TP_SKIP_BIAS_ADD;
        char label[160];
        const float *inp = sp && np > 1 ? X_rows : X;
        size_t out_n = gather ? (size_t)N * OC : (size_t)N * OCl;
        size_t in_n = sp && np > 1 ? (size_t)Sl * B * C : (size_t)N * C;
        size_t need = mc_column_parallel_linear_scratch(S, B, C, OC, flags, np);
        /* every other variant passes its own scratch, the others let the call allocate */
        float *scratch = v % 2 ? fzalloc(need) : NULL;
        float *out = fzalloc(out_n), *dinp = fzalloc(in_n), *dw = fzalloc((size_t)OCl * C);
        float *dbv = fzalloc(OCl);
        prefill(dw, (size_t)OCl * C);
        prefill(dbv, OCl);

        snprintf(label, sizeof label, "column forward [%s]", flag_text(flags));
        OK(mc_column_parallel_linear_forward(out, scratch, inp, w, b, S, B, C, OC, flags, MC_F32,
                                             tp, ops));
        CLOSE(label, out, gather ? (skip ? Y_nob : Y) : (skip ? Ynob_cols : Y_cols), out_n);

        counting_begin();
        int rc = mc_column_parallel_linear_backward(dinp, dw, dbv, scratch, gather ? dY : dY_cols,
                                                    inp, w, S, B, C, OC, flags, MC_F32, tp, ops);
        counting_end();
        OK(rc);
        snprintf(label, sizeof label, "column dX [%s]", flag_text(flags));
        CLOSE(label, dinp, sp && np > 1 ? dX_rows : dX, in_n);
        snprintf(label, sizeof label, "column dW (+=) [%s]", flag_text(flags));
        CLOSE(label, dw, dW_rows, (size_t)OCl * C);
        snprintf(label, sizeof label, "column db (+=) [%s]", flag_text(flags));
        if (skip) {
            int untouched = 1;
            for (int j = 0; j < OCl; j++) untouched = untouched && dbv[j] == PREFILL;
            MC_CASE_CHECK(untouched, "%s: skip_bias_add must leave dbias alone", label);
        } else {
            CLOSE(label, dbv, db_rows, OCl);
        }
        if (np > 1 && sp) { /* SP: the input all-gathered again, dX reduce-scattered */
            MC_CASE_CHECK(cnt.all_gather == 1 && cnt.reduce_scatter == 1 && cnt.all_reduce == 0,
                          "column SP backward: %d all-gathers, %d reduce-scatters, %d "
                          "all-reduces; want 1, 1, 0",
                          cnt.all_gather, cnt.reduce_scatter, cnt.all_reduce);
        } else if (np > 1) { /* dX all-reduced, started before the weight gradient */
            MC_CASE_CHECK(cnt.all_reduce == 1 && cnt.async_all_reduce == 1,
                          "column backward: %d all-reduces (%d async); want 1 async",
                          cnt.all_reduce, cnt.async_all_reduce);
        } else {
            MC_CASE_CHECK(cnt.all_reduce + cnt.all_gather + cnt.reduce_scatter == 0,
                          "column backward at TP 1 communicated");
        }
        free(scratch), free(out), free(dinp), free(dw), free(dbv);
    }

    /* gather_output with SP is refused (Megatron asserts) */
    float *tmp = fzalloc((size_t)N * OC);
    int rc = mc_column_parallel_linear_forward(
        tmp, NULL, X, w, b, S, B, C, OC, MC_TP_SEQUENCE_PARALLEL | MC_TP_GATHER_OUTPUT, MC_F32, tp, ops);
    MC_CASE_CHECK(rc == MC_ERR_INVALID_ARG && mc_test_contains(mc_last_error(), "gather_output"),
                  "SP + gather_output: %s '%s'", mc_err_name(rc), mc_last_error());
    if (np > 1) {
        rc = mc_column_parallel_linear_forward(tmp, NULL, X, w, b, S, B, C, OC + 1, 0, MC_F32, tp,
                                               ops);
        MC_CASE_CHECK(
            rc == MC_ERR_INVALID_ARG && mc_test_contains(mc_last_error(), "is not divisible by"),
            "OC = %d over TP %d: %s '%s'", OC + 1, np, mc_err_name(rc), mc_last_error());
    }
    free(tmp);
    free(X), free(W), free(bias), free(dY), free(Y), free(Y_nob), free(dX), free(dW), free(db);
    free(w), free(b), free(w_want), free(b_want), free(Y_cols), free(Ynob_cols), free(dY_cols);
    free(dW_rows), free(db_rows), free(X_rows), free(dX_rows);
}

/* ---------------------------------------------------------------------------------------------
   row-parallel linear */

static void case_row(void) {
    const int S = 8, B = 2, C = 8, OC = 6, N = S * B, Cl = C / np, Sl = S / np;
    float *X = full_tensor("row.x", N, C, 1.0f), *W = full_tensor("row.w", OC, C, 0.3f);
    float *bias = full_tensor("row.b", 1, OC, 0.1f), *dY = full_tensor("row.dy", N, OC, 1.0f);
    float *Y = fzalloc((size_t)N * OC), *Y_nob = fzalloc((size_t)N * OC);
    float *dX = fzalloc((size_t)N * C), *dW = fzalloc((size_t)OC * C), *db = fzalloc(OC);
    OK(mc_row_parallel_linear_forward(Y, NULL, X, W, bias, S, B, C, OC, 0, MC_F32, NULL, ops));
    OK(mc_row_parallel_linear_forward(Y_nob, NULL, X, W, NULL, S, B, C, OC, 0, MC_F32, NULL, ops));
    OK(mc_row_parallel_linear_backward(dX, dW, db, NULL, dY, X, W, S, B, C, OC, 0, MC_F32, NULL,
                                       ops));
    plus_prefill(dW, (size_t)OC * C);

    float *w = fzalloc((size_t)OC * Cl);
    mc_init_normal_shard(w, "row.w", OC, C, 1, 1, me, np, 0.3f, SEED);
    float *w_want = cols_of(W, OC, C, me * Cl, Cl);
    CLOSE("row weight shard = columns of the TP=1 master", w, w_want, (size_t)OC * Cl);

    float *X_cols = cols_of(X, N, C, me * Cl, Cl), *dX_cols = cols_of(dX, N, C, me * Cl, Cl);
    float *dW_cols = cols_of(dW, OC, C, me * Cl, Cl);
    float *Y_rows = rows_of(Y, OC, me * Sl * B, Sl * B);
    float *Ynob_rows = rows_of(Y_nob, OC, me * Sl * B, Sl * B);
    float *dY_rows = rows_of(dY, OC, me * Sl * B, Sl * B);

    const int variants[] = {
        MC_TP_INPUT_IS_PARALLEL,
        0,
        MC_TP_INPUT_IS_PARALLEL | MC_TP_SEQUENCE_PARALLEL,
        MC_TP_INPUT_IS_PARALLEL | MC_TP_SKIP_BIAS_ADD,
        MC_TP_SKIP_BIAS_ADD,
        MC_TP_INPUT_IS_PARALLEL | MC_TP_SEQUENCE_PARALLEL | MC_TP_SKIP_BIAS_ADD};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        int flags = variants[v], sp = (flags & MC_TP_SEQUENCE_PARALLEL) && np > 1;
        int iip = flags & MC_TP_INPUT_IS_PARALLEL, skip = flags & MC_TP_SKIP_BIAS_ADD;
        char label[160];
        const float *inp = iip ? X_cols : X;
        size_t in_n = iip ? (size_t)N * Cl : (size_t)N * C;
        size_t out_n = sp ? (size_t)Sl * B * OC : (size_t)N * OC;
        size_t need = mc_row_parallel_linear_scratch(S, B, C, OC, flags, np);
        float *scratch = v % 2 ? fzalloc(need) : NULL;
        float *out = fzalloc(out_n), *dinp = fzalloc(in_n), *dw = fzalloc((size_t)OC * Cl);
        float *dbv = fzalloc(OC);
        prefill(dw, (size_t)OC * Cl);

        snprintf(label, sizeof label, "row forward [%s]", flag_text(flags));
        OK(mc_row_parallel_linear_forward(out, scratch, inp, w, bias, S, B, C, OC, flags, MC_F32,
                                          tp, ops));
        const float *want = sp ? (skip ? Ynob_rows : Y_rows) : (skip ? Y_nob : Y);
        CLOSE(label, out, want, out_n);

        OK(mc_row_parallel_linear_backward(dinp, dw, dbv, scratch, sp ? dY_rows : dY, inp, w, S, B,
                                           C, OC, flags, MC_F32, tp, ops));
        snprintf(label, sizeof label, "row dX [%s]", flag_text(flags));
        CLOSE(label, dinp, iip ? dX_cols : dX, in_n);
        snprintf(label, sizeof label, "row dW (+=) [%s]", flag_text(flags));
        CLOSE(label, dw, dW_cols, (size_t)OC * Cl);
        snprintf(label, sizeof label, "row db [%s]", flag_text(flags));
        if (skip) {
            int untouched = 1;
            for (int j = 0; j < OC; j++) untouched = untouched && dbv[j] == 0.0f;
            MC_CASE_CHECK(untouched, "%s: skip_bias_add must leave dbias alone", label);
        } else if (sp) {
            /* partial per rank: the TP all-reduce of finalize completes it */
            OK(mc_all_reduce(tp, dbv, dbv, (size_t)OC, MC_F32, MC_SUM));
            CLOSE(label, dbv, db, OC);
        } else {
            CLOSE(label, dbv, db, OC);
        }
        free(scratch), free(out), free(dinp), free(dw), free(dbv);
    }

    /* SP requires input_is_parallel (Megatron: RuntimeError) */
    float *tmp = fzalloc((size_t)N * OC);
    int rc = mc_row_parallel_linear_forward(tmp, NULL, X, w, bias, S, B, C, OC,
                                            MC_TP_SEQUENCE_PARALLEL, MC_F32, tp, ops);
    MC_CASE_CHECK(
        rc == MC_ERR_INVALID_ARG && mc_test_contains(mc_last_error(), "input_is_parallel"),
        "SP without input_is_parallel: %s '%s'", mc_err_name(rc), mc_last_error());
    free(tmp);
    free(X), free(W), free(bias), free(dY), free(Y), free(Y_nob), free(dX), free(dW), free(db);
    free(w), free(w_want), free(X_cols), free(dX_cols), free(dW_cols), free(Y_rows);
    free(Ynob_rows), free(dY_rows);
}

/* ---------------------------------------------------------------------------------------------
   vocab-parallel embedding */

static void case_embedding(void) {
    /* the vocabulary padded as @config does: 29 -> 32 with make_vocab_size_divisible_by 4 */
    const int V = mc_gpt_padded_vocab_size(29, 4, np), C = 4, N = 12, Vl = V / np;
    int ids[12];
    for (int i = 0; i < N; i++) ids[i] = (i * 5 + 3) % 29; /* every shard, with repeats */
    ids[7] = ids[2];
    float *T = full_tensor("emb.w", V, C, 1.0f), *dY = full_tensor("emb.dy", N, C, 1.0f);
    float *Y = fzalloc((size_t)N * C), *dT = fzalloc((size_t)V * C);
    OK(mc_vocab_parallel_embedding_forward(Y, ids, T, N, C, V, MC_F32, NULL, ops));
    OK(mc_vocab_parallel_embedding_backward(dT, dY, ids, N, C, V, MC_F32, NULL, ops));
    plus_prefill(dT, (size_t)V * C);

    float *t = fzalloc((size_t)Vl * C), *out = fzalloc((size_t)N * C),
          *dt = fzalloc((size_t)Vl * C);
    mc_init_normal_shard(t, "emb.w", V, C, 0, 1, me, np, 1.0f, SEED);
    float *t_want = rows_of(T, C, me * Vl, Vl), *dT_rows = rows_of(dT, C, me * Vl, Vl);
    CLOSE("embedding shard = vocab rows of the TP=1 master", t, t_want, (size_t)Vl * C);
    MC_CASE_CHECK(V == 32, "padded vocabulary of 29 (divisible by 4, TP %d) = %d, want 32", np, V);
    OK(mc_vocab_parallel_embedding_forward(out, ids, t, N, C, V, MC_F32, tp, ops));
    CLOSE("embedding forward", out, Y, (size_t)N * C);
    prefill(dt, (size_t)Vl * C);
    OK(mc_vocab_parallel_embedding_backward(dt, dY, ids, N, C, V, MC_F32, tp, ops));
    CLOSE("embedding backward (+=)", dt, dT_rows, (size_t)Vl * C);

    int bad_ids[2] = {3, V};
    int rc = mc_vocab_parallel_embedding_forward(out, bad_ids, t, 2, C, V, MC_F32, tp, ops);
    MC_CASE_CHECK(rc == MC_ERR_INVALID_ARG && mc_test_contains(mc_last_error(), "ids[1] = 32"),
                  "id outside the vocabulary: %s '%s'", mc_err_name(rc), mc_last_error());

    if (np == 2) {
        /* Megatron's example: V = 8, TP = 2, ids [1,5,7,3]. Rank 0 owns 0-3 and zeroes rows 1
           and 2 (ids 5, 7); rank 1 owns 4-7 and zeroes rows 0 and 3; the sum is the lookup. */
        const int ex_ids[4] = {1, 5, 7, 3}, EV = 8, EC = 3;
        float *ET = full_tensor("emb.example", EV, EC, 1.0f);
        float *et = rows_of(ET, EC, me * 4, 4), *eo = fzalloc(4 * EC);
        counting_begin();
        rc = mc_vocab_parallel_embedding_forward(eo, ex_ids, et, 4, EC, EV, MC_F32, tp, ops);
        counting_end();
        OK(rc);
        MC_CASE_CHECK(cnt.all_reduce == 1 && cnt.first_reduce_count == 4 * EC,
                      "example: %d all-reduces of %zu floats, want 1 of %d", cnt.all_reduce,
                      cnt.first_reduce_count, 4 * EC);
        for (int i = 0; i < 4 && cnt.first_reduce_input; i++) {
            int owned = me == 0 ? ex_ids[i] < 4 : ex_ids[i] >= 4;
            for (int j = 0; j < EC; j++) {
                float got = cnt.first_reduce_input[i * EC + j];
                float want = owned ? ET[ex_ids[i] * EC + j] : 0.0f;
                MC_CASE_CHECK(got == want,
                              "example rank %d partial row %d col %d = %g, want %g"
                              " (%s)",
                              me, i, j, (double)got, (double)want, owned ? "its own id" : "zeroed");
            }
        }
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < EC; j++)
                MC_CASE_CHECK(eo[i * EC + j] == ET[ex_ids[i] * EC + j],
                              "example lookup row %d col %d = %g, want %g", i, j,
                              (double)eo[i * EC + j], (double)ET[ex_ids[i] * EC + j]);
        free(ET), free(et), free(eo);
    }
    free(T), free(dY), free(Y), free(dT), free(t), free(out), free(dt), free(t_want), free(dT_rows);
}

/* ---------------------------------------------------------------------------------------------
   vocab-parallel cross entropy */

/* Megatron's smoothed loss on one rank (K and the mean taken over the LOCAL partition), from
   the exact pieces: what issues #737 / #7464 describe. */
static double megatron_local_smoothing_loss(const float *logits_local, int Vl, double nll,
                                            double log_z, double a) {
    double K = Vl, s = a * K / (K - 1.0), mean = 0.0;
    for (int j = 0; j < Vl; j++) mean += (double)logits_local[j] - log_z;
    mean /= K;
    return (1.0 - s) * nll - s * mean;
}

static void case_cross_entropy(void) {
    const int N = 8, V = mc_gpt_padded_vocab_size(29, 4, np), Vl = V / np;
    const float smoothings[2] = {0.0f, 0.1f};
    int targets[8];
    for (int i = 0; i < N; i++) targets[i] = (i * 7 + 3) % 29; /* spread over every shard */
    float *L = full_tensor("ce.logits", N, V, 3.0f), *dL = full_tensor("ce.dloss", 1, N, 1.0f);
    float *logits = cols_of(L, N, V, me * Vl, Vl);
    for (int k = 0; k < 2; k++) {
        float a = smoothings[k];
        char label[128];
        float *ref_loss = fzalloc(N), *ref_max = fzalloc(N), *ref_sum = fzalloc(N);
        float *ref_dl = fzalloc((size_t)N * V);
        OK(mc_vocab_parallel_cross_entropy_forward(ref_loss, NULL, ref_max, ref_sum, NULL, L,
                                                   targets, N,
                                                   V, a, MC_F32, NULL, ops));
        OK(mc_vocab_parallel_cross_entropy_backward(ref_dl, dL, L, ref_max, ref_sum, targets, N, V,
                                                    a, MC_F32, NULL, ops));
        float *loss = fzalloc(N), *max = fzalloc(N), *sum = fzalloc(N);
        float *dl = fzalloc((size_t)N * Vl);
        float *scratch = k ? fzalloc(mc_vocab_parallel_cross_entropy_scratch(N, V, a, np)) : NULL;
        counting_begin();
        int rc = mc_vocab_parallel_cross_entropy_forward(loss, NULL, max, sum, scratch, logits,
                                                         targets,
                                                         N, V, a, MC_F32, tp, ops);
        counting_end();
        OK(rc);
        snprintf(label, sizeof label, "cross entropy losses (smoothing %g)", (double)a);
        CLOSE(label, loss, ref_loss, N);
        if (np > 1) {
            MC_CASE_CHECK(cnt.all_reduce == 3, "smoothing %g: %d all-reduces, want exactly 3",
                          (double)a, cnt.all_reduce);
            MC_CASE_CHECK(cnt.reduce_ops[0] == MC_MAX && cnt.reduce_ops[1] == MC_SUM &&
                              cnt.reduce_ops[2] == MC_SUM,
                          "smoothing %g: all-reduce ops %d %d %d, want MAX SUM SUM", (double)a,
                          (int)cnt.reduce_ops[0], (int)cnt.reduce_ops[1], (int)cnt.reduce_ops[2]);
            MC_CASE_CHECK(cnt.all_gather == 0 && cnt.reduce_scatter == 0,
                          "smoothing %g: %d all-gathers, %d reduce-scatters; the logits must "
                          "never be gathered",
                          (double)a, cnt.all_gather, cnt.reduce_scatter);
            size_t biggest = 0;
            for (int i = 0; i < 3; i++)
                biggest = cnt.reduce_counts[i] > biggest ? cnt.reduce_counts[i] : biggest;
            MC_CASE_CHECK(biggest <= 2 * (size_t)N,
                          "smoothing %g: an all-reduce of %zu floats "
                          "(more than 2N = %d)",
                          (double)a, biggest, 2 * N);
        }
        counting_begin();
        rc = mc_vocab_parallel_cross_entropy_backward(dl, dL, logits, max, sum, targets, N, V, a,
                                                      MC_F32,
                                                      tp, ops);
        counting_end();
        OK(rc);
        MC_CASE_CHECK(cnt.all_reduce + cnt.all_gather + cnt.reduce_scatter == 0,
                      "cross entropy backward communicated");
        float *dl_want = cols_of(ref_dl, N, V, me * Vl, Vl);
        snprintf(label, sizeof label, "cross entropy dlogits (smoothing %g)", (double)a);
        CLOSE(label, dl, dl_want, (size_t)N * Vl);
        if (a > 0.0f && np > 1) {
            /* Megatron's local-K formula gives another loss on this rank: the check above
               would catch it. */
            int differs = 0;
            for (int i = 0; i < N; i++) {
                double log_z = log((double)sum[i]) + max[i];
                double tl = (double)L[(size_t)i * V + targets[i]];
                double meg = megatron_local_smoothing_loss(logits + (size_t)i * Vl, Vl, log_z - tl,
                                                           log_z, a);
                differs += fabs(meg - ref_loss[i]) > ATOL + RTOL * fabs(ref_loss[i]);
            }
            MC_CASE_CHECK(differs > 0,
                          "Megatron's local-K smoothing matched TP=1 on every "
                          "token; the test would not see the bug");
        }
        free(ref_loss), free(ref_max), free(ref_sum), free(ref_dl), free(loss), free(max);
        free(sum), free(dl), free(scratch), free(dl_want);
    }
    free(L), free(dL), free(logits);
    free(cnt.first_reduce_input);
    cnt.first_reduce_input = NULL;
}

/* ---------------------------------------------------------------------------------------------
   main */

typedef struct tp_case {
    const char *name;
    void (*run)(void);
} tp_case;

static const tp_case cases[] = {
    {"mappings", case_mappings},
    {"column", case_column},
    {"row", case_row},
    {"embedding", case_embedding},
    {"cross_entropy", case_cross_entropy},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

int main(int argc, char **argv) {
    const tp_case *chosen = NULL;
    for (int i = 0; argc == 2 && i < N_CASES; i++)
        if (strcmp(argv[1], cases[i].name) == 0) chosen = &cases[i];
    if (chosen == NULL) {
        fprintf(stderr, "usage: %s mappings|column|row|embedding|cross_entropy\n", argv[0]);
        return 2;
    }
    int rc = mc_case_init_world(
        &world, &(mc_comm_desc){.timeout_s = TIMEOUT_S, .watchdog_s = TIMEOUT_S, .argc = &argc, .argv = &argv});
    if (rc != MC_OK) return 1;
    me = world->rank;
    np = world->size;
    mc_case_begin(chosen->name, me);
    mc_parallel_state ps;
    memset(&ps, 0, sizeof ps);
    rc = mc_parallel_init(&ps, &(mc_parallel_desc){.world = world, .grid = {.tp = np}});
    if (MC_CASE_CHECK_STATUS(rc, MC_OK, "mc_parallel_init with tp = world size")) {
        tp = mc_parallel_group(&ps, MC_GROUP_TP);
        ops = mc_ops_cpu();
        chosen->run();
        mc_parallel_destroy(&ps);
    }
    int exit_code = mc_case_finish(world);
    mc_comm_destroy(world);
    return exit_code;
}
