/* labs/lab01.c - M001: Megatron-LM vs Megatron-Core vs Transformer Engine, measured as three ways
   to run the same training iterations of the same small GPT.

       make lab01 && mpirun --oversubscribe -np 2 ./lab01      (as root add --allow-run-as-root)

   The three layers and what plays them here:
     application / recipe   examples/pretrain_gpt.c, the analogue of Megatron-LM's pretrain_gpt.py
                            and training.py (flags, data, the loop, the log line). It is compiled
                            into this file with its main renamed: the same code as ./pretrain_gpt.
     core library           megatron_c.h, the analogue of Megatron-Core: mc_gpt_config
                            (TransformerConfig), mc_gpt (GPTModel), mc_parallel_init
                            (initialize_model_parallel), mc_get_forward_backward_func, DDP and the
                            optimizer.
     accelerated backend    an op table other than the reference one, in Transformer Engine's
                            place: the CUDA table (mc_ops_cuda) in a `make cuda` build on a GPU
                            when that table has its numeric ops, else the CPU table with its
                            GEMM through OpenBLAS (mc_ops_cpu_cblas).

   Experiments (every rank takes part, rank 0 prints):
     A. the recipe path: pretrain_gpt's main with Megatron-LM's flags, its data from the token
        file this lab writes (--data-path), on the reference op table;
     B. the core-API path: this file's own script (its data loader, its config, its loop) over
        mc_gpt_*, mc_get_forward_backward_func, DDP and the optimizer, on the reference table;
     C. the fused path: the script of B on the accelerated table;
     D. the single-rank reference: rank 0 runs the same model (TP = PP = DP = 1, no schedule, no
        communication) on the same data; every path's losses against it and against each other;
     E. the step time of B's script on the reference table and on the accelerated one, untraced.

   The call trace tags every call by layer:
     backend      the model's op table is a tracing table that counts each op and forwards it to
                  the path's own table (noting when an op ran on a non-reference implementation);
     core         every library entry point that pretrain_gpt.c calls, and this file calls, is a
                  macro (defined below, before pretrain_gpt.c is included) that records the call,
                  its call site (file:function) and its nesting, then calls the library: both
                  paths are tagged by the same code;
     application  the recipe's main and the schedule's hooks (pretrain_gpt's or this script's),
                  entered through trampolines around the hooks the schedule calls.
   Each rank keeps an edge table (caller -> callee, with a count); the probe rank's is printed
   and recorded. The loop owner is the call site of mc_optimizer_step and of the schedule in
   every iteration. Checks against independent computations: the recipe's own logged loss, the
   single-rank reference, the GEMM count the model's structure implies, and the three paths'
   op counts against each other. */
#include "lab_driver.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define LAB01_N_VARIANTS 2
#define LAB01_MAX_WORLD 8

/* The model and the batch (every path gets these numbers; the recipe as flags). */
#define LAB01_LAYERS 4
#define LAB01_HIDDEN 128
#define LAB01_HEADS 4
#define LAB01_SEQ 64
#define LAB01_MICRO_BATCH 4
#define LAB01_MICROBATCHES 4       /* per DP rank and iteration */
#define LAB01_ITERS 2              /* iteration 2's loss shows iteration 1's update */
#define LAB01_VOCAB 256            /* byte tokens: what pretrain_gpt's --data-path reads */
#define LAB01_SEED 1234
#define LAB01_LR 1e-3f
#define LAB01_MIN_LR 1e-4f
#define LAB01_TIMED_ITERS 4        /* experiment E: per table, in two blocks after a warm-up */
#define LAB01_LOSS_RTOL 1e-4       /* "within tolerance": |a - b| <= rtol * |b| */

enum { LAB01_RECIPE = 0, LAB01_CORE_API, LAB01_FUSED, LAB01_N_PATHS };
static const char *const lab01_path_key[LAB01_N_PATHS] = {"recipe", "core_api", "fused"};

/* =============================================================================================
   The trace */

enum { L_APP = 0, L_CORE, L_BACKEND };
static const char *const lab01_layer[] = {"application", "core", "backend"};

#define LAB01_NAME 64
#define LAB01_MAX_EDGES 256
#define LAB01_MAX_DEPTH 16
#define LAB01_MAX_ITERS 8

/* The op table's slots in field order: alloc .. synchronize are memory, the rest compute. */
#define LAB01_OPS(X)                                                                           \
    X(alloc) X(free) X(upload) X(download) X(copy_2d) X(synchronize) X(fill) X(copy) X(axpy)   \
    X(scale) X(sum_squares) X(gemm) X(bias_backward) X(layernorm_forward)                      \
    X(layernorm_backward) X(gelu_forward) X(gelu_backward) X(attention_stats)                  \
    X(attention_forward) X(attention_backward) X(dropout_forward) X(dropout_backward)          \
    X(check_ids) X(embedding_forward) X(embedding_backward) X(row_max) X(target_logit)         \
    X(sum_exp) X(row_sum) X(cross_entropy_loss) X(cross_entropy_backward) X(adamw)
#define LAB01_OP_ENUM(slot) LAB01_OP_##slot,
enum { LAB01_OPS(LAB01_OP_ENUM) LAB01_N_OPS };
#define LAB01_OP_NAME(slot) #slot,
static const char *const lab01_op_name[LAB01_N_OPS] = {LAB01_OPS(LAB01_OP_NAME)};
#define LAB01_FIRST_COMPUTE LAB01_OP_fill

/* The compute ops: the numeric slots, not attention_stats (a size query the model asks once per
   activation slot, so it follows n_slots, not the math). */
static int lab01_is_compute(int op) {
    return op >= LAB01_FIRST_COMPUTE && op != LAB01_OP_attention_stats;
}

typedef struct lab01_edge {
    int from_layer, to_layer;
    char from[LAB01_NAME], to[LAB01_NAME];
    long long n;
} lab01_edge;

/* What one path did on this rank. */
typedef struct lab01_trace {
    const mc_ops *inner;             /* the path's table: the tracing table forwards to it */
    mc_ops table;                    /* the tracing table */
    int depth;                       /* the frames entered and not yet left */
    int frame_layer[LAB01_MAX_DEPTH];
    char frame[LAB01_MAX_DEPTH][LAB01_NAME];
    char last_site[LAB01_NAME];      /* call site of the application's last core call */
    lab01_edge edge[LAB01_MAX_EDGES];
    int n_edges, edges_dropped;
    long long op_calls[LAB01_N_OPS], op_accelerated[LAB01_N_OPS];
    double op_seconds[LAB01_N_OPS];
    long long ops_outside_core;      /* backend ops with no core call around them */
    long long core_inside_core;      /* core entry points called from inside the core */
    int recipe_entries;              /* the recipe's main ran */
    /* the loop: call sites of the schedule and of the optimizer step, every iteration */
    char schedule_site[LAB01_NAME], step_site[LAB01_NAME], schedule_name[LAB01_NAME];
    int schedule_runs, steps, sites_moved;
    mc_forward_backward_func real_schedule;
    /* per iteration, from the schedule's result on this rank (last stage: the loss sums) */
    double loss_sum[LAB01_MAX_ITERS], num_tokens[LAB01_MAX_ITERS];
    double logged_loss[LAB01_MAX_ITERS];   /* the recipe's own global loss, as it logged it */
    int n_logged;
} lab01_trace;

static lab01_trace *lab01_tr;       /* the trace being recorded; NULL between paths */

static const char *lab01_basename(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

static void lab01_edge_add(lab01_trace *tr, int from_layer, const char *from, int to_layer,
                           const char *to) {
    for (int i = 0; i < tr->n_edges; i++) {
        lab01_edge *e = &tr->edge[i];
        if (e->from_layer == from_layer && e->to_layer == to_layer && !strcmp(e->from, from) &&
            !strcmp(e->to, to)) {
            e->n++;
            return;
        }
    }
    if (tr->n_edges == LAB01_MAX_EDGES) {
        tr->edges_dropped++;
        return;
    }
    lab01_edge *e = &tr->edge[tr->n_edges++];
    e->from_layer = from_layer, e->to_layer = to_layer, e->n = 1;
    snprintf(e->from, sizeof e->from, "%s", from);
    snprintf(e->to, sizeof e->to, "%s", to);
}

static void lab01_push(lab01_trace *tr, int layer, const char *name) {
    if (tr->depth < LAB01_MAX_DEPTH) {
        tr->frame_layer[tr->depth] = layer;
        snprintf(tr->frame[tr->depth], LAB01_NAME, "%s", name);
    }
    tr->depth++;
}

static void lab01_pop(lab01_trace *tr) {
    if (tr->depth > 0) tr->depth--;
}

static int lab01_top_layer(const lab01_trace *tr) {
    int d = tr->depth < LAB01_MAX_DEPTH ? tr->depth : LAB01_MAX_DEPTH;
    return d > 0 ? tr->frame_layer[d - 1] : -1;
}

static const char *lab01_top_name(const lab01_trace *tr) {
    int d = tr->depth < LAB01_MAX_DEPTH ? tr->depth : LAB01_MAX_DEPTH;
    return d > 0 ? tr->frame[d - 1] : "";
}

/* An application frame: the recipe's main, or a hook the schedule calls. */
static void lab01_app_enter(const char *name) {
    lab01_trace *tr = lab01_tr;
    if (tr == NULL) return;
    if (tr->depth > 0) lab01_edge_add(tr, lab01_top_layer(tr), lab01_top_name(tr), L_APP, name);
    lab01_push(tr, L_APP, name);
}

static void lab01_app_leave(void) {
    if (lab01_tr != NULL) lab01_pop(lab01_tr);
}

/* A core entry point called at `file`:`func` (the macros below). */
static void lab01_core_enter(const char *name, const char *file, const char *func) {
    lab01_trace *tr = lab01_tr;
    if (tr == NULL) return;
    char site[LAB01_NAME];
    /* pretrain_gpt's main is compiled here as lab01_recipe_main */
    snprintf(site, sizeof site, "%s:%s", lab01_basename(file),
             strcmp(func, "lab01_recipe_main") ? func : "main");
    if (lab01_top_layer(tr) == L_CORE) tr->core_inside_core++;
    lab01_edge_add(tr, L_APP, site, L_CORE, name);
    snprintf(tr->last_site, sizeof tr->last_site, "%s", site);
    if (!strcmp(name, "mc_optimizer_step")) {
        if (tr->steps > 0 && strcmp(tr->step_site, site)) tr->sites_moved++;
        snprintf(tr->step_site, sizeof tr->step_site, "%s", site);
        tr->steps++;
    }
    lab01_push(tr, L_CORE, name);
}

static void lab01_core_leave(void) {
    if (lab01_tr != NULL) lab01_pop(lab01_tr);
}

/* ---------------------------------------------------------------------------------------------
   The tracing op table: every slot counts the call under the core frame it runs in, then
   forwards to the path's table. An op "ran accelerated" when the path's table implements that
   slot with another function than the reference CPU table. */

static const mc_ops *lab01_inner_last;   /* where the tracing table forwards between traces */

static const mc_ops *lab01_op_seen(int op, int accelerated) {
    lab01_trace *tr = lab01_tr;
    if (tr == NULL) return lab01_inner_last;
    tr->op_calls[op]++;
    if (accelerated && lab01_is_compute(op)) tr->op_accelerated[op]++;
    if (lab01_top_layer(tr) != L_CORE) tr->ops_outside_core++;
    lab01_edge_add(tr, tr->depth > 0 ? lab01_top_layer(tr) : L_APP,
                   tr->depth > 0 ? lab01_top_name(tr) : "(none)", L_BACKEND, lab01_op_name[op]);
    return tr->inner;
}

/* Host time spent in the op (a CUDA op may return before its kernel ends). */
static void lab01_op_done(int op, double t0) {
    if (lab01_tr != NULL) lab01_tr->op_seconds[op] += lab_now() - t0;
}

#define LAB01_SEEN(slot)                                                                      \
    lab01_op_seen(LAB01_OP_##slot,                                                            \
                  (lab01_tr ? lab01_tr->inner : lab01_inner_last)->slot != mc_ops_cpu_reference()->slot)
#define LAB01_FWD(slot, params, args)                                                         \
    static int lab01_op_##slot params {                                                       \
        const mc_ops *in = LAB01_SEEN(slot);                                                  \
        double t0 = lab_now();                                                                \
        int rc = in->slot args;                                                               \
        lab01_op_done(LAB01_OP_##slot, t0);                                                   \
        (void)o;                                                                              \
        return rc;                                                                            \
    }

LAB01_FWD(alloc, (const mc_ops *o, void **p, size_t n), (in, p, n))
LAB01_FWD(free, (const mc_ops *o, void *p), (in, p))
LAB01_FWD(upload, (const mc_ops *o, void *d, const void *s, size_t n), (in, d, s, n))
LAB01_FWD(download, (const mc_ops *o, void *d, const void *s, size_t n), (in, d, s, n))
LAB01_FWD(copy_2d, (const mc_ops *o, void *d, size_t dp, const void *s, size_t sp, size_t w,
                    size_t r), (in, d, dp, s, sp, w, r))
LAB01_FWD(synchronize, (const mc_ops *o), (in))
LAB01_FWD(fill, (const mc_ops *o, void *x, float v, size_t n, mc_dtype dt), (in, x, v, n, dt))
LAB01_FWD(copy, (const mc_ops *o, void *d, const void *s, size_t n, mc_dtype ddt, mc_dtype sdt),
          (in, d, s, n, ddt, sdt))
LAB01_FWD(axpy, (const mc_ops *o, void *y, float a, const void *x, size_t n, mc_dtype dt),
          (in, y, a, x, n, dt))
LAB01_FWD(scale, (const mc_ops *o, void *x, float a, size_t n, mc_dtype dt), (in, x, a, n, dt))
LAB01_FWD(sum_squares, (const mc_ops *o, double *out, const float *x, const size_t *spans, int k),
          (in, out, x, spans, k))
LAB01_FWD(gemm, (const mc_ops *o, void *C, const void *A, const void *B, const void *bias, int M,
                 int N, int K, int ta, int tb, float alpha, float beta, mc_dtype cdt,
                 mc_dtype abdt), (in, C, A, B, bias, M, N, K, ta, tb, alpha, beta, cdt, abdt))
LAB01_FWD(bias_backward, (const mc_ops *o, float *db, const void *dout, int N, int C,
                          mc_dtype dt), (in, db, dout, N, C, dt))
LAB01_FWD(layernorm_forward, (const mc_ops *o, void *out, float *mean, float *rstd,
                              const void *inp, const void *w, const void *b, int N, int C,
                              float eps, mc_dtype dt),
          (in, out, mean, rstd, inp, w, b, N, C, eps, dt))
LAB01_FWD(layernorm_backward, (const mc_ops *o, void *dinp, float *dw, float *db,
                               const void *dout, const void *inp, const void *w,
                               const float *mean, const float *rstd, int N, int C, mc_dtype dt),
          (in, dinp, dw, db, dout, inp, w, mean, rstd, N, C, dt))
LAB01_FWD(gelu_forward, (const mc_ops *o, void *out, const void *inp, size_t n, mc_dtype dt),
          (in, out, inp, n, dt))
LAB01_FWD(gelu_backward, (const mc_ops *o, void *dinp, const void *inp, const void *dout,
                          size_t n, mc_dtype dt), (in, dinp, inp, dout, n, dt))
static size_t lab01_op_attention_stats(const mc_ops *o, int S, int B, int NH, int HD) {
    const mc_ops *in = LAB01_SEEN(attention_stats);
    (void)o;
    return in->attention_stats(in, S, B, NH, HD);
}
LAB01_FWD(attention_forward, (const mc_ops *o, void *out, float *stats, const void *qkv, int S,
                              int B, int NH, int HD, float p, uint64_t seed, uint64_t off,
                              mc_dtype dt), (in, out, stats, qkv, S, B, NH, HD, p, seed, off, dt))
LAB01_FWD(attention_backward, (const mc_ops *o, void *dqkv, const void *dout, const void *qkv,
                               const void *out, const float *stats, int S, int B, int NH,
                               int HD, float p, uint64_t seed, uint64_t off, mc_dtype dt),
          (in, dqkv, dout, qkv, out, stats, S, B, NH, HD, p, seed, off, dt))
LAB01_FWD(dropout_forward, (const mc_ops *o, void *out, const void *inp, size_t n, float p,
                            uint64_t seed, uint64_t off, mc_dtype dt),
          (in, out, inp, n, p, seed, off, dt))
LAB01_FWD(dropout_backward, (const mc_ops *o, void *dinp, const void *dout, size_t n, float p,
                             uint64_t seed, uint64_t off, mc_dtype dt),
          (in, dinp, dout, n, p, seed, off, dt))
LAB01_FWD(check_ids, (const mc_ops *o, const int *ids, int N, int V, const char *fn,
                      const char *what), (in, ids, N, V, fn, what))
LAB01_FWD(embedding_forward, (const mc_ops *o, void *out, const int *ids, const void *table,
                              int N, int C, int vs, int ve, mc_dtype dt),
          (in, out, ids, table, N, C, vs, ve, dt))
LAB01_FWD(embedding_backward, (const mc_ops *o, float *dt_, const void *dout, const int *ids,
                               int N, int C, int vs, int ve, mc_dtype dt),
          (in, dt_, dout, ids, N, C, vs, ve, dt))
LAB01_FWD(row_max, (const mc_ops *o, float *mx, const void *lg, int N, int V, mc_dtype dt),
          (in, mx, lg, N, V, dt))
LAB01_FWD(target_logit, (const mc_ops *o, float *out, const void *lg, const int *t, int N, int V,
                         int vs, mc_dtype dt), (in, out, lg, t, N, V, vs, dt))
LAB01_FWD(sum_exp, (const mc_ops *o, float *sum, const void *lg, const float *mx, int N, int V,
                    mc_dtype dt), (in, sum, lg, mx, N, V, dt))
LAB01_FWD(row_sum, (const mc_ops *o, float *sum, const void *lg, int N, int V, mc_dtype dt),
          (in, sum, lg, N, V, dt))
LAB01_FWD(cross_entropy_loss, (const mc_ops *o, float *losses, double *ls, const float *mx,
                               const float *se, const float *tl, const float *rs, int N, int K,
                               float s), (in, losses, ls, mx, se, tl, rs, N, K, s))
LAB01_FWD(cross_entropy_backward, (const mc_ops *o, void *dl, const void *lg, const float *mx,
                                   const float *sum, const int *t, const float *dloss, int N,
                                   int V, int vs, float s, int vg, mc_dtype dt),
          (in, dl, lg, mx, sum, t, dloss, N, V, vs, s, vg, dt))
LAB01_FWD(adamw, (const mc_ops *o, float *main_, const float *g, float *m, float *v, void *mp,
                  const mc_adamw_span *spans, int n, const mc_adamw_step *h, mc_dtype dt),
          (in, main_, g, m, v, mp, spans, n, h, dt))

/* The tracing table around `inner`: the same memory (device and context), so the model, DDP,
   the optimizer and the communicators accept it in the inner table's place. */
static void lab01_tracing_table(mc_ops *t, const mc_ops *inner) {
    *t = *inner;
    t->name = "trace";
#define LAB01_SET(slot) t->slot = lab01_op_##slot;
    LAB01_OPS(LAB01_SET)
#undef LAB01_SET
}

static void lab01_trace_begin(lab01_trace *tr, const mc_ops *inner) {
    memset(tr, 0, sizeof *tr);
    tr->inner = inner;
    lab01_tracing_table(&tr->table, inner);
    lab01_inner_last = inner;
    lab01_tr = tr;
}

static void lab01_trace_end(void) { lab01_tr = NULL; }

/* ---------------------------------------------------------------------------------------------
   The core seam. Every library call below this point (pretrain_gpt.c and this script) goes
   through these macros; with no trace active they only call the library. A few calls also do
   what the lab needs around them: mc_ops_cpu hands out the path's tracing table (the recipe
   copies it into its own op table), mc_gpt_init and mc_ddp_init give a model or DDP that names
   no op table the tracing table;
   mc_get_forward_backward_func hands out a traced schedule; the recipe's global-loss
   all-reduce is read back as the loss it logged. */

static const mc_ops *lab01_seam_ops_cpu(const char *file, const char *func);
static int lab01_seam_gpt_init(const char *file, const char *func, mc_gpt *g,
                               const mc_gpt_desc *d);
static int lab01_seam_ddp_init(const char *file, const char *func, mc_ddp *ddp,
                               const mc_ddp_desc *d);
static mc_forward_backward_func lab01_seam_get_schedule(const char *file, const char *func,
                                                        const mc_parallel_state *ps);
static int lab01_seam_host_collective(const char *file, const char *func, mc_comm *c,
                                      mc_collective kind, const void *send, void *recv,
                                      size_t count, mc_dtype dt, mc_reduce_op op, int root);

#define LAB01_CORE(fn, ...)                                                                   \
    __extension__({                                                                           \
        lab01_core_enter(#fn, __FILE__, __func__);                                            \
        __typeof__((fn)(__VA_ARGS__)) lab01_ret_ = (fn)(__VA_ARGS__);                         \
        lab01_core_leave();                                                                   \
        lab01_ret_;                                                                           \
    })
#define LAB01_CORE_VOID(fn, ...)                                                              \
    __extension__({                                                                           \
        lab01_core_enter(#fn, __FILE__, __func__);                                            \
        (fn)(__VA_ARGS__);                                                                    \
        lab01_core_leave();                                                                   \
    })

#define mc_checkpoint_load(...) LAB01_CORE(mc_checkpoint_load, __VA_ARGS__)
#define mc_checkpoint_save(...) LAB01_CORE(mc_checkpoint_save, __VA_ARGS__)
#define mc_backend_name(...) LAB01_CORE(mc_backend_name, __VA_ARGS__)
#define mc_comm_agree(...) LAB01_CORE(mc_comm_agree, __VA_ARGS__)
#define mc_comm_destroy(...) LAB01_CORE_VOID(mc_comm_destroy, __VA_ARGS__)
#define mc_comm_init_world(...) LAB01_CORE(mc_comm_init_world, __VA_ARGS__)
#define mc_comm_memory(...) LAB01_CORE(mc_comm_memory, __VA_ARGS__)
#define mc_comm_watchdog_verdict(...) LAB01_CORE(mc_comm_watchdog_verdict, __VA_ARGS__)
#define mc_ddp_destroy(...) LAB01_CORE(mc_ddp_destroy, __VA_ARGS__)
#define mc_ddp_register_grad_ready(...) LAB01_CORE(mc_ddp_register_grad_ready, __VA_ARGS__)
#define mc_ddp_set_grad_sync(...) LAB01_CORE(mc_ddp_set_grad_sync, __VA_ARGS__)
#define mc_ddp_zero_grad(...) LAB01_CORE(mc_ddp_zero_grad, __VA_ARGS__)
#define mc_finalize_model_grads(...) LAB01_CORE(mc_finalize_model_grads, __VA_ARGS__)
#define mc_gpt_backward_step(...) LAB01_CORE(mc_gpt_backward_step, __VA_ARGS__)
#define mc_gpt_config_resolve(...) LAB01_CORE(mc_gpt_config_resolve, __VA_ARGS__)
#define mc_gpt_config_validate(...) LAB01_CORE(mc_gpt_config_validate, __VA_ARGS__)
#define mc_gpt_destroy(...) LAB01_CORE_VOID(mc_gpt_destroy, __VA_ARGS__)
#define mc_gpt_forward_step(...) LAB01_CORE(mc_gpt_forward_step, __VA_ARGS__)
#define mc_gpt_set_grad_sync(...) LAB01_CORE_VOID(mc_gpt_set_grad_sync, __VA_ARGS__)
#define mc_gpt_zero_grad(...) LAB01_CORE(mc_gpt_zero_grad, __VA_ARGS__)
#define mc_memory_account_destroy(...) LAB01_CORE_VOID(mc_memory_account_destroy, __VA_ARGS__)
#define mc_memory_account_reset_peaks(...)                                                   \
    LAB01_CORE_VOID(mc_memory_account_reset_peaks, __VA_ARGS__)
#define mc_memory_category_name(...) LAB01_CORE(mc_memory_category_name, __VA_ARGS__)
#define mc_memory_estimate(...) LAB01_CORE(mc_memory_estimate, __VA_ARGS__)
#define mc_memory_format_bytes(...) LAB01_CORE(mc_memory_format_bytes, __VA_ARGS__)
#define mc_microbatch_init(...) LAB01_CORE(mc_microbatch_init, __VA_ARGS__)
#define mc_microbatch_update(...) LAB01_CORE(mc_microbatch_update, __VA_ARGS__)
#define mc_ops_cuda_describe(...) LAB01_CORE(mc_ops_cuda_describe, __VA_ARGS__)
#define mc_ops_cuda_peak_bytes(...) LAB01_CORE(mc_ops_cuda_peak_bytes, __VA_ARGS__)
#define mc_ops_cuda_profile(...) LAB01_CORE(mc_ops_cuda_profile, __VA_ARGS__)
#define mc_ops_cuda_profile_read(...) LAB01_CORE(mc_ops_cuda_profile_read, __VA_ARGS__)
#define mc_optimizer_destroy(...) LAB01_CORE_VOID(mc_optimizer_destroy, __VA_ARGS__)
#define mc_optimizer_get_state(...) LAB01_CORE(mc_optimizer_get_state, __VA_ARGS__)
#define mc_optimizer_init(...) LAB01_CORE(mc_optimizer_init, __VA_ARGS__)
#define mc_optimizer_lr_at(...) LAB01_CORE(mc_optimizer_lr_at, __VA_ARGS__)
#define mc_optimizer_set_state(...) LAB01_CORE(mc_optimizer_set_state, __VA_ARGS__)
#define mc_optimizer_step(...) LAB01_CORE(mc_optimizer_step, __VA_ARGS__)
#define mc_parallel_destroy(...) LAB01_CORE(mc_parallel_destroy, __VA_ARGS__)
#define mc_parallel_group(...) LAB01_CORE(mc_parallel_group, __VA_ARGS__)
#define mc_parallel_init(...) LAB01_CORE(mc_parallel_init, __VA_ARGS__)
#define mc_parallel_is_last_stage(...) LAB01_CORE(mc_parallel_is_last_stage, __VA_ARGS__)
#define mc_rng_bits_at(...) LAB01_CORE(mc_rng_bits_at, __VA_ARGS__)
#define mc_schedule_max_in_flight(...) LAB01_CORE(mc_schedule_max_in_flight, __VA_ARGS__)
#define mc_ops_cpu(...) lab01_seam_ops_cpu(__FILE__, __func__)
#define mc_gpt_init(...) lab01_seam_gpt_init(__FILE__, __func__, __VA_ARGS__)
#define mc_ddp_init(...) lab01_seam_ddp_init(__FILE__, __func__, __VA_ARGS__)
#define mc_get_forward_backward_func(...) lab01_seam_get_schedule(__FILE__, __func__, __VA_ARGS__)
#define mc_host_collective(...) lab01_seam_host_collective(__FILE__, __func__, __VA_ARGS__)

/* =============================================================================================
   The recipe, compiled in: ./pretrain_gpt's code with its main renamed. */

#define main(...) lab01_recipe_main(__VA_ARGS__)   /* not the optimizer's .main field */
#include "../examples/pretrain_gpt.c"
#undef main
#undef CHECK

/* The seam functions (the parenthesised names call the library itself, not the macros). */

/* The recipe builds its op table from a copy of mc_ops_cpu() (giving the copy its memory
   account): inside a trace the copy is the tracing table's, so every op of the recipe is
   counted and forwarded to the path's table. */
static const mc_ops *lab01_seam_ops_cpu(const char *file, const char *func) {
    lab01_core_enter("mc_ops_cpu", file, func);
    /* the reference loops: the lab compares them with the accelerated table */
    const mc_ops *t = lab01_tr != NULL ? &lab01_tr->table : mc_ops_cpu_reference();
    lab01_core_leave();
    return t;
}

static int lab01_seam_gpt_init(const char *file, const char *func, mc_gpt *g,
                               const mc_gpt_desc *d) {
    mc_gpt_desc copy = *d;
    lab01_core_enter("mc_gpt_init", file, func);
    if (lab01_tr != NULL && copy.ops == NULL) copy.ops = &lab01_tr->table;
    int rc = (mc_gpt_init)(g, &copy);
    lab01_core_leave();
    return rc;
}

static int lab01_seam_ddp_init(const char *file, const char *func, mc_ddp *ddp,
                               const mc_ddp_desc *d) {
    mc_ddp_desc copy = *d;
    lab01_core_enter("mc_ddp_init", file, func);
    if (lab01_tr != NULL && copy.ops == NULL) copy.ops = &lab01_tr->table;
    int rc = (mc_ddp_init)(ddp, &copy);
    lab01_core_leave();
    return rc;
}

static int lab01_seam_host_collective(const char *file, const char *func, mc_comm *c,
                                      mc_collective kind, const void *send, void *recv,
                                      size_t count, mc_dtype dt, mc_reduce_op op, int root) {
    lab01_core_enter("mc_host_collective", file, func);
    int rc = (mc_host_collective)(c, kind, send, recv, count, dt, op, root);
    lab01_core_leave();
    lab01_trace *tr = lab01_tr;
    /* pretrain_gpt's global_loss: one world all-reduce of (loss sum, tokens) per iteration */
    if (tr != NULL && rc == MC_OK && !strcmp(func, "global_loss") && kind == MC_COLL_ALL_REDUCE &&
        count == 2 && dt == MC_F64 && tr->n_logged < LAB01_MAX_ITERS) {
        const double *v = recv;
        tr->logged_loss[tr->n_logged++] = v[1] > 0 ? v[0] / v[1] : 0.0;
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   The traced schedule: the forward_backward function, with the application's hooks behind
   trampolines that tag them. */

static const char *lab01_schedule_name(mc_forward_backward_func f) {
    if (f == mc_forward_backward_no_pipelining) return "forward_backward_no_pipelining";
    if (f == mc_forward_backward_pipelining_without_interleaving)
        return "forward_backward_pipelining_without_interleaving";
    if (f == mc_forward_backward_pipelining_with_interleaving)
        return "forward_backward_pipelining_with_interleaving";
    return "forward_backward (unknown)";
}

typedef struct lab01_hookbox {
    const mc_schedule_hooks *orig;
    const char *names[4];            /* forward, backward, grad_sync, finalize */
} lab01_hookbox;

static int lab01_tr_forward(void *app, int chunk, int mb, const float *input, float **output,
                            double *loss_sum, double *num_tokens) {
    lab01_hookbox *b = app;
    lab01_app_enter(b->names[0]);
    int rc = b->orig->forward_step(b->orig->app, chunk, mb, input, output, loss_sum, num_tokens);
    lab01_app_leave();
    return rc;
}

static int lab01_tr_backward(void *app, int chunk, int mb, const float *output_grad,
                             float loss_scale, float **input_grad) {
    lab01_hookbox *b = app;
    lab01_app_enter(b->names[1]);
    int rc = b->orig->backward_step(b->orig->app, chunk, mb, output_grad, loss_scale, input_grad);
    lab01_app_leave();
    return rc;
}

static void lab01_tr_grad_sync(void *app, int chunk, int enable) {
    lab01_hookbox *b = app;
    lab01_app_enter(b->names[2]);
    b->orig->grad_sync(b->orig->app, chunk, enable);
    lab01_app_leave();
}

static int lab01_tr_finalize(void *app) {
    lab01_hookbox *b = app;
    lab01_app_enter(b->names[3]);
    int rc = b->orig->finalize(b->orig->app);
    lab01_app_leave();
    return rc;
}

/* Names of the hooks the lab knows (the recipe's and the script's, below). */
static void lab01_hook_names(const mc_schedule_hooks *h, const char **names);

static int lab01_traced_schedule(const mc_parallel_state *ps, const mc_schedule_hooks *hooks,
                                 int num_microbatches, int forward_only,
                                 mc_schedule_result *result) {
    lab01_trace *tr = lab01_tr;
    if (tr == NULL || tr->real_schedule == NULL)
        return MC_ERR_STATE;   /* handed out by a trace that has ended */
    /* its caller: the application function that made the last core call before it */
    if (lab01_top_layer(tr) == L_CORE) tr->core_inside_core++;
    lab01_edge_add(tr, L_APP, tr->last_site, L_CORE, tr->schedule_name);
    if (tr->schedule_runs > 0 && strcmp(tr->schedule_site, tr->last_site)) tr->sites_moved++;
    snprintf(tr->schedule_site, sizeof tr->schedule_site, "%s", tr->last_site);
    int it = tr->schedule_runs++;
    lab01_hookbox box = {hooks, {NULL, NULL, NULL, NULL}};
    mc_schedule_hooks h = *hooks;
    h.app = &box;
    lab01_hook_names(hooks, box.names);
    if (hooks->forward_step) h.forward_step = lab01_tr_forward;
    if (hooks->backward_step) h.backward_step = lab01_tr_backward;
    if (hooks->grad_sync) h.grad_sync = lab01_tr_grad_sync;
    if (hooks->finalize) h.finalize = lab01_tr_finalize;
    lab01_push(tr, L_CORE, tr->schedule_name);
    int rc = tr->real_schedule(ps, &h, num_microbatches, forward_only, result);
    lab01_pop(tr);
    if (rc == MC_OK && it < LAB01_MAX_ITERS) {
        tr->loss_sum[it] = result->loss_sum;
        tr->num_tokens[it] = result->num_tokens;
    }
    return rc;
}

static mc_forward_backward_func lab01_seam_get_schedule(const char *file, const char *func,
                                                        const mc_parallel_state *ps) {
    lab01_core_enter("mc_get_forward_backward_func", file, func);
    mc_forward_backward_func f = (mc_get_forward_backward_func)(ps);
    lab01_core_leave();
    lab01_trace *tr = lab01_tr;
    if (tr == NULL || f == NULL) return f;
    tr->real_schedule = f;
    snprintf(tr->schedule_name, sizeof tr->schedule_name, "%s", lab01_schedule_name(f));
    return lab01_traced_schedule;
}

/* Which layer's code a call site belongs to. */
static const char *lab01_owner_of_site(const char *site) {
    if (!strncmp(site, "pretrain_gpt.c:", 15)) return "recipe";
    if (!strncmp(site, "lab01.c:", 8)) return "script";
    return site[0] ? "library" : "none";
}

/* =============================================================================================
   The model, the data and the script (the core-API path's own code) */

typedef struct lab01_model {
    int layers, hidden, heads, seq, micro_batch, microbatches, iters, vocab;
    int tp, pp, vpp, dp;
    int global_batch;                /* micro_batch x microbatches x dp */
} lab01_model;

static lab01_model lab01_model_of(const lab_ctx *cx) {
    lab01_model m = {LAB01_LAYERS, LAB01_HIDDEN, LAB01_HEADS, LAB01_SEQ, LAB01_MICRO_BATCH,
                     LAB01_MICROBATCHES, LAB01_ITERS, LAB01_VOCAB, 0, 0, 0, 0, 0};
    m.tp = cx->grid.desc.tp, m.pp = cx->grid.desc.pp, m.vpp = cx->grid.desc.vpp;
    m.dp = cx->grid.dp;
    m.global_batch = m.micro_batch * m.microbatches * m.dp;
    return m;
}

/* The script's config: TransformerConfig's fields, set directly (no argument parser). */
static mc_gpt_config lab01_config(const lab01_model *m) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = m->layers, c.hidden_size = m->hidden, c.num_attention_heads = m->heads;
    c.vocab_size = m->vocab, c.seq_length = m->seq, c.micro_batch_size = m->micro_batch;
    c.hidden_dropout = MC_DROPOUT_OFF, c.attention_dropout = MC_DROPOUT_OFF;
    c.tensor_model_parallel_size = m->tp, c.pipeline_model_parallel_size = m->pp;
    c.virtual_pipeline_model_parallel_size = m->vpp > 1 ? m->vpp : 0;
    c.seed = LAB01_SEED;
    return c;
}

static mc_optimizer_desc lab01_optimizer_desc(const lab01_model *m) {
    mc_optimizer_desc od;
    memset(&od, 0, sizeof od);
    od.lr = LAB01_LR, od.min_lr = LAB01_MIN_LR;
    od.lr_decay_iters = m->iters, od.train_iters = m->iters;
    od.weight_decay = 0.01f, od.clip_grad = 1.0f;
    return od;
}

/* The script's own data: a byte stream with structure to learn (runs of +7 steps with a random
   restart about every 8 tokens), from its own xorshift generator. Sample k is the window
   tokens[k*S .. k*S + S] (inputs and the labels shifted by one), as Megatron's GPT dataset
   cuts documents; the recipe reads the same bytes from the file with --data-path. */
static size_t lab01_token_count(const lab01_model *m) {
    return (size_t)m->iters * (size_t)m->global_batch * (size_t)m->seq + (size_t)m->seq + 2;
}

static unsigned char *lab01_make_tokens(const lab01_model *m) {
    size_t n = lab01_token_count(m);
    unsigned char *t = lab_xcalloc(n, 1);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t[i] = (i == 0 || x % 8 == 0) ? (unsigned char)(x >> 24) : (unsigned char)(t[i - 1] + 7);
    }
    return t;
}

typedef struct lab01_script {
    const lab01_model *m;
    const unsigned char *tokens;
    mc_parallel_state ps;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int dp_rank;
    long long batch_start;           /* first sample of the iteration's global batch */
    int *tok, *lab;                  /* [S, B] of the micro-batch being fed */
} lab01_script;

/* Micro-batch `mb` of DP rank d holds samples batch_start + (mb * DP + d) * B + j, j < B
   (Megatron's sampler order), as [S, B], sequence first. */
static void lab01_load_microbatch(lab01_script *s, int mb) {
    const lab01_model *m = s->m;
    int S = m->seq, B = m->micro_batch;
    for (int j = 0; j < B; j++) {
        long long k = s->batch_start + ((long long)mb * m->dp + s->dp_rank) * B + j;
        const unsigned char *w = s->tokens + (size_t)k * (size_t)S;
        for (int t = 0; t < S; t++) s->tok[t * B + j] = w[t], s->lab[t * B + j] = w[t + 1];
    }
}

static int lab01_script_forward(void *app, int chunk, int mb, const float *input,
                                float **output, double *loss_sum, double *num_tokens) {
    lab01_script *s = app;
    lab01_load_microbatch(s, mb);
    return mc_gpt_forward_step(&s->gpt, chunk, mb, s->tok, s->lab, input, output, loss_sum,
                               num_tokens);
}

static int lab01_script_backward(void *app, int chunk, int mb, const float *output_grad,
                                 float loss_scale, float **input_grad) {
    lab01_script *s = app;
    return mc_gpt_backward_step(&s->gpt, chunk, mb, output_grad, loss_scale, input_grad);
}

static void lab01_script_grad_sync(void *app, int chunk, int enable) {
    lab01_script *s = app;
    mc_gpt_set_grad_sync(&s->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&s->ddp, chunk, enable);
}

static int lab01_script_finalize(void *app) {
    lab01_script *s = app;
    return mc_finalize_model_grads(&s->ps, &s->ddp, NULL, NULL, 0, NULL);
}

/* The names of the hooks the schedule calls: the recipe's (pretrain_gpt.c) or the script's. */
static void lab01_hook_names(const mc_schedule_hooks *h, const char **names) {
    static const char *const recipe[4] = {
        "pretrain_gpt.c:hook_forward", "pretrain_gpt.c:hook_backward",
        "pretrain_gpt.c:hook_grad_sync", "pretrain_gpt.c:hook_finalize"};
    static const char *const script[4] = {
        "lab01.c:lab01_script_forward", "lab01.c:lab01_script_backward",
        "lab01.c:lab01_script_grad_sync", "lab01.c:lab01_script_finalize"};
    static const char *const other[4] = {"forward_step hook", "backward_step hook",
                                         "grad_sync hook", "finalize hook"};
    const char *const *n = h->forward_step == hook_forward           ? recipe
                           : h->forward_step == lab01_script_forward ? script
                                                                     : other;
    memcpy(names, n, 4 * sizeof *names);
}

/* The core-API path: this script's own loop on `world` with `ops`. iter_ms[it] (may be NULL)
   receives each iteration's wall time on this rank. Every library call here goes through the
   seam above, so a running trace sees it tagged with this file. */
static void lab01_script_train(const lab01_model *m, const unsigned char *tokens, mc_comm *world,
                               const mc_ops *ops, int iters, double *iter_ms) {
    lab01_script s;
    memset(&s, 0, sizeof s);
    s.m = m, s.tokens = tokens;
    mc_gpt_config cfg = lab01_config(m);
    char report[1024];
    MC_CHECK(mc_gpt_config_validate(&cfg, report, sizeof report) == 0 ? MC_OK
                                                                      : MC_ERR_INVALID_DESC);
    mc_parallel_desc pd = {.world = world, .grid = {.tp = m->tp, .pp = m->pp, .vpp = m->vpp}};
    MC_CHECK(mc_parallel_init(&s.ps, &pd));
    s.dp_rank = s.ps.coords.dp;
    mc_gpt_desc gd = {.config = cfg, .ps = &s.ps, .ops = ops, .n_slots = m->microbatches};
    MC_CHECK(mc_gpt_init(&s.gpt, &gd));
    mc_ddp_desc dd = {.table = &s.gpt.table, .grads = s.gpt.grads,
                      .dp = mc_parallel_group(&s.ps, MC_GROUP_DP_CP), .ops = ops};
    MC_CHECK(mc_ddp_init(&s.ddp, &dd));
    mc_optimizer_desc od = lab01_optimizer_desc(m);
    od.ddp = &s.ddp, od.params = s.gpt.params, od.ps = &s.ps;
    MC_CHECK(mc_optimizer_init(&s.opt, &od));
    s.tok = lab_xcalloc((size_t)m->seq * m->micro_batch, sizeof(int));
    s.lab = lab_xcalloc((size_t)m->seq * m->micro_batch, sizeof(int));
    mc_schedule_result *res = lab_xcalloc(1, sizeof *res);

    mc_forward_backward_func fb = mc_get_forward_backward_func(&s.ps);
    mc_schedule_hooks hooks = {.app = &s,
                               .forward_step = lab01_script_forward,
                               .backward_step = lab01_script_backward,
                               .grad_sync = lab01_script_grad_sync,
                               .finalize = lab01_script_finalize,
                               .tensor_elems = s.gpt.p2p_elems};
    for (int it = 0; it < iters; it++) {
        double t0 = lab_now();
        s.batch_start = (long long)(it % m->iters) * m->global_batch;
        MC_CHECK(mc_ddp_zero_grad(&s.ddp));   /* the model's grads are the DDP's buffer */
        MC_CHECK(fb(&s.ps, &hooks, m->microbatches, 0, res));
        MC_CHECK(mc_optimizer_step(&s.opt));
        if (iter_ms != NULL) iter_ms[it] = (lab_now() - t0) * 1000.0;
    }
    free(res);
    free(s.tok);
    free(s.lab);
    mc_optimizer_destroy(&s.opt);
    MC_CHECK(mc_ddp_destroy(&s.ddp));
    mc_gpt_destroy(&s.gpt);
    MC_CHECK(mc_parallel_destroy(&s.ps));
}

/* =============================================================================================
   The accelerated table and the worlds the paths run on */

typedef struct lab01_backend {
    const mc_ops *ops;               /* the fused path's table */
    char name[24];                   /* "cuda", "cpu-cblas" or "cpu" */
    char why[256];                   /* why this one */
    int accelerated_ops;             /* compute slots that differ from the reference table */
    char accelerated_list[256];      /* their names */
    mc_comm *world;                  /* the NCCL world of a CUDA table (NULL otherwise) */
#if defined(MC_ENABLE_CUDA)
    mc_ops cuda;
    int have_cuda;
#endif
} lab01_backend;

#if defined(MC_ENABLE_CUDA)
/* Every compute slot filled (a CUDA table of this build may have memory ops only). */
static int lab01_table_complete(const mc_ops *t) {
    int ok = 1;
#define LAB01_HAS(slot) ok &= t->slot != NULL;
    LAB01_OPS(LAB01_HAS)
#undef LAB01_HAS
    return ok;
}
#endif

static void lab01_pick_backend(lab_ctx *cx, lab01_backend *b) {
    memset(b, 0, sizeof b[0]);
#if defined(MC_ENABLE_CUDA)
    int n = mc_cuda_device_count(), usable = 0;
    if (n > 0 && mc_ops_cuda_init(&b->cuda, &(mc_cuda_desc){.device = cx->me % n}) == MC_OK) {
        b->have_cuda = 1;
        usable = lab01_table_complete(&b->cuda);
        if (!usable)
            snprintf(b->why, sizeof b->why, "the CUDA table of this build has no numeric ops "
                     "yet (%s); ", mc_ops_cuda_describe(&b->cuda));
    } else {
        snprintf(b->why, sizeof b->why, "%s; ", n > 0 ? "the CUDA table did not start"
                                                      : "no GPU visible to this rank");
    }
    int all = 0;   /* every rank must agree: the path's world is collective */
    MC_CHECK(lab_all_reduce_i32(cx->world, &usable, &all, 1, MC_MIN));
    if (all) {   /* its world: NCCL over the same ranks, on this table's memory */
        mc_comm_desc d = {.backend = MC_BACKEND_NCCL, .timeout_s = cx->world->timeout_s,
                          .memory = &b->cuda};
        int rc = mc_comm_init_world(&b->world, &d);
        if (rc != MC_OK) {
            b->world = NULL, all = 0;
            snprintf(b->why, sizeof b->why, "no NCCL world on this table (%s: %s); ",
                     mc_err_name(rc), mc_last_error());
        }
    }
    if (all) {
        b->ops = &b->cuda;
        snprintf(b->name, sizeof b->name, "cuda");
        snprintf(b->why, sizeof b->why, "the CUDA table: %s", mc_ops_cuda_describe(&b->cuda));
    } else if (b->have_cuda) {
        if (usable) snprintf(b->why, sizeof b->why, "another rank cannot use its GPU; ");
        mc_ops_cuda_destroy(&b->cuda);
        b->have_cuda = 0;
    }
#endif
    size_t used = strlen(b->why);
    if (b->ops == NULL && mc_ops_cpu_cblas() != NULL) {
        b->ops = mc_ops_cpu_cblas();
        snprintf(b->name, sizeof b->name, "%s", b->ops->name);
        snprintf(b->why + used, sizeof b->why - used,
                 "the CPU table with its GEMM through cblas_sgemm (OpenBLAS)");
    } else if (b->ops == NULL) {
        b->ops = mc_ops_cpu();
        snprintf(b->name, sizeof b->name, "%s", b->ops->name);
        snprintf(b->why + used, sizeof b->why - used,
                 "no accelerated table in this build (WITH_CBLAS=0, no usable GPU): the fused "
                 "path runs on the reference table");
    }
    const mc_ops *ref = mc_ops_cpu();
    int k = 0;
#define LAB01_DIFF(slot)                                                                      \
    if (lab01_is_compute(LAB01_OP_##slot) && b->ops->slot != ref->slot) {                     \
        k += snprintf(b->accelerated_list + k, sizeof b->accelerated_list - (size_t)k, "%s%s", \
                      b->accelerated_ops ? ", " : "", #slot);                                 \
        if (k >= (int)sizeof b->accelerated_list) k = (int)sizeof b->accelerated_list - 1;    \
        b->accelerated_ops++;                                                                 \
    }
    LAB01_OPS(LAB01_DIFF)
#undef LAB01_DIFF
}

static void lab01_release_backend(lab01_backend *b) {
    if (b->world != NULL) mc_comm_destroy(b->world);
    b->world = NULL;
#if defined(MC_ENABLE_CUDA)
    if (b->have_cuda) mc_ops_cuda_destroy(&b->cuda);
    b->have_cuda = 0;
#else
    (void)b;
#endif
}

/* The world a path on `ops` runs on: the fused backend's own (NCCL on its CUDA table), the
   lab's when its memory is the table's, else a new MPI world over the same processes (the lab's
   world is NCCL when every rank has a GPU); *own says whether the caller destroys it. */
static mc_comm *lab01_world_for(lab_ctx *cx, const lab01_backend *b, const mc_ops *ops,
                                int *own) {
    *own = 0;
    if (b->world != NULL && ops == b->ops) return b->world;
    if (mc_ops_same_memory(mc_comm_memory(cx->world), ops)) return cx->world;
    mc_comm *w = NULL;
    mc_comm_desc d = {.backend = MC_BACKEND_MPI, .timeout_s = cx->world->timeout_s};
    MC_CHECK(mc_comm_init_world(&w, &d));
    *own = 1;
    return w;
}

/* =============================================================================================
   What the paths measured */

typedef struct lab01_path {
    int ran;
    char table[24];                  /* the inner table's name */
    double loss[LAB01_MAX_ITERS];    /* global loss per iteration (every rank) */
    lab01_trace probe;               /* the probe rank's trace (every rank holds a copy) */
    long long world_calls[LAB01_N_OPS], world_accelerated;   /* over every rank */
    long long world_outside_core, world_core_inside_core;
    int owner_same_everywhere;       /* every rank's step site belongs to the same layer */
    char owner[16];                  /* "recipe", "script", "library" */
    double seconds;
} lab01_path;

typedef struct lab01_state {
    lab01_model m;
    unsigned char *tokens;
    char token_file[256];
    lab01_backend fused;
    lab01_trace mine[LAB01_N_PATHS]; /* this rank's traces */
    lab01_path path[LAB01_N_PATHS];
    double reference[LAB01_MAX_ITERS];
    int gemm_formula_mismatches;     /* ranks whose GEMM count differs from the formula */
    int op_counts_differ;            /* ranks whose op counts differ between the paths */
    int op_counts_differ_core_fused;
    int timing_ran;
    double step_ms[2];               /* core_api (reference table), fused */
    int timed_iters;
} lab01_state;

/* Global loss of every iteration: the last stage's TP-rank-0 ranks hold their DP replica's
   loss and token sums; one all-reduce over the world adds the replicas. */
static void lab01_global_losses(lab_ctx *cx, const lab01_trace *tr, int iters, double *loss) {
    double mine[2 * LAB01_MAX_ITERS], all[2 * LAB01_MAX_ITERS];
    mc_rank_coords c;
    MC_CHECK(mc_grid_coords(&cx->grid, cx->me, &c));
    int counts = c.tp == 0 && c.pp == cx->grid.desc.pp - 1;
    for (int it = 0; it < iters; it++) {
        mine[2 * it] = counts ? tr->loss_sum[it] : 0.0;
        mine[2 * it + 1] = counts ? tr->num_tokens[it] : 0.0;
    }
    MC_CHECK(lab_all_reduce_f64(cx->world, mine, all, (size_t)(2 * iters), MC_SUM));
    for (int it = 0; it < iters; it++)
        loss[it] = all[2 * it + 1] > 0 ? all[2 * it] / all[2 * it + 1] : NAN;
}

static long long lab01_sum_calls(const long long *calls, int first, int last) {
    long long n = 0;
    for (int op = first; op < last; op++) n += calls[op];
    return n;
}

static long long lab01_compute_calls(const long long *calls) {
    long long n = 0;
    for (int op = 0; op < LAB01_N_OPS; op++) n += lab01_is_compute(op) ? calls[op] : 0;
    return n;
}

static long long lab01_core_calls(const lab01_trace *tr) {
    long long n = 0;
    for (int i = 0; i < tr->n_edges; i++)
        if (tr->edge[i].to_layer == L_CORE) n += tr->edge[i].n;
    return n;
}

/* After a path: the losses, the probe rank's trace on every rank, world totals, the owner. */
static void lab01_collect(lab_ctx *cx, int path, double seconds) {
    lab01_state *st = cx->state;
    lab01_trace *tr = &st->mine[path];
    lab01_path *p = &st->path[path];
    p->ran = 1;
    p->seconds = seconds;
    snprintf(p->table, sizeof p->table, "%s", tr->inner->name);
    lab01_global_losses(cx, tr, st->m.iters, p->loss);
    p->probe = *tr;
    MC_CHECK(lab_broadcast_bytes(cx->world, &p->probe, sizeof p->probe, cx->probe));
    p->probe.inner = NULL, p->probe.real_schedule = NULL;   /* another process's pointers */
    memset(&p->probe.table, 0, sizeof p->probe.table);
    double mine[LAB01_N_OPS + 3], all[LAB01_N_OPS + 3];
    for (int op = 0; op < LAB01_N_OPS; op++) mine[op] = (double)tr->op_calls[op];
    mine[LAB01_N_OPS] = (double)lab01_sum_calls(tr->op_accelerated, 0, LAB01_N_OPS);
    mine[LAB01_N_OPS + 1] = (double)tr->ops_outside_core;
    mine[LAB01_N_OPS + 2] = (double)tr->core_inside_core;
    MC_CHECK(lab_all_reduce_f64(cx->world, mine, all, LAB01_N_OPS + 3, MC_SUM));
    for (int op = 0; op < LAB01_N_OPS; op++) p->world_calls[op] = (long long)all[op];
    p->world_accelerated = (long long)all[LAB01_N_OPS];
    p->world_outside_core = (long long)all[LAB01_N_OPS + 1];
    p->world_core_inside_core = (long long)all[LAB01_N_OPS + 2];
    /* the loop owner: the layer whose code called the optimizer step (and the schedule) */
    const char *owner = lab01_owner_of_site(tr->step_site);
    int code = !strcmp(owner, "recipe") ? 1 : !strcmp(owner, "script") ? 2 : 3, lo = 0, hi = 0;
    MC_CHECK(lab_all_reduce_i32(cx->world, &code, &lo, 1, MC_MIN));
    MC_CHECK(lab_all_reduce_i32(cx->world, &code, &hi, 1, MC_MAX));
    p->owner_same_everywhere = lo == hi;
    snprintf(p->owner, sizeof p->owner, "%s", owner);
}

/* ---------------------------------------------------------------------------------------------
   Printing a trace: one line per caller, its callees with their counts, in first-seen order. */

/* Edges into the layers set in `to_layers` (bit per layer). */
static void lab01_print_edges(const lab01_trace *tr, unsigned to_layers) {
    char done[LAB01_MAX_EDGES] = {0};
    for (int i = 0; i < tr->n_edges; i++) {
        const lab01_edge *e = &tr->edge[i];
        if (done[i] || !(to_layers & (1u << e->to_layer))) continue;
        char line[1024];
        int len = snprintf(line, sizeof line, "  %-11s %-34s -> %s:", lab01_layer[e->from_layer],
                           e->from, lab01_layer[e->to_layer]);
        int col = len;
        for (int j = i; j < tr->n_edges; j++) {
            const lab01_edge *f = &tr->edge[j];
            if (done[j] || f->from_layer != e->from_layer || f->to_layer != e->to_layer ||
                strcmp(f->from, e->from))
                continue;
            done[j] = 1;
            char item[LAB01_NAME + 24];
            int n = snprintf(item, sizeof item, " %s %lld", f->to, f->n);
            if (col + n + 1 > 100 && len + 60 < (int)sizeof line) {
                len += snprintf(line + len, sizeof line - (size_t)len, "\n%52s", "");
                col = 52;
            }
            if (len + n + 2 < (int)sizeof line) {
                len += snprintf(line + len, sizeof line - (size_t)len, "%s,", item);
                col += n + 1;
            }
        }
        if (len > 0 && line[len - 1] == ',') line[len - 1] = '\0';
        lab_printf0("%s\n", line);
    }
}

/* Host seconds in backend ops on the probe rank, and the share of the GEMMs. */
static void lab01_print_op_time(const lab01_trace *t, int probe) {
    double total = 0;
    for (int op = 0; op < LAB01_N_OPS; op++) total += t->op_seconds[op];
    lab_printf0("rank %d: %.3f s in backend ops, %.0f%% of it in gemm (%.3f s)\n", probe, total,
                total > 0 ? 100.0 * t->op_seconds[LAB01_OP_gemm] / total : 0.0,
                t->op_seconds[LAB01_OP_gemm]);
}

static void lab01_print_path(lab_ctx *cx, int path, int with_backend) {
    const lab01_state *st = cx->state;
    const lab01_path *p = &st->path[path];
    const lab01_trace *t = &p->probe;
    mc_rank_coords c;
    MC_CHECK(mc_grid_coords(&cx->grid, cx->probe, &c));
    lab_printf0("call trace of rank %d (pipeline stage %d of %d), %d iterations on table %s:\n",
                cx->probe, c.pp, cx->grid.desc.pp, st->m.iters, p->table);
    lab01_print_edges(t, with_backend ? 7u : 3u);
    if (!with_backend)
        lab_printf0("  (its backend edges are the recipe's: the same ops under the same core "
                    "calls)\n");
    long long compute = lab01_compute_calls(t->op_calls);
    long long memory = lab01_sum_calls(t->op_calls, 0, LAB01_N_OPS) - compute;
    long long accel = lab01_sum_calls(t->op_accelerated, 0, LAB01_N_OPS);
    lab_printf0("rank %d: %lld core entry-point calls; %lld backend ops (%lld compute, %lld "
                "memory and queries), %lld of them on an accelerated implementation\n",
                cx->probe, lab01_core_calls(t), compute + memory, compute, memory, accel);
    lab01_print_op_time(t, cx->probe);
    lab_printf0("loop owner: %s (%s called mc_optimizer_step %d times and ran the schedule %d "
                "times)\n", p->owner, t->step_site, t->steps, t->schedule_runs);
}

/* =============================================================================================
   The experiments */

/* Rank 0 writes the script's token stream for the recipe's --data-path (atomically). */
static void lab01_write_tokens(lab_ctx *cx) {
    lab01_state *st = cx->state;
    lab_path_beside_results(cx->args->results_path, "tokens", "bin", st->token_file,
                            sizeof st->token_file);
    int ok = 1;
    if (cx->me == 0) {
        char tmp[300];
        snprintf(tmp, sizeof tmp, "%s.tmp", st->token_file);
        FILE *f = lab_make_parent_dirs(st->token_file) == 0 ? fopen(tmp, "wb") : NULL;
        size_t n = lab01_token_count(&st->m);
        ok = f != NULL && fwrite(st->tokens, 1, n, f) == n;
        if (f != NULL) ok &= fclose(f) == 0;
        ok = ok && rename(tmp, st->token_file) == 0;
        if (!ok) fprintf(stderr, "lab01: cannot write %s\n", st->token_file);
    }
    int all = 0;   /* the others wait for rank 0 here, then read the file */
    MC_CHECK(lab_all_reduce_i32(cx->world, &ok, &all, 1, MC_MIN));
    if (!all) lab_abort(LAB_EXIT_FAILED);
}

/* pretrain_gpt's flags for this lab's model (Megatron-LM's names), in argv form. */
typedef struct lab01_argv {
    int argc;
    char *argv[48];
    char text[48][64];
} lab01_argv;

static void lab01_arg(lab01_argv *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->text[a->argc], sizeof a->text[0], fmt, ap);
    va_end(ap);
    a->argv[a->argc] = a->text[a->argc];
    a->argc++;
}

static void lab01_recipe_flags(const lab01_state *st, lab01_argv *a) {
    const lab01_model *m = &st->m;
    memset(a, 0, sizeof *a);
    lab01_arg(a, "pretrain_gpt");
    lab01_arg(a, "--tensor-model-parallel-size"), lab01_arg(a, "%d", m->tp);
    lab01_arg(a, "--pipeline-model-parallel-size"), lab01_arg(a, "%d", m->pp);
    if (m->vpp > 1)
        lab01_arg(a, "--virtual-pipeline-model-parallel-size"), lab01_arg(a, "%d", m->vpp);
    lab01_arg(a, "--num-layers"), lab01_arg(a, "%d", m->layers);
    lab01_arg(a, "--hidden-size"), lab01_arg(a, "%d", m->hidden);
    lab01_arg(a, "--num-attention-heads"), lab01_arg(a, "%d", m->heads);
    lab01_arg(a, "--seq-length"), lab01_arg(a, "%d", m->seq);
    lab01_arg(a, "--micro-batch-size"), lab01_arg(a, "%d", m->micro_batch);
    lab01_arg(a, "--global-batch-size"), lab01_arg(a, "%d", m->global_batch);
    lab01_arg(a, "--train-iters"), lab01_arg(a, "%d", m->iters);
    lab01_arg(a, "--lr"), lab01_arg(a, "%g", (double)LAB01_LR);
    lab01_arg(a, "--min-lr"), lab01_arg(a, "%g", (double)LAB01_MIN_LR);
    lab01_arg(a, "--lr-decay-iters"), lab01_arg(a, "%d", m->iters);
    lab01_arg(a, "--weight-decay"), lab01_arg(a, "%g", 0.01);
    lab01_arg(a, "--clip-grad"), lab01_arg(a, "%g", 1.0);
    lab01_arg(a, "--seed"), lab01_arg(a, "%d", LAB01_SEED);
    lab01_arg(a, "--hidden-dropout"), lab01_arg(a, "0");
    lab01_arg(a, "--attention-dropout"), lab01_arg(a, "0");
    lab01_arg(a, "--data-path"), lab01_arg(a, "%s", st->token_file);
    lab01_arg(a, "--log-interval"), lab01_arg(a, "1");
    lab01_arg(a, "--cpu");   /* a GPU build too: the recipe path is the reference (host) table */
    a->argv[a->argc] = NULL;
}

static int lab01_run_recipe(lab_ctx *cx) {
    lab01_state *st = cx->state;
    lab_heading(cx, "A. The recipe path: examples/pretrain_gpt.c owns the flags, the data and "
                    "the loop");
    lab01_write_tokens(cx);
    lab01_argv a;
    lab01_recipe_flags(st, &a);
    char line[1400];
    int len = snprintf(line, sizeof line, "application  ./pretrain_gpt"), col = len;
    for (int i = 1; i < a.argc && len < (int)sizeof line - 100; i++) {
        int has_value = i + 1 < a.argc && strncmp(a.argv[i + 1], "--", 2) != 0;
        const char *value = has_value ? a.argv[i + 1] : "";
        int w = (int)(strlen(a.argv[i]) + strlen(value)) + 1 + has_value;
        if (col + w > 98) {
            len += snprintf(line + len, sizeof line - (size_t)len, " \\\n%15s", "");
            col = 15;
        }
        len += snprintf(line + len, sizeof line - (size_t)len, " %s%s%s", a.argv[i],
                        has_value ? " " : "", value);
        col += w;
        i += has_value;
    }
    lab_printf0("%s\n", line);
    double t0 = lab_now();
    lab01_trace_begin(&st->mine[LAB01_RECIPE], mc_ops_cpu());
    lab01_app_enter("pretrain_gpt.c:main");
    st->mine[LAB01_RECIPE].recipe_entries++;
    int rc = lab01_recipe_main(a.argc, a.argv);
    lab01_app_leave();
    lab01_trace_end();
    int all = 0;
    MC_CHECK(lab_all_reduce_i32(cx->world, &rc, &all, 1, MC_MAX));
    if (!lab_check(cx, all == 0, "pretrain_gpt's main returned 0 on every rank (got %d)", all))
        return LAB_RAN;
    lab01_collect(cx, LAB01_RECIPE, lab_now() - t0);
    lab01_print_path(cx, LAB01_RECIPE, 1);
    const lab01_path *p = &st->path[LAB01_RECIPE];
    const lab01_trace *mine = &st->mine[LAB01_RECIPE];
    int logged_ok = mine->n_logged == st->m.iters;
    for (int it = 0; logged_ok && it < st->m.iters; it++)
        logged_ok = mine->logged_loss[it] == p->loss[it];
    lab_check(cx, logged_ok, "the loss the recipe logged equals the loss its schedule results add "
              "up to, every iteration (logged %d of %d)", mine->n_logged, st->m.iters);
    return LAB_RAN;
}

/* B and C: the script on `ops`, traced. */
static void lab01_run_script_path(lab_ctx *cx, int path, const mc_ops *ops) {
    lab01_state *st = cx->state;
    int own = 0;
    mc_comm *world = lab01_world_for(cx, &st->fused, ops, &own);
    double t0 = lab_now();
    lab01_trace_begin(&st->mine[path], ops);
    lab01_script_train(&st->m, st->tokens, world, &st->mine[path].table, st->m.iters, NULL);
    lab01_trace_end();
    if (own) mc_comm_destroy(world);
    lab01_collect(cx, path, lab_now() - t0);
}

static int lab01_run_core_api(lab_ctx *cx) {
    lab01_state *st = cx->state;
    lab_heading(cx, "B. The core-API path: this lab's own script calls the model, the schedule, "
                    "DDP and the optimizer");
    lab_printf0("application  lab01.c: its own data loader (the same token windows), its own "
                "mc_gpt_config, its own loop of %d iterations\n", st->m.iters);
    lab01_run_script_path(cx, LAB01_CORE_API, mc_ops_cpu());
    lab01_print_path(cx, LAB01_CORE_API, 0);
    return LAB_RAN;
}

static int lab01_run_fused(lab_ctx *cx) {
    lab01_state *st = cx->state;
    lab_heading(cx, "C. The fused path: the same script on the accelerated backend");
    lab01_pick_backend(cx, &st->fused);
    lab_printf0("backend table %s: %s\n", st->fused.name, st->fused.why);
    lab_printf0("compute ops it implements differently from the reference table: %d (%s)\n",
                st->fused.accelerated_ops,
                st->fused.accelerated_ops ? st->fused.accelerated_list : "none");
    lab01_run_script_path(cx, LAB01_FUSED, st->fused.ops);
    const lab01_path *p = &st->path[LAB01_FUSED];
    const lab01_trace *t = &p->probe;
    lab_printf0("call trace of rank %d: the core edges of B; backend ops per core caller:\n",
                cx->probe);
    lab01_print_edges(t, 1u << L_BACKEND);
    lab_printf0("rank %d: %lld backend ops, %lld on an accelerated implementation; loop owner: "
                "%s (%s)\n", cx->probe, lab01_sum_calls(t->op_calls, 0, LAB01_N_OPS),
                lab01_sum_calls(t->op_accelerated, 0, LAB01_N_OPS), p->owner, t->step_site);
    lab01_print_op_time(t, cx->probe);
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   D. The single-rank reference and the comparisons */

/* Rank 0 alone: the same model with TP = PP = DP = 1 (the padded vocabulary of the run's TP),
   no schedule and no communication: every micro-batch of the global batch forward and backward
   in sample order, then the same optimizer step. loss[it] = mean token loss of iteration it. */
static void lab01_reference(const lab01_model *run, const unsigned char *tokens, double *loss) {
    lab01_model m = *run;
    m.tp = m.pp = m.dp = 1, m.vpp = 0;
    mc_gpt_config cfg = lab01_config(&m);
    cfg.make_vocab_size_divisible_by = 128 * run->tp;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    MC_CHECK(mc_gpt_init(&gpt, &(mc_gpt_desc){.config = cfg, .ops = mc_ops_cpu(), .n_slots = 1}));
    MC_CHECK(mc_ddp_init(&ddp, &(mc_ddp_desc){.table = &gpt.table, .grads = gpt.grads,
                                              .ops = mc_ops_cpu()}));
    mc_optimizer_desc od = lab01_optimizer_desc(run);
    od.ddp = &ddp, od.params = gpt.params;
    MC_CHECK(mc_optimizer_init(&opt, &od));
    int S = m.seq, B = m.micro_batch, n_mb = run->microbatches * run->dp;
    int *tok = lab_xcalloc((size_t)S * B, sizeof(int));
    int *lab = lab_xcalloc((size_t)S * B, sizeof(int));
    float scale = (float)(1.0 / ((double)S * B * n_mb));
    for (int it = 0; it < run->iters; it++) {
        MC_CHECK(mc_ddp_zero_grad(&ddp));
        MC_CHECK(mc_gpt_zero_grad(&gpt));
        double total = 0.0;
        for (int r = 0; r < n_mb; r++) {
            for (int j = 0; j < B; j++) {
                long long k = (long long)it * run->global_batch + (long long)r * B + j;
                for (int t = 0; t < S; t++)
                    tok[t * B + j] = tokens[k * S + t], lab[t * B + j] = tokens[k * S + t + 1];
            }
            float *out = NULL, *dinp = NULL;
            double ls = 0.0;
            MC_CHECK(mc_gpt_forward(&gpt, 0, 0, tok, lab, NULL, &out, &ls));
            MC_CHECK(mc_gpt_backward(&gpt, 0, 0, NULL, scale, &dinp));
            total += ls;
        }
        MC_CHECK(mc_finalize_model_grads(NULL, &ddp, NULL, NULL, 0, NULL));
        MC_CHECK(mc_optimizer_step(&opt));
        loss[it] = total / ((double)S * B * n_mb);
    }
    free(tok);
    free(lab);
    mc_optimizer_destroy(&opt);
    MC_CHECK(mc_ddp_destroy(&ddp));
    mc_gpt_destroy(&gpt);
}

/* "identical" (every iteration bit for bit), "within_tolerance" or "different". */
static const char *lab01_relation(const double *a, const double *b, int n, double *max_abs,
                                  double *max_rel) {
    int same = 1, close = 1;
    *max_abs = *max_rel = 0.0;
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]), r = d / fmax(fabs(b[i]), 1e-30);
        same &= a[i] == b[i];
        close &= d <= LAB01_LOSS_RTOL * fabs(b[i]);
        if (d > *max_abs) *max_abs = d;
        if (r > *max_rel) *max_rel = r;
    }
    return same ? "identical" : close ? "within_tolerance" : "different";
}

/* GEMMs per micro-batch the structure implies on a rank: 4 linears per layer forward (QKV,
   projection, fc1, fc2) and 2 backward each (input and weight gradients); with TP > 1 the two
   row-parallel linears add their bias after the TP all-reduce (a GEMM with K = 0); on the last
   stage the output layer (logits forward, 2 backward). */
static long long lab01_gemms_expected(const lab_ctx *cx, const lab01_model *m, int rank) {
    mc_rank_coords c;
    MC_CHECK(mc_grid_coords(&cx->grid, rank, &c));
    int layers_here = m->layers / m->pp, last = c.pp == m->pp - 1, row_bias = m->tp > 1 ? 2 : 0;
    return (long long)m->iters * m->microbatches * ((12LL + row_bias) * layers_here + 3LL * last);
}

/* The compute ops (the memory ops and the size queries differ by design: the recipe never frees
   its model, and it keeps fewer activation slots). */
static int lab01_probe_is_last(const lab_ctx *cx) {
    mc_rank_coords c;
    MC_CHECK(mc_grid_coords(&cx->grid, cx->probe, &c));
    return c.pp == cx->grid.desc.pp - 1;
}

static int lab01_same_counts(const lab01_trace *a, const lab01_trace *b) {
    for (int op = 0; op < LAB01_N_OPS; op++)
        if (lab01_is_compute(op) && a->op_calls[op] != b->op_calls[op]) return 0;
    return 1;
}

static void lab01_print_losses(lab_ctx *cx) {
    const lab01_state *st = cx->state;
    lab_printf0("%-10s", "loss");
    for (int it = 0; it < st->m.iters; it++)
        lab_printf0("  %-22s", it == 0 ? "iteration 1" : "iteration 2 (after 1 step)");
    lab_printf0("\n");
    for (int p = 0; p < LAB01_N_PATHS + 1; p++) {
        const double *v = p < LAB01_N_PATHS ? st->path[p].loss : st->reference;
        lab_printf0("%-10s", p < LAB01_N_PATHS ? lab01_path_key[p] : "reference");
        for (int it = 0; it < st->m.iters; it++) lab_printf0("  %-22.17g", v[it]);
        lab_printf0("\n");
    }
}

static int lab01_run_compare(lab_ctx *cx) {
    lab01_state *st = cx->state;
    lab_heading(cx, "D. The single-rank reference (rank 0: TP = PP = DP = 1, no schedule) and the "
                    "losses");
    if (cx->me == 0) lab01_reference(&st->m, st->tokens, st->reference);
    MC_CHECK(lab_broadcast_bytes(cx->world, st->reference, sizeof st->reference, 0));
    lab01_print_losses(cx);
    double a, r;
    int n = st->m.iters;
    const double *rec = st->path[LAB01_RECIPE].loss, *core = st->path[LAB01_CORE_API].loss;
    const double *fused = st->path[LAB01_FUSED].loss;
    const char *rel = lab01_relation(rec, core, n, &a, &r);
    lab_printf0("recipe vs core_api: %s (max |diff| %.3g)\n", rel, a);
    lab_check(cx, !strcmp(rel, "identical"), "the recipe and the core-API path give identical "
              "losses: the same core calls and ops in the same order (%s)", rel);
    rel = lab01_relation(fused, core, n, &a, &r);
    lab_printf0("core_api vs fused: %s (max |diff| %.3g, relative %.3g; tolerance %.0e of the "
                "loss)\n", rel, a, r, LAB01_LOSS_RTOL);
    for (int p = 0; p < LAB01_N_PATHS; p++) {
        rel = lab01_relation(st->path[p].loss, st->reference, n, &a, &r);
        lab_printf0("%-9s vs the single-rank reference: %s (max |diff| %.3g)\n", lab01_path_key[p],
                    rel, a);
        lab_check(cx, strcmp(rel, "different") != 0, "%s agrees with the single-rank reference "
                  "within %.0e (max |diff| %.3g)", lab01_path_key[p], LAB01_LOSS_RTOL, a);
    }
    /* the op counts, rank by rank: the same core drives the same ops, whoever owns the loop */
    int differ = !lab01_same_counts(&st->mine[LAB01_RECIPE], &st->mine[LAB01_CORE_API]) ||
                 !lab01_same_counts(&st->mine[LAB01_CORE_API], &st->mine[LAB01_FUSED]);
    int differ_cf = !lab01_same_counts(&st->mine[LAB01_CORE_API], &st->mine[LAB01_FUSED]);
    long long want = lab01_gemms_expected(cx, &st->m, cx->me), mismatch = 0;
    for (int p = 0; p < LAB01_N_PATHS; p++)
        mismatch |= st->mine[p].op_calls[LAB01_OP_gemm] != want;
    int mine[3] = {differ, differ_cf, (int)mismatch}, all[3];
    MC_CHECK(lab_all_reduce_i32(cx->world, mine, all, 3, MC_SUM));
    st->op_counts_differ = all[0], st->op_counts_differ_core_fused = all[1];
    st->gemm_formula_mismatches = all[2];
    lab_printf0("backend compute ops: %s on %s rank (recipe, core_api and fused, op by op)\n",
                all[0] ? "DIFFERENT" : "the same counts in all three paths",
                all[0] ? "some" : "every");
    lab_check(cx, all[0] == 0, "every rank issued the same compute ops in all three paths (%d "
              "ranks differ)", all[0]);
    lab_printf0("GEMMs on rank %d: %lld in every path; its structure implies %lld (%d iterations "
                "x %d micro-batches x (%s x %d layers%s))\n", cx->probe,
                st->path[LAB01_CORE_API].probe.op_calls[LAB01_OP_gemm],
                lab01_gemms_expected(cx, &st->m, cx->probe), st->m.iters, st->m.microbatches,
                st->m.tp > 1 ? "(12 + 2 row-parallel biases)" : "12", st->m.layers / st->m.pp,
                lab01_probe_is_last(cx) ? " + 3 for the output layer" : "");
    lab_check(cx, all[2] == 0, "every rank's GEMM count equals iterations x micro-batches x "
              "((12 + 2 with TP) x its layers + 3 on the last stage): rank %d %lld (%d ranks "
              "differ)",
              cx->probe, lab01_gemms_expected(cx, &st->m, cx->probe), all[2]);
    for (int p = 0; p < LAB01_N_PATHS; p++) {
        const lab01_path *q = &st->path[p];
        const char *want_owner = p == LAB01_RECIPE ? "recipe" : "script";
        lab_check(cx, q->owner_same_everywhere && !strcmp(q->owner, want_owner),
                  "%s: the loop belongs to the %s on every rank (%s)", lab01_path_key[p],
                  want_owner, q->probe.step_site);
        lab_check(cx, q->probe.steps == n && q->probe.schedule_runs == n && !q->probe.sites_moved,
                  "%s: one schedule run and one optimizer step per iteration, from one call site",
                  lab01_path_key[p]);
        lab_check(cx, q->world_outside_core == 0 && q->world_core_inside_core == 0,
                  "%s: every backend op ran inside a core entry point and every core entry point "
                  "was called by application code (%lld, %lld)", lab01_path_key[p],
                  q->world_outside_core, q->world_core_inside_core);
        long long want_acc = p == LAB01_FUSED && st->fused.accelerated_ops > 0;
        lab_check(cx, (q->world_accelerated > 0) == want_acc, "%s: %s accelerated ops (%lld)",
                  lab01_path_key[p], want_acc ? "ran" : "ran no", q->world_accelerated);
    }
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   E. Step time, untraced: the script on the reference table and on the accelerated one. */

/* One block: a fresh model on `ops`, a warm-up iteration, then `timed` iterations; the slowest
   rank's time of each goes to ms[]. */
static void lab01_timed_block(lab_ctx *cx, const mc_ops *ops, int timed, double *ms) {
    lab01_state *st = cx->state;
    int own = 0;
    mc_comm *world = lab01_world_for(cx, &st->fused, ops, &own);
    double mine[1 + LAB01_TIMED_ITERS], slowest[1 + LAB01_TIMED_ITERS];
    lab01_script_train(&st->m, st->tokens, world, ops, 1 + timed, mine);
    if (own) mc_comm_destroy(world);
    MC_CHECK(lab_all_reduce_f64(cx->world, mine, slowest, (size_t)(1 + timed), MC_MAX));
    memcpy(ms, slowest + 1, sizeof(double) * (size_t)timed);
}

/* OpenBLAS starts a thread per core; one rank per core is the comparison here, as the
   reference GEMM uses one core. */
extern void openblas_set_num_threads(int n) __attribute__((weak));

static int lab01_run_timing(lab_ctx *cx) {
    lab01_state *st = cx->state;
    if (cx->args->timing == 0) return LAB_SKIPPED;
    lab_heading(cx, "E. Step time: the script on the reference table and on %s (untraced)",
                st->fused.name);
    if (openblas_set_num_threads != NULL) openblas_set_num_threads(1);
    /* the two tables take turns, two blocks each, so that a change in the machine's load
       falls on both */
    st->timed_iters = cx->args->quick ? 2 : LAB01_TIMED_ITERS;
    int half = st->timed_iters / 2;
    double ms[2][LAB01_TIMED_ITERS];
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 2; k++)
            lab01_timed_block(cx, k == 0 ? mc_ops_cpu() : st->fused.ops, half,
                              ms[k] + round * half);
    for (int k = 0; k < 2; k++) st->step_ms[k] = lab_median(ms[k], 2 * half);
    st->timing_ran = 1;
    double tokens = (double)st->m.global_batch * st->m.seq;
    for (int k = 0; k < 2; k++)
        lab_printf0("%-9s %-10s median of %d iterations (slowest rank): %8.2f ms, %8.0f "
                    "tokens/s\n", k == 0 ? "core_api" : "fused", k == 0 ? "cpu" : st->fused.name,
                    st->timed_iters, st->step_ms[k], tokens / (st->step_ms[k] / 1000.0));
    lab_printf0("the fused path takes %.2fx the reference path's time per iteration\n",
                st->step_ms[1] / st->step_ms[0]);
    return LAB_RAN;
}

/* =============================================================================================
   Facts */

static int lab01_called(const lab01_trace *t, const char *owner, const char *prefix) {
    for (int i = 0; i < t->n_edges; i++) {
        const lab01_edge *e = &t->edge[i];
        if (e->from_layer == L_APP && e->to_layer == L_CORE &&
            !strcmp(lab01_owner_of_site(e->from), owner) &&
            !strncmp(e->to, prefix, strlen(prefix)))
            return 1;
    }
    return 0;
}

static const char *lab01_kind(const lab01_path *p) {
    if (p->probe.recipe_entries > 0) return "recipe";
    return p->world_accelerated > 0 ? "core_api_fused" : "core_api";
}

/* What the path's own application code (the recipe's, or the script's) called in the core. */
static cJSON *lab01_direct_calls_json(const lab01_path *p) {
    const lab01_trace *t = &p->probe;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "config", lab01_called(t, p->owner, "mc_gpt_config"));
    cJSON_AddBoolToObject(o, "model", lab01_called(t, p->owner, "mc_gpt_init") &&
                                          lab01_called(t, p->owner, "mc_gpt_forward_step"));
    cJSON_AddBoolToObject(o, "schedule",
                          lab01_called(t, p->owner, "mc_get_forward_backward_func"));
    cJSON_AddBoolToObject(o, "parallel_state", lab01_called(t, p->owner, "mc_parallel_init"));
    cJSON_AddBoolToObject(o, "recipe_entry", t->recipe_entries > 0);
    return o;
}

static cJSON *lab01_ops_json(const long long *calls) {
    cJSON *o = cJSON_CreateObject();
    for (int op = 0; op < LAB01_N_OPS; op++)
        if (calls[op] > 0) cJSON_AddNumberToObject(o, lab01_op_name[op], (double)calls[op]);
    return o;
}

static cJSON *lab01_path_json(const lab_ctx *cx, int path) {
    const lab01_state *st = cx->state;
    const lab01_path *p = &st->path[path];
    const lab01_trace *t = &p->probe;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ran", p->ran);
    if (!p->ran) return o;
    cJSON_AddStringToObject(o, "table", p->table);
    cJSON_AddStringToObject(o, "loop_owner", p->owner);
    cJSON_AddStringToObject(o, "loop_site", t->step_site);
    cJSON_AddStringToObject(o, "schedule_site", t->schedule_site);
    cJSON_AddStringToObject(o, "schedule", t->schedule_name);
    cJSON_AddNumberToObject(o, "schedule_runs", t->schedule_runs);
    cJSON_AddNumberToObject(o, "optimizer_steps", t->steps);
    cJSON_AddBoolToObject(o, "recipe_entry", t->recipe_entries > 0);
    cJSON_AddStringToObject(o, "experiment_kind", lab01_kind(p));
    cJSON_AddItemToObject(o, "direct_calls", lab01_direct_calls_json(p));
    cJSON *loss = cJSON_AddArrayToObject(o, "loss");
    for (int it = 0; it < st->m.iters; it++)
        cJSON_AddItemToArray(loss, cJSON_CreateNumber(p->loss[it]));
    /* the probe rank's trace */
    cJSON_AddNumberToObject(o, "core_calls", (double)lab01_core_calls(t));
    cJSON *core = cJSON_AddObjectToObject(o, "core_entry_points");
    for (int i = 0; i < t->n_edges; i++) {
        const lab01_edge *e = &t->edge[i];
        if (e->to_layer != L_CORE) continue;
        cJSON *c = cJSON_GetObjectItemCaseSensitive(core, e->to);
        if (c != NULL) cJSON_SetNumberValue(c, c->valuedouble + (double)e->n);
        else cJSON_AddNumberToObject(core, e->to, (double)e->n);
    }
    cJSON_AddNumberToObject(o, "backend_calls",
                            (double)lab01_sum_calls(t->op_calls, 0, LAB01_N_OPS));
    cJSON_AddNumberToObject(o, "compute_calls",
                            (double)lab01_compute_calls(t->op_calls));
    cJSON_AddNumberToObject(o, "accelerated_calls",
                            (double)lab01_sum_calls(t->op_accelerated, 0, LAB01_N_OPS));
    cJSON_AddNumberToObject(o, "gemm_calls", (double)t->op_calls[LAB01_OP_gemm]);
    cJSON_AddItemToObject(o, "backend_ops", lab01_ops_json(t->op_calls));
    cJSON *edges = cJSON_AddArrayToObject(o, "edges");
    for (int i = 0; i < t->n_edges; i++) {
        const lab01_edge *e = &t->edge[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "from_layer", lab01_layer[e->from_layer]);
        cJSON_AddStringToObject(x, "from", e->from);
        cJSON_AddStringToObject(x, "to_layer", lab01_layer[e->to_layer]);
        cJSON_AddStringToObject(x, "to", e->to);
        cJSON_AddNumberToObject(x, "n", (double)e->n);
        cJSON_AddItemToArray(edges, x);
    }
    cJSON_AddNumberToObject(o, "edges_dropped", t->edges_dropped);
    /* every rank */
    cJSON *w = cJSON_AddObjectToObject(o, "world");
    cJSON_AddNumberToObject(w, "backend_calls",
                            (double)lab01_sum_calls(p->world_calls, 0, LAB01_N_OPS));
    cJSON_AddNumberToObject(w, "accelerated_calls", (double)p->world_accelerated);
    cJSON_AddNumberToObject(w, "gemm_calls", (double)p->world_calls[LAB01_OP_gemm]);
    cJSON_AddNumberToObject(w, "ops_outside_core", (double)p->world_outside_core);
    cJSON_AddNumberToObject(w, "core_calls_inside_core", (double)p->world_core_inside_core);
    cJSON_AddBoolToObject(w, "same_loop_owner", p->owner_same_everywhere);
    cJSON_AddNumberToObject(o, "seconds", lab_round_s(p->seconds));
    return o;
}

static cJSON *lab01_compare_json(const double *a, const double *b, int n) {
    double ma, mr;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "relation", lab01_relation(a, b, n, &ma, &mr));
    cJSON_AddNumberToObject(o, "max_abs_diff", ma);
    cJSON_AddNumberToObject(o, "max_rel_diff", mr);
    return o;
}

static cJSON *lab01_facts(lab_ctx *cx) {
    const lab01_state *st = cx->state;
    const lab01_model *m = &st->m;
    const lab01_path *P = st->path;
    cJSON *f = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(f, "model");
    cJSON_AddNumberToObject(model, "layers", m->layers);
    cJSON_AddNumberToObject(model, "hidden", m->hidden);
    cJSON_AddNumberToObject(model, "heads", m->heads);
    cJSON_AddNumberToObject(model, "seq_length", m->seq);
    cJSON_AddNumberToObject(model, "vocab", m->vocab);
    cJSON_AddNumberToObject(model, "micro_batch", m->micro_batch);
    cJSON_AddNumberToObject(model, "microbatches", m->microbatches);
    cJSON_AddNumberToObject(model, "global_batch", m->global_batch);
    cJSON_AddNumberToObject(model, "iterations", m->iters);
    cJSON_AddNumberToObject(model, "tp", m->tp);
    cJSON_AddNumberToObject(model, "pp", m->pp);
    cJSON_AddNumberToObject(model, "dp", m->dp);
    cJSON_AddStringToObject(f, "token_file", st->token_file);
    mc_rank_coords c;
    MC_CHECK(mc_grid_coords(&cx->grid, cx->probe, &c));
    cJSON_AddNumberToObject(f, "probe_stage", c.pp);
    cJSON_AddNumberToObject(f, "gemm_expected_probe",
                            (double)lab01_gemms_expected(cx, m, cx->probe));
    cJSON *paths = cJSON_AddObjectToObject(f, "paths");
    for (int p = 0; p < LAB01_N_PATHS; p++)
        cJSON_AddItemToObject(paths, lab01_path_key[p], lab01_path_json(cx, p));
    int all_ran = P[0].ran && P[1].ran && P[2].ran;
    if (!all_ran) return f;

    /* what the predictions are checked against */
    cJSON *own = cJSON_AddObjectToObject(f, "loop_owner");
    for (int p = 0; p < LAB01_N_PATHS; p++)
        cJSON_AddStringToObject(own, lab01_path_key[p], P[p].owner);
    char in[64] = "";
    for (int p = 0; p < LAB01_N_PATHS; p++)
        if (P[p].world_accelerated > 0)
            snprintf(in + strlen(in), sizeof in - strlen(in), "%s%s", in[0] ? "+" : "",
                     lab01_path_key[p]);
    cJSON_AddStringToObject(f, "fused_ops_in", in[0] ? in : "none");
    const lab01_trace *rt = &P[LAB01_RECIPE].probe;
    int recipe_core = lab01_called(rt, "recipe", "mc_gpt_forward_step") &&
                      rt->schedule_runs > 0 && rt->steps > 0;
    cJSON_AddBoolToObject(f, "recipe_calls_core", recipe_core);
    cJSON_AddBoolToObject(f, "same_op_counts", st->op_counts_differ == 0);
    cJSON_AddBoolToObject(f, "same_op_counts_core_vs_fused", st->op_counts_differ_core_fused == 0);
    cJSON_AddNumberToObject(f, "gemm_formula_mismatches", st->gemm_formula_mismatches);
    int n = m->iters;
    cJSON *loss = cJSON_AddObjectToObject(f, "loss");
    cJSON_AddNumberToObject(loss, "tolerance_rel", LAB01_LOSS_RTOL);
    cJSON *ref = cJSON_AddArrayToObject(loss, "reference");
    for (int it = 0; it < n; it++) cJSON_AddItemToArray(ref, cJSON_CreateNumber(st->reference[it]));
    cJSON_AddItemToObject(loss, "recipe_vs_core", lab01_compare_json(P[0].loss, P[1].loss, n));
    cJSON_AddItemToObject(loss, "core_vs_fused", lab01_compare_json(P[2].loss, P[1].loss, n));
    for (int p = 0; p < LAB01_N_PATHS; p++) {
        char key[32];
        snprintf(key, sizeof key, "%s_vs_reference", lab01_path_key[p]);
        cJSON_AddItemToObject(loss, key, lab01_compare_json(P[p].loss, st->reference, n));
    }
    double ma, mr;
    cJSON_AddStringToObject(f, "loss_recipe_vs_core",
                            lab01_relation(P[0].loss, P[1].loss, n, &ma, &mr));
    cJSON_AddStringToObject(f, "loss_core_vs_fused",
                            lab01_relation(P[2].loss, P[1].loss, n, &ma, &mr));
    cJSON *fb = cJSON_AddObjectToObject(f, "fused_backend");
    cJSON_AddStringToObject(fb, "table", st->fused.name);
    cJSON_AddStringToObject(fb, "why", st->fused.why);
    cJSON_AddNumberToObject(fb, "accelerated_ops", st->fused.accelerated_ops);
    cJSON_AddStringToObject(fb, "accelerated_op_names", st->fused.accelerated_list);
    if (st->timing_ran) {
        cJSON *t = cJSON_AddObjectToObject(f, "step_ms");
        cJSON_AddNumberToObject(t, "core_api", lab_round_ms(st->step_ms[0]));
        cJSON_AddNumberToObject(t, "fused", lab_round_ms(st->step_ms[1]));
        cJSON_AddNumberToObject(t, "timed_iterations", st->timed_iters);
        double tokens = (double)m->global_batch * m->seq;
        cJSON *tps = cJSON_AddObjectToObject(f, "tokens_per_s");
        cJSON_AddNumberToObject(tps, "core_api", round(tokens / (st->step_ms[0] / 1000.0)));
        cJSON_AddNumberToObject(tps, "fused", round(tokens / (st->step_ms[1] / 1000.0)));
        cJSON_AddNumberToObject(f, "fused_speedup",
                                round(st->step_ms[0] / st->step_ms[1] * 100) / 100);
        cJSON_AddStringToObject(f, "faster_path",
                                st->step_ms[1] < st->step_ms[0] ? "fused" : "core_api");
    } else {
        cJSON_AddNullToObject(f, "faster_path");
    }
    /* the core-API path's boundary: what the script did itself (true) or handed to the core */
    const lab01_path *cp = &P[LAB01_CORE_API];
    const lab01_trace *ct = &cp->probe;
    int feeds = 0;
    for (int i = 0; i < ct->n_edges; i++)
        feeds |= ct->edge[i].from_layer == L_CORE && ct->edge[i].to_layer == L_APP &&
                 !strcmp(lab01_owner_of_site(ct->edge[i].to), "script");
    cJSON *so = cJSON_AddObjectToObject(f, "script_owns");
    cJSON_AddBoolToObject(so, "data", feeds && !lab01_called(ct, "script", "mc_rng_bits_at"));
    cJSON_AddBoolToObject(so, "loop", !strcmp(cp->owner, "script"));
    cJSON_AddBoolToObject(so, "model", !lab01_called(ct, "script", "mc_gpt_forward_step"));
    cJSON_AddBoolToObject(so, "schedule", ct->schedule_runs == 0);
    cJSON_AddBoolToObject(so, "optimizer", ct->steps == 0);
    /* the follow-up's path */
    int fu = cx->variant == 2 ? LAB01_FUSED : LAB01_CORE_API;
    cJSON *fo = cJSON_AddObjectToObject(f, "followup");
    cJSON_AddStringToObject(fo, "variant", cx->variant_name);
    cJSON_AddStringToObject(fo, "path", lab01_path_key[fu]);
    cJSON_AddItemToObject(fo, "direct_calls", lab01_direct_calls_json(&P[fu]));
    cJSON_AddStringToObject(fo, "loop_owner", P[fu].owner);
    cJSON_AddBoolToObject(fo, "recipe_entry", P[fu].probe.recipe_entries > 0);
    cJSON_AddBoolToObject(fo, "fused_backend", P[fu].world_accelerated > 0);
    cJSON_AddStringToObject(fo, "experiment_kind", lab01_kind(&P[fu]));
    cJSON_AddStringToObject(fo, "table", P[fu].table);
    return f;
}

static void lab01_report(lab_ctx *cx) {
    const lab01_state *st = cx->state;
    const lab01_path *P = st->path;
    if (!(P[0].ran && P[1].ran && P[2].ran)) return;
    double a, r;
    int n = st->m.iters;
    lab_printf0("\n== Measured ==\n");
    lab_printf0("loop owner: recipe path %s, core-API path %s, fused path %s\n", P[0].owner,
                P[1].owner, P[2].owner);
    lab_printf0("accelerated backend ops (all ranks): recipe %lld, core_api %lld, fused %lld "
                "(%s)\n",
                P[0].world_accelerated, P[1].world_accelerated, P[2].world_accelerated,
                st->fused.name);
    lab_printf0("backend ops per path (all ranks): %lld, %lld, %lld: %s\n",
                lab01_sum_calls(P[0].world_calls, 0, LAB01_N_OPS),
                lab01_sum_calls(P[1].world_calls, 0, LAB01_N_OPS),
                lab01_sum_calls(P[2].world_calls, 0, LAB01_N_OPS),
                st->op_counts_differ ? "they differ" : "the same ops on every rank");
    const char *rc_rel = lab01_relation(P[0].loss, P[1].loss, n, &a, &r);
    const char *cf_rel = lab01_relation(P[2].loss, P[1].loss, n, &a, &r);
    lab_printf0("loss: recipe vs core_api %s; core_api vs fused %s (max |diff| %.3g)\n", rc_rel,
                cf_rel, a);
    if (st->timing_ran)
        lab_printf0("step time: core_api %.2f ms, fused %.2f ms (%.2fx faster)\n", st->step_ms[0],
                    st->step_ms[1], st->step_ms[0] / st->step_ms[1]);
    int fu = cx->variant == 2 ? LAB01_FUSED : LAB01_CORE_API;
    lab_printf0("follow-up %s asks about the %s path: a %s run, loop owned by the %s\n",
                cx->variant_name, lab01_path_key[fu], lab01_kind(&P[fu]), P[fu].owner);
}

static void lab01_cleanup(lab_ctx *cx) {
    lab01_state *st = cx->state;
    lab01_release_backend(&st->fused);
    free(st->tokens);
    st->tokens = NULL;
}

/* ---------------------------------------------------------------------------------------------
   The world and the spec */

static int lab01_check_world(const lab_ctx *cx, char *why, size_t cap) {
    const mc_grid_desc *d = &cx->grid.desc;
    int vpp = d->vpp > 1 ? d->vpp : 1;
    if (d->cp > 1 || d->ep > 1)
        snprintf(why, cap, "cp=1 and ep=1 (pretrain_gpt has no context or expert parallelism): "
                 "got cp=%d ep=%d", d->cp, d->ep);
    else if (strcmp(cx->grid.order, "tp-cp-ep-dp-pp") != 0)
        snprintf(why, cap, "the default order tp-cp-ep-dp-pp (pretrain_gpt has no --order): got "
                 "%s", cx->grid.order);
    else if (LAB01_HEADS % d->tp != 0)
        snprintf(why, cap, "tp to divide the %d attention heads: got tp=%d", LAB01_HEADS, d->tp);
    else if (LAB01_LAYERS % (d->pp * vpp) != 0)
        snprintf(why, cap, "pp x vpp to divide the %d layers: got pp=%d vpp=%d", LAB01_LAYERS,
                 d->pp, vpp);
    else
        return 0;
    return 1;
}

/* The model and the data are the lab's own, made before any path runs. */
static int lab01_setup(lab_ctx *cx) {
    lab01_state *st = cx->state;
    st->m = lab01_model_of(cx);
    st->tokens = lab01_make_tokens(&st->m);
    return LAB_RAN;
}

static const char lab01_summary[] =
    "lab01 (M001): one GPT, the same iterations three ways, with a call trace tagged by layer:\n"
    "A. the recipe (examples/pretrain_gpt.c: Megatron-LM's role; flags, data, loop), B. this\n"
    "lab's own script on the core API (mc_gpt_*, mc_get_forward_backward_func, DDP, the\n"
    "optimizer: Megatron-Core's role), C. the same script on the accelerated backend (CUDA\n"
    "table, or the CPU table with an OpenBLAS GEMM: Transformer Engine's role); D. the losses\n"
    "against the single-rank reference; E. step time. Then grades answers/lab01.md.\n"
    "Default: 2 ranks, PP=2 (the 1F1B schedule).";

static const lab_experiment lab01_experiments[] = {
    {"setup", lab01_setup},     {"A", lab01_run_recipe},  {"B", lab01_run_core_api},
    {"C", lab01_run_fused},     {"D", lab01_run_compare}, {"E", lab01_run_timing},
};

static const lab_spec lab01_spec = {
    .name = "lab01",
    .question = "M001",
    .title = "Megatron-LM vs Megatron-Core vs Transformer Engine",
    .summary = lab01_summary,
    .default_world = 2,
    .sizes = {.pp = 2},
    .min_world = 1,
    .max_world = LAB01_MAX_WORLD,
    .check_world = lab01_check_world,
    .n_variants = LAB01_N_VARIANTS,
    .experiments = lab01_experiments,
    .n_experiments = (int)(sizeof lab01_experiments / sizeof lab01_experiments[0]),
    .state_size = sizeof(lab01_state),
    .facts = lab01_facts,
    .report = lab01_report,
    .cleanup = lab01_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab01_spec); }
